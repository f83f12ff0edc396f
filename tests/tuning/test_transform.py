"""The model cache as the budget reads it: which leading steps of a pipeline an earlier build left there."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ortpilot.modelio import file_sha256
from ortpilot.tuning.space import DYN_PC, QDQ_PC
from ortpilot.tuning.transform import PREPARE, build_model, cached_prefix
from ortpilot.tuning.worker import load_samples, save_samples


def _calibration(n: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        {
            "input_ids": rng.integers(1, 100, size=(1, 16), dtype=np.int64),
            "attention_mask": np.ones((1, 16), np.int64),
            "token_type_ids": np.zeros((1, 16), np.int64),
        }
        for _ in range(n)
    ]


def test_a_pipeline_the_worker_built_reads_as_cached_from_the_samples_it_was_calibrated_on(
    tmp_path, monkeypatch, demo_paths
):
    """The worker builds from the calibration samples it reads back from its scratch file; the tune's own process
    reads the cache with the samples it wrote there: both must give the same keys."""
    monkeypatch.setenv("ORTPILOT_CACHE_DIR", str(tmp_path / "cache"))
    model = Path(demo_paths["encoder"])
    sha = file_sha256(model)
    calibration = _calibration()
    assert cached_prefix(sha, [QDQ_PC], calibration) == () and cached_prefix(sha, [], calibration) == ()
    save_samples(tmp_path / "calibration.npz", calibration)
    _, _, hit = build_model(model, [QDQ_PC], load_samples(tmp_path / "calibration.npz"))
    assert not hit
    assert cached_prefix(sha, [QDQ_PC], calibration) == (QDQ_PC,)
    assert cached_prefix(sha, [DYN_PC], calibration) == (PREPARE,)  # its preparation is there, its quantization not
    assert cached_prefix(sha, [QDQ_PC], _calibration(5)) == (PREPARE,)  # other samples: only the preparation held
    assert cached_prefix("0" * 64, [QDQ_PC], calibration) == ()  # another source model
