"""The reference: transformers' Qwen3-Next layers, built offline from tiny configs with random weights.

Without the optional kernel packages (flash-linear-attention, causal-conv1d; do not install them on a CPU machine:
with them transformers binds GPU kernels) ``Qwen3NextGatedDeltaNet`` runs its pure-PyTorch fallbacks and logs a
one-line notice per function: :func:`quiet_transformers` silences that logger. The fallbacks compute the
recurrence in float32 whatever the module's dtype, so a comparison with the course's layer is made in float32.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

# build_hf_attention and hf_forward are re-exported: Qwen3-Next's attention is family "qwen3_next" there
from ..modern.hf import build_hf_attention, hf_forward, random_weights  # noqa: F401

KERNEL_LOGGER = "transformers.integrations.hub_kernels"


def quiet_transformers() -> None:
    """Silence transformers' "falling back to its reference PyTorch implementation" notices (one per function)."""
    logging.getLogger(KERNEL_LOGGER).setLevel(logging.ERROR)


def build_hf_gated_deltanet(*, dtype=torch.float32, seed: int = 0, scale: float = 0.3, **config):
    """transformers' ``Qwen3NextGatedDeltaNet`` from a config of the given sizes, every parameter ~ N(0, scale^2).

    ``config`` holds Qwen3NextConfig keyword arguments: hidden_size, linear_num_key_heads, linear_num_value_heads,
    linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim (and hidden_act to see a refusal).
    Random norm weights, A_log and dt_bias make those parameters visible (a wrong copy would not hide).
    """
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    quiet_transformers()
    hf_config = Qwen3NextConfig(num_hidden_layers=1, layer_types=["linear_attention"], intermediate_size=8,
                                vocab_size=16, **config)
    return random_weights(Qwen3NextGatedDeltaNet(hf_config, 0), seed=seed, dtype=dtype, scale=scale)


def hf_deltanet_forward(layer, x: Tensor) -> Tensor:
    """Run transformers' Gated DeltaNet layer on x (B, T, D) without a cache (its chunked fallback) -> (B, T, D)."""
    quiet_transformers()
    with torch.no_grad():
        return layer(x)


def build_hf_kimi_delta(*, dtype=torch.float32, seed: int = 0, scale: float = 0.3, **config):
    """transformers' ``KimiLinearDeltaAttention`` from a config of the given sizes, every parameter ~ N(0, scale^2).

    ``config`` holds KimiLinearConfig keyword arguments: hidden_size, linear_num_heads, linear_head_dim,
    linear_conv_kernel_dim (and hidden_act to see a refusal).
    """
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    quiet_transformers()
    hf_config = KimiLinearConfig(num_hidden_layers=1, layer_types=["linear_attention"], intermediate_size=8,
                                 vocab_size=16, pad_token_id=None, bos_token_id=None, eos_token_id=None, **config)
    return random_weights(KimiLinearDeltaAttention(hf_config, 0), seed=seed, dtype=dtype, scale=scale)
