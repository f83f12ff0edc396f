"""A model that comes quantized: no INT8 variant of it is built, labels say so, and a file ortpilot wrote that
does not load names ortpilot's step, not the user's model."""

from __future__ import annotations

import json
import warnings

import onnx
import pytest
from onnxruntime.quantization import QuantType, quantize_dynamic

from ortpilot.graph.feeds import generate_samples
from ortpilot.providers.names import ProviderSpec
from ortpilot.providers.openvino import OPENVINO
from ortpilot.tuning import tune
from ortpilot.tuning.candidate import baseline_candidate
from ortpilot.tuning.space import (
    QDQ_PC,
    _openvino_variants,
    first_candidates,
    gather_facts,
    knob_variants,
    model_variants,
)
from ortpilot.tuning.worker import WorkerClient, save_samples


def _int8(source, dest):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(dest), weight_type=QuantType.QInt8)
    return dest


@pytest.fixture(scope="module")
def int8_mlp(demo_paths, tmp_path_factory):
    return _int8(demo_paths["mlp"], tmp_path_factory.mktemp("int8") / "mlp.int8.onnx")


def test_a_quantized_model_gets_no_int8_variants_and_its_labels_say_int8_as_given(int8_mlp, demo_paths):
    facts = gather_facts(onnx.load(int8_mlp), None)
    assert facts.given_int8 == {"DynamicQuantizeLinear": 3, "MatMulInteger": 3}
    assert facts.model_label == "int8 (as given)" and not facts.requantize
    assert not [v for v in model_variants(facts) if any(s.name == "quantize" for s in v)]
    (line,) = [e for e in facts.excluded if e.what == "INT8 variants"]
    assert "already quantized (DynamicQuantizeLinear x3, MatMulInteger x3)" in line.reason
    assert facts.to_dict()["given_int8"] == facts.given_int8
    base = baseline_candidate(facts.model_label)
    cands = [*first_candidates(facts, base), *knob_variants(base.with_settings(intra_op_threads=1), facts)]
    assert cands and all("fp32" not in c.label and c.label.startswith("int8 (as given)") for c in cands)
    # the label is a name, not a setting: the same configuration keeps its id (journals resume)
    one = base.with_settings(intra_op_threads=1)
    assert (
        one.label == "int8 (as given) · intra=1" and one.id == baseline_candidate().with_settings(intra_op_threads=1).id
    )
    assert type(one).from_dict(json.loads(json.dumps(one.to_dict()))).label == one.label
    # OpenVINO's candidates of it: the model as given, no NNCF variant
    ov = _openvino_variants(ProviderSpec(OPENVINO), facts, base)
    assert ov and all(c.label.startswith("int8 (as given) · openvino") and not c.passes for c in ov)
    # a float model: as before
    plain = gather_facts(onnx.load(demo_paths["mlp"]), None)
    assert plain.given_int8 == {} and plain.model_label == "fp32"
    assert baseline_candidate().with_settings(intra_op_threads=1).label == "fp32 · intra=1"


def test_a_file_ortpilot_wrote_that_does_not_load_names_ortpilots_step(demo_paths, tmp_path):
    # ORT's QDQ quantizer over an already dynamic-INT8 encoder writes two nodes of one name: the model it wrote
    # does not load, and the message says so instead of sending the user to check their own model.
    model = _int8(demo_paths["encoder"], tmp_path / "encoder.int8.onnx")
    proto = onnx.load(model)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    save_samples(scratch / "heldout.npz", generate_samples(proto, 1))
    save_samples(scratch / "calibration.npz", generate_samples(proto, 4))
    (scratch / "worker.json").write_text(json.dumps({"model": str(model), "shapes": {}}))
    worker = WorkerClient(scratch)
    try:
        cand = baseline_candidate().derived(passes=(QDQ_PC,))
        result = worker.request("prepare", cand.to_dict(), 300)
        plain = worker.request("prepare", baseline_candidate().to_dict(), 300)
    finally:
        worker.close()
    assert result["status"] == "failed", result
    assert "ortpilot's int8-qdq-pc step wrote from yours does not load" in result["error"]
    assert "two nodes with same node name" in result["error"] and "ortpilot inspect" not in result["error"]
    assert plain["status"] == "ok"


def test_a_tune_of_a_quantized_model_builds_no_int8_variant(int8_mlp, tmp_path):
    result = tune(str(int8_mlp), tmp_path / "out", budget_s=15)
    assert result.entries and not [e for e in result.entries if e.candidate.passes]
    labels = [e.candidate.label for e in result.entries if not e.candidate.baseline]
    assert labels and all(label.startswith("int8 (as given)") for label in labels), labels
    doc = result.to_dict()
    assert doc["facts"]["given_int8"] == {"DynamicQuantizeLinear": 3, "MatMulInteger": 3}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "- INT8 variants: the model is already quantized (DynamicQuantizeLinear x3" in report
