"""Where the NNCF-on-OpenVINO tests can run: NNCF installed and OpenVINO computing (the plugin lane on Intel CPUs,
or the onnxruntime-openvino distribution with NNCF on any x86 CPU)."""

from __future__ import annotations

import importlib.util

import pytest

from ortpilot.providers.plugins import compute_providers

OV = "OpenVINOExecutionProvider"


def _reason() -> str:
    if importlib.util.find_spec("nncf") is None:
        return "NNCF is not installed (pip install -e '.[cpu,openvino-plugin]')"
    if OV not in compute_providers():
        return "OpenVINO computes nowhere here (the plugin lists Intel CPUs only; or onnxruntime-openvino)"
    return ""


REASON = _reason()
MARKS = [pytest.mark.openvino_plugin, pytest.mark.skipif(bool(REASON), reason=REASON or "-")]
