"""``passes.options``: each pass's options record (defaults, normalisation, checks, the JSON form, the recipe)."""

from __future__ import annotations

import json

import pytest

from ortpilot.errors import UsageError
from ortpilot.passes.decoder_fusion import DecoderFusionPass
from ortpilot.passes.fusion import FusionPass
from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass
from ortpilot.passes.options import (
    MIN_POSITIONS,
    NOISE_RANKING,
    SQNR_RANKING,
    WEIGHT_OPS,
    DecoderFusionOptions,
    FusionOptions,
    NoOptions,
    OpenVINOInt8Options,
    QuantizeOptions,
    RawOptions,
    WeightOnlyOptions,
    quantize_options,
)
from ortpilot.passes.quantize import QuantizePass
from ortpilot.passes.registry import Step
from ortpilot.passes.weight_only import WeightOnlyPass
from ortpilot.quantmodes import CALIBRATED_MODES, INT8_MODES

RECORDS = [
    QuantizeOptions(),
    QuantizeOptions("qdq", per_channel=True, op_types=WEIGHT_OPS, nodes_to_exclude=["a"], preprocess=False),
    QuantizeOptions("static", weight_type="QUINT8", activation_type="qint8", method="entropy", op_types=["Conv"]),
    OpenVINOInt8Options(),
    OpenVINOInt8Options("cnn", nodes_to_exclude=("x",), fast_bias_correction=False),
    FusionOptions(),
    FusionOptions("bert", num_heads=4, hidden_size=64),
    DecoderFusionOptions(),
    DecoderFusionOptions(atol=1e-2, pack=False, max_positions=0),
    WeightOnlyOptions(),
    WeightOnlyOptions("int8-weights", block_size=64, symmetric=False, accuracy_level=None, nodes_to_exclude=["n"]),
    NoOptions(),
    RawOptions({"k": 1}),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_its_json_form(record):
    doc = json.loads(json.dumps(record.to_dict()))
    assert type(record).from_dict(doc) == record


def test_defaults_are_the_passes_and_the_json_form_names_only_what_differs():
    assert QuantizePass().config == QuantizeOptions() and QuantizePass().mode == "dynamic"
    assert WeightOnlyPass().config == WeightOnlyOptions() and FusionPass(check=False).config == FusionOptions()
    assert DecoderFusionPass().config == DecoderFusionOptions() and OpenVINOInt8Pass().config == OpenVINOInt8Options()
    # The forms tune journals hold: mode and per_channel always, the rest only off their defaults.
    assert QuantizeOptions().to_dict() == {"mode": "dynamic", "per_channel": False}
    assert QuantizeOptions(op_types=WEIGHT_OPS, nodes_to_exclude=["b", "a"]).to_dict() == {
        "mode": "dynamic",
        "per_channel": False,
        "weights_only": True,
        "exclude": ["b", "a"],
    }
    assert FusionOptions().to_dict() == {"model_type": "auto", "num_heads": 0, "hidden_size": 0}
    assert FusionOptions(skip_layer_norm=False).to_dict() == {**FusionOptions().to_dict(), "skip_layer_norm": False}
    assert WeightOnlyOptions().to_dict() == {"mode": "int4"}
    assert DecoderFusionOptions().to_dict() == {} == OpenVINOInt8Options().to_dict() == NoOptions().to_dict()


def test_settings_are_normalised_so_records_compare():
    assert QuantizeOptions(weight_type="QInt8", nodes_to_exclude="n1") == QuantizeOptions(nodes_to_exclude=("n1",))
    assert QuantizeOptions(op_types=[]).op_types is None  # no op types given: per mode
    assert QuantizeOptions(op_types=list(WEIGHT_OPS)).weights_only
    # A weight-only node set is a set; the ones left float are not also kept 8-bit.
    w = WeightOnlyOptions(nodes_to_exclude=["b", "a", "b"], nodes_in_int8=["a", "c"])
    assert w.nodes_to_exclude == ("a", "b") and w.nodes_in_int8 == ("c",)
    assert QuantizeOptions().excluding(["a"]).excluding(["a", "b"]).nodes_to_exclude == ("a", "b")


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: QuantizeOptions("int4"), "Unknown quantization mode"),
        (lambda: QuantizeOptions(weight_type="int8"), "Unknown quantization type"),
        (lambda: QuantizeOptions(method="mse"), "Unknown calibration method"),
        (lambda: OpenVINOInt8Options("rnn"), "Unknown model type"),
        (lambda: FusionOptions(num_heads=-1), "num_heads must be"),
        (lambda: FusionOptions(skip_layer_norm="no"), "skip_layer_norm must be true or false"),
        (lambda: DecoderFusionOptions(max_positions=MIN_POSITIONS - 1), "max_positions must be 0"),
        (lambda: WeightOnlyOptions("int2"), "Unknown weight-only mode"),
        (lambda: WeightOnlyOptions(block_size=48), "power of two"),
        (lambda: WeightOnlyOptions(accuracy_level=5), "accuracy-level"),
        (lambda: QuantizeOptions.from_dict({"mode": "dynamic", "per_chanel": True}), "unknown settings: per_chanel"),
        (lambda: QuantizeOptions.from_dict({"weights_only": True, "op_types": ["Conv"]}), "both weights_only"),
    ],
)
def test_bad_settings_are_usage_errors_as_the_record_is_made(make, said):
    with pytest.raises(UsageError, match=said):
        make()


