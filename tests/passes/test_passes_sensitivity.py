"""Dynamic-INT8 layer sensitivity from real activations, and ``quantize --auto-exclude`` built on it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortpilot.api import quantize_gated
from ortpilot.errors import AccuracyGateError
from ortpilot.graph.feeds import make_feeds
from ortpilot.measure.compare import metric_error
from ortpilot.modelio import load_model
from ortpilot.passes.base import SourceModel
from ortpilot.passes.calibration import load_calibration, write_samples
from ortpilot.passes.quantize import QuantizePass
from ortpilot.passes.sensitivity import nodes_to_exclude, rank_dynamic
from ortpilot.providers.cpuisa import int8_rule
from ortpilot.session import load

# Tests marked isa assert an answer that depends on the CPU's INT8 kernel (rankings, errors, a gate
# reached): .ci/run also runs those on an emulated AVX2 CPU. The two that are not (the arithmetic of
# nodes_to_exclude, and the wording of a gate no kernel can pass) run in the main run only.


def _outlier_mlp(tmp_path):
    """x -> mm1 -> (one channel x 40) -> mm2 -> mm3: mm2's input has an outlier channel, so a
    per-tensor uint8 activation scale crushes its other channels; mm1 and mm3 are benign, and all
    three weights are drawn alike (their weight statistics cannot tell them apart)."""
    rng = np.random.default_rng(0)
    scale = np.ones(64, np.float32)
    scale[3] = 40.0
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32) / 8, f"w{i}") for i in (1, 2, 3)]
    inits.append(numpy_helper.from_array(scale, "s"))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Mul", ["h1", "s"], ["h1s"], name="outlier"),
        helper.make_node("MatMul", ["h1s", "w2"], ["h2"], name="mm2"),
        helper.make_node("MatMul", ["h2", "w3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(
        nodes,
        "outlier_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64])],
        inits,
    )
    path = tmp_path / "outlier.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def _error(quantized, source, heldout):
    ref, test = load(str(source)), load(quantized.SerializeToString())
    return metric_error("rel_l2", [ref.run(None, f)[0] for f in heldout], [test.run(None, f)[0] for f in heldout])


def _noise(quantized, source, samples):
    """Summed noise-to-signal power of ``quantized`` against the float model over ``samples``."""
    ref, test = load(str(source)), load(quantized.SerializeToString())
    total = 0.0
    for feeds in samples:
        r, g = ref.run(None, feeds)[0].astype(np.float64), test.run(None, feeds)[0].astype(np.float64)
        total += float(np.sum((r - g) ** 2) / np.sum(r * r))
    return total


@pytest.mark.isa
@pytest.mark.parametrize("reduce_range", [False, True])
def test_each_layers_rank_is_the_error_leaving_it_in_float_removes_from_the_real_quantized_model(
    tmp_path, reduce_range
):
    """On any CPU: the ranking is a measurement with ORT's own kernels (VNNI, AMX or AVX2's saturating
    vpmaddubsw alike), so each layer's figure equals what excluding it does to the quantized model."""
    source = _outlier_mlp(tmp_path)
    proto = load_model(source)
    calibration = [make_feeds(proto, seed=i) for i in range(4)]
    ranking = rank_dynamic(source, calibration, reduce_range=reduce_range)
    quant = QuantizePass("dynamic", per_channel=True, reduce_range=reduce_range)
    full = _noise(quant.run(source).model, source, calibration)
    for entry in ranking:
        without = _noise(quant.with_excluded([entry["node"]]).run(source).model, source, calibration)
        assert entry["nsr"] == pytest.approx(max(0.0, full - without), rel=0.02, abs=1e-7), entry["node"]


