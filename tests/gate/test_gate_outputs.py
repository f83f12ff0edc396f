"""The output gate (``gate.outputs``): a check per output with evidence-chosen metrics, its limit, and the masks
of the held-out samples (through the quantize probe and the tune worker's saved outputs)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from metric_models import (
    byte_classifier,
    byte_samples,
    ctc_recognizer,
    padded_samples,
    save,
    text_images,
    token_model,
)

from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import OutputGate, SampleProbe, SavedOutputs, samples_needed
from ortpilot.gate.quantize import quantize_int8_gated
from ortpilot.gate.result import MIN_SEQUENCE_SAMPLES, GateResult
from ortpilot.measure.metrics import MetricChoice, MetricOverrides, choose_metrics
from ortpilot.passes.calibration import CalibrationSet
from ortpilot.passes.quantize import QuantizePass
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


def test_a_decomposed_softmax_classifier_is_gated_on_top1_agreement_of_real_runs(tmp_path):
    """The byte classifier (softmax from Exp / ReduceSum / Div) and its dynamic INT8 on real sessions: the gate
    holds the file-type probabilities to top-1 agreement, not to cosine."""
    source = save(byte_classifier(), tmp_path / "classifier.onnx")
    quantized = tmp_path / "classifier-int8.onnx"
    onnx.save(QuantizePass("dynamic").run(onnx.load(source)).model, quantized)
    samples = byte_samples(64)
    gate = ModelGate.of(OutputGate.for_model(onnx.load(source), 0.05), SampleProbe(samples), str(source))
    (check,) = gate.measure(str(quantized)).checks
    assert check.name == "file_type" and check.metric == "top1"
    assert gate.measure(str(source)).checks[0].value == 0.0  # the model against itself: every argmax agrees


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


# --------------------------------------------------------------------------- a CTC text recognizer


@pytest.fixture(scope="module")
def recognizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("ctc") / "rec.onnx"
    onnx.save(ctc_recognizer(), path)
    return path


def test_the_gate_reads_a_recognizers_real_output_and_decodes_it(recognizer):
    """Declared ``[1, seqlen]`` (cosine by the graph alone), returned ``[20, 1, 40]``: the gate says so and
    chooses ctc from the values; the float model against itself passes with every sequence identical."""
    model = onnx.load(recognizer)
    assert choose_metrics(model)["387"].metric == "cosine"  # what the declared shape alone says
    gate = ModelGate.of(OutputGate.for_model(model, 0.01), SampleProbe(text_images(8)), str(recognizer))
    choice = gate.gate.choices_for(gate.reference)["387"]
    assert choice.metric == "ctc" and choice.step_axis == 0
    assert "declared [1, seqlen] but returns [20, 1, 40]" in choice.evidence and "CTC blank" in choice.evidence
    same = gate.measure(str(recognizer))
    assert same.passed and same.checks[0].figures["sequence_exact_match"] == 1.0
    # --metric wins over what the outputs say
    forced = OutputGate.for_model(model, 0.01, metrics="cosine").choices_for(gate.reference)["387"]
    assert forced == MetricChoice("cosine", "set by --metric")


def test_int8_that_changes_decoded_text_is_rejected_where_cosine_passed_it(recognizer):
    """The issue's case: dynamic INT8 of the recognizer keeps cosine near 1 and most per-step top classes,
    and changes decoded strings; the quantize gate refuses it on ctc, and would have passed it on cosine."""
    data = CalibrationSet(text_images(256), "generated text images")  # a quarter (64) held out
    with pytest.raises(AccuracyGateError) as failed:
        quantize_int8_gated(str(recognizer), None, "dynamic", calibration=data, max_error=0.01)
    said = str(failed.value)
    assert "on output '387'" in said and "decoded sequences identical" in said and "over 64 held-out" in said
    on_cosine = quantize_int8_gated(str(recognizer), None, "dynamic", calibration=data, max_error=0.01, metric="cosine")
    assert on_cosine.gate.passed and on_cosine.gate.error < 0.01
    # the same INT8 model, gated on the decoded sequences: the exact-match rate is what fails it
    heldout = data.split(0.25)[1]
    quantized = recognizer.parent / "rec-int8.onnx"
    onnx.save(QuantizePass("dynamic").run(onnx.load(recognizer)).model, quantized)
    result = ModelGate.of(OutputGate.for_model(onnx.load(recognizer), 0.01), SampleProbe(heldout), str(recognizer))
    checked = result.measure(str(quantized))
    (check,) = checked.checks
    assert check.metric == "ctc" and not check.passed
    assert 1.0 - check.figures["sequence_exact_match"] == check.value > 0.01  # the decoded sequences decide
    # what verify does with the metric a profile recorded: kept as it is, its step axis read off the arrays
    recorded = OutputGate(0.01, {"387": MetricChoice("ctc", "recorded by the tune")}).check(
        result.reference, SampleProbe(heldout).run(str(quantized))
    )
    assert recorded.choices["387"].evidence == "recorded by the tune" and recorded.checks[0].figures == check.figures
    assert (
        check.figures["sequences"] == 64
        and checked.warning == ""
        and GateResult.from_dict(checked.to_dict()).checks[0].figures == dict(check.figures)
    )


def test_a_ctc_gate_on_too_few_samples_to_see_one_string_in_20_says_so(recognizer):
    """59 samples are needed to see a 1-in-20 change of decoded sequences (0.95**59 < 5 %); 16 are
    enough for the other metrics, so the same 20 samples warn on the recognizer only."""
    few = ModelGate.of(OutputGate.for_model(onnx.load(recognizer), 0.01), SampleProbe(text_images(20)), str(recognizer))
    result = few.measure(str(recognizer))
    assert result.passed and result.min_samples == MIN_SEQUENCE_SAMPLES == 59
    assert "fewer than 59 to see a model that changes 1 decoded sequence in 20" in result.warning
    assert result.warning in result.summary
    assert samples_needed(result.choices) == (59, result.min_samples_why)  # what tune's data warning can take
    plain = OutputGate(0.01).check({"y": [np.ones((1, 8), np.float32)] * 20}, {"y": [np.ones((1, 8), np.float32)] * 20})
    assert plain.warning == "" and plain.min_samples == 16


def test_a_tune_of_a_recognizer_records_the_ctc_gates_sample_minimum(recognizer, tmp_path):
    """Tune chooses each output's metric once the reference has run: its gate warning must then ask for the
    59 samples a ctc verdict needs, not the 16 it said at the start (64 samples given, 16 held out)."""
    from ortpilot import tune

    data = CalibrationSet(text_images(64), "generated text images")  # 16 held out
    result = tune(str(recognizer), out_dir=str(tmp_path / "out"), budget_s=12, calibration=data)
    assert result.metrics == {"387": "ctc"}
    assert "fewer than 59" in result.gate.warning, result.gate.warning
