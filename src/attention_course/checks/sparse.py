"""Checks of chapter 19's exercises: the lightning indexer's score, the top-k
mask and the ties that make top-k ambiguous, each against a float64 NumPy
reference; plus the chapter's question on what k costs.

Masks are bottom-right causal (query i may see key j iff j <= i + Tk - Tq),
True = may attend.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import numpy_ref
from ..sparse import costs
from .diagnosis import diagnose
from .questions import number_question
from .runner import DEFAULT_TIMEOUT, as_array, call, display_name, run_check

# (B, H, Tq, Tk, Dh) of the indexer's cases: one head, Tq == Tk, Tq < Tk (a
# decode step and a chunk)
_INDEX_CASES = [
    (1, 1, 4, 4, 8),
    (2, 3, 5, 5, 4),
    (2, 2, 1, 7, 6),
    (1, 4, 3, 9, 8),
    (3, 2, 6, 6, 16),
]
# (B, Tq, Tk, k) of the top-k cases: k of one, k larger than the context,
# decode steps, T not a multiple of k
_TOPK_CASES = [
    (1, 5, 5, 2),
    (2, 6, 6, 3),
    (2, 1, 9, 4),
    (1, 4, 10, 3),
    (2, 7, 7, 1),
    (1, 5, 8, 20),
    (3, 8, 8, 5),
]


def index_scores_reference(q, k, weights, scale):
    """float64: sum_h weights[b, h, i] * relu(scale * q[b, h, i] . k[b, 0, j])
    -> (B, Tq, Tk)."""
    per_head = np.maximum(np.einsum("bhid,bjd->bhij", q, k[:, 0]) * scale, 0.0)
    return np.einsum("bhi,bhij->bij", weights, per_head)


def visible(t_q: int, t_k: int) -> np.ndarray:
    """(Tq, Tk) bottom-right causal: the keys each query may choose among."""
    return numpy_ref.causal_mask(t_q, t_k)


def top_k_reference(
    scores: np.ndarray,
    k: int,
    allowed: np.ndarray | None = None,
    axis: int = -1,
) -> np.ndarray:
    """Boolean: the k highest allowed scores along ``axis`` (ties are absent
    from the checks' scores)."""
    allowed = visible(*scores.shape[-2:]) if allowed is None else allowed
    ranked = np.where(allowed, scores, -np.inf)
    order = np.argsort(-ranked, axis=axis, kind="stable")
    chosen = np.zeros(ranked.shape, dtype=bool)
    np.put_along_axis(
        chosen,
        np.take(order, range(min(k, ranked.shape[axis])), axis=axis),
        True,
        axis=axis,
    )
    return chosen & np.broadcast_to(allowed, ranked.shape)


def tied_rows_reference(
    scores: np.ndarray, k: int, allowed: np.ndarray | None = None
) -> np.ndarray:
    """(B, Tq): True where top-k among the allowed keys is ambiguous: more than
    k of them, and the k-th highest score equals the (k+1)-th."""
    allowed = visible(*scores.shape[-2:]) if allowed is None else allowed
    ranked = -np.sort(-np.where(allowed, scores, -np.inf), axis=-1)
    if k >= ranked.shape[-1]:
        return np.zeros(ranked.shape[:-1], dtype=bool)
    return (np.broadcast_to(allowed, ranked.shape).sum(-1) > k) & (
        ranked[..., k - 1] == ranked[..., k]
    )


def check_index_scores(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, weights, scale)`` -> (B, Tq, Tk): the lightning
    indexer's scores, q (B, H, Tq, Dh), one key per token k (B, 1, Tk, Dh),
    weights (B, H, Tq), sum over heads of weights * relu(scale * q . k)."""

    def body():
        rng = np.random.default_rng(19)
        for i, (b, h, t_q, t_k, d) in enumerate(_INDEX_CASES, 1):
            q, k = (
                rng.standard_normal((b, h, t_q, d)),
                rng.standard_normal((b, 1, t_k, d)),
            )
            w, scale = rng.standard_normal((b, h, t_q)), d**-0.5
            case = (
                f"case {i} of {len(_INDEX_CASES)}: B={b}, H={h}, "
                f"Tq={t_q}, Tk={t_k}, Dh={d}"
            )
            args = {
                "q": torch.from_numpy(q),
                "k": torch.from_numpy(k),
                "weights": torch.from_numpy(w),
                "scale": scale,
            }
            out = as_array(
                call(fn, args, "index_scores", positional=4), "result", case
            )
            expected = index_scores_reference(q, k, w, scale)
            dots = np.einsum("bhid,bjd->bhij", q, k[:, 0])
            candidates = [
                (
                    "relu-after-weights",
                    "",
                    lambda: (
                        np.maximum(
                            np.einsum("bhi,bhij->bij", w, dots) * scale, 0
                        ),
                        None,
                    ),
                ),
                (
                    "index-no-relu",
                    "",
                    lambda: (
                        np.einsum("bhi,bhij->bij", w, dots) * scale,
                        None,
                    ),
                ),
                (
                    "index-scale-missing",
                    "",
                    lambda: (index_scores_reference(q, k, w, 1.0), None),
                ),
            ]
            if out.shape == expected.shape and np.allclose(
                out, expected, atol=1e-8, rtol=1e-6
            ):
                continue
            diagnose(
                out,
                None,
                candidates,
                case,
                expected,
                None,
                what="scores",
                atol=1e-8,
                rtol=1e-6,
            )
        return (
            f"✓ {display_name(fn, 'index_scores')}: {len(_INDEX_CASES)} "
            "cases (1 to 4 heads, Tq == Tk and "
            "Tq < Tk) match the float64 reference"
        )

    run_check(body, timeout)


def _topk_candidates(scores, k, t_q, t_k):
    causal = visible(t_q, t_k)
    return [
        (
            "topk-not-causal",
            "",
            lambda: (
                top_k_reference(scores, k, np.ones_like(causal)) & causal,
                None,
            ),
        ),
        (
            "topk-not-causal",
            "",
            lambda: (top_k_reference(scores, k, np.ones_like(causal)), None),
        ),
        (
            "topk-wrong-axis",
            "",
            lambda: (top_k_reference(scores, k, causal, axis=-2), None),
        ),
        (
            "topk-off-by-one",
            "",
            lambda: (top_k_reference(scores, k + 1), None),
        ),
        (
            "topk-off-by-one",
            "",
            lambda: (top_k_reference(scores, k - 1), None),
        ),
    ]


def check_top_k_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(scores, k)`` -> boolean (B, Tq, Tk): True at each query's k
    highest-scoring keys among those it may see (bottom-right causal); all of
    them when it sees k or fewer."""

    def body():
        rng = np.random.default_rng(190)
        for i, (b, t_q, t_k, k) in enumerate(_TOPK_CASES, 1):
            scores = rng.standard_normal((b, t_q, t_k))  # continuous: no ties
            case = (
                f"case {i} of {len(_TOPK_CASES)}: B={b}, Tq={t_q}, "
                f"Tk={t_k}, k={k}"
            )
            args = {"scores": torch.from_numpy(scores), "k": k}
            mask = as_array(
                call(fn, args, "top_k_mask", positional=2),
                "result",
                case,
                kind="bool",
            )
            expected = top_k_reference(scores, k)
            if mask.shape == expected.shape and np.array_equal(mask, expected):
                continue
            candidates = [
                (c, d, lambda f=f: (f()[0].astype(float), None))
                for c, d, f in _topk_candidates(scores, k, t_q, t_k)
            ]
            diagnose(
                mask.astype(float),
                None,
                candidates,
                case,
                expected.astype(float),
                None,
                what="mask",
            )
        return (
            f"✓ {display_name(fn, 'top_k_mask')}: {len(_TOPK_CASES)} cases "
            "(k = 1 to more than the context, "
            "Tq == Tk and Tq < Tk) match the reference"
        )

    run_check(body, timeout)


def _tied_scores(rng, b, t_q, t_k):
    """Scores like a ReLU indexer's with few heads: many exact zeros and small
    integers, so ties are common."""
    return np.maximum(rng.integers(-3, 4, (b, t_q, t_k)), 0).astype(float)


def check_tied_rows(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(scores, k)`` -> boolean (B, Tq): True where a query's top-k
    is ambiguous: it sees more than k keys and its k-th highest visible score
    equals its (k+1)-th."""

    def body():
        rng = np.random.default_rng(1919)
        for i, (b, t_q, t_k, k) in enumerate(_TOPK_CASES, 1):
            scores = _tied_scores(rng, b, t_q, t_k)
            case = (
                f"case {i} of {len(_TOPK_CASES)}: B={b}, Tq={t_q}, "
                f"Tk={t_k}, k={k}"
            )
            args = {"scores": torch.from_numpy(scores), "k": k}
            rows = as_array(
                call(fn, args, "tied_rows", positional=2),
                "result",
                case,
                kind="bool",
            )
            expected = tied_rows_reference(scores, k)
            if rows.shape == expected.shape and np.array_equal(rows, expected):
                continue
            causal = visible(t_q, t_k)
            masked = np.where(causal, scores, np.nan)
            equal_pair = np.array(
                [
                    [
                        len(set(r[~np.isnan(r)])) < (~np.isnan(r)).sum()
                        for r in row
                    ]
                    for row in masked
                ]
            )
            candidates = [
                (
                    "ties-by-position",
                    "",
                    lambda: (np.zeros_like(expected), None),
                ),
                (
                    "tie-anywhere",
                    "",
                    lambda: (equal_pair & (causal.sum(-1) > k), None),
                ),
                ("tie-anywhere", "", lambda: (equal_pair, None)),
                (
                    "topk-not-causal",
                    "",
                    lambda: (
                        tied_rows_reference(scores, k, np.ones_like(causal)),
                        None,
                    ),
                ),
                (
                    "topk-off-by-one",
                    "",
                    lambda: (tied_rows_reference(scores, k + 1), None),
                ),
                (
                    "topk-off-by-one",
                    "",
                    lambda: (
                        tied_rows_reference(scores, k - 1) if k > 1 else None,
                        None,
                    ),
                ),
            ]
            diagnose(
                rows.astype(float),
                None,
                [
                    (c, d, lambda f=f: (np.asarray(f()[0], dtype=float), None))
                    for c, d, f in candidates
                ],
                case,
                expected.astype(float),
                None,
                what="rows",
            )
        return (
            f"✓ {display_name(fn, 'tied_rows')}: {len(_TOPK_CASES)} cases "
            "of scores with ReLU zeros match the "
            "reference"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Checked question of chapter 19 (see .questions)
# -----------------------------------------------------------------------------


def _double_k() -> float:
    sizes = costs.DEEPSEEK_V32
    return costs.sparse_macs(
        sizes._replace(top_k=4096), 32768
    ) / costs.sparse_macs(sizes, 32768)


number_question(
    "19.double-k",
    answer=_double_k,
    rtol=0.01,
    why="the indexer's work (64 x 128 per key, over all 32768 keys) "
    "does not depend on k; only MLA's part (128 x "
    "1088 per key, over k keys) doubles: (268.4 M + 570.4 M) / (268.4 M + "
    "285.2 M) = 1.52.",
    known={
        2: "2 would double the indexer's work too, but the indexer "
        "scores every key whatever k is.",
        1: "k does change the work: MLA's part runs over k keys.",
    },
    hint="Write the cost per query as the indexer's part (all T keys) "
    "plus MLA's part (k keys); which depends on k?",
)
