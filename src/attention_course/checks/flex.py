"""Checks of chapter 15: FlexAttention mods written by the student (a prefix-LM
mask, a document mask, ALiBi, Llama 4's chunked attention, a decode step's
mask, documents and a window with their tile count), and attention sinks added
from FlexAttention's log-sum-exp.

A mod is a function of index tensors. The checks call the student's mod the way
:func:`attention_course.flex. dense_mask` does, on broadcasting index tensors b
(B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, T, 1) and kv_idx (1, 1, 1, T), so
that one call gives every pair; a mod written with tensor operations (``&``,
``|``, ``torch.where``, indexing) works there as inside FlexAttention's kernel.
The captured data (the prefix length, the document ids, the slopes) comes
first, so that ``functools.partial(mod, data)`` is the ``mask_mod`` or
``score_mod``. Each reference is NumPy written for the checker; each candidate
mask or bias is the reference with one mistake.

A mod right on the grid must also be a mod: each case then runs it through the
real ``create_block_mask`` and ``flex_attention`` (eager), where vmap hands it
one index at a time (a mod that reads the index tensors' shapes, turns them
into Python numbers or leans on broadcasting fails there), and the notebook's
rule "not the library's mods" is checked by what the mod calls
(:class:`~attention_course.checks.observe.LibraryCalls`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import warnings

import numpy as np
import torch

from . import hidden, observe
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    display_name,
    fail,
    first_line,
    run_check,
)
from .tiles import tiles_needed

# (B, H, T) of the public cases; the captured data is drawn per case
_SIZES = [(1, 1, 7), (2, 3, 12), (3, 2, 9), (1, 4, 16)]


def _grid_tensors(
    batch: int, heads: int, t: int, t_k: int | None = None
) -> dict:
    """The broadcasting index tensors of every (b, h, q_idx, kv_idx), int64 as
    FlexAttention passes them; T queries over ``t_k`` keys (T when None)."""
    lengths = (batch, heads, t, t if t_k is None else t_k)
    return dict(
        zip(
            ("b", "h", "q_idx", "kv_idx"),
            (
                torch.arange(n).view([n if a == axis else 1 for a in range(4)])
                for axis, n in enumerate(lengths)
            ),
            strict=True,
        )
    )


def _grid(
    batch: int, heads: int, t: int, t_k: int | None = None
) -> tuple[np.ndarray, ...]:
    return tuple(
        x.numpy() for x in _grid_tensors(batch, heads, t, t_k).values()
    )


def _sizes() -> list[tuple[int, int, int]]:
    return _SIZES + hidden.flex_sizes()


def _call_mod(fn, args: dict, label: str, case: str):
    """The student's mod called on the grid, watched for the library's own mods
    (the notebook forbids them)."""
    with observe.LibraryCalls("flex", "masks") as library:
        result = call(fn, args, label, positional=len(args))
    if library.called:
        raise fail("mod-from-library", detail=library.called[0], case=case)
    return result


def _student_mask(
    fn, data: dict, batch, heads, t, label, case, t_k=None
) -> np.ndarray:
    t_k = t if t_k is None else t_k
    result = _call_mod(
        fn, {**data, **_grid_tensors(batch, heads, t, t_k)}, label, case
    )
    out = as_array(result, "result", case, kind="bool")
    try:
        return np.broadcast_to(out, (batch, heads, t, t_k))
    except ValueError:
        raise fail(
            "wrong-shape",
            f"Your mask_mod returned shape {out.shape}, which does not "
            "broadcast to the "
            f"(B, H, Tq, Tk) = {(batch, heads, t, t_k)} of its index "
            "tensors: combine them elementwise "
            "(&, |, comparisons), without reductions.",
            case=case,
        ) from None


def _judge_mask(
    out: np.ndarray, ref: np.ndarray, candidates, case: str
) -> None:
    """Pass if equal; otherwise the code of the first candidate mask the output
    equals, else [wrong-output]."""
    if np.array_equal(out, ref):
        return
    for code, detail, mask in candidates:
        if np.array_equal(out, np.broadcast_to(mask, ref.shape)):
            raise fail(code, detail=detail, case=case)
    b, h, i, j = (int(x[0]) for x in np.nonzero(out != ref))
    raise fail(
        "wrong-output",
        f"Your mask_mod says {bool(out[b, h, i, j])} for example {b}, head "
        f"{h}, query "
        f"{i}, key {j}, where the mask says {bool(ref[b, h, i, j])}.",
        case=case,
    )


class _EagerFlex:
    """FlexAttention's eager path, without the torch.compile(backend="eager")
    wrapper it puts around its higher-order op: after a compiled FlexAttention
    ran in the same process (chapter 15, the tests), that wrapper's
    recompilation check can raise inside PyTorch (``'NoneType' object is not
    subscriptable``) and a right mod would fail. PyTorch's own switch for
    running the op plainly (named in its warning) is a module global: it is
    set while at least one check's call runs, in any thread, and put back as
    it was when the last one leaves (a lock-guarded count: two overlapping
    checks that each saved and restored it would leave it set for good, or
    clear it under the other). vmap still hands the mod one index at a time,
    which is what the check is about."""

    def __init__(self):
        self._lock, self._users, self._was = threading.Lock(), 0, None

    @staticmethod
    def _module():
        from torch.nn.attention import flex_attention as module

        return module

    def __enter__(self):
        module = self._module()
        with self._lock:
            if self._users == 0:
                self._was = module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
                module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
            self._users += 1
        return self

    def __exit__(self, *exc):
        module = self._module()
        with self._lock:
            self._users -= 1
            if self._users == 0:
                module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = self._was
        return False


_EAGER_FLEX = _EagerFlex()


def warm_up() -> None:
    """The first ``create_block_mask`` and ``flex_attention`` load PyTorch's
    higher-order-op machinery (a second or two): a check does it once before
    its time limit starts."""
    from torch.nn.attention.flex_attention import (
        create_block_mask,
        flex_attention,
    )

    with warnings.catch_warnings(), _EAGER_FLEX:
        warnings.simplefilter("ignore")
        x = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
        flex_attention(
            x,
            x,
            x,
            block_mask=create_block_mask(
                lambda b, h, q, kv: kv <= q, 1, 1, 4, 4, device="cpu"
            ),
        )


def _through_flex(
    fn, data: tuple, shape, case: str, *, allowed=None, bias=None
) -> None:
    """Run the student's mod, bound to its data, through the real
    ``create_block_mask`` (a mask_mod: ``allowed`` (B, H, T, T) is the right
    mask) or ``flex_attention``'s ``score_mod`` (``bias`` (B, H, T, T) the
    right bias), eager, float64; the output must be attention with the right
    mask or bias. Under the grader the mod runs in the sandbox, one call at a
    time, where vmap cannot reach it: there the grid alone judges it."""
    from torch.nn.attention.flex_attention import (
        create_block_mask,
        flex_attention,
    )

    if not observe.runs_here(fn):
        return

    # (B, H, T) or (B, H, Tq, Tk)
    batch, heads, t, t_k = (*shape, shape[-1])[:4]
    gen = torch.Generator().manual_seed(t)
    q, k, v = (
        torch.randn(batch, heads, n, 8, generator=gen, dtype=torch.float64)
        for n in (t, t_k, t_k)
    )
    mod = functools.partial(fn, *data)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).numpy()
    try:
        with (
            warnings.catch_warnings(),
            np.errstate(all="ignore"),
            _EAGER_FLEX,
        ):
            warnings.simplefilter("ignore")
            if allowed is not None:
                out = flex_attention(
                    q,
                    k,
                    v,
                    block_mask=create_block_mask(
                        mod, batch, heads, t, t_k, device="cpu"
                    ),
                )
                scores = np.where(allowed, scores, -np.inf)
            else:
                out = flex_attention(q, k, v, score_mod=mod)
                scores = scores + bias
    # any failure inside FlexAttention is the student's mod's
    except Exception as err:  # noqa: BLE001
        raise fail(
            "mod-fails-in-flex",
            detail=f"it raised {type(err).__name__}: {first_line(err)[:160]}",
            case=case,
        ) from None
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    ref = (weights / weights.sum(-1, keepdims=True)) @ v.numpy()
    if tuple(out.shape) != ref.shape or not np.allclose(
        out.detach().numpy(), ref, atol=1e-6, rtol=1e-6
    ):
        raise fail(
            "mod-fails-in-flex",
            detail="its attention output differs from the one of the mask "
            "or bias it "
            "gave on the grid",
            case=case,
        )


# -----------------------------------------------------------------------------
# Prefix-LM mask
# -----------------------------------------------------------------------------


def prefix_lm_reference(
    prefix: int,
    b,
    h,
    q,
    kv,
    *,
    prefix_shift: int = 0,
    diagonal: int = 0,
    swapped=False,
):
    """Key kv is open to every query when kv < prefix, otherwise causal; with
    the deviations of the mistakes."""
    causal = kv >= q if swapped else kv <= q + diagonal
    return (kv < prefix + prefix_shift) | causal


def check_prefix_lm_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(prefix, b, h, q_idx, kv_idx)`` -> bool: a prefix-LM mask_mod
    (T queries over the same T keys):
    key kv_idx may be attended when kv_idx < prefix (the prompt, read both
    ways) or kv_idx <= q_idx (causal). Diagnoses ``[mod-roles-swapped]``,
    ``[mod-window-off-by-one]``, ``[mod-from-library]`` and
    ``[mod-fails-in-flex]``."""
    label = "prefix_lm_mod"

    def body():
        rng = np.random.default_rng(15)
        sizes = _sizes()
        for n, (batch, heads, t) in enumerate(sizes, 1):
            prefix = int(rng.integers(1, t - 1))
            case = (
                f"case {n} of {len(sizes)}: B={batch}, H={heads}, "
                f"T={t}, prefix={prefix}"
            )
            out = _student_mask(
                fn, {"prefix": prefix}, batch, heads, t, label, case
            )
            grid = _grid(batch, heads, t)
            candidates = [
                (
                    "mod-roles-swapped",
                    "a query may attend its own future (kv_idx >= q_idx)",
                    prefix_lm_reference(prefix, *grid, swapped=True),
                ),
                (
                    "mod-window-off-by-one",
                    f"the prompt has {prefix + 1} keys (kv_idx <= prefix)",
                    prefix_lm_reference(prefix, *grid, prefix_shift=1),
                ),
                (
                    "mod-window-off-by-one",
                    f"the prompt has {prefix - 1} keys",
                    prefix_lm_reference(prefix, *grid, prefix_shift=-1),
                ),
                (
                    "mod-window-off-by-one",
                    "a query may not attend itself (kv_idx < q_idx)",
                    prefix_lm_reference(prefix, *grid, diagonal=-1),
                ),
            ]
            ref = np.broadcast_to(
                prefix_lm_reference(prefix, *grid), out.shape
            )
            _judge_mask(out, ref, candidates, case)
            _through_flex(fn, (prefix,), (batch, heads, t), case, allowed=ref)
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} cases (1 to 4 "
            "heads, prompts of several lengths) match "
            "the prefix-LM mask on every (query, key) pair"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Document mask
# -----------------------------------------------------------------------------


def document_reference(
    doc_ids: np.ndarray, b, h, q, kv, *, reads="right", swapped=False
):
    """Causal attention inside each document of ``doc_ids`` (B, T); ``reads``
    names a wrong lookup of the ids."""
    causal = kv >= q if swapped else kv <= q
    # ids compared by order, right only while they rise (or fall) along the row
    if reads.startswith("ordered"):
        up = doc_ids[b, kv] >= doc_ids[b, q]
        return (
            up if reads == "ordered" else doc_ids[b, kv] <= doc_ids[b, q]
        ) & causal
    query_doc = {
        "right": doc_ids[b, q],
        "key-twice": doc_ids[b, kv],
        "row-0": doc_ids[0 * b, q],
    }[reads]
    key_doc = doc_ids[0 * b, kv] if reads == "row-0" else doc_ids[b, kv]
    return (query_doc == key_doc) & causal


def _doc_ids(rng, batch: int, t: int) -> np.ndarray:
    """(B, T) document ids, 2 to 4 contiguous documents per row, a different
    split in every row, their ids in no particular order (a document's id says
    which document, not where it lies: rising, falling or mixed)."""
    rows = []
    for _ in range(batch):
        n = int(rng.integers(2, 5))
        labels = rng.permutation(n)
        if np.all(labels == np.arange(n)):
            labels = labels[::-1]
        rows.append(labels[np.sort(rng.integers(0, n, size=t))])
    return np.stack(rows)


def check_document_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(doc_ids, b, h, q_idx, kv_idx)`` -> bool: documents packed
    into each row of ``doc_ids`` (B, T) int64; query q_idx may attend key
    kv_idx when both lie in the same document of row b and kv_idx <= q_idx. The
    ids of a row are in no particular order. Diagnoses
    ``[doc-id-wrong-index]``, ``[mod-roles-swapped]``,
    ``[doc-ids-assumed-sorted]``, ``[mod-from-library]`` and
    ``[mod-fails-in-flex]``."""
    label = "document_mod"

    def body():
        rng = np.random.default_rng(16)
        sizes = _sizes()
        for n, (batch, heads, t) in enumerate(sizes, 1):
            ids = _doc_ids(rng, batch, t)
            shown = (
                ids.tolist()
                if ids.size <= 40
                else f"(B, T) = {ids.shape}, row 0 {ids[0].tolist()}"
            )
            case = (
                f"case {n} of {len(sizes)}: B={batch}, H={heads}, "
                f"T={t}, doc_ids {shown}"
            )
            out = _student_mask(
                fn,
                {"doc_ids": torch.from_numpy(ids)},
                batch,
                heads,
                t,
                label,
                case,
            )
            grid = _grid(batch, heads, t)
            candidates = [
                (
                    "doc-id-wrong-index",
                    "the key's document twice (doc_ids[b, kv_idx] on both "
                    "sides): every pair "
                    "is in 'the same document'",
                    document_reference(ids, *grid, reads="key-twice"),
                ),
                (
                    "doc-id-wrong-index",
                    "the ids of the first row for every example (doc_ids[0, "
                    "...] "
                    "instead of doc_ids[b, ...])",
                    document_reference(ids, *grid, reads="row-0"),
                ),
                (
                    "mod-roles-swapped",
                    "a query attends the LATER keys of its document (kv_idx "
                    ">= q_idx)",
                    document_reference(ids, *grid, swapped=True),
                ),
                (
                    "doc-ids-assumed-sorted",
                    "doc_ids[b, kv_idx] >= doc_ids[b, q_idx]",
                    document_reference(ids, *grid, reads="ordered"),
                ),
                (
                    "doc-ids-assumed-sorted",
                    "doc_ids[b, kv_idx] <= doc_ids[b, q_idx]",
                    document_reference(ids, *grid, reads="ordered-down"),
                ),
            ]
            ref = np.broadcast_to(document_reference(ids, *grid), out.shape)
            _judge_mask(out, ref, candidates, case)
            _through_flex(
                fn,
                (torch.from_numpy(ids),),
                (batch, heads, t),
                case,
                allowed=ref,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} cases (batches of 1 "
            "to 3 rows, 2 to 4 documents per "
            "row) match causal attention inside each document"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# ALiBi score mod
# -----------------------------------------------------------------------------


def alibi_reference(scores, slopes, b, h, q, kv, *, sign=-1.0):
    return scores + sign * slopes[h] * np.abs(q - kv)


def check_alibi_score_mod(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(slopes, score, b, h, q_idx, kv_idx)`` -> score: ALiBi as a
    score_mod, slopes (H,) float32, the score minus slopes[h] * |q_idx -
    kv_idx| (every pair, also kv_idx > q_idx: the bidirectional form).
    Diagnoses ``[bias-sign-flipped]``, ``[mod-from-library]`` and
    ``[mod-fails-in-flex]``."""
    label = "alibi_mod"

    def body():
        rng = np.random.default_rng(17)
        sizes = _sizes()
        for n, (batch, heads, t) in enumerate(sizes, 1):
            slopes = rng.uniform(0.05, 1.0, size=heads).astype(np.float32)
            scores = rng.standard_normal((batch, heads, t, t)).astype(
                np.float32
            )
            case = (
                f"case {n} of {len(sizes)}: B={batch}, H={heads}, "
                f"T={t}, slopes {np.round(slopes, 3).tolist()}"
            )
            args = {
                "slopes": torch.from_numpy(slopes),
                "score": torch.from_numpy(scores),
                **_grid_tensors(batch, heads, t),
            }
            out = as_array(_call_mod(fn, args, label, case), "result", case)
            if out.shape != scores.shape:
                raise fail(
                    "wrong-shape",
                    f"Your score_mod returned shape {out.shape}; the scores "
                    "were "
                    f"{scores.shape}: return one new score per score.",
                    case=case,
                )
            grid = _grid(batch, heads, t)
            ref = alibi_reference(
                scores.astype(np.float64), slopes.astype(np.float64), *grid
            )
            if np.allclose(out, ref, atol=1e-5, rtol=1e-5):
                bias = alibi_reference(
                    np.zeros(scores.shape), slopes.astype(np.float64), *grid
                )
                _through_flex(
                    fn,
                    (torch.from_numpy(slopes),),
                    (batch, heads, t),
                    case,
                    bias=bias,
                )
                continue
            flipped = alibi_reference(
                scores.astype(np.float64),
                slopes.astype(np.float64),
                *grid,
                sign=1.0,
            )
            if np.allclose(out, flipped, atol=1e-5, rtol=1e-5):
                raise fail(
                    "bias-sign-flipped",
                    detail="score + slopes[h] * |q_idx - kv_idx|",
                    case=case,
                )
            raise fail(
                "wrong-output",
                "Your score_mod's scores differ from score - slopes[h] * "
                "|q_idx - kv_idx| "
                "(each head its own slope, the distance either way).",
                case=case,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} cases (1 to 4 heads "
            "with their own slopes) match ALiBi "
            "on every score"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Chunked attention (Llama 4's local layers)
# -----------------------------------------------------------------------------


def chunked_reference(
    chunk: int, b, h, q, kv, *, causal=True, width=None, shift=0
):
    """Causal attention inside fixed chunks of ``chunk`` positions; ``width``
    chunks of another size, ``shift`` boundaries moved by one, ``causal=False``
    the whole chunk either way."""
    width = chunk if width is None else width
    same = (kv + shift) // width == (q + shift) // width
    return same & (kv <= q) if causal else same


def _chunk_candidates(chunk: int, grid) -> list:
    q, kv = grid[2], grid[3]
    return [
        (
            "chunk-not-causal",
            "every key of the query's chunk, also the later ones",
            chunked_reference(chunk, *grid, causal=False),
        ),
        (
            "mod-roles-swapped",
            "a query attends the LATER keys of its chunk (kv_idx >= q_idx)",
            chunked_reference(chunk, *grid, causal=False) & (kv >= q),
        ),
        (
            "chunk-is-window",
            f"a sliding window of {chunk} keys (q_idx - kv_idx < {chunk})",
            (kv <= q) & (q - kv < chunk),
        ),
        (
            "chunk-boundary-off-by-one",
            f"chunks of {chunk + 1} positions",
            chunked_reference(chunk, *grid, width=chunk + 1),
        ),
        (
            "chunk-boundary-off-by-one",
            f"chunks of {chunk - 1} positions",
            chunked_reference(chunk, *grid, width=chunk - 1),
        ),
        (
            "chunk-boundary-off-by-one",
            "chunk boundaries one position early ((idx + 1) // chunk)",
            chunked_reference(chunk, *grid, shift=1),
        ),
        (
            "chunk-boundary-off-by-one",
            "chunk boundaries one position late ((idx - 1) // chunk)",
            chunked_reference(chunk, *grid, shift=-1),
        ),
    ]


def check_chunked_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(chunk, b, h, q_idx, kv_idx)`` -> bool: Llama 4's chunked
    attention over T queries and the same T keys, cut into chunks of ``chunk``
    positions (0 .. chunk-1, chunk .. 2*chunk-1, ...): query q_idx may attend
    key kv_idx when both lie in the same chunk and kv_idx <= q_idx. Diagnoses
    ``[chunk-not-causal]``, ``[chunk-is-window]``,
    ``[chunk-boundary-off-by-one]``, ``[mod-roles-swapped]``,
    ``[mod-from-library]`` and ``[mod-fails-in-flex]``."""
    label = "chunked_mod"

    def body():
        rng = np.random.default_rng(18)
        sizes = _sizes()
        for n, (batch, heads, t) in enumerate(sizes, 1):
            # at least 2 chunks, the last one partial or whole
            chunk = int(rng.integers(3, max(4, t // 2)))
            case = (
                f"case {n} of {len(sizes)}: B={batch}, H={heads}, "
                f"T={t}, chunk={chunk}"
            )
            out = _student_mask(
                fn, {"chunk": chunk}, batch, heads, t, label, case
            )
            grid = _grid(batch, heads, t)
            ref = np.broadcast_to(chunked_reference(chunk, *grid), out.shape)
            _judge_mask(out, ref, _chunk_candidates(chunk, grid), case)
            _through_flex(fn, (chunk,), (batch, heads, t), case, allowed=ref)
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} cases (chunks of "
            "several sizes, the last one partial) "
            "match causal attention inside each chunk"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# A decode-time mask with a captured offset
# -----------------------------------------------------------------------------


def decode_reference(
    offset: int, window: int, b, h, q, kv, *, shift=0, reach=0, use_offset=True
):
    """The query at q_idx stands at position offset + q_idx of a cache of Tk
    slots (the slots after it are empty):
    it sees the ``window`` keys up to itself; ``shift`` moves the query's
    position, ``reach`` the window's far end, ``use_offset=False`` forgets the
    offset."""
    position = q + (offset + shift if use_offset else 0)
    return (kv <= position) & (kv > position - window - reach)


def check_decode_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(offset, window, b, h, q_idx, kv_idx)`` -> bool: a decode
    step's mask_mod, one query (Tq = 1, q_idx = 0) at position ``offset`` of a
    KV cache of Tk slots (slots after ``offset`` not yet written), a sliding
    window of ``window`` keys: key kv_idx may be attended when offset - window
    < kv_idx <= offset. Diagnoses ``[decode-offset-ignored]``,
    ``[decode-offset-off-by-one]``, ``[mod-window-off-by-one]``,
    ``[mod-from-library]`` and ``[mod-fails-in-flex]``."""
    label = "decode_mod"

    def body():
        rng = np.random.default_rng(19)
        sizes = _sizes()
        for n, (batch, heads, t_k) in enumerate(sizes, 1):
            # empty slots after the query, a window inside the cache
            offset = int(rng.integers(t_k // 2, t_k - 1))
            window = int(rng.integers(2, offset))
            case = (
                f"case {n} of {len(sizes)}: B={batch}, H={heads}, Tq=1, "
                f"Tk={t_k}, offset={offset}, window={window}"
            )
            out = _student_mask(
                fn,
                {"offset": offset, "window": window},
                batch,
                heads,
                1,
                label,
                case,
                t_k,
            )
            grid = _grid(batch, heads, 1, t_k)
            candidates = [
                (
                    "decode-offset-ignored",
                    "the query stands at position q_idx = 0",
                    decode_reference(offset, window, *grid, use_offset=False),
                ),
                (
                    "decode-offset-off-by-one",
                    f"the query stands at position {offset + 1}",
                    decode_reference(offset, window, *grid, shift=1),
                ),
                (
                    "decode-offset-off-by-one",
                    f"the query stands at position {offset - 1}",
                    decode_reference(offset, window, *grid, shift=-1),
                ),
                (
                    "mod-window-off-by-one",
                    f"the window holds {window + 1} keys",
                    decode_reference(offset, window, *grid, reach=1),
                ),
                (
                    "mod-window-off-by-one",
                    f"the window holds {window - 1} keys",
                    decode_reference(offset, window, *grid, reach=-1),
                ),
                (
                    "decode-reads-empty-slots",
                    "the query also sees the cache's empty slots after it",
                    decode_reference(offset, window, *grid)
                    | (grid[3] > offset),
                ),
            ]
            ref = np.broadcast_to(
                decode_reference(offset, window, *grid), out.shape
            )
            _judge_mask(out, ref, candidates, case)
            _through_flex(
                fn, (offset, window), (batch, heads, 1, t_k), case, allowed=ref
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} decode steps "
            "(caches of several lengths, empty slots "
            "after the query) match the window of keys up to the query's "
            "position"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Documents AND a sliding window, and the tiles FlexAttention computes for them
# -----------------------------------------------------------------------------

# (B, H, T): rows long enough for documents longer than the window
_DOC_WINDOW_SIZES = [(1, 2, 16), (2, 1, 12), (3, 3, 20), (1, 4, 9)]
#: the exercise's packed row (documents of these lengths, ids 0, 1, 2), window
#: and block size: the tile question
DOC_WINDOW_CASE = {"lengths": (20, 80, 28), "window": 32, "block": 16}


def doc_window_reference(
    doc_ids: np.ndarray,
    window: int,
    b,
    h,
    q,
    kv,
    *,
    reach=0,
    reads="right",
    combine="and",
):
    """Causal attention inside each document, to the ``window`` keys up to the
    query; ``reach`` moves the window's far end, ``reads`` is
    :func:`document_reference`'s, ``combine`` "or" joins the two masks by or,
    "document" or "window" keeps one of them."""
    in_document = document_reference(doc_ids, b, h, q, kv, reads=reads)
    in_window = (kv <= q) & (q - kv < window + reach)
    return {
        "and": in_document & in_window,
        "or": in_document | in_window,
        "document": in_document,
        "window": in_window,
    }[combine]


def _doc_window_candidates(ids, window, grid) -> list:
    return [
        (
            "mod-window-off-by-one",
            f"the window holds {window + 1} keys",
            doc_window_reference(ids, window, *grid, reach=1),
        ),
        (
            "mod-window-off-by-one",
            f"the window holds {window - 1} keys",
            doc_window_reference(ids, window, *grid, reach=-1),
        ),
        (
            "masks-or-not-and",
            "a pair allowed by the documents OR by the window",
            doc_window_reference(ids, window, *grid, combine="or"),
        ),
        (
            "mask-term-missing",
            "the documents without the window",
            doc_window_reference(ids, window, *grid, combine="document"),
        ),
        (
            "mask-term-missing",
            "the window across documents",
            doc_window_reference(ids, window, *grid, combine="window"),
        ),
        (
            "doc-ids-assumed-sorted",
            "doc_ids[b, kv_idx] >= doc_ids[b, q_idx]",
            doc_window_reference(ids, window, *grid, reads="ordered"),
        ),
        (
            "doc-ids-assumed-sorted",
            "doc_ids[b, kv_idx] <= doc_ids[b, q_idx]",
            doc_window_reference(ids, window, *grid, reads="ordered-down"),
        ),
    ]


def doc_window_ids() -> torch.Tensor:
    """(1, T) int64 document ids of :data:`DOC_WINDOW_CASE`'s packed row."""
    lengths = DOC_WINDOW_CASE["lengths"]
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[
        None
    ]


def doc_window_tiles() -> int:
    """Tiles computed (partial or full) for :data:`DOC_WINDOW_CASE`, by chapter
    9's ``tiles.tile_states`` on the reference mask (no FlexAttention: fast
    under a check's time limit)."""
    from .. import tiles

    ids, window, block = (
        doc_window_ids().numpy(),
        DOC_WINDOW_CASE["window"],
        DOC_WINDOW_CASE["block"],
    )
    t = ids.shape[-1]
    allowed = torch.from_numpy(
        doc_window_reference(ids, window, *_grid(1, 1, t))[0, 0]
    )
    return tiles.tiles_computed(tiles.tile_states(allowed, t, t, block))


def _flex_tiles(fn) -> None:
    """The student's mod on the exercise's row through the real
    ``create_block_mask``: its tile count must be the reference's (chapter 9's
    count on the reference mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from .. import flex

    if not observe.runs_here(fn):
        return
    ids, window, block = (
        doc_window_ids(),
        DOC_WINDOW_CASE["window"],
        DOC_WINDOW_CASE["block"],
    )
    t = ids.size(-1)
    case = (
        "the exercise's row: documents of "
        f"{list(DOC_WINDOW_CASE['lengths'])} tokens, window {window}"
    )
    try:
        with warnings.catch_warnings(), _EAGER_FLEX:
            warnings.simplefilter("ignore")
            mask = create_block_mask(
                functools.partial(fn, ids, window),
                1,
                1,
                t,
                t,
                device="cpu",
                BLOCK_SIZE=block,
            )
    # any failure inside FlexAttention is the student's mod's
    except Exception as err:  # noqa: BLE001
        raise fail(
            "mod-fails-in-flex",
            detail=f"it raised {type(err).__name__}: {first_line(err)[:160]}",
            case=case,
        ) from None
    if flex.tiles_computed(mask) != doc_window_tiles():
        raise fail(
            "mod-fails-in-flex",
            detail=f"its block mask computes {flex.tiles_computed(mask)} "
            "tiles, not the "
            f"{doc_window_tiles()} of the mask it gave on the grid",
            case=case,
        )


def check_doc_window_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(doc_ids, window, b, h, q_idx, kv_idx)`` -> bool: documents
    packed into each row of ``doc_ids`` (B, T) int64 AND a causal sliding
    window of ``window`` keys: query q_idx may attend key kv_idx when both lie
    in the same document of row b and 0 <= q_idx - kv_idx < window. The ids of
    a row are in no particular order. Diagnoses ``[masks-or-not-and]``,
    ``[mask-term-missing]``, ``[mod-window-off-by-one]``,
    ``[doc-ids-assumed-sorted]``, ``[mod-from-library]`` and
    ``[mod-fails-in-flex]``; the mod also runs through ``create_block_mask`` on
    the exercise's row, where its tile count must be the reference's."""
    label = "doc_window_mod"

    def body():
        # the first case's ids neither rise nor fall: each mistake its own mask
        rng = np.random.default_rng(22)
        sizes = _DOC_WINDOW_SIZES + hidden.flex_sizes()
        for n, (batch, heads, t) in enumerate(sizes, 1):
            ids, window = (
                _doc_ids(rng, batch, t),
                int(rng.integers(2, max(3, t // 3))),
            )
            shown = (
                ids.tolist()
                if ids.size <= 40
                else f"(B, T) = {ids.shape}, row 0 {ids[0].tolist()}"
            )
            case = (
                f"case {n} of {len(sizes)}: B={batch}, H={heads}, "
                f"T={t}, window={window}, doc_ids {shown}"
            )
            data = {"doc_ids": torch.from_numpy(ids), "window": window}
            out = _student_mask(fn, data, batch, heads, t, label, case)
            grid = _grid(batch, heads, t)
            ref = np.broadcast_to(
                doc_window_reference(ids, window, *grid), out.shape
            )
            _judge_mask(
                out, ref, _doc_window_candidates(ids, window, grid), case
            )
            _through_flex(
                fn,
                (torch.from_numpy(ids), window),
                (batch, heads, t),
                case,
                allowed=ref,
            )
        _flex_tiles(fn)
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} cases (2 to 4 "
            "documents per row, windows shorter and "
            "longer than a document) match the window inside each document; "
            "its block mask computes "
            f"{doc_window_tiles()} tiles on the exercise's row"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Attention sinks from the log-sum-exp (GPT-OSS)
# -----------------------------------------------------------------------------

# (B, H, Tq, Tk, D, window): the first case has Tq == H, where sinks indexed by
# query still broadcast
_SINK_CASES = [
    (1, 3, 3, 5, 8, None),
    (2, 2, 4, 9, 8, 3),
    (1, 4, 6, 6, 16, None),
    (2, 1, 5, 12, 8, 4),
]


def sink_reference(q, k, v, sinks, window, *, variant="right"):
    """Float64 NumPy: bottom-right causal (and windowed) attention whose
    softmax has one more column per head, the sink's logit, with no value
    (GPT-OSS; HF's ``eager_attention_forward`` of ``gpt_oss``); a ``variant``
    rescales the sink-free output from its log-sum-exp the way a known mistake
    does."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    # (Tq, 1): the queries are the last positions
    position = np.arange(t_q)[:, None] + t_k - t_q
    distance = position - np.arange(t_k)[None, :]  # (Tq, Tk)
    allowed = (distance >= 0) & (
        distance < (t_k if window is None else window)
    )
    # (B, H, Tq, Tk)
    scores = np.where(
        allowed, q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), -np.inf
    )
    sink = sinks[:, None]  # (H, 1): one logit per head, every query
    if variant == "right":
        top = np.maximum(scores.max(-1), sink)[..., None]
        weights = np.exp(scores - top) / (
            np.exp(scores - top).sum(-1, keepdims=True)
            + np.exp(sink[..., None] - top)
        )
        return weights @ v
    # (B, H, Tq)
    lse = np.log(
        np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)
    ) + scores.max(-1)
    out = np.exp(scores - lse[..., None]) @ v  # attention without the sink
    if variant == "per-query":
        # (1, Tq) = (1, H): the sink of query i is sinks[i]
        sink = sinks[None, :]
    keep = {
        "numerator": 1 + np.exp(sink - lse),
        "base-2": 1 / (1 + np.exp(sink - lse * math.log(2))),
        "base-2-inverse": 1 / (1 + np.exp(sink - lse / math.log(2))),
        "twice": 1 / (1 + np.exp(sink - lse)) ** 2,
        "per-query": 1 / (1 + np.exp(sink - lse)),
    }[variant]
    return out * keep[..., None]


def _sink_inputs(case, rng):
    batch, heads, t_q, t_k, d, window = case
    q, k, v = (
        rng.standard_normal((batch, heads, n, d)) for n in (t_q, t_k, t_k)
    )
    sinks = rng.uniform(-1.0, 2.0, size=heads)
    return q, k, v, sinks, window


def _sinks_observed(fn, args: dict, label: str, text: str, t_k: int):
    """The student's call, watched for the exercise's rule: FlexAttention
    called with its log-sum-exp requested, no tensor with a (Tk + 1)-long axis
    (the sink as a score column or an extra key), no scores of its own, no
    library sinks. Returns (output, the first broken rule as (code, detail) or
    None)."""
    watched = observe.observable(fn)
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(_EAGER_FLEX)
        library = stack.enter_context(
            observe.LibraryCalls("functional", "modern")
        )
        calls = stack.enter_context(observe.FlexCalls()) if watched else None
        d = args["q"].size(-1)
        beside = (
            stack.enter_context(
                observe.OutsideFlex(t_k + 1, (args["q"].size(-2), t_k, d))
            )
            if watched
            else None
        )
        leaves = (
            stack.enter_context(observe.LeavesTorch()) if watched else None
        )
        result = call(fn, args, label, call_text=text)
    # outside the watchers: the check's own conversion
    out = as_array(result, "result", text)
    if library.called:
        return out, ("sinks-from-library", library.called[0])
    if not watched:
        return out, None
    if leaves.left:
        return out, ("left-torch", leaves.left)
    if beside.widened:
        return out, ("sink-as-column", f"a tensor of shape {beside.widened}")
    if beside.scores:
        return out, ("scores-outside-flex", beside.scores)
    if not any(calls.calls):
        return out, (
            "lse-not-requested",
            "flex_attention was called without return_aux=AuxRequest(lse=True)"
            if calls.calls
            else "flex_attention was never called",
        )
    return out, None


def check_sinks_from_lse(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, sinks, window)`` -> (B, H, Tq, D): GPT-OSS's
    attention with one learned sink logit per head (``sinks`` (H,)) in the
    softmax's denominator and no value, for queries that are the last Tq of Tk
    positions, causal (bottom-right), within ``window`` keys unless ``window``
    is None; float64 tensors. Compared with float64 NumPy that appends the
    sink's column to the scores. The notebook's rule, from FlexAttention's
    output and log-sum-exp, is enforced by watching the call:
    ``flex_attention`` asked for its lse (``[lse-not-requested]``), no tensor
    with an axis of Tk + 1 (the sink as a column of the scores or a key, SDPA's
    or a softmax's: ``[sink-as-column]``), no scores or attention computed
    beside FlexAttention (``[scores-outside-flex]``), not the library's
    ``add_sinks`` or sink attention (``[sinks-from-library]``). Diagnoses
    ``[sink-in-numerator]``, ``[lse-wrong-base]``, ``[sinks-per-query]`` and
    ``[sink-renormalised-twice]``."""
    label = display_name(fn, "sink_attention")
    candidates = [
        ("sink-in-numerator", "numerator"),
        ("lse-wrong-base", "base-2"),
        ("lse-wrong-base", "base-2-inverse"),
        ("sinks-per-query", "per-query"),
        ("sink-renormalised-twice", "twice"),
    ]
    if observe.observable(fn):
        observe.warm_up()  # before the time limit starts

    def body():
        rng = np.random.default_rng(21)
        cases = _SINK_CASES + hidden.sink_lse_cases()
        for n, case in enumerate(cases, 1):
            q, k, v, sinks, window = _sink_inputs(case, rng)
            text = (
                f"case {n} of {len(cases)}: B={case[0]}, H={case[1]}, "
                f"Tq={case[2]}, Tk={case[3]}, "
                f"window={window}"
            )
            args = {
                "q": torch.from_numpy(q),
                "k": torch.from_numpy(k),
                "v": torch.from_numpy(v),
                "sinks": torch.from_numpy(sinks),
                "window": window,
            }
            out, broken = _sinks_observed(fn, args, label, text, case[3])
            ref = sink_reference(q, k, v, sinks, window)
            if out.shape != ref.shape:
                raise fail(
                    "wrong-shape",
                    f"Your output has shape {out.shape}; it should be (B, "
                    "H, Tq, D) = "
                    f"{ref.shape}.",
                    case=text,
                )
            if np.allclose(out, ref, atol=1e-8, rtol=1e-8):
                if broken is not None:
                    raise fail(broken[0], detail=broken[1], case=text)
                continue
            for code, variant in candidates:
                if variant == "per-query" and case[1] != case[2]:
                    # sinks indexed by query only broadcast where Tq == H
                    continue
                if np.allclose(
                    out,
                    sink_reference(q, k, v, sinks, window, variant=variant),
                    atol=1e-8,
                    rtol=1e-8,
                ):
                    raise fail(code, case=text)
            # a wrong road, whatever it computed
            if broken is not None and broken[0] == "lse-not-requested":
                raise fail(broken[0], detail=broken[1], case=text)
            raise fail(
                "wrong-output",
                "Your output differs from attention with one sink logit per "
                "head in the "
                "softmax's denominator (float64, tolerance 1e-8).",
                case=text,
            )
        return (
            f"✓ {label}: {len(cases)} cases (1 to "
            f"{max(c[1] for c in cases)} heads, Tq != Tk, causal and "
            "windowed) match attention with a sink per head, from "
            "flex_attention's log-sum-exp"
        )

    warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Questions
# -----------------------------------------------------------------------------

SPARSITY_CASE = {"t": 128, "window": 16, "block": 16}


def _sparsity() -> float:
    """Chapter 9's count of the tiles that hold an allowed pair, as a
    percentage skipped (what ``BlockMask.sparsity``
    prints: tests/test_checks_flex.py compares them; building the block mask
    here could exceed a check's time limit on a loaded machine, as it loads
    torch.compile's machinery)."""
    t, window, block = (
        SPARSITY_CASE["t"],
        SPARSITY_CASE["window"],
        SPARSITY_CASE["block"],
    )
    return 100 * (
        1 - tiles_needed(t, window, block) / math.ceil(t / block) ** 2
    )


number_question(
    "15.sparsity",
    answer=_sparsity,
    rtol=1e-3,
    why="8 blocks a side, 64 tiles; each query block needs its own "
    "(diagonal) tile and the one before it, since a "
    "window of 16 reaches back 15 keys: 8 + 7 = 15 tiles computed, 49 of 64 "
    "skipped, 76.5625 %.",
    known={
        100 * (1 - 8 / 64): (
            "mod-window-off-by-one",
            "that counts only the diagonal tiles: every query but "
            "the first of its block also reaches into the block before.",
        ),
        100
        * (
            1 - 36 / 64
        ): "that is causal attention's sparsity (36 of 64 tiles): the "
        "window skips more.",
        100
        * 15
        / 64: "that is the share of tiles COMPUTED; sparsity is the share "
        "skipped.",
    },
    hint="Count the (query block, key block) tiles that hold at least "
    "one allowed pair, then give the percentage "
    "of the 64 tiles that are skipped.",
)

choice_question(
    "15.recompile",
    answer="B",
    why="the captured Python float is baked into the kernel as a "
    "constant and guarded: 30.0 fails the guard of the "
    "kernel compiled for 20.0 and compiles again; the third call, 20.0, "
    "passes the first kernel's guards and "
    "reuses it. Capturing a tensor instead would have compiled once.",
    wrong={
        "A": "a captured Python number is a constant of the kernel, not "
        "an input: a new value cannot reuse it.",
        "C": "compiled kernels stay in the cache with their guards: 20.0 "
        "again matches the first one.",
    },
)


def _doc_window_known() -> dict:
    """The counts of the known wrong predictions for :data:`DOC_WINDOW_CASE`
    (chapter 9's tile states of the wrong masks; the right count is
    :func:`doc_window_tiles`)."""
    from .. import tiles

    ids, window, block = (
        doc_window_ids().numpy(),
        DOC_WINDOW_CASE["window"],
        DOC_WINDOW_CASE["block"],
    )
    t = ids.shape[-1]
    grid = _grid(1, 1, t)

    def states(combine):
        allowed = torch.from_numpy(
            doc_window_reference(ids, window, *grid, combine=combine)[0, 0]
        )
        return tiles.tile_states(allowed, t, t, block)

    right, n = states("and"), math.ceil(t / block)
    causal = torch.from_numpy((grid[3] <= grid[2])[0, 0])
    return {
        n * n: (
            "tiles-dense-count",
            f"{n * n} is every tile of the {n} x {n} grid: the count of a "
            "dense mask. "
            "A tile is computed only if it holds an allowed pair.",
        ),
        int((right == tiles.FULL).sum()): (
            "partial-tiles-skipped",
            "that counts only the FULL tiles; a partial "
            "tile holds allowed pairs too and is computed, with the mask "
            "applied "
            "inside it.",
        ),
        n * n - doc_window_tiles(): (
            "wrong-answer",
            "that is the number of tiles SKIPPED; the question asks "
            "for those computed.",
        ),
        tiles.tiles_computed(tiles.tile_states(causal, t, t, block)): (
            "wrong-answer",
            "that is plain causal "
            "attention's count: the documents and the "
            "window skip more.",
        ),
        tiles.tiles_computed(states("document")): (
            "mask-term-missing",
            "that is the documents' count without the "
            "window: the long middle document reaches back further than "
            f"{window} keys.",
        ),
        tiles.tiles_computed(states("window")): (
            "mask-term-missing",
            "that is the window's count across "
            "documents: the document boundaries cut tiles away too.",
        ),
        tiles.tiles_computed(states("or")): (
            "masks-or-not-and",
            "that is the count of the documents OR the "
            "window: a pair must satisfy both.",
        ),
    }


number_question(
    "15.doc-window-tiles",
    answer=doc_window_tiles,
    known=_doc_window_known,
    why="per query block, the key blocks holding a key of the query's "
    "document at most 31 positions back: block "
    "0 needs 1 tile, block 1 2 (document 0 reaches back into block 0), "
    "blocks 2 to 6 need 2, 3, 3, 3, 3 "
    "(document 1 starts at 20; a window of 32 spans up to three blocks of "
    "16), block 7 2 (document 2 starts "
    "at 100): 1 + 2 + 2 + 3 + 3 + 3 + 3 + 2 = 19 of 64 computed (3 of them "
    "full, 16 partial), 45 skipped.",
    hint="Draw the 8 x 8 grid of tiles of 16: mark where each document "
    "starts (0, 20, 100), then for each query "
    "block the key blocks that hold a key of its document within the window.",
)
