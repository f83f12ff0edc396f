"""Fallback records and the policy that decides what a fallback does."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from ortpilot.errors import ProviderFallbackError, UsageError

POLICIES = ("strict", "warn", "allow")
LAYER_TITLES = {
    1: "provider not in this ORT build",
    2: "provider library or device failed to load",
    3: "provider raised while creating the session",
    4: "nodes placed on another provider",
}
log = logging.getLogger("ortpilot")


@dataclass(frozen=True)
class Fallback:
    """One way the session did not get what was asked for."""

    layer: int
    requested: str
    got: list[str]
    reason: str
    fix: str = ""

    @property
    def title(self) -> str:
        return LAYER_TITLES[self.layer]

    def message(self) -> str:
        got = ", ".join(self.got) if self.got else "nothing yet"
        text = f"{self.requested}: {self.title} (layer {self.layer}); running on {got} instead."
        if self.reason:
            text += f" ORT said: {self.reason.rstrip('.')}."
        if self.fix:
            text += f" Fix: {self.fix}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "title": self.title}


def check_policy(policy: str) -> str:
    key = (policy or "").lower()
    if key not in POLICIES:
        raise UsageError(
            f"Unknown policy '{policy}'. Choose strict (raise on any fallback), warn (log and "
            "record) or allow (record only)."
        )
    return key


def apply_policy(policy: str, event: Fallback) -> None:
    """Raise (strict), log one warning (warn) or do nothing (allow); the caller records it."""
    if policy == "strict":
        raise ProviderFallbackError(
            f"Strict policy: {event.message()}",
            requested=event.requested,
            loaded=event.got,
            reason=event.reason,
            layer=event.layer,
        )
    if policy == "warn":
        log.warning("Provider fallback: %s", event.message())


@dataclass
class FallbackRecorder:
    """The fallbacks one load finds, in the order found, under one policy."""

    policy: str
    events: list[Fallback] = field(default_factory=list)

    def record(self, event: Fallback, *, enforce: bool = True) -> None:
        """Keep ``event``; with ``enforce`` the policy also acts on it (strict raises, warn logs)."""
        self.events.append(event)
        if enforce:
            apply_policy(self.policy, event)


FIXES = {
    "CUDAExecutionProvider": "install the GPU build: pip uninstall onnxruntime && pip install onnxruntime-gpu "
    "(with CUDA and cuDNN versions matching it); 'ortpilot doctor' checks them.",
    "TensorrtExecutionProvider": "install onnxruntime-gpu built with TensorRT and the TensorRT libraries it "
    "expects; 'ortpilot doctor' lists what is missing.",
    "OpenVINOExecutionProvider": "install onnxruntime-openvino in its own virtual environment (it replaces the "
    "onnxruntime package), or the onnxruntime-ep-openvino plugin.",
    "DmlExecutionProvider": "install onnxruntime-directml (Windows only).",
    "CoreMLExecutionProvider": "CoreML exists only in the macOS builds of onnxruntime.",
    "QNNExecutionProvider": "install onnxruntime-qnn on a Snapdragon device.",
    "WebGpuExecutionProvider": "install onnxruntime-ep-webgpu and make sure a Vulkan/Metal/D3D12 GPU driver "
    "(and on Linux the Vulkan loader libvulkan1) is present.",
}


def fix_for(provider: str) -> str:
    return FIXES.get(provider, "run 'ortpilot doctor' to see which providers this environment really has.")
