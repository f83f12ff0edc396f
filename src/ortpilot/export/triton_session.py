"""An ORT session built from an exported ``config.pbtxt`` the way Triton's ORT backend builds it.

No Triton server runs here, so this is how an export is checked end to end: read the written
config as Triton would, create the session with the options the backend would set (graph level,
threads, execution mode, arena, memory pattern, accelerators in the backend's order, the
deprecated CUDA keys overriding the cuda accelerator's), feed it the warmup files, and compare
with the profile's reference outputs. It follows ``triton_backend``; it is not the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ortpilot.eps import CPU_EP
from ortpilot.errors import ProviderError
from ortpilot.export.triton_backend import (
    CUDA,
    CUDA_CODES,
    CUDA_MODEL_DEFAULTS,
    OPENVINO,
    ORT_LEVEL_OF,
    PRECISION_MODES,
    TENSORRT,
    TENSORRT_PARAMETERS,
    parse_bool,
)
from ortpilot.export.triton_config import (
    MODEL_FILE,
    VERSION_DIR,
    WARMUP_DIR,
    instance_kind,
    model_config_datatype_name,
    parse_config,
)
from ortpilot.export.triton_mapping import DEVICE_ALLOCATOR_KEY, KIND_GPU
from ortpilot.graph.tensors import ONNX_TYPE_OF
from ortpilot.session.options import SessionSettings


def read_config(model_dir: str | Path) -> Any:
    path = Path(model_dir) / "config.pbtxt"
    return parse_config(path.read_text(encoding="utf-8"), path)


def backend_settings(config: Any) -> SessionSettings:
    """The session options the backend sets from the config (everything else stays ORT's default)."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    level = ORT_LEVEL_OF.get(config.optimization.graph.level, "all") if config.optimization.HasField("graph") else "all"
    entries = {DEVICE_ALLOCATOR_KEY: params[DEVICE_ALLOCATOR_KEY]} if DEVICE_ALLOCATOR_KEY in params else {}
    return SessionSettings(
        level=level,
        intra_op_threads=max(int(params.get("intra_op_thread_count", 0)), 0),
        inter_op_threads=max(int(params.get("inter_op_thread_count", 0)), 0),
        execution_mode="parallel" if params.get("execution_mode", "0") == "1" else "sequential",
        enable_cpu_mem_arena=parse_bool(params.get("enable_mem_arena", "1")),
        enable_mem_pattern=parse_bool(params.get("enable_mem_pattern", "1")),
        config_entries=entries,
    )


def backend_providers(config: Any) -> list[tuple[str, dict[str, str]]]:
    """The providers, with options, the backend appends for the config's first instance group."""
    group = config.instance_group[0] if config.instance_group else None
    device = str(group.gpus[0]) if group is not None and group.gpus else "0"
    accelerators = config.optimization.execution_accelerators
    providers: list[tuple[str, dict[str, str]]] = []
    if group is not None and instance_kind(group) == KIND_GPU:
        cuda: dict[str, str] = {}
        for accel in accelerators.gpu_execution_accelerator:
            if accel.name == "tensorrt":
                providers.append((TENSORRT, {**_tensorrt_options(dict(accel.parameters)), "device_id": device}))
            elif accel.name == "cuda":
                cuda.update(dict(accel.parameters))
        cuda["device_id"] = device
        if config.parameters:  # the deprecated block runs whenever the model has parameters
            model = {k: v.string_value for k, v in config.parameters.items()}
            for key, default in CUDA_MODEL_DEFAULTS.items():
                value = model.get(key)
                codes = CUDA_CODES.get(key)
                cuda[key] = default if value is None else (codes[int(value)] if codes else value)
        providers.append((CUDA, cuda))
    if any(a.name == "openvino" for a in accelerators.cpu_execution_accelerator):
        providers.append((OPENVINO, {"device_type": "CPU"}))
    return providers + [(CPU_EP, {})]


def _tensorrt_options(params: dict[str, str]) -> dict[str, str]:
    options = {}
    for key, value in params.items():
        if key == "precision_mode":
            if PRECISION_MODES.get(value):
                options[PRECISION_MODES[value]] = "1"
        else:
            options[TENSORRT_PARAMETERS[key][0]] = value
    return options


def backend_session(model_dir: str | Path, config: Any = None) -> tuple[ort.InferenceSession, ort.RunOptions]:
    """The session and run options the backend would create for an exported model folder.

    Raises ProviderError (exit 2) when the config needs a provider this ORT build lacks.
    """
    model_dir = Path(model_dir)
    config = config if config is not None else read_config(model_dir)
    providers = backend_providers(config)
    available = ort.get_available_providers()
    missing = [name for name, _ in providers if name not in available]
    if missing:
        raise ProviderError(
            f"'{model_dir}/config.pbtxt' runs on {', '.join(missing)}, which this ORT build lacks "
            f"(it has {', '.join(available)}); check it where that provider is installed."
        )
    run_options = ort.RunOptions()
    shrink = config.parameters.get("memory.enable_memory_arena_shrinkage")
    if shrink is not None:
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrink.string_value)
    session = ort.InferenceSession(
        str(model_dir / VERSION_DIR / MODEL_FILE), backend_settings(config).build(), providers=providers
    )
    return session, run_options


def warmup_samples(model_dir: str | Path, config: Any = None) -> list[dict[str, np.ndarray]]:
    """The config's warmup samples as feeds, read from the raw files the way Triton reads them.

    A file holds one batch element in row-major order; with ``max_batch_size`` > 0 Triton adds
    the batch dim and repeats the element ``batch_size`` times.
    """
    model_dir = Path(model_dir)
    config = config if config is not None else read_config(model_dir)
    samples = []
    for sample in config.model_warmup:
        feeds = {}
        for name, item in sample.inputs.items():
            dtype = onnx.helper.tensor_dtype_to_np_dtype(ONNX_TYPE_OF[model_config_datatype_name(item.data_type)])
            array = np.fromfile(model_dir / WARMUP_DIR / item.input_data_file, dtype=dtype).reshape(tuple(item.dims))
            if config.max_batch_size > 0:
                array = np.repeat(array[None], max(sample.batch_size, 1), axis=0)
            feeds[name] = array
        samples.append(feeds)
    return samples
