"""RoPE for long contexts: rescaled rotation frequencies (Llama 3's rule and
YaRN).

A model trained on sequences of ``original_max_positions`` tokens has seen
every angle ``m * theta_i`` of its fast pairs many times, but its slow pairs
(wavelength ``2 pi / theta_i`` longer than the training context) never turned a
full circle: at longer positions they produce angles the model has never seen.
Both rules slow down (divide by ``factor``) the frequencies whose wavelength is
too long, keep the fast ones, and blend in between:

* **Llama 3** (Meta's Llama 3.1 release; ``rope_type="llama3"``): wavelengths
  above ``original / low_freq_factor`` are divided by ``factor``, those below
  ``original / high_freq_factor`` are kept, and the band between is
  interpolated linearly in ``original / wavelength``.
* **YaRN** (Peng et al., 2023; GPT-OSS's default, DeepSeek-V3): the blend runs
  over the pair index, between the pairs that turn ``beta_fast`` and
  ``beta_slow`` times over the original context, and cos and sin are multiplied
  by an attention factor ``0.1 ln(factor) + 1`` (scores by its square) to keep
  the softmax as sharp as before.

Each function returns float64 ``(Dh/2,)`` frequencies for
:func:`~attention_course.positions.apply_rope` (``inv_freq=``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..positions import check_base, inverse_frequencies
from ..validation import check_int


def check_factor(value, name: str) -> None:
    """Raise TypeError unless value is a real number, ValueError unless it is
    finite and > 0."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {name}={value}")


def llama3_frequencies(
    inv_freq: Tensor,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_positions: int,
) -> Tensor:
    """Llama 3's rescaled frequencies: slow pairs divided by ``factor``, fast
    pairs kept, a linear blend between.

    ``inv_freq`` (Dh/2,) are the frequencies of plain RoPE, e.g.
    ``inverse_frequencies(128, 500000.0)``.
    """
    for name, value in (
        ("factor", factor),
        ("low_freq_factor", low_freq_factor),
        ("high_freq_factor", high_freq_factor),
    ):
        check_factor(value, name)
    check_int(original_max_positions, "original_max_positions")
    if high_freq_factor <= low_freq_factor:
        raise ValueError(
            f"high_freq_factor={high_freq_factor} must be > "
            f"low_freq_factor={low_freq_factor}"
        )
    inv_freq = inv_freq.to(torch.float64)
    wavelength = 2 * math.pi / inv_freq
    # 0 for wavelengths beyond original / low (slow: divide), 1 below original
    # / high (fast: keep).
    keep = (
        (original_max_positions / wavelength - low_freq_factor)
        / (high_freq_factor - low_freq_factor)
    ).clamp(0, 1)
    return (1 - keep) * inv_freq / factor + keep * inv_freq


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature correction ``0.1 * mscale * ln(factor) + 1`` (1 when
    the context is not stretched)."""
    check_factor(factor, "factor")
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(
    dim: int,
    base: float,
    *,
    factor: float,
    original_max_positions: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> Tensor:
    """YaRN's frequencies for a head of ``dim`` rotated features: a blend over
    the pair index i.

    Pairs that turn more than ``beta_fast`` times over the original context
    keep their frequency; pairs that turn fewer than ``beta_slow`` times are
    divided by ``factor``; in between, the weight of the kept frequency falls
    linearly with i. ``truncate`` rounds the two boundary indices outwards
    (floor and ceil), as the reference code. Multiply cos and sin by
    :func:`yarn_attention_factor` as well.
    """
    check_int(dim, "dim")
    if dim % 2:
        raise ValueError(
            f"dim must be even (RoPE rotates pairs of features), got dim={dim}"
        )
    check_base(base)
    check_factor(factor, "factor")
    check_int(original_max_positions, "original_max_positions")

    # the (fractional) pair index that turns `turns` times
    def pair_turning(turns: float) -> float:
        return (
            dim
            * math.log(original_max_positions / (turns * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    # a step, not a division by zero
    high = high + 0.001 if high == low else high
    inv_freq = inverse_frequencies(dim, base)  # (dim/2,)
    keep = 1 - (
        (torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)
    ).clamp(0, 1)
    return (1 - keep) * inv_freq / factor + keep * inv_freq


def rope_from_config(
    rope_parameters: dict, dim: int, max_positions: int | None = None
) -> tuple[Tensor, float]:
    """(inv_freq (dim/2,) float64, cos/sin factor) from a Hugging Face
    ``rope_parameters`` dict.

    Reads ``rope_type`` ("default", "llama3" or "yarn"), ``rope_theta`` and the
    type's own keys; YaRN without a ``factor`` stretches
    ``original_max_position_embeddings`` to ``max_positions`` (DeepSeek-V3's
    rule).
    """
    if not isinstance(rope_parameters, dict):
        raise TypeError(
            "rope_parameters must be a dict, got "
            f"{type(rope_parameters).__name__}"
        )
    rope_type, base = (
        rope_parameters.get("rope_type", "default"),
        rope_parameters["rope_theta"],
    )
    if rope_parameters.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            "partial_rotary_factor != 1 (RoPE on part of the head) is not "
            "supported"
        )
    if rope_type == "default":
        return inverse_frequencies(dim, base), 1.0
    original = rope_parameters["original_max_position_embeddings"]
    if rope_type == "llama3":
        return llama3_frequencies(
            inverse_frequencies(dim, base),
            factor=rope_parameters["factor"],
            original_max_positions=original,
            low_freq_factor=rope_parameters["low_freq_factor"],
            high_freq_factor=rope_parameters["high_freq_factor"],
        ), 1.0
    if rope_type == "yarn":
        factor = rope_parameters.get("factor") or max_positions / original
        inv_freq = yarn_frequencies(
            dim,
            base,
            factor=factor,
            original_max_positions=original,
            beta_fast=rope_parameters.get("beta_fast") or 32.0,
            beta_slow=rope_parameters.get("beta_slow") or 1.0,
            truncate=rope_parameters.get("truncate", True),
        )
        attention_factor = rope_parameters.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all = (
                rope_parameters.get("mscale"),
                rope_parameters.get("mscale_all_dim"),
            )
            attention_factor = (
                yarn_attention_factor(factor, mscale)
                / yarn_attention_factor(factor, mscale_all)
                if mscale and mscale_all
                else yarn_attention_factor(factor)
            )
        return inv_freq, float(attention_factor)
    raise ValueError(
        "rope_type must be 'default', 'llama3' or 'yarn', got "
        f"rope_type={rope_type!r}"
    )
