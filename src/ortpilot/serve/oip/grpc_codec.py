"""KServe v2 protobuf messages <-> numpy, with the same checks as the REST codec (``codec``), and the
metadata messages. The messages are tritonclient's generated ones, so ``tritonclient.grpc`` works
unchanged. Tensor data comes as ``raw_input_contents`` (one little-endian buffer per input, decoded
with ``np.frombuffer``, no copy) or as the typed ``contents`` lists; outputs go back raw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ortpilot.errors import InputError
from ortpilot.serve.oip.codec import BYTES, DATATYPE_OF, MAX_DIM, MAX_RANK, NUMPY_OF, decode_bytes
from ortpilot.serve.oip.config import TensorSpec

# The typed field of InferTensorContents each datatype travels in (FP16/BF16 only travel raw).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def messages() -> Any:
    """tritonclient's generated KServe v2 messages (``service_pb2``)."""
    from tritonclient.grpc import service_pb2

    return service_pb2


def server_metadata() -> Any:
    """The ServerMetadataResponse every deployment answers (the same as REST ``GET /v2``)."""
    from ortpilot.serve.oip.routes import EXTENSIONS
    from ortpilot.version import __version__

    return messages().ServerMetadataResponse(name="ortpilot", version=__version__, extensions=EXTENSIONS)


def decode_infer(request: Any, max_bytes: int) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """(feeds, the outputs asked for) of a ModelInferRequest; an InputError names what is wrong."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InputError(
            f"The request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents: send one "
            "buffer per input, in order, or the typed contents."
        )
    feeds: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in feeds:
            raise InputError(f"Input '{name}' is given twice in the request.")
        shape = list(tensor.shape)
        if len(shape) > MAX_RANK or not all(0 <= d <= MAX_DIM for d in shape):
            raise InputError(f"Input '{name}' needs a shape of at most {MAX_RANK} non-negative dims, got {shape}.")
        if tensor.datatype == BYTES:
            feeds[name] = _bytes_tensor(name, tensor, raw[i] if raw else None, shape)
            continue
        if tensor.datatype not in NUMPY_OF:
            raise InputError(
                f"Input '{name}' has datatype {tensor.datatype!r}, which this server does not decode; it takes "
                f"{', '.join(NUMPY_OF)}, {BYTES}."
            )
        dtype = NUMPY_OF[tensor.datatype]
        needed = math.prod(shape) * dtype.itemsize
        if needed > max_bytes:
            raise InputError(f"Input '{name}' has shape {shape}: {needed} bytes, over the limit of {max_bytes}.")
        feeds[name] = _tensor(name, tensor, raw[i] if raw else None, dtype, shape, needed)
    outputs = [o.name for o in request.outputs] or None
    return feeds, outputs


def _bytes_tensor(name: str, tensor: Any, raw: bytes | None, shape: list[int]) -> np.ndarray:
    """A BYTES input (a text model's strings): raw as length-prefixed elements, or ``bytes_contents``."""
    count = math.prod(shape)
    if raw is not None:
        return decode_bytes(name, raw, count).reshape(shape)
    values = list(tensor.contents.bytes_contents)
    if len(values) != count:
        raise InputError(f"Input '{name}' has {len(values)} values, but shape {shape} needs {count}.")
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)


def _tensor(name: str, tensor: Any, raw: bytes | None, dtype: np.dtype, shape: list[int], needed: int) -> np.ndarray:
    if raw is not None:
        if len(raw) != needed:
            raise InputError(
                f"Input '{name}' carries {len(raw)} raw bytes; shape {shape} of {tensor.datatype} needs {needed}."
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    field_name = CONTENTS_FIELD.get(tensor.datatype)
    if field_name is None:
        raise InputError(f"Input '{name}' is {tensor.datatype}: send it as raw_input_contents.")
    values = getattr(tensor.contents, field_name)
    if len(values) != math.prod(shape):
        raise InputError(f"Input '{name}' has {len(values)} values, but shape {shape} needs {math.prod(shape)}.")
    try:
        return np.asarray(values, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise InputError(f"Input '{name}' data cannot be read as {tensor.datatype} ({exc}).") from None


def encode_infer(model: str, outputs: Mapping[str, np.ndarray], request_id: str = "") -> Any:
    """The ModelInferResponse: every output raw (as tritonclient reads them), in the model's order."""
    pb = messages()
    response = pb.ModelInferResponse(model_name=model, model_version="1", id=request_id)
    for name, value in outputs.items():
        value = np.ascontiguousarray(value)
        response.outputs.add(name=name, datatype=DATATYPE_OF.get(value.dtype, str(value.dtype)), shape=value.shape)
        response.raw_output_contents.append(value.tobytes())
    return response


def model_metadata(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> Any:
    pb = messages()
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=name,
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in inputs],
        outputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in outputs],
    )


__all__ = ["CONTENTS_FIELD", "decode_infer", "encode_infer", "messages", "model_metadata", "server_metadata"]
