"""``ortpilot quantize``: ``--mode int4|int8-weights`` and ``compare`` on decoder pairs, and the output gate's
metrics it prints with their evidence, the few-samples warning, and exit 2 for a bad ``--metric``."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from metric_models import save, three_outputs

from ortpilot.cli.main import cli
from ortpilot.decode.signature import detect_signature


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_int4_writes_matmulnbits_and_compare_reports_the_generation_gate(tmp_path):
    out = tmp_path / "d4.onnx"
    res = _run(
        "quantize",
        "demo:decoder",
        "-o",
        str(out),
        "--mode",
        "int4",
        "--block-size",
        "16",
        "--min-top1",
        "0.5",
        "--json",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["weights"]["weight_only_nodes"] > 0 and doc["weights"]["compression"] > 3
    quantized = onnx.load(str(out))
    weights = {t.name for t in quantized.graph.initializer}
    assert any(n.op_type == "MatMulNBits" for n in quantized.graph.node)
    # only activation x activation MatMuls (attention scores) stay float
    assert not [n.name for n in quantized.graph.node if n.op_type == "MatMul" and n.input[1] in weights]

    cmp = _run("compare", "demo:decoder", str(out), "--min-top1", "0.5", "--json")
    assert cmp.exit_code == 0, cmp.output
    gate = json.loads(cmp.stdout)
    assert 0.5 <= gate["top1_agreement"] <= 1.0 and gate["kl_mean"] >= 0
    strict = _run("compare", "demo:decoder", str(out), "--min-top1", "1.0")
    assert strict.exit_code == 1 and "generation gate" in strict.output


def test_failing_weight_only_gate_writes_nothing(tmp_path):
    out = tmp_path / "d4.onnx"
    res = _run("quantize", "demo:decoder", "-o", str(out), "--mode", "int4", "--block-size", "16", "--min-top1", "1.0")
    assert res.exit_code == 1 and "Nothing was written" in res.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bad_block_size_is_exit_2(tmp_path):
    res = _run("quantize", "demo:decoder", "-o", str(tmp_path / "x.onnx"), "--mode", "int4", "--block-size", "48")
    assert res.exit_code == 2


def test_fuse_with_max_positions_writes_the_limit_into_the_model(tmp_path):
    if importlib.util.find_spec("onnxscript") is None:
        pytest.skip("onnxscript is not installed")
    out = tmp_path / "d4.onnx"
    res = _run(
        "quantize",
        "demo:decoder",
        "-o",
        str(out),
        "--mode",
        "int4",
        "--block-size",
        "16",
        "--fuse",
        "--max-positions",
        "64",
        "--min-top1",
        "0.5",
        "--json",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert any("rotary tables constant for 64 positions" in note for note in doc["fusion_notes"])
    model = onnx.load(str(out))
    assert detect_signature(model).max_positions == 64
    assert {n.op_type for n in model.graph.node} >= {"GroupQueryAttention", "MatMulNBits"}
    unfused = _run(
        "quantize", "demo:decoder", "-o", str(tmp_path / "x.onnx"), "--mode", "int4", "--max-positions", "64"
    )
    assert unfused.exit_code == 2 and "needs --mode int4|int8-weights with --fuse" in " ".join(unfused.output.split())
    assert not (tmp_path / "x.onnx").exists()


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    folder = tmp_path_factory.mktemp("three")
    rng = np.random.default_rng(0)
    calibration = folder / "calibration.npz"
    np.savez(  # 64 stacked samples: a quarter (16) are held out for the gate
        calibration,
        x=rng.standard_normal((64, 1, 64)).astype(np.float32),
        ids=rng.integers(0, 100, (64, 1, 8)).astype(np.int64),
    )
    return save(three_outputs(), folder / "three.onnx"), calibration


def test_quantize_prints_each_metric_with_its_evidence_and_the_sample_warning(three, tmp_path):
    model, _ = three
    res = CliRunner().invoke(
        cli, ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "dynamic", "--json"]
    )
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gate"]
    assert gate["metrics"] == {
        "embedding": {"metric": "cosine", "evidence": "float vector [batch, 384], no class evidence"},
        "p": {"metric": "top1", "evidence": "produced by Softmax through Identity"},
        "ids_out": {"metric": "exact", "evidence": "int64 output: compared exactly"},
    }
    assert gate["samples"] == 1 and "fewer than 16" in gate["warning"]
    by_name = {o["name"]: o for o in gate["comparison"]["outputs"]}
    assert by_name["ids_out"]["error"] == 0  # the passthrough is untouched by INT8
    res = CliRunner().invoke(
        cli, ["quantize", str(model), "-o", str(tmp_path / "q2.onnx"), "--mode", "dynamic", "--metric", "p=cosine"]
    )
    said = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "p: gate metric cosine (set by --metric)" in said and "embedding: gate metric cosine (float vector" in said


def test_quantize_on_16_held_out_samples_has_no_warning(three, tmp_path):
    model, calibration = three
    res = CliRunner().invoke(
        cli,
        ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "dynamic"]
        + ["--calibration", str(calibration), "--json"],
    )
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gate"]
    assert gate["samples"] == 16 and gate["warning"] is None


@pytest.mark.parametrize(
    ("flag", "message"),
    [("logits=top1", "Its outputs: embedding, p, ids_out"), ("cosin", "Valid metrics: cosine, top1, rel_l2, exact")],
)
def test_quantize_refuses_a_bad_metric_with_exit_2_before_writing(three, tmp_path, flag, message):
    model, _ = three
    out = tmp_path / "q.onnx"
    res = CliRunner().invoke(cli, ["quantize", str(model), "-o", str(out), "--mode", "dynamic", "--metric", flag])
    assert res.exit_code == 2 and message in " ".join(res.output.split()) and not out.exists()


def test_quantize_outputs_prunes_gates_and_writes_only_the_named_ones(three, tmp_path):
    model, calibration = three
    out = tmp_path / "q.onnx"
    res = CliRunner().invoke(
        cli,
        ["quantize", str(model), "-o", str(out), "--mode", "dynamic", "--calibration", str(calibration)]
        + ["--outputs", "embedding", "--json"],
    )
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gate"]
    assert list(gate["metrics"]) == ["embedding"]
    assert [o["name"] for o in gate["comparison"]["outputs"]] == ["embedding"]
    written = onnx.load(out)
    assert [o.name for o in written.graph.output] == ["embedding"]
    assert not {"Softmax", "Identity"} & {n.op_type for n in written.graph.node}  # p's and ids_out's nodes are gone
    assert [i.name for i in written.graph.input] == ["x", "ids"]  # the same requests as the full model


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["nope"], "'nope', which the model does not output; its outputs are: embedding, p, ids_out"),
        (["embedding", "x"], "'x', which the model does not output ('x' is an input)"),
    ],
)
def test_quantize_refuses_bad_outputs_with_exit_2_before_writing(three, tmp_path, names, message):
    model, _ = three
    args = ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", "dynamic"]
    res = CliRunner().invoke(cli, [*args, *[a for n in names for a in ("--outputs", n)]])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert "Traceback" not in res.output and not (tmp_path / "q.onnx").exists()


def test_weight_only_modes_refuse_outputs(tmp_path):
    from ortpilot.models import demo_model_path

    res = _run(
        "quantize",
        str(demo_model_path("decoder")),
        "-o",
        str(tmp_path / "q.onnx"),
        "--mode",
        "int4",
        "--outputs",
        "logits",
    )
    assert res.exit_code == 2, res.output
    assert "Drop --outputs" in " ".join(res.output.split())
