"""NNCF's INT8 on OpenVINO with its noisiest layers left in float through NNCF's ignored scope: tune's follow-up
for a variant just over the gate (``tuning.search.noise_settings``), and ``quantize --mode openvino --auto-exclude``
(``passes.debug.layer_errors``), both ranked by the noise dynamic INT8 adds at each layer.

Runs wherever OpenVINO computes and NNCF is installed: the plugin lane on Intel CPUs, or an environment with the
onnxruntime-openvino distribution and NNCF (on any x86 CPU).
"""

from __future__ import annotations

import re

from nncf_lane import MARKS

from ortpilot.modelio import load_model

pytestmark = MARKS


def _ov_int8(result):
    return [e for e in result.entries if e.candidate.passes and e.candidate.passes[-1].name == "openvino_int8"]


def test_an_openvino_int8_variant_over_the_gate_is_retried_with_its_noisiest_layers_in_float(tmp_path, demo_paths):
    from ortpilot import tune

    model = str(demo_paths["encoder"])
    probe = tune(model, out_dir=str(tmp_path / "probe"), budget_s=20, providers=["openvino"], max_error=1.0)
    error = min(e.accuracy["worst_error"] for e in _ov_int8(probe) if e.accuracy)  # every recipe over the limit
    result = tune(model, out_dir=str(tmp_path / "out"), budget_s=30, providers=["openvino"], max_error=error / 2)
    tried = _ov_int8(result)
    follow = [e for e in tried if e.candidate.passes[-1].get("exclude")]
    assert follow, [(e.candidate.label, e.status, e.reason) for e in tried]
    parents = [e for e in tried if not e.candidate.passes[-1].get("exclude") and e.accuracy]
    assert parents and all(e.status == "rejected" for e in parents)
    measured = [e for e in follow if e.accuracy]
    assert measured, [(e.candidate.label, e.status, e.reason) for e in follow]

    def recipe(entry) -> dict:
        return {k: v for k, v in entry.candidate.passes[-1].items() if k != "exclude"}

    for entry in measured:  # each recipe's follow-up keeps its recipe and beats its own parent
        assert re.search(r"int8-openvino(-sq[0-9.]+)?(-minmax)?-x\d+ ", entry.candidate.label), entry.candidate.label
        parent = next(p for p in parents if recipe(p) == recipe(entry))
        assert entry.accuracy["worst_error"] < parent.accuracy["worst_error"]
        # the layers named are MatMuls whose weights NNCF left float: no DequantizeLinear feeds them
        graph = load_model(entry.prepared["model_path"]).graph
        made_by = {o: n.op_type for n in graph.node for o in n.output}
        named = {n.name: n for n in graph.node}
        for name in entry.candidate.passes[-1]["exclude"]:
            assert named[name].op_type == "MatMul"
            assert "DequantizeLinear" not in {made_by.get(i) for i in named[name].input}


def test_quantize_mode_openvino_auto_exclude_ranks_nncfs_layers_and_leaves_them_float(demo_paths, tmp_path):
    """It raised AttributeError ('OpenVINOInt8Pass' has no 'prepared') once the gate failed: the ranking is the
    dynamic-INT8 noise of the model NNCF quantizes."""
    import json
    import subprocess
    import sys

    def quantize(*extra: str) -> subprocess.CompletedProcess:
        out = tmp_path / f"enc{len(extra)}.onnx"
        args = ["quantize", str(demo_paths["encoder"]), "-o", str(out), "--mode", "openvino", "--json", *extra]
        return subprocess.run(
            [sys.executable, "-m", "ortpilot.cli.main", *args], capture_output=True, text=True, timeout=600
        )

    first = quantize("--max-error", "1.0")
    assert first.returncode == 0, first.stderr
    error = json.loads(first.stdout)["gate"]["error"]
    done = quantize("--max-error", f"{error / 2:.3g}", "--auto-exclude")
    assert "Traceback" not in done.stderr and done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["gate"]["passed"] and report["gate"]["error"] <= float(f"{error / 2:.3g}")
    assert all("MatMul" in name for name in report["record"]["options"]["nodes_to_exclude"]), report["record"]
