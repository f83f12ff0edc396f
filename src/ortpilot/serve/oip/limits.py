"""What a model's inputs may hold, as its graph tells, checked before ORT runs; ORT's refusals said
without its internals.

ORT reports a sequence longer than a model's positions, or a token id past its embedding table,
as a kernel failure deep in the graph, with a C++ source path and a node name. A server answers
that as the client's mistake (400) naming the input and the limit: ``input_limits`` reads the
limits once from the model (position tables and ``max_positions``-style metadata for dims named
like a sequence; the rows of every table an input indexes straight through ``Gather`` or the fused
``EmbedLayerNormalization``) and
``InputLimits.check`` refuses feeds past them (``serve.ortmessage`` words what ORT says about the rest).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import InputError
from ortpilot.graph.shapes import model_max_positions

_SEQUENCE = re.compile(r"(seq|sequence|length|len|tokens)", re.I)
_NOT_POSITIONS = re.compile(r"(past|total|all|kv|key_?len|batch)", re.I)
_POSITION_TABLE = re.compile(r"position", re.I)
_PASS_THROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"}  # values kept as they are
# Ops that look their index input up in a table, by (domain, op): (index input, table input, whether
# the table holds positions). ORT's transformer fusion folds the embedding Gathers of a BERT into
# ``EmbedLayerNormalization`` (word, segment, position tables), 4-bit weights make them
# ``GatherBlockQuantized``: the limits must read the fused graph as they read the plain one.
_LOOKUPS: dict[tuple[str, str], tuple[tuple[int, int, bool], ...]] = {
    ("ai.onnx", "Gather"): ((1, 0, False),),
    ("com.microsoft", "GatherBlockQuantized"): ((1, 0, False),),
    ("com.microsoft", "EmbedLayerNormalization"): ((0, 2, False), (1, 4, False), (8, 3, True)),
}


@dataclass(frozen=True)
class InputLimits:
    """Per input: the axes whose size counts positions, and the rows of the table its values index."""

    positions: int | None = None  # the model's positions (None: the graph does not say)
    position_axes: dict[str, list[int]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def check(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Raise InputError naming the first input past a limit (400 for a server)."""
        if self.positions is not None:
            for name, axes in self.position_axes.items():
                value = feeds.get(name)
                for axis in axes:
                    if value is not None and axis < value.ndim and value.shape[axis] > self.positions:
                        raise InputError(
                            f"Input '{name}' has {value.shape[axis]} positions (dim {axis}), but the model "
                            f"handles at most {self.positions}; send a shorter sequence."
                        )
        for name, rows in self.rows.items():
            value = feeds.get(name)
            if value is None or not value.size or value.dtype.kind not in "iu":
                continue
            # ONNX's Gather reads -rows..-1 from the end of the table, but a negative id in a request is a
            # client's mistake (a token id, a token type), refused like one past the end.
            low, high = int(value.min()), int(value.max())
            if high >= rows or low < 0:
                bad = high if high >= rows else low
                raise InputError(
                    f"Input '{name}' holds {bad}, but the model looks its values up in a table of {rows} rows: "
                    f"each must be from 0 to {rows - 1}."
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> InputLimits:
        doc = dict(doc or {})
        return cls(doc.get("positions"), dict(doc.get("position_axes") or {}), dict(doc.get("rows") or {}))


def input_limits(model: onnx.ModelProto) -> InputLimits:
    """The limits ``model``'s main graph tells (reads dims only: no external data is needed)."""
    graph = model.graph
    tables = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:  # Constant tables count too
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    tables[node.output[0]] = list(attr.t.dims)
    inputs = {i.name for i in graph.input} - set(tables)
    source = {}  # value -> the graph input it carries unchanged
    for name in inputs:
        source[name] = name
    for node in graph.node:
        if node.op_type in _PASS_THROUGH and node.input and node.input[0] in source and node.output:
            source[node.output[0]] = source[node.input[0]]
    rows: dict[str, int] = {}
    position_rows: list[int] = []
    for node in graph.node:
        axis = next((a.i for a in node.attribute if a.name in ("axis", "gather_axis")), 0)
        for index, table, positional in _LOOKUPS.get((node.domain or "ai.onnx", node.op_type), ()):
            dims = tables.get(node.input[table], []) if table < len(node.input) else []
            if axis != 0 or not dims or dims[0] <= 0:
                continue
            fed = node.input[index] if index < len(node.input) else ""
            if fed in source:
                rows[source[fed]] = min(rows.get(source[fed], dims[0]), dims[0])
            elif positional or (_POSITION_TABLE.search(node.input[table]) and len(dims) == 2):
                position_rows.append(dims[0])
    positions = model_max_positions(model) or (min(position_rows) if position_rows else None)
    axes: dict[str, list[int]] = {}
    if positions is not None:
        for tensor in graph.input:
            if tensor.name not in inputs:
                continue
            dims = tensor.type.tensor_type.shape.dim
            found = [
                i
                for i, d in enumerate(dims)
                if d.dim_param and _SEQUENCE.search(d.dim_param) and not _NOT_POSITIONS.search(d.dim_param)
            ]
            if found:
                axes[tensor.name] = found
    return InputLimits(positions if axes else None, axes, rows)


__all__ = ["InputLimits", "input_limits"]
