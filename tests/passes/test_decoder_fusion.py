"""The decoder fusion pass: a GQA per layer or a refusal that names the pattern that failed."""

from __future__ import annotations

import onnx
import pytest

pytest.importorskip("onnxscript", reason="onnxscript is not installed (pip install onnxscript)")

from ortpilot.errors import AccuracyGateError, VerificationError  # noqa: E402
from ortpilot.models import make_decoder  # noqa: E402
from ortpilot.passes.base import op_histogram  # noqa: E402
from ortpilot.passes.decoder_fusion import DecoderFusionPass, count_layers, fuse_decoder, summary  # noqa: E402


@pytest.fixture(scope="module")
def decoder() -> onnx.ModelProto:
    return make_decoder(layers=3)


def test_every_layer_gets_its_gqa(decoder: onnx.ModelProto) -> None:
    result = fuse_decoder(decoder)
    assert count_layers(decoder) == 3
    assert result.changed and result.record.fused["GroupQueryAttention"] == 3
    assert op_histogram(result.model)["Softmax"] == 0
    assert result.record.extra["onnxscript_counts"]["gqa"] == 3
    assert result.record.extra["max_abs_error"] < 1e-4
    assert "3 GroupQueryAttention" in summary(result)
    # Running it again on the fused model changes nothing.
    again = fuse_decoder(result.model)
    assert not again.changed and "already fused" in again.record.notes[0]


def _mutated(decoder: onnx.ModelProto, op: str, value: int) -> onnx.ModelProto:
    """Same math, different spelling: a positive axis where the patterns expect a negative one."""
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    for node in model.graph.node:
        if node.op_type == op and (op != "Concat" or node.output[0].startswith("present")):
            node.attribute[0].i = value
    return model


def test_gqa_pattern_failure_is_named(decoder: onnx.ModelProto) -> None:
    with pytest.raises(VerificationError, match=r"0 GroupQueryAttention for 3 layers.*SDPA matched every layer "
                                                r"but GQA only 0 of 3.*Concat\(past, new\)"):
        fuse_decoder(_mutated(decoder, "Concat", 2))


def test_sdpa_pattern_failure_is_named(decoder: onnx.ModelProto) -> None:
    with pytest.raises(VerificationError, match="SDPA matched 0 of 3 layers"):
        fuse_decoder(_mutated(decoder, "Softmax", 3))


def test_output_mismatch_is_refused(decoder: onnx.ModelProto) -> None:
    with pytest.raises(AccuracyGateError, match="changed the outputs"):
        DecoderFusionPass(atol=0.0, rtol=0.0).run(decoder)
