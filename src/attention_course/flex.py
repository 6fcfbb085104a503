"""FlexAttention: every mask and bias of the course as a few lines of code,
    compiled into one kernel (chapter 15).

PyTorch's ``torch.nn.attention.flex_attention`` takes two small functions
instead of a (Tq, Tk) tensor:

* a ``mask_mod(b, h, q_idx, kv_idx) -> bool``: may query ``q_idx`` of example
  ``b``, head ``h`` attend key ``kv_idx``? (True = may attend, the course's one
  convention);
* a ``score_mod(score, b, h, q_idx, kv_idx) -> score``: change one scaled score
  (add a bias, cap it).

The arguments are integer tensors (0-d inside the kernel), so a mod uses tensor
operations, ``&``, ``|`` and ``torch.where``, never a Python ``if`` on them.
:func:`block_mask` evaluates a ``mask_mod`` once per tile of ``block_size``
queries by ``block_size`` keys and records which tiles hold an allowed pair
(chapter 9's tiles); :func:`attention` then computes only those tiles, and
applies the mask inside a tile only where the tile is partly masked. Compiled
with ``torch.compile`` (``compiled=True``) the mods are fused into one kernel;
eager (the default) runs the same mods on the full score matrix, for debugging
and for dtypes the CPU kernel lacks.

The mods are written once, where their idea lives, and read here under chapter
15's names: the mask functions (``flex.causal``, ``sliding_window``,
``padding``, ``prefix_lm``, ``document``, ``and_masks``) in
:mod:`attention_course.masks`, the score mods ``flex.alibi`` and
``flex.relative_bias`` in :mod:`attention_course.positions`, ``flex.softcap``
in :mod:`attention_course.functional`; each equals an explicit mask or bias an
earlier chapter built (its docstring names it). :func:`dense_mask` and
:func:`dense_attention` evaluate a mod on every (query, key) pair, which is how
the tests compare them and how gradients are taken on CPU (FlexAttention has no
CPU backward in torch 2.13). Importing this module registers the backend "flex"
of :func:`~attention_course.functional.attend`.

Positions are bottom-right aligned as everywhere in the course: with Tq < Tk
the queries are the last Tq positions, query ``i`` sits at ``i + Tk - Tq``.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
import warnings

import torch
from torch import Tensor
from torch.nn.attention import flex_attention as _flex

from . import functional, tiles
from .functional import attend

# (chapter 15's name)
from .functional import softcap_mod as softcap  # noqa: F401

# (chapter 15 reads the mask functions as flex.causal, ...)
from .masks import (  # noqa: F401
    MaskMod,
    and_masks,
    causal,
    document,
    materialize,
    padding,
    prefix_lm,
    query_key_lengths,
    sliding_window,
    tensor_mod,
)

# (chapter 15's name for the ALiBi score mod)
from .positions import alibi_mod as alibi  # noqa: F401
from .positions import relative_bias_mod as relative_bias  # noqa: F401
from .validation import check_attention_inputs, check_int, check_rank

ScoreMod = functional.ScoreMod
BlockMask = _flex.BlockMask
# what the compiled CPU kernel accepts
COMPILED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
dense_mask = materialize  # chapter 15's name for chapter 4's tensor of a mod


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
) -> Tensor:
    """What FlexAttention computes, on the full (B, H, Tq, Tk) score matrix,
    with autograd: the mods evaluated on every pair
    (:func:`~attention_course.masks.materialize`) and the eager backend of
    :func:`~attention_course.functional.attend` (rows that may attend nothing
    give 0). q (B, H, Tq, Dk), k (B, H, Tk, Dk), v (B, H, Tk, Dv) -> (B, H, Tq,
    Dv)."""
    _check_qkv(q, k, v)
    batch, heads = max(q.size(0), k.size(0)), max(q.size(1), k.size(1))
    mask = (
        None
        if mask_mod is None
        else materialize(
            mask_mod, batch, heads, q.size(-2), k.size(-2), q.device
        )
    )
    return attend(q, k, v, mask, score_mod=score_mod)[0]


# ---------------------------------------------------------------- block masks:
# chapter 9's tiles


def block_mask(
    mask_mod: MaskMod,
    t_q: int,
    t_k: int | None = None,
    *,
    block_size: int = 128,
    batch: int | None = None,
    heads: int | None = None,
) -> BlockMask:
    """The ``BlockMask`` of a ``mask_mod``: which (query block, key block)
    tiles hold an allowed pair (computed), and which of those are full
    (computed without evaluating the mask). ``batch``/``heads``: None when the
    mod does not read ``b``/``h`` (one block mask shared by all), the sizes
    when it does (padding, per-example documents)."""
    if not callable(mask_mod):
        raise TypeError(
            "mask_mod must be a function (b, h, q_idx, kv_idx) -> bool, "
            f"got {type(mask_mod).__name__}"
        )
    t_q, t_k = query_key_lengths(t_q, t_k)
    check_int(block_size, "block_size")
    for name, n in (("batch", batch), ("heads", heads)):
        if n is not None:
            check_int(n, name)
    return _flex.create_block_mask(
        mask_mod, batch, heads, t_q, t_k, device="cpu", BLOCK_SIZE=block_size
    )


def _blocks(count: Tensor | None, indices: Tensor | None, n_k: int) -> Tensor:
    """(..., n_q, n_k) 0/1 of the key blocks listed, from a block mask's
    per-row count and column indices."""
    if count is None:
        return 0
    # the first `count` indices of each row are used
    valid = torch.arange(indices.size(-1)) < count[..., None]
    dense = torch.zeros(*count.shape, n_k + 1, dtype=torch.int64)
    # unused entries go to an extra column
    dense.scatter_(-1, torch.where(valid, indices.long(), n_k), 1)
    return dense[..., :n_k]


def tile_states(mask: BlockMask) -> Tensor:
    """(B, H, n_q, n_k) integers per tile: 0 skipped (no allowed pair), 1
    partial (computed, masked inside), 2 full (computed, every pair
    allowed)."""
    if not isinstance(mask, BlockMask):
        raise TypeError(
            "tile_states needs a BlockMask (flex.block_mask), got "
            f"{type(mask).__name__}"
        )
    n_k = math.ceil(mask.seq_lengths[1] / mask.BLOCK_SIZE[1])
    return _blocks(mask.kv_num_blocks, mask.kv_indices, n_k) + 2 * _blocks(
        mask.full_kv_num_blocks, mask.full_kv_indices, n_k
    )


def tiles_computed(mask: BlockMask) -> int:
    """How many tiles the kernel computes (summed over the block mask's
    examples and heads): what :func:`attention_course.tiles.tile_states` gives
    for the same mask function and block size."""
    return tiles.tiles_computed(tile_states(mask))


# ---------------------------------------------------------------- running it


def _check_qkv(q, k, v) -> None:
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_rank(x, name, 4, "(B, H, T, D)")
    check_attention_inputs(q, k, v)
    if not q.shape[:2] == k.shape[:2] == v.shape[:2]:
        raise ValueError(
            "query, key and value must share (B, H), got "
            f"{tuple(q.shape[:2])}, "
            f"{tuple(k.shape[:2])}, {tuple(v.shape[:2])}"
        )


def check_compiler() -> str:
    """The C++ compiler that ``torch.compile`` (inductor) will use on CPU;
    RuntimeError naming the fix if none."""
    from torch._inductor import config

    names = [os.environ.get("CXX"), *config.cpp.cxx]
    for name in filter(None, names):
        if shutil.which(name):
            return name
    raise RuntimeError(
        "compiled FlexAttention on CPU builds a C++ kernel, but no C++ "
        "compiler was found (looked for "
        f"{', '.join(filter(None, names))}): install one (Debian/Ubuntu: "
        "apt-get install g++; macOS: "
        "xcode-select --install) or run with compiled=False (eager, slower, "
        "same results)"
    )


def compiled_unsupported_reason() -> str:
    """ "" where compiled FlexAttention can run on this machine's CPU, else why
    not. PyTorch 2.13 compiles it for CPUs with AVX2, not on macOS, and not
    under ``ATEN_CPU_CAPABILITY=default`` (its own rule, in
    ``torch._inductor.kernel.flex.flex_cpu``); the kernel is C++ and needs a
    compiler (:func:`check_compiler`)."""
    if sys.platform == "darwin":
        return "PyTorch does not compile FlexAttention for the CPU on macOS"
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return (
            "ATEN_CPU_CAPABILITY=default turns off the vector "
            "instructions (AVX2) of the compiled CPU kernel"
        )
    if not torch.cpu._is_avx2_supported():
        return (
            "this CPU has no AVX2, which PyTorch's compiled "
            "FlexAttention kernel needs"
        )
    try:
        check_compiler()
    except RuntimeError as err:
        return str(err)
    return ""


@functools.cache
def compiled_flex_attention():
    """``torch.compile(flex_attention)``, built once per process.
    ``dynamic=False``: every new shape or captured Python number compiles a
    specialised kernel (a recompilation) instead of a symbolic one."""
    check_compiler()
    return torch.compile(_flex.flex_attention, dynamic=False)


def graphs_compiled() -> int:
    """How many graphs ``torch.compile`` has compiled in this process so far
    (dynamo's counter): a call that raises it compiled (or recompiled); one
    that leaves it unchanged reused a kernel."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block_mask: BlockMask | None = None,
    score_mod: ScoreMod | None = None,
    compiled: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """FlexAttention: q (B, H, Tq, Dk), k (B, H, Tk, Dk), v (B, H, Tk, Dv) ->
        (B, H, Tq, Dv) [, lse (B, H, Tq)].

    ``block_mask`` from :func:`block_mask` (None: every pair), ``score_mod`` as
    above; the scale defaults to 1 / sqrt(Dk). ``compiled=True`` runs
    ``torch.compile``'s fused kernel (float32, float16 or bfloat16 on CPU; it
    needs a C++ compiler); the default runs the same mods eagerly on the full
    score matrix. Rows that may attend no key give 0 (lse -inf). No gradients
    on CPU (torch 2.13): train through :func:`dense_attention` or on a GPU.
    """
    _check_qkv(q, k, v)
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise TypeError(
                "block_mask must be a BlockMask (flex.block_mask), got "
                f"{type(block_mask).__name__}"
            )
        if tuple(block_mask.seq_lengths) != (q.size(-2), k.size(-2)):
            raise ValueError(
                "block_mask was built for (Tq, Tk) = "
                f"{tuple(block_mask.seq_lengths)}, but the query "
                f"and key lengths are ({q.size(-2)}, {k.size(-2)}): build "
                "one for these lengths"
            )
    if q.device.type == "cpu" and any(x.requires_grad for x in (q, k, v)):
        raise NotImplementedError(
            "FlexAttention has no backward pass on CPU in this PyTorch: "
            "call it under "
            "torch.no_grad(), or take gradients through "
            "flex.dense_attention (same mods)"
        )
    if compiled and q.device.type == "cpu" and q.dtype not in COMPILED_DTYPES:
        raise TypeError(
            "compiled FlexAttention on CPU takes float32, float16 or "
            f"bfloat16, got {q.dtype}: "
            "use compiled=False (eager) for float64"
        )
    if compiled and q.device.type == "cpu" and compiled_unsupported_reason():
        raise RuntimeError(
            "compiled FlexAttention cannot run here: "
            f"{compiled_unsupported_reason()}. Use "
            "compiled=False (eager: the same results, slower)"
        )
    aux = _flex.AuxRequest(lse=True) if return_lse else None
    options = {
        "score_mod": score_mod,
        "block_mask": block_mask,
        "scale": scale,
        "return_aux": aux,
    }
    if compiled:
        result = compiled_flex_attention()(q, k, v, **options)
    else:
        # eager is chosen on purpose here: no advice to compile
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="flex_attention called without torch.compile"
            )
            result = _flex.flex_attention(q, k, v, **options)
    return (result[0], result[1].lse) if return_lse else result


