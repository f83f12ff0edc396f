"""The OpenVINO plugin lane (.ci/openvino-plugin.sh): stock onnxruntime with onnxruntime-ep-openvino and NNCF.

The plugin lists a device on Intel CPUs only; elsewhere every test here skips, naming the reason
(on such a CPU, OpenVINO runs through the onnxruntime-openvino distribution: tests/openvino_dist).
doctor, run, tune, verify and load_profile must agree about OpenVINO; the INT8 step for OpenVINO
(NNCF's QDQ) and the compiled blob (EP context) are checked on real sessions.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ortpilot import ProviderFallbackError, load
from ortpilot.errors import StampMismatchError
from ortpilot.graph.feeds import make_feeds
from ortpilot.providers.plugins import ep_devices, plugin_for_ep, register_plugin

OV = "OpenVINOExecutionProvider"
CPU = "CPUExecutionProvider"


def _no_device_reason() -> str:
    plugin = plugin_for_ep(OV)
    if plugin is None:
        return "onnxruntime-ep-openvino is not installed (pip install -e '.[cpu,openvino-plugin]')"
    error = register_plugin(OV, plugin.library_path or None)
    if error:
        return f"the OpenVINO plugin did not register: {error}"
    if not ep_devices(OV):
        return "the OpenVINO plugin lists no device on this CPU (it lists Intel CPUs only)"
    return ""


REASON = _no_device_reason()
pytestmark = [pytest.mark.openvino_plugin, pytest.mark.skipif(bool(REASON), reason=REASON or "-")]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ortpilot.cli.main", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_doctor_and_run_agree_about_openvino(demo_paths):
    doctor = json.loads(_cli("doctor", "--json").stdout)
    probe = next(p for p in doctor["probes"] if p["provider"] == OV)
    assert (probe["kind"], probe["status"]) == ("plugin", "ok"), probe
    assert not any(p["provider"].endswith(".AUTO") for p in doctor["probes"])
    assert doctor["machine_class"]["name"].endswith("+openvino"), doctor["machine_class"]["name"]
    assert OV in doctor["machine_class"]["key"]["eps"]
    assert not [e for e in doctor["machine_class"]["key"]["eps"] if "." in e]

    ran = _cli("run", str(demo_paths["encoder"]), "-p", "openvino", "-p", "cpu", "--policy", "strict", "--json")
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)["session"]
    assert report["providers"][0] == OV
    placed = report["placement"]["providers"]
    assert set(placed) == {OV} and placed[OV]["share"] == 1.0, placed


def test_a_second_session_in_one_process_still_gets_openvino(demo_paths):
    """A registered plugin is listed by get_available_providers(): it must still be created by device."""
    first = load(str(demo_paths["encoder"]), ["openvino"], policy="strict")
    second = load(str(demo_paths["encoder"]), ["openvino", "cpu"], policy="strict")
    assert first.providers[0] == second.providers[0] == OV
    assert second.placement.share(OV) == 1.0


def test_openvino_options_reach_the_plugin_without_warnings(demo_paths):
    sess = load(str(demo_paths["encoder"]), ["openvino:num_of_threads=1,precision=ACCURACY", "cpu"], policy="strict")
    assert sess.providers[0] == OV
    assert not [m for m in sess.ort_messages if "is ignored" in m], sess.ort_messages


def test_a_device_the_plugin_does_not_list_is_a_named_fallback(demo_paths, caplog):
    with pytest.raises(ProviderFallbackError, match="lists no OpenVINO NPU device"):
        load(str(demo_paths["encoder"]), ["openvino:device_type=NPU", "cpu"], policy="strict")
    with caplog.at_level(logging.WARNING, logger="ortpilot"):
        sess = load(str(demo_paths["encoder"]), ["openvino:device_type=NPU", "cpu"], policy="warn")
    assert sess.providers == [CPU]
    assert sess.fallbacks and sess.fallbacks[0].layer == 2 and "listed: CPU" in sess.fallbacks[0].reason


def test_a_plugin_library_that_is_missing_is_a_named_fallback(demo_paths, tmp_path):
    missing = tmp_path / "libonnxruntime_providers_openvino_plugin.so"
    with pytest.raises(ProviderFallbackError, match="failed to load"):
        load(str(demo_paths["encoder"]), [f"openvino:ep_library={missing}", "cpu"], policy="strict")
    sess = load(str(demo_paths["encoder"]), [f"openvino:ep_library={missing}", "cpu"], policy="allow")
    assert sess.providers == [CPU] and sess.fallbacks[0].layer == 2


def test_a_model_openvino_cannot_compile_falls_back_with_the_reason(silero_vad_path):
    with pytest.raises(ProviderFallbackError):
        load(str(silero_vad_path), ["openvino"], policy="strict")
    sess = load(str(silero_vad_path), ["openvino", "cpu"], policy="allow")
    assert sess.providers == [CPU]
    assert sess.fallbacks[0].requested == OV and sess.fallbacks[0].reason


def test_int8_for_openvino_is_nncfs_qdq_and_keeps_the_answers(demo_paths):
    import onnx

    from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass

    model = onnx.load(str(demo_paths["encoder"]))
    calibration = [make_feeds(model, seed=i) for i in range(8)]
    result = OpenVINOInt8Pass(calibration=calibration).run(model)
    ops = {n.op_type for n in result.model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert "LayerNormalization" in ops  # norms stay in float: NNCF's transformer placement
    assert result.record.quantized_nodes > 0 and result.record.stamp
    feeds = make_feeds(model, seed=99)
    [fp32] = load(model, ["cpu"]).run(None, feeds)
    ov = load(result.model, ["openvino"], policy="strict")
    assert ov.placement.share(OV) == 1.0
    [int8] = ov.run(None, feeds)
    assert _cosine(fp32, int8) > 0.99


@pytest.fixture(scope="module")
def openvino_tune(demo_paths, tmp_path_factory) -> Path:
    """A tune of the demo encoder on OpenVINO alone against ORT's default (which runs on the CPU EP): the
    encoder is 1.4-1.6x faster on OpenVINO on the Intel CPUs measured, so it ships, and its blob with it."""
    from ortpilot import tune

    out = tmp_path_factory.mktemp("ov-tune") / "out"
    tune(str(demo_paths["encoder"]), out_dir=str(out), budget_s=40, providers=["openvino"])
    return out


def test_tune_searches_openvino_and_ships_a_compiled_blob_that_verify_and_load_profile_use(openvino_tune, tmp_path):
    from ortpilot import load_profile

    out = tmp_path / "out"
    shutil.copytree(openvino_tune, out)
    doc = json.loads((out / "profile.json").read_text())
    journal = (out / "journal.jsonl").read_text()
    assert '"pass": "openvino_int8"' in journal or '"pass":"openvino_int8"' in journal  # NNCF's QDQ was tried
    if doc["providers"][0]["name"] != OV:
        pytest.skip(f"OpenVINO did not win on this machine ({doc['providers'][0]['name']} did): nothing to compile")
    assert "OpenVINO won: " in (out / "report.md").read_text()  # which EP won, and by how much
    blob = doc["compiled_model"]
    assert (out / blob["file"]).is_file()
    assert blob["plugin"].startswith("onnxruntime-ep-openvino") and blob["openvino"] and blob["device"] == "CPU"
    sess = load_profile(out / "profile.json")
    assert sess.model_path.name == blob["file"] and sess.providers[0] == OV
    verified = _cli("verify", str(out), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The blob is a file of its own beside the model that names it, hashed in the profile.
    [bin_file] = blob["blobs"]
    assert (out / bin_file["file"]).stat().st_size > (out / blob["file"]).stat().st_size
    # A truncated blob is never run: strict refuses, warn loads (and compiles) the source model.
    good = (out / bin_file["file"]).read_bytes()
    (out / bin_file["file"]).write_bytes(good[: len(good) // 2])
    with pytest.raises(StampMismatchError, match="changed since it was compiled"):
        load_profile(out / "profile.json")
    fallback = load_profile(out / "profile.json", policy="warn")
    assert fallback.model_path.name == "model.onnx" and fallback.providers[0] == OV
    (out / bin_file["file"]).write_bytes(good)
    (out / bin_file["file"]).unlink()
    with pytest.raises(StampMismatchError, match="is missing"):
        load_profile(out / "profile.json")
    (out / bin_file["file"]).write_bytes(good)

    # What serve's replicas load (optimized=True, their own thread count): the compiled model too.
    replica = load_profile(out / "profile.json", optimized=True, intra_op_threads=1)
    assert replica.model_path.name == blob["file"]

    # export triton: Triton's backend takes OpenVINO as its CPU accelerator and compiles itself.
    exported = _cli("export", "triton", str(out / "profile.json"), "-o", str(tmp_path / "repo"))
    assert exported.returncode == 0, exported.stderr
    [model_dir] = [p for p in (tmp_path / "repo").iterdir() if p.is_dir()]
    assert 'name: "openvino"' in (model_dir / "config.pbtxt").read_text()
    assert "**compiled_model**" in (model_dir / "ORTPILOT.md").read_text()

    # A blob from another OpenVINO: refused naming both versions.
    other = tmp_path / "other"
    shutil.copytree(out, other)
    edited = json.loads((other / "profile.json").read_text())
    edited["compiled_model"]["openvino"] = "2025.4.0"
    (other / "profile.json").write_text(json.dumps(edited))
    with pytest.raises(StampMismatchError, match=r"openvino 2025\.4\.0.*this environment has " + blob["openvino"]):
        load_profile(other / "profile.json")


def test_quantize_mode_openvino_writes_nncfs_model_gated_on_openvino(demo_paths, tmp_path):
    import onnx

    out = tmp_path / "encoder.int8-openvino.onnx"
    done = _cli(
        "quantize", str(demo_paths["encoder"]), "-o", str(out), "--mode", "openvino", "--max-error", "0.01", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["gate"]["passed"] and report["record"]["name"] == "openvino-int8"
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "LayerNormalization"} <= ops


def test_serve_replicas_run_the_profile_on_openvino(openvino_tune, tmp_path):
    """A real `ortpilot serve` of the OpenVINO profile on 127.0.0.1, one KServe v2 request, stopped by its PID."""
    import signal
    import socket
    import time
    import urllib.request

    pytest.importorskip("ray.serve", reason="the serve extra is not installed here")
    from ortpilot.tuning.reference import read_reference

    doc = json.loads((openvino_tune / "profile.json").read_text())
    if doc["providers"][0]["name"] != OV:
        pytest.skip("OpenVINO did not win the tune on this machine")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "serve.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ortpilot.cli.main",
                "serve",
                str(openvino_tune / "profile.json"),
                "--port",
                str(port),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 180
        while "\ningress: " not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        text = log.read_text()
        assert "replica ready on OpenVINOExecutionProvider" in text, text[-3000:]
        inputs, outputs = read_reference(openvino_tune / doc["reference_outputs"]["file"])
        body = {
            "inputs": [
                {"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.ravel().tolist()}
                for k, v in inputs.items()
            ]
        }
        name = re.search(r"^([\w.-]+): 1 replica ready on OpenVINOExecutionProvider", text, re.M).group(1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/models/{name}/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        for out in answer["outputs"]:
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
            assert np.array_equal(got, outputs[out["name"]])  # the tune's reference, bit for bit
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
