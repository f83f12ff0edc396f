"""What one execution provider is, as ortpilot passes it to ORT: a full name and its options.

The record and the names table live here, below both ``names`` (parsing what users type) and
``defaults`` (the gotcha options ortpilot adds), so that neither imports the other's caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortpilot.eps import CPU_EP

PROVIDER_ALIASES: dict[str, str] = {
    "cpu": CPU_EP,
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "ov": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider",
    "azure": "AzureExecutionProvider",
}

SHORT_NAMES: tuple[str, ...] = ("cpu", "cuda", "tensorrt", "openvino", "coreml", "dml", "webgpu", "qnn")

# Provider option naming a plugin EP library to register; ortpilot's own, never passed to ORT.
EP_LIBRARY_OPTION = "ep_library"


@dataclass(frozen=True)
class ProviderSpec:
    """One execution provider with its options, as ortpilot will pass it to ORT."""

    name: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return short_name(self.name)

    def ort_options(self) -> dict[str, str]:
        """Options as ORT takes them (without ortpilot's own keys)."""
        return {k: v for k, v in self.options.items() if k != EP_LIBRARY_OPTION}

    def as_ort(self) -> tuple[str, dict[str, str]]:
        return (self.name, self.ort_options())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "short": self.short, "options": dict(self.options)}

    def __str__(self) -> str:
        if not self.options:
            return self.short
        return self.short + ":" + ",".join(f"{k}={v}" for k, v in self.options.items())


def short_name(full: str) -> str:
    for short, name in PROVIDER_ALIASES.items():
        if name == full and short in SHORT_NAMES + ("rocm", "migraphx", "dnnl", "xnnpack", "azure"):
            return short
    return full


# Providers that ORT lists but that run nothing locally: no search tries them, no machine class counts them.
NOT_COMPUTE = {"AzureExecutionProvider": "a remote-endpoint provider; it runs no local compute"}


__all__ = ["EP_LIBRARY_OPTION", "NOT_COMPUTE", "PROVIDER_ALIASES", "SHORT_NAMES", "ProviderSpec", "short_name"]
