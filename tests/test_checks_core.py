"""Checks of the attention core (chapters 1, 2, 6, 9): softmax, attention for one query, streaming attention, scaled
dot-product attention in NumPy, PyTorch and TensorFlow. Correct code in several styles passes with one line; each
planted wrong answer (PLANTED) gets its own code."""

import functools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attention_course as ac
from attention_course import bug_zoo, checks, numpy_ref
from attention_course.checks import diagnosis
from attention_impls import (
    ScratchSingleHead,
    attend_loop,
    attention_numpy,
    attention_numpy_output_only,
    causal_numpy,
    padding_numpy,
    parameter_count,
    sdpa_scratch,
    sdpa_torch_builtin,
    softmax_axis0,
    softmax_np,
    stream,
    stream_max,
)


def test_candidates_that_do_not_apply_are_skipped():
    def not_applicable():
        raise ValueError("shapes do not fit")

    out = np.zeros(3)
    with pytest.raises(checks.CheckFailed, match=r"^\[missing-scale\]"):
        diagnosis.diagnose(out, None, [("wrong-scale", "", not_applicable), ("missing-scale", "", lambda: (out, None))],
                         "case", np.ones(3), None)


def test_numpy_variants_of_the_checks(capsys):
    checks.check_numpy_attention(attention_numpy, fully_masked_rows=True)
    checks.check_padding_mask(padding_numpy, framework="numpy")
    checks.check_scaled_dot_product_attention(sdpa_scratch, fully_masked_rows=False)
    lines = capsys.readouterr().out.splitlines()
    assert "fully masked rows" in lines[0] and "fully masked rows" not in lines[2]


def test_success_line_says_what_was_verified(capsys):
    checks.check_scaled_dot_product_attention(ac.scaled_dot_product_attention)
    assert capsys.readouterr().out == (
        "✓ scaled_dot_product_attention: 24 random cases (Tq != Tk, masks, batch dims, fully masked rows) "
        "match the reference\n"
    )


def test_success_line_names_the_students_function(capsys):
    """The student's function or class by its name; lambdas and partials by the name the contract gives it."""
    checks.check_scaled_dot_product_attention(sdpa_scratch)
    checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa_scratch(q, k, v, mask))
    checks.check_numpy_attention(attention_numpy_output_only)
    checks.check_numpy_attention(functools.partial(attention_numpy))
    checks.check_attention_one_query(attend_loop)
    checks.check_softmax(softmax_np)
    checks.check_causal_mask(causal_numpy)
    checks.check_padding_mask(lambda lengths, t: ac.padding_mask(lengths, t))
    checks.check_split_heads(ac.split_heads)
    checks.check_merge_heads(lambda x: ac.merge_heads(x))
    checks.check_parameter_count(parameter_count)
    checks.check_single_head_attention(ScratchSingleHead, test_dropout=False)
    names = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["✓ sdpa_scratch", "✓ scaled_dot_product_attention", "✓ attention_numpy_output_only",
                     "✓ attention (NumPy)", "✓ attend_loop", "✓ softmax_np", "✓ causal_numpy", "✓ padding_mask",
                     "✓ split_heads", "✓ merge_heads", "✓ parameter_count",
                     "✓ ScratchSingleHead"]


def sdpa_returns_scores_shape(q, k, v, mask=None):
    return q @ k.transpose(-2, -1)


def sdpa_off_a_bit(q, k, v, mask=None):
    out, weights = sdpa_scratch(q, k, v, mask)
    return out + 0.01, weights


def sdpa_wrong_weights(q, k, v, mask=None):
    out, weights = sdpa_scratch(q, k, v, mask)
    return out, weights * 2


def sdpa_weights_unmasked(q, k, v, mask=None):
    out, _ = sdpa_scratch(q, k, v, mask)
    return out, sdpa_scratch(q, k, v, None)[1]  # output right, but returns the weights before masking


def sdpa_weights_wrong_shape(q, k, v, mask=None):
    out, weights = sdpa_scratch(q, k, v, mask)
    return out, weights[..., 0]


def softmax_exp_only(x):
    return np.exp(x - x.max(axis=-1, keepdims=True))


