"""Checks of the attention modules (chapters 2, 3, 5, 6): single-head, multi-head, einsum and Keras attention, the
parameter count; weight layouts, keys and values of other widths. Correct code in several styles passes with one
line; each planted wrong answer (PLANTED) gets its own code."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attention_course as ac
from attention_course import bug_zoo, checks
from attention_course.checks import diagnosis
from attention_course.checks import modules as check_modules
from attention_course.functional import masked_softmax
from attention_impls import (
    LoadableSingleHead,
    LoadableSingleHeadTransposed,
    NotAModule,
    ScratchMHA,
    ScratchSingleHead,
    parameter_count,
    sdpa_scratch,
    sdpa_without_signature,
)


def test_dropout_test_can_be_skipped(capsys):
    checks.check_multi_head_attention(MHANoDropoutArgument, test_dropout=False)
    assert capsys.readouterr().out.endswith("match the reference\n")


def test_single_head_success_line(capsys):
    checks.check_single_head_attention(ac.SingleHeadAttention)
    assert capsys.readouterr().out == (
        "✓ SingleHeadAttention: 18 cases (3 sizes, d_in != d_out too; self- and cross-attention, Tq != Tk, masks) "
        "match the reference; dropout is off in eval mode and drops attention weights at rate p in training mode\n"
    )


def mha_scale_by_d_model(d_model, num_heads, dropout=0.0):
    return bug_zoo.MHAScaleByDModel(d_model, num_heads, dropout)


class MHANoLinears(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, query, key, value, mask=None):
        return query


class MHAWrongLinearShape(bug_zoo.ZooMultiHeadAttention):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__(d_model, num_heads, dropout)
        self.w_q = nn.Linear(d_model, d_model // num_heads)


class MHANoDropoutArgument(bug_zoo.ZooMultiHeadAttention):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)


class MHANoWo(bug_zoo.MHAMissingOutputProjection):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__(d_model, num_heads, dropout)
        del self.w_o


class MHANoWoLoadable(MHANoLinears):
    loaded = None

    def load_numpy_params(self, params):
        self.loaded = params


class MHADropoutWrongWhenOff(bug_zoo.ZooMultiHeadAttention):
    """Deterministic in eval mode, but scales by 1 / (1 - p) as if dropout were on."""

    def attend(self, q, k, v, mask):
        return super().attend(q, k, v, mask) / (1 - self.p)


def mha_loop_missing_out_proj(query, key, value, params, num_heads, mask=None):
    out = ac.multi_head_attention_loop(query, key, value, params, num_heads, mask)
    out = out[0] if isinstance(out, tuple) else out
    return (out - params["b_o"]) @ torch.linalg.pinv(params["w_o"])


def count_without_w_o(d_model, num_heads, bias=True):
    return 3 * d_model * d_model + (3 * d_model if bias else 0)


def count_ignores_bias_flag(d_model, num_heads, bias=True):
    return 4 * d_model * d_model + 4 * d_model


def count_per_head(d_model, num_heads, bias=True):
    return num_heads * 4 * d_model * d_model + (4 * d_model if bias else 0)


def count_wrong(d_model, num_heads, bias=True):
    return 7


class SHAScaleBySeqLen(bug_zoo.ZooSingleHeadAttention):
    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / k.size(-2)


class SHANoDefaults(bug_zoo.ZooSingleHeadAttention):
    def forward(self, query, key, value, mask=None):  # key and value required: self-attention module(x) fails
        return super().forward(query, key, value, mask)


class SHAAlwaysSelf(bug_zoo.ZooSingleHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        return super().forward(query, query, query, mask)


class SHANoWv(bug_zoo.ZooSingleHeadAttention):
    def __init__(self, d_in, d_out, bias=False, dropout=0.0):
        super().__init__(d_in, d_out, bias, dropout)
        self.w_v = None


class SHAWrongLinearShape(bug_zoo.ZooSingleHeadAttention):
    def __init__(self, d_in, d_out, bias=False, dropout=0.0):
        super().__init__(d_in, d_out, bias, dropout)
        self.w_k = nn.Linear(d_out, d_in, bias=bias)


class SHANaNOnMaskedRow(bug_zoo.ZooSingleHeadAttention):
    def attend(self, scores, v, mask):
        weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
        return weights @ v, weights


def mha_reads_kv_transposed(query, key, value, params, num_heads, mask=None):
    """Chapter 5's colleague: w_k and w_v read as (d_out, d_in), nn.Linear's layout; right for w_q and w_o."""
    p = dict(params, w_k=params["w_k"].T, w_v=params["w_v"].T)  # only runs when kdim == vdim == d_model
    return ac.multi_head_attention_loop(query, key, value, p, num_heads, mask)


def mha_square_only(query, key, value, params, num_heads, mask=None):
    """Right with square weights; assumes every W is (d_model, d_model)."""
    d = query.shape[-1]
    p = {name: w.reshape(d, d) if name.startswith("w_") else w for name, w in params.items()}
    return ac.multi_head_attention_loop(query, key, value, p, num_heads, mask)


class MHAIgnoresKdim(bug_zoo.ZooMultiHeadAttention):
    """Accepts kdim and vdim, but builds w_k and w_v as d_model -> d_model anyway."""

    def __init__(self, d_model, num_heads, dropout=0.0, kdim=None, vdim=None):
        super().__init__(d_model, num_heads, dropout)


class MHAKdimSquareOnly(ac.MultiHeadAttention):
    """Builds w_k and w_v for kdim and vdim, but its forward insists on keys and values of width d_model."""

    def forward(self, query, key=None, value=None, mask=None):
        if key.shape[-1] != self.d_model or value.shape[-1] != self.d_model:
            raise ValueError(f"key and value must have {self.d_model} features")
        return super().forward(query, key, value, mask)


class LoadableMHALinearLayout(nn.Module):
    """Stores nn.Linear-style (d_out, d_in) weights and computes F.linear, but its loader copies the dict's
    (d_in, d_out) matrices without transposing them."""

    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.h = num_heads
        self.weight = nn.ParameterDict({n: nn.Parameter(torch.zeros(d_model, d_model)) for n in "qkvo"})
        self.bias = nn.ParameterDict({n: nn.Parameter(torch.zeros(d_model)) for n in "qkvo"})

    def load_numpy_params(self, params):
        with torch.no_grad():
            for n in "qkvo":
                self.weight[n].copy_(torch.as_tensor(params[f"w_{n}"]))  # should be params[...].T
                self.bias[n].copy_(torch.as_tensor(params[f"b_{n}"]))

    def forward(self, query, key, value, mask=None):
        q, k, v = (ac.split_heads(F.linear(x, self.weight[n], self.bias[n]), self.h)
                   for x, n in ((query, "q"), (key, "k"), (value, "v")))
        out, weights = ac.scaled_dot_product_attention(q, k, v, mask)
        return F.linear(ac.merge_heads(out), self.weight["o"], self.bias["o"]), weights


def test_keras_checks():
    pytest.importorskip("tensorflow")
    from attention_course.keras_attention import KerasMultiHeadAttention

    checks.check_keras_attention(KerasMultiHeadAttention)

    class KerasNoLoader(KerasMultiHeadAttention):
        load_numpy_params = None

    with pytest.raises(checks.CheckFailed, match=r"^\[missing-attribute\] Your layer has no load_numpy_params"):
        checks.check_keras_attention(KerasNoLoader, test_dropout=False)

    class KerasDropoutAlwaysOn(KerasMultiHeadAttention):
        def call(self, query, key=None, value=None, mask=None, training=None, return_weights=False):
            return super().call(query, key, value, mask=mask, training=True)

    with pytest.raises(checks.CheckFailed, match=r"^\[dropout-in-eval\]"):
        checks.check_keras_attention(KerasDropoutAlwaysOn)

    class KerasKernelsTransposed(KerasMultiHeadAttention):  # a (d_out, d_in) matrix loaded as a Dense kernel
        def load_numpy_params(self, params):
            super().load_numpy_params({name: a.T for name, a in params.items()})

    with pytest.raises(checks.CheckFailed, match=r"^\[weight-layout-transposed\] .* with all four weights"):
        checks.check_keras_attention(KerasKernelsTransposed, test_dropout=False)


def test_keras_errors_keep_their_own_message():
    """Keras rewrites an error raised in call() into a multi-line dump (ANSI codes, "•" lists of the arguments):
    the check switches that off while it runs, and restores the setting."""
    pytest.importorskip("tensorflow")
    import keras

    from attention_course.keras_attention import KerasMultiHeadAttention

    class KerasNotImplemented(KerasMultiHeadAttention):
        def call(self, query, key=None, value=None, mask=None, training=None):
            raise NotImplementedError("Exercise 4: A multi-head attention layer in Keras")

    class KerasRaises(KerasMultiHeadAttention):
        def call(self, query, key=None, value=None, mask=None, training=None):
            return self.w_q(query) @ self.w_k(key)  # (B, Tq, D) @ (B, Tk, D)

    was_enabled = keras.config.is_traceback_filtering_enabled()
    try:
        keras.config.enable_traceback_filtering()  # Keras' default
        with pytest.raises(checks.CheckFailed) as info:
            checks.check_keras_attention(KerasNotImplemented)
        assert str(info.value) == (
            "[not-implemented] Exercise 4: A multi-head attention layer in Keras: replace the `raise "
            "NotImplementedError(...)` line with your solution, run that cell, then run this check again.")
        assert keras.config.is_traceback_filtering_enabled()  # restored
        keras.config.disable_traceback_filtering()
        with pytest.raises(checks.CheckFailed) as info:
            checks.check_keras_attention(KerasRaises)
        assert not keras.config.is_traceback_filtering_enabled()  # left as it was
    finally:
        (keras.config.enable_traceback_filtering if was_enabled else keras.config.disable_traceback_filtering)()
    assert str(info.value) == (
        "[raised-exception] Your code raised InvalidArgumentError: Matrix size-incompatible: In[0]: [1,2,12], "
        "In[1]: [1,2,12] [Op:BatchMatMulV2]\n  when called as KerasRaises(...)(query of shape (1, 2, 12), key of "
        "shape (1, 2, 12), value of shape (1, 2, 12), training=False).")


def test_single_head_messages():
    with pytest.raises(checks.CheckFailed, match=r"w_v \(and no load_numpy_params method\).*nn\.Linear\(d_in, d_out\)"):
        checks.check_single_head_attention(SHANoWv)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] SHAWrongLinearShape\.w_k\.weight has shape "
                       r"\(6, 4\); expected \(4, 6\) \(nn\.Linear\(6, 4\)\)"):
        checks.check_single_head_attention(SHAWrongLinearShape)
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_single_head_attention(SHANoDefaults)
    assert "when called as SHANoDefaults(...)(query of shape (2, 5, 8))" in str(info.value)


def test_weight_layout_diagnosis_names_the_transposed_weights():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_einsum_attention(mha_reads_kv_transposed)
    assert str(info.value).startswith("[weight-layout-transposed] Your output matches attention computed with w_k and "
                                      "w_v transposed: a weight matrix was read in the other layout.")
    assert str(info.value).endswith("Failing case: d_model=12, num_heads=3, case 1 of 6: self-attention, x (2, 5, D), "
                                    "no mask")
    with pytest.raises(checks.CheckFailed, match=r"^\[weight-layout-transposed\] .* with all four weights \(w_q, w_k, "
                       r"w_v and w_o\) transposed"):
        checks.check_multi_head_attention(LoadableMHALinearLayout)
    with pytest.raises(checks.CheckFailed, match=r"^\[weight-layout-transposed\] .* with w_o transposed"):
        checks.check_einsum_attention(lambda query, key, value, params, num_heads, mask=None: (
            ac.multi_head_attention_loop(query, key, value, dict(params, w_o=params["w_o"].T), num_heads, mask)))


def test_layout_subsets():
    subsets = dict(diagnosis.LAYOUT_SUBSETS)
    assert len(subsets) == 15 and list(subsets)[:2] == ["qkvo", "qkv"]
    assert subsets["qkv"] == "w_q, w_k and w_v" and subsets["kv"] == "w_k and w_v" and subsets["o"] == "w_o"


def test_keys_and_values_of_other_widths(capsys):
    """Functions with params always, classes when their signature has kdim and vdim, get 3 more cases."""
    checks.check_einsum_attention(ac.multi_head_attention_loop)
    checks.check_multi_head_attention(ac.MultiHeadAttention, test_dropout=False)
    checks.check_multi_head_attention(ScratchMHA, test_dropout=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "✓ multi_head_attention_loop: 15 cases (2 sizes; self- and cross-attention, also with kdim, vdim != d_model; "
        "Tq != Tk, masks) match the reference",
        "✓ MultiHeadAttention: 15 cases (2 sizes; self- and cross-attention, also with kdim, vdim != d_model; "
        "Tq != Tk, masks) match the reference",
        "✓ ScratchMHA: 12 cases (2 sizes; self- and cross-attention, Tq != Tk, masks) match the reference",
    ]
    assert check_modules._accepts_cross_dims(ac.EinsumMultiHeadAttention)
    assert not check_modules._accepts_cross_dims(ScratchMHA)
    assert not check_modules._accepts_cross_dims(sdpa_without_signature)


def test_code_that_assumes_square_weights_is_told_so():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_einsum_attention(mha_square_only)
    msg = str(info.value)
    assert msg.startswith("[raised-exception] Your code raised RuntimeError: shape '[12, 12]' is invalid")
    assert ("when called as mha_square_only(query of shape (2, 4, 12), key of shape (2, 6, 8), value of shape "
            "(2, 6, 5), params={w_q: (12, 12), b_q: (12,), w_k: (8, 12), b_k: (12,), w_v: (5, 12), b_v: (12,), "
            "w_o: (12, 12), b_o: (12,)}, num_heads=3, mask=None).") in msg
    assert msg.endswith("Your code passed the cases with square weights. Here the keys have kdim=8 and the values "
                        "vdim=5 features, not d_model=12: w_k is (8, 12) and w_v (5, 12), each W (d_in, d_out). Does "
                        "your code assume d_in == d_model somewhere?")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] MHAIgnoresKdim\.w_k\.weight has shape \(12, 12\); "
                       r"expected \(12, 8\) \(nn\.Linear\(8, 12\)\)"):
        checks.check_multi_head_attention(MHAIgnoresKdim)
    with pytest.raises(checks.CheckFailed, match=r"(?s)ValueError: key and value must have 12 features\n.*when called "
                       r"as MHAKdimSquareOnly\(\.\.\.\)\(query of shape \(2, 4, 12\), key of shape \(2, 6, 8\).*Does "
                       r"your code assume d_in == d_model somewhere\?$"):
        checks.check_multi_head_attention(MHAKdimSquareOnly)



# --- dropout in training mode: wrong answers a student writes ------------------------------------------------------


class MHADropoutHardCodedOff(bug_zoo.ZooMultiHeadAttention):
    """`training=False` written into the call: deterministic in eval mode, and in training mode too."""

    def attend(self, q, k, v, mask):
        weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask)
        return F.dropout(weights, self.p, training=False) @ v


class MHANoDropoutLayer(ScratchMHA):
    """Builds nn.Dropout and never calls it."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (ac.split_heads(w(x), self.h) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
        out, weights = sdpa_scratch(q, k, v, mask)
        return self.w_o(ac.merge_heads(out)), weights


