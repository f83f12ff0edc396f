"""OpenVINO's two packagings: the distribution's option names turned into what the plugin EP reads, and the
doctor's words for a plugin with no device (a non-Intel CPU) and for a plugin the build shadows.

The plugin itself runs in its own lane (tests/openvino_plugin); these are the rules, checked here on
any CPU.
"""

from __future__ import annotations

import json

import pytest

from ortpilot.providers.doctor import _plugin_findings, _shadowed_plugin_findings
from ortpilot.providers.openvino import OpenVINOOptionError, plugin_openvino_version, plugin_options

OV = "OpenVINOExecutionProvider"


def test_distribution_options_become_the_plugins_device_and_load_config():
    device, passed = plugin_options(
        {"device_type": "cpu", "num_of_threads": "2", "precision": "ACCURACY", "num_streams": "1", "cache_dir": "/c"}
    )
    assert device == "CPU"
    assert set(passed) == {"load_config"}  # nothing the plugin would ignore with a warning
    assert json.loads(passed["load_config"]) == {
        "CPU": {"INFERENCE_NUM_THREADS": "2", "EXECUTION_MODE_HINT": "ACCURACY", "NUM_STREAMS": "1", "CACHE_DIR": "/c"}
    }
    assert plugin_options({"precision": "fp32"})[1] == {"load_config": '{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}'}
    assert plugin_options({}) == ("CPU", {})


def test_a_users_load_config_wins_and_bad_values_are_named():
    _, passed = plugin_options({"num_of_threads": "2", "load_config": '{"CPU": {"INFERENCE_NUM_THREADS": "1"}}'})
    assert json.loads(passed["load_config"]) == {"CPU": {"INFERENCE_NUM_THREADS": "1"}}
    with pytest.raises(OpenVINOOptionError, match="precision 'FP64' is not one of"):
        plugin_options({"precision": "FP64"})
    with pytest.raises(OpenVINOOptionError, match="not JSON"):
        plugin_options({"load_config": "{CPU"})


def test_openvino_version_is_read_off_the_runtime_in_the_plugin_package(tmp_path):
    (tmp_path / "libopenvino.so.2641").write_bytes(b"")
    assert plugin_openvino_version(str(tmp_path / "libplugin.so")) == "2026.4.1"
    assert plugin_openvino_version(str(tmp_path / "missing" / "lib.so")) == ""


def _plugin(devices: int) -> dict:
    return {
        "distribution": "onnxruntime-ep-openvino",
        "version": "1.8.1",
        "ep_names": [OV],
        "error": "",
        "registration": {OV: {"registered": True, "error": "", "devices": devices}},
    }


def test_a_plugin_without_a_device_names_the_distribution_as_the_path():
    [finding] = _plugin_findings([_plugin(0)])
    assert finding.severity == "warn" and "Intel CPUs" in finding.message
    assert "pip install onnxruntime-openvino" in finding.fix and "own virtual environment" in finding.fix
    [ok] = _plugin_findings([_plugin(1)])
    assert ok.severity == "ok"


def test_the_plugin_beside_the_distribution_is_a_finding():
    [finding] = _shadowed_plugin_findings([_plugin(1)], [OV, "CPUExecutionProvider"])
    assert "two providers of OpenVINOExecutionProvider" in finding.message and "never used" in finding.message
    assert "pip uninstall onnxruntime-ep-openvino" in finding.fix
    assert _shadowed_plugin_findings([_plugin(1)], ["CPUExecutionProvider"]) == []
