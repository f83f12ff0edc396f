"""A graph's structure as one hash: what its kernels are, not what its weights hold.

Two models with the same structure run the same kernels on the same shapes, so on the same session they run at
the same speed by construction; only their values differ. Two INT8 recipes that move scales around without
adding or removing a node (NNCF's SmoothQuant alphas, its activation range estimators) are such a pair: the tune
keeps the more accurate one instead of timing both against each other in the machine's noise.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import numpy_helper


def _attribute(attr: onnx.AttributeProto) -> str:
    """An attribute without tensor values: a tensor (a Constant's value) counts by its type and shape only."""
    if attr.type == onnx.AttributeProto.TENSOR:
        return f"{attr.name}:tensor{attr.t.data_type}{list(attr.t.dims)}"
    if attr.type == onnx.AttributeProto.GRAPH:
        return f"{attr.name}:graph{_graph(attr.g)}"
    if attr.type == onnx.AttributeProto.GRAPHS:
        return f"{attr.name}:graphs{[_graph(g) for g in attr.graphs]}"
    return f"{attr.name}:{onnx.helper.get_attribute_value(attr)!r}"


# A weight's zero point of 0 picks a kernel (ORT's symmetric INT8 paths); an activation's does not.
_INTEGER = {
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32,
}


def _weight_zero_points(graph: onnx.GraphProto) -> set[str]:
    """The integer initializers that sit beside an integer weight in one node (a dequantized weight's zero
    point, MatMulInteger's ``b_zero_point``) and hold only zeros: part of the structure. An activation's zero
    point (a QuantizeLinear's, with no integer weight beside it) is a value like any other."""
    inits = {t.name: t for t in graph.initializer}
    integer = {
        name for name, t in inits.items() if t.data_type in _INTEGER and t.data_location != onnx.TensorProto.EXTERNAL
    }
    marked = set()
    for node in graph.node:
        ints = [name for name in node.input if name in integer]
        if any(int(np.prod(inits[name].dims)) > 1 for name in ints):  # a weight among them
            marked.update(name for name in ints if not numpy_helper.to_array(inits[name]).any())
    return marked


def _graph(graph: onnx.GraphProto) -> str:
    zeros = _weight_zero_points(graph)
    parts = [f"in {v.name} {v.type.SerializeToString().hex()}" for v in graph.input]
    parts += [f"out {v.name} {v.type.SerializeToString().hex()}" for v in graph.output]
    parts += [
        f"init {t.name} {t.data_type} {list(t.dims)}{' zeros' if t.name in zeros else ''}" for t in graph.initializer
    ]
    for node in graph.node:
        attrs = ",".join(sorted(_attribute(a) for a in node.attribute))
        parts.append(f"node {node.domain}:{node.op_type} {list(node.input)} {list(node.output)} {attrs}")
    return "\n".join(parts)


def structure_sha256(model: onnx.ModelProto) -> str:
    """The sha256 of ``model``'s opsets, inputs, outputs, initializers' names, types and shapes (and whether a
    weight's zero point is all zeros), and nodes (op, wiring, attributes): equal for two models that differ only in
    their weights' and constants' values."""
    opsets = ",".join(sorted(f"{o.domain}:{o.version}" for o in model.opset_import))
    return hashlib.sha256(f"{opsets}\n{_graph(model.graph)}".encode()).hexdigest()


__all__ = ["structure_sha256"]
