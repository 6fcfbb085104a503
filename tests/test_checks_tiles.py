"""Chapter 9's challenge check: blockwise attention over a sliding window, computing only the tiles it needs. A right
solution passes (public and hidden cases); each known mistake is named; a wrong count or return type gets a clear
message."""

import math

import pytest
import torch

from attention_course import checks
from attention_course.checks import hidden, tiles


def make(window_shift=0, skip=True, causal_only_skip=False, count_shift=0, pair=True):
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
            for b in range(0, t, block_size):
                future = b > a + block_size - 1
                past = b + block_size - 1 <= a - window
                if skip and (future or (past and not causal_only_skip)):
                    continue
                computed += 1
                cols = torch.arange(b, min(b + block_size, t))[None, :]
                s = q[..., a:a + block_size, :] @ k[..., b:b + block_size, :].transpose(-2, -1) / q.shape[-1] ** 0.5
                s = s.masked_fill(~((cols <= rows) & (cols > rows - window)), -math.inf)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                p, rescale = torch.exp(s - shift), torch.exp(m - shift)
                l = l * rescale + p.sum(-1, keepdim=True)
                acc = acc * rescale + p @ v[..., b:b + block_size, :]
                m = m_new
            out[..., a:a + block_size, :] = acc / l
        return (out, computed + count_shift) if pair else out

    return sliding_window_attention


def _code(fn):
    try:
        checks.check_sliding_window_attention(fn)
    except checks.CheckFailed as err:
        return err.code
    return None


def test_right_solution_passes_public_and_hidden_cases(capsys):
    checks.check_sliding_window_attention(make())
    assert capsys.readouterr().out.startswith("✓ sliding_window_attention: 6 random cases")
    for seed in (0, 1, 7):
        with hidden.drawn_from(seed):
            checks.check_sliding_window_attention(make())
    assert capsys.readouterr().out.count("7 random cases") == 3


@pytest.mark.parametrize("kwargs, code", [
    ({"window_shift": 1}, "window-off-by-one"),
    ({"window_shift": -1}, "window-off-by-one"),
    ({"window_shift": 100}, "window-ignored"),
    ({"skip": False}, "tiles-not-skipped"),
    ({"causal_only_skip": True}, "tiles-not-skipped"),
    ({"count_shift": -1}, "wrong-value"),
    ({"pair": False}, "wrong-type"),
])
def test_each_mistake_is_named(kwargs, code):
    assert _code(make(**kwargs)) == code


def test_tiles_needed_counts_the_band():
    assert tiles.tiles_needed(8, 8, 4) == 3  # causal: the two diagonal tiles and the one below
    assert tiles.tiles_needed(8, 1, 4) == 2  # the diagonal only
    assert tiles.tiles_needed(16, 6, 4) == 4 + 3 + 2  # the diagonal, the tiles one and two blocks below it
    assert tiles.window_mask(4, 2).sum() == 4 + 3
