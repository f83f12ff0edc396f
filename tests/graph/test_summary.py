"""Static model summary and the kernel-registry op-support check."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortpilot.graph.flops import total_flops
from ortpilot.graph.summary import summarize
from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION, load_model
from ortpilot.session.opsupport import kernel_gaps, unsupported_ops


def test_demo_cnn_summary_matches_the_graph(demo_paths):
    path = demo_paths["cnn"]
    model = onnx.load(str(path))
    doc = summarize(model, path).to_dict()
    assert doc["inputs"] == [{"name": "image", "dtype": "float32", "dims": ["batch", 3, 32, 32]}]
    assert doc["outputs"][0]["dims"][0] == "batch"
    assert doc["ir_version"] == SAFE_IR_VERSION and doc["opsets"] == {"ai.onnx": DEFAULT_OPSET}
    assert doc["node_count"] == len(model.graph.node) == sum(doc["op_histogram"].values())
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert doc["parameters"]["count"] == sum(w.size for w in weights)
    assert doc["parameters"]["bytes"] == sum(w.nbytes for w in weights)
    assert doc["flops"]["total"] == total_flops(model) and doc["flops"]["shapes"] == {"image": [1, 3, 32, 32]}
    assert doc["file_bytes"] == path.stat().st_size and doc["external_data"] == []


def test_given_shapes_scale_flops(demo_paths):
    model = onnx.load(str(demo_paths["encoder"]))
    one = summarize(model, shapes={"batch": (1,)}).flops["total"]
    four = summarize(
        model, shapes={"input_ids": (4, 128), "attention_mask": (4, 128), "token_type_ids": (4, 128)}
    ).flops["total"]
    assert four == pytest.approx(4 * one)


def test_external_data_is_listed_and_sized_without_loading_it(tmp_path, demo_paths):
    model = onnx.load(str(demo_paths["mlp"]))
    expected = summarize(model).parameters
    out = tmp_path / "ext.onnx"
    onnx.save(
        model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0
    )
    light = load_model(out, load_external_data=False)
    doc = summarize(light, out).to_dict()
    assert doc["parameters"] == expected
    [ext] = doc["external_data"]
    assert ext["location"] == "w.bin" and ext["present"] and ext["bytes"] == (tmp_path / "w.bin").stat().st_size


def test_unresolvable_dims_give_a_flops_error_that_names_the_fix():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    flops = summarize(helper.make_model(graph)).flops
    assert flops["total"] is None and "--shape x=" in flops["error"]


def test_subgraph_nodes_are_counted(silero_vad_path):
    doc = summarize(onnx.load(str(silero_vad_path))).to_dict()
    assert doc["op_histogram"].get("If", 0) >= 1 and doc["subgraph_node_count"] > 0


def _op_model(node: onnx.NodeProto, opsets) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = SAFE_IR_VERSION
    return model


def test_kernel_registry_flags_a_custom_op_and_nothing_else():
    custom = _op_model(helper.make_node("NoSuchOp", ["x"], ["y"], domain="my.ops"), [("", 18), ("my.ops", 1)])
    assert kernel_gaps(custom).ops == {"my.ops.NoSuchOp": 1}
    contrib = _op_model(
        helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft"), [("", 18), ("com.microsoft", 1)]
    )
    assert kernel_gaps(contrib).ops == {}
    # Gelu (opset 20) is an ONNX function; ORT expands it when it has no kernel.
    gelu = _op_model(helper.make_node("Gelu", ["x"], ["y"]), [("", 20)])
    assert kernel_gaps(gelu).ops == {}


def test_constant_nodes_are_not_listed_ort_folds_them_at_load():
    """ORT's CPU registry has no Constant kernel, yet a session with every graph optimization off
    (no constant folding) runs the model: Constant nodes become initializers when the graph loads."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C

    assert not any(k.op_name == "Constant" and k.provider == "CPUExecutionProvider" for k in C.get_all_opkernel_def())

    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [1, 4], [1] * 4)),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = SAFE_IR_VERSION
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.zeros((1, 4), np.float32)})[0].tolist() == [[1.0] * 4]
    assert kernel_gaps(model).ops == {}
    # a real op without a kernel beside it is still listed
    model.graph.node.append(helper.make_node("NoSuchOp", ["y"], ["z"], domain="my.ops"))
    model.graph.output[0].name = "z"
    model.opset_import.append(helper.make_opsetid("my.ops", 1))
    assert kernel_gaps(model).ops == {"my.ops.NoSuchOp": 1}


@pytest.mark.realmodels
def test_constant_nodes_in_subgraphs_of_a_real_model_are_not_listed(silero_vad_path):
    from ortpilot.graph.summary import iter_subgraph_nodes

    model = onnx.load(str(silero_vad_path))  # 341 Constant nodes, most inside If branches
    assert sum(n.op_type == "Constant" for n in [*model.graph.node, *iter_subgraph_nodes(model.graph)]) > 300
    assert kernel_gaps(model).ops == {}


def test_unsupported_ops_checks_every_available_provider(demo_paths):
    model = onnx.load(str(demo_paths["cnn"]))
    import onnxruntime as ort

    report = {o.provider: o for o in unsupported_ops(model, str(demo_paths["cnn"]))}
    assert set(ort.get_available_providers()) <= set(report)
    assert report["CPUExecutionProvider"].checked and report["CPUExecutionProvider"].ops == {}
    if "AzureExecutionProvider" in report:
        assert not report["AzureExecutionProvider"].checked


def test_unavailable_provider_is_reported_unchecked_with_the_reason(demo_paths):
    [cuda] = unsupported_ops(onnx.load(str(demo_paths["cnn"])), str(demo_paths["cnn"]), ["CUDAExecutionProvider"])
    assert not cuda.checked and "not in this ORT build" in cuda.note
    assert cuda.ops == {}