@pytest.mark.isa
@pytest.mark.parametrize("reduce_range", [False, True])
def test_ranking_finds_the_layer_fed_by_outliers_and_excluding_it_cuts_the_error(tmp_path, reduce_range):
    """The layer behind the outlier channel is the one to leave in float, with 7-bit weights on every
    CPU; with 8-bit weights only where ORT's u8s8 kernel is exact. Where it saturates (x86 without
    VNNI: vpmaddubsw clips int16 pair sums), every layer loses to clipping and 8-bit weights are
    worse than 7-bit ones, which is why ORT's guide (and tune's space there) reaches for reduce_range."""
    source = _outlier_mlp(tmp_path)
    proto = load_model(source)
    calibration = [make_feeds(proto, seed=i) for i in range(4)]
    heldout = [make_feeds(proto, seed=100 + i) for i in range(3)]
    quant = QuantizePass("dynamic", per_channel=True, reduce_range=reduce_range)
    err_all = _error(quant.run(source).model, source, heldout)
    if not reduce_range:
        seven_bit = _error(
            QuantizePass("dynamic", per_channel=True, reduce_range=True).run(source).model, source, heldout
        )
        assert (err_all > seven_bit) == int8_rule().u8s8_saturates, (err_all, seven_bit, int8_rule())
        if int8_rule().u8s8_saturates:
            return
    ranking = rank_dynamic(source, calibration, reduce_range=reduce_range)
    assert ranking[0]["node"] == "mm2" and ranking[0]["tensor"] == "h1s"
    assert sorted(r["node"] for r in ranking) == ["mm1", "mm2", "mm3"]
    assert [r["nsr"] for r in ranking] == sorted((r["nsr"] for r in ranking), reverse=True)
    assert nodes_to_exclude(ranking, 1.5) == ["mm2"]
    err_mm2 = _error(quant.with_excluded(["mm2"]).run(source).model, source, heldout)
    err_mm3 = _error(quant.with_excluded(["mm3"]).run(source).model, source, heldout)
    assert err_mm2 < err_mm3 < err_all * 1.01
    assert err_mm2 < err_all / 1.5  # the ranking's noise share predicts the gain


@pytest.mark.isa
def test_ranking_covers_every_weighted_matmul_and_embedding_of_the_encoder(demo_paths):
    proto = load_model(demo_paths["encoder"])
    ranking = rank_dynamic(demo_paths["encoder"], [make_feeds(proto, seed=i) for i in range(2)])
    weights = {t.name for t in proto.graph.initializer}
    matmuls = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    tables = [n.name for n in proto.graph.node if n.op_type == "Gather" and n.input[0] in weights]
    assert len(tables) == 3 and sorted(r["node"] for r in ranking) == sorted(matmuls + tables)
    # Every GEMM adds noise; where u8s8 saturates, a small table's share can drown in the clipping.
    assert all(r["nsr"] > 0 for r in ranking if r["op_type"] == "MatMul") and all(r["nsr"] >= 0 for r in ranking)
    assert int8_rule().u8s8_saturates or all(r["nsr"] > 0 for r in ranking)


def test_ranking_can_be_limited_to_op_types(demo_paths):
    """Which layers are ranked does not depend on the INT8 kernel: not in the ISA lane."""
    proto = load_model(demo_paths["encoder"])
    weights = {t.name for t in proto.graph.initializer}
    matmuls = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    only = rank_dynamic(demo_paths["encoder"], [make_feeds(proto, seed=0)], op_types=["MatMul"])
    assert sorted(r["node"] for r in only) == sorted(matmuls)


@pytest.mark.isa
def test_ranking_replays_conv_and_reduce_range_on_the_cnn(demo_paths):
    """ConvInteger products are ranked too; 7-bit weights (--reduce-range) add more noise than 8-bit."""
    proto = load_model(demo_paths["cnn"])
    samples = [make_feeds(proto, seed=i) for i in range(2)]
    full = {r["node"]: r["nsr"] for r in rank_dynamic(demo_paths["cnn"], samples, per_channel=False)}
    reduced = {
        r["node"]: r["nsr"] for r in rank_dynamic(demo_paths["cnn"], samples, per_channel=False, reduce_range=True)
    }
    convs = [n.name for n in proto.graph.node if n.op_type == "Conv"]
    assert convs and set(convs) <= set(full) and set(full) == set(reduced)
    assert all(reduced[name] > full[name] > 0 for name in convs)


