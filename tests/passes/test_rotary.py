"""Constant rotary tables: folded only when they are a position-indexed table, and the limit enforced."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxscript", reason="onnxscript is not installed (pip install onnxscript)")

from ortpilot.decode.generate import generate
from ortpilot.decode.signature import detect_signature
from ortpilot.errors import UsageError
from ortpilot.models import make_decoder
from ortpilot.passes.base import op_histogram
from ortpilot.passes.decoder_fusion import DecoderFusionPass
from ortpilot.passes.rotary import COS_NAME, SIN_NAME, fold_rotary_tables
from ortpilot.passes.weight_only import tensor_bytes, weight_bytes


@pytest.fixture(scope="module")
def decoder() -> onnx.ModelProto:
    return make_decoder(layers=2, max_positions=512)


def test_fusion_stores_the_tables_and_drops_the_per_token_nodes(decoder: onnx.ModelProto) -> None:
    dynamic = DecoderFusionPass(max_positions=0).run(decoder)
    folded = DecoderFusionPass(max_positions=64).run(decoder)
    assert dynamic.record.extra["rotary"] is None and op_histogram(dynamic.model)["Cos"] == 1
    ops = op_histogram(folded.model)
    assert ops["Cos"] == ops["Sin"] == ops["Range"] == 0
    rotary = folded.record.extra["rotary"]
    assert rotary["folded"] and rotary["max_positions"] == 64 and rotary["nodes_removed"] >= 5
    tables = {t.name: t for t in folded.model.graph.initializer}
    assert list(tables[COS_NAME].dims) == list(tables[SIN_NAME].dims) == [64, rotary["rotary_dim"]]
    assert all(
        n.input[7:9] == [COS_NAME, SIN_NAME] for n in folded.model.graph.node if n.op_type == "GroupQueryAttention"
    )
    # The pass's own output check covered the folded model; both loops agree with the dynamic one.
    assert folded.record.extra["max_abs_error"] < 1e-4
    assert detect_signature(folded.model).max_positions == 64
    # The tables are not weights a step streams.
    table_bytes = sum(tensor_bytes(tables[name]) for name in (COS_NAME, SIN_NAME))
    assert table_bytes == 2 * 64 * rotary["rotary_dim"] * 4
    assert weight_bytes(folded.model) == sum(tensor_bytes(t) for t in tables.values()) - table_bytes
    # The folded model in the shared loop (its mask bound once: no node reads it) against the
    # unfused source in the plain loop, two rows at once.
    prompts = np.random.default_rng(0).integers(0, 256, (2, 9))
    assert generate(folded.model, prompts, 20, "shared").tokens == generate(decoder, prompts, 20, "plain").tokens


def test_default_is_the_exports_recorded_context(decoder: onnx.ModelProto) -> None:
    result = DecoderFusionPass().run(decoder)
    assert result.record.extra["rotary"]["max_positions"] == 512
    assert any("512 positions" in note for note in result.record.notes)


def test_generation_past_the_table_is_refused(decoder: onnx.ModelProto) -> None:
    folded = DecoderFusionPass(max_positions=16).run(decoder).model
    with pytest.raises(UsageError, match="at most 16 positions"):
        generate(folded, list(range(1, 17)), 4)
    # A prompt that fits stops at the table's end instead of running GQA past it.
    result = generate(folded, list(range(1, 11)), 20, "shared")
    assert len(result.tokens[0]) == 6 and result.stop_reason == "max_length"


def test_negative_limit_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="max_positions must be 0"):
        DecoderFusionPass(max_positions=-1)


def _gqa_graph(cos_from: list[str]) -> onnx.ModelProto:
    """One GroupQueryAttention whose cos/sin tables are computed from ``cos_from`` inputs."""
    inputs = [
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "t"]),
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, "s", 24]),
    ]
    nodes = [
        helper.make_node("Concat", cos_from, ["joined"], axis=1),
        helper.make_node("Cast", ["joined"], ["angles"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["angles", "axis0"], ["angles2"]),
        helper.make_node("Cos", ["angles2"], ["cos"]),
        helper.make_node("Sin", ["angles2"], ["sin"]),
        helper.make_node(
            "GroupQueryAttention",
            ["qkv", "", "", "", "", "seqlens", "total", "cos", "sin"],
            ["out"],
            domain="com.microsoft",
            num_heads=2,
            kv_num_heads=1,
            do_rotary=1,
        ),
    ]
    inits = [
        helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("seqlens", TensorProto.INT32, [1], [0]),
        helper.make_tensor("total", TensorProto.INT32, [], [1]),
    ]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def test_tables_that_read_more_than_positions_stay_computed() -> None:
    model = _gqa_graph(["position_ids", "attention_mask"])
    fold = fold_rotary_tables(model, 32)
    assert not fold.folded and "attention_mask" in fold.reason and "position_ids" in fold.reason
    only_mask = fold_rotary_tables(_gqa_graph(["attention_mask"]), 32)
    assert not only_mask.folded and "'attention_mask', not on position ids" in only_mask.reason
    assert op_histogram(model)["Cos"] == 1


def test_tables_whose_rows_depend_on_their_length_stay_computed() -> None:
    # cos/sin of Range(0, n) / n: 2-D and n rows long, but row k changes with n, so not a table.
    inputs = [
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"]),
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, "s", 24]),
    ]
    nodes = [
        helper.make_node("ReduceMax", ["position_ids"], ["last"], keepdims=0),
        helper.make_node("Add", ["last", "one"], ["n"]),
        helper.make_node("Range", ["zero", "n", "one"], ["steps"]),
        helper.make_node("Cast", ["steps"], ["stepsf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["stepsf", "nf"], ["angles"]),
        helper.make_node("Unsqueeze", ["angles", "axis1"], ["angles2"]),
        helper.make_node("Cos", ["angles2"], ["cos"]),
        helper.make_node("Sin", ["angles2"], ["sin"]),
        helper.make_node(
            "GroupQueryAttention",
            ["qkv", "", "", "", "", "seqlens", "total", "cos", "sin"],
            ["out"],
            domain="com.microsoft",
            num_heads=2,
            kv_num_heads=1,
            do_rotary=1,
        ),
    ]
    inits = [
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("seqlens", TensorProto.INT32, [1], [0]),
        helper.make_tensor("total", TensorProto.INT32, [], [1]),
    ]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    fold = fold_rotary_tables(model, 32)
    assert not fold.folded and "position-indexed table" in fold.reason and "[32, 1]" in fold.reason


def test_tables_not_indexed_by_position_stay_computed() -> None:
    # cos/sin of the position ids themselves: [1, seq], not a [positions, dim] table.
    fold = fold_rotary_tables(_gqa_graph(["position_ids"]), 32)
    assert not fold.folded and "position-indexed table" in fold.reason


def test_tables_the_cone_cannot_compute_alone_stay_computed() -> None:
    model = _gqa_graph(["position_ids"])
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    concat.op_type, concat.domain = "NoSuchOp", "ortpilot.test"  # ORT has no kernel for it
    model.opset_import.append(helper.make_opsetid("ortpilot.test", 1))
    fold = fold_rotary_tables(model, 32)
    assert not fold.folded and "did not run on its own" in fold.reason
    assert op_histogram(model)["Cos"] == 1
