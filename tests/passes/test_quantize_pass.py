"""Quantization with the accuracy gate: the issue's done-when, bad input, and real models."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from ortpilot.api import quantize_gated
from ortpilot.artifacts.atomic import save_model
from ortpilot.cli.main import cli
from ortpilot.errors import AccuracyGateError, InputError, UsageError
from ortpilot.passes.base import SourceModel
from ortpilot.passes.calibration import (
    SyntheticCalibrationWarning,
    load_calibration,
    synthetic,
    write_samples,
)
from ortpilot.passes.quantize import (
    NothingQuantizedError,
    QuantizePass,
    constants_to_initializers,
)

# Tests marked isa assert an answer that depends on the CPU's INT8 kernel (a gate passing, an error
# bound): .ci/run also runs those on an emulated AVX2 CPU. The others check what the quantizer writes
# or refuses (node and op counts, notes, messages, files, a gate no kernel can pass), the same on every
# kernel, so they run in the main run only: under the emulator the encoder's and Magika's ones cost minutes.


@pytest.fixture(scope="module")
def encoder_calibration(demo_paths, tmp_path_factory):
    model = onnx.load(demo_paths["encoder"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = synthetic(model, None, 8).samples
    return write_samples([{k: v[:, :32] for k, v in s.items()} for s in samples], tmp_path_factory.mktemp("calib"))


@pytest.mark.isa
def test_quantize_qdq_cli_writes_a_gated_model_and_compare_prints_metrics(demo_paths, encoder_calibration, tmp_path):
    out = tmp_path / "enc.qdq.onnx"
    res = CliRunner().invoke(
        cli,
        [
            "quantize",
            str(demo_paths["encoder"]),
            "-o",
            str(out),
            "--mode",
            "qdq",
            "--calibration",
            str(encoder_calibration),
            "--max-error",
            "0.05",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["record"]["quantized_nodes"] > 0 and doc["gate"]["passed"]
    assert doc["record"]["op_diff"]["QuantizeLinear"] > 0 and out.is_file()
    res = CliRunner().invoke(
        cli, ["compare", str(demo_paths["encoder"]), str(out), "--calibration", str(encoder_calibration)]
    )
    assert res.exit_code == 0, res.output
    for label in ("abs error max", "p99", "cosine similarity", "SNR dB", "min atol", "min rtol", "NaN/Inf"):
        assert label in res.output


def test_impossible_max_error_exits_1_names_worst_layers_writes_nothing(demo_paths, encoder_calibration, tmp_path):
    out = tmp_path / "never.onnx"
    res = CliRunner().invoke(
        cli,
        [
            "quantize",
            str(demo_paths["encoder"]),
            "-o",
            str(out),
            "--mode",
            "qdq",
            "--calibration",
            str(encoder_calibration),
            "--max-error",
            "1e-9",
        ],
    )
    assert res.exit_code == 1, res.output
    assert "Accuracy gate failed" in res.output and "Worst layers" in res.output and "SQNR" in res.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.isa
def test_auto_exclude_reaches_a_tighter_gate(demo_paths, encoder_calibration):
    plain = quantize_gated(demo_paths["encoder"], None, "full", calibration=str(encoder_calibration), max_error=1.0)
    target = plain.gate.error * 0.8
    report = quantize_gated(
        demo_paths["encoder"],
        None,
        "full",
        calibration=str(encoder_calibration),
        max_error=target,
        auto_exclude=True,
        max_rounds=8,
        per_round=3,
    )
    assert report.gate.passed and report.gate.error <= target
    assert len(report.history) >= 2 and report.history[-1]["excluded"]
    assert report.record.quantized_nodes > 0


def test_dynamic_per_channel_reduce_range_and_static_qoperator(demo_paths, encoder_calibration):
    dyn = QuantizePass("dynamic", per_channel=True, reduce_range=True).run(demo_paths["encoder"])
    assert dyn.record.op_diff.get("DynamicQuantizeLinear", 0) > 0 and dyn.record.quantized_nodes > 0
    samples = load_calibration(str(encoder_calibration), onnx.load(demo_paths["encoder"])).samples
    static = QuantizePass("static", calibration=samples[:4]).run(demo_paths["encoder"])
    assert any(op.startswith("QLinear") for op in static.record.op_diff)
    full = QuantizePass("full", calibration=samples[:4]).run(demo_paths["encoder"])
    qdq = QuantizePass("qdq", calibration=samples[:4]).run(demo_paths["encoder"])
    assert full.record.quantized_nodes > qdq.record.quantized_nodes > 0


def test_model_without_quantizable_ops_says_so(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    path = save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "relu.onnx")
    out = tmp_path / "out" / "relu.q.onnx"
    res = CliRunner().invoke(cli, ["quantize", str(path), "-o", str(out), "--mode", "dynamic"])
    assert res.exit_code == 2 and "changed nothing" in res.output and not out.exists()
    with pytest.raises(NothingQuantizedError):
        QuantizePass("dynamic").run(path)


def test_calibration_with_wrong_names_or_shapes_exits_2(demo_paths, tmp_path):
    bad_names = tmp_path / "names"
    bad_names.mkdir()
    np.savez(bad_names / "s0.npz", image=np.zeros((1, 3, 32, 32), np.float32))
    res = CliRunner().invoke(
        cli,
        [
            "quantize",
            str(demo_paths["mlp"]),
            "-o",
            str(tmp_path / "o.onnx"),
            "--mode",
            "qdq",
            "--calibration",
            str(bad_names),
        ],
    )
    assert res.exit_code == 2 and "'image'" in res.output and "'x'" in res.output
    bad_shape = tmp_path / "shape.npz"
    np.savez(bad_shape, x=np.zeros((4, 1, 63), np.float32))  # 4 stacked samples of [1, 63], model wants [batch, 64]
    with pytest.raises(InputError, match="x"):
        load_calibration(str(bad_shape), onnx.load(demo_paths["mlp"]))
    assert not (tmp_path / "o.onnx").exists()


def test_calibration_formats_and_split(demo_paths, tmp_path):
    model = onnx.load(demo_paths["mlp"])
    stacked = tmp_path / "stack.npz"
    np.savez(stacked, x=np.random.default_rng(0).standard_normal((8, 1, 64)).astype(np.float32))
    data = load_calibration(str(stacked), model)
    assert len(data) == 8 and not data.synthetic
    calib, held = data.split(0.25)
    assert (len(calib), len(held)) == (6, 2)
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((1, 64), np.float32))
    np.save(folder / "b.npy", np.ones((1, 64), np.float32))
    assert len(load_calibration(str(folder), model)) == 2
    with pytest.warns(SyntheticCalibrationWarning, match="NO CALIBRATION DATA"):
        assert load_calibration(None, model).synthetic
    reader_data = load_calibration(_Reader(), model)
    assert len(reader_data) == 3


class _Reader:
    def __init__(self):
        self.items = iter([{"x": np.zeros((1, 64), np.float32)} for _ in range(3)])

    def get_next(self):
        return next(self.items, None)


def test_gate_refuses_before_writing(demo_paths, tmp_path):
    with pytest.raises(AccuracyGateError, match="dynamic INT8"):  # dynamic: layers ranked by passes.sensitivity
        quantize_gated(demo_paths["encoder"], tmp_path / "enc.q.onnx", "dynamic", max_error=1e-12)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.isa
def test_class_scores_are_gated_on_top1(demo_paths):
    report = quantize_gated(demo_paths["cnn"], None, "full", max_error=0.5)
    assert report.gate.metric == "top1" and report.record.quantized_nodes > 0


def test_constant_weights_become_initializers():
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.ones(16, np.float32).tolist())
    nodes = [helper.make_node("Constant", [], ["W"], value=w), helper.make_node("MatMul", ["x", "W"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert constants_to_initializers(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul"] and model.graph.initializer[0].name == "W"


@pytest.mark.realmodels
def test_silero_vad_quantizes_dynamic_after_constant_fix(silero_vad_path):
    result = QuantizePass("dynamic").run(silero_vad_path)
    assert result.record.quantized_nodes > 0
    assert any("Constant node(s) turned into initializers" in n for n in result.record.notes)
    assert result.record.size_after < result.record.size_before / 2


def test_quantize_leaves_no_files_in_the_working_directory(demo_paths, encoder_calibration, tmp_path, monkeypatch):
    """ORT's pre-processor dumps sym_shape_infer_temp.onnx and UUID .data files into the cwd on failure."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    samples = load_calibration(str(encoder_calibration), onnx.load(demo_paths["encoder"])).samples
    QuantizePass("qdq", calibration=samples[:2]).run(demo_paths["encoder"])
    assert list(cwd.iterdir()) == []


