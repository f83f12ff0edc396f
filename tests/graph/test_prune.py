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


# --------------------------------------------------------------------------- --outputs: prune_to_outputs


def _encoder_feeds() -> dict[str, np.ndarray]:
    from output_models import encoder_with_heads

    from ortpilot.graph.feeds import make_feeds, plan_feeds

    model = encoder_with_heads()
    return make_feeds(model, plan=plan_feeds(model, {}), seed=3)


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("names", [["last_hidden_state"], ["hidden_state_1"], ["pooler_output", "last_hidden_state"]])
def test_pruned_model_has_only_the_named_outputs_with_the_full_models_values(names: list[str]) -> None:
    from output_models import encoder_with_heads

    from ortpilot.graph.prune import prune_to_outputs

    full = encoder_with_heads()
    feeds = _encoder_feeds()
    pruned = prune_to_outputs(full, names)
    onnx.checker.check_model(pruned)
    assert [o.name for o in pruned.graph.output] == names  # in the order asked
    assert [i.name for i in pruned.graph.input] == [i.name for i in full.graph.input]  # the same requests
    want, got = _outputs(full, feeds), _outputs(pruned, feeds)
    assert list(got) == names
    for name in names:
        np.testing.assert_array_equal(got[name], want[name])
    assert len(full.graph.output) == 3  # the input model is left as it was


def test_pruning_drops_what_only_the_other_outputs_need() -> None:
    from output_models import encoder_with_heads

    from ortpilot.graph.prune import prune_to_outputs

    full = encoder_with_heads()
    ops = {n.output[0] for n in prune_to_outputs(full, ["last_hidden_state"]).graph.node}
    assert "pooler_output" not in ops and "pooler/mean" not in ops  # the pooler head is gone
    inits = {i.name for i in prune_to_outputs(full, ["last_hidden_state"]).graph.initializer}
    assert "pooler.W" not in inits
    early = prune_to_outputs(full, ["hidden_state_1"])
    assert not any(n.name.startswith("encoder.layer.1") or "layer.1" in n.output[0] for n in early.graph.node)
    assert len(early.graph.node) < len(full.graph.node) // 2 + 10


def test_bad_output_names_are_usage_errors_naming_the_real_ones() -> None:
    from output_models import encoder_with_heads

    from ortpilot.errors import UsageError
    from ortpilot.graph.prune import check_outputs, prune_to_outputs

    full = encoder_with_heads()
    with pytest.raises(UsageError, match="'nope'.*its outputs are: last_hidden_state, pooler_output, hidden_state_1"):
        prune_to_outputs(full, ["last_hidden_state", "nope"])
    with pytest.raises(UsageError, match="'input_ids' is an input"):
        check_outputs(full, ["input_ids"])
    with pytest.raises(UsageError, match="at least one"):
        check_outputs(full, [])
    assert check_outputs(full, ["pooler_output", "pooler_output"]) == ["pooler_output"]


def test_an_output_that_is_also_an_input_is_refused() -> None:
    from ortpilot.errors import UsageError
    from ortpilot.graph.prune import check_outputs

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y, x])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UsageError, match="'x', which is also a graph input.*\\(y\\)"):
        check_outputs(model, ["y", "x"])
    assert check_outputs(model, ["y"]) == ["y"]


def test_a_real_model_with_if_subgraphs_prunes_to_its_speech_probability(silero_vad_path) -> None:
    """silero-vad returns ``output`` and ``stateN`` from one If node: pruning keeps the node (and the
    subgraphs' reads of outer names), drops ``stateN`` from the graph's outputs, and changes no value."""
    from ortpilot.graph.prune import prune_to_outputs

    full = onnx.load(str(silero_vad_path))
    pruned = prune_to_outputs(full, ["output"])
    assert [o.name for o in pruned.graph.output] == ["output"]
    rng = np.random.default_rng(0)
    feeds = {
        "input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    want, got = _outputs(full, feeds), _outputs(pruned, feeds)
    assert list(got) == ["output"]
    np.testing.assert_array_equal(got["output"], want["output"])
