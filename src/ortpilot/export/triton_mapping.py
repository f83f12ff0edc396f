"""A profile's providers and session settings -> what Triton's ORT backend reads, and what it cannot.

The mapping follows ``triton_backend`` (the backend's own source); whatever has no place in a
``config.pbtxt`` becomes a ``Loss`` with its consequence instead of being dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortpilot.eps import CPU_EP
from ortpilot.errors import UsageError
from ortpilot.export.losses import Loss
from ortpilot.export.triton_backend import (
    CUDA,
    CUDA_CODES,
    GPU_PROVIDERS,
    GRAPH_LEVELS,
    OPENVINO,
    PRECISION_MODES,
    SUPPORTED_PROVIDERS,
    TENSORRT,
    TENSORRT_PARAMETERS,
)
from ortpilot.providers.names import ProviderSpec, short_name
from ortpilot.session.options import SessionSettings

KIND_CPU, KIND_GPU = "KIND_CPU", "KIND_GPU"
DEVICE_ALLOCATOR_KEY = "session.use_device_allocator_for_initializers"
# Where an exported TensorRT engine cache goes: this machine's cache path means nothing on a server.
TRT_CACHE_ROOT = "/tmp/ortpilot-trt-cache"
_CUDA_MODEL_KEYS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")
_SPINNING = (
    "idle threads spin again, ORT's default: on few or shared cores they take time from the working "
    "threads, so the latency the profile measured without spinning does not hold"
)
_ENTRY_CONSEQUENCES = {
    "session.intra_op.allow_spinning": "intra-op " + _SPINNING,
    "session.inter_op.allow_spinning": "inter-op " + _SPINNING,
}


@dataclass
class BackendSettings:
    """The session half of a ``config.pbtxt``: what the backend builds each instance's ORT session from."""

    kind: str
    gpus: list[int] = field(default_factory=list)
    level: int | None = None  # optimization.graph.level; None: no ``graph`` (all optimizations)
    parameters: dict[str, str] = field(default_factory=dict)
    gpu_accelerators: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    cpu_accelerators: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    losses: list[Loss] = field(default_factory=list)

    @property
    def provider_order(self) -> list[str]:
        """The ORT providers the backend appends, in its order (GPU ones only on GPU instances)."""
        gpu = [TENSORRT] if any(n == "tensorrt" for n, _ in self.gpu_accelerators) else []
        gpu += [CUDA] if self.kind == KIND_GPU else []
        return gpu + [OPENVINO] * bool(self.cpu_accelerators) + [CPU_EP]


def check_supported(chain: list[ProviderSpec]) -> None:
    """Exit 2 for a provider Triton's ORT backend cannot use, naming it and the ones it can."""
    bad = [spec.name for spec in chain if spec.name not in SUPPORTED_PROVIDERS]
    if bad:
        raise UsageError(
            f"The profile runs on {', '.join(short_name(b) for b in bad)}, which Triton's ONNX Runtime "
            f"backend cannot use: it runs {', '.join(short_name(s) for s in SUPPORTED_PROVIDERS)}. "
            "Tune for one of those (ortpilot tune MODEL -p cuda ...) and export that profile."
        )


def map_profile(
    chain: list[ProviderSpec], settings: SessionSettings, *, name: str, kind: str | None = None
) -> BackendSettings:
    """Map a (supported) provider chain and its session settings onto the backend's config fields."""
    check_supported(chain)
    derived = KIND_GPU if chain[0].name in GPU_PROVIDERS else KIND_CPU
    out = BackendSettings(kind=kind or derived)
    _map_settings(settings, out)
    devices: set[int] = set()
    for spec in chain:
        if spec.name == TENSORRT:
            out.gpu_accelerators.append(("tensorrt", _tensorrt(spec, name, out, devices)))
        elif spec.name == CUDA:
            out.gpu_accelerators.append(("cuda", _cuda(spec, out, devices)))
        elif spec.name == OPENVINO:
            out.cpu_accelerators.append(("openvino", {}))
            for key, value in spec.options.items():
                out.losses.append(Loss(f"providers.OpenVINO.{key}", value, _openvino_loss(key, value)))
        else:
            for key, value in spec.options.items():
                out.losses.append(
                    Loss(
                        f"providers.CPU.{key}",
                        value,
                        "the backend passes no CPU provider options: ORT's default applies",
                    )
                )
    if devices - {0}:
        out.gpus = sorted(devices)
    _kind_losses(chain, derived, out)
    return out


