"""Open Inference Protocol (KServe v2) tensors <-> numpy, JSON and the binary-tensor extension.

Datatype names come from the Triton export's table (``graph.tensors.DATATYPES`` without
its ``TYPE_`` prefix; Triton's ``TYPE_STRING`` is the protocol's ``BYTES``), so serve and export
never disagree about a model's types. A request that does not decode is an ``InputError`` (HTTP
400); whether the decoded arrays fit the model is the session's ``check_feeds``, the same check
and message as ``ortpilot run`` and the library.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ortpilot.data.textinput import json_kind
from ortpilot.errors import InputError
from ortpilot.graph.tensors import DATATYPES, has_batch_dim, model_tensors
from ortpilot.serve.jsonbody import not_json_reason

try:  # orjson (the serve extra) parses 4x and writes numpy tensors 20x faster than the json module
    import orjson
except ImportError:  # pragma: no cover - the codec still works without it, slower
    orjson = None

HEADER_LENGTH = "inference-header-content-length"
BINARY_TYPE = "application/octet-stream"
MAX_RANK = 16
MAX_DIM = 2**62  # larger dims are refused before any element count is made from them

BYTES = "BYTES"  # strings (a text model's input): JSON strings, or binary as 4-byte little-endian lengths + bytes
# The protocol's datatype names, from the export table; BF16 has no numpy type and is not decoded.
NUMPY_OF: dict[str, np.dtype] = {
    ("BYTES" if v == "TYPE_STRING" else v.removeprefix("TYPE_")): np.dtype(onnx.helper.tensor_dtype_to_np_dtype(k))
    for k, v in DATATYPES.items()
    if v not in ("TYPE_BF16", "TYPE_STRING")
}
DATATYPE_OF: dict[np.dtype, str] = {dtype: name for name, dtype in NUMPY_OF.items()}


@dataclass
class InferRequest:
    """A decoded ``/infer`` body: the feeds, the outputs asked for, and which to send as binary."""

    feeds: dict[str, np.ndarray]
    outputs: list[str] | None  # None: every output
    binary_outputs: set[str]
    binary_default: bool
    id: str | None = None


def decode_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Parse an infer request: JSON, or a JSON header of ``header_length`` bytes plus binary tensors.

    Every way a body can be wrong is an InputError naming the field (HTTP 400): the tensors are
    checked against the body that carries them before any array is made, so no shape can ask
    for more memory than the request brought.
    """
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InputError(
                f"Inference-Header-Content-Length is {header_length}, but the body has {len(body)} "
                "bytes: the JSON header must be the first that many bytes of it."
            )
        head, rest = body[:header_length], memoryview(body)[header_length:]
    else:
        head, rest = body, memoryview(b"")
    doc = _json_object(head)
    params = _parameters(doc, "The request")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for item in doc["inputs"]:
        name, array, used = _decode_tensor(item, rest, offset, len(head))
        if name in feeds:
            raise InputError(f"Input '{name}' is given twice in the request.")
        feeds[name] = array
        offset += used
    if offset != len(rest):
        raise InputError(
            f"The request carries {len(rest)} bytes of binary tensor data, but its inputs' "
            f"binary_data_size add up to {offset}."
        )
    binary_default = bool(params.get("binary_data_output", False))
    outputs, binary = _requested_outputs(doc.get("outputs"), binary_default)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InputError(f'The request\'s "id" must be a string, got {type(request_id).__name__}.')
    return InferRequest(feeds, outputs, binary, binary_default, request_id)


