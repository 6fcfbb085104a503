"""FlexAttention: every mask and bias of the course as a few lines of code, compiled into one kernel (chapter 15).

PyTorch's ``torch.nn.attention.flex_attention`` takes two small functions instead of a (Tq, Tk) tensor:

* a ``mask_mod(b, h, q_idx, kv_idx) -> bool``: may query ``q_idx`` of example ``b``, head ``h`` attend key
  ``kv_idx``? (True = may attend, the course's one convention);
* a ``score_mod(score, b, h, q_idx, kv_idx) -> score``: change one scaled score (add a bias, cap it).

The arguments are integer tensors (0-d inside the kernel), so a mod uses tensor operations, ``&``, ``|`` and
``torch.where``, never a Python ``if`` on them. :func:`block_mask` evaluates a ``mask_mod`` once per tile of
``block_size`` queries by ``block_size`` keys and records which tiles hold an allowed pair (chapter 9's tiles);
:func:`attention` then computes only those tiles, and applies the mask inside a tile only where the tile is
partly masked. Compiled with ``torch.compile`` (``compiled=True``) the mods are fused into one kernel; eager (the
default) runs the same mods on the full score matrix, for debugging and for dtypes the CPU kernel lacks.

Each factory below returns a mod equal to an explicit mask or bias an earlier chapter built (its docstring names
it); :func:`dense_mask` and :func:`dense_attention` evaluate a mod on every (query, key) pair, which is how the
tests compare them and how gradients are taken on CPU (FlexAttention has no CPU backward in torch 2.13).

Positions are bottom-right aligned as everywhere in the course: with Tq < Tk the queries are the last Tq
positions, query ``i`` sits at ``i + Tk - Tq``.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention import flex_attention as _flex

from .functional import masked_softmax
from .masks import check_doc_ids
from .positions import alibi_slopes, check_offset_table
from .validation import check_attention_inputs, check_int, check_lengths, check_rank

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
BlockMask = _flex.BlockMask
COMPILED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the compiled CPU kernel accepts


def _lengths(t_q, t_k) -> tuple[int, int]:
    t_k = t_q if t_k is None else t_k
    check_int(t_q, "t_q")
    check_int(t_k, "t_k")
    return t_q, t_k


# ---------------------------------------------------------------- mask mods (b, h, q_idx, kv_idx) -> bool


def causal(t_q: int, t_k: int | None = None) -> MaskMod:
    """Query i may attend key j iff j <= i + (Tk - Tq): chapter 4's :func:`~attention_course.masks.causal_mask`."""
    t_q, t_k = _lengths(t_q, t_k)
    offset = t_k - t_q

    def causal_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return causal_mod


def sliding_window(window: int, t_q: int, t_k: int | None = None) -> MaskMod:
    """Query i (at i' = i + Tk - Tq) may attend key j iff 0 <= i' - j < window: the window of chapter 9's tiles
    and chapter 14's :func:`~attention_course.masks.sliding_window_mask` (Mistral, Gemma's local layers)."""
    check_int(window, "window")
    t_q, t_k = _lengths(t_q, t_k)
    offset = t_k - t_q

    def window_mod(b, h, q_idx, kv_idx):
        distance = q_idx + offset - kv_idx  # how far back the key is
        return (distance >= 0) & (distance < window)

    return window_mod


def padding(lengths: Tensor, t_k: int) -> MaskMod:
    """Key j of example b may be attended iff j < lengths[b]: chapter 4's
    :func:`~attention_course.masks.padding_mask`. ``lengths`` (B,) integers; the block mask needs ``batch=B``."""
    lengths = torch.as_tensor(lengths)
    check_int(t_k, "t_k")
    check_lengths(lengths, t_k)

    def padding_mod(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    return padding_mod


def prefix_lm(prefix_lengths: int | Tensor, t_q: int, t_k: int | None = None) -> MaskMod:
    """Causal, plus the first ``prefix_lengths`` keys for every query (an int, or (B,) integers: one prefix per
    example): :func:`~attention_course.masks.prefix_lm_mask`, the causal mask of chapter 4 opened on a prompt."""
    t_q, t_k = _lengths(t_q, t_k)
    is_causal = causal(t_q, t_k)
    if isinstance(prefix_lengths, int) and not isinstance(prefix_lengths, bool):
        check_int(prefix_lengths, "prefix_lengths", minimum=0)

        def prefix_mod(b, h, q_idx, kv_idx):
            return (kv_idx < prefix_lengths) | is_causal(b, h, q_idx, kv_idx)

        return prefix_mod
    prefix = torch.as_tensor(prefix_lengths)
    check_lengths(prefix, t_k)

    def prefix_per_example_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix[b]) | is_causal(b, h, q_idx, kv_idx)

    return prefix_per_example_mod