def _dense_head(bias_rows: int) -> onnx.ModelProto:
    """x @ W + B, as exporters write a dense layer (Magika's head): ORT's quant_pre_process fuses it
    into a Gemm whose bias keeps B's 2-D shape [bias_rows, 4]."""
    rng = np.random.default_rng(0)
    batch = "batch" if bias_rows == 1 else bias_rows
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "B"], ["y"], name="add"),
        ],
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [
            onnx.numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
            onnx.numpy_helper.from_array(rng.standard_normal((bias_rows, 4)).astype(np.float32), "B"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _head_samples(rows: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((rows, 8)).astype(np.float32)} for _ in range(8)]


def _run(model: onnx.ModelProto, feeds) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_flattening_a_gemm_bias_changes_no_result():
    from ortpilot.passes.quantize import flatten_gemm_biases, prepare

    model, _ = prepare(_dense_head(1))
    [gemm] = [n for n in model.graph.node if n.op_type == "Gemm"]  # ORT's MatMulAddFusion
    assert [list(i.dims) for i in model.graph.initializer if i.name == gemm.input[2]] == [[1, 4]]
    flat = onnx.ModelProto()
    flat.CopyFrom(model)
    assert flatten_gemm_biases(flat) == 1
    assert [list(i.dims) for i in flat.graph.initializer if i.name == gemm.input[2]] == [[4]]
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)}
    assert np.array_equal(_run(flat, feeds), _run(model, feeds))
    assert flatten_gemm_biases(flat) == 0


