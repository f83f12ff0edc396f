"""Whether dim 0 is Triton's batch dim: named like batch, or dynamic everywhere with rows that a
real ORT run shows to be independent; and the warmup named by where its data comes from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from export_profiles import rows_model, with_real_reference, write_cpu_profile

from ortpilot.export import export_triton
from ortpilot.export.triton_batch import decide_batching
from ortpilot.export.triton_session import backend_session, read_config, warmup_samples
from ortpilot.graph.tensors import model_tensors
from ortpilot.modelio import load_model
from ortpilot.tuning.reference import array_digest


def _decide(model: Path, feeds):
    inputs, outputs = model_tensors(load_model(model))
    return decide_batching(model, inputs, outputs, feeds)


def _backend_outputs(model_dir: Path) -> dict[str, str]:
    session, run_options = backend_session(model_dir)
    names = [o.name for o in session.get_outputs()]
    return {n: array_digest(o) for n, o in zip(names, session.run(None, warmup_samples(model_dir)[0], run_options))}


@pytest.fixture
def magika_path() -> Path:
    spec = importlib.util.find_spec("magika")
    path = Path(next(iter(spec.submodule_search_locations))) / "models/standard_v3_3/model.onnx" if spec else None
    if path is None or not path.is_file():
        pytest.skip("magika is not installed (pip install --no-deps magika)")
    return path


def test_named_batch_dim_is_taken_without_running_the_model(demo_paths):
    decision = _decide(demo_paths["encoder"], None)
    assert decision.batchable and "named like batch" in decision.evidence and decision.batch_vs_single is None


def test_rows_that_interact_are_no_batch_dim(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    mean = _decide(rows_model(tmp_path / "mean.onnx"), {"x": x})
    assert not mean.batchable and "rows are not independent" in mean.evidence
    total = _decide(rows_model(tmp_path / "sum.onnx", reduce=True), {"x": x})
    assert not total.batchable and "does not follow it ([1, 3] for 1 row, [1, 3] for 2)" in total.evidence


def test_no_sample_inputs_means_no_batching_and_says_why(tmp_path):
    decision = _decide(rows_model(tmp_path / "mean.onnx"), None)
    assert not decision.batchable and "cannot check that its rows are independent" in decision.evidence


@pytest.mark.realmodels
def test_paddle_unnamed_batch_dim_is_batched_after_a_real_run(ocr_det_path, tmp_path):
    """PP-OCR's detector: dim 0 'DynamicDimension.0'; a conv net, so its rows are independent."""
    profile = write_cpu_profile(tmp_path / "det", ocr_det_path, shapes={"x": [1, 3, 64, 64]})
    result = export_triton(profile, tmp_path / "repo", name="det")
    assert result.max_batch_size == 4 and "rows are independent" in result.batching
    config = read_config(result.model_dir)
    assert list(config.input[0].dims) == [3, -1, -1] and config.HasField("dynamic_batching")
    assert _backend_outputs(result.model_dir) == json.loads(profile.read_text())["reference_outputs"]["sha256"]


@pytest.mark.realmodels
def test_magika_tf2onnx_batch_dim_is_batched_with_its_numerics_reported(magika_path, tmp_path):
    """Magika's byte classifier: bytes [unk__214, 2048] -> target_label [unk__215, 214]."""
    profile = write_cpu_profile(tmp_path / "magika", magika_path, shapes={"bytes": [1, 2048]})
    result = export_triton(profile, tmp_path / "repo", name="magika")
    config = read_config(result.model_dir)
    assert config.max_batch_size == 4 and list(config.input[0].dims) == [2048]
    assert list(config.output[0].dims) == [214]
    loss = next(loss for loss in result.losses if loss.setting == "max_batch_size")
    assert "differ from its outputs alone by up to" in loss.consequence  # batch-2 kernels are not batch-1's
    assert _backend_outputs(result.model_dir) == json.loads(profile.read_text())["reference_outputs"]["sha256"]


def test_real_data_reference_is_read_from_reference_npz_beside_the_profile(encoder_profile, tmp_path):
    """A profile tuned on real data has no seed to regenerate its sample: export reads reference.npz,
    as verify does, and the warmup reproduces the reference outputs."""
    import shutil

    folder = tmp_path / "real"
    shutil.copytree(encoder_profile.parent, folder)
    profile = with_real_reference(folder / encoder_profile.name)
    result = export_triton(profile, tmp_path / "repo", name="enc")
    assert result.warmup["source"] == "reference"
    assert "reference.npz; real data from /data/samples" in result.warmup["note"]
    assert read_config(result.model_dir).model_warmup[0].name == "reference"
    assert _backend_outputs(result.model_dir) == json.loads(profile.read_text())["reference_outputs"]["sha256"]

    (folder / "reference.npz").unlink()  # now the sample is gone: generated inputs, named so
    result = export_triton(profile, tmp_path / "repo2", name="enc")
    assert result.warmup["source"] == "generated"
    assert "reference.npz is missing beside" in result.warmup["note"]
    assert "not real data and not the profile's reference inputs" in result.warmup["note"]
    assert read_config(result.model_dir).model_warmup[0].name == "generated"


def test_a_reference_file_that_does_not_hold_the_recorded_inputs_is_not_used(encoder_profile, tmp_path):
    import shutil

    folder = tmp_path / "real"
    shutil.copytree(encoder_profile.parent, folder)
    profile = with_real_reference(folder / encoder_profile.name)
    with np.load(folder / "reference.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["inputs/input_ids"] = np.roll(arrays["inputs/input_ids"], 1)
    np.savez(folder / "reference.npz", **arrays)
    result = export_triton(profile, tmp_path / "repo", name="enc")
    assert result.warmup["source"] == "generated" and "inputs_sha256 differs" in result.warmup["note"]