def softmax_returns_list(x):
    return [float(v) for v in softmax_np(np.atleast_1d(x)).ravel()]


def test_messages_explain_the_failing_case():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(bug_zoo.sdpa_missing_scale)
    assert str(info.value) == (
        "[missing-scale] Your scores are not divided by sqrt(d_k): your output matches softmax(q @ k^T) @ v "
        "without the 1/sqrt(d_k) factor. Multiply the scores by 1 / sqrt(d_k), with d_k = q.shape[-1], before "
        "the softmax.\n  Failing case: case 1 of 24: q (4, 8), k (4, 8), v (4, 8), no mask"
    )
    assert info.value.code == "missing-scale"


def test_attention_core_framework_option(capsys):
    checks.check_scaled_dot_product_attention(attention_numpy, framework="numpy")
    assert capsys.readouterr().out.startswith("✓ attention_numpy: 24 random cases")
    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised ValueError: matmul"):
        checks.check_scaled_dot_product_attention(sdpa_scratch, framework="numpy")  # torch code, NumPy inputs
    with pytest.raises(ValueError, match=r"framework must be one of 'torch', 'tf', 'numpy', got 'jax'"):
        checks.check_scaled_dot_product_attention(sdpa_scratch, framework="jax")


def tf_attention(q, k, v, mask=None, scale=True):
    import tensorflow as tf

    scores = tf.matmul(q, k, transpose_b=True)
    scores = scores / tf.sqrt(tf.cast(tf.shape(q)[-1], q.dtype)) if scale else scores
    if mask is not None:
        scores = tf.where(mask, scores, tf.constant(float("-inf"), dtype=scores.dtype))
    weights = tf.nn.softmax(scores, axis=-1)
    if mask is not None:
        weights = tf.where(tf.reduce_any(mask, axis=-1, keepdims=True), weights, tf.zeros_like(weights))
    return tf.matmul(weights, v), weights


def test_attention_core_in_tensorflow(capsys):
    tf = pytest.importorskip("tensorflow")
    checks.check_scaled_dot_product_attention(tf_attention, framework="tf")
    assert capsys.readouterr().out == ("✓ tf_attention: 24 random cases (Tq != Tk, masks, batch dims, fully masked "
                                       "rows) match the reference\n")
    with pytest.raises(checks.CheckFailed, match=r"^\[missing-scale\]"):
        checks.check_scaled_dot_product_attention(functools.partial(tf_attention, scale=False), framework="tf")
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: tf.matmul(q, k), framework="tf")
    assert str(info.value) == (  # TensorFlow's "{{function_node ...}}" prefix and empty " name:" are dropped
        "[raised-exception] Your code raised InvalidArgumentError: Matrix size-incompatible: In[0]: [4,8], In[1]: "
        "[4,8] [Op:MatMul]\n  when called as scaled_dot_product_attention(q of shape (4, 8), k of shape (4, 8), v of "
        "shape (4, 8), mask=None).")


def attend_no_scale(query, keys, values):
    return attend_loop(query * math.sqrt(len(query)), keys, values)


def attend_divide_by_dk(query, keys, values):
    return attend_loop(query / math.sqrt(len(query)), keys, values)


def stream_indexed(q, k, v):
    """The stream by index, k[j], in float operations of NumPy."""
    lse, out = -np.inf, np.zeros(v.shape[-1])
    for j in range(len(k)):
        s = q @ k[j] / np.sqrt(len(q))
        new = np.logaddexp(lse, s)
        out, lse = np.exp(lse - new) * out + np.exp(s - new) * v[j], new
    return out


def stream_blocks(q, k, v, block=16):
    """A stream over blocks of 16 keys (holding 16 scores at a time, never one per key)."""
    lse, out = -np.inf, np.zeros(v.shape[-1])
    for start in range(0, len(k), block):
        s = k[start:start + block] @ q / np.sqrt(len(q))
        new = np.logaddexp(lse, np.logaddexp.reduce(s))
        out, lse = np.exp(lse - new) * out + np.exp(s - new) @ v[start:start + block], new
    return out