def document(doc_ids: Tensor, t_q: int | None = None, is_causal: bool = True) -> MaskMod:
    """Documents packed into one row: query i may attend key j iff both belong to the same document (and, with
    ``is_causal``, j <= i'): :func:`~attention_course.masks.document_mask`, chapter 4's masks for packed batches.

    ``doc_ids`` (T,) or (B, T) integers, the document of each key position; the queries are the last ``t_q``.
    With (B, T) ids the block mask needs ``batch=B``.
    """
    check_doc_ids(doc_ids)
    t_k = doc_ids.size(-1)
    t_q, _ = _lengths(t_k if t_q is None else t_q, t_k)
    if t_q > t_k:
        raise ValueError(f"t_q={t_q} is longer than the {t_k} document ids: the queries are the last positions")
    offset = t_k - t_q

    def same_document(b, q_idx, kv_idx):  # the query's document is read at ITS position, i' = i + offset
        if doc_ids.dim() == 1:
            return doc_ids[q_idx + offset] == doc_ids[kv_idx]
        return doc_ids[b, q_idx + offset] == doc_ids[b, kv_idx]

    def document_mod(b, h, q_idx, kv_idx):
        same = same_document(b, q_idx, kv_idx)
        return same & (kv_idx <= q_idx + offset) if is_causal else same

    return document_mod


def and_masks(*mods: MaskMod) -> MaskMod:
    """A pair is allowed iff every mod allows it (chapter 4's ``combine_masks`` for mods)."""
    if not mods or not all(callable(m) for m in mods):
        raise TypeError("and_masks needs one or more mask_mod functions")
    return _flex.and_masks(*mods)


# ---------------------------------------------------------------- score mods (score, b, h, q_idx, kv_idx) -> score


def alibi(num_heads: int, t_q: int, t_k: int | None = None) -> ScoreMod:
    """Adds -slope_h * |i' - j| to the score of head h: chapter 10's :func:`~attention_course.positions.alibi_bias`
    (slopes of :func:`~attention_course.positions.alibi_slopes`)."""
    t_q, t_k = _lengths(t_q, t_k)
    offset = t_k - t_q
    slopes = alibi_slopes(num_heads, dtype=torch.float64)  # powers of two: exact in every float dtype

    def alibi_mod(score, b, h, q_idx, kv_idx):
        distance = (q_idx + offset - kv_idx).abs()
        return score - slopes[h].to(score.dtype) * distance

    return alibi_mod