def test_the_recipe_questions_are_answered_by_the_record():
    for mode in INT8_MODES:
        options = QuantizeOptions(mode)
        assert options.calibrated == (mode in CALIBRATED_MODES) == QuantizePass(mode).calibrated
        assert options.ranking == (NOISE_RANKING if mode == "dynamic" else SQNR_RANKING)
        assert options.cpu_only == (mode == "dynamic") and options.always_gated == (mode == "full")
    assert QuantizeOptions("qdq").qdq and not QuantizeOptions("static").qdq
    openvino = OpenVINOInt8Options()
    # NNCF's QDQ tensors are not ORT's: its layers rank by dynamic INT8's noise (passes.debug.layer_errors)
    assert openvino.calibrated and openvino.ranking == NOISE_RANKING and not openvino.cpu_only
    assert openvino.mode == "openvino"
    for record in (FusionOptions(), DecoderFusionOptions(), WeightOnlyOptions(), NoOptions()):
        assert not record.calibrated and record.ranking is None and not record.cpu_only
    assert WeightOnlyOptions().quantizes_embedding and not WeightOnlyOptions("int8-weights").quantizes_embedding
    assert WeightOnlyPass("int8-weights").embedding is False  # the pass runs what the record says it can


def test_a_step_carries_its_record_and_reads_as_its_json():
    step = Step("quantize", {"mode": "qdq", "per_channel": True})
    assert step.options == QuantizeOptions("qdq", per_channel=True) and step.options.calibrated
    assert Step("quantize", step.options) == step and Step("decoder_fusion").options == DecoderFusionOptions()
    assert step.with_options(exclude=["n"]).options.nodes_to_exclude == ("n",)
    assert step.with_options(per_channel=None)["per_channel"] is False  # None: back to the default
    assert Step("prepare").to_dict() == {"pass": "prepare"}
    assert Step("custom_pass", {"k": 1}).options == RawOptions({"k": 1})  # a name with no record of its own
    with pytest.raises(TypeError, match="takes QuantizeOptions"):
        Step("quantize", FusionOptions())


def test_quantize_options_picks_the_record_of_the_mode_and_refuses_other_modes_settings():
    assert quantize_options("qdq", per_channel=True) == QuantizeOptions("qdq", per_channel=True)
    assert quantize_options("int4", block_size=64) == WeightOnlyOptions(block_size=64)
    assert quantize_options("openvino", nodes_to_exclude=["a"]) == OpenVINOInt8Options(nodes_to_exclude=("a",))
    # Another mode's settings at their defaults are no request (a command passes every flag it has).
    assert quantize_options("openvino", per_channel=False, weight_type="qint8") == OpenVINOInt8Options()
    with pytest.raises(UsageError, match="--per-channel, --reduce-range do"):
        quantize_options("openvino", per_channel=True, reduce_range=True)
    with pytest.raises(UsageError, match="--mode dynamic is ORT's INT8 quantizer; --block-size"):
        quantize_options("dynamic", block_size=64)
    with pytest.raises(UsageError, match="Unknown quantize settings: colour"):
        quantize_options("dynamic", colour="red")
    with pytest.raises(UsageError, match="Unknown quantization mode 'int2'"):
        quantize_options("int2")


def test_the_openvino_recipe_is_part_of_the_record_and_its_label():
    # NNCF's own recipe keeps the step's JSON (and every journaled candidate id) as it was
    assert Step("openvino_int8").to_dict() == {"pass": "openvino_int8"}
    step = Step("openvino_int8", {"smooth_quant": 0.8, "activation_ranges": "minmax", "exclude": ["a"]})
    assert step.options == OpenVINOInt8Options(nodes_to_exclude=("a",), smooth_quant=0.8, activation_ranges="minmax")
    assert step.label() == "int8-openvino-sq0.8-minmax-x1"
    assert Step.of(step.to_dict()) == step and step.options.excluding(["b"]).smooth_quant == 0.8
    assert Step("openvino_int8", {"smooth_quant": 1}).options.smooth_quant == 1.0
    assert Step("openvino_int8", {"activation_ranges": "minmax"}).label() == "int8-openvino-minmax"
    for alpha in (1.5, -0.1, "0.8", True):
        with pytest.raises(UsageError, match="SmoothQuant's alpha"):
            OpenVINOInt8Options(smooth_quant=alpha)
    with pytest.raises(UsageError, match="activation ranges 'mean'.*nncf, minmax"):
        OpenVINOInt8Options(activation_ranges="mean")
    # a CPU INT8 mode refuses the recipe's settings by their flags
    with pytest.raises(UsageError, match="--smooth-quant do"):
        quantize_options("dynamic", smooth_quant=0.8)