def attend_at_once(q, k, v):
    """No stream: every score at once, the log-sum-exp of the row, the weighted sum."""
    s = k @ q / np.sqrt(len(q))
    return np.exp(s - np.logaddexp.reduce(s)) @ v


def attend_at_once_in_torch(q, k, v):
    """No stream, in PyTorch (whose memory Python's tracemalloc does not see)."""
    keys, values, query = (torch.from_numpy(np.asarray(x)) for x in (k, v, q))
    return (torch.softmax(keys @ query / len(q) ** 0.5, dim=0) @ values).numpy()


def stream_in_torch(q, k, v):
    """The stream, in PyTorch tensors, by index (``for k_j in keys`` would unbind every row at once: an object per
    key, which the check counts as holding one per key)."""
    query, keys, values = (torch.from_numpy(np.asarray(x)) for x in (q, k, v))
    lse, out = torch.tensor(float("-inf"), dtype=torch.float64), torch.zeros(values.shape[-1], dtype=torch.float64)
    for j in range(len(keys)):
        k_j, v_j = keys[j], values[j]
        s = query @ k_j / len(q) ** 0.5
        new = torch.logaddexp(lse, s)
        out, lse = torch.exp(lse - new) * out + torch.exp(s - new) * v_j, new
    return out.numpy()


def three_passes(q, k, v):
    """No score kept, but three passes over the keys: the maximum, the sum, the weighted values."""
    scale = 1 / math.sqrt(len(q))
    m = max(float(q @ k_j) * scale for k_j in k)
    total = sum(math.exp(float(q @ k_j) * scale - m) for k_j in k)
    return sum(math.exp(float(q @ k_j) * scale - m) * v_j for k_j, v_j in zip(k, v, strict=True)) / total


def stream_scores_then_softmax(q, k, v):
    """A loop over the keys that keeps a running log-sum-exp right, but stores every score to weight the values
    at the end."""
    lse, scores = -np.inf, []
    for k_j in k:
        scores.append(q @ k_j / np.sqrt(len(q)))
        lse = np.logaddexp(lse, scores[-1])
    return np.exp(np.array(scores) - lse) @ v


def attend_exp_only(query, keys, values):
    scores = keys @ query / math.sqrt(len(query))
    return np.exp(scores) @ values  # never divided by the sum


def attention_numpy_no_guard(q, k, v, mask=None):
    """NumPy attention whose fully masked rows are 0 / 0."""
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    with np.errstate(all="ignore"):
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights


def attention_numpy_minus_1e9(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    weights = softmax_np(scores)
    return weights @ v, weights


def attention_numpy_mask_inverted(q, k, v, mask=None):
    return attention_numpy(q, k, v, None if mask is None else ~np.asarray(mask))


def attention_numpy_k_transposed_wrong(q, k, v, mask=None):
    """k.T instead of swapping the last two axes: right without batch axes only."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    weights = softmax_np(scores if mask is None else np.where(mask, scores, -np.inf))
    return weights @ v, weights


def attention_numpy_einsum(q, k, v, mask=None):
    """Another style: einsum, and a guard that zeroes the rows with no allowed key."""
    scores = np.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is None:
        weights = softmax_np(scores)
    else:
        allowed = np.broadcast_to(mask, scores.shape)
        shifted = np.where(allowed, scores - np.where(allowed, scores, -np.inf).max(-1, keepdims=True, initial=-1e300),
                           -np.inf)
        e = np.exp(shifted)
        weights = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    return np.einsum("...qk,...kd->...qd", weights, v), weights


def float_mask_attention(to_additive, guard=True, fused=True):
    """Chapter 4's exercise: ``to_additive(mask, q)`` builds the attn_mask, then the fused function (or a manual
    softmax); with ``guard`` the rows that may attend nothing are set to zero by the code itself."""

    def attention_float_mask(q, k, v, mask=None):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v)
        if fused:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=to_additive(mask, q))
        else:
            out = sdpa_scratch(q, k, v, mask)[0]
        return torch.where(mask.any(-1, keepdim=True), out, 0.0) if guard else out

    return attention_float_mask


def additive_inf(mask, q):
    return torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))


def additive_by_where(mask, q):
    """Another style: torch.where with a finite large negative number (not -inf)."""
    return torch.where(mask, 0.0, torch.finfo(q.dtype).min).to(q.dtype)


def float_mask_decoy(decoy):
    """A fused call with the float mask ``decoy(mask, q)`` that the output does not come from: the output is the
    library's, through the boolean mask."""

    def attention_float_mask(q, k, v, mask=None):
        if mask is not None:
            F.scaled_dot_product_attention(q, k, v, attn_mask=decoy(mask, q))
        return ac.scaled_dot_product_attention(q, k, v, mask)[0]

    return attention_float_mask


