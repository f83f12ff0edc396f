"""Quantization mode names that several layers spell (passes, profiles, the decoder gate, the CLI's
choices): one definition each, at the bottom layer, so that every layer can import them and
``ortpilot quantize --help`` loads no pass code."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DYNAMIC = "dynamic"  # INT8 weights, activations quantized at run time: no calibration
STATIC = "static"  # calibrated, written as ORT's quantized operators (QOperator)
QDQ = "qdq"  # calibrated, QuantizeLinear/DequantizeLinear pairs around the weighted ops
FULL = "full"  # calibrated, QDQ pairs on every op ORT can quantize

INT8_MODES = (DYNAMIC, STATIC, QDQ, FULL)
"""``passes.quantize``'s INT8 modes (ORT's quantizer: weights and activations)."""

CALIBRATED_MODES = tuple(m for m in INT8_MODES if m != DYNAMIC)
"""The INT8 modes that need calibration samples (``quantize_static``)."""

QDQ_MODES = (QDQ, FULL)
"""The INT8 modes written as QDQ pairs (per-channel scales need opset 13)."""

OPERATOR_MODES = tuple(m for m in INT8_MODES if m not in QDQ_MODES)
"""The INT8 modes written as ORT's integer operators (``EnableSubgraph`` reaches If/Loop bodies)."""

OPENVINO_INT8 = "openvino"  # NNCF's QDQ model for the OpenVINO EP (``passes.openvino_int8``), calibrated

INT4 = "int4"  # 4-bit MatMulNBits weights, float activations
INT8_WEIGHTS = "int8-weights"  # 8-bit MatMulNBits weights, float activations

WEIGHT_ONLY_BITS: Mapping[str, int] = MappingProxyType({INT4: 4, INT8_WEIGHTS: 8})
"""``passes.weight_only``'s modes (MatMulNBits weights, float activations) and their weight bits."""

WEIGHT_ONLY_MODES = tuple(WEIGHT_ONLY_BITS)
"""The weight-only mode names, in order: decoders built from a base model at load, gated on generation."""

DEFAULT_BLOCK_SIZE = 32
"""Weight-only: weights per quantization block (MatMulNBits' block_size)."""

DEFAULT_ACCURACY_LEVEL = 4
"""Weight-only: MatMulNBits' compute type on the CPU (4: int8 activations, fast with VNNI)."""

__all__ = [
    "CALIBRATED_MODES",
    "DEFAULT_ACCURACY_LEVEL",
    "DEFAULT_BLOCK_SIZE",
    "DYNAMIC",
    "FULL",
    "INT4",
    "INT8_MODES",
    "INT8_WEIGHTS",
    "OPENVINO_INT8",
    "OPERATOR_MODES",
    "QDQ",
    "QDQ_MODES",
    "STATIC",
    "WEIGHT_ONLY_BITS",
    "WEIGHT_ONLY_MODES",
]
