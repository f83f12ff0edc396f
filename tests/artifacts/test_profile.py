"""profile.json: written atomically, loaded exactly, refused when the world changed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from ortpilot.artifacts.profile import OrtVersionWarning, profile_file, write_profile
from ortpilot.errors import ProviderFallbackError, StampMismatchError, UsageError
from ortpilot.graph.feeds import make_feeds
from ortpilot.providers.machine import machine_facts
from ortpilot.session import SessionSettings, load
from ortpilot.session.profile import load_profile


@pytest.fixture
def profile(tmp_path, demo_paths):
    model = tmp_path / "model.onnx"
    shutil.copy(demo_paths["mlp"], model)
    settings = SessionSettings(level="extended", intra_op_threads=1)
    return write_profile(
        tmp_path / "profile.json",
        model_file=model,
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings=settings.to_dict(),
        machine=machine_facts(),
    )


def test_load_profile_recreates_the_session(profile):
    sess = load_profile(profile)
    assert sess.providers == ["CPUExecutionProvider"]
    assert sess.settings.level == "extended" and sess.settings.intra_op_threads == 1
    feeds = make_feeds(sess.model, seed=3)
    plain = load(str(profile.parent / "model.onnx"), settings=SessionSettings(level="extended", intra_op_threads=1))
    np.testing.assert_array_equal(sess.run(None, feeds)[0], plain.run(None, feeds)[0])
    doc = json.loads(profile.read_text())
    assert doc["onnxruntime"]["version"] == ort.__version__ and doc["machine"]["cores"]


def test_a_tune_output_folder_names_its_profile_json(profile, tmp_path):
    """The folder 'ortpilot tune -o DIR' wrote is taken as its profile.json everywhere (load_profile, verify, serve,
    export); a folder without one is exit 2 saying what it lacks."""
    sess = load_profile(profile.parent)
    assert sess.providers == ["CPUExecutionProvider"] and sess.settings.intra_op_threads == 1
    assert profile_file(profile.parent) == profile and profile_file(profile) == profile
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="is a folder without profile.json") as err:
        load_profile(empty)
    assert err.value.exit_code == 2


def test_changed_model_is_refused_with_exit_1(profile):
    with open(profile.parent / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(StampMismatchError, match="changed since it was tuned") as err:
        load_profile(profile)
    assert err.value.exit_code == 1


def test_invalid_json_is_refused_with_exit_2(profile):
    profile.write_text(profile.read_text()[:-20])
    with pytest.raises(UsageError, match="not valid JSON") as err:
        load_profile(profile)
    assert err.value.exit_code == 2


def test_missing_provider_is_an_error_and_other_minor_version_a_warning(profile):
    doc = json.loads(profile.read_text())
    doc["onnxruntime"]["version"] = "1.0.0"
    profile.write_text(json.dumps(doc))
    with pytest.warns(OrtVersionWarning):
        load_profile(profile)
    doc["providers"] = [{"name": "TensorrtExecutionProvider", "options": {}}]
    profile.write_text(json.dumps(doc))
    with pytest.raises(ProviderFallbackError, match="lacks") as err:
        load_profile(profile)
    assert err.value.exit_code == 1


def test_gate_and_calibration_data_are_checked_and_optional(profile):
    from ortpilot.artifacts.profile_schema import check_profile

    doc = json.loads(profile.read_text())
    check_profile(doc, "old")  # written without them: still loads
    load_profile(profile)
    record = {"source": "text", "samples": 5, "total": 20, "path": "s.txt", "sha256": "ab" * 32}
    check_profile({**doc, "gate_data": record, "calibration_data": {**record, "samples": 15}}, "new")
    check_profile({**doc, "gate_data": {"source": "synthetic", "samples": 4, "path": None, "sha256": None}}, "new")
    for bad, field in (
        ({**record, "source": "web"}, "gate_data.source"),
        ({**record, "samples": -1}, "gate_data.samples"),
        ({**record, "sha256": "nope"}, "gate_data.sha256"),
        ({**record, "rows": 3}, "gate_data.rows"),
    ):
        with pytest.raises(UsageError, match=f"invalid field '{field}'"):
            check_profile({**doc, "gate_data": bad}, "bad")
