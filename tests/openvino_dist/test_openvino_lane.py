"""The OpenVINO lane (.ci/openvino.sh): run only where onnxruntime-openvino provides OpenVINOExecutionProvider.

A CNN verifies on OpenVINO in strict mode with its placement; silero-vad, which the OpenVINO
CPU plugin refuses at compile time ("Parameter operation with dynamic rank", from an If
branch), is handled per policy: strict raises, warn and allow fall back to CPU and record why.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from ortpilot import ProviderFallbackError, load
from ortpilot.graph.feeds import make_feeds

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"

pytestmark = [
    pytest.mark.openvino,
    pytest.mark.skipif(
        OV not in ort.get_available_providers(),
        reason="OpenVINOExecutionProvider not available (pip install onnxruntime-openvino)",
    ),
]


def _show(sess) -> None:
    """Print the placement, so that the lane's log shows where the nodes ran."""
    print(
        json.dumps(
            {
                "providers": sess.providers,
                "placement": {
                    p: {"nodes": v["nodes"], "share": v["share"]}
                    for p, v in sess.placement.to_dict()["providers"].items()
                },
            }
        )
    )


def test_demo_cnn_verifies_on_openvino_strict(demo_paths):
    sess = load(str(demo_paths["cnn"]), ["openvino"], policy="strict")
    _show(sess)
    assert sess.providers[0] == OV and sess.fallbacks == []
    assert sess.placement is not None and sess.placement.share(OV) == 1.0
    assert {n.op_type for n in sess.placement.nodes_on(OV)} >= {"Conv", "Gemm"}
    [logits] = sess.run(None, make_feeds(sess.model))
    cpu = load(str(demo_paths["cnn"]), ["cpu"], policy="strict")
    [expected] = cpu.run(None, make_feeds(cpu.model))
    assert logits.shape == expected.shape
    assert abs(logits - expected).max() < 1e-3


def test_demo_cnn_strict_full_coverage_disables_cpu_fallback(demo_paths):
    sess = load(str(demo_paths["cnn"]), ["openvino"], policy="strict", min_coverage=1.0)
    assert sess.placement.counts == {OV: sess.placement.total}


def test_nudenet_yolo_verifies_on_openvino_strict(nudenet_path):
    sess = load(str(nudenet_path), ["openvino"], policy="strict", shapes={"images": (1, 3, 320, 320)})
    _show(sess)
    assert sess.placement.share(OV) >= 0.95
    assert sess.placement.flops_share(OV) is None or sess.placement.flops_share(OV) >= 0.95
    [out] = sess.run(None, make_feeds(sess.model, {"images": (1, 3, 320, 320)}))
    assert out.shape[0] == 1


def test_silero_vad_strict_raises_naming_the_reason(silero_vad_path):
    with pytest.raises(ProviderFallbackError) as info:
        load(str(silero_vad_path), ["openvino", "cpu"], policy="strict")
    err = info.value
    assert err.requested == OV and err.layer == 3 and err.exit_code == 1
    assert "dynamic rank" in err.reason