def flex_backend(
    q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse
):
    """:func:`attention` (eager) as
    :func:`~attention_course.functional.attend`'s backend "flex": the mask
    tensor and ``is_causal`` become one mask function and its block mask; (B,
    H) broadcast as the other backends do."""
    if dropout_p > 0.0:
        raise ValueError(
            "backend 'flex' has no dropout: use backend='eager' or 'sdpa' "
            "to train with attention dropout"
        )
    if q.dim() != 4:
        raise ValueError(
            "backend 'flex' takes (B, H, T, D) inputs, got query "
            f"{tuple(q.shape)}"
        )
    batch, heads = (max(x.size(axis) for x in (q, k, v)) for axis in (0, 1))
    q, k, v = (x.expand(batch, heads, *x.shape[2:]) for x in (q, k, v))
    mods = ([] if mask is None else [tensor_mod(mask)]) + (
        [causal(q.size(-2), k.size(-2))] if is_causal else []
    )
    blocks = None
    if mods:
        blocks = block_mask(
            and_masks(*mods), q.size(-2), k.size(-2), batch=batch, heads=heads
        )
    out, lse = attention(
        q,
        k,
        v,
        block_mask=blocks,
        score_mod=score_mod,
        scale=scale,
        return_lse=True,
    )
    return out, None, lse if need_lse else None


functional.register("flex", flex_backend)
