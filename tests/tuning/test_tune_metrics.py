"""``ortpilot tune``'s gate metrics (chosen on evidence, printed with it, overridden per output), its warning
for a gate on few samples, its candidate table's ratios (interleaved or labelled as search-phase estimates),
and ``verify`` holding a profile to the (masked) metric it recorded."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from metric_models import SENTENCES, padded_samples, save, sentence_folder, three_outputs, token_model

from ortpilot.artifacts.profile import write_profile
from ortpilot.cli.main import cli
from ortpilot.providers.cpuisa import KERNEL_FLAGS
from ortpilot.providers.machine import machine_facts
from ortpilot.session import load
from ortpilot.tuning.report import table_rows
from ortpilot.tuning.verify import verify_profile


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One short tune of a model with a float vector, a Softmax output and an int64 passthrough."""
    folder = tmp_path_factory.mktemp("tune")
    model = save(three_outputs(), folder / "three.onnx")
    out = folder / "out"
    res = CliRunner().invoke(
        cli,
        ["tune", str(model), "-o", str(out), "--budget", "15", "--no-quantize", "--metric", "p=rel_l2", "--json"],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), " ".join(res.stderr.split()), out


def test_tune_prints_each_metric_with_its_evidence(tuned):
    doc, said, out = tuned
    assert doc["metrics"] == {"embedding": "cosine", "p": "rel_l2", "ids_out": "exact"}
    assert doc["metric_evidence"] == {
        "embedding": "float vector [batch, 384], no class evidence",
        "p": "set by --metric",
        "ids_out": "int64 output: compared exactly",
    }
    assert (
        "Accuracy gate per output: embedding: cosine (float vector [batch, 384], no class evidence); "
        "p: rel_l2 (set by --metric); ids_out: exact (int64 output: compared exactly)" in said
    )
    assert "p: rel_l2 (set by --metric)" in (out / "report.md").read_text()
    profile = json.loads((out / "profile.json").read_text())
    assert {o["name"]: o["metric"] for o in profile["accuracy"]["outputs"]} == doc["metrics"]


def test_a_tune_gated_on_4_samples_says_so(tuned):
    doc, said, out = tuned
    assert doc["gate_samples"] == 4 and "fewer than 16" in doc["gate_warning"]
    # one message says it all once, as the tune starts: generated inputs, too few, and what to pass
    assert "NO GATE DATA: the accuracy gate is decided on 4 synthetic inputs" in said
    assert said.count("synthetic input") == said.count("fewer than 16") == said.count("--calibration-text") == 1
    assert "fewer than 16" in (out / "report.md").read_text()


def test_every_ratio_says_whether_it_is_interleaved_or_a_search_estimate(tuned):
    doc, said, out = tuned
    rows = [*doc["candidates"], doc["winner"]]
    assert all(c["vs_default"]["timing"] in ("interleaved", "search") for c in rows)
    interleaved = [c for c in doc["candidates"] if c["timing"] == "interleaved"]
    assert doc["baseline"]["timing"] == "interleaved" and 2 <= len(interleaved) <= 3  # finalists + the default
    if doc["winner"]["vs_default"]["timing"] == "interleaved" and not doc["default_best"]:
        # the table's figure for the winner is the headline's: both come from the interleaved measurement
        assert doc["winner"]["vs_default"]["ratio"] == pytest.approx(doc["speedup"]["ratio"])
        assert "interleaved final measurement" in said
    searched = [c for c in doc["candidates"] if c["status"] == "ok" and c["vs_default"]["timing"] == "search"]
    report = (out / "report.md").read_text()
    for c in searched:  # like with like: the default's own search-phase timings, and labelled so
        expected = doc["baseline"]["screen_latency"]["p50_ms"] / c["screen_latency"]["p50_ms"]
        assert c["vs_default"]["ratio"] == pytest.approx(expected)
        assert f"~{expected:.2f}x est." in report
    assert "search-phase estimate" in said and "search-phase estimate" in report
    shown = table_rows(doc)  # the terminal table always holds the two rows the headline compares
    assert {doc["winner"]["id"], doc["baseline"]["id"]} <= {c["id"] for c in shown} and len(shown) <= 6


