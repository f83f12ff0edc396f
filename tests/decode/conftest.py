"""Decoder fixtures for the decode tests: the demo decoder as built, and fused into GQA."""

from __future__ import annotations

import importlib.util

import onnx
import pytest


@pytest.fixture(scope="session")
def demo_decoder() -> onnx.ModelProto:
    from ortpilot.models import make_decoder

    return make_decoder()


@pytest.fixture(scope="session")
def fused_decoder(demo_decoder: onnx.ModelProto) -> onnx.ModelProto:
    if importlib.util.find_spec("onnxscript") is None:
        pytest.skip("onnxscript is not installed (pip install onnxscript): no GroupQueryAttention fusion")
    from ortpilot.passes.decoder_fusion import fuse_decoder

    return fuse_decoder(demo_decoder).model
