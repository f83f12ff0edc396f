"""Equivalence: the session Triton's ORT backend would build from the exported config.pbtxt, fed
the exported warmup files, gives the profile's reference outputs bit for bit.

No Triton server runs here (no container runtime); ``triton_session`` builds the session the way
the backend's source does, from the parsed config alone.
"""

from __future__ import annotations

import json

import pytest
from export_profiles import write_cpu_profile

import ortpilot
from ortpilot.export import export_triton
from ortpilot.export.triton_session import backend_session, read_config, warmup_samples
from ortpilot.modelio import file_sha256
from ortpilot.tuning.reference import array_digest as _digest


def _backend_outputs(model_dir):
    session, run_options = backend_session(model_dir)
    feeds = warmup_samples(model_dir)[0]
    names = [o.name for o in session.get_outputs()]
    return {n: _digest(o) for n, o in zip(names, session.run(None, feeds, run_options))}


@pytest.fixture(scope="module")
def tuned_encoder(tmp_path_factory):
    """A real ``ortpilot tune`` of the demo encoder: whichever candidate wins is exported."""
    out = tmp_path_factory.mktemp("tuned")
    ortpilot.tune("demo:encoder", out_dir=str(out), budget_s=10)
    return out / "profile.json"


def test_tuned_demo_encoder_exports_to_a_config_that_reproduces_the_reference(tuned_encoder, tmp_path):
    profile = json.loads(tuned_encoder.read_text())
    result = export_triton(tuned_encoder, tmp_path / "repo", name="encoder")
    assert result.warmup["source"] == "reference"
    assert file_sha256(result.model_dir / "1" / "model.onnx") == profile["model"]["sha256"]
    assert _backend_outputs(result.model_dir) == profile["reference_outputs"]["sha256"]


@pytest.mark.realmodels
@pytest.mark.parametrize(
    "fixture, shapes, max_batch",
    [
        ("nudenet_path", {"images": [1, 3, 320, 320]}, 4),  # [batch, 3, height, width]: batch folded
        # first dim 'DynamicDimension.0': not named batch, but a 2-row run shows its rows independent
        ("ocr_det_path", {"x": [1, 3, 64, 64]}, 4),
    ],
)
def test_real_model_export_reproduces_the_reference(fixture, shapes, max_batch, request, tmp_path):
    model = request.getfixturevalue(fixture)
    profile_path = write_cpu_profile(tmp_path / "profile", model, shapes=shapes)
    profile = json.loads(profile_path.read_text())
    result = export_triton(profile_path, tmp_path / "repo", name="real")
    config = read_config(result.model_dir)
    assert config.max_batch_size == max_batch
    first = list(config.input[0].dims)
    assert first == ([3, -1, -1] if max_batch else [-1, 3, -1, -1])
    assert _backend_outputs(result.model_dir) == profile["reference_outputs"]["sha256"]


def test_the_comparison_sees_a_changed_warmup_file_and_a_changed_config(encoder_profile, tmp_path):
    """The check can fail: other warmup data gives other outputs, and an edited config another session."""
    import numpy as np

    from ortpilot.export.triton_session import backend_settings

    profile = json.loads(encoder_profile.read_text())
    result = export_triton(encoder_profile, tmp_path / "repo", name="encoder")
    assert _backend_outputs(result.model_dir) == profile["reference_outputs"]["sha256"]
    ids = result.model_dir / "warmup" / "input_ids"
    tokens = np.fromfile(ids, dtype=np.int64)
    np.roll(tokens, 1).tofile(ids)
    assert _backend_outputs(result.model_dir) != profile["reference_outputs"]["sha256"]
    config_path = result.model_dir / "config.pbtxt"
    one_thread = 'key: "intra_op_thread_count"\n  value {\n    string_value: "1"'
    assert one_thread in config_path.read_text()
    config_path.write_text(config_path.read_text().replace(one_thread, one_thread[:-2] + '2"'))
    assert backend_settings(read_config(result.model_dir)).intra_op_threads == 2
