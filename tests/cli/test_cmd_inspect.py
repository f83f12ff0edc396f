"""``ortpilot inspect`` through click: exit codes and JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ortpilot.cli.main import cli


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_inspect_json_is_one_valid_document(demo_paths):
    result = _invoke("inspect", str(demo_paths["encoder"]), "--json", "--shape", "sequence=32")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["flops"]["shapes"]["input_ids"] == [1, 32]
    assert doc["op_histogram"]["MatMul"] >= 1
    cpu = next(o for o in doc["unsupported_ops"] if o["provider"] == "CPUExecutionProvider")
    assert cpu["checked"] and cpu["unsupported"] == []


def test_inspect_human_output_shows_symbolic_dims():
    result = _invoke("inspect", "demo:cnn", "--no-check")
    assert result.exit_code == 0
    assert "[batch, 3, 32, 32]" in result.stdout and "FLOPs" in result.stdout


@pytest.mark.parametrize("content", [None, b"", b"this is not a model\n", "truncated"])
def test_inspect_bad_files_exit_2_without_traceback(tmp_path, demo_paths, content):
    path = tmp_path / "bad.onnx"
    if content == "truncated":
        data = demo_paths["cnn"].read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif content is not None:
        path.write_bytes(content)
    result = _invoke("inspect", str(path))
    assert result.exit_code == 2
    assert "error:" in result.stderr and "Traceback" not in result.output


def test_inspect_contradicting_shape_exits_2(demo_paths):
    result = _invoke("inspect", str(demo_paths["cnn"]), "--shape", "image=1x3x64")
    assert result.exit_code == 2 and "rank" in result.stderr


@pytest.mark.realmodels
def test_inspect_does_not_list_constant_nodes_as_ops_the_cpu_will_not_run(silero_vad_path):
    """silero-vad keeps its weights in Constant nodes (inside If branches): ORT folds them at load."""
    result = _invoke("inspect", str(silero_vad_path), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    cpu = next(o for o in doc["unsupported_ops"] if o["provider"] == "CPUExecutionProvider")
    assert cpu["checked"] and cpu["unsupported"] == []
    assert doc["op_histogram"]["Constant"] >= 1 and doc["subgraph_node_count"] > 300  # the If branches' Constants