def _map_settings(settings: SessionSettings, out: BackendSettings) -> None:
    out.level = GRAPH_LEVELS[settings.level]
    if settings.level == "layout":
        out.losses.append(
            Loss(
                "session_settings.level",
                "layout",
                "Triton's graph levels have no 'layout': "
                "exported as all (no optimization.graph), which runs the layout transformations "
                "and any level above them",
            )
        )
    out.parameters.update(
        {
            "execution_mode": "1" if settings.execution_mode == "parallel" else "0",
            "intra_op_thread_count": str(settings.intra_op_threads),
            "inter_op_thread_count": str(settings.inter_op_threads),
            "enable_mem_arena": "1" if settings.enable_cpu_mem_arena else "0",
            "enable_mem_pattern": "1" if settings.enable_mem_pattern else "0",
        }
    )
    for key, value in settings.config_entries.items():
        if key == DEVICE_ALLOCATOR_KEY:
            out.parameters[key] = str(value)
            continue
        out.losses.append(
            Loss(
                f"session_settings.config_entries[{key}]",
                str(value),
                _ENTRY_CONSEQUENCES.get(
                    key,
                    "the backend sets no session config entries except "
                    + DEVICE_ALLOCATOR_KEY
                    + ": ORT's default for this one applies",
                ),
            )
        )
    for dim, size in settings.free_dimension_overrides.items():
        out.losses.append(
            Loss(
                f"session_settings.free_dimension_overrides[{dim}]",
                str(size),
                "the dim stays symbolic: ORT cannot specialize the graph to this size, and requests "
                "of other sizes are accepted",
            )
        )


def _device(spec: ProviderSpec, devices: set[int]) -> None:
    if "device_id" in spec.options:
        try:
            devices.add(int(spec.options["device_id"]))
        except ValueError:
            raise UsageError(
                f"The profile's {short_name(spec.name)} device_id '{spec.options['device_id']}' is not a number."
            ) from None


def _tensorrt(spec: ProviderSpec, name: str, out: BackendSettings, devices: set[int]) -> dict[str, str]:
    """ORT TensorRT options -> the tensorrt accelerator's parameters (their Triton names)."""
    _device(spec, devices)
    by_ort_key = {ort_key: key for key, (ort_key, _) in TENSORRT_PARAMETERS.items()}
    params: dict[str, str] = {}
    precisions = [
        mode for mode, key in PRECISION_MODES.items() if key and spec.options.get(key, "0").lower() in ("1", "true")
    ]
    if precisions:
        # INT8 wins: it is the one that changes the model most, and ORT enables FP16 beside it.
        chosen = "INT8" if "INT8" in precisions else precisions[0]
        params["precision_mode"] = chosen
        for other in precisions:
            if other != chosen:
                out.losses.append(
                    Loss(
                        f"providers.TensorRT.{PRECISION_MODES[other]}",
                        "1",
                        f"precision_mode takes one value: exported {chosen}; layers TensorRT "
                        f"would have run in {other} beside it run in FP32",
                    )
                )
    for key, value in spec.options.items():
        if key == "device_id" or key in PRECISION_MODES.values():
            continue
        if key in ("trt_engine_cache_path", "trt_timing_cache_path"):
            server_path = f"{TRT_CACHE_ROOT}/{name}"
            params[by_ort_key[key]] = server_path
            out.losses.append(
                Loss(
                    f"providers.TensorRT.{key}",
                    value,
                    f"a path on this machine: exported as "
                    f"{server_path} on the server, so engines are built again on the server's first "
                    "load (minutes for a large model); mount a persistent volume there and edit "
                    "the path to keep them across restarts",
                )
            )
        elif key in by_ort_key:
            params[by_ort_key[key]] = value
        else:
            out.losses.append(
                Loss(
                    f"providers.TensorRT.{key}",
                    value,
                    "the tensorrt accelerator has no parameter for it: ORT's default applies",
                )
            )
    return params


def _cuda(spec: ProviderSpec, out: BackendSettings, devices: set[int]) -> dict[str, str]:
    """ORT CUDA options -> the cuda accelerator's parameters, except the four the backend overrides
    from the model-level keys (written there, in the integer codes it reads)."""
    _device(spec, devices)
    params: dict[str, str] = {}
    for key, value in spec.options.items():
        if key == "device_id":
            continue
        if key in _CUDA_MODEL_KEYS:
            codes = CUDA_CODES.get(key)
            if codes and value in codes:
                value = str(codes.index(value))
            out.parameters[key] = value
        elif key in ("user_compute_stream", "has_user_compute_stream"):
            out.losses.append(
                Loss(f"providers.CUDA.{key}", value, "the backend gives each instance its own CUDA stream")
            )
        else:
            params[key] = value
    return params


def _openvino_loss(key: str, value: str) -> str:
    if key == "device_type" and value.upper() != "CPU":
        return (
            f"the backend reads no OpenVINO options and always uses device_type CPU: the model runs on the "
            f"CPU, not on {value}"
        )
    return "the backend reads no OpenVINO options (it sets device_type CPU only): OpenVINO's default applies"


def _kind_losses(chain: list[ProviderSpec], derived: str, out: BackendSettings) -> None:
    if out.kind != derived:
        out.losses.append(
            Loss(
                "instance_group.kind",
                out.kind,
                (
                    "the backend appends CUDA on every GPU instance: the model runs on CUDA, which the profile never "
                    "verified"
                )
                if out.kind == KIND_GPU
                else (
                    "the backend appends CUDA/TensorRT only on GPU instances: on a CPU instance the model runs on the "
                    "CPU, which the profile never verified"
                ),
            )
        )
    wanted = [spec.name for spec in chain if spec.name != CPU_EP] + [CPU_EP]
    if out.provider_order != wanted and out.kind == derived:
        out.losses.append(
            Loss(
                "providers",
                " > ".join(short_name(n) for n in wanted),
                "the backend appends providers in its own order ("
                + " > ".join(short_name(n) for n in out.provider_order)
                + ")",
            )
        )
