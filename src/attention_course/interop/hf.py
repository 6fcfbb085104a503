"""The course's side of Hugging Face ``transformers``: the helpers every ``from_hf`` shares.

``transformers`` is imported only when a conversion needs it (:func:`hf_class`): the course runs without it.
"""

from __future__ import annotations

import importlib

from torch import nn


def hf_class(path: str):
    """The transformers class ``"module.Class"`` (imported only when a conversion needs it)."""
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(f"transformers.models.{module}"), name)


def check_hf_module(cls, module) -> None:
    """Raise TypeError unless module is the transformers class that ``cls`` mirrors."""
    expected = hf_class(cls.hf_class)
    if not isinstance(module, expected):
        raise TypeError(
            f"{cls.__name__}.from_hf mirrors transformers' {expected.__name__}, got "
            f"{type(module).__module__}.{type(module).__name__}"
        )


def copy_linear(target: nn.Linear, source: nn.Linear) -> None:
    """Copy an nn.Linear's weight and bias (shapes must agree)."""
    target.weight.data.copy_(source.weight.data)
    if source.bias is not None:
        target.bias.data.copy_(source.bias.data)


def hf_window(module) -> int | None:
    """The window of an HF attention layer (None: plain causal): ``config.sliding_window`` where it is a sliding one.

    Models that mix layer types name each layer in ``config.layer_types``; Mistral, which has none, applies its
    window (if any) to every layer.
    """
    config = module.config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return window
    return window if layer_types[module.layer_idx] == "sliding_attention" else None