@pytest.mark.parametrize(
    ("flag", "message"),
    [("logits=top1", "Its outputs: embedding, p, ids_out"), ("p=l2", "Valid metrics: cosine, top1, rel_l2, exact")],
)
def test_tune_refuses_a_bad_metric_with_exit_2_before_any_work(tmp_path, flag, message):
    model = save(three_outputs(), tmp_path / "three.onnx")
    res = CliRunner().invoke(cli, ["tune", str(model), "-o", str(tmp_path / "out"), "--metric", flag])
    assert res.exit_code == 2 and message in " ".join(res.output.split()) and "Traceback" not in res.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _other_kernels() -> dict:
    """This machine with one more fp32 kernel flag: outputs are then checked by tolerance, not bit for bit.

    A flag this CPU lacks is turned on (on an AVX2-only CPU, AVX-512F): turning AVX2 off there would
    leave a record with no flag at all, which reads as an old profile that recorded none."""
    machine = json.loads(json.dumps(machine_facts()))
    flags = machine["isa_flags"]
    flag = next((k for k in KERNEL_FLAGS if not flags.get(k)), KERNEL_FLAGS[0])
    flags[flag] = not flags.get(flag, False)
    return machine


@pytest.mark.parametrize(
    ("recorded_from", "metric", "passes"),
    [("padding", "masked_cosine", True), ("padding", "cosine", False), ("real", "masked_cosine", False)],
)
def test_verify_holds_outputs_to_the_recorded_metric_under_the_mask(tmp_path, recorded_from, metric, passes):
    model = save(token_model(), tmp_path / "model.onnx")
    feeds = padded_samples(1)[0]
    scale = 3.0 if recorded_from == "padding" else 0.5
    recorded = load(token_model(recorded_from, scale=scale)).run(None, feeds)[0]
    np.savez(
        tmp_path / "reference.npz",
        **{f"inputs/{k}": v for k, v in feeds.items()},
        **{"outputs/last_hidden_state": recorded},
    )
    profile = write_profile(
        tmp_path / "profile.json",
        model_file=model,
        machine=_other_kernels(),
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={"intra_op_threads": 1, "inter_op_threads": 1},
        passes=[],
        accuracy={"max_error": 0.01, "outputs": [{"name": "last_hidden_state", "metric": metric, "error": 0.0}]},
        extra={"candidate": {"passes": []}, "reference_outputs": {"file": "reference.npz"}},
    )
    result = verify_profile(profile)
    assert result.mode == "tolerance" and result.outputs[0].metric == metric
    assert result.passed is passes, result.outputs[0].detail


@pytest.fixture(scope="module")
def st_text(tmp_path_factory):
    """A sentence-transformers folder around ``token_model`` and sentences of 2 to 10 words (padded: masks of 0)."""
    root = tmp_path_factory.mktemp("st")
    text = root / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return sentence_folder(root / "st"), text, save(token_model("padding", scale=3.0), root / "noisy.onnx")


def test_tune_on_real_sentences_gates_the_pooled_embedding_under_their_masks(st_text, tmp_path):
    """The worker path: the saved outputs are judged with the held-out sentences' masks (without them a
    pooled metric cannot be computed and the tune would fail)."""
    folder, text, _ = st_text
    res = CliRunner().invoke(
        cli,
        ["tune", str(folder), "--calibration-text", str(text), "-o", str(tmp_path / "o")]
        + ["--budget", "15", "--no-quantize", "--json"],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["metrics"] == {"last_hidden_state": "pooled_cosine"}
    assert doc["metric_evidence"]["last_hidden_state"].startswith("1_Pooling/config.json: mean pooling")
    assert doc["gate_samples"] == doc["gate_data"]["samples"] == 6 and "fewer than 16" in doc["gate_warning"]
    said = " ".join(res.stderr.split())
    assert said.count("fewer than 16") == 1 and "synthetic" not in said and "Gated on 6 real samples" in said
    assert all(c["accuracy"]["passed"] for c in doc["candidates"] if c["status"] == "ok")


def test_compare_on_padded_sentences_leaves_padding_out(st_text):
    folder, text, noisy = st_text
    args = ["compare", str(folder), str(noisy), "--calibration-text", str(text), "--all-samples", "--json"]
    pooled = json.loads(CliRunner().invoke(cli, args).stdout)["outputs"][0]
    plain = json.loads(CliRunner().invoke(cli, [*args, "--metric", "cosine"]).stdout)["outputs"][0]
    assert pooled["metric"] == "pooled_cosine" and pooled["error"] < 1e-6  # the noise is only at padding
    assert plain["metric"] == "cosine" and plain["error"] > 0.01  # counted at padding, it would fail a gate
