"""A small CNN classifier with Conv+BatchNormalization+ReLU blocks.

BatchNormalization stays a separate node, as in an eval-mode export without folding, so
ORT's basic-level Conv+BN fusion (and Conv+Relu at extended level) has work to do. Convs
are also where dynamic INT8 can be slower than FP32 on CPU, which the tuner must see.
"""

from __future__ import annotations

import math

import onnx

from ortpilot.models._graph import FLOAT, GraphBuilder

CHANNELS = (16, 32, 64)
CLASSES = 10
IMAGE = (3, 32, 32)


def _conv_bn_relu(g: GraphBuilder, x: str, cin: int, cout: int, prefix: str) -> str:
    std = math.sqrt(2.0 / (cin * 9))
    w = g.weight(f"{prefix}.conv.weight", [cout, cin, 3, 3], std)
    y = g.op("Conv", [x, w], f"{prefix}/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    scale = g.uniform(f"{prefix}.bn.weight", [cout], 0.5, 1.5)
    bias = g.weight(f"{prefix}.bn.bias", [cout], 0.1)
    mean = g.weight(f"{prefix}.bn.running_mean", [cout], 0.1)
    var = g.uniform(f"{prefix}.bn.running_var", [cout], 0.5, 1.5)
    y = g.op("BatchNormalization", [y, scale, bias, mean, var], f"{prefix}/BatchNormalization", epsilon=1e-5)
    return g.op("Relu", [y], f"{prefix}/Relu")


def make_cnn(seed: int = 0) -> onnx.ModelProto:
    """``image`` float32 [batch, 3, 32, 32] -> ``logits`` float32 [batch, 10]."""
    g = GraphBuilder("demo_cnn", seed)
    x = g.input("image", FLOAT, ["batch", *IMAGE])
    x = _conv_bn_relu(g, x, IMAGE[0], CHANNELS[0], "block0")
    x = _conv_bn_relu(g, x, CHANNELS[0], CHANNELS[1], "block1")
    x = g.op("MaxPool", [x], "pool/MaxPool", kernel_shape=[2, 2], strides=[2, 2])
    x = _conv_bn_relu(g, x, CHANNELS[1], CHANNELS[2], "block2")
    x = g.op("GlobalAveragePool", [x], "head/GlobalAveragePool")
    x = g.op("Flatten", [x], "head/Flatten", axis=1)
    w = g.weight("fc.weight", [CLASSES, CHANNELS[2]], math.sqrt(1.0 / CHANNELS[2]))
    b = g.weight("fc.bias", [CLASSES], 0.05)
    g.op("Gemm", [x, w, b], "fc/Gemm", out="logits", transB=1)
    g.output("logits", FLOAT, ["batch", CLASSES])
    return g.build("ortpilot demo CNN: 3 Conv+BN+ReLU blocks, MaxPool, GAP, Linear.")
