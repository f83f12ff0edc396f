"""``ortpilot inspect`` through click: exit codes and JSON."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from ortpilot.cli.main import cli
from ortpilot.modelio import DEFAULT_OPSET, SAFE_IR_VERSION


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


def _lstm_model(path, before: str):
    """x [4, 1, 8] -> ``before`` (Relu: counted, 32 FLOPs; Identity: moves data, 0) -> an LSTM of 16 units, an op
    the FLOPs tables have no count for, which holds nearly all of the compute."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 64, 8)).astype(np.float32), "w")
    r = numpy_helper.from_array(rng.standard_normal((1, 64, 16)).astype(np.float32), "r")
    graph = helper.make_graph(
        [
            helper.make_node(before, ["x"], ["h"], name="before"),
            helper.make_node("LSTM", ["h", "w", "r"], ["y"], hidden_size=16, name="lstm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 1, 16])],
        [w, r],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)])
    model.ir_version = SAFE_IR_VERSION
    onnx.save(model, str(path))
    return path


def test_inspect_says_a_flops_total_that_leaves_compute_out_is_a_lower_bound(tmp_path):
    """Uncounted nodes can hold all the compute: the total is 'at least' and names them, never a bare figure."""
    path = _lstm_model(tmp_path / "lstm.onnx", "Relu")
    doc = json.loads(_invoke("inspect", str(path), "--json", "--no-check").stdout)["flops"]
    assert doc["total"] == 32 and doc["counted_nodes"] == 1
    assert doc["complete"] is False and doc["uncounted"] == {"LSTM": 1}
    result = _invoke("inspect", str(path), "--no-check")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "at least 32 at x=4x1x8; 1 of 2 nodes (LSTM) not counted" in text
    assert "their compute is not in this figure" in text
    assert "FLOPs (estimate) │ 32 " not in text
    assert "LSTM │ 1 │ not counted" in text


def test_inspect_says_unknown_when_only_data_movement_was_counted(tmp_path):
    path = _lstm_model(tmp_path / "lstm.onnx", "Identity")
    result = _invoke("inspect", str(path), "--no-check")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "unknown at x=4x1x8: 1 of 2 nodes (LSTM) not counted" in text
    assert "the rest move data and count 0" in text


def test_inspect_counts_a_fully_counted_model_as_before(demo_paths):
    doc = json.loads(_invoke("inspect", str(demo_paths["cnn"]), "--json", "--no-check").stdout)["flops"]
    assert doc["complete"] is True and doc["uncounted"] == {} and doc["total"] > 0
