"""Dynamic-INT8 layer sensitivity, exclusion follow-ups, and reading attention shapes from a graph."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortpilot.graph.feeds import make_feeds
from ortpilot.measure.compare import metric_error
from ortpilot.modelio import load_model
from ortpilot.passes.quantize import QuantizePass
from ortpilot.session import load
from ortpilot.tune import tune
from ortpilot.tune.sensitivity import nodes_to_exclude, rank_dynamic
from ortpilot.tune.transform import attention_dims


def _outlier_mlp(tmp_path):
    """x -> mm1 -> (one channel x 40) -> mm2 -> mm3: mm2's input has an outlier channel, so a
    per-tensor uint8 activation scale crushes its other channels; mm1 and mm3 are benign."""
    rng = np.random.default_rng(0)
    scale = np.ones(64, np.float32)
    scale[3] = 40.0
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32) / 8, f"w{i}") for i in (1, 2, 3)]
    inits.append(numpy_helper.from_array(scale, "s"))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
             helper.make_node("Mul", ["h1", "s"], ["h1s"], name="outlier"),
             helper.make_node("MatMul", ["h1s", "w2"], ["h2"], name="mm2"),
             helper.make_node("MatMul", ["h2", "w3"], ["y"], name="mm3")]
    graph = helper.make_graph(nodes, "outlier_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64])], inits)
    path = tmp_path / "outlier.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def _error(quantized, source, heldout):
    ref, test = load(str(source)), load(quantized.SerializeToString())
    return metric_error("rel_l2", [ref.run(None, f)[0] for f in heldout], [test.run(None, f)[0] for f in heldout])


def test_ranking_finds_the_layer_fed_by_outliers_and_excluding_it_cuts_the_error(tmp_path):
    source = _outlier_mlp(tmp_path)
    proto = load_model(source)
    calibration = [make_feeds(proto, seed=i) for i in range(4)]
    heldout = [make_feeds(proto, seed=100 + i) for i in range(3)]
    ranking = rank_dynamic(source, calibration)
    assert ranking[0]["node"] == "mm2"
    assert sorted(r["node"] for r in ranking) == ["mm1", "mm2", "mm3"]
    assert [r["nsr"] for r in ranking] == sorted((r["nsr"] for r in ranking), reverse=True)
    assert nodes_to_exclude(ranking, 1.5) == ["mm2"]

    quant = QuantizePass("dynamic", per_channel=True)
    err_all = _error(quant.run(source).model, source, heldout)
    err_mm2 = _error(quant.with_excluded(["mm2"]).run(source).model, source, heldout)
    err_mm3 = _error(quant.with_excluded(["mm3"]).run(source).model, source, heldout)
    assert err_mm2 < err_mm3 < err_all * 1.01
    assert err_mm2 < err_all / 1.5  # the ranking's noise share predicts the gain


def test_ranking_covers_every_weighted_matmul_of_the_encoder(demo_paths):
    proto = load_model(demo_paths["encoder"])
    ranking = rank_dynamic(demo_paths["encoder"], [make_feeds(proto, seed=i) for i in range(2)])
    weights = {t.name for t in proto.graph.initializer}
    matmuls = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert sorted(r["node"] for r in ranking) == sorted(matmuls)
    assert all(r["nsr"] > 0 for r in ranking)


def test_nodes_to_exclude_gives_up_when_half_the_layers_would_not_do():
    ranking = [{"node": f"n{i}", "nsr": 1.0} for i in range(10)]
    assert nodes_to_exclude(ranking, 1.5) == ["n0", "n1", "n2", "n3"]  # 10 / 6 >= 1.5
    assert nodes_to_exclude(ranking, 100.0) == []
    assert nodes_to_exclude(ranking, 1.2, already=["n0"]) == ["n1", "n2"]


def test_attention_dims_reads_heads_from_a_minus_one_reshape():
    hidden, head = 64, 16
    w = numpy_helper.from_array(np.zeros((hidden, hidden), np.float32), "wq")
    b = numpy_helper.from_array(np.zeros((hidden,), np.float32), "bq")
    tail = numpy_helper.from_array(np.array([-1, head], np.int64), "tail")
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("Add", ["q0", "bq"], ["q"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["bs"]),
        helper.make_node("Concat", ["bs", "tail"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["q", "new_shape"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inits = [w, b, tail, numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    assert attention_dims(model) == (hidden // head, hidden)
    del model.graph.node[-1]  # no attention-style transpose: nothing to read
    assert attention_dims(model) == (0, 0)


def test_a_dynamic_variant_just_over_the_gate_is_retried_with_its_worst_layers_in_float(tmp_path, demo_paths):
    result = tune(str(demo_paths["encoder"]), tmp_path / "out", budget_s=18, max_error=8e-5)
    by_id = {e.candidate.id: e for e in result.entries}
    follow = [e for e in result.entries if e.candidate.passes and e.candidate.passes[-1].get("exclude")]
    assert follow, [(e.candidate.label, e.status, e.reason) for e in result.entries]
    for entry in follow:
        step = entry.candidate.passes[-1]
        parent = next(e for e in by_id.values() if e.candidate.passes and e.candidate.passes[:-1] == entry.candidate.passes[:-1]
                      and e.candidate.passes[-1] == {k: v for k, v in step.items() if k != "exclude"})
        assert parent.status == "rejected"
        assert entry.accuracy["worst_error"] < parent.accuracy["worst_error"]
        assert "-x" in entry.candidate.label
    for entry in follow:  # the layers named stay float ops in the model the follow-up built
        if entry.status in ("ok", "rejected"):
            ops = {n.name: n.op_type for n in load_model(entry.prepared["model_path"]).graph.node}
            assert {ops.get(name) for name in entry.candidate.passes[-1]["exclude"]} <= {"MatMul", "Attention"}
