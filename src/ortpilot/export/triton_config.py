"""Build, render, parse and check a Triton ``config.pbtxt`` with Triton's own protobuf classes.

The message is built with ``tritonclient.grpc.model_config_pb2`` (the ``ModelConfig`` Triton
itself parses), rendered with protobuf's text format, and the written text is parsed back and
checked against the backend's rules (``triton_backend``): protobuf cannot know which
``parameters`` keys the ONNX Runtime backend reads, or which accelerator names it accepts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortpilot.errors import UsageError, VerificationError
from ortpilot.export.triton_backend import (
    BACKEND,
    BACKEND_SOURCE,
    CPU_ACCELERATORS,
    GPU_ACCELERATORS,
    MODEL_PARAMETERS,
    PRECISION_MODES,
    TENSORRT_PARAMETERS,
    parses_as,
)
from ortpilot.export.triton_mapping import KIND_GPU, BackendSettings
from ortpilot.graph.tensors import ONNX_TYPE_OF, TensorSpec

WARMUP_DIR = "warmup"
VERSION_DIR = "1"
MODEL_FILE = "model.onnx"
INSTALL_HINT = "pip install 'ortpilot[export]' (or: pip install 'tritonclient[grpc]')"


def protobuf() -> tuple[Any, Any]:
    """``(model_config_pb2, text_format)``, imported on first use: only exports need them."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        raise UsageError(
            f"Exporting to Triton needs tritonclient, whose protobuf classes parse and check the "
            f"written config.pbtxt: {INSTALL_HINT}."
        ) from None
    return model_config_pb2, text_format


@dataclass(frozen=True)
class WarmupInput:
    """One input of the warmup sample: its file under ``warmup/`` and the dims it holds (no batch dim)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    file: str


def build_config(
    name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    max_batch: int,
    instances: int,
    backend: BackendSettings,
    warmup: Sequence[WarmupInput] = (),
    warmup_name: str = "reference",
) -> Any:
    """The ``ModelConfig`` message for the backend; with ``max_batch`` > 0 the batch dim leaves ``dims``.
    ``warmup_name`` names the warmup sample by where its data comes from (``reference``, ``generated``)."""
    pb, _ = protobuf()
    config = pb.ModelConfig(name=name, backend=BACKEND, max_batch_size=max_batch)
    for specs, field in ((inputs, config.input), (outputs, config.output)):
        for spec in specs:
            dims = spec.dims[1:] if max_batch > 0 else spec.dims
            field.add(name=spec.name, data_type=spec.data_type, dims=list(dims) or [1])  # a scalar is [1]
    group = config.instance_group.add(count=instances, kind=backend.kind)
    if backend.kind == KIND_GPU and backend.gpus:
        group.gpus.extend(backend.gpus)
    if max_batch > 1:
        config.dynamic_batching.SetInParent()
    if backend.level is not None:
        config.optimization.graph.level = backend.level
    accelerators = config.optimization.execution_accelerators
    for target, entries in (
        (accelerators.gpu_execution_accelerator, backend.gpu_accelerators),
        (accelerators.cpu_execution_accelerator, backend.cpu_accelerators),
    ):
        for accel_name, params in entries:
            target.add(name=accel_name, parameters=params)
    for key, value in backend.parameters.items():
        config.parameters[key].string_value = value
    if warmup:
        sample = config.model_warmup.add(name=warmup_name, batch_size=1)
        for item in warmup:
            sample.inputs[item.name].data_type = item.data_type
            sample.inputs[item.name].dims.extend(list(item.dims) or [1])
            sample.inputs[item.name].input_data_file = item.file
    return config


def render(config: Any) -> str:
    _, text_format = protobuf()
    header = f"# Written by ortpilot export triton for Triton's ONNX Runtime backend ({BACKEND_SOURCE}).\n"
    return header + text_format.MessageToString(config)


def parse_config(text: str, path: str | Path = "config.pbtxt") -> Any:
    """Parse config.pbtxt text as Triton does; a failure on a file ortpilot wrote is a bug (exit 1)."""
    pb, text_format = protobuf()
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise VerificationError(
            f"'{path}' does not parse as Triton's ModelConfig ({exc}). ortpilot wrote it, so this "
            "is a bug in ortpilot; please report it with the profile."
        ) from None


def check_config(config: Any, model_dir: Path) -> list[str]:
    """What Triton's ORT backend would refuse or silently ignore in ``config``, read from ``model_dir``."""
    problems: list[str] = []
    if config.backend != BACKEND:
        problems.append(f"backend is '{config.backend}', not '{BACKEND}'")
    for key, value in config.parameters.items():
        if key not in MODEL_PARAMETERS:
            problems.append(f"parameters key '{key}' is not one the backend reads (it would be ignored)")
        elif not parses_as(MODEL_PARAMETERS[key], value.string_value):
            problems.append(f"parameters '{key}' = '{value.string_value}' is not a valid {MODEL_PARAMETERS[key]}")
    if config.optimization.HasField("graph") and config.optimization.graph.level not in (-1, 1, 2):
        problems.append(f"optimization.graph.level {config.optimization.graph.level} is not -1, 1 or 2")
    accelerators = config.optimization.execution_accelerators
    for kind, names, entries in (
        ("gpu", GPU_ACCELERATORS, accelerators.gpu_execution_accelerator),
        ("cpu", CPU_ACCELERATORS, accelerators.cpu_execution_accelerator),
    ):
        for accel in entries:
            if accel.name not in names:
                problems.append(
                    f"{kind}_execution_accelerator '{accel.name}' is not one the backend knows ({', '.join(names)})"
                )
            if accel.name == "tensorrt":
                problems.extend(_check_tensorrt(dict(accel.parameters)))
            if accel.name == "openvino" and accel.parameters:
                problems.append("the openvino accelerator takes no parameters")
    if accelerators.gpu_execution_accelerator and any(instance_kind(g) != KIND_GPU for g in config.instance_group):
        problems.append("gpu_execution_accelerator is set, but an instance group is not KIND_GPU (it would be ignored)")
    if not (model_dir / VERSION_DIR / MODEL_FILE).is_file():
        problems.append(f"{VERSION_DIR}/{MODEL_FILE} is missing")
    declared = {i.name: list(i.dims) for i in config.input}
    for sample in config.model_warmup:
        if set(sample.inputs) != set(declared):
            problems.append(
                f"warmup sample '{sample.name}' feeds {sorted(sample.inputs)}, the model takes {sorted(declared)}"
            )
        for name, item in sample.inputs.items():
            dims = declared.get(name)
            if dims is not None and (
                len(dims) != len(item.dims) or any(d not in (-1, w) for d, w in zip(dims, item.dims))
            ):
                problems.append(f"warmup input '{name}' has dims {list(item.dims)}, the config declares {dims}")
            problems.extend(_check_warmup_file(model_dir, name, item))
    return problems


