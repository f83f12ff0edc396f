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
    zeroed = _copy(model)  # an integer tensor that becomes all zeros (a zero point ORT's symmetric paths take)
    zeroed.graph.initializer.append(numpy_helper.from_array(np.array([3, 0], np.uint8), "zp"))
    shifted = _copy(zeroed)
    shifted.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array([5, 1], np.uint8), "zp"))
    assert structure_sha256(shifted) == structure_sha256(zeroed)
    zeroed.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.zeros(2, np.uint8), "zp"))
    assert structure_sha256(shifted) != structure_sha256(zeroed)
    changed = [structure_sha256(m) for m in (reshaped, retyped, rewired, attributed, make_cnn())]
    assert base not in changed and len(set(changed)) == len(changed)
