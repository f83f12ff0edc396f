"""NNCF's second INT8 recipe for transformers (SmoothQuant 0.8, min-max activation ranges): what it writes, that it
runs on OpenVINO, and that a tune on OpenVINO measures it beside NNCF's own recipe (issue 46: which recipe keeps a
model's worst sample accurate is measured, not assumed).

Runs wherever OpenVINO computes and NNCF is installed (the plugin lane on Intel CPUs, or the onnxruntime-openvino
distribution with NNCF on any x86 CPU).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from nncf_lane import MARKS, OV
from onnx import numpy_helper

from ortpilot.graph.feeds import make_feeds
from ortpilot.models import make_cnn, make_encoder
from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass
from ortpilot.providers.names import ProviderSpec

pytestmark = MARKS


def _scales(model: onnx.ModelProto) -> dict[str, float]:
    """Each QuantizeLinear's (activation) scale, by the tensor it quantizes."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits:
            scale = node.input[1]
            value = inits[scale] if scale in inits else numpy_helper.to_array(made[scale].attribute[0].t)
            out[node.input[0]] = float(np.max(value))
    return out


def test_the_smoothed_recipe_writes_other_ranges_and_runs_on_openvino():
    model = make_encoder()
    rng = np.random.default_rng(0)
    calibration = [make_feeds(model, seed=int(s)) for s in rng.integers(0, 1000, 16)]
    own = OpenVINOInt8Pass(calibration=calibration).run(model)
    smoothed = OpenVINOInt8Pass(calibration=calibration, smooth_quant=0.8, activation_ranges="minmax").run(model)
    assert OpenVINOInt8Pass(smooth_quant=0.8, activation_ranges="minmax").label() == "int8-openvino-sq0.8-minmax"
    assert any("SmoothQuant alpha 0.8" in n and "min and max" in n for n in smoothed.record.notes), (
        smoothed.record.notes
    )
    own_scales, smoothed_scales = _scales(own.model), _scales(smoothed.model)
    assert own_scales and smoothed_scales
    # min-max ranges are never narrower than NNCF's estimator's (a mean of per-sample ranges) on the same samples,
    # and SmoothQuant moves the MatMul inputs' outliers into the weights: the ranges differ
    assert own_scales != smoothed_scales
    feeds = make_feeds(model, seed=7)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for built in (own, smoothed):
        got = ort.InferenceSession(
            built.model.SerializeToString(), providers=[OV], provider_options=[{"device_type": "CPU"}]
        ).run(None, feeds)[0]
        assert got.shape == want.shape and np.isfinite(got).all()
        cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine > 0.9, cosine


def test_a_tune_on_openvino_tries_both_recipes_on_a_transformer_and_one_on_a_cnn():
    from ortpilot.tuning.candidate import baseline_candidate
    from ortpilot.tuning.space import first_candidates, gather_facts

    def ov_int8(model: onnx.ModelProto) -> list[str]:
        facts = gather_facts(model, [ProviderSpec(OV)])
        cands = first_candidates(facts, baseline_candidate())
        return list(
            dict.fromkeys(c.passes[-1].label() for c in cands if c.passes and c.passes[-1].name == "openvino_int8")
        )

    transformer = ov_int8(make_encoder())
    # the smoothed recipe first: it kept MiniLM's worst sentence where NNCF's own did not, at the same cost
    assert transformer == ["int8-openvino-sq0.8-minmax", "int8-openvino"], transformer
    assert not any("sq0.8" in label for label in ov_int8(make_cnn())), ov_int8(make_cnn())


def test_quantize_mode_openvino_writes_the_recipe_it_was_given(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "enc.onnx"
    args = ["quantize", "demo:encoder", "-o", str(out), "--mode", "openvino", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", *args, "--smooth-quant", "0.8", "--activation-ranges", "minmax"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["record"]
    assert record["options"]["smooth_quant"] == 0.8 and record["options"]["activation_ranges"] == "minmax"
    assert record["op_diff"].get("Mul", 0) > 0  # SmoothQuant's scales before the MatMuls it smoothed
    assert out.exists()
