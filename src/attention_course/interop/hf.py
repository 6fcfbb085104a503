"""The course's side of Hugging Face ``transformers``: the helpers every
``from_hf`` shares.

``transformers`` is imported only when a conversion needs it
(:meth:`HFTwin.load`): the course runs without it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class HFTwin:
    """The transformers class a course class mirrors (each such class holds one
    as ``hf_twin``).

    ``module`` is its module under ``transformers.models``, ``name`` the class;
    ``config`` and ``rotary`` name the config and rotary-embedding classes that
    build and run one layer of it offline (chapter 14's reference).
    """

    module: str
    name: str
    config: str | None = None
    rotary: str | None = None

    def load(self, name: str | None = None):
        """The transformers class ``name`` (default: the twin itself) of this
        module, imported only now."""
        return getattr(
            importlib.import_module(f"transformers.models.{self.module}"),
            name or self.name,
        )


def check_hf_module(cls, module) -> None:
    """Raise TypeError unless module is the transformers class that ``cls``
    mirrors."""
    expected = cls.hf_twin.load()
    if not isinstance(module, expected):
        raise TypeError(
            f"{cls.__name__}.from_hf mirrors transformers' "
            f"{expected.__name__}, got "
            f"{type(module).__module__}.{type(module).__name__}"
        )


def copy_linear(target: nn.Linear, source: nn.Linear) -> None:
    """Copy an nn.Linear's weight and bias (shapes must agree)."""
    target.weight.data.copy_(source.weight.data)
    if source.bias is not None:
        target.bias.data.copy_(source.bias.data)


# the layer types that attend over a sliding window
WINDOWED = (
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
)


def hf_window(module) -> int | None:
    """The window of an HF attention layer (None: plain causal):
    ``config.sliding_window`` where it is a sliding one.

    Models that mix layer types name each layer in ``config.layer_types``;
    Mistral, which has none, applies its window (if any) to every layer, and
    DeepSeek V4's compressed layers keep the window beside their entries.
    """
    config = module.config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return window
    return window if layer_types[module.layer_idx] in WINDOWED else None