def _check_tensorrt(params: dict[str, str]) -> list[str]:
    problems = []
    for key, value in params.items():
        if key == "precision_mode":
            if value not in PRECISION_MODES:
                problems.append(f"tensorrt precision_mode '{value}' is not one of {', '.join(PRECISION_MODES)}")
        elif key not in TENSORRT_PARAMETERS:
            problems.append(f"tensorrt parameter '{key}' is unknown to the backend (a load error)")
        elif not parses_as(TENSORRT_PARAMETERS[key][1], value):
            problems.append(f"tensorrt parameter '{key}' = '{value}' is not a valid {TENSORRT_PARAMETERS[key][1]}")
    return problems


def _check_warmup_file(model_dir: Path, name: str, item: Any) -> list[str]:
    path = model_dir / WARMUP_DIR / item.input_data_file
    type_name = model_config_datatype_name(item.data_type)
    elem_type = ONNX_TYPE_OF.get(type_name)
    if elem_type is None or elem_type == onnx.TensorProto.STRING:
        return [f"warmup input '{name}' has type {type_name}, whose raw files ortpilot does not write"]
    if not path.is_file():
        return [f"warmup file {WARMUP_DIR}/{item.input_data_file} of input '{name}' is missing"]
    expected = int(np.prod(item.dims)) * onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    if path.stat().st_size != expected:
        return [
            (
                f"warmup file {WARMUP_DIR}/{item.input_data_file} holds {path.stat().st_size} bytes, "
                f"not {expected} ({list(item.dims)} of {type_name})"
            )
        ]
    return []


def instance_kind(group: Any) -> str:
    """An instance group's kind by name (``KIND_CPU``, ``KIND_GPU``, ...); protobuf holds the number."""
    pb, _ = protobuf()
    return pb.ModelInstanceGroup.Kind.Name(group.kind)


def model_config_datatype_name(value: int) -> str:
    pb, _ = protobuf()
    return pb.DataType.Name(value)


def warmup_file_name(input_name: str, taken: set[str]) -> str:
    """A file name for an input's warmup data: its name with path-unsafe characters replaced, unique."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", input_name).lstrip(".") or "input"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name
