"""OpenVINO's two packagings for ORT, and how ortpilot's OpenVINO options reach each.

- ``onnxruntime-openvino`` (a distribution: it replaces ``onnxruntime``, its own venv; runs on any
  x86 CPU) reads provider options by name: ``device_type``, ``num_of_threads``, ``precision``,
  ``num_streams``, ``cache_dir``.
- ``onnxruntime-ep-openvino`` (a plugin EP on stock ``onnxruntime``; lists a device on Intel CPUs
  only) is created through its EP devices: it ignores those names (with a warning per option) and
  reads OpenVINO properties from one option, ``load_config``, a JSON object per OpenVINO device.

Users and profiles write the distribution's names either way; :func:`plugin_request` turns them
into the plugin's device and ``load_config`` so that ``-p openvino:num_of_threads=2`` means the
same on both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

OPENVINO = "OpenVINOExecutionProvider"
PLUGIN_DISTRIBUTION = "onnxruntime-ep-openvino"
ORT_DISTRIBUTION = "onnxruntime-openvino"
# provider option -> the OpenVINO property the plugin reads from load_config
PROPERTIES = {
    "num_of_threads": "INFERENCE_NUM_THREADS",
    "num_streams": "NUM_STREAMS",
    "cache_dir": "CACHE_DIR",
    "performance_hint": "PERFORMANCE_HINT",
}
# ``precision`` -> (property, value): ACCURACY keeps the model's own precision (OpenVINO runs an fp32
# model in bf16 on a CPU with AMX otherwise), the others set the inference precision.
PRECISIONS = {
    "FP32": ("INFERENCE_PRECISION_HINT", "f32"),
    "FP16": ("INFERENCE_PRECISION_HINT", "f16"),
    "BF16": ("INFERENCE_PRECISION_HINT", "bf16"),
    "ACCURACY": ("EXECUTION_MODE_HINT", "ACCURACY"),
}
# Options that only say which device: the plugin picks it from its EP devices instead.
DEVICE_OPTIONS = ("device_type", "device_id")


class OpenVINOOptionError(ValueError):
    """An OpenVINO option the plugin cannot be given (the message says which and why)."""


def plugin_options(options: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """(the OpenVINO device to pick, the options to pass the plugin) for the distribution-style ``options``.

    Options the plugin reads as they are (``load_config`` and any name not listed here) pass through;
    a ``load_config`` given by the user wins over the translated properties it also sets."""
    device = str(options.get("device_type", "CPU")).upper() or "CPU"
    config: dict[str, str] = {}
    passed: dict[str, str] = {}
    for key, value in options.items():
        if key in DEVICE_OPTIONS:
            continue
        if key in PROPERTIES:
            config[PROPERTIES[key]] = str(value)
        elif key == "precision":
            if str(value).upper() not in PRECISIONS:
                raise OpenVINOOptionError(
                    f"OpenVINO precision '{value}' is not one of {', '.join(PRECISIONS)} (openvino:precision=FP32)."
                )
            prop, setting = PRECISIONS[str(value).upper()]
            config[prop] = setting
        elif key != "load_config":
            passed[key] = str(value)
    if config or "load_config" in options:
        merged: dict[str, Any] = {device: config} if config else {}
        if "load_config" in options:
            try:
                user = json.loads(str(options["load_config"]))
            except json.JSONDecodeError as exc:
                raise OpenVINOOptionError(f"OpenVINO load_config is not JSON ({exc}).") from None
            if not isinstance(user, dict):
                raise OpenVINOOptionError("OpenVINO load_config must be a JSON object of devices.")
            for dev, props in user.items():
                merged.setdefault(dev, {}).update(props if isinstance(props, dict) else {})
        passed["load_config"] = json.dumps(merged, sort_keys=True)
    return device, passed


def pick_devices(devices: Sequence[Any], device: str) -> list[Any]:
    """The plugin's EP devices for OpenVINO device ``device`` (``CPU``, ``GPU``, ``NPU``; by ``ov_device``)."""
    return [d for d in devices if str(dict(d.ep_metadata).get("ov_device", "")).upper() == device]


def listed_devices(devices: Sequence[Any]) -> list[str]:
    return sorted({str(dict(d.ep_metadata).get("ov_device", "?")) for d in devices})


def plugin_openvino_version(library_path: str) -> str:
    """OpenVINO's version inside the plugin package, read off its runtime's file name
    (``libopenvino.so.2641`` is 2026.4.1); '' when it cannot be told."""
    folder = Path(library_path).parent if library_path else None
    if folder is None or not folder.is_dir():
        return ""
    for path in sorted(folder.glob("libopenvino.so.*")):
        digits = path.name.rsplit(".", 1)[-1]
        if digits.isdigit() and len(digits) >= 3:
            return f"20{digits[:2]}.{digits[2]}.{digits[3:] or '0'}"
    return ""


__all__ = [
    "OPENVINO",
    "ORT_DISTRIBUTION",
    "PLUGIN_DISTRIBUTION",
    "PRECISIONS",
    "PROPERTIES",
    "OpenVINOOptionError",
    "listed_devices",
    "pick_devices",
    "plugin_openvino_version",
    "plugin_options",
]
