"""Replica lifecycle: a killed replica comes back verified, a failing one never takes traffic,
batching stacks requests, and the CLI's start and stop (local Ray, exit codes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")
from listeners import descendants as _descendants
from listeners import open_ports as _open_ports
from serve_procs import GRPC_RETRY_CHANNEL_ARGS, Server, free_port

import ortpilot
from ortpilot.graph.feeds import make_feeds


def _input(module, name, value):
    item = module.InferInput(name, list(value.shape), "INT64" if value.dtype == np.int64 else "FP32")
    item.set_data_from_numpy(value)
    return item


def _inputs(feeds):
    return [_input(th, name, value) for name, value in feeds.items()]


def _replicas(server, name):
    return th.InferenceServerClient(server.url).get_model_metadata(name)["ortpilot"]["replicas"]


@pytest.mark.alone  # beside another xdist worker it lost 1 request of several hundred in 2 of 3 runs (issue 37 notes)
def test_no_request_is_lost_when_one_of_two_replicas_is_killed_under_load(start_server, ray_address, written_encoder):
    """8 clients back to back with heavy requests (bodies small enough for HAProxy to replay), REST and gRPC
    (with the retry policy the docs give gRPC clients); one of the two replicas is SIGKILLed with requests in
    flight: every request answers right."""
    tg = pytest.importorskip("tritonclient.grpc")
    grpc_port = free_port()
    server = start_server(
        str(written_encoder),
        *("--name", "m", "--address", ray_address, "--debug-info", "--grpc-port", str(grpc_port)),
        *("--replicas", "2", "--cpus-per-replica", "1"),
    )
    assert server.ready, server.stderr[-3000:]
    sess = ortpilot.load_profile(written_encoder / "profile.json")
    before = _replicas(server, "m")
    assert len(before) == 2 and len({r["pid"] for r in before}) == 2
    feeds = make_feeds(sess.model, dict.fromkeys((i.name for i in sess.inputs), (16, 512)), seed=1)
    expected = sess.run(None, feeds)[0].tobytes()
    output = sess.get_outputs()[0].name
    outcomes: list[tuple[float, float, object]] = []
    done = threading.Event()

    def requests(grpc: str) -> None:
        client = (
            tg.InferenceServerClient(f"127.0.0.1:{grpc_port}", channel_args=GRPC_RETRY_CHANNEL_ARGS)
            if grpc
            else th.InferenceServerClient(server.url, network_timeout=180)
        )
        inputs = [_input(tg if grpc else th, name, value) for name, value in feeds.items()]
        while not done.is_set():
            started = time.monotonic()
            try:
                got = client.infer("m", inputs, headers={"application": "m"} if grpc == "one hop" else None)
                outcomes.append((started, time.monotonic(), got.as_numpy(output).tobytes() == expected))
            except BaseException as exc:
                outcomes.append((started, time.monotonic(), f"{grpc or 'REST'}: {type(exc).__name__} {exc}"))

    kinds = ["", "", "", "", "", "one hop", "one hop", "relayed"]  # REST, gRPC to the model, gRPC via the server app
    threads = [threading.Thread(target=requests, args=(kind,)) for kind in kinds]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    killed = time.monotonic()
    os.kill(before[0]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 180
    after = []
    while time.monotonic() < deadline:
        after = [r for r in _replicas(server, "m") if r["replica"] not in {b["replica"] for b in before}]
        if after:
            break
        time.sleep(0.5)
    time.sleep(1.0)
    done.set()
    for thread in threads:
        thread.join(200)
    assert after and after[0]["verified"] and after[0]["verification"] == "bit-exact"
    assert after[0]["pid"] not in {b["pid"] for b in before}
    failed = [o for o in outcomes if o[2] is not True]
    assert outcomes and not failed, [(round(s - killed, 3), round(e - killed, 3), o) for s, e, o in failed[:5]]
    assert sum(s < killed < e for s, e, _ in outcomes) >= 2, "too few requests were in flight at the kill"


def _haproxy_admin(grpc_port: int) -> str:
    """The admin socket of the HAProxy that publishes ``grpc_port`` (found from its command line and config,
    which Ray rewrites on every reload)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes().split(b"\0")
                config = args[args.index(b"-f") + 1].decode() if args[0].endswith(b"haproxy") else ""
                text = Path(config).read_text() if config else ""
            except (OSError, ValueError, IndexError):
                continue
            if f":{grpc_port} proto h2" in text and "stats socket " in text:
                return text.split("stats socket ", 1)[1].split()[0]
        time.sleep(0.5)
    raise AssertionError(f"no HAProxy publishes port {grpc_port}")


