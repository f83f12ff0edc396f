"""Text and images as calibration and gate data on quantize, tune and compare, with their provenance."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from folders import SENTENCES, image_folder, sentence_folder, write_images

from ortpilot.artifacts.profile import read_profile
from ortpilot.cli.main import cli
from ortpilot.data import real_data, resolve_model_folder
from ortpilot.gate.result import SAMPLES_TO_SEE_RARE, rare_break_clause
from ortpilot.modelio import load_model
from ortpilot.passes.calibration import CalibrationSet, load_calibration, spread

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


@pytest.fixture
def st_folder(tmp_path, demo_paths):
    return sentence_folder(tmp_path / "st", demo_paths["encoder"])


@pytest.fixture
def sentences(tmp_path):
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return text


@pytest.fixture
def cnn_folder(tmp_path, demo_paths):
    return image_folder(tmp_path / "cnn", demo_paths["cnn"])


def _invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _tune(*args) -> subprocess.CompletedProcess:
    """A tiny tune without INT8 variants, in its own process (the worker children are real)."""
    return subprocess.run([*CLI, "tune", *map(str, args), "--no-quantize"], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 20, 101, 400, 1300])
def test_split_is_disjoint_deterministic_and_spread(n):
    samples = [{"x": np.full((1, 2), i, np.float32)} for i in range(n)]
    data = CalibrationSet(samples, "test")
    calib, held = data.split()
    ids = lambda part: [int(s["x"][0, 0]) for s in part]  # noqa: E731
    assert not set(ids(calib)) & set(ids(held)) and held and calib
    assert len(held) == min(max(1, round(n * 0.25)), n - 1, 299)
    assert len(calib) == min(n - len(held), 256) and data.counts == (len(calib), len(held))
    assert ids(held) == sorted(ids(held)) and ids(CalibrationSet(samples, "test").split()[1]) == ids(held)
    if n >= 20:  # spread over the set, not its tail: a file sorted by topic gates on every part
        assert ids(held)[0] < n // 4 and ids(held)[-1] >= 3 * n // 4
    assert spread(10, 20) == list(range(10)) and len(set(spread(1000, 37))) == 37


def test_the_held_out_cap_lets_a_user_follow_the_reports_advice():
    """The report tells a user with few held-out samples to give 4 x SAMPLES_TO_SEE_RARE samples: the split
    must then hold out SAMPLES_TO_SEE_RARE of them, or the advice cannot be followed."""
    n = 4 * SAMPLES_TO_SEE_RARE
    data = CalibrationSet([{"x": np.full((1, 2), i, np.float32)} for i in range(n)], "test")
    held = data.split()[1]
    assert len(held) == SAMPLES_TO_SEE_RARE and f"give {n:,} or more" in rare_break_clause(64)
    assert rare_break_clause(len(held)) == ""


def test_text_split_holds_out_the_lines_it_says(st_folder, sentences):
    folder = resolve_model_folder(st_folder)
    data = load_calibration(real_data(text=sentences, folder=folder), load_model(folder.model_file))
    calib, held = data.split()
    tok = folder.tokenizer_file
    from tokenizers import Tokenizer

    ids = [Tokenizer.from_file(str(tok)).encode(SENTENCES[i]).ids for i in spread(len(SENTENCES), 5)]
    assert [h["input_ids"][0, : len(i)].tolist() for h, i in zip(held, ids)] == ids
    held_ids = {h["input_ids"].tobytes() for h in held}
    assert not any(c["input_ids"].tobytes() in held_ids for c in calib)
    gate = data.gate_data()
    assert gate == {**data.calibration_data(), "samples": 5} and gate["total"] == 20
    assert gate["source"] == "text" and gate["path"] == str(sentences) and len(gate["sha256"]) == 64


def test_tune_folder_calibration_text_gates_on_held_out_sentences(st_folder, sentences, tmp_path):
    out = tmp_path / "tuned"
    res = _tune(st_folder, "--calibration-text", sentences, "-o", out, "--budget", "10", "--json")
    assert res.returncode == 0, res.stderr
    assert "Gated on 5 real samples (text, sentences.txt)" in " ".join(res.stderr.split())
    assert "synthetic" not in res.stderr
    doc = json.loads(res.stdout)
    assert doc["gate_data"]["source"] == "text" and doc["gate_data"]["samples"] == 5
    assert doc["calibration_data"]["samples"] == 15 and doc["gate_data"]["total"] == 20
    lengths = sorted(len(s.split()) + 2 for s in SENTENCES)  # each sentence at its own length: + [CLS] [SEP]
    workload = doc["workload"]
    assert workload["dims"][0]["name"] == "sequence" and workload["requests"] == len(SENTENCES)
    assert (workload["dims"][0]["min"], workload["dims"][0]["max"]) == (lengths[0], lengths[-1])
    assert doc["shapes"]["input_ids"] == [1, lengths[len(lengths) // 2]]  # the median request
    assert (out / "workload.npz").is_file() and read_profile(out / "profile.json")["workload"]["replay"] == 8
    profile = read_profile(out / "profile.json")
    assert profile["gate_data"] == doc["gate_data"] and profile["calibration_data"] == doc["calibration_data"]
    assert "heldout_seed" not in profile["reference_outputs"]  # the reference sample is a real sentence
    assert "Gate data: 5 of 20 text samples" in (out / "report.md").read_text()
    assert (
        "worst of 5 held-out samples: a sample that breaks 1 time in 100 is among them 5%"
        in (out / "report.md").read_text()
    )
    assert "Gate data: 5 of 20 text samples" in (out / "report.html").read_text()
    check = subprocess.run([*CLI, "verify", str(out / "profile.json")], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr
    sentences.write_text("\n".join(reversed(SENTENCES)) + "\n", encoding="utf-8")  # other data: no resume
    again = _tune(st_folder, "--calibration-text", sentences, "-o", out, "--budget", "10", "--resume")
    assert again.returncode == 2 and "data_sha256" in again.stderr


def test_tune_without_data_warns_it_gated_on_synthetic_inputs(tmp_path):
    res = _tune("demo:encoder", "-o", tmp_path / "t", "--budget", "15", "--no-quantize", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["gate_data"] == {"source": "synthetic", "samples": 4, "path": None, "sha256": doc["gate_data"]["sha256"]}
    flat = " ".join(res.stderr.split())
    assert "NO GATE DATA: the accuracy gate is decided on 4 synthetic inputs" in flat
    assert flat.count("synthetic input") == 1  # said once: not again beside the headline


def test_quantize_qdq_calibrates_a_cnn_from_images(cnn_folder, tmp_path):
    pics = write_images(tmp_path / "pics", n=8)
    out = tmp_path / "cnn.qdq.onnx"
    res = _invoke("quantize", cnn_folder, "--mode", "qdq", "--calibration-images", pics, "-o", out, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["record"]["quantized_nodes"] > 0 and out.is_file() and doc["gate"]["passed"]
    assert doc["synthetic_calibration"] is False
    assert doc["calibration_data"]["source"] == "images" and doc["calibration_data"]["samples"] == 6
    assert doc["gate_data"]["samples"] == 2 and doc["gate"]["samples"] == 2 and doc["gate_data"]["total"] == 8
    human = _invoke("quantize", cnn_folder, "--mode", "qdq", "--calibration-images", pics, "-o", out)
    flat = " ".join(human.output.split())
    assert human.exit_code == 0 and "gated on 2 real samples (images, pics)" in flat
    assert "6 of 8 samples calibrate, 2 held out for the gate" in flat


def test_quantize_a_bare_cnn_from_images_by_arguments(demo_paths, tmp_path):
    pics = write_images(tmp_path / "pics", n=5)
    args = ["quantize", demo_paths["cnn"], "--mode", "static", "--calibration-images", pics, "-o", tmp_path / "q.onnx"]
    res = _invoke(*args, "--image-size", "32", "--mean", "0.5,0.5,0.5", "--std", "0.25", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["calibration_data"]["samples"] == 4
    res = _invoke(*args, "--image-size", "32", "--layout", "NHWC")
    assert res.exit_code == 2 and "NHWC" in res.output


def test_compare_runs_the_held_out_sentences_or_all(st_folder, sentences, demo_paths, tmp_path):
    out = tmp_path / "q.onnx"
    assert _invoke("quantize", st_folder, "--mode", "dynamic", "-o", out, "--max-error", "1").exit_code == 0
    res = _invoke("compare", st_folder, out, "--calibration-text", sentences, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["samples"] == 5 and doc["gate_data"]["samples"] == 5 and doc["gate_data"]["source"] == "text"
    res = _invoke("compare", st_folder, out, "--calibration-text", sentences, "--all-samples", "--json")
    assert json.loads(res.stdout)["samples"] == 20
    human = _invoke("compare", st_folder, out, "--calibration-text", sentences)
    assert "compared on 5 of 20 text samples" in " ".join(human.output.split())
    generated = json.loads(_invoke("compare", demo_paths["encoder"], out, "--json").stdout)
    assert generated["gate_data"]["source"] == "synthetic" and generated["gate_data"]["samples"] == 4


def test_tokenizer_option_reads_text_for_a_bare_model(demo_paths, st_folder, sentences, tmp_path):
    args = ["quantize", demo_paths["encoder"], "--mode", "qdq", "--calibration-text", sentences, "-o", tmp_path / "q"]
    res = _invoke(*args, "--tokenizer", st_folder / "tokenizer.json", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gate_data"]["samples"] == 5
    res = _invoke(*args)
    assert res.exit_code == 2 and "needs a tokenizer" in res.output and "sentences.txt" in res.output


def _error(res) -> str:
    return " ".join(res.output.split())


def test_bad_real_data_exits_2_naming_the_file(st_folder, cnn_folder, sentences, tmp_path):
    quantize = ["quantize", "--mode", "qdq", "-o", tmp_path / "q.onnx"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    res = _invoke(*quantize, st_folder, "--calibration-text", empty)
    assert res.exit_code == 2 and "empty.txt" in _error(res) and "holds no text" in _error(res)
    one = tmp_path / "one.txt"
    one.write_text("the cat sat\n")
    res = _invoke(*quantize, st_folder, "--calibration-text", one)
    assert res.exit_code == 2 and "one.txt" in _error(res) and "two at least" in _error(res)
    pics = write_images(tmp_path / "pics", n=3)
    (pics / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    res = _invoke(*quantize, cnn_folder, "--calibration-images", pics)
    assert res.exit_code == 2 and "broken.png" in _error(res) and "cannot be decoded" in _error(res)
    (st_folder / "tokenizer.json").unlink()
    res = _invoke("tune", st_folder, "--calibration-text", sentences, "-o", tmp_path / "t")
    assert res.exit_code == 2 and "has no tokenizer.json" in _error(res) and str(st_folder) in _error(res)
    assert not (tmp_path / "t").exists()
    bad = sentence_folder(tmp_path / "bad", st_folder / "model.onnx", num_attention_heads=5)
    res = _invoke("compare", bad, bad / "model.onnx", "--calibration-text", sentences)
    assert res.exit_code == 2 and "config.json" in _error(res) and "does not divide" in _error(res)
    assert "Traceback" not in res.output


def test_text_past_the_position_limit_is_truncated_and_said(tmp_path, demo_paths, sentences):
    short = sentence_folder(tmp_path / "short", demo_paths["encoder"], max_position_embeddings=6)
    res = _invoke("compare", short, short / "model.onnx", "--calibration-text", sentences, "--json")
    assert res.exit_code == 0, res.output
    assert "were longer than 6 tokens and were truncated" in _error(res)
    assert json.loads(res.stdout)["samples"] == 5
    res = _invoke("compare", short, short / "model.onnx", "--calibration-text", sentences, "--shape", "sequence=9")
    assert res.exit_code == 2 and "position limit is 6" in _error(res)


def test_real_data_options_need_their_data(st_folder, sentences, tmp_path, demo_paths):
    res = _invoke("quantize", st_folder, "--mode", "qdq", "--tokenizer", st_folder / "tokenizer.json", "-o", "x.onnx")
    assert res.exit_code == 2 and "--tokenizer" in res.output
    res = _invoke("quantize", st_folder, "--mode", "int4", "--calibration-text", sentences, "-o", tmp_path / "x.onnx")
    assert res.exit_code == 2 and "int4/int8-weights" in res.output
    npz = tmp_path / "c.npz"
    np.savez(npz, input_ids=np.ones((2, 1, 4), np.int64))
    res = _invoke("tune", st_folder, "--calibration", npz, "--calibration-text", sentences, "-o", tmp_path / "t")
    assert res.exit_code == 2 and "not both" in res.output


def test_inspect_folder_json_lists_the_model_file_and_every_value_with_its_source(st_folder):
    res = _invoke("inspect", st_folder, "--no-check", "--json")
    assert res.exit_code == 0, res.output
    folder = json.loads(res.stdout)["folder"]
    assert folder["model_file"] == str(st_folder / "model.onnx") and folder["layout"] == "optimum"
    assert folder["values"]["num_heads"] == {"value": 4, "source": "config.json"}
    assert folder["values"]["pooling"] == {"value": "mean_tokens", "source": "1_Pooling/config.json"}
    assert folder["tokenizer"] == str(st_folder / "tokenizer.json")
    human = _invoke("inspect", st_folder, "--no-check")
    assert "optimum layout" in human.output and "1_Pooling/config.json" in human.output
    assert "folder" not in json.loads(_invoke("inspect", st_folder / "model.onnx", "--no-check", "--json").stdout)
