"""``ModelGate`` (``gate.core``): the probe runs the reference model once, and every candidate is judged
against those outputs."""

from __future__ import annotations

import shutil

import numpy as np

from ortpilot.artifacts.atomic import save_model
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import OutputGate, SampleProbe
from ortpilot.models import make_mlp


def test_the_reference_runs_once_and_each_candidate_is_judged_against_its_outputs(demo_paths, tmp_path):
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32)} for i in range(4)]
    reference = shutil.copy(demo_paths["mlp"], tmp_path / "reference.onnx")
    gate = ModelGate.of(OutputGate(0.01), SampleProbe(samples), str(reference))
    assert list(gate.reference) == ["y"] and [a.shape for a in gate.reference["y"]] == [(1, 10)] * 4
    save_model(make_mlp(seed=1), reference)  # the file changes after: the outputs computed from it are kept
    assert gate.measure(str(demo_paths["mlp"])).passed
    other = gate.measure(str(reference))
    assert not other.passed and other.worst_output == "y"