def _json_object(head: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(head) if orjson is not None else json.loads(head)
    except RecursionError:
        raise InputError("The request body nests JSON too deeply to be an infer request.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        if "depth limit" in str(exc):  # orjson's word for JSON nested past 1024 levels
            raise InputError("The request body nests JSON too deeply to be an infer request.") from None
        raise InputError(
            f"The request body is not valid JSON ({not_json_reason(bytes(head), exc)}). Send an Open Inference "
            "Protocol infer "
            'request: {"inputs": [{"name", "shape", "datatype", "data"}]}.'
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise InputError(
            'The request has no "inputs" list. Send {"inputs": [{"name", "shape", "datatype", '
            '"data"}]} (Open Inference Protocol).'
        )
    return doc


def _parameters(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``parameters`` field: absent, or an object (the protocol's map of parameter name -> value)."""
    params = doc.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InputError(f'{where} has "parameters" of type {type(params).__name__}; it must be an object.')
    return params


def _requested_outputs(entries: Any, binary_default: bool) -> tuple[list[str] | None, set[str]]:
    if entries is None:
        return None, set()
    if not isinstance(entries, list):
        raise InputError('"outputs" must be a list of objects with a "name".')
    outputs, binary = [], set()
    for out in entries:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise InputError('Each entry of "outputs" must be an object with a "name".')
        outputs.append(out["name"])
        if _parameters(out, f"Output '{out['name']}'").get("binary_data", binary_default):
            binary.add(out["name"])
    return outputs, binary


def _checked_shape(name: str, shape: Any) -> tuple[list[int], int]:
    """(shape, element count) of a tensor's ``shape`` field; the count as an exact integer."""
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape)
    ):
        raise InputError(
            f"Input '{name}' needs \"shape\" as a list of at most {MAX_RANK} non-negative integers "
            f"(each at most {MAX_DIM}), got {_short(shape)}."
        )
    return shape, math.prod(shape)


def _decode_tensor(item: Any, rest: memoryview, offset: int, json_bytes: int) -> tuple[str, np.ndarray, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InputError('Each entry of "inputs" must be an object with "name", "shape", "datatype" and "data".')
    name = item["name"]
    datatype = item.get("datatype")
    shape, count = _checked_shape(name, item.get("shape"))
    if datatype == BYTES:
        return _decode_bytes_tensor(name, item, shape, count, rest, offset, json_bytes)
    if datatype not in NUMPY_OF:
        raise InputError(
            f"Input '{name}' has datatype {_short(datatype)}, which this server does not decode; it takes "
            f"{', '.join(NUMPY_OF)}, {BYTES}."
        )
    dtype = NUMPY_OF[datatype]
    size = _parameters(item, f"Input '{name}'").get("binary_data_size")
    if size is not None:
        needed = count * dtype.itemsize
        if not isinstance(size, int) or isinstance(size, bool) or size != needed or offset + size > len(rest):
            raise InputError(
                f"Input '{name}' declares binary_data_size {_short(size)}; shape {shape} of {datatype} needs "
                f"{needed} bytes and {len(rest) - offset} remain in the body."
            )
        return name, np.frombuffer(rest[offset : offset + size], dtype=dtype).reshape(shape), size
    if "data" not in item:
        raise InputError(f"Input '{name}' has neither \"data\" nor a binary_data_size parameter.")
    if count > json_bytes:  # every JSON value takes at least one byte: such a shape cannot be in this body
        raise InputError(
            f"Input '{name}' has shape {shape} ({count} values), more than a JSON body of {json_bytes} bytes can hold."
        )
    return name, _json_array(name, item["data"], datatype, dtype, shape).reshape(shape), 0


def _decode_bytes_tensor(
    name: str, item: dict[str, Any], shape: list[int], count: int, rest: memoryview, offset: int, json_bytes: int
) -> tuple[str, np.ndarray, int]:
    """A BYTES input: JSON strings in ``data``, or ``binary_data_size`` bytes of length-prefixed elements."""
    size = _parameters(item, f"Input '{name}'").get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(rest):
            raise InputError(
                f"Input '{name}' declares binary_data_size {_short(size)}, but {len(rest) - offset} bytes remain in "
                "the body."
            )
        return name, decode_bytes(name, rest[offset : offset + size], count).reshape(shape), size
    if "data" not in item:
        raise InputError(f"Input '{name}' has neither \"data\" nor a binary_data_size parameter.")
    if count > json_bytes:
        raise InputError(
            f"Input '{name}' has shape {shape} ({count} values), more than a JSON body of {json_bytes} bytes can hold."
        )
    values = _flatten(item["data"])
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise InputError(
            f"Input '{name}' is declared BYTES, and its element {bad} is {json_kind(values[bad])}: BYTES elements are "
            "strings. If the input takes numbers, declare its datatype (FP32, INT64, ...: the model's metadata "
            "names it)."
        )
    if len(values) != count:
        raise InputError(f"Input '{name}' has {len(values)} values, but shape {shape} needs {count}.")
    array = np.empty(count, dtype=object)
    array[:] = values
    return name, array.reshape(shape), 0


def _flatten(data: Any) -> list[Any]:
    """JSON tensor data, flat (the protocol allows nested lists in row-major order)."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


def decode_bytes(name: str, buffer: bytes | memoryview, count: int) -> np.ndarray:
    """``count`` BYTES elements of a binary buffer (each a 4-byte little-endian length, then that many bytes,
    as tritonclient's ``serialize_byte_tensor`` writes them), as a flat object array of ``bytes``."""
    view = memoryview(buffer)
    if count * 4 > len(view):  # each element takes at least its length: refused before anything is made
        raise InputError(f"Input '{name}' needs {count} BYTES elements, more than its {len(view)} bytes can hold.")
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        if at + 4 > len(view):
            raise InputError(
                f"Input '{name}' holds {i} BYTES element(s) in {len(view)} bytes, but its shape needs {count}."
            )
        length = int.from_bytes(view[at : at + 4], "little")
        if at + 4 + length > len(view):
            raise InputError(
                f"Input '{name}': BYTES element {i} says it has {length} bytes, but {len(view) - at - 4} remain."
            )
        out[i] = bytes(view[at + 4 : at + 4 + length])
        at += 4 + length
    if at != len(view):
        raise InputError(f"Input '{name}' has {len(view) - at} bytes after its {count} BYTES element(s).")
    return out


def _json_array(name: str, data: Any, datatype: str, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """``data`` as ``dtype``, refusing what would change a value: text for numbers, fractions for integers."""
    try:
        array = np.asarray(data)
        if array.dtype.kind in "USO" and dtype.kind != "O":
            raise TypeError("it holds text or mixed values")
        if dtype.kind in "iub" and array.dtype.kind == "f":
            fractional = array[array != np.floor(array)] if array.size else array
            if fractional.size:
                raise TypeError(f"{datatype} takes integers, and it holds {fractional.reshape(-1)[0].item()!r}")
        with np.errstate(over="ignore"):  # a float too large for dtype is refused below, by element
            converted = array.astype(dtype) if dtype.kind not in "iu" else np.asarray(data, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"Input '{name}' data cannot be read as {datatype} ({exc}).") from None
    if dtype.kind == "f" and array.dtype.kind in "fiu":  # 1e39 as FP32 is inf: every output would be NaN or inf
        with np.errstate(invalid="ignore"):
            overflow = np.flatnonzero(np.isfinite(array) & ~np.isfinite(converted))
        if overflow.size:
            first = int(overflow[0])
            raise InputError(
                f"Input '{name}' element {first} ({array.reshape(-1)[first].item()!r}) is outside {datatype}'s range "
                f"(largest {np.finfo(dtype).max:.4g}): it would become infinity. Scale the values into that range."
            )
    if converted.size != math.prod(shape):
        raise InputError(f"Input '{name}' has {converted.size} values, but shape {shape} needs {math.prod(shape)}.")
    return converted


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: messages quote what the client sent, not all of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def encode_response(
    model: str,
    outputs: Mapping[str, np.ndarray],
    binary: set[str] | bool,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """The response body and, when any output goes as binary, the JSON header's length."""
    entries, blobs = [], []
    for name, value in outputs.items():
        value = np.ascontiguousarray(value)
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(value.shape),
            "datatype": DATATYPE_OF.get(value.dtype, str(value.dtype)),
        }
        if binary is True or (binary and name in binary):
            data = value.tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        else:
            entry["data"] = value.reshape(-1) if orjson is not None else value.reshape(-1).tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": entries}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    head = _dumps(doc)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def _dumps(doc: dict[str, Any]) -> bytes:
    """Compact JSON with tensors written from their buffers (orjson), or through lists (json module)."""
    if orjson is not None:
        try:
            return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:  # a dtype orjson does not write (float16 on old releases): through lists
            for entry in doc["outputs"]:
                if isinstance(entry.get("data"), np.ndarray):
                    entry["data"] = entry["data"].tolist()
            return orjson.dumps(doc)
    return json.dumps(doc, separators=(",", ":")).encode()


def protocol_datatype(triton_type: str) -> str:
    """``TYPE_FP32`` (a Triton config's name) -> ``FP32`` (the protocol's)."""
    return "BYTES" if triton_type == "TYPE_STRING" else triton_type.removeprefix("TYPE_")


def tensor_metadata(model: onnx.ModelProto) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """``inputs`` and ``outputs`` of the model metadata (datatype, shape with -1 for dynamic dims), and
    whether the model has a batch dim (every first dim dynamic and named like batch, the export's rule)."""
    inputs, outputs = model_tensors(model)
    meta = [
        [{"name": t.name, "datatype": protocol_datatype(t.data_type), "shape": list(t.dims)} for t in group]
        for group in (inputs, outputs)
    ]
    return meta[0], meta[1], has_batch_dim(inputs, outputs)


__all__ = [
    "BYTES",
    "HEADER_LENGTH",
    "InferRequest",
    "decode_bytes",
    "decode_request",
    "encode_response",
    "protocol_datatype",
    "tensor_metadata",
]
