"""NVIDIA libraries on this machine versus the CUDA/cuDNN majors the ORT build expects.

onnxruntime-gpu dlopens libcudart/libcublas/libcudnn (and libnvinfer for TensorRT) of one
major version each; with another major present, or none, the CUDA EP fails to load and ORT
silently runs on CPU (fallback layer 2). The versions ORT was built with are in
``onnxruntime.capi.build_and_package_info`` (GPU builds only).
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

# library family -> soname stem ("libcudart.so.12" -> major 12).
LIBRARIES: dict[str, str] = {"cuda_runtime": "cudart", "cublas": "cublas", "cudnn": "cudnn", "tensorrt": "nvinfer"}
# pip wheels that ship those libraries (onnxruntime-gpu can load them from site-packages).
_PIP_PREFIXES: dict[str, tuple[str, ...]] = {
    "cuda_runtime": ("nvidia-cuda-runtime",),
    "cublas": ("nvidia-cublas",),
    "cudnn": ("nvidia-cudnn",),
    "tensorrt": ("tensorrt-cu", "tensorrt-libs", "tensorrt"),
}


@dataclass
class LibraryHit:
    """One copy of a library: its major version, where, and how it was found."""

    family: str
    major: int | None
    where: str
    source: str  # ldconfig, LD_LIBRARY_PATH, find_library, pip

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "major": self.major, "where": self.where, "source": self.source}


@dataclass
class GpuEnvironment:
    """NVIDIA driver and libraries found, and what the running ORT build expects."""

    driver_version: str | None = None
    gpus: list[str] = field(default_factory=list)
    nvidia_smi: str | None = None
    libraries: list[LibraryHit] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)  # cuda_version / cudnn_version from the build

    def majors(self, family: str) -> list[int]:
        return sorted({h.major for h in self.libraries if h.family == family and h.major is not None})

    def to_dict(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "gpus": self.gpus,
            "nvidia_smi": self.nvidia_smi,
            "libraries": {
                fam: {"majors": self.majors(fam), "found": [h.to_dict() for h in self.libraries if h.family == fam]}
                for fam in LIBRARIES
            },
            "expected_by_ort": self.expected,
        }


def expected_by_ort() -> dict[str, str]:
    """CUDA/cuDNN versions the running ORT was built against ({} for CPU builds or no ORT)."""
    try:
        from onnxruntime.capi import build_and_package_info as info
    except Exception:  # no ORT, or a broken mix: the distribution check reports that
        return {}
    return {
        key: str(getattr(info, key))
        for key in ("package_name", "cuda_version", "cudnn_version")
        if getattr(info, key, None)
    }


def _major_of(name: str, stem: str) -> int | None:
    match = re.search(rf"lib{stem}\.so\.(\d+)", name) or re.search(rf"{stem}64_(\d+)", name)
    return int(match.group(1)) if match else None


def _ldconfig_hits() -> list[LibraryHit]:
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not ldconfig:
        return []
    try:
        text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    hits = []
    for line in text.splitlines():
        name, _, path = line.strip().partition(" => ")
        for family, stem in LIBRARIES.items():
            if name.startswith(f"lib{stem}.so"):
                hits.append(LibraryHit(family, _major_of(name, stem), path.strip(), "ldconfig"))
    return hits


def _ld_library_path_hits() -> list[LibraryHit]:
    hits = []
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            for family, stem in LIBRARIES.items():
                if name.startswith(f"lib{stem}.so."):
                    hits.append(
                        LibraryHit(family, _major_of(name, stem), os.path.join(folder, name), "LD_LIBRARY_PATH")
                    )
    return hits


def _find_library_hits(seen: set[str]) -> list[LibraryHit]:
    hits = []
    for family, stem in LIBRARIES.items():
        if family in seen:
            continue
        name = ctypes.util.find_library(stem)
        if name:
            hits.append(LibraryHit(family, _major_of(name, stem), name, "find_library"))
    return hits


def _pip_hits() -> list[LibraryHit]:
    hits = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        for family, prefixes in _PIP_PREFIXES.items():
            if name.startswith(prefixes) and not name.startswith("tensorrt-dispatch"):
                major = re.search(r"cu(\d+)", name)
                version_major = int(dist.version.split(".")[0]) if dist.version[:1].isdigit() else None
                # cuDNN/TensorRT wheels carry their own major in the version; CUDA ones in the name.
                value = (
                    version_major
                    if family in ("cudnn", "tensorrt")
                    else (int(major.group(1)) if major else version_major)
                )
                hits.append(LibraryHit(family, value, f"{name} {dist.version}", "pip"))
    return hits


def _nvidia_smi() -> tuple[str | None, str | None, list[str]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, None, []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return exe, None, [f"nvidia-smi failed: {exc}"]
    rows = [r.strip() for r in out.stdout.splitlines() if r.strip()]
    driver = rows[0].split(",")[1].strip() if rows and rows[0].count(",") >= 1 else None
    return exe, driver, rows or [out.stderr.strip()[:200]]


def scan_gpu_environment() -> GpuEnvironment:
    """Driver, GPUs and CUDA/cuDNN/TensorRT libraries found through every channel ORT uses."""
    smi, driver, gpus = _nvidia_smi()
    hits = _ldconfig_hits() + _ld_library_path_hits() + _pip_hits()
    hits += _find_library_hits({h.family for h in hits})
    return GpuEnvironment(driver, gpus, smi, hits, expected_by_ort())


def _major(text: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def library_mismatches(env: GpuEnvironment) -> list[tuple[str, str]]:
    """(family, problem) for each library the ORT build expects at a major that is not present."""
    problems = []
    for family, key in (("cuda_runtime", "cuda_version"), ("cudnn", "cudnn_version")):
        want = _major(env.expected.get(key))
        if want is None:
            continue
        have = env.majors(family)
        if want not in have:
            found = ", ".join(map(str, have)) if have else "none"
            problems.append(
                (
                    family,
                    f"ORT was built for {family.replace('_', ' ')} {env.expected[key]} "
                    f"(major {want}); found major(s): {found}",
                )
            )
    return problems


__all__ = ["GpuEnvironment", "LibraryHit", "expected_by_ort", "library_mismatches", "scan_gpu_environment"]
