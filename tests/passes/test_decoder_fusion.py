"""The decoder fusion pass: a GQA per layer or a refusal that names the pattern that failed."""

from __future__ import annotations

import onnx
import pytest

pytest.importorskip("onnxscript", reason="onnxscript is not installed (pip install onnxscript)")

from ortpilot.errors import AccuracyGateError, VerificationError
from ortpilot.models import make_decoder
from ortpilot.passes.base import op_histogram
from ortpilot.passes.decoder_fusion import (
    DecoderFusionPass,
    count_layers,
    fuse_decoder,
    summary,
)


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
    with pytest.raises(
        VerificationError,
        match=r"0 GroupQueryAttention for 3 layers.*SDPA matched every layer "
        r"but GQA only 0 of 3.*Concat\(past, new\)",
    ):
        fuse_decoder(_mutated(decoder, "Concat", 2))


def test_sdpa_pattern_failure_is_named(decoder: onnx.ModelProto) -> None:
    with pytest.raises(VerificationError, match="SDPA matched 0 of 3 layers"):
        fuse_decoder(_mutated(decoder, "Softmax", 3))


def test_output_mismatch_is_refused(decoder: onnx.ModelProto) -> None:
    with pytest.raises(AccuracyGateError, match="changed the outputs"):
        DecoderFusionPass(atol=0.0, rtol=0.0).run(decoder)


def test_packing_gives_gqa_the_packed_qkv(decoder: onnx.ModelProto) -> None:
    """q/k/v become one MatMul whose output GQA reads directly; gate/up one MatMul and a Split."""
    packed, unpacked = fuse_decoder(decoder), DecoderFusionPass(pack=False).run(decoder)
    before, after = op_histogram(unpacked.model), op_histogram(packed.model)
    assert after["MatMul"] == before["MatMul"] - 3 * 3  # per layer: q/k/v 3 -> 1, gate/up 2 -> 1
    assert after.get("Split", 0) == before.get("Split", 0) + 3  # gate/up only
    gqas = [n for n in packed.model.graph.node if n.op_type == "GroupQueryAttention"]
    producers = {o: n for n in packed.model.graph.node for o in n.output}
    for gqa in gqas:
        assert gqa.input[1] == gqa.input[2] == ""
        assert producers[gqa.input[0]].op_type == "MatMul"
    assert packed.record.extra["max_abs_error"] < 1e-4  # checked against the source like any fusion
    assert any("packed" in note for note in packed.record.notes)


def test_cached_fusion_is_built_once(decoder: onnx.ModelProto, tmp_path) -> None:
    from ortpilot.artifacts.store import ModelStore

    store = ModelStore(tmp_path / "cache")
    first = DecoderFusionPass(use_cache=True, store=store).run(decoder)
    second = DecoderFusionPass(use_cache=True, store=store).run(decoder)
    assert first.record.extra["cache_hit"] is False and second.record.extra["cache_hit"] is True
    assert summary(second).endswith("from the cache)") and summary(first).endswith("cached)")
    assert second.record.fused == first.record.fused and second.record.fused["GroupQueryAttention"] == 3
    assert second.model.SerializeToString() == first.model.SerializeToString()
    assert len(store.entries()) == 1
    # Other options are another entry, not a stale hit.
    DecoderFusionPass(use_cache=True, store=store, pack=False).run(decoder)
    assert len(store.entries()) == 2
