"""What a model is, without running it: interface, opsets, ops, parameters, FLOPs, external data.

The facts ``ortpilot inspect`` prints. Weights in external files are never read: their sizes
come from the tensor dims, so a 10 GB model is summarized in the time it takes to parse its
graph.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ortpilot.graph.flops import node_flops, node_key
from ortpilot.graph.shapes import graph_inputs, resolve_input_shapes
from ortpilot.walk import graphs

DEFAULT_DOMAIN = "ai.onnx"


@dataclass
class TensorInfo:
    name: str
    dtype: str
    dims: list[int | str | None]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "dims": self.dims}


@dataclass
class ModelSummary:
    """Static facts about one model; ``to_dict`` is ``ortpilot inspect --json``."""

    path: str | None
    file_bytes: int | None
    ir_version: int
    opsets: dict[str, int]
    producer: dict[str, str]
    graph_name: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    node_count: int
    subgraph_node_count: int
    op_histogram: dict[str, int]
    parameters: dict[str, int]
    flops: dict[str, Any]
    external_data: list[dict[str, Any]]
    functions: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "ir_version": self.ir_version,
            "opsets": self.opsets,
            "producer": self.producer,
            "graph_name": self.graph_name,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "node_count": self.node_count,
            "subgraph_node_count": self.subgraph_node_count,
            "op_histogram": self.op_histogram,
            "parameters": self.parameters,
            "flops": self.flops,
            "external_data": self.external_data,
            "functions": self.functions,
            "metadata": self.metadata,
        }


def op_key(node: onnx.NodeProto) -> str:
    """``Conv`` for default-domain ops, ``com.microsoft.Attention`` for others (same name, other op)."""
    return node.op_type if node.domain in ("", DEFAULT_DOMAIN) else f"{node.domain}.{node.op_type}"


def _dtype_name(elem_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:  # bfloat16, float8 ... have no numpy dtype
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _tensor_infos(values) -> list[TensorInfo]:
    out = []
    for vi in values:
        ttype = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            out.append(TensorInfo(vi.name, vi.type.WhichOneof("value") or "unknown", []))
            continue
        dims: list[int | str | None] = []
        for d in ttype.shape.dim if ttype.HasField("shape") else []:
            dims.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None))
        out.append(TensorInfo(vi.name, _dtype_name(ttype.elem_type), dims))
    return out


def iter_subgraph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Nodes inside If/Loop/Scan bodies, at any depth (not the top-level ones)."""
    for body in list(graphs(graph))[1:]:
        yield from body.node


def _all_initializers(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Initializers and Constant tensors of the graph and of every body nested in it."""
    for graph in graphs(model.graph):
        yield from graph.initializer
        for node in graph.node:
            if node.op_type == "Constant":
                yield from (attr.t for attr in node.attribute if attr.HasField("t"))


def parameter_stats(model: onnx.ModelProto) -> dict[str, int]:
    """Element count and bytes of all weights (initializers and Constant tensors), from dims only."""
    count = size = tensors = 0
    for tensor in _all_initializers(model):
        n = 1
        for d in tensor.dims:
            n *= int(d)
        count += n
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except Exception:  # 4-bit and float8 types
            itemsize = 1
        size += n * itemsize if tensor.data_type not in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) else n // 2
        tensors += 1
    return {"count": count, "bytes": size, "tensors": tensors}


def external_data_files(model: onnx.ModelProto, base_dir: Path | None) -> list[dict[str, Any]]:
    """Each external data file the model names: how many tensors use it, and whether it exists."""
    uses: Counter[str] = Counter()
    for tensor in _all_initializers(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            uses[location] += 1
    out = []
    for location, tensors in sorted(uses.items()):
        path = (base_dir / location) if base_dir is not None else None
        present = bool(path and path.is_file())
        out.append(
            {
                "location": location,
                "tensors": tensors,
                "present": present,
                "bytes": path.stat().st_size if present and path else None,
            }
        )
    return out


def flops_summary(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]] | None) -> dict[str, Any]:
    """Estimated FLOPs at the given (or default) input shapes, with the shapes used and the coverage.

    Nodes left out (an op the tables do not know, or shapes inference could not find) may hold most of the
    compute, so ``complete`` says whether every node was counted and ``uncounted`` which op types were not
    (``{op: nodes}``): a partial total is a lower bound, never the model's FLOPs."""
    try:
        concrete, _ = resolve_input_shapes(graph_inputs(model), shapes)
    except Exception as exc:  # UsageError/InputError: the message says which --shape to pass
        return {
            "total": None,
            "shapes": None,
            "by_op_type": {},
            "counted_nodes": 0,
            "complete": False,
            "uncounted": {},
            "error": str(exc),
        }
    per_node = node_flops(model, concrete)
    by_op: dict[str, float] = {}
    uncounted: Counter[str] = Counter()
    for index, node in enumerate(model.graph.node):
        key = node_key(node, index)
        if key in per_node:
            by_op[node.op_type] = by_op.get(node.op_type, 0.0) + per_node[key]
        else:
            uncounted[node.op_type] += 1
    return {
        "total": sum(per_node.values()),
        "shapes": {k: list(v) for k, v in concrete.items()},
        "by_op_type": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
        "counted_nodes": len(per_node),
        "complete": not uncounted,
        "uncounted": dict(uncounted.most_common()),
        "error": None,
    }


def summarize(
    model: onnx.ModelProto, path: str | os.PathLike | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> ModelSummary:
    """Everything ``inspect`` reports about ``model`` (loaded without external data)."""
    file_path = Path(path) if path is not None else None
    init_names = {t.name for t in model.graph.initializer}
    histogram = Counter(op_key(n) for n in model.graph.node)
    return ModelSummary(
        path=str(file_path) if file_path else None,
        file_bytes=file_path.stat().st_size if file_path and file_path.is_file() else None,
        ir_version=model.ir_version,
        opsets={(o.domain or DEFAULT_DOMAIN): o.version for o in model.opset_import},
        producer={"name": model.producer_name, "version": model.producer_version},
        graph_name=model.graph.name,
        inputs=_tensor_infos([vi for vi in model.graph.input if vi.name not in init_names]),
        outputs=_tensor_infos(model.graph.output),
        node_count=len(model.graph.node),
        subgraph_node_count=sum(1 for _ in iter_subgraph_nodes(model.graph)),
        op_histogram=dict(histogram.most_common()),
        parameters=parameter_stats(model),
        flops=flops_summary(model, shapes),
        external_data=external_data_files(model, file_path.parent if file_path else None),
        functions=[f"{f.domain}.{f.name}" for f in model.functions],
        metadata={p.key: p.value for p in model.metadata_props},
    )


__all__ = [
    "ModelSummary",
    "TensorInfo",
    "external_data_files",
    "flops_summary",
    "iter_subgraph_nodes",
    "op_key",
    "parameter_stats",
    "summarize",
]