def test_nodes_to_exclude_gives_up_when_half_the_layers_would_not_do():
    ranking = [{"node": f"n{i}", "nsr": 1.0} for i in range(10)]
    assert nodes_to_exclude(ranking, 1.5) == ["n0", "n1", "n2", "n3"]  # 10 / 6 >= 1.5
    assert nodes_to_exclude(ranking, 100.0) == []
    assert nodes_to_exclude(ranking, 1.2, already=["n0"]) == ["n1", "n2"]


@pytest.mark.isa
def test_auto_exclude_leaves_the_layer_fed_by_outliers_in_float_first(tmp_path):
    source = _outlier_mlp(tmp_path)
    proto = load_model(source)
    calibration = write_samples([make_feeds(proto, seed=i) for i in range(8)], tmp_path / "calib")
    plain = quantize_gated(source, None, "dynamic", calibration=str(calibration), max_error=1.0, per_channel=True)
    report = quantize_gated(
        source,
        tmp_path / "q.onnx",
        "dynamic",
        calibration=str(calibration),
        max_error=plain.gate.error / 1.5,
        auto_exclude=True,
        per_round=1,
        per_channel=True,
    )
    assert report.gate.passed and [h["excluded"] for h in report.history] == [[], ["mm2"]]
    ops = {n.name: n.op_type for n in load_model(report.output).graph.node}
    assert ops["mm2"] == "MatMul" and "mm1" not in ops  # mm1 became MatMulInteger (renamed by the quantizer)


@pytest.fixture(scope="module")
def encoder_samples(demo_paths, tmp_path_factory):
    proto = load_model(demo_paths["encoder"])
    samples = [{k: v[:, :32] for k, v in make_feeds(proto, seed=i).items()} for i in range(8)]
    return write_samples(samples, tmp_path_factory.mktemp("encoder-calib"))


@pytest.mark.isa
def test_auto_exclude_on_the_encoder_ranks_by_calibration_activations_and_passes(demo_paths, encoder_samples):
    plain = quantize_gated(demo_paths["encoder"], None, "dynamic", calibration=str(encoder_samples), max_error=1.0)
    target = plain.gate.error * 0.7
    report = quantize_gated(
        demo_paths["encoder"],
        None,
        "dynamic",
        calibration=str(encoder_samples),
        max_error=target,
        auto_exclude=True,
        per_round=2,
    )
    assert report.gate.passed and report.gate.error <= target < plain.gate.error
    # Round by round, the layers left in float are the activation ranking's worst, in order, on the
    # calibration part of the data (the held-out quarter only judges).
    step = QuantizePass("dynamic")
    prepared, _ = step.prepared(SourceModel.of(demo_paths["encoder"]))
    calib, _ = load_calibration(str(encoder_samples), prepared).split(0.25)
    order = [r["node"] for r in rank_dynamic(prepared, calib, per_channel=False)]
    rounds = len(report.history) - 1
    assert rounds >= 1 and report.history[-1]["excluded"] == order[: 2 * rounds]
    assert [h["error"] for h in report.history] == sorted((h["error"] for h in report.history), reverse=True)


def test_a_dynamic_gate_failure_names_layers_by_their_activation_error(demo_paths, encoder_samples, tmp_path):
    with pytest.raises(AccuracyGateError, match="dynamic INT8 output SQNR .* on the calibration activations") as err:
        quantize_gated(
            demo_paths["encoder"], tmp_path / "enc.q.onnx", "dynamic", calibration=str(encoder_samples), max_error=1e-12
        )
    assert "of the added noise" in str(err.value)
    assert list(tmp_path.iterdir()) == []