def float_mask_flattened(q, k, v, mask=None):
    """The batch and head axes flattened before the fused call, the float mask with them."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v)
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask.shape[:-2])
    tq, tk = q.shape[-2], k.shape[-2]
    flat = [x.expand(*shape, *x.shape[-2:]).reshape(-1, *x.shape[-2:]) for x in (q, k, v)]
    added = additive_inf(mask.expand(*shape, tq, tk).reshape(-1, tq, tk), q)
    out = F.scaled_dot_product_attention(*flat, attn_mask=added).reshape(*shape, tq, v.shape[-1])
    return torch.where(mask.expand(*shape, tq, tk).any(-1, keepdim=True), out, 0.0)


numpy_attention_with_empty_rows = functools.partial(checks.check_numpy_attention, fully_masked_rows=True)

CORRECT = [
    # (check, a correct implementation in some style)
    (numpy_attention_with_empty_rows, attention_numpy_einsum),
    (checks.check_float_mask_attention, float_mask_attention(additive_inf)),
    (checks.check_float_mask_attention, float_mask_attention(additive_by_where)),
    (checks.check_float_mask_attention, float_mask_flattened),
    (checks.check_scaled_dot_product_attention, sdpa_scratch),
    (checks.check_scaled_dot_product_attention, ac.scaled_dot_product_attention),
    (checks.check_scaled_dot_product_attention, sdpa_torch_builtin),
    (checks.check_scaled_dot_product_attention, ac.sdpa_fast),
    (checks.check_numpy_attention, attention_numpy),
    (checks.check_numpy_attention, attention_numpy_output_only),
    (checks.check_attention_one_query, attend_loop),
    (checks.check_attention_one_query, stream),
    (checks.check_streaming_attention, stream),
    (checks.check_streaming_attention, stream_max),
    (checks.check_streaming_attention, stream_indexed),
    (checks.check_streaming_attention, stream_blocks),
    (checks.check_streaming_attention, stream_in_torch),
    (checks.check_softmax, softmax_np),
    (checks.check_softmax, numpy_ref.softmax),
]


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_attention_one_query, attend_no_scale, "missing-scale"),
    (checks.check_attention_one_query, attend_divide_by_dk, "wrong-scale"),
    (checks.check_attention_one_query, attend_exp_only, "weights-not-normalized"),
    (numpy_attention_with_empty_rows, attention_numpy_no_guard, "nan-on-masked-row"),
    (numpy_attention_with_empty_rows, attention_numpy_minus_1e9, "masked-row-not-zero"),
    (numpy_attention_with_empty_rows, attention_numpy_mask_inverted, "mask-inverted"),
    (numpy_attention_with_empty_rows, attention_numpy_k_transposed_wrong, "raised-exception"),
    (checks.check_float_mask_attention, float_mask_attention(lambda mask, q: mask), "float-mask-not-passed"),
    (checks.check_float_mask_attention, float_mask_attention(additive_inf, fused=False), "float-mask-not-passed"),
    (checks.check_float_mask_attention, float_mask_attention(additive_inf, guard=False), "nan-on-masked-row"),
    (checks.check_float_mask_attention, float_mask_attention(lambda mask, q: (1 - mask.to(q.dtype)) * -1e10,
                                                             guard=False),
     "masked-row-not-zero"),  # the classic recipe: a row of -1e10 everywhere is uniform
    (checks.check_float_mask_attention, float_mask_attention(lambda mask, q: mask.to(q.dtype)),
     "float-mask-not-additive"),
    (checks.check_float_mask_attention, float_mask_decoy(lambda mask, q: torch.zeros((), dtype=q.dtype)),
     "float-mask-not-used"),  # a float mask reaches the fused call; the output comes from the boolean one
    (checks.check_float_mask_attention, float_mask_decoy(lambda mask, q: torch.zeros(mask.shape, dtype=q.dtype)),
     "float-mask-not-used"),
    (checks.check_float_mask_attention, float_mask_decoy(lambda mask, q: additive_inf(~mask, q)),
     "float-mask-not-used"),
    (checks.check_float_mask_attention, float_mask_attention(lambda mask, q: mask.to(q.dtype) * -1e10),
     "mask-inverted"),
    (checks.check_scaled_dot_product_attention, float_mask_attention(lambda mask, q: mask.to(q.dtype)),
     "float-mask-not-additive"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_scores_shape, "wrong-shape"),
    (checks.check_scaled_dot_product_attention, sdpa_weights_wrong_shape, "wrong-shape"),
    (checks.check_scaled_dot_product_attention, sdpa_off_a_bit, "wrong-output"),
    (checks.check_scaled_dot_product_attention, sdpa_wrong_weights, "wrong-output"),
    (checks.check_scaled_dot_product_attention, sdpa_weights_unmasked, "mask-ignored"),
    (checks.check_numpy_attention, bug_zoo.sdpa_missing_scale, "raised-exception"),  # torch code, NumPy inputs
    (checks.check_softmax, softmax_axis0, "softmax-wrong-axis"),
    (checks.check_softmax, softmax_exp_only, "weights-not-normalized"),
    (checks.check_softmax, lambda x: softmax_np(x) + 0.5, "wrong-output"),
    (checks.check_softmax, lambda x: "softmax", "wrong-type"),
    (checks.check_softmax, softmax_returns_list, "wrong-shape"),  # a list is fine, but not a flattened one
    (checks.check_attention_one_query, lambda q, k, v: attend_loop(q, k, k), "values-from-keys"),
    (checks.check_streaming_attention, functools.partial(stream, rescale="none"), "stream-not-rescaled"),
    (checks.check_streaming_attention, functools.partial(stream, rescale="inverted"), "stream-not-rescaled"),
    (checks.check_streaming_attention, functools.partial(stream, form="max", rescale="none"), "stream-not-rescaled"),
    (checks.check_streaming_attention, functools.partial(stream, form="max", normalize=False),
     "weights-not-normalized"),
    (checks.check_streaming_attention, functools.partial(stream, overflow=True), "softmax-overflow"),
    (checks.check_streaming_attention, lambda q, k, v: stream(q * math.sqrt(len(q)), k, v), "missing-scale"),
    (checks.check_streaming_attention, lambda q, k, v: stream(q, k, k), "values-from-keys"),
    (checks.check_streaming_attention, attend_at_once, "not-streamed"),
    (checks.check_streaming_attention, attend_at_once_in_torch, "not-streamed"),
    (checks.check_streaming_attention, attend_loop, "scores-stored"),  # a loop over the keys, then a softmax
    (checks.check_streaming_attention, stream_scores_then_softmax, "scores-stored"),
    (checks.check_streaming_attention, three_passes, "keys-read-twice"),
]


def test_chapter_1s_checks_run_without_pytorch():
    """Chapter 1 is NumPy: its checks (softmax, one query, attention with fully masked rows, the causal and padding
    masks, its questions) pass right answers in a process where importing PyTorch fails. A graded notebook's checks
    run in a process of their own, and importing PyTorch there was 3 of a chapter-1 grading's 5 CPU-seconds."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of PyTorch now raises\n"
        "import numpy as np\n"
        "from attention_course import checks, numpy_ref\n"
        "checks.check_softmax(numpy_ref.softmax)\n"
        "checks.check_attention_one_query(\n"
        "    lambda q, k, v: numpy_ref.scaled_dot_product_attention(q[None], k, v)[0][0])\n"
        "checks.check_numpy_attention(numpy_ref.scaled_dot_product_attention, fully_masked_rows=True)\n"
        "checks.check_causal_mask(numpy_ref.causal_mask)\n"
        "checks.check_padding_mask(numpy_ref.padding_mask, framework='numpy')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
