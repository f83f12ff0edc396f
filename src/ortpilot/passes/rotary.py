"""Rotary tables as constants: the cos/sin caches a fused decoder's GroupQueryAttention reads.

A transformers export computes the rotary cos/sin for positions 0..max(position_ids) on every
run (ReduceMax, Range, MatMul, Cos, Sin: 8 small kernels per token in SmolLM2's export), and
Cos/Sin over the whole context, so the work grows with it (0.35 ms per token at 2048).
GroupQueryAttention only indexes the tables by position, so they can be computed once for
``max_positions`` positions and stored, as onnxruntime-genai's builder does. The price is a hard
limit: the model then handles at most ``max_positions`` tokens, which the fold records in the
model's metadata (``max_positions``) so the decode loops refuse longer sequences up front.

The fold is checked, not assumed: the subgraph must depend on the position ids alone, and its
table for a short sequence must equal the first rows of the long one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from ortpilot.eps import CPU_EP
from ortpilot.graph.prune import cone, remove_dead_nodes

DEFAULT_MAX_POSITIONS = 8192
COS_NAME, SIN_NAME = "rotary.cos_cache", "rotary.sin_cache"
_COS_INPUT, _SIN_INPUT = 7, 8  # GroupQueryAttention's cos_cache and sin_cache
_PROBE_POSITIONS = 16


@dataclass
class RotaryFold:
    """What the fold did: the tables' shape and the nodes it removed, or why it left them."""

    folded: bool
    reason: str = ""
    max_positions: int = 0
    rotary_dim: int = 0
    nodes_removed: int = 0


def constant_tables(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The constant cos/sin tables GroupQueryAttention nodes read (a step reads one row of each per
    position, and positions past their rows fail)."""
    initializers = {i.name: i for i in model.graph.initializer}
    names = {
        n.input[k]
        for n in model.graph.node
        if n.op_type == "GroupQueryAttention"
        for k in (_COS_INPUT, _SIN_INPUT)
        if len(n.input) > k
    }
    return [initializers[name] for name in sorted(names) if name in initializers]


def fold_rotary_tables(model: onnx.ModelProto, max_positions: int) -> RotaryFold:
    """Replace computed GQA cos/sin caches by ``max_positions``-row initializers, in place."""
    gqa = [
        n
        for n in model.graph.node
        if n.op_type == "GroupQueryAttention"
        and len(n.input) > _SIN_INPUT
        and n.input[_COS_INPUT]
        and n.input[_SIN_INPUT]
    ]
    if not gqa:
        return RotaryFold(False, "no GroupQueryAttention reads rotary tables")
    pairs = {(n.input[_COS_INPUT], n.input[_SIN_INPUT]) for n in gqa}
    if len(pairs) != 1:
        return RotaryFold(False, f"the attention layers read {len(pairs)} different rotary tables")
    cos, sin = next(iter(pairs))
    initializers = {i.name for i in model.graph.initializer}
    if cos in initializers and sin in initializers:
        return RotaryFold(False, "the rotary tables are already constants")
    nodes, inputs = cone(model, [cos, sin])
    if len(inputs) != 1:
        return RotaryFold(
            False, f"the rotary tables depend on {sorted(inputs) or 'no input'}, not on the position ids alone"
        )
    (position_input,) = inputs
    if "position" not in position_input.lower():
        return RotaryFold(False, f"the rotary tables depend on '{position_input}', not on position ids")
    probe = min(_PROBE_POSITIONS, max(1, max_positions // 2))
    try:
        tables = _evaluate(model, nodes, position_input, [cos, sin], max_positions)
        short = _evaluate(model, nodes, position_input, [cos, sin], probe)
    except Exception as exc:  # ORT refused the subgraph alone: keep it in the model, computed
        return RotaryFold(False, f"the rotary subgraph did not run on its own ({str(exc).splitlines()[0][:200]})")
    if (
        any(t.ndim != 2 or t.shape != tables[0].shape or t.shape[0] != max_positions for t in tables)
        or any(t.ndim != 2 or t.shape != (probe, tables[0].shape[1]) for t in short)
        or not all(np.allclose(s, t[:probe], atol=1e-6) for s, t in zip(short, tables))
    ):
        return RotaryFold(
            False,
            f"the subgraph does not compute a position-indexed table (shape "
            f"{list(tables[0].shape)} for {max_positions} positions)",
        )
    model.graph.initializer.extend(
        [numpy_helper.from_array(tables[0], COS_NAME), numpy_helper.from_array(tables[1], SIN_NAME)]
    )
    for node in gqa:
        node.input[_COS_INPUT], node.input[_SIN_INPUT] = COS_NAME, SIN_NAME
    removed = remove_dead_nodes(model)
    _set_metadata(model, "max_positions", str(max_positions))
    return RotaryFold(True, max_positions=max_positions, rotary_dim=int(tables[0].shape[1]), nodes_removed=removed)


def _evaluate(
    model: onnx.ModelProto, nodes: list[onnx.NodeProto], position_input: str, outputs: list[str], positions: int
) -> list[np.ndarray]:
    """Run the cone alone, on position ids [[positions - 1]] (the tables cover 0..max)."""
    info = next(i for i in model.graph.input if i.name == position_input)
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        list(nodes),
        "rotary",
        [info],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [i for i in model.graph.initializer if i.name in used],
    )
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(sub.SerializeToString(), options, providers=[CPU_EP])
    dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
    rank = len(info.type.tensor_type.shape.dim) or 2
    feed = np.full((1,) * rank, positions - 1, dtype=dtype)
    return [np.ascontiguousarray(t) for t in session.run(outputs, {position_input: feed})]


def _set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)
