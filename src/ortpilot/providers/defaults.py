"""Known EP gotchas, encoded as defaults. Each default says why; a user's option always wins.

These come from ORT's EP documentation; most of them cannot run on a CPU-only machine, so they
are tested as option mapping, and the reasons are printed by ``ortpilot doctor``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortpilot.providers.spec import ProviderSpec


def _cache_subdir(name: str) -> str:
    from ortpilot.artifacts.cache import cache_root

    path = cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


@dataclass(frozen=True)
class SessionOverride:
    """A session setting a provider needs, and why."""

    setting: str
    value: object
    reason: str
    provider: str


def apply_provider_defaults(specs: list[ProviderSpec]) -> list[ProviderSpec]:
    """Fill in per-EP defaults and add implied providers (CUDA behind TensorRT)."""
    out: list[ProviderSpec] = []
    names = [s.name for s in specs]
    for spec in specs:
        opts = dict(spec.options)
        if spec.name == "TensorrtExecutionProvider":
            # Building a TRT engine takes seconds to minutes; without a cache every process
            # start rebuilds it. The timing cache speeds up builds for new shapes as well.
            opts.setdefault("trt_engine_cache_enable", "1")
            opts.setdefault("trt_timing_cache_enable", "1")
            if "trt_engine_cache_path" not in opts:
                opts["trt_engine_cache_path"] = _cache_subdir("tensorrt")
            opts.setdefault("trt_timing_cache_path", opts["trt_engine_cache_path"])
            opts.setdefault("device_id", "0")
        elif spec.name == "CUDAExecutionProvider":
            # An explicit device keeps multi-GPU hosts from silently sharing GPU 0.
            opts.setdefault("device_id", "0")
            # ORT's default EXHAUSTIVE benchmarks every cuDNN algorithm on the first run of
            # each new input shape: seconds per shape with dynamic shapes. HEURISTIC avoids it;
            # tune measures EXHAUSTIVE when shapes are fixed.
            opts.setdefault("cudnn_conv_algo_search", "HEURISTIC")
        elif spec.name == "OpenVINOExecutionProvider":
            # Without device_type the EP picks the build's default device, which differs by
            # package; compiled blobs are cached so that a restart does not recompile.
            opts.setdefault("device_type", "CPU")
            if "cache_dir" not in opts:
                opts["cache_dir"] = _cache_subdir("openvino")
        elif spec.name == "CoreMLExecutionProvider":
            # The older NeuralNetwork format supports fewer ops, so more nodes land on CPU.
            opts.setdefault("ModelFormat", "MLProgram")
            opts.setdefault("MLComputeUnits", "ALL")
        elif spec.name == "QNNExecutionProvider" and "backend_path" not in opts:
            # Without a backend QNN cannot create a session; HTP is the NPU most users want.
            opts.setdefault("backend_type", "htp")
        out.append(ProviderSpec(spec.name, opts))
        if spec.name == "TensorrtExecutionProvider" and "CUDAExecutionProvider" not in names:
            # Subgraphs TensorRT rejects should run on CUDA, not bounce to CPU with copies.
            out.append(apply_provider_defaults([ProviderSpec("CUDAExecutionProvider")])[0])
            names.append("CUDAExecutionProvider")
    return out


def session_overrides(specs: list[ProviderSpec]) -> list[SessionOverride]:
    """Session settings that the chosen providers need to work or to work well."""
    names = {s.name for s in specs}
    out: list[SessionOverride] = []
    if "DmlExecutionProvider" in names:
        out.append(
            SessionOverride(
                "enable_mem_pattern",
                False,
                "DirectML does not support memory patterns (ORT's DML EP docs)",
                "DmlExecutionProvider",
            )
        )
        out.append(
            SessionOverride(
                "execution_mode",
                "sequential",
                "DirectML does not support parallel execution (ORT's DML EP docs)",
                "DmlExecutionProvider",
            )
        )
    if "TensorrtExecutionProvider" in names:
        out.append(
            SessionOverride(
                "level",
                "basic",
                "extended/all-level fusions produce com.microsoft contrib ops that TensorRT cannot take, "
                "which splits the graph and sends those nodes to CUDA/CPU (ORT's TensorRT EP docs)",
                "TensorrtExecutionProvider",
            )
        )
    return out
