"""A small MLP classifier: the cheapest model that still has MatMul/Gemm work for ORT.

Layer 1 is a Gemm as ``torch.onnx`` exports ``nn.Linear``; layers 2 and 3 are MatMul+Add,
which ORT fuses into Gemm at the basic level, so optimization levels change the graph.
"""

from __future__ import annotations

import math

import onnx

from ortpilot.models._graph import FLOAT, GraphBuilder

INPUT_FEATURES = 64
HIDDEN = (256, 128)
CLASSES = 10


def make_mlp(seed: int = 0) -> onnx.ModelProto:
    """``x`` float32 [batch, 64] -> ``y`` float32 [batch, 10] class scores."""
    g = GraphBuilder("demo_mlp", seed)
    h = g.input("x", FLOAT, ["batch", INPUT_FEATURES])
    sizes = [INPUT_FEATURES, *HIDDEN, CLASSES]
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        std = math.sqrt(2.0 / fan_in)
        last = i == len(sizes) - 2
        if i == 0:
            # nn.Linear export: weight [out, in] with transB=1.
            w = g.weight(f"fc{i}.weight", [fan_out, fan_in], std)
            b = g.weight(f"fc{i}.bias", [fan_out], 0.05)
            h = g.op("Gemm", [h, w, b], f"fc{i}/Gemm", transB=1)
        else:
            w = g.weight(f"fc{i}.weight", [fan_in, fan_out], std)
            b = g.weight(f"fc{i}.bias", [fan_out], 0.05)
            h = g.op("MatMul", [h, w], f"fc{i}/MatMul")
            h = g.op("Add", [h, b], f"fc{i}/Add", out="y" if last else None)
        if not last:
            h = g.op("Relu", [h], f"fc{i}/Relu")
    g.output("y", FLOAT, ["batch", CLASSES])
    return g.build("ortpilot demo MLP: 64 -> 256 -> 128 -> 10 with ReLU.")
