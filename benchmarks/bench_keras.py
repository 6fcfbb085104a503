"""Keras (TensorFlow backend): the course's KerasMultiHeadAttention vs keras.layers.MultiHeadAttention, CPU fp32.

Causal self-attention, B=8, T=1024, D=768, H=12 (the size of bench_mha_block), same weights in both layers, called
eagerly as a user would; TensorFlow limited to 2 intra-op threads. Ours gets the course's boolean causal mask
(True = may attend); Keras' layer gets use_causal_mask=True. The ratio is reported (no target).

Usage: python benchmarks/bench_keras.py [--repeats N]
"""

from __future__ import annotations

import argparse

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(common.THREADS)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

from attention_course import numpy_ref  # noqa: E402
from attention_course.keras_attention import KerasMultiHeadAttention  # noqa: E402

B, T, D, H = 8, 1024, 768, 12


def build(d: int, h: int, seed: int = 0):
    """Keras' layer with seeded random weights, and ours loaded with the very same weights."""
    keras.utils.set_random_seed(seed)
    theirs = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d // h)
    theirs.build((None, None, d), (None, None, d))
    return KerasMultiHeadAttention.from_keras(theirs), theirs


def candidates(x, ours, theirs) -> dict:
    t = x.shape[1]
    mask = tf.constant(numpy_ref.causal_mask(t))  # (Tq, Tk), True = may attend
    return {
        "ours (KerasMultiHeadAttention)": lambda: ours(x, mask=mask),
        "keras.layers.MultiHeadAttention": lambda: theirs(x, x, use_causal_mask=True),
    }


def check_small() -> None:
    ours, theirs = build(48, 4, seed=1)
    x = np.random.default_rng(0).normal(size=(2, 16, 48)).astype("float32")
    ref, _ = numpy_ref.multi_head_attention(x, x, x, ours.numpy_params(), 4, numpy_ref.causal_mask(16))
    for name, fn in candidates(tf.constant(x), ours, theirs).items():
        common.check(f"{name} vs float64 reference (small)", common.max_abs_diff(np.asarray(fn()), ref), 1e-5)


def main(repeats: int = 5) -> dict:
    extra = {"B": B, "T": T, "D": D, "H": H, "causal": True, "dtype": "float32",
             "keras_backend": keras.backend.backend(), "tf_intra_op_threads": common.THREADS}
    config = common.setup("bench_keras", extra)
    check_small()
    ours, theirs = build(D, H)
    x = tf.constant(np.random.default_rng(0).normal(size=(B, T, D)).astype("float32"))
    cands = candidates(x, ours, theirs)
    outs = [np.asarray(fn()) for fn in cands.values()]
    common.check("ours vs keras (full size)", float(np.abs(outs[0] - outs[1]).max()), 1e-4)
    times = common.interleaved({n: (lambda f=f: np.asarray(f())) for n, f in cands.items()}, repeats=repeats, warmup=1)
    base = common.fastest(times["keras.layers.MultiHeadAttention"])
    headers = ["layer", "fastest ms", "median ms", "time / keras"]
    rows = [[n, f"{common.fastest(ts) * 1e3:.0f}", f"{common.median(ts) * 1e3:.0f}", f"{common.fastest(ts) / base:.2f}"]
            for n, ts in times.items()]  # fmt: skip
    print()
    print(common.markdown_table(headers, rows))
    common.save("bench_keras", config, table={"headers": headers, "rows": rows})
    return {"rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    main(parser.parse_args().repeats)