def softcap(cap: float) -> ScoreMod:
    """Caps each score smoothly within (-cap, cap), ``cap * tanh(score / cap)``: the soft-capping of chapter 14's
    :func:`~attention_course.modern.attend` (Gemma 2)."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        raise TypeError(f"cap must be a number, got {type(cap).__name__}")
    if not cap > 0 or math.isinf(cap):
        raise ValueError(f"cap must be a finite number > 0, got cap={cap}")

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return softcap_mod


def relative_bias(table: Tensor, t_q: int, t_k: int | None = None) -> ScoreMod:
    """Adds table[h, clamp(j - i', -M, M) + M] to the score of head h: a learned bias per head and offset,
    :func:`~attention_course.positions.relative_bias` (T5's idea; chapter 10's ALiBi is one fixed table)."""
    check_offset_table(table)
    t_q, t_k = _lengths(t_q, t_k)
    offset, reach = t_k - t_q, (table.size(-1) - 1) // 2

    def relative_mod(score, b, h, q_idx, kv_idx):
        index = (kv_idx - q_idx - offset).clamp(-reach, reach) + reach
        return score + table[h, index].to(score.dtype)

    return relative_mod


# ---------------------------------------------------------------- every pair at once (the explicit route)


def _grid(batch: int, heads: int, t_q: int, t_k: int, device=None) -> tuple[Tensor, ...]:
    """Index tensors b (B, 1, 1, 1), h (1, H, 1, 1), q (1, 1, Tq, 1), kv (1, 1, 1, Tk) that broadcast."""
    sizes = (batch, heads, t_q, t_k)
    return tuple(torch.arange(n, device=device).view([n if a == axis else 1 for a in range(4)])
                 for axis, n in enumerate(sizes))


def dense_mask(mask_mod: MaskMod, batch: int, heads: int, t_q: int, t_k: int, device=None) -> Tensor:
    """The (B, H, Tq, Tk) boolean mask a ``mask_mod`` describes, evaluated on every pair (broadcasting)."""
    for name, n in (("batch", batch), ("heads", heads), ("t_q", t_q), ("t_k", t_k)):
        check_int(n, name)
    allowed = mask_mod(*_grid(batch, heads, t_q, t_k, device))
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
        raise TypeError(f"a mask_mod must return a boolean tensor (True = may attend), got "
                        f"{getattr(allowed, 'dtype', type(allowed).__name__)}")
    return allowed.expand(batch, heads, t_q, t_k)


def dense_attention(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod | None = None,
                    score_mod: ScoreMod | None = None) -> Tensor:
    """What FlexAttention computes, on the full (B, H, Tq, Tk) score matrix, with autograd: the scaled scores go
    through ``score_mod``, the ``mask_mod``'s pairs through chapter 4's
    :func:`~attention_course.functional.masked_softmax` (rows that may attend nothing give 0). q (B, H, Tq, Dk),
    k (B, H, Tk, Dk), v (B, H, Tk, Dv) -> (B, H, Tq, Dv)."""
    _check_qkv(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    grid = _grid(*scores.shape, device=q.device)
    if score_mod is not None:
        scores = score_mod(scores, *grid)
    mask = None if mask_mod is None else dense_mask(mask_mod, *scores.shape, device=q.device)
    return masked_softmax(scores, mask) @ v


# ---------------------------------------------------------------- block masks: chapter 9's tiles


def block_mask(mask_mod: MaskMod, t_q: int, t_k: int | None = None, *, block_size: int = 128,
               batch: int | None = None, heads: int | None = None) -> BlockMask:
    """The ``BlockMask`` of a ``mask_mod``: which (query block, key block) tiles hold an allowed pair (computed),
    and which of those are full (computed without evaluating the mask). ``batch``/``heads``: None when the mod does
    not read ``b``/``h`` (one block mask shared by all), the sizes when it does (padding, per-example documents)."""
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be a function (b, h, q_idx, kv_idx) -> bool, got {type(mask_mod).__name__}")
    t_q, t_k = _lengths(t_q, t_k)
    check_int(block_size, "block_size")
    for name, n in (("batch", batch), ("heads", heads)):
        if n is not None:
            check_int(n, name)
    return _flex.create_block_mask(mask_mod, batch, heads, t_q, t_k, device="cpu", BLOCK_SIZE=block_size)


def _blocks(count: Tensor | None, indices: Tensor | None, n_k: int) -> Tensor:
    """(..., n_q, n_k) 0/1 of the key blocks listed, from a block mask's per-row count and column indices."""
    if count is None:
        return 0
    valid = torch.arange(indices.size(-1)) < count[..., None]  # the first `count` indices of each row are used
    dense = torch.zeros(*count.shape, n_k + 1, dtype=torch.int64)
    dense.scatter_(-1, torch.where(valid, indices.long(), n_k), 1)  # unused entries go to an extra column
    return dense[..., :n_k]


def tile_states(mask: BlockMask) -> Tensor:
    """(B, H, n_q, n_k) integers per tile: 0 skipped (no allowed pair), 1 partial (computed, masked inside),
    2 full (computed, every pair allowed)."""
    if not isinstance(mask, BlockMask):
        raise TypeError(f"tile_states needs a BlockMask (flex.block_mask), got {type(mask).__name__}")
    n_k = math.ceil(mask.seq_lengths[1] / mask.BLOCK_SIZE[1])
    return _blocks(mask.kv_num_blocks, mask.kv_indices, n_k) + 2 * _blocks(
        mask.full_kv_num_blocks, mask.full_kv_indices, n_k)


def tiles_computed(mask: BlockMask) -> int:
    """How many tiles the kernel computes (summed over the block mask's examples and heads): chapter 9's
    ``tiles_needed`` for the same mask and block size."""
    return int((tile_states(mask) > 0).sum())


# ---------------------------------------------------------------- running it


def _check_qkv(q, k, v) -> None:
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_rank(x, name, 4, "(B, H, T, D)")
    check_attention_inputs(q, k, v)
    if not q.shape[:2] == k.shape[:2] == v.shape[:2]:
        raise ValueError(f"query, key and value must share (B, H), got {tuple(q.shape[:2])}, "
                         f"{tuple(k.shape[:2])}, {tuple(v.shape[:2])}")


def check_compiler() -> str:
    """The C++ compiler that ``torch.compile`` (inductor) will use on CPU; RuntimeError naming the fix if none."""
    from torch._inductor import config

    names = [os.environ.get("CXX"), *config.cpp.cxx]
    for name in filter(None, names):
        if shutil.which(name):
            return name
    raise RuntimeError(
        "compiled FlexAttention on CPU builds a C++ kernel, but no C++ compiler was found (looked for "
        f"{', '.join(filter(None, names))}): install one (Debian/Ubuntu: apt-get install g++; macOS: "
        "xcode-select --install) or run with compiled=False (eager, slower, same results)")


def compiled_unsupported_reason() -> str:
    """"" where compiled FlexAttention can run on this machine's CPU, else why not. PyTorch 2.13 compiles it for
    CPUs with AVX2, not on macOS, and not under ``ATEN_CPU_CAPABILITY=default`` (its own rule, in
    ``torch._inductor.kernel.flex.flex_cpu``); the kernel is C++ and needs a compiler (:func:`check_compiler`)."""
    if sys.platform == "darwin":
        return "PyTorch does not compile FlexAttention for the CPU on macOS"
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return "ATEN_CPU_CAPABILITY=default turns off the vector instructions (AVX2) of the compiled CPU kernel"
    if not torch.cpu._is_avx2_supported():
        return "this CPU has no AVX2, which PyTorch's compiled FlexAttention kernel needs"
    try:
        check_compiler()
    except RuntimeError as err:
        return str(err)
    return ""


@functools.cache
def compiled_flex_attention():
    """``torch.compile(flex_attention)``, built once per process. ``dynamic=False``: every new shape or captured
    Python number compiles a specialised kernel (a recompilation) instead of a symbolic one."""
    check_compiler()
    return torch.compile(_flex.flex_attention, dynamic=False)


def graphs_compiled() -> int:
    """How many graphs ``torch.compile`` has compiled in this process so far (dynamo's counter): a call that
    raises it compiled (or recompiled); one that leaves it unchanged reused a kernel."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def attention(q: Tensor, k: Tensor, v: Tensor, *, block_mask: BlockMask | None = None,
              score_mod: ScoreMod | None = None, compiled: bool = False) -> Tensor:
    """FlexAttention: q (B, H, Tq, Dk), k (B, H, Tk, Dk), v (B, H, Tk, Dv) -> (B, H, Tq, Dv).

    ``block_mask`` from :func:`block_mask` (None: every pair), ``score_mod`` as above; the scale is
    1 / sqrt(Dk). ``compiled=True`` runs ``torch.compile``'s fused kernel (float32, float16 or bfloat16 on CPU;
    it needs a C++ compiler); the default runs the same mods eagerly on the full score matrix. Rows that may
    attend no key give 0. No gradients on CPU (torch 2.13): train through :func:`dense_attention` or on a GPU.
    """
    _check_qkv(q, k, v)
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise TypeError(f"block_mask must be a BlockMask (flex.block_mask), got {type(block_mask).__name__}")
        if tuple(block_mask.seq_lengths) != (q.size(-2), k.size(-2)):
            raise ValueError(f"block_mask was built for (Tq, Tk) = {tuple(block_mask.seq_lengths)}, but the query "
                             f"and key lengths are ({q.size(-2)}, {k.size(-2)}): build one for these lengths")
    if q.device.type == "cpu" and any(x.requires_grad for x in (q, k, v)):
        raise NotImplementedError("FlexAttention has no backward pass on CPU in this PyTorch: call it under "
                                  "torch.no_grad(), or take gradients through flex.dense_attention (same mods)")
    if compiled and q.device.type == "cpu" and q.dtype not in COMPILED_DTYPES:
        raise TypeError(f"compiled FlexAttention on CPU takes float32, float16 or bfloat16, got {q.dtype}: "
                        "use compiled=False (eager) for float64")
    if compiled and q.device.type == "cpu" and compiled_unsupported_reason():
        raise RuntimeError(f"compiled FlexAttention cannot run here: {compiled_unsupported_reason()}. Use "
                           "compiled=False (eager: the same results, slower)")
    if compiled:
        return compiled_flex_attention()(q, k, v, score_mod=score_mod, block_mask=block_mask)
    with warnings.catch_warnings():  # eager is chosen on purpose here: no advice to compile
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return _flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