@pytest.mark.isa
@pytest.mark.parametrize("mode", ["qdq", "static", "full"])
def test_per_channel_int8_of_a_dense_head_with_a_2d_bias_works(mode):
    """The Magika failure (issue 38): per-channel calibrated INT8 on a Gemm whose bias is [1, N] made
    ORT's quantizer raise 'The truth value of an array ... is ambiguous'; the bias is now [N]."""
    samples = _head_samples(1)
    result = QuantizePass(mode, calibration=samples, per_channel=True).run(_dense_head(1))
    assert result.record.quantized_nodes > 0
    assert any("Gemm biases of shape [1, N] reshaped to [N]" in n for n in result.record.notes)
    float_out, int8_out = _run(_dense_head(1), samples[0]), _run(result.model, samples[0])
    # Without VNNI ORT's u8s8 pair sums saturate in vpmaddubsw (the ISA lane's emulated Haswell: 5.5 %
    # of the output's range); VNNI and AMX accumulate exactly (under 5 %).
    from ortpilot.providers.cpuisa import int8_rule

    share = 0.10 if int8_rule().name == "x86-no-vnni" else 0.05
    assert np.abs(int8_out - float_out).max() < share * np.abs(float_out).max()


@pytest.mark.parametrize("mode", ["qdq", "static"])
def test_a_quantizer_failure_inside_ort_is_named_not_a_bare_value_error(mode, tmp_path):
    """A bias of [2, N] (a fixed batch of 2) cannot be flattened, and ORT's per-channel quantizers still
    fail on it: the error names ORT's function, and the command exits 1 without a traceback."""
    from ortpilot.passes.quantize import QuantizerError

    with pytest.raises(QuantizerError) as caught:
        QuantizePass(mode, calibration=_head_samples(2), per_channel=True).run(_dense_head(2))
    said = str(caught.value)
    assert said.startswith("ORT's quantize_static raised ValueError in ")
    assert ("qdq_quantizer.py:_adjust_weight_scale_for_int32_bias" if mode == "qdq" else "onnx_quantizer.py:") in said
    assert "inside ONNX Runtime's quantizer" in said and "\n" not in said
    assert isinstance(caught.value.__cause__, ValueError)

    model = tmp_path / "head.onnx"
    save_model(_dense_head(2), model)
    result = CliRunner().invoke(
        cli, ["quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--mode", mode, "--per-channel"]
    )
    assert result.exit_code == 1 and "ORT's quantize_static raised ValueError" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "q.onnx").exists()


@pytest.mark.realmodels
def test_magika_quantizes_qdq_per_channel():
    """Google's Magika byte classifier (PyPI magika, its .onnx only): the model issue 38's tune failed on."""
    import importlib.util
    from pathlib import Path

    from ortpilot.graph.feeds import make_feeds, plan_feeds

    spec = importlib.util.find_spec("magika")
    path = Path(next(iter(spec.submodule_search_locations))) / "models/standard_v3_3/model.onnx" if spec else None
    if path is None or not path.is_file():
        pytest.skip("magika is not installed (pip install --no-deps magika)")
    model = onnx.load(str(path))
    samples = [make_feeds(model, plan=plan_feeds(model, {"bytes": (1, 2048)}), seed=s) for s in range(4)]
    result = QuantizePass("qdq", calibration=samples, per_channel=True).run(model)
    assert result.record.quantized_nodes > 0
    assert any("Gemm biases of shape [1, N] reshaped to [N]" in n for n in result.record.notes)
    assert _run(result.model, samples[0]).shape == (1, 214)


def test_per_channel_qdq_on_an_old_opset_with_a_fusions_ort_op_names_the_op_not_the_converters_assertion():
    """A fusion writes ORT ops (SimplifiedLayerNormalization) into the default domain; ONNX's version
    converter cannot upgrade such a graph to opset 13. The error names the op and what to do."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.ones(8, dtype=np.float32), "scale")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("SimplifiedLayerNormalization", ["h", "scale"], ["y"], axis=-1, epsilon=1e-5),
        ],
        "fused",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # ORT runs it
    calibration = [{"x": np.ones((1, 8), np.float32)}]
    quant = QuantizePass("qdq", per_channel=True, calibration=calibration, preprocess=False)
    with pytest.raises(UsageError) as err:
        quant.run(SourceModel.of(model))
    text = str(err.value)
    assert "no schema for SimplifiedLayerNormalization" in text and "quantize before fusing" in text
    assert "%s" not in text and "drop --per-channel" in text
