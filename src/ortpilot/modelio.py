"""Read and write ONNX model files with errors a user can act on.

ORT's own messages for a bad file ("Protobuf parsing failed", "Load model from x failed")
say neither what is wrong nor what to do; these checks run first and say both.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import onnx

from ortpilot.errors import ModelLoadError
from ortpilot.walk import subgraphs

# IR version and default opset that every ORT ortpilot supports can read. onnx 1.23 writes
# IR 14 by default, which ORT 1.24 (the onnxruntime-openvino build) refuses.
SAFE_IR_VERSION = 10
DEFAULT_OPSET = 18


def max_ir_version_for_ort(ort_version: str | None = None) -> int:
    """The highest model IR version the given (or running) ORT reads."""
    if ort_version is None:
        import onnxruntime as ort

        ort_version = ort.__version__
    major, minor = (int(p) for p in ort_version.split(".")[:2])
    if (major, minor) >= (1, 25):
        return 14  # assumption: ORT 1.25+ ships onnx 1.23 (IR 14); verified for 1.32
    if (major, minor) >= (1, 20):
        return 13 if (major, minor) >= (1, 23) else 10
    return 9


def _starts_like_json(path: Path) -> bool:
    """Whether the file's first non-blank byte opens a JSON object (a profile.json given as a model)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(64).lstrip()[:1] == b"{"
    except OSError:
        return False


