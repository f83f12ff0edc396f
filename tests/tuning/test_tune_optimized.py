"""tune keeps the ORT-optimized winner (stamped) so that serving replicas skip graph optimization."""

from __future__ import annotations

import json
import logging

from ortpilot.artifacts.stamp import read_stamp
from ortpilot.modelio import load_model
from ortpilot.tuning import tune
from ortpilot.tuning.verify import verify_profile


def test_tune_keeps_a_stamped_optimized_model_that_verifies_bit_for_bit_with_optimizations_off(
    tmp_path, demo_paths, caplog
):
    out = tmp_path / "out"
    tune(str(demo_paths["cnn"]), out, budget_s=12, quantize=False)
    doc = json.loads((out / "profile.json").read_text())
    entry = doc["optimized_model"]
    assert entry["file"] == "model.optimized.onnx" and entry["level"] == doc["session_settings"]["level"]
    stamp = read_stamp(load_model(out / entry["file"]))
    assert stamp["pass"] == "optimize" and stamp["level"] == entry["level"]
    result = verify_profile(out, optimized=True)
    assert result.passed and result.mode == "bit-exact"
    assert result.session.settings.level == "disable" and str(result.session.model_path).endswith(entry["file"])
    plain = verify_profile(out)
    assert plain.passed and plain.session.settings.level == entry["level"]
    (out / entry["file"]).write_bytes((out / entry["file"]).read_bytes() + b"\0")
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        fallback = verify_profile(out, optimized=True)
    assert fallback.passed and fallback.session.settings.level == entry["level"]
    assert "changed since it was tuned" in caplog.text
