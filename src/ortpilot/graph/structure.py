"""A graph's structure as one hash: what its kernels are, not what its weights hold.

Two models with the same structure run the same kernels on the same shapes, so on the same session they run at
the same speed by construction; only their values differ. Two INT8 recipes that move scales around without
adding or removing a node (NNCF's SmoothQuant alphas, its activation range estimators) are such a pair: the tune
keeps the more accurate one instead of timing both against each other in the machine's noise.
"""

from __future__ import annotations

import hashlib

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


# Integer tensors whose all-zero value picks a kernel: ORT runs a zero point of 0 on its symmetric INT8 paths.
_INTEGER = {
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32,
}


def _zeros(tensor: onnx.TensorProto) -> str:
    """A mark for an integer initializer that holds only zeros (a value that picks kernels: part of structure)."""
    if tensor.data_type not in _INTEGER or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return ""
    return " zeros" if not numpy_helper.to_array(tensor).any() else ""


def _graph(graph: onnx.GraphProto) -> str:
    parts = [f"in {v.name} {v.type.SerializeToString().hex()}" for v in graph.input]
    parts += [f"out {v.name} {v.type.SerializeToString().hex()}" for v in graph.output]
    parts += [f"init {t.name} {t.data_type} {list(t.dims)}{_zeros(t)}" for t in graph.initializer]
    for node in graph.node:
        attrs = ",".join(sorted(_attribute(a) for a in node.attribute))
        parts.append(f"node {node.domain}:{node.op_type} {list(node.input)} {list(node.output)} {attrs}")
    return "\n".join(parts)


def structure_sha256(model: onnx.ModelProto) -> str:
    """The sha256 of ``model``'s opsets, inputs, outputs, initializers' names, types and shapes (and whether an
    integer one is all zeros), and nodes (op, wiring, attributes): equal for two models that differ only in
    their weights' and constants' values."""
    opsets = ",".join(sorted(f"{o.domain}:{o.version}" for o in model.opset_import))
    return hashlib.sha256(f"{opsets}\n{_graph(model.graph)}".encode()).hexdigest()


__all__ = ["structure_sha256"]
