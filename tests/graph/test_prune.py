"""Pruning: unread optional outputs unnamed, dead nodes dropped, subgraph reads respected."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortpilot.decode.signature import detect_signature
from ortpilot.graph.prune import clear_unread_outputs, remove_dead_nodes
from ortpilot.models import make_decoder


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_fused_decoder_loses_its_unread_norm_statistics() -> None:
    pytest.importorskip("onnxscript")
    from ortpilot.passes.decoder_fusion import _optimize

    fused, _ = _optimize(make_decoder(layers=2))
    norms = [n for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert norms and all(n.output[1] and n.output[2] for n in norms)  # onnxscript names mean / inv-std
    before = onnx.ModelProto()
    before.CopyFrom(fused)
    cleared = clear_unread_outputs(fused)
    assert cleared >= 2 * len(norms)
    assert all(not any(n.output[1:3]) for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization")
    sig = detect_signature(fused)
    feeds = {
        "input_ids": np.array([[5, 7, 9]]),
        "attention_mask": np.ones((1, 3), np.int64),
        "position_ids": np.array([[0, 1, 2]]),
    }
    feeds.update({c.past: np.zeros(c.shape(1, 0), np.float32) for c in sig.cache})
    for a, b in zip(_run(before, feeds), _run(fused, feeds)):
        np.testing.assert_array_equal(a, b)


def test_variadic_and_read_outputs_stay() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2),
        helper.make_node("Identity", ["a"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    assert clear_unread_outputs(model) == 0  # Split's outputs are variadic, not optional
    assert list(model.graph.node[0].output) == ["a", "b"]


def test_dead_nodes_go_but_subgraph_reads_keep_theirs() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    branch = helper.make_graph(
        [helper.make_node("Identity", ["outer"], ["r"])],
        "then",
        [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["r2"])],
        "else",
        [],
        [helper.make_tensor_value_info("r2", TensorProto.FLOAT, [1])],
    )
    nodes = [
        helper.make_node("Neg", ["x"], ["outer"]),  # read only inside the If body
        helper.make_node("Abs", ["x"], ["dead"]),  # read by nobody
        helper.make_node("Add", ["dead", "w"], ["dead2"]),
        helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other),
    ]
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x, cond], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [w]),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    assert remove_dead_nodes(model) == 2
    assert [n.op_type for n in model.graph.node] == ["Neg", "If"] and not model.graph.initializer
    (y,) = _run(model, {"x": np.array([2.0], np.float32), "c": np.array(True)})
    assert y.tolist() == [-2.0]


def test_signature_names_inputs_no_node_reads() -> None:
    pytest.importorskip("onnxscript")
    from ortpilot.passes.decoder_fusion import DecoderFusionPass

    source = make_decoder(layers=2)
    assert detect_signature(source).unread_inputs == ()
    fused = DecoderFusionPass(max_positions=64).run(source).model
    assert detect_signature(fused).unread_inputs == ("attention_mask",)
