"""FLOPs estimates: exact counts on hand-built graphs, scaling on demo models, a real CNN."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortpilot.graph.flops import node_flops, total_flops
from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION


def _model(nodes, inputs, outputs, inits=(), opsets=(("", DEFAULT_OPSET),)):
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = SAFE_IR_VERSION
    return model


def _vi(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def test_matmul_gemm_and_elementwise_counts_are_exact():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="gemm", transB=1),
            helper.make_node("Reshape", ["y", "shape"], ["z"], name="reshape"),
        ],
        [_vi("x", ["batch", 3])],
        [_vi("z", None)],
        [("w", np.ones((3, 4))), ("w2", np.ones((5, 4))), ("b2", np.ones(5))],
    )
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "shape"))
    flops = node_flops(model, {"x": (2, 3)})
    assert flops == {"mm": 2 * 2 * 4 * 3, "relu": 2 * 4, "gemm": 2 * 2 * 5 * 4 + 2 * 5, "reshape": 0.0}
    assert total_flops(model, {"batch": (4,)}) == 2 * total_flops(model, {"x": (2, 3)})


def test_conv_counts_groups_bias_and_transpose():
    model = _model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["c", "wd"], ["d"], name="depthwise", group=4, pads=[1, 1, 1, 1]),
            helper.make_node("ConvTranspose", ["d", "wt"], ["t"], name="up", strides=[2, 2]),
            helper.make_node("MaxPool", ["t"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        ],
        [_vi("x", [1, 3, 8, 8])],
        [_vi("p", None)],
        [("w", np.ones((4, 3, 3, 3))), ("b", np.ones(4)), ("wd", np.ones((4, 1, 3, 3))), ("wt", np.ones((4, 2, 2, 2)))],
    )
    flops = node_flops(model)
    assert flops["conv"] == 2 * (4 * 8 * 8) * 27 + 4 * 8 * 8
    assert flops["depthwise"] == 2 * (4 * 8 * 8) * 9
    assert flops["up"] == 2 * (4 * 8 * 8) * (2 * 2 * 2)
    assert flops["pool"] == (2 * 8 * 8) * 4


def test_contrib_matmulnbits_and_gqa_counted_from_input_shapes():
    k, n, heads, kv_heads, d, s, past = 64, 32, 4, 2, 16, 8, 24
    model = _model(
        [
            helper.make_node(
                "MatMulNBits",
                ["a", "qw", "scales"],
                ["m"],
                name="q4",
                domain="com.microsoft",
                K=k,
                N=n,
                bits=4,
                block_size=32,
            ),
            helper.make_node(
                "GroupQueryAttention",
                ["q", "k", "v", "pk", "pv", "seqlens", "total"],
                ["attn", "present_k", "present_v"],
                name="gqa",
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
            ),
        ],
        [
            _vi("a", [1, s, k]),
            _vi("qw", [n, 2, 16], TensorProto.UINT8),
            _vi("scales", [n * 2]),
            _vi("q", [1, s, heads * d]),
            _vi("k", [1, s, kv_heads * d]),
            _vi("v", [1, s, kv_heads * d]),
            _vi("pk", [1, kv_heads, past, d]),
            _vi("pv", [1, kv_heads, past, d]),
            _vi("seqlens", [1], TensorProto.INT32),
            _vi("total", [], TensorProto.INT32),
        ],
        [_vi("m", None), _vi("attn", None)],
        opsets=(("", DEFAULT_OPSET), ("com.microsoft", 1)),
    )
    flops = node_flops(model)
    assert flops["q4"] == 2 * s * n * k
    scores = heads * s * (past + s)
    assert flops["gqa"] == 2 * scores * (2 * d) + 5 * scores


def test_unknown_ops_and_unknown_shapes_are_left_out():
    model = _model(
        [
            helper.make_node("MyOp", ["x"], ["y"], name="custom", domain="my.domain"),
            helper.make_node("Relu", ["y"], ["z"], name="after_custom"),
            helper.make_node("Relu", ["x"], ["r"], name="known"),
        ],
        [_vi("x", [2, 3])],
        [_vi("z", None), _vi("r", None)],
        opsets=(("", DEFAULT_OPSET), ("my.domain", 1)),
    )
    assert node_flops(model) == {"known": 6.0}


def test_unresolvable_dims_do_not_raise():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", [None, "weird"])], [_vi("y", None)])
    assert node_flops(model) == {}
    assert node_flops(model, {"x": (2, 5)}) == {"relu": 10.0}


def test_unnamed_nodes_get_op_and_index_keys():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", None)])
    assert node_flops(model) == {"Relu_0": 2.0}


@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder", "decoder"])
def test_demo_models_are_fully_counted_and_linear_in_batch(name):
    from ortpilot.models import DEMO_MODELS

    model = DEMO_MODELS[name]()
    flops = node_flops(model)
    assert len(flops) == len(model.graph.node)
    one = total_flops(model)
    assert one > 0
    assert total_flops(model, {"batch": (3,)}) == pytest.approx(3 * one, rel=0.02)


def test_yolov8n_matches_published_gflops(nudenet_path):
    """Ultralytics lists YOLOv8n at 8.7 GFLOPs for 640x640, i.e. ~2.2 at 320x320."""
    model = onnx.load(str(nudenet_path))
    gflops = total_flops(model, {"images": (1, 3, 320, 320)}) / 1e9
    assert 1.9 < gflops < 2.4


def test_ort_fused_graph_writes_nothing_to_cwd(tmp_path, monkeypatch, demo_paths):
    """ORT's symbolic inference saves sym_shape_infer_temp.onnx into the cwd when it gives up; ours must not."""
    import onnxruntime as ort

    optimized = tmp_path / "opt" / "encoder_fused.onnx"
    optimized.parent.mkdir()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(demo_paths["encoder"]), opts, providers=["CPUExecutionProvider"])
    model = onnx.load(str(optimized))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    flops = node_flops(model)
    assert list(work.iterdir()) == []
    # Shapes stop at ops neither onnx nor ORT's tool can follow (here FusedMatMul): a lower bound.
    assert 0 < sum(flops.values()) <= 1.01 * total_flops(onnx.load(str(demo_paths["encoder"])))
