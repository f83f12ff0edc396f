"""The output gate (``gate.outputs``): a check per output with evidence-chosen metrics, its limit, and the masks
of the held-out samples (through the quantize probe and the tune worker's saved outputs)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from metric_models import padded_samples, save, token_model

from ortpilot.errors import UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import OutputGate, SampleProbe, SavedOutputs
from ortpilot.measure.metrics import MetricChoice, MetricOverrides
from ortpilot.tuning.worker import save_samples


@pytest.fixture(scope="module")
def token_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    return {
        kind: save(token_model(kind, scale=3.0 if kind == "padding" else 0.5), folder / f"{kind or 'ref'}.onnx")
        for kind in (None, "padding", "real")
    }


def test_the_gate_reads_the_held_out_masks_and_ignores_padding(token_models):
    samples = padded_samples()
    probe = SampleProbe(samples)
    masked = ModelGate.of(OutputGate.for_model(token_model(), 0.01, inputs=samples), probe, str(token_models[None]))
    unmasked = ModelGate.of(OutputGate.for_model(token_model(), 0.01, metrics="cosine"), probe, str(token_models[None]))
    padding = masked.measure(str(token_models["padding"]))
    assert padding.passed and padding.checks[0].metric == "masked_cosine" and padding.error < 1e-6
    assert not unmasked.measure(str(token_models["padding"])).passed  # the same change, padding included: fails
    real = masked.measure(str(token_models["real"]))
    assert not real.passed and real.error > 0.01


def test_the_tune_workers_saved_outputs_are_judged_under_the_same_masks(token_models, tmp_path):
    """The tune path: outputs come from the worker's npz, the masks from the held-out samples tune gave it."""
    from ortpilot.measure.compare import run_samples
    from ortpilot.session import load

    samples = padded_samples()
    files = {}
    for kind, path in token_models.items():
        files[kind] = tmp_path / f"{kind}.npz"
        save_samples(files[kind], run_samples(load(str(path), policy="strict", placement=False), samples))
    gate = OutputGate.for_model(token_model(), 0.01)
    with pytest.raises(UsageError, match="needs each sample's attention mask"):  # no held-out inputs: no masks
        ModelGate.of(gate, SavedOutputs(), files[None]).measure(files["padding"])
    tuned = ModelGate.of(replace(gate, inputs=samples), SavedOutputs(), files[None])
    assert tuned.measure(files["padding"]).passed and not tuned.measure(files["real"]).passed


def test_output_gate_checks_every_output_and_refuses_a_bad_limit():
    ref = {"emb": [np.ones((1, 4, 8), np.float32)], "logits": [np.eye(3, dtype=np.float32)]}
    same = OutputGate(0.01).check(ref, ref)
    assert same.passed and [c.metric for c in same.checks] == ["cosine", "top1"] and same.error < 1e-12
    broken = OutputGate(0.01).check(ref, {"emb": [np.ones((1, 4, 7), np.float32)]})
    assert not broken.passed and {c.note for c in broken.checks} == {"shape changed", "output missing"}
    assert OutputGate(None).check(ref, {"emb": [-ref["emb"][0]], "logits": ref["logits"]}).passed  # measured only
    forced = OutputGate(0.01, {"logits": MetricChoice("rel_l2", "set by --metric")}).check(ref, ref)
    assert forced.check("logits").metric == "rel_l2"
    with pytest.raises(UsageError, match="max-error must be >= 0"):
        OutputGate(-1.0)
    with pytest.raises(UsageError, match="Unknown --metric 'l1'"):
        MetricOverrides.parse("l1")
