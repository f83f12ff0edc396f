"""A graph's structure hash: equal for models that differ in weights only, different for any other change."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ortpilot.graph.structure import structure_sha256
from ortpilot.models import make_cnn, make_encoder


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def test_other_weights_keep_the_hash_and_every_other_change_moves_it():
    model = make_encoder()
    base = structure_sha256(model)
    reweighted = _copy(model)
    first = reweighted.graph.initializer[0]
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 0.5 + 1.0, first.name))
    assert structure_sha256(reweighted) == base and reweighted.SerializeToString() != model.SerializeToString()
    assert structure_sha256(make_encoder(seed=1)) == base  # the same builder, other random weights

    reshaped = _copy(model)  # an initializer's shape
    tensor = reshaped.graph.initializer[0]
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).reshape(-1), tensor.name))
    retyped = _copy(model)  # its type (an INT8 scale that became float16, say)
    tensor = retyped.graph.initializer[0]
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    rewired = _copy(model)  # one more node
    rewired.graph.node.append(onnx.helper.make_node("Identity", [model.graph.output[0].name], ["extra"]))
    attributed = _copy(model)  # an attribute's value
    node = next(n for n in attributed.graph.node if n.attribute and n.attribute[0].type == onnx.AttributeProto.INT)
    node.attribute[0].i += 1
    # a weight's zero point of 0 picks ORT's symmetric INT8 kernels: it is structure; an activation's is a value
    weight = numpy_helper.from_array(np.arange(6, dtype=np.int8).reshape(2, 3), "w")
    zp = numpy_helper.from_array(np.array(3, np.int8), "w_zp")
    act_zp = numpy_helper.from_array(np.array(7, np.uint8), "x_zp")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("QuantizeLinear", ["x", "s", "x_zp"], ["xq"]),
            onnx.helper.make_node("DequantizeLinear", ["xq", "s", "x_zp"], ["xd"]),
            onnx.helper.make_node("DequantizeLinear", ["w", "s", "w_zp"], ["wd"]),
            onnx.helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        ],
        "qdq",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3])],
        [weight, zp, act_zp, scale],
    )
    qdq = onnx.helper.make_model(graph)

    def with_value(name: str, value: int) -> str:
        m = _copy(qdq)
        t = next(t for t in m.graph.initializer if t.name == name)
        t.CopyFrom(numpy_helper.from_array(np.array(value, numpy_helper.to_array(t).dtype), name))
        return structure_sha256(m)

    assert with_value("w_zp", 5) == structure_sha256(qdq) != with_value("w_zp", 0)
    assert with_value("x_zp", 0) == structure_sha256(qdq) == with_value("x_zp", 128)
    changed = [structure_sha256(m) for m in (reshaped, retyped, rewired, attributed, make_cnn())]
    assert base not in changed and len(set(changed)) == len(changed)
