"""tiles.tile_states, the one home of "which tiles a mask needs", against a loop over tiles written here, and the
places that use it: blockwise's causal ranges, FlexAttention's block masks, the checks' tiles_needed, ring work."""

import math

import pytest
import torch

from attention_course import flex, masks, tiles
from attention_course.checks.tiles import tiles_needed
from attention_course.distributed.ring_attention import causal_work_per_rank


def loop_states(allowed, bq, bk):
    """(n_q, n_k) states of a (Tq, Tk) boolean mask, one tile at a time."""
    t_q, t_k = allowed.shape
    states = torch.zeros(math.ceil(t_q / bq), math.ceil(t_k / bk), dtype=torch.long)
    for a in range(states.size(0)):
        for c in range(states.size(1)):
            tile = allowed[a * bq:(a + 1) * bq, c * bk:(c + 1) * bk]
            states[a, c] = 0 if not tile.any() else 2 if tile.all() else 1
    return states


@pytest.mark.parametrize("t_q, t_k, bq, bk", [(16, 16, 4, 4), (13, 13, 3, 3), (5, 11, 2, 4), (7, 7, 8, 8)])
def test_tile_states_of_every_mask_function_match_a_loop(t_q, t_k, bq, bk):
    doc_ids = torch.arange(t_k) // 4
    mods = [masks.causal(t_q, t_k), masks.sliding_window(3, t_q, t_k), masks.prefix_lm(2, t_q, t_k),
            masks.document(doc_ids, t_q), masks.chunked(4, t_q, t_k)]
    for mod in mods:
        allowed = masks.materialize(mod, 1, 1, t_q, t_k)[0, 0]
        expected = loop_states(allowed, bq, bk)
        assert torch.equal(tiles.tile_states(mod, t_q, t_k, bq, bk)[0, 0], expected), mod.__name__
        assert torch.equal(tiles.tile_states(allowed, t_q, t_k, bq, bk), expected), mod.__name__


def test_padding_gives_one_grid_per_example():
    states = tiles.tile_states(masks.padding(torch.tensor([3, 8]), 8), 4, 8, 2, batch=2)
    assert states.shape == (2, 1, 2, 4)
    assert states[0, 0, 0].tolist() == [2, 1, 0, 0] and states[1, 0, 0].tolist() == [2, 2, 2, 2]


@pytest.mark.parametrize("t, window, block", [(64, 12, 8), (48, 48, 16), (32, 1, 4)])
def test_flex_block_masks_and_the_checks_count_the_same_tiles(t, window, block):
    states = tiles.tile_states(masks.sliding_window(window, t), t, t, block)
    bm = flex.block_mask(flex.sliding_window(window, t), t, block_size=block)
    assert torch.equal(flex.tile_states(bm), states)  # T a multiple of the block: the same three states
    assert flex.tiles_computed(bm) == tiles.tiles_computed(states) == tiles_needed(t, window, block)


@pytest.mark.parametrize("t_q, t_k, bq", [(8, 8, 4), (3, 10, 2), (10, 4, 3)])
def test_causal_block_range_agrees_with_the_causal_tile_states(t_q, t_k, bq):
    allowed = masks.causal_mask(t_q, t_k)
    for q0 in range(0, t_q, bq):
        q1 = min(q0 + bq, t_q)
        k_stop, k_free = tiles.causal_block_range(q0, q1, t_q, t_k)
        rows = allowed[q0:q1]
        assert not rows[:, k_stop:].any() and (k_stop == 0 or rows[:, k_stop - 1].any())
        assert rows[:, :k_free].all() and (k_free == t_k or not rows[:, k_free].all())


def test_block_state_and_ring_work():
    assert tiles.block_state(torch.zeros(2, 3, dtype=torch.bool)) == tiles.SKIP
    assert tiles.block_state(torch.eye(2, dtype=torch.bool)) == tiles.PARTIAL
    assert tiles.block_state(torch.ones(2, 2, dtype=torch.bool)) == tiles.FULL
    work = causal_work_per_rank(8, 2, "contiguous")  # ranks hold positions 0..3 and 4..7
    assert [(w.computed, w.needed) for w in work] == [(16, 10), (32, 26)]


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="mask function or a boolean"):
        tiles.tile_states(torch.ones(4, 4), 4, 4, 2)
    with pytest.raises(ValueError, match="bq"):
        tiles.tile_states(masks.causal(4), 4, 4, 0)


@pytest.mark.parametrize("t_q, t_k, block_m, block_n, window, length",
                         [(100, 100, 16, 16, None, None), (50, 90, 16, 32, 17, None), (90, 50, 32, 16, None, 33),
                          (64, 64, 16, 16, 20, 40)])
def test_the_kernels_tile_states_are_the_masks_own(t_q, t_k, block_m, block_n, window, length):
    """Chapter 16's kernel, by its own bounds, skips exactly the tiles the mask skips (tile_states, the one home of
    tile states) and runs unmasked only tiles the mask fills; flash_triton keeps no second classification."""
    from attention_course import flash_triton

    allowed = masks.causal_mask(t_q, t_k) if window is None else masks.sliding_window_mask(t_q, t_k, window)
    if length is not None:
        allowed = allowed & (torch.arange(t_k) < length)
    wanted = tiles.tile_states(allowed, t_q, t_k, block_m, block_n)
    kernel = tiles.kernel_tile_states(t_q, t_k, block_m, block_n, True, window, length)
    assert kernel.shape == wanted.shape
    assert torch.equal(kernel == tiles.SKIP, wanted == tiles.SKIP)
    assert bool(((kernel == tiles.FULL) <= (wanted == tiles.FULL)).all())
    visited = [tiles.key_tiles_visited(i, t_q, t_k, block_m, block_n, True, window, length)
               for i in range(kernel.size(0))]
    assert visited == (kernel != tiles.SKIP).sum(1).tolist()
    assert not hasattr(flash_triton, "key_tile_kinds") and not hasattr(flash_triton, "key_range")
