"""`quantize --mode int4|int8-weights` and `compare` on decoder pairs, through the CLI."""

from __future__ import annotations

import importlib.util
import json

import onnx
import pytest
from click.testing import CliRunner

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
