"""A model's inputs and outputs as serving protocols name them: Triton datatypes and dims.

Triton's model configuration (``TYPE_FP32``, dims with -1 for a dynamic dim) and the Open
Inference Protocol (KServe v2: the same names without ``TYPE_``) describe tensors alike, so
``export`` (config.pbtxt) and ``serve`` (``/v2/models/{name}``) take them from here. A batch
dim is Triton's when every input's first dim is dynamic and named like batch, and every
output's first dim is dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from ortpilot.errors import UsageError
from ortpilot.graph.shapes import graph_inputs, is_batch_dim

# ONNX element type -> Triton data type (the types Triton's ONNX Runtime backend passes through).
DATATYPES: dict[int, str] = {
    onnx.TensorProto.BOOL: "TYPE_BOOL",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.UINT16: "TYPE_UINT16",
    onnx.TensorProto.UINT32: "TYPE_UINT32",
    onnx.TensorProto.UINT64: "TYPE_UINT64",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.INT16: "TYPE_INT16",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.STRING: "TYPE_STRING",
}
ONNX_TYPE_OF: dict[str, int] = {v: k for k, v in DATATYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton sees it: name, data type, dims (-1: dynamic)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    first_dim_batch: bool  # a dynamic first dim that may be Triton's batch dim


def model_tensors(model: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's inputs (initializers excluded) and outputs as Triton tensors."""
    inputs = [
        TensorSpec(
            i.name,
            _datatype(i.name, i.elem_type),
            tuple(_dim(d) for d in i.dims),
            bool(i.dims) and isinstance(i.dims[0], str) and is_batch_dim(i.dims[0]),
        )
        for i in graph_inputs(model)
    ]
    outputs = list(model.graph.output)
    if any(not o.type.tensor_type.HasField("shape") for o in outputs):
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        outputs = list(inferred.graph.output)
    specs = []
    for out in outputs:
        ttype = out.type.tensor_type
        if not ttype.HasField("shape"):
            raise UsageError(
                f"Output '{out.name}' has no declared rank, even after shape inference; Triton's config "
                "needs its dims. Re-export the model with output shapes."
            )
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim)
        specs.append(TensorSpec(out.name, _datatype(out.name, ttype.elem_type), dims, bool(dims) and dims[0] == -1))
    return inputs, specs


def _dim(d: int | str | None) -> int:
    return d if isinstance(d, int) and d >= 0 else -1


def _datatype(name: str, elem_type: int) -> str:
    if elem_type not in DATATYPES:
        raise UsageError(
            f"Tensor '{name}' has ONNX type {onnx.TensorProto.DataType.Name(elem_type)}, which Triton and the "
            f"Open Inference Protocol cannot carry (it takes {', '.join(sorted(DATATYPES.values()))})."
        )
    return DATATYPES[elem_type]


def has_batch_dim(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Every input's first dim is dynamic and named like batch, and every output's first dim is
    dynamic: then Triton's batch dim can take it (the backend's own test is that every first dim is -1)."""
    return bool(inputs) and all(t.first_dim_batch for t in inputs) and all(t.first_dim_batch for t in outputs)


__all__ = ["DATATYPES", "ONNX_TYPE_OF", "TensorSpec", "has_batch_dim", "model_tensors"]
