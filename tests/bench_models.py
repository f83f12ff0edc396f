"""Models made for benchmark tests (imported by tests/measure/test_bench_* and tests/cli/test_cmd_bench.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as h


def flaky_model(seed: float = 7.0) -> onnx.ModelProto:
    """y = x + table[floor(U * 103)] with a 100-row table: a seeded RandomUniform makes ORT itself
    fail (index out of bounds) at a fixed, run-count-dependent call."""
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [
        h.make_node("RandomUniform", [], ["r"], shape=[1], low=0.0, high=1.0, seed=seed),
        h.make_node("Mul", ["r", "k"], ["rk"]),
        h.make_node("Floor", ["rk"], ["f"]),
        h.make_node("Cast", ["f"], ["i"], to=TensorProto.INT64),
        h.make_node("Gather", ["table", "i"], ["g"], axis=0),
        h.make_node("Add", ["x", "g"], ["y"]),
    ]
    inits = [
        h.make_tensor("k", TensorProto.FLOAT, [1], [103.0]),
        h.make_tensor("table", TensorProto.FLOAT, [100, 4], np.zeros(400).tolist()),
    ]
    model = h.make_model(h.make_graph(nodes, "flaky", [x], [y], inits), opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def failing_call(model: onnx.ModelProto) -> int:
    """The 0-based call at which a fresh raw ORT session of ``model`` fails."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), opts)
    feeds = {"x": np.zeros((1, 4), np.float32)}
    for call in range(100_000):
        try:
            sess.run(None, feeds)
        except Exception:
            return call
    raise AssertionError("the flaky model never failed")
