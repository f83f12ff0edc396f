"""The decode floor of this machine: how fast can ORT stream a 540 MB fp32 weight through a GEMV?

A decode step of a 135M-parameter fp32 decoder reads its ~540 MB of weights once; no loop can be
faster than one MatMul over the same bytes. This times ``x[1, K] @ W[K, N]`` with a 540 MB ``W``
in ORT (1 and 2 intra-op threads, medians of 10 runs after 3 warm-ups) and a single-threaded numpy
sum over the same bytes, so BENCHMARKS.md can say how close the shared-buffer loop is to it.

    .venv/bin/python benchmarks/bench_membw.py
"""

from __future__ import annotations

import datetime
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K, N = 4608, 29296  # 540 MB of float32


def gemv_ms(model: bytes, threads: int, x: np.ndarray, runs: int = 10) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, {"x": x})
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main() -> None:
    weight = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    x = np.ones((1, K), np.float32)
    flat = weight.reshape(-1)
    flat.sum()
    t0 = time.perf_counter()
    for _ in range(5):
        flat.sum()
    numpy_gbs = 5 * flat.nbytes / (time.perf_counter() - t0) / 1e9
    print(
        f"ORT {ort.__version__}, {datetime.datetime.now().isoformat(timespec='minutes')}, "
        f"weight {weight.nbytes / 1e6:.0f} MB"
    )
    print(f"numpy sum, 1 thread: {numpy_gbs:.1f} GB/s")
    for threads in (1, 2):
        ms = gemv_ms(data, threads, x)
        print(f"ORT MatMul GEMV, {threads} thread(s): {ms:.1f} ms = {weight.nbytes / ms / 1e6:.1f} GB/s")


if __name__ == "__main__":
    main()
