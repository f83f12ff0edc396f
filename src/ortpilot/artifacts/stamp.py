"""Stamps: what a written model was built for, stored in its own ``metadata_props``.

An offline-optimized model at extended/layout/all level can hold EP-specific fused ops and,
on CPU, layouts chosen for this CPU's vector width; loaded elsewhere it fails or quietly runs
a slow path. Every model ortpilot writes carries a stamp (JSON under ``ortpilot.stamp``):
ORT version and distribution, providers and their options, level, source model hash and
path, CPU features, GPU flag, ortpilot version. ``check_stamp`` refuses a model whose stamp
does not fit the session about to run it, and says why.
"""

from __future__ import annotations

import functools
import json
import platform
from collections.abc import Sequence
from typing import Any

import onnx

from ortpilot.eps import CPU_EP
from ortpilot.errors import StampMismatchError

STAMP_KEY = "ortpilot.stamp"
STAMP_VERSION = 1
# Levels whose saved graph can hold EP-specific ops or CPU-specific layouts.
EP_SPECIFIC_LEVELS = ("extended", "layout", "all")
# CPU flags that change what ORT's CPU kernels and layout transforms choose.
_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "sve",
    "i8mm",
    "bf16",
)


@functools.lru_cache(maxsize=1)
def cpu_features() -> dict[str, Any]:
    """Architecture and the vector/matrix ISA flags that ORT's kernels dispatch on."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    present = sorted(f for f in _CPU_FLAGS if f in flags)
    if "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags:
        isa = "avx2"
    elif "asimd" in flags:
        isa = "neon"
    else:
        isa = "baseline"
    return {"arch": platform.machine(), "isa": isa, "flags": present}


@functools.lru_cache(maxsize=1)
def ort_distribution() -> str:
    """Which ORT package provides ``import onnxruntime`` (onnxruntime, -gpu, -openvino, ...)."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name.startswith("onnxruntime") and not name.startswith("onnxruntime-ep") and name != "onnxruntime-genai":
            found.append(f"{name}=={dist.version}")
    return ",".join(sorted(set(found))) or "unknown"


def _providers_list(providers: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Provider dicts of resolved providers (``ProviderSpec`` or their dicts): the caller resolves user
    spellings (``providers.names.resolve_providers``), which live a layer above this one."""
    return [p.to_dict() if hasattr(p, "to_dict") else dict(p) for p in providers or ()]


def make_stamp(
    *,
    source_sha256: str,
    providers: Sequence[Any] | None = None,
    level: str | None = None,
    ep_specific: bool | None = None,
    source_path: str | None = None,
    pass_name: str = "",
    options: dict[str, Any] | None = None,
    ort_version: str | None = None,
) -> dict[str, Any]:
    """Build a stamp. ``ep_specific`` defaults to True for extended/layout/all levels."""
    import onnxruntime as ort

    from ortpilot.version import __version__

    specs = _providers_list(providers)
    return {
        "stamp_version": STAMP_VERSION,
        "ortpilot_version": __version__,
        "ort_version": ort_version or ort.__version__,
        "ort_distribution": ort_distribution(),
        "providers": specs,
        "level": level,
        "ep_specific": bool(level in EP_SPECIFIC_LEVELS) if ep_specific is None else bool(ep_specific),
        "source_sha256": source_sha256,
        "source_path": source_path,
        "pass": pass_name,
        "options": options or {},
        "cpu": cpu_features(),
        "gpu": any(s["name"] not in (CPU_EP,) for s in specs),
        # No wall-clock time: the same input and options must give byte-identical files (the
        # cache entry's entry.json records when it was built).
    }


def write_stamp(model: onnx.ModelProto, stamp: dict[str, Any]) -> onnx.ModelProto:
    """Put ``stamp`` into the model's metadata (replacing an older ortpilot stamp)."""
    kept = [p for p in model.metadata_props if p.key != STAMP_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=STAMP_KEY, value=json.dumps(stamp, sort_keys=True))
    return model


def read_stamp(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The model's ortpilot stamp, or None when it has none (or an unreadable one)."""
    for prop in model.metadata_props:
        if prop.key == STAMP_KEY:
            try:
                data = json.loads(prop.value)
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def stamp_problems(stamp: dict[str, Any], providers: Sequence[Any] | None, ort_version: str | None = None) -> list[str]:
    """Why a model with ``stamp`` must not run on ``providers`` with ``ort_version`` (empty: it may)."""
    import onnxruntime as ort

    if not stamp.get("ep_specific"):
        return []
    running = ort_version or ort.__version__
    problems = []
    if stamp.get("ort_version") != running:
        problems.append(f"it was built with ORT {stamp.get('ort_version')} and ORT {running} is running")
    built = [p.get("name") for p in stamp.get("providers") or []]
    wanted = [p["name"] for p in _providers_list(providers)]
    if built and wanted and built[0] != wanted[0]:
        problems.append(f"it was optimized for {built[0]} and the session asks for {wanted[0]}")
    level = stamp.get("level")
    if (
        wanted
        and wanted[0] == CPU_EP
        and level in ("layout", "all")
        and (stamp.get("cpu") or {}).get("isa") not in (None, cpu_features()["isa"])
    ):
        problems.append(
            f"its CPU layouts were chosen for {stamp['cpu']['isa']} and this CPU is {cpu_features()['isa']}"
        )
    return problems


def describe_stamp(stamp: dict[str, Any]) -> str:
    eps = ", ".join(p.get("name", "?") for p in stamp.get("providers") or []) or "?"
    return f"{eps} at level {stamp.get('level')} with ORT {stamp.get('ort_version')}"


def check_stamp(model_proto: onnx.ModelProto, providers: Sequence[Any] | None, ort_version: str | None = None) -> None:
    """Raise StampMismatchError when the model's stamp does not fit these providers and ORT."""
    stamp = read_stamp(model_proto)
    if stamp is None:
        return
    problems = stamp_problems(stamp, providers, ort_version)
    if problems:
        raise StampMismatchError(mismatch_message(stamp, problems))


def mismatch_message(stamp: dict[str, Any], problems: list[str]) -> str:
    source = stamp.get("source_path") or "SOURCE.onnx"
    eps = [p.get("short") or p.get("name") for p in stamp.get("providers") or []]
    return (
        f"This model was built for {describe_stamp(stamp)}, but " + "; ".join(problems) + ". Offline-optimized "
        "models can hold provider-specific fused ops and CPU-specific layouts, so ortpilot will not run it here. "
        f"Rebuild it from its source for what is in use: 'ortpilot optimize {source} -o OUT "
        f"--level {stamp.get('level')} -p PROVIDER' (it was built with -p {' -p '.join(eps) or 'cpu'}), "
        "or load the source model directly."
    )


__all__ = [
    "STAMP_KEY",
    "check_stamp",
    "cpu_features",
    "describe_stamp",
    "make_stamp",
    "mismatch_message",
    "ort_distribution",
    "read_stamp",
    "stamp_problems",
    "write_stamp",
]
