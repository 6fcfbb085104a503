"""Chapter 9's challenge check: blockwise attention over a sliding window, computing only the tiles it needs. Right
solutions in several styles pass (public and hidden cases); each planted wrong answer gets its code; the tiles are
counted by the check, so dense attention fails however right its output."""

import math

import pytest
import torch

from attention_course import checks
from attention_course.checks import hidden, tiles


def make(window_shift=0, skip=True, causal_only_skip=False, extra_past_tile=False, rescale=True, pair=False):
    """A blockwise sliding-window attention, right by default, or with one deliberate mistake."""

    def sliding_window_attention(q, k, v, window, block_size):
        window = window + window_shift
        t, computed = q.shape[-2], 0
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        for a in range(0, t, block_size):
            rows = torch.arange(a, min(a + block_size, t))[:, None]
            m = torch.full((*q.shape[:-2], len(rows), 1), -math.inf, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(*q.shape[:-2], len(rows), v.shape[-1], dtype=q.dtype)
            for c in range(0, t, block_size):
                future = c > a + block_size - 1
                past = c + block_size - 1 <= a - window - (block_size if extra_past_tile else 0)
                if skip and (future or (past and not causal_only_skip)):
                    continue
                computed += 1
                cols = torch.arange(c, min(c + block_size, t))[None, :]
                s = q[..., a:a + block_size, :] @ k[..., c:c + block_size, :].transpose(-2, -1) / q.shape[-1] ** 0.5
                s = s.masked_fill(~((cols <= rows) & (cols > rows - window)), -math.inf)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                p, alpha = torch.exp(s - shift), torch.exp(m - shift)
                if not rescale:
                    alpha = torch.ones_like(alpha)
                l = l * alpha + p.sum(-1, keepdim=True)
                acc = acc * alpha + p @ v[..., c:c + block_size, :]
                m = m_new
            out[..., a:a + block_size, :] = acc / l
        return (out, computed) if pair else out

    return sliding_window_attention


def band_per_query_block(q, k, v, window, block_size):
    """Another style: for each query block, ONE einsum over the slab of key blocks it needs, then a softmax."""
    t = q.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for a in range(0, t, block_size):
        end = min(a + block_size, t)
        first = max(0, (a - window + 1) // block_size * block_size)  # the first key block holding an allowed key
        s = torch.einsum("...qd,...kd->...qk", q[..., a:end, :], k[..., first:end, :]) / math.sqrt(q.shape[-1])
        i, j = torch.arange(a, end)[:, None], torch.arange(first, end)[None, :]
        s = s.masked_fill(~((j <= i) & (j > i - window)), -math.inf)
        out[..., a:end, :] = torch.softmax(s, dim=-1) @ v[..., first:end, :]
    return out


def dense_windowed(q, k, v, window, block_size):
    """The whole (T, T) score matrix, masked to the window: the right output, every tile computed."""
    t = q.shape[-2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~((j <= i) & (j > i - window)), -math.inf)
    return torch.softmax(s, dim=-1) @ v


def dense_by_broadcasting(q, k, v, window, block_size):
    """Dense again, with the dot products as a broadcast product summed over the features."""
    t = q.shape[-2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    s = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~((j <= i) & (j > i - window)), -math.inf), dim=-1) @ v


def numpy_windowed(q, k, v, window, block_size):
    """Right output, computed in NumPy: nothing the check can count."""
    from attention_course import numpy_ref

    mask = tiles.window_mask(q.shape[-2], window)
    return torch.from_numpy(numpy_ref.scaled_dot_product_attention(q.double().numpy(), k.double().numpy(),
                                                                   v.double().numpy(), mask)[0])


CORRECT = [
    (checks.check_sliding_window_attention, make()),
    (checks.check_sliding_window_attention, band_per_query_block),
]
PLANTED = [
    (checks.check_sliding_window_attention, make(window_shift=1), "window-off-by-one"),
    (checks.check_sliding_window_attention, make(window_shift=-1), "window-off-by-one"),
    (checks.check_sliding_window_attention, make(window_shift=100), "window-ignored"),
    (checks.check_sliding_window_attention, make(rescale=False), "stream-not-rescaled"),
    (checks.check_sliding_window_attention, make(skip=False), "tiles-not-skipped"),
    (checks.check_sliding_window_attention, make(causal_only_skip=True), "tiles-not-skipped"),
    (checks.check_sliding_window_attention, make(extra_past_tile=True), "tiles-not-skipped"),
    (checks.check_sliding_window_attention, dense_windowed, "tiles-not-skipped"),
    (checks.check_sliding_window_attention, dense_by_broadcasting, "tiles-not-skipped"),
    (checks.check_sliding_window_attention, numpy_windowed, "wrong-type"),
    (checks.check_sliding_window_attention, make(pair=True), "wrong-type"),
]


def test_right_solution_passes_public_and_hidden_cases(capsys):
    checks.check_sliding_window_attention(make())
    assert capsys.readouterr().out.startswith("✓ sliding_window_attention: 8 random cases")
    for seed in (0, 1, 7):
        with hidden.drawn_from(seed):
            checks.check_sliding_window_attention(band_per_query_block)
    assert capsys.readouterr().out.count("10 random cases") == 3


def test_dense_attention_is_told_what_it_computed():
    with pytest.raises(checks.CheckFailed, match=r"^\[tiles-not-skipped\] Your output is right, but your function "
                       r"computed 2304 query-key scores, where the 21 tiles that hold an allowed pair have 756: it "
                       r"computes every tile"):
        checks.check_sliding_window_attention(dense_windowed)


def test_tiles_needed_counts_the_band():
    assert tiles.tiles_needed(8, 8, 4) == 3  # causal: the two diagonal tiles and the one below
    assert tiles.tiles_needed(8, 1, 4) == 2  # the diagonal only
    assert tiles.tiles_needed(16, 6, 4) == 4 + 3 + 2  # the diagonal, the tiles one and two blocks below it
    assert tiles.window_mask(4, 2).sum() == 4 + 3


def test_fused_attention_counts_its_scores_and_stand_ins_are_observed_through_the_sandbox():
    """A fused kernel's scores are counted (Tq x Tk); the grader's stand-ins for a function run the call inside the
    same observers in the sandbox (tests/test_sandbox_wire.py), a Remote object's calls do not."""
    from attention_course.checks import observe
    from attention_course.course import judge

    q = torch.randn(2, 5, 17)
    with observe.ScoreCounter(17) as counter:
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert counter.scores == 2 * 5 * 5
    assert observe.observable(make())
    assert observe.observable(judge.stand_in(None, "key", "f", {"name": "f"}))
    assert not observe.observable(judge.Remote(object(), "key", "f", {"name": "f"}))
