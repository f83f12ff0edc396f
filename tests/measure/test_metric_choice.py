"""``measure.metrics``: each output's metric chosen on evidence, the user's overrides, and the masked measures
(on real sessions of models built in code); what ``ortpilot compare`` prints of it is in
tests/cli/test_cmd_compare.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from metric_models import (
    byte_classifier,
    classifier,
    classifier_folder,
    padded_samples,
    sentence_folder,
    three_outputs,
    token_model,
)

from ortpilot.data.folder import resolve_model_folder
from ortpilot.errors import UsageError
from ortpilot.measure.compare import compare_runs, run_samples
from ortpilot.measure.metrics import (
    MetricChoice,
    choose_from_outputs,
    choose_metrics,
    ctc_decode,
    folder_near,
    metric_error,
    sequence_figures,
)
from ortpilot.models import make_encoder
from ortpilot.session import load


def test_a_pooled_embedding_is_cosine_a_softmax_is_top1_an_int_passthrough_exact():
    choices = choose_metrics(three_outputs())
    assert choices["embedding"] == MetricChoice("cosine", "float vector [batch, 384], no class evidence")
    assert choices["p"] == MetricChoice("top1", "produced by Softmax through Identity")
    assert choices["ids_out"] == MetricChoice("exact", "int64 output: compared exactly")


def test_a_classifier_whose_softmax_is_built_from_separate_ops_is_gated_on_top1():
    """A byte classifier's probabilities [batch, 12] from Exp / ReduceSum / Div were gated by cosine (a float
    vector, no class evidence): the pattern is class evidence, as a Softmax node is."""
    (choice,) = choose_metrics(byte_classifier()).values()
    assert choice == MetricChoice(
        "top1", "produced by a Softmax built from ReduceMax, Sub, Exp, ReduceSum, Div over the last axis"
    )
    (plain,) = choose_metrics(byte_classifier(stable=False)).values()
    assert plain.metric == "top1" and "built from Exp, ReduceSum, Div" in plain.evidence
    (other_axis,) = choose_metrics(byte_classifier(axis=0)).values()
    assert other_axis.metric == "cosine"


def test_token_outputs_of_a_model_with_a_mask_are_compared_under_it():
    (choice,) = choose_metrics(make_encoder()).values()
    assert choice.metric == "masked_cosine" and choice.mask == "attention_mask"
    assert "under attention_mask" in choice.evidence


def test_the_folder_says_sentence_embedding_or_classifier(tmp_path):
    folder = resolve_model_folder(sentence_folder(tmp_path / "st"))
    (choice,) = choose_metrics(token_model(), folder).values()
    assert choice.metric == "pooled_cosine" and choice.evidence.startswith("1_Pooling/config.json: mean pooling")
    assert folder_near(tmp_path / "st" / "model.onnx").task == "sentence-embedding"  # a model file finds its folder

    classes = resolve_model_folder(classifier_folder(tmp_path / "cls"))
    assert choose_metrics(classifier(), classes)["y"] == MetricChoice(
        "top1", "config.json: BertForSequenceClassification"
    )
    assert choose_metrics(classifier())["y"].metric == "rel_l2"  # the same model without its folder: no evidence
    other = resolve_model_folder(classifier_folder(tmp_path / "five", labels=5, classes=3))
    assert choose_metrics(classifier(), other)["y"].metric != "top1"  # 5 labels, 3 scores: not this output


def test_overrides_set_one_output_or_all_and_bad_ones_name_the_valid_choices():
    model = three_outputs()
    choices = choose_metrics(model, overrides=["rel_l2", "p=cosine"])
    assert choices["p"] == MetricChoice("cosine", "set by --metric")
    assert choices["embedding"].metric == choices["ids_out"].metric == "rel_l2"
    with pytest.raises(UsageError, match=r"does not have\. Its outputs: embedding, p, ids_out"):
        choose_metrics(model, overrides=["logits=top1"])
    with pytest.raises(UsageError, match=r"Unknown --metric 'l1'\. Valid metrics: cosine, top1, rel_l2, exact"):
        choose_metrics(model, overrides=["p=l1"])
    with pytest.raises(UsageError, match="no mask input"):
        choose_metrics(model, overrides=["embedding=masked_cosine"])


def _runs(model, samples):
    return run_samples(load(model, policy="strict", placement=False), samples)


@pytest.mark.parametrize(("metric", "base"), [("masked_cosine", "cosine"), ("pooled_cosine", "cosine")])
def test_masked_metrics_leave_padding_out_and_still_see_real_positions(metric, base):
    samples = padded_samples()
    ref = [r["last_hidden_state"] for r in _runs(token_model(), samples)]
    at_padding = [r["last_hidden_state"] for r in _runs(token_model("padding", scale=3.0), samples)]
    at_real = [r["last_hidden_state"] for r in _runs(token_model("real", scale=0.5), samples)]
    masks = [s["attention_mask"] for s in samples]
    assert metric_error(base, ref, at_padding) > 0.05  # unmasked, the padding noise fails any 0.01 gate
    assert metric_error(metric, ref, at_padding, masks) < 1e-6  # under the mask it is not there
    assert metric_error(metric, ref, at_real, masks) > 0.01  # a change at real tokens still fails
    with pytest.raises(UsageError, match="needs each sample's attention mask"):
        metric_error(metric, ref, at_padding)


def test_exact_counts_changed_elements():
    a = np.arange(8).reshape(2, 4)
    b = a.copy()
    b[1, 3] = 0
    assert metric_error("exact", [a], [a.copy()]) == 0 and metric_error("exact", [a], [b]) == pytest.approx(1 / 8)


def test_compare_runs_carries_choice_and_masks():
    samples = padded_samples()
    ref, got = _runs(token_model(), samples), _runs(token_model("padding", scale=3.0), samples)
    plain = compare_runs(ref, got).outputs[0]
    choice = choose_metrics(token_model())["last_hidden_state"]
    masked = compare_runs(ref, got, choices={"last_hidden_state": choice}, samples=samples).outputs[0]
    assert plain.metric == "cosine" and plain.error > 0.05  # chosen from the arrays alone: no mask known
    assert masked.metric == "masked_cosine" and masked.error < 1e-6 and masked.metric_evidence == choice.evidence


# --------------------------------------------------------------------------- from what the outputs really are


def test_pp_ocr_recognizer_is_gated_on_its_decoded_text_from_its_real_outputs(ocr_rec_path):
    """PP-OCRv6's recognizer (rapidocr): a Softmax over 18,710 classes, returned ``[1, steps, 18710]`` with
    steps = width / 8; the graph alone says top1, its outputs say CTC (class 0, the blank, tops most steps)."""
    from ortpilot.gate.outputs import OutputGate, SampleProbe

    path = str(ocr_rec_path)
    model = onnx.load(path)
    (name,) = (o.name for o in model.graph.output)
    assert choose_metrics(model)[name].metric == "top1"
    rng = np.random.default_rng(0)
    samples = [{"x": rng.random((1, 3, 48, w), dtype=np.float32)} for w in (160, 320, 160)]
    reference = SampleProbe(samples).run(str(path))
    assert [a.shape for a in reference[name]] == [(1, 20, 18710), (1, 40, 18710), (1, 20, 18710)]
    choice = OutputGate.for_model(model, 0.01).choices_for(reference)[name]
    assert choice.metric == "ctc" and choice.step_axis == 1
    assert "18710 classes at 20-40 steps (axis 1), rows are probabilities" in choice.evidence
    assert "CTC blank" in choice.evidence and "declared" not in choice.evidence  # its declared dims allow these


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def test_the_values_decide_between_ctc_per_step_top1_and_vectors():
    rng = np.random.default_rng(0)
    blanky = rng.standard_normal((4, 1, 12, 16))
    blanky[..., 0] += 4.0  # class 0 tops most steps: a CTC blank
    probs = [_softmax(a) for a in blanky]
    assert choose_from_outputs("y", probs).metric == "ctc"
    logp = [np.log(p) for p in probs]
    ctc = choose_from_outputs("y", logp)
    assert ctc.metric == "ctc" and ctc.step_axis == 1 and "log-probabilities" in ctc.evidence
    tagger = [_softmax(a) for a in rng.standard_normal((4, 1, 12, 16))]  # no class tops a third of the steps
    assert choose_from_outputs("y", tagger).metric == "top1"
    hidden = list(rng.standard_normal((4, 1, 12, 16)).astype(np.float32))  # hidden states: not scores
    assert choose_from_outputs("y", hidden).metric == "cosine"
    rows = [_softmax(a) for a in blanky[:, 0, :, :]]  # [12, 16]: rank 2, a batch of rows, not steps
    assert choose_from_outputs("y", rows).metric != "ctc"
    masked = MetricChoice("masked_cosine", "token vectors", "attention_mask")
    assert choose_from_outputs("y", probs, choice=masked) is masked  # a mask-aware choice stays


def test_ctc_decoding_collapses_repeats_and_drops_the_blank():
    ids = [0, 3, 3, 0, 3, 5, 5, 0, 0]
    scores = np.eye(6, dtype=np.float32)[ids][:, None, :]  # [steps, 1, classes]
    assert ctc_decode(scores, 0) == [(3, 3, 5)]
    assert ctc_decode(scores) == [(3, 3, 5)]  # no axis given: the longest non-class axis
    changed = scores.copy()
    changed[4] = np.eye(6, dtype=np.float32)[4]
    figures = sequence_figures([scores], [changed], 0)
    assert figures["sequence_exact_match"] == 0.0 and figures["step_top1_agreement"] == pytest.approx(8 / 9)
    assert metric_error("ctc", [scores], [changed]) == 1.0 and metric_error("ctc", [scores], [scores]) == 0.0
