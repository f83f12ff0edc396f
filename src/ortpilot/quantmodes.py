"""Quantization mode names that several layers spell (passes, profiles, the decoder gate, the CLI's
choices): one definition each, at the bottom layer, so that every layer can import them and
``ortpilot quantize --help`` loads no pass code."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

INT8_MODES = ("dynamic", "static", "qdq", "full")
"""``passes.quantize``'s INT8 modes (ORT's quantizer: weights and activations)."""

WEIGHT_ONLY_BITS: Mapping[str, int] = MappingProxyType({"int4": 4, "int8-weights": 8})
"""``passes.weight_only``'s modes (MatMulNBits weights, float activations) and their weight bits."""

WEIGHT_ONLY_MODES = tuple(WEIGHT_ONLY_BITS)
"""The weight-only mode names, in order: decoders built from a base model at load, gated on generation."""

__all__ = ["INT8_MODES", "WEIGHT_ONLY_BITS", "WEIGHT_ONLY_MODES"]