def _haproxy_command(admin: str, command: str) -> str:
    """One command on HAProxy's runtime API (its admin socket), its whole answer."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(admin)
        sock.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: sock.recv(65536), b"")).decode()


def _servers(admin: str, backend: str) -> dict[str, dict[str, str]]:
    """Server name -> its ``show stat`` row (``bck``: a backup, ``stot``: sessions so far) in one backend."""
    lines = _haproxy_command(admin, "show stat").splitlines()
    fields = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(fields, line.split(","), strict=False)) for line in lines[1:] if line]
    return {r["svname"]: r for r in rows if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")}


def test_a_grpc_call_without_application_is_answered_while_haproxy_has_no_replica_up(
    start_server, ray_address, written_encoder
):
    """With no replica of the model up in HAProxy's view (killed, busy past its health checks), HAProxy hands
    gRPC calls to its backup, Ray's fallback proxy, which refused a call that names no application as soon
    as two applications exist (the model's and the server-wide one): the call must still be answered."""
    tg = pytest.importorskip("tritonclient.grpc")
    grpc_port = free_port()
    server = start_server(
        str(written_encoder), *("--name", "m", "--address", ray_address, "--grpc-port", str(grpc_port))
    )
    assert server.ready, server.stderr[-3000:]
    admin = _haproxy_admin(grpc_port)
    deadline = time.monotonic() + 60
    while True:  # HAProxy learns a replica's gRPC port on a reload of its own; until then the backup answers
        servers = _servers(admin, "grpc-m")
        replicas = [name for name, row in servers.items() if row["bck"] == "0"]
        if replicas or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    (backup,) = (name for name, row in servers.items() if row["bck"] == "1")
    assert replicas, servers
    for name in replicas:  # as HAProxy sees it: no replica of the model is up
        assert _haproxy_command(admin, f"set server grpc-m/{name} state maint").strip() == ""
    sess = ortpilot.load_profile(written_encoder / "profile.json")
    feeds = make_feeds(sess.model, seed=2)
    expected = sess.run(None, feeds)[0].tobytes()
    output = sess.get_outputs()[0].name
    client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    inputs = [_input(tg, name, value) for name, value in feeds.items()]
    taken = int(_servers(admin, "grpc-m")[backup]["stot"])
    for headers in (None, {"application": "m"}):
        assert client.infer("m", inputs, headers=headers).as_numpy(output).tobytes() == expected, headers
    assert int(_servers(admin, "grpc-m")[backup]["stot"]) == taken + 2  # both went the backup's way


# The one-model case is a variant kept out of CI's time (slow); the relay with several models is what failed.
@pytest.mark.parametrize("models", [pytest.param(("m",), marks=pytest.mark.slow), ("m", "mlp")])
def test_on_the_classic_proxy_a_grpc_call_without_application_is_answered(
    start_server, ray_address, written_encoder, demo_paths, models
):
    """``--ingress proxy`` (also the path without an HAProxy binary): Ray's proxy routes gRPC by ``application``
    metadata and, with a model's app and the server-wide one, refused a call without it; serve never became
    ready. A call naming none goes to the one model, or with several to the server-wide app, which relays it."""
    tg = pytest.importorskip("tritonclient.grpc")
    grpc_port = free_port()
    profiles = [str(written_encoder), str(demo_paths["mlp"])][: len(models)]
    names = [arg for name in models for arg in ("--name", name)]
    server = start_server(
        *profiles, *names, *("--address", ray_address, "--ingress", "proxy", "--grpc-port", str(grpc_port))
    )
    assert server.ready, server.stderr[-3000:]
    assert "the classic Serve proxy takes requests" in server.ingress
    client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    for name, profile in zip(models, profiles, strict=True):
        sess = (
            ortpilot.load_profile(written_encoder / "profile.json") if name == "m" else ortpilot.load(profile, ["cpu"])
        )
        feeds = make_feeds(sess.model, seed=4)
        expected = sess.run(None, feeds)[0].tobytes()
        inputs = [_input(tg, key, value) for key, value in feeds.items()]
        for headers in (None, {"application": name}):
            got = client.infer(name, inputs, headers=headers)
            assert got.as_numpy(sess.get_outputs()[0].name).tobytes() == expected, (name, headers)


@pytest.mark.slow  # a full-run variant: the choice itself is pinned by test_serve_haproxy_unit.py
def test_an_ipv6_loopback_host_is_served_through_the_classic_proxy(start_server, ray_address, demo_paths):
    """Through Ray's HAProxy every request to a server on ``--host ::1`` was a 503 and serve never became ready."""
    server = start_server(str(demo_paths["mlp"]), "--name", "mlp", "--address", ray_address, "--host", "::1")
    assert server.ready, server.stderr[-3000:]
    assert "--host ::1 is an IPv6 address" in server.ingress and "Ray Serve proxy" in server.ingress
    with urllib.request.urlopen(f"http://[::1]:{server.port}/v2/models/mlp/ready", timeout=30) as resp:
        assert resp.status == 200


def test_a_replica_that_fails_verification_never_serves_and_serve_exits_1_saying_why(
    start_server, ray_address, written_encoder, tmp_path
):
    broken = tmp_path / "broken"
    shutil.copytree(written_encoder, broken)
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


def test_without_address_serve_starts_a_local_ray_on_loopback_shares_its_cpus_and_sigterm_stops_all_of_it(tmp_path):
    """Three claims about the Ray instance ``serve`` starts itself, checked on one start of it: every port Ray, Serve
    and HAProxy open is on 127.0.0.1; one model more than the CPU budget gets every replica a fraction of a CPU and
    one intra-op thread, so all of them are scheduled at once and ready within a short --ready-timeout (with a whole
    CPU each, the last one waited for a CPU that never came free); one SIGTERM drains and stops all of it."""
    from ortpilot.providers.cpubudget import this_budget
    from ortpilot.serve.options import cpu_share

    budget = this_budget().cpus
    names = [f"m{i}" for i in range(budget + 1)] if budget <= 3 else ["m0"]  # more would start too many here
    grpc_port = free_port()
    args = ["demo:mlp"] * len(names) + [a for name in names for a in ("--name", name)]
    server = Server([*args, "--grpc-port", str(grpc_port), "--ready-timeout", "90"], free_port(), tmp_path / "s.err")
    try:
        assert len(server.ready) == len(names), server.stderr[-3000:]
        assert sorted(line.split(": 1 replica ready")[0] for line in server.ready) == names, server.ready
        if len(names) > budget:
            for name in names:
                with urllib.request.urlopen(f"http://{server.url}/v2/models/{name}", timeout=30) as resp:
                    (replica,) = json.loads(resp.read())["ortpilot"]["replicas"]
                assert replica["cpus"] == cpu_share(budget, len(names)) < 1 and replica["intra_op_threads"] == 1
        started = _descendants(server.proc.pid)
        assert started  # Ray's processes (gcs, raylet, workers, HAProxy) are this command's children
        ports = _open_ports(started | {server.proc.pid})
        # Every port Ray, Serve and HAProxy open (gRPC too) is on 127.0.0.1, none on another interface.
        assert {server.port, grpc_port} <= {port for _p, _a, port in ports}, ports
        assert all(address == "127.0.0.1" for _p, address, _port in ports), ports
        # SIGTERM drains: 200 while the model's replica still serves, then 503 + Retry-After, then closed.
        os.kill(server.proc.pid, signal.SIGTERM)
        seen: list[tuple] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{server.url}/v2/models/m0/ready", timeout=10) as resp:
                    seen.append((resp.status, None))
            except urllib.error.HTTPError as exc:
                seen.append((exc.code, exc.headers.get("Retry-After")))
            except (urllib.error.URLError, ConnectionError):
                break
            time.sleep(0.02)
        assert (503, "1") in seen and set(seen) <= {(200, None), (503, "1")}, sorted(set(seen))
        server.proc.wait(90)  # the one SIGTERM stops it: no second signal
    finally:
        code = server.stop()
    assert code == 0, server.log.read_text(errors="replace")[-3000:]
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

        from serve_procs import CLI, cli_env

        proc = subprocess.run(
            [*CLI, "serve", "demo:mlp", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            env=cli_env(),
        )
    assert proc.returncode == 2 and f"Port {port}" in proc.stderr and "not free" in proc.stderr
    assert "Ray" not in proc.stderr.split("error:")[0]  # nothing started before the message


def test_cpus_per_replica_that_does_not_fit_exits_2_before_ray_starts():
    import subprocess

    from serve_procs import CLI, cli_env

    from ortpilot.providers.cpubudget import this_budget

    budget = this_budget().cpus
    proc = subprocess.run(
        [*CLI, "serve", "demo:mlp", "demo:mlp", "--name", "a", "--name", "b"]
        + ["--cpus-per-replica", str(budget), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = " ".join(proc.stderr.split())
    assert f"for {2 * budget} CPUs" in message and "only 1 would start now" in message, message
    assert "Leave --cpus-per-replica out" in message and "Ray" not in message.split("error:")[0]


def test_a_profile_that_cannot_load_exits_naming_it(tmp_path, written_encoder):
    import subprocess

    from serve_procs import CLI, cli_env

    changed = tmp_path / "changed"
    shutil.copytree(written_encoder, changed)
    with open(changed / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    proc = subprocess.run(
        [*CLI, "serve", str(changed), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert proc.returncode == 1 and "changed since it was tuned" in proc.stderr and str(changed) in proc.stderr
    proc = subprocess.run(
        [*CLI, "serve", str(tmp_path / "nowhere"), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


LEFTOVER = """
import json, sys, time
import ray
from ray.serve._private.constants import SERVE_NAMESPACE
from ortpilot.serve.runner import end_serve_leftovers

ray.init(address=sys.argv[1], namespace="test-leftovers", log_to_driver=False)

@ray.remote(num_cpus=1)
class Stuck:
    def ping(self):
        return 1

actor = Stuck.options(name="SERVE_REPLICA::gone#model-gone#x", namespace=SERVE_NAMESPACE, lifetime="detached").remote()
ray.get(actor.ping.remote())

def cpus(until):  # Ray's resource view lags the actor's start and end by a report period
    deadline = time.monotonic() + 20
    while not until(free := ray.available_resources().get("CPU", 0)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return free

held = cpus(lambda free: free <= ray.cluster_resources()["CPU"] - 1)
killed = end_serve_leftovers(wait_s=0.5)
print(json.dumps({"killed": killed, "held": held, "after": cpus(lambda free: free > held)}))
"""


def test_what_serve_left_after_shutdown_is_ended_and_its_cpus_freed(ray_address):
    """``serve.shutdown`` returns after 30 s while its controller may still be deleting replicas: a detached
    actor left in Serve's namespace is killed (``end_serve_leftovers``), so the next server on the cluster
    gets its CPUs back instead of waiting forever for a placement."""
    import subprocess
    import sys

    from serve_procs import RAY_ENV

    env = {**os.environ, **RAY_ENV}  # a plain Ray driver on loopback: Ray's single-machine mode
    out = subprocess.run(
        [sys.executable, "-c", LEFTOVER, ray_address], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["killed"] == ["SERVE_REPLICA::gone#model-gone#x"], found
    assert found["after"] == found["held"] + 1, found


PORT_TAKEN = """
import json, socket, sys
import ray
from ray.serve._private.constants import SERVE_NAMESPACE
from ortpilot.errors import UsageError
from ortpilot.serve.options import ServerOptions
from ortpilot.serve.runner import serve_until_stopped

held = socket.socket()  # taken after the CLI's port check would have passed: Ray's proxy cannot bind it
held.bind(("127.0.0.1", 0))
held.listen()
port = held.getsockname()[1]
try:
    serve_until_stopped(lambda cpus: [], lambda errors, stop: None, ServerOptions(port=port, address=sys.argv[1], ingress=sys.argv[2]))
    message = ""
except UsageError as exc:
    message = str(exc)
left = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == SERVE_NAMESPACE]
print(json.dumps({"port": port, "message": message, "left": left}))
"""


# Ray's classic proxy is a variant kept out of CI's time (slow); the default path (HAProxy) runs everywhere.
@pytest.mark.parametrize("ingress", [pytest.param("proxy", marks=pytest.mark.slow), "auto"])
def test_a_port_taken_while_serve_starts_is_named_and_serve_is_stopped_again(
    ray_address, start_server, demo_paths, ingress
):
    """A port free at the CLI's check and taken before Ray's proxy (or HAProxy, on the fast path) binds it
    (CI once: another process got it in those seconds) is a one-paragraph error naming the flag, and the Serve that ``serve.start`` left
    half-started is stopped: the next server on the shared cluster then starts its own Serve on its own
    port instead of joining the broken one."""
    import subprocess
    import sys

    from serve_procs import cli_env

    out = subprocess.run(
        [sys.executable, "-c", PORT_TAKEN, ray_address, ingress],
        capture_output=True,
        text=True,
        timeout=240,
        env=cli_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert f"could not listen on 127.0.0.1:{found['port']} (--port {found['port']})" in found["message"], found
    assert "choose another --port" in found["message"], found
    assert found["left"] == [], found
    server = start_server(str(demo_paths["mlp"]), "--address", ray_address, "--ingress", ingress)
    assert server.ready, server.stderr[-3000:]


OWN_PORT_TAKEN = """
import json, socket, sys
from ortpilot.serve import fastpath
from ortpilot.serve.options import ServerOptions
from ortpilot.serve.runner import http_get, serve_until_stopped

held = socket.socket()
held.bind(("127.0.0.1", 0))
held.listen()
pick, picked = fastpath.free_port, []

def third_taken(host="127.0.0.1"):  # the fast path's third pick: Ray's fallback HTTP proxy
    picked.append(pick(host))
    return held.getsockname()[1] if len(picked) == 3 else picked[-1]

fastpath.free_port = third_taken
port = pick()

def answer(errors, stop):
    stop.set()
    return http_get(f"http://127.0.0.1:{port}/-/healthz")[0]

status = serve_until_stopped(lambda cpus: [], answer, ServerOptions(port=port, address=sys.argv[1], ingress="auto"))
print(json.dumps({"status": status, "picks": len(picked)}))
"""


def test_a_port_ortpilot_picked_that_is_taken_before_serve_binds_it_is_picked_again(ray_address):
    """The fast path's own ports (Ray's fallback proxy, HAProxy's stats) are no user's choice: one taken
    between its pick and its bind makes ``serve`` start Serve again on new ones, not exit."""
    import subprocess
    import sys

    from serve_procs import cli_env

    out = subprocess.run(
        [sys.executable, "-c", OWN_PORT_TAKEN, ray_address], capture_output=True, text=True, timeout=240, env=cli_env()
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    restarts = out.stderr.count("was taken before Serve bound it; starting Serve again on other ports")
    assert restarts >= 1, out.stderr[-3000:]
    # four ports a start: two starts, or one more where another process (a test beside it) took a port it picked
    # too (a local run read 12 picks: three starts, each said)
    assert found["picks"] == 4 * (restarts + 1), (found, restarts)
    assert found["status"] == 503, found  # HAProxy answers on the second start: up, no model deployed
