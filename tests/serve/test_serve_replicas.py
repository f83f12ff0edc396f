"""Replica lifecycle: a killed replica comes back verified, a failing one never takes traffic,
batching stacks requests, and the CLI's start and stop (local Ray, exit codes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")
from serve_procs import Server, free_port
from tritonclient.utils import InferenceServerException

import ortpilot
from ortpilot.graph.feeds import make_feeds


def _inputs(feeds):
    items = []
    for name, value in feeds.items():
        item = th.InferInput(name, list(value.shape), "INT64" if value.dtype == np.int64 else "FP32")
        item.set_data_from_numpy(value)
        items.append(item)
    return items


def _replicas(server, name):
    return th.InferenceServerClient(server.url).get_model_metadata(name)["ortpilot"]["replicas"]


def test_a_replica_killed_mid_request_gives_5xx_and_comes_back_verified(start_server, ray_address, tuned_encoder):
    server = start_server(str(tuned_encoder), "--name", "m", "--address", ray_address)
    assert server.ready, server.stderr[-3000:]
    sess = ortpilot.load_profile(tuned_encoder / "profile.json")
    (before,) = _replicas(server, "m")
    # A large batch keeps the replica busy long enough to be killed while it runs.
    big = make_feeds(sess.model, dict.fromkeys((i.name for i in sess.inputs), (64, 512)), seed=1)
    errors: list[BaseException] = []

    def request() -> None:
        try:
            th.InferenceServerClient(server.url, network_timeout=120).infer("m", _inputs(big))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    time.sleep(0.5)
    os.kill(before["pid"], signal.SIGKILL)
    thread.join(120)
    assert errors and isinstance(errors[0], InferenceServerException), errors
    assert errors[0].status().startswith("5") and "Ray restarts it" in str(errors[0])
    deadline = time.monotonic() + 180
    after = []
    while time.monotonic() < deadline:
        after = [r for r in _replicas(server, "m") if r["replica"] != before["replica"]]
        if after:
            break
        time.sleep(0.5)
    assert (
        after and after[0]["verified"] and after[0]["verification"] == "bit-exact" and after[0]["pid"] != before["pid"]
    )
    feeds = make_feeds(sess.model, seed=2)
    result = th.InferenceServerClient(server.url).infer("m", _inputs(feeds))
    assert result.as_numpy(sess.get_outputs()[0].name).tobytes() == sess.run(None, feeds)[0].tobytes()


def test_a_replica_that_fails_verification_never_serves_and_serve_exits_1_saying_why(
    start_server, ray_address, tuned_encoder, tmp_path
):
    broken = tmp_path / "broken"
    shutil.copytree(tuned_encoder, broken)
    doc = json.loads((broken / "profile.json").read_text())
    doc["reference_outputs"]["sha256"] = dict.fromkeys(doc["reference_outputs"]["sha256"], "0" * 64)
    (broken / "profile.json").write_text(json.dumps(doc))
    server = start_server(str(broken), "--name", "bad", "--address", ray_address, "--ready-timeout", "120")
    assert server.proc.wait(180) == 1
    assert not server.ready
    err = " ".join(server.stderr.split())
    assert "No replica of model 'bad' became ready" in err and "does not reproduce its reference outputs" in err


def test_dynamic_batching_stacks_concurrent_requests_and_splits_results(start_server, ray_address, demo_paths):
    server = start_server(
        str(demo_paths["encoder"]),
        "demo:cnn",
        "--name",
        "enc",
        "--name",
        "cnn",
        "--address",
        ray_address,
        "--max-batch",
        "8",
        "--batch-wait-ms",
        "50",
        "--cpus-per-replica",
        "1",
    )
    assert server.ready, server.stderr[-3000:]
    client = th.InferenceServerClient(server.url, concurrency=16)
    meta = client.get_model_metadata("enc")
    assert meta["ortpilot"]["batching"] == {"max_batch": 8, "wait_ms": 50.0}
    sess = ortpilot.load(str(demo_paths["encoder"]), ["cpu"], "strict")
    requests = [make_feeds(sess.model, seed=s) for s in range(16)]
    before = _batch_counts(server, "enc")
    pending = [client.async_infer("enc", _inputs(feeds)) for feeds in requests]
    results = [p.get_result() for p in pending]
    name = sess.get_outputs()[0].name
    for feeds, result in zip(requests, results):
        np.testing.assert_allclose(result.as_numpy(name), sess.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    runs, rows = (a - b for a, b in zip(_batch_counts(server, "enc"), before))
    assert rows == 16 and runs < 16  # some runs held more than one request
    cnn = client.get_model_metadata("cnn")
    has_batch = all(i["shape"][0] == -1 for i in cnn["inputs"])
    assert (cnn["ortpilot"]["batching"] is not None) == has_batch


def _batch_counts(server, model):
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return (
        float(values[f'ortpilot_batch_size_count{{model="{model}"}}']),
        float(values[f'ortpilot_batch_size_sum{{model="{model}"}}']),
    )


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def test_without_address_serve_starts_a_local_ray_and_sigterm_stops_all_of_it(tmp_path):
    server = Server(["demo:mlp"], free_port(), tmp_path / "serve.err")
    try:
        assert server.ready and server.ready[0].startswith("mlp: 1 replica ready"), server.stderr[-3000:]
        started = _descendants(server.proc.pid)
        assert started  # Ray's processes (gcs, raylet, workers) are this command's children
    finally:
        code = server.stop()
    assert code == 0, server.stderr[-3000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in started):
        time.sleep(0.5)
    alive = [
        p for p in started if Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"
    ]
    assert not alive, f"left running: {alive}"


def test_a_port_in_use_exits_2_before_ray_starts(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        import subprocess

        from serve_procs import CLI, RAY_ENV

        proc = subprocess.run(
            [*CLI, "serve", "demo:mlp", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **RAY_ENV},
        )
    assert proc.returncode == 2 and f"Port {port}" in proc.stderr and "not free" in proc.stderr
    assert "Ray" not in proc.stderr.split("error:")[0]  # nothing started before the message


def test_a_profile_that_cannot_load_exits_naming_it(tmp_path, tuned_encoder):
    import subprocess

    from serve_procs import CLI, RAY_ENV

    changed = tmp_path / "changed"
    shutil.copytree(tuned_encoder, changed)
    with open(changed / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    proc = subprocess.run(
        [*CLI, "serve", str(changed), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **RAY_ENV},
    )
    assert proc.returncode == 1 and "changed since it was tuned" in proc.stderr and str(changed) in proc.stderr
    proc = subprocess.run(
        [*CLI, "serve", str(tmp_path / "nowhere"), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **RAY_ENV},
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr
