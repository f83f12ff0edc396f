"""Gate metrics under masks beyond one command's output: ``verify`` holding a profile to the (masked) metric it
recorded, and a tune and a compare on real padded sentences judged under their masks. What ``ortpilot tune``
prints of its metrics, its few-samples warning and its table's ratios are in tests/cli/test_cmd_tune.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from metric_models import SENTENCES, padded_samples, save, sentence_folder, token_model

from ortpilot.artifacts.profile import write_profile
from ortpilot.cli.main import cli
from ortpilot.providers.cpuisa import KERNEL_FLAGS
from ortpilot.providers.machine import machine_facts
from ortpilot.session import load
from ortpilot.tuning.verify import verify_profile


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
    padded = [*args, "--shape", "sequence=16"]  # every sentence padded to one length, as --shape asks
    pooled = json.loads(CliRunner().invoke(cli, padded).stdout)["outputs"][0]
    plain = json.loads(CliRunner().invoke(cli, [*padded, "--metric", "cosine"]).stdout)["outputs"][0]
    assert pooled["metric"] == "pooled_cosine" and pooled["error"] < 1e-6  # the noise is only at padding
    assert plain["metric"] == "cosine" and plain["error"] > 0.01  # counted at padding, it would fail a gate
    # without --shape each sentence runs at its own length: no padding, so no noise anywhere
    own = json.loads(CliRunner().invoke(cli, [*args, "--metric", "cosine"]).stdout)["outputs"][0]
    assert own["error"] < 1e-6
