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


def test_a_request_in_flight_on_a_killed_replica_is_retried_and_the_replica_comes_back_verified(
    start_server, ray_address, tuned_encoder
):
    server = start_server(str(tuned_encoder), "--name", "m", "--address", ray_address, "--debug-info")
    assert server.ready, server.stderr[-3000:]
    sess = ortpilot.load_profile(tuned_encoder / "profile.json")
    (before,) = _replicas(server, "m")
    # Requests back to back (bodies small enough for HAProxy to replay), so one is in flight at the kill.
    feeds = make_feeds(sess.model, dict.fromkeys((i.name for i in sess.inputs), (16, 512)), seed=1)
    expected = sess.run(None, feeds)[0].tobytes()
    outcomes: list[tuple[float, float, object]] = []
    done = threading.Event()

    def requests() -> None:
        client = th.InferenceServerClient(server.url, network_timeout=180)
        while not done.is_set():
            started = time.monotonic()
            try:
                got = client.infer("m", _inputs(feeds)).as_numpy(sess.get_outputs()[0].name).tobytes()
                outcomes.append((started, time.monotonic(), got == expected))
            except BaseException as exc:
                outcomes.append((started, time.monotonic(), exc))

    thread = threading.Thread(target=requests)
    thread.start()
    time.sleep(2.0)
    killed = time.monotonic()
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 180
    after = []
    while time.monotonic() < deadline:
        after = [r for r in _replicas(server, "m") if r["replica"] != before["replica"]]
        if after:
            break
        time.sleep(0.5)
    time.sleep(1.0)
    done.set()
    thread.join(200)
    assert (
        after and after[0]["verified"] and after[0]["verification"] == "bit-exact" and after[0]["pid"] != before["pid"]
    )
    assert outcomes and all(ok is True for _s, _e, ok in outcomes), [o for o in outcomes if o[2] is not True]
    assert any(s < killed < e for s, e, _ in outcomes), "no request was in flight when the replica was killed"


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
    runs, rows = (a - b for a, b in zip(_batch_counts(server, "enc", before[1] + 16), before))
    assert rows == 16 and runs < 16  # some runs held more than one request
    cnn = client.get_model_metadata("cnn")
    has_batch = all(i["shape"][0] == -1 for i in cnn["inputs"])
    assert (cnn["ortpilot"]["batching"] is not None) == has_batch


def _batch_counts(server, model, rows_at_least: float = 0.0, timeout: float = 20.0):
    """(runs, rows) of the model's batch histogram, once its rows reached ``rows_at_least`` (replicas report
    their counts every heartbeat)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        runs = float(values[f'ortpilot_batch_size_count{{model="{model}"}}'])
        rows = float(values[f'ortpilot_batch_size_sum{{model="{model}"}}'])
        if rows >= rows_at_least or time.monotonic() > deadline:
            return runs, rows
        time.sleep(0.5)


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