class MHADropoutKeepProbability(bug_zoo.ZooMultiHeadAttention):
    """Passes the keep probability 1 - p where F.dropout wants the drop probability."""

    def attend(self, q, k, v, mask):
        weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask)
        return F.dropout(weights, 1 - self.p, training=self.training) @ v


class MHADropsTheOutput(bug_zoo.ZooMultiHeadAttention):
    """Dropout on the layer's output instead of the attention weights."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask)
        return F.dropout(self.w_o(self.merge(weights @ v)), self.p, training=self.training)


class MHADropsTheScores(ScratchMHA):
    """Dropout on the scores before the softmax: the weights still sum to 1, none is exactly 0."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (ac.split_heads(w(x), self.h) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
        scores = self.drop(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
        weights = ac.masked_softmax(scores, mask)
        return self.w_o(ac.merge_heads(weights @ v)), weights


class MHAReturnsDroppedAttendsUndropped(ScratchMHA):
    """Returns dropped weights, but the output uses the weights before dropout."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (ac.split_heads(w(x), self.h) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
        out, weights = sdpa_scratch(q, k, v, mask)
        return self.w_o(ac.merge_heads(out)), self.drop(weights)


class MHANoGuardOnEmptyRows(bug_zoo.ZooMultiHeadAttention):
    """A plain softmax of a row of -inf: NaN where a query may attend no key."""

    def attend(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return F.dropout(torch.softmax(scores, dim=-1), self.p, training=self.training) @ v


class SHADropoutHardCodedOff(bug_zoo.ZooSingleHeadAttention):
    def attend(self, scores, v, mask):
        weights = F.dropout(ac.masked_softmax(scores, mask), self.p, training=False)
        return weights @ v, weights


class SHADropoutFixedRate(bug_zoo.ZooSingleHeadAttention):
    """Drops at a fixed 0.1, whatever the module was built with."""

    def attend(self, scores, v, mask):
        weights = F.dropout(ac.masked_softmax(scores, mask), 0.1, training=self.training)
        return weights @ v, weights


class SHADropsTheValues(bug_zoo.ZooSingleHeadAttention):
    def attend(self, scores, v, mask):
        weights = ac.masked_softmax(scores, mask)
        return weights @ F.dropout(v, self.p, training=self.training), weights



keras_check = functools.partial(checks.check_keras_attention, timeout=None)  # TensorFlow's first call is slow


def keras_layer(change):
    """A factory for the check: the course's Keras layer with one method changed (TensorFlow imported on call)."""

    def build(d_model, num_heads, dropout=0.0):
        from attention_course.keras_attention import KerasMultiHeadAttention

        return type("KerasLayer", (KerasMultiHeadAttention,), change(KerasMultiHeadAttention))(
            d_model, num_heads, dropout=dropout)

    return build


def keras_dropout_always_on(base):
    def call(self, query, key=None, value=None, mask=None, training=None, return_weights=False):
        return base.call(self, query, key, value, mask=mask, training=True, return_weights=return_weights)

    return {"call": call}


def keras_dropout_never(base):
    def call(self, query, key=None, value=None, mask=None, training=None, return_weights=False):
        return base.call(self, query, key, value, mask=mask, training=False, return_weights=return_weights)

    return {"call": call}


def keras_kernels_transposed(base):
    def load_numpy_params(self, params):
        base.load_numpy_params(self, {name: a.T for name, a in params.items()})

    return {"load_numpy_params": load_numpy_params}


CORRECT = [
    # (check, a correct implementation in some style)
    (keras_check, keras_layer(lambda base: {})),
    (checks.check_multi_head_attention, ac.MultiHeadAttention),
    (checks.check_multi_head_attention, ScratchMHA),
    (checks.check_einsum_attention, ac.EinsumMultiHeadAttention),
    (checks.check_einsum_attention, ac.multi_head_attention_loop),
    (checks.check_einsum_attention, sdpa_scratch),
    (checks.check_einsum_attention, sdpa_without_signature),
    (checks.check_parameter_count, parameter_count),
    (checks.check_single_head_attention, ac.SingleHeadAttention),
    (checks.check_single_head_attention, bug_zoo.ZooSingleHeadAttention),
    (checks.check_single_head_attention, ScratchSingleHead),
    (checks.check_single_head_attention, LoadableSingleHead),
]


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_multi_head_attention, MHANoGuardOnEmptyRows, "nan-on-masked-row"),
    (checks.check_multi_head_attention, MHADropoutHardCodedOff, "dropout-off-in-training"),
    (checks.check_multi_head_attention, MHANoDropoutLayer, "dropout-off-in-training"),
    (checks.check_multi_head_attention, MHADropoutKeepProbability, "dropout-wrong-rate"),
    (checks.check_multi_head_attention, MHADropsTheOutput, "dropout-wrong-tensor"),
    (checks.check_multi_head_attention, MHADropsTheScores, "dropout-wrong-tensor"),
    (checks.check_multi_head_attention, MHAReturnsDroppedAttendsUndropped, "dropout-wrong-tensor"),
    (checks.check_single_head_attention, SHADropoutHardCodedOff, "dropout-off-in-training"),
    (checks.check_single_head_attention, SHADropoutFixedRate, "dropout-wrong-rate"),
    (checks.check_single_head_attention, SHADropsTheValues, "dropout-wrong-tensor"),
    (keras_check, keras_layer(keras_dropout_always_on), "dropout-in-eval"),
    (keras_check, keras_layer(keras_dropout_never), "dropout-off-in-training"),
    (keras_check, keras_layer(keras_kernels_transposed), "weight-layout-transposed"),
    (keras_check, keras_layer(lambda base: {"load_numpy_params": None}), "missing-attribute"),
    (checks.check_multi_head_attention, mha_scale_by_d_model, "wrong-scale"),
    (checks.check_multi_head_attention, MHANoLinears, "missing-attribute"),
    (checks.check_multi_head_attention, MHAWrongLinearShape, "wrong-shape"),
    (checks.check_multi_head_attention, MHANoDropoutArgument, "raised-exception"),
    (checks.check_multi_head_attention, MHANoWo, "missing-output-projection"),
    (checks.check_multi_head_attention, MHANoWoLoadable, "wrong-output"),
    (checks.check_multi_head_attention, NotAModule, "wrong-type"),
    (checks.check_multi_head_attention, MHADropoutWrongWhenOff, "dropout-in-eval"),
    (checks.check_einsum_attention, bug_zoo.MHASplitWithoutTranspose, "heads-split-without-transpose"),
    (checks.check_einsum_attention, mha_loop_missing_out_proj, "missing-output-projection"),
    (checks.check_einsum_attention, bug_zoo.sdpa_mask_inverted, "mask-inverted"),
    (checks.check_einsum_attention, mha_reads_kv_transposed, "weight-layout-transposed"),
    (checks.check_einsum_attention, mha_square_only, "raised-exception"),
    (checks.check_multi_head_attention, MHAIgnoresKdim, "wrong-shape"),
    (checks.check_multi_head_attention, MHAKdimSquareOnly, "raised-exception"),
    (checks.check_multi_head_attention, LoadableMHALinearLayout, "weight-layout-transposed"),
    (checks.check_parameter_count, count_without_w_o, "missing-output-projection"),
    (checks.check_parameter_count, count_ignores_bias_flag, "wrong-value"),
    (checks.check_parameter_count, count_per_head, "wrong-value"),
    (checks.check_parameter_count, count_wrong, "wrong-value"),
    (checks.check_parameter_count, lambda d_model, num_heads, bias=True: None, "returned-none"),
    (checks.check_parameter_count, lambda d_model, num_heads, bias=True: "many", "wrong-type"),
    (checks.check_single_head_attention, SHAScaleBySeqLen, "wrong-scale"),
    (checks.check_single_head_attention, SHANoDefaults, "raised-exception"),
    (checks.check_single_head_attention, SHAAlwaysSelf, "wrong-shape"),
    (checks.check_single_head_attention, SHANoWv, "missing-attribute"),
    (checks.check_single_head_attention, SHAWrongLinearShape, "wrong-shape"),
    (checks.check_single_head_attention, SHANaNOnMaskedRow, "nan-on-masked-row"),
    (checks.check_single_head_attention, LoadableSingleHeadTransposed, "weight-layout-transposed"),
    (checks.check_single_head_attention, NotAModule, "wrong-type"),
]


def test_module_checks_leave_the_random_stream_as_it_was(capsys):
    """The modules a check builds and the dropout it draws do not move the notebook's torch random stream."""
    torch.manual_seed(0)
    expected = torch.randn(3)
    torch.manual_seed(0)
    checks.check_multi_head_attention(bug_zoo.ZooMultiHeadAttention)
    checks.check_single_head_attention(bug_zoo.ZooSingleHeadAttention)
    assert torch.equal(torch.randn(3), expected)
    assert capsys.readouterr().out.count("✓") == 2
