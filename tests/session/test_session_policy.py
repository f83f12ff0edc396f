"""Every policy x fallback layer that this machine can produce, on real ORT sessions.

Layer 1: CUDA is not in the CPU build. Layer 2: the WebGPU plugin EP registers but finds no
device here, and a plugin library path that does not exist fails to load. Layer 4: the Azure EP
loads but takes no node of an ordinary model. Layer 3 needs an EP that raises at creation
(silero-vad on OpenVINO): see tests/openvino_dist.
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import pytest

import ortpilot
from ortpilot.errors import ProviderFallbackError

needs_webgpu = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime_ep_webgpu") is None, reason="onnxruntime-ep-webgpu not installed"
)


@pytest.fixture
def mlp(demo_paths):
    return demo_paths["mlp"]


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def ortpilot_log():
    """Records of the 'ortpilot' logger, independent of other handlers (the CLI installs its own)."""
    logger = logging.getLogger("ortpilot")
    handler = _ListHandler()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_cpu_strict_places_every_node_on_cpu(mlp):
    sess = ortpilot.load(mlp, ["cpu"], policy="strict")
    assert sess.providers == ["CPUExecutionProvider"]
    assert sess.fallbacks == []
    assert sess.placement.total > 0
    assert sess.placement.share("CPUExecutionProvider") == 1.0
    out = sess.run(None, {"x": np.ones((2, 64), np.float32)})
    assert out[0].shape == (2, 10)


CASES = {
    "layer1-cuda": (["cuda", "cpu"], 1, "CUDAExecutionProvider"),
    "layer2-bad-library": (["webgpu:ep_library=/nonexistent/libort_ep.so", "cpu"], 2, "WebGpuExecutionProvider"),
    "layer4-azure": (["azure", "cpu"], 4, "AzureExecutionProvider"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_strict_raises_with_layer_and_reason(mlp, case):
    providers, layer, name = CASES[case]
    with pytest.raises(ProviderFallbackError) as info:
        ortpilot.load(mlp, providers, policy="strict")
    err = info.value
    assert err.layer == layer
    assert err.requested == name
    assert err.reason
    assert name in str(err)
    assert err.exit_code == 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_warn_logs_once_and_records(mlp, case, ortpilot_log):
    providers, layer, name = CASES[case]
    sess = ortpilot.load(mlp, providers, policy="warn")
    assert [f.layer for f in sess.fallbacks] == [layer]
    assert sess.fallbacks[0].requested == name
    warnings = [r for r in ortpilot_log if r.levelno == logging.WARNING and name in r.getMessage()]
    assert len(warnings) == 1
    assert "CPUExecutionProvider" in sess.providers
    assert sess.run(None, {"x": np.ones((1, 64), np.float32)})[0].shape == (1, 10)


@pytest.mark.parametrize("case", sorted(CASES))
def test_allow_records_silently(mlp, case, ortpilot_log):
    providers, layer, _name = CASES[case]
    sess = ortpilot.load(mlp, providers, policy="allow")
    assert [f.layer for f in sess.fallbacks] == [layer]
    assert not [r for r in ortpilot_log if r.levelno >= logging.WARNING]
    assert sess.to_dict()["fallbacks"][0]["layer"] == layer


@needs_webgpu
def test_installed_plugin_without_device_is_layer2(mlp):
    sess = ortpilot.load(mlp, ["webgpu", "cpu"], policy="allow")
    (event,) = sess.fallbacks
    assert event.layer == 2 and "no device" in event.reason
    with pytest.raises(ProviderFallbackError, match="WebGpuExecutionProvider"):
        ortpilot.load(mlp, ["webgpu"], policy="strict")


def test_full_coverage_strict_turns_on_ort_cpu_fallback_ban(mlp):
    # Azure takes no node; with min_coverage=1.0 and no CPU in the chain ORT itself refuses.
    with pytest.raises(ProviderFallbackError) as info:
        ortpilot.load(mlp, ["azure"], policy="strict", min_coverage=1.0)
    assert info.value.layer == 4
    assert "fallback" in info.value.reason.lower()


def test_low_min_coverage_accepts_partial_placement(mlp):
    sess = ortpilot.load(mlp, ["azure", "cpu"], policy="strict", min_coverage=0.0)
    assert sess.fallbacks == []
    assert sess.placement.share("AzureExecutionProvider") == 0.0


def test_unknown_policy_and_coverage_are_usage_errors(mlp):
    with pytest.raises(ortpilot.UsageError, match="policy"):
        ortpilot.load(mlp, ["cpu"], policy="loose")
    with pytest.raises(ortpilot.UsageError, match="min_coverage"):
        ortpilot.load(mlp, ["cpu"], min_coverage=1.5)


def test_unknown_provider_lists_valid_names(mlp):
    with pytest.raises(ortpilot.ProviderError) as info:
        ortpilot.load(mlp, ["cdua"])
    assert "cuda" in str(info.value) and "openvino" in str(info.value)
    assert info.value.exit_code == 2
