"""Weight-only INT4/INT8 on the demo decoder: MatMulNBits everywhere, GQA kept, every loop runs it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortpilot.decode.generate import generate
from ortpilot.errors import UsageError
from ortpilot.models import make_cnn, make_decoder
from ortpilot.passes.decoder_fusion import DecoderFusionPass
from ortpilot.passes.weight_only import (
    WeightOnlyPass,
    find_targets,
    layer_groups,
    weight_bytes,
    weight_only_summary,
)
from ortpilot.passes.weight_only_fused import quantize_weight_only

LAYERS = 2
WEIGHT_MATMULS = LAYERS * 7 + 1  # q k v o gate up down per layer, plus lm_head
PACKED = LAYERS * 4 + 1  # q/k/v and gate/up read the same input: one MatMulNBits (+ Split) each


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def attr(node: onnx.NodeProto, name: str) -> int:
    return next(a.i for a in node.attribute if a.name == name)


@pytest.fixture(scope="module")
def decoder() -> onnx.ModelProto:
    return make_decoder(layers=LAYERS)


@pytest.fixture(scope="module")
def fused(decoder: onnx.ModelProto) -> onnx.ModelProto:
    return DecoderFusionPass().run(decoder).model


def full_logits(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    """Logits of every position with an empty past: the ground truth the loops must reproduce."""
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None]}
    for i in range(LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, 2, 0, 16), np.float32)
    return ort.InferenceSession(model.SerializeToString()).run(["logits"], feeds)[0]


def test_int4_replaces_every_weight_matmul(decoder: onnx.ModelProto) -> None:
    result = WeightOnlyPass("int4", block_size=32).run(decoder)
    counts = ops(result.model)
    assert counts["MatMulNBits"] == PACKED and counts["Split"] == 2 * LAYERS
    assert result.record.extra["matmuls_quantized"] == WEIGHT_MATMULS
    assert result.record.extra["matmuls_packed_away"] == WEIGHT_MATMULS - PACKED
    assert counts["GatherBlockQuantized"] == 1 and counts["Gather"] == 0
    assert not find_targets(result.model)  # no float weight MatMul or embedding left
    nodes = [n for n in result.model.graph.node if n.op_type == "MatMulNBits"]
    assert {attr(n, "bits") for n in nodes} == {4}
    assert {attr(n, "block_size") for n in nodes} == {32}
    assert {attr(n, "accuracy_level") for n in nodes} == {4}
    assert all(len(n.input) == 3 for n in nodes)  # symmetric: no zero points
    extra = result.record.extra
    assert extra["weight_bytes_before"] == weight_bytes(decoder)
    assert extra["weight_bytes_after"] == weight_bytes(result.model)
    assert extra["weight_bytes_after"] * 4 < extra["weight_bytes_before"]
    assert result.record.quantized_nodes == PACKED + 1
    # It runs in ORT and stays close to the float model (random weights: a loose bound).
    ids = np.random.default_rng(0).integers(0, 256, (1, 9))
    ref, out = full_logits(decoder, ids), full_logits(result.model, ids)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.5
    # Packing changes how many kernels run, not what they compute: each column is quantized alone.
    unpacked = WeightOnlyPass("int4", block_size=32, pack=False).run(decoder).model
    assert ops(unpacked)["MatMulNBits"] == WEIGHT_MATMULS and not ops(unpacked)["Split"]
    np.testing.assert_allclose(full_logits(unpacked, ids), out, rtol=1e-4, atol=1e-4)


def test_int8_weights_keeps_float_embedding(decoder: onnx.ModelProto) -> None:
    result = WeightOnlyPass("int8-weights").run(decoder)
    counts = ops(result.model)
    assert counts["MatMulNBits"] == PACKED and counts["Gather"] == 1
    assert {attr(n, "bits") for n in result.model.graph.node if n.op_type == "MatMulNBits"} == {8}
    assert any("4-bit only" in note for note in result.record.notes)
    ids = np.random.default_rng(1).integers(0, 256, (1, 9))
    ref, out = full_logits(decoder, ids), full_logits(result.model, ids)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.05


def test_asymmetric_adds_zero_points(decoder: onnx.ModelProto) -> None:
    model = WeightOnlyPass("int4", symmetric=False, accuracy_level=1).run(decoder).model
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert nodes and all(len(n.input) == 4 for n in nodes)
    assert {attr(n, "accuracy_level") for n in nodes} == {1}
    ort.InferenceSession(model.SerializeToString())


def test_fusion_then_int4_runs_in_every_loop(decoder: onnx.ModelProto, tmp_path) -> None:
    out = tmp_path / "int4.onnx"
    result = quantize_weight_only(decoder, out, "int4", block_size=16, fuse=True)
    assert [r.name for r in result.records] == ["decoder-fusion", "weight_only"]
    model = onnx.load(out)
    counts = ops(model)
    assert counts["GroupQueryAttention"] == LAYERS
    assert counts["MatMulNBits"] == PACKED and not find_targets(model)
    assert counts["Split"] == LAYERS  # gate/up; GQA reads the packed q/k/v itself
    summary = weight_only_summary(result)
    assert summary["matmuls_quantized"] == PACKED and summary["compression"] > 4  # the fusion packed them
    for length in (1, 7):
        prompt = np.random.default_rng(length).integers(0, 256, length).tolist()
        tokens = {loop: generate(out, prompt, 12, loop).tokens for loop in ("plain", "bound", "shared")}
        assert tokens["plain"] == tokens["bound"] == tokens["shared"], tokens
        assert len(tokens["plain"][0]) == 12


def test_nodes_to_exclude_stay_float(fused: onnx.ModelProto) -> None:
    layer0 = layer_groups(fused)["layer 0"]
    assert len(layer0) == 4  # the fusion packed q/k/v and gate/up
    model = WeightOnlyPass("int4", nodes_to_exclude=layer0).run(fused).model
    counts = ops(model)
    # The excluded layer's 4 MatMuls stay, next to the fused graph's rotary-table MatMul (no weight).
    assert counts["MatMul"] == ops(fused)["MatMul"] - PACKED + 4
    assert counts["MatMulNBits"] == PACKED - 4
    assert {t.node for t in find_targets(model)} == set(layer0)


def test_second_pass_does_not_quantize_twice(decoder: onnx.ModelProto) -> None:
    once = WeightOnlyPass("int4").run(decoder)
    twice = WeightOnlyPass("int4").run(once.model)
    assert not twice.changed
    assert twice.record.extra["already_quantized"] is True
    assert "already weight-only quantized" in twice.record.notes[0]
    assert ops(twice.model) == ops(once.model)


def test_block_size_that_does_not_divide_is_refused_naming_the_tensor() -> None:
    model = make_decoder(layers=1, hidden=48, heads=4, kv_heads=2)  # K = 48 for the projections
    with pytest.raises(UsageError, match=r"does not divide .*'model\.(embed_tokens|layers\.0\.[a-z_.]+)\.weight'"):
        WeightOnlyPass("int4", block_size=32).run(model)
    WeightOnlyPass("int4", block_size=16).run(model)  # 16 divides 48 and 192


def test_model_without_matmul_weights_says_so() -> None:
    with pytest.raises(UsageError, match="no MatMul with a constant float weight"):
        WeightOnlyPass("int4").run(make_cnn())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "int3"}, "Unknown weight-only mode"),
        ({"block_size": 24}, "power of two"),
        ({"block_size": 8}, "at least 16"),
        ({"accuracy_level": 7}, "accuracy-level"),
    ],
)
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        WeightOnlyPass(**kwargs)


def test_unknown_excluded_node_is_refused(decoder: onnx.ModelProto) -> None:
    with pytest.raises(UsageError, match="not quantizable"):
        WeightOnlyPass("int4", nodes_to_exclude=["no/such/MatMul"]).run(decoder)


def test_mixed_precision_keeps_chosen_nodes_in_8_bits(decoder: onnx.ModelProto) -> None:
    wide = ["model.layers.0.mlp.up_proj/MatMul", "model.embed_tokens/Gather"]
    result = WeightOnlyPass("int4", nodes_in_int8=wide).run(decoder)
    bits = {n.name: attr(n, "bits") for n in result.model.graph.node if n.op_type == "MatMulNBits"}
    assert bits.pop("model.layers.0.mlp.up_proj/MatMul_Q8") == 8 and set(bits.values()) == {4}
    assert ops(result.model)["Gather"] == 1  # no 8-bit block-quantized Gather in ORT: the embedding stays float
    assert result.record.extra["int8_nodes"] == ["model.layers.0.mlp.up_proj/MatMul"]
    ort.InferenceSession(result.model.SerializeToString())


def test_tied_lm_head_fused_matmul_is_quantized() -> None:
    """onnxscript fuses a tied LM head into FusedMatMul(x, E, transB=1); it must become MatMulNBits too."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((64, 32)).astype(np.float32)  # [vocab, hidden], shared with the embedding
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "ids"], ["h"], name="embed"),
            helper.make_node("FusedMatMul", ["h", "E"], ["logits"], name="lm_head", domain="com.microsoft", transB=1),
        ],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5, 64])],
        [numpy_helper.from_array(table, "E")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    assert [t.op_type for t in find_targets(model)] == ["Gather", "FusedMatMul"]
    quantized = WeightOnlyPass("int4", block_size=16).run(model).model
    assert ops(quantized) == Counter({"GatherBlockQuantized": 1, "MatMulNBits": 1})
    ids = np.array([[1, 5, 9, 63, 0]])
    ref = table[ids] @ table.T
    out = ort.InferenceSession(quantized.SerializeToString()).run(None, {"ids": ids})[0]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.2


def test_pack_weight_matmuls_keeps_float_outputs(decoder: onnx.ModelProto) -> None:
    from ortpilot.passes.weight_only import pack_weight_matmuls

    packed = pack_weight_matmuls(decoder)
    assert ops(packed)["MatMul"] == ops(decoder)["MatMul"] - (WEIGHT_MATMULS - PACKED)
    assert ops(packed)["Split"] == 2 * LAYERS
    assert abs(weight_bytes(packed) - weight_bytes(decoder)) < 1024  # the unpacked weights are gone
    ids = np.random.default_rng(2).integers(0, 256, (1, 7))
    np.testing.assert_allclose(full_logits(packed, ids), full_logits(decoder, ids), rtol=1e-5, atol=1e-5)


def test_packed_matmuls_keep_their_layer_from_export_metadata(decoder: onnx.ModelProto) -> None:
    """Exports name nodes node_linear_N and keep the module path in metadata; packing keeps it too."""
    from ortpilot.passes.weight_only import _SCOPE_KEYS, pack_weight_matmuls

    model = DecoderFusionPass(pack=False).run(decoder).model
    for i, node in enumerate(model.graph.node):
        entry = node.metadata_props.add()
        entry.key, entry.value = sorted(_SCOPE_KEYS)[0], node.name
        node.name = f"node_{i}"
    assert len(layer_groups(model)["layer 0"]) == 7
    packed = pack_weight_matmuls(model, untranspose=False)
    groups = layer_groups(packed)
    assert len(groups["layer 0"]) == 4 and len(groups["layer 1"]) == 4
    assert all(name.startswith("layer") or "lm_head" in name or "embed" in name for name in groups)