def load_model(path: str | os.PathLike, *, load_external_data: bool = True) -> onnx.ModelProto:
    """Load and lightly validate an ONNX model, raising ModelLoadError with a fix."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(
            f"Model file '{p}' does not exist. Check the path, or run "
            "'ortpilot demo-models DIR' to get demo models to try."
        )
    if p.is_dir():
        raise ModelLoadError(f"'{p}' is a directory, not an ONNX model file. Pass the .onnx file itself.")
    size = p.stat().st_size
    if size == 0:
        raise ModelLoadError(
            f"Model file '{p}' is empty (0 bytes). The download or export that "
            "produced it probably failed; produce it again."
        )
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        if _starts_like_json(p):
            raise ModelLoadError(
                f"'{p}' is a JSON file, not an ONNX model. A tune's profile.json is loaded with "
                "ortpilot.load_profile, checked with 'ortpilot verify' and served with 'ortpilot serve'; the model "
                "it names is the model.onnx beside it."
            ) from None
        said = " ".join(str(exc).split())[:300]  # protobuf's ParseError spans lines
        raise ModelLoadError(
            f"'{p}' is not a readable ONNX model ({type(exc).__name__}: {said}). It may be truncated, "
            "or not an ONNX file at all (a .ort, .pt or .safetensors file?). Re-export or re-download it."
        ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(
            f"'{p}' parsed as protobuf but holds no graph: it is not an ONNX model, or it is truncated. "
            "Re-export or re-download it."
        )
    outside = escaping_external_data(model, p.parent)
    if outside:  # refused before anything stats or reads the target: a model must not probe the disk
        raise ModelLoadError(
            f"Model '{p}' names external data outside its own folder: {'; '.join(outside[:3])}. ONNX external data "
            "lives beside the model (relative paths, no '..', no links out); a model that points elsewhere could "
            "make ortpilot or ORT read any file. Move the data next to the model and fix the locations."
        )
    missing = missing_external_data(model, p.parent)
    if missing:
        listed = ", ".join(sorted(missing)[:5])
        raise ModelLoadError(
            f"Model '{p}' keeps weights in external data files that are missing: {listed}. "
            "Copy those files next to the model (same relative paths), or re-save the model "
            "with all tensors inside it (onnx.save(model, path, save_as_external_data=False))."
        )
    short = short_external_data(model, p.parent)
    if short:
        raise ModelLoadError(
            f"Model '{p}' declares more external data than its files hold: {'; '.join(short[:3])}. "
            "The data files are truncated or belong to another export; copy them again or re-export the model."
        )
    if load_external_data and _uses_external_data(model):
        try:
            onnx.load_external_data_for_model(model, str(p.parent))
        except Exception as exc:
            raise ModelLoadError(
                f"External data of '{p}' could not be read: {exc}. Check that the data files are complete."
            ) from None
    return model


def escaping_external_data(model: onnx.ModelProto, base_dir: Path) -> list[str]:
    """``'tensor' -> location`` for external data that resolves outside ``base_dir``, decided without
    touching the target: absolute paths and '..' that climb out lexically, links walked only while
    they stay inside the folder."""
    found = []
    for tensor in _all_initializers(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            if _resolves_outside(base_dir, location):
                found.append(f"'{tensor.name}' -> '{location}'")
    return found


def _resolves_outside(base_dir: Path, location: str) -> bool:
    if not location or "\0" in location or os.path.isabs(location) or location.startswith("\\"):
        return True
    root = os.path.realpath(base_dir)
    current = root
    pending = list(Path(location).parts)
    hops = 0
    while pending:
        part = pending.pop(0)
        candidate = os.path.normpath(os.path.join(current, part))
        if not _inside(candidate, root):
            return True
        if os.path.islink(candidate):  # an lstat of a name inside the folder, never of what it names
            hops += 1
            target = os.readlink(candidate)
            if hops > 40 or os.path.isabs(target):
                return True
            pending = list(Path(target).parts) + pending
            continue
        current = candidate
    return False


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def external_data_files(model: onnx.ModelProto) -> set[str]:
    """The external data files a model's tensors live in, relative to the model's folder."""
    locations: set[str] = set()
    for tensor in _all_initializers(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return locations


def model_bytes(model: onnx.ModelProto) -> int:
    """The model's size with its weights: the proto's own bytes plus what its external tensors declare (a model
    loaded without its external data still says how big it is)."""
    external = sum(
        _declared_bytes(t) or 0 for t in _all_initializers(model) if t.data_location == onnx.TensorProto.EXTERNAL
    )
    return model.ByteSize() + external


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return bool(external_data_files(model))


def missing_external_data(model: onnx.ModelProto, base_dir: Path) -> list[str]:
    """External data files the model refers to that do not exist under ``base_dir``."""
    return [loc for loc in external_data_files(model) if not (base_dir / loc).is_file()]


def short_external_data(model: onnx.ModelProto, base_dir: Path) -> list[str]:
    """External tensors whose offset + length run past the end of their (existing) file.

    ORT reads them lazily and fails deep inside session creation with a message that reads
    like a provider failure; a ``stat`` per file catches it first.
    """
    short = []
    for tensor in _all_initializers(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        path = base_dir / info.get("location", "")
        try:
            offset, length = int(info.get("offset", 0) or 0), int(info.get("length", 0) or 0)
            available = path.stat().st_size
        except (ValueError, OSError):
            continue  # missing files are reported by missing_external_data
        declared = _declared_bytes(tensor)
        if declared is not None and length and length < declared:
            short.append(
                f"'{tensor.name}' declares dims {list(tensor.dims)} ({declared} bytes) but its length is {length}"
            )
        elif offset + max(length, declared or 0) > available:
            short.append(
                f"'{tensor.name}' needs bytes {offset}..{offset + max(length, declared or 0)} of "
                f"{info.get('location')} ({available} bytes)"
            )
    return short


def _declared_bytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes the tensor's dims and type call for (None for strings and sub-byte or unknown types)."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) or any(d < 0 for d in tensor.dims):
        return None
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize if itemsize and tensor.data_type not in _SUB_BYTE else None


_SUB_BYTE = {
    getattr(onnx.TensorProto, n)
    for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, n)
}


def _all_initializers(model: onnx.ModelProto):
    """Every tensor ORT may load from external data: initializers (sparse ones too) and tensor
    attributes, in the main graph, every subgraph at any depth and every function."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
    for _, sub in subgraphs(node):
        yield from _graph_tensors(sub)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Content hash of a file, streamed (models can be GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def model_sha256(model: onnx.ModelProto) -> str:
    """Content hash of an in-memory model (its serialized bytes)."""
    return hashlib.sha256(model.SerializeToString()).hexdigest()


def set_ir_for_running_ort(model: onnx.ModelProto) -> onnx.ModelProto:
    """Lower the model's IR version to what the running ORT reads, when that is safe."""
    limit = max_ir_version_for_ort()
    if model.ir_version > limit:
        model.ir_version = max(limit, SAFE_IR_VERSION)
    return model