def test_silero_vad_warn_falls_back_to_cpu_and_records(silero_vad_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        sess = load(str(silero_vad_path), ["openvino", "cpu"], policy="warn")
    assert sess.providers == [CPU]
    [fallback] = [f for f in sess.fallbacks if f.requested == OV]
    assert fallback.layer == 3 and fallback.got == [CPU] and "dynamic rank" in fallback.reason
    assert sum("Provider fallback" in r.getMessage() for r in caplog.records) == 1
    out, state = sess.run(None, _silero_feeds())
    assert out.shape == (1, 1) and state.shape == (2, 1, 128)


def _silero_feeds() -> dict[str, np.ndarray]:
    """One 32 ms chunk at 16 kHz; silero-vad's dims are unnamed, so they are given here."""
    rng = np.random.default_rng(0)
    return {
        "input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


def test_silero_vad_allow_records_silently(silero_vad_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        sess = load(str(silero_vad_path), ["openvino", "cpu"], policy="allow")
    assert sess.providers == [CPU]
    assert [f.layer for f in sess.fallbacks if f.requested == OV] == [3]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_run_strict_on_silero_vad_exits_1_with_reason(silero_vad_path):
    proc = _cli("run", str(silero_vad_path), "-p", "openvino", "-p", "cpu", "--policy", "strict")
    assert proc.returncode == 1
    assert "dynamic rank" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_run_cnn_strict_prints_placement(demo_paths):
    proc = _cli("run", str(demo_paths["cnn"]), "-p", "openvino", "--policy", "strict", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    placement = doc["session"]["placement"]["providers"]
    assert placement[OV]["share"] == 1.0


def test_doctor_json_shows_openvino_probe_ok():
    proc = _cli("doctor", "--json")
    doc = json.loads(proc.stdout)
    probe = next(p for p in doc["probes"] if p["provider"] == OV)
    assert probe["status"] == "ok" and probe["placement_share"] == 1.0, probe
    names = [d["name"] for d in doc["distributions"]["distributions"]]
    assert names == ["onnxruntime-openvino"] and proc.returncode == 0


def test_inspect_measures_openvino_support(demo_paths):
    proc = _cli("inspect", str(demo_paths["cnn"]), "--json", "-p", "openvino")
    assert proc.returncode == 0, proc.stderr
    [entry] = json.loads(proc.stdout)["unsupported_ops"]
    assert entry["provider"] == OV and entry["checked"] and entry["unsupported"] == []


def test_openvino_compiles_a_session_per_bucket_and_padding_to_it_changes_no_answer(demo_paths):
    """A shape plan on OpenVINO (session.shaped): each bucket's session has the sequence fixed, so OpenVINO
    compiles it for a static shape; requests at their own length come back at their length, as the CPU EP
    gives them unpadded."""
    from ortpilot.session.shaped import load_shaped
    from ortpilot.session.shapeplan import ShapePlan

    model = str(demo_paths["encoder"])  # a BERT-style encoder whose attention honours its mask
    axes = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))
    shaped = load_shaped(model, [OV], "strict", ShapePlan("sequence", (8, 16), axes))
    plain = load(model, [CPU], "strict")
    assert shaped.providers[0] == OV and {s.providers[0] for s in shaped.buckets.values()} == {OV}
    for n in (3, 8, 13):
        feeds = {
            "input_ids": np.arange(5, 5 + n, dtype=np.int64)[None],
            "attention_mask": np.ones((1, n), np.int64),
            "token_type_ids": np.zeros((1, n), np.int64),
        }
        got, want = shaped.run(None, feeds)[0], plain.run(None, feeds)[0]
        assert got.shape == want.shape == (1, n, want.shape[-1])
        assert np.allclose(got, want, atol=1e-3), n
    assert dict(shaped.served) == {"8": 2, "16": 1}


def test_the_winners_first_run_cost_is_measured_on_openvino_and_a_warm_up_runs_every_size(demo_paths):
    """OpenVINO prepares each new input length on its first run (session.warmup): the tune's measurement
    (tuning.warmup.measure_warmup) runs on a fresh OpenVINO session, and the warm-up at load runs it once at
    every size of the plan, after which it answers as the CPU EP does."""
    from ortpilot.data.workload import DimStats, Workload
    from ortpilot.session.options import SessionSettings
    from ortpilot.session.warmup import warm_at_sizes, worth_warming
    from ortpilot.tuning.warmup import measure_warmup

    model = demo_paths["encoder"]
    axes = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))

    def request(n: int) -> dict[str, np.ndarray]:
        return {
            "input_ids": np.arange(5, 5 + n, dtype=np.int64)[None],
            "attention_mask": np.ones((1, n), np.int64),
            "token_type_ids": np.zeros((1, n), np.int64),
        }

    workload = Workload("text", 12, (DimStats("sequence", axes, ((4, 5), (9, 4), (20, 3))),))
    replay = [request(4), request(9), request(20)]
    plan = measure_warmup(model, [{"name": OV, "options": {}}], SessionSettings(), workload, replay)
    assert plan is not None and plan.sizes[:3] == (4, 9, 20) and sorted(plan.sizes) == list(range(4, 21))
    assert plan.run_ms > 0 and plan.warm == worth_warming(plan.first_run_ms, plan.run_ms) and plan.batches == (1,)
    session, plain = load(str(model), [OV], "strict"), load(str(model), [CPU], "strict")
    warmed = warm_at_sizes(session, request(20), plan, budget_s=600)
    assert warmed.shapes == tuple((1, n) for n in plan.sizes)
    assert np.allclose(session.run(None, request(13))[0], plain.run(None, request(13))[0], atol=1e-3)


def test_openvino_compiled_per_shape_answers_as_the_cpu_ep_at_every_shape_and_prepares_each_once(demo_paths):
    """``disable_dynamic_shapes`` (the tune's per-shape knob, ``tuning.space.PER_SHAPE_OPTION``): the session
    compiles the model for each input shape it meets and keeps it, so a second run at a shape answers the same as
    the first, and every shape answers as the CPU EP does."""
    from ortpilot.tuning.space import PER_SHAPE_OPTION

    model = str(demo_paths["encoder"])
    per_shape = load(model, [f"openvino:{PER_SHAPE_OPTION}=True,num_of_threads=2"], "strict")
    plain = load(model, [CPU], "strict")
    assert per_shape.providers[0] == OV
    for batch, n in ((1, 5), (1, 17), (4, 17), (1, 5)):
        feeds = {
            "input_ids": np.arange(5, 5 + batch * n, dtype=np.int64).reshape(batch, n) % 90 + 5,
            "attention_mask": np.ones((batch, n), np.int64),
            "token_type_ids": np.zeros((batch, n), np.int64),
        }
        first, again = per_shape.run(None, feeds)[0], per_shape.run(None, feeds)[0]
        want = plain.run(None, feeds)[0]
        assert first.shape == want.shape == (batch, n, want.shape[-1])
        assert np.array_equal(first, again) and np.allclose(first, want, atol=1e-3), (batch, n)
