"""``ortpilot serve`` over the Open Inference Protocol, with tritonclient.http as the real client.

One server for the module: the tuned demo encoder as ``m`` (a real profile, verified bit for bit)
and the demo MLP, joined to the session's Ray instance.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException

import ortpilot
from ortpilot.graph.feeds import make_feeds


@pytest.fixture(scope="module")
def server(start_module_server, ray_address, written_encoder):
    srv = start_module_server(
        str(written_encoder / "profile.json"),
        "demo:mlp",
        "--name",
        "m",
        "--name",
        "mlp",
        "--address",
        ray_address,
        "--max-request-mb",
        "1",
    )
    assert srv.ready, srv.stderr[-3000:]
    return srv


@pytest.fixture(scope="module")
def reference(written_encoder):
    sess = ortpilot.load_profile(written_encoder / "profile.json")
    return sess, make_feeds(sess.model, seed=3)


def _inputs(feeds, binary=True):
    items = []
    for name, value in feeds.items():
        item = th.InferInput(name, list(value.shape), "INT64" if value.dtype == np.int64 else "FP32")
        item.set_data_from_numpy(value, binary_data=binary)
        items.append(item)
    return items


def _post(url, body, headers=None):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_ready_lines_name_the_model_replicas_providers_url_and_cold_start(server):
    line = next(ln for ln in server.ready if ln.startswith("m:"))
    assert re.search(
        r"m: 1 replica ready on CPUExecutionProvider, http://127\.0\.0\.1:\d+/v2/models/m "
        r"\(cold start \d+\.\d s\)",
        line,
    ), line
    assert any(ln.startswith("mlp:") and "outputs not checked" in ln for ln in server.ready), server.ready


@pytest.mark.parametrize("binary", [True, False], ids=["binary-tensors", "json-tensors"])
def test_tritonclient_infer_gives_load_profile_outputs_bit_for_bit(server, reference, binary):
    sess, feeds = reference
    client = th.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("m")
    outputs = [th.InferRequestedOutput(o.name, binary_data=binary) for o in sess.get_outputs()]
    result = client.infer("m", _inputs(feeds, binary), outputs=outputs)
    expected = sess.run(None, feeds)
    for out, want in zip(sess.get_outputs(), expected):
        got = result.as_numpy(out.name)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_model_metadata_has_datatypes_shapes_and_each_replicas_providers_and_placement(server, written_encoder):
    client = th.InferenceServerClient(server.url)
    meta = client.get_model_metadata("m")
    assert [i["datatype"] for i in meta["inputs"]] == ["INT64"] * len(meta["inputs"])
    assert all(i["shape"][0] == -1 for i in meta["inputs"])
    assert meta["outputs"][0]["datatype"] == "FP32" and meta["outputs"][0]["shape"][-1] > 0
    (replica,) = meta["ortpilot"]["replicas"]
    assert replica["providers"][0] == "CPUExecutionProvider"
    assert replica["placement_share"] == {"CPUExecutionProvider": 1.0}
    assert replica["verification"] == "bit-exact" and replica["verified"] is True
    profile = json.loads((written_encoder / "profile.json").read_text())
    assert replica["profile_intra_op_threads"] == profile["session_settings"]["intra_op_threads"]
    assert replica["intra_op_threads"] == int(replica["cpus"])
    if replica["intra_op_threads"] != replica["profile_intra_op_threads"]:
        assert "the profile was tuned with" in replica["threads_note"]


def test_unknown_model_is_404_naming_the_served_ones(server):
    client = th.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert "Unknown model 'nope'" in str(info.value) and "m, mlp" in str(info.value)
    status, body = _post(f"http://{server.url}/v2/models/nope/infer", b'{"inputs": []}')
    assert status == 404 and b"m, mlp" in body


def _library_message(sess, feeds):
    with pytest.raises(ortpilot.InputError) as info:
        sess.check_feeds(feeds)
    return str(info.value)


def test_bad_requests_get_400_with_the_librarys_message_and_the_replica_stays_up(server, reference):
    sess, feeds = reference
    client = th.InferenceServerClient(server.url)
    name = next(iter(feeds))
    cases = {
        "missing": {k: v for k, v in feeds.items() if k != name},
        "extra": {**feeds, "bogus": np.zeros((1, 2), np.int64)},
        "dtype": {**feeds, name: feeds[name].astype(np.float32)},
        "rank": {**feeds, name: feeds[name][0]},
    }
    for case, bad in cases.items():
        with pytest.raises(InferenceServerException) as info:
            client.infer("m", _inputs(bad))
        assert info.value.status() == "400", case
        assert _library_message(sess, bad) in str(info.value), case
    status, body = _post(f"http://{server.url}/v2/models/m/infer", b"{not json")
    assert status == 400 and b"not valid JSON" in body
    status, body = _post(
        f"http://{server.url}/v2/models/m/infer",
        json.dumps({"inputs": [{"name": name, "shape": [1, 3], "datatype": "INT64", "data": [1, 2]}]}).encode(),
    )
    assert status == 400 and b"has 2 values, but shape [1, 3] needs 3" in body
    result = client.infer("m", _inputs(feeds))  # still up, still right
    assert result.as_numpy(sess.get_outputs()[0].name).tobytes() == sess.run(None, feeds)[0].tobytes()


def test_a_body_over_max_request_mb_is_413(server):
    big = json.dumps(
        {"inputs": [{"name": "x", "shape": [300000], "datatype": "FP32", "data": [0.5] * 300000}]}
    ).encode()
    assert len(big) > 1024 * 1024
    status, body = _post(f"http://{server.url}/v2/models/m/infer", big)
    assert status == 413 and b"--max-request-mb" in body


def test_metrics_count_requests_batches_verified_replicas_and_placement(server, reference):
    _sess, feeds = reference
    client = th.InferenceServerClient(server.url)
    ok = 'ortpilot_requests_total{code="200",model="m"}'
    bad = 'ortpilot_requests_total{code="400",model="m"}'
    seconds = 'ortpilot_request_seconds_count{model="m"}'
    batches = 'ortpilot_batch_size_count{model="m"}'
    before = _settled_metrics(server)
    for _ in range(3):
        client.infer("m", _inputs(feeds))
    with pytest.raises(InferenceServerException):
        client.infer("m", _inputs(dict(list(feeds.items())[1:])))
    after = _settled_metrics(server, lambda m: m.get(seconds, 0) - before.get(seconds, 0) >= 4)
    assert after[ok] - before.get(ok, 0) == 3
    assert after[bad] - before.get(bad, 0) == 1
    assert after[seconds] - before.get(seconds, 0) == 4
    assert after[batches] - before.get(batches, 0) == 3
    assert after['ortpilot_replica_verified{model="m"}'] == 1
    assert after['ortpilot_replica_verified{model="mlp"}'] == 1
    assert after['ortpilot_placement_share{model="m",provider="CPUExecutionProvider"}'] == 1.0


def test_metrics_count_what_the_server_answers_itself(server):
    key = 'ortpilot_requests_total{code="404",model="(unknown)"}'
    before = _settled_metrics(server)
    status, _ = _post(f"http://{server.url}/v2/models/nope/infer", b'{"inputs": []}')
    assert status == 404
    after = _settled_metrics(server, lambda m: m.get(key, 0) > before.get(key, 0))
    assert after[key] - before.get(key, 0) == 1


def test_access_log_has_one_line_per_request_without_payloads(server, reference):
    _sess, feeds = reference
    client = th.InferenceServerClient(server.url)
    marker = np.full_like(next(iter(feeds.values())), 7)
    client.infer("m", _inputs({**feeds, next(iter(feeds)): marker}))
    # The replica writes the line; Ray's log monitor forwards it to the server's stderr a moment later.
    deadline = time.monotonic() + 20
    while not (lines := [ln for ln in server.stderr.splitlines() if '"POST /v2/models/m/infer"' in ln]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert lines and all(re.search(r'"POST /v2/models/m/infer" \d{3} \d+ \d+\.\dms$', ln) for ln in lines)
    assert not any("7, 7" in ln or "data" in ln for ln in lines)


def _settled_metrics(server, until=None, timeout: float = 20.0) -> dict[str, float]:
    """/metrics once ``until`` holds (replicas report their counts every heartbeat), else after the timeout;
    without ``until``, once two scrapes a heartbeat apart agree."""
    import time

    from ortpilot.serve.counts import HEARTBEAT_S

    deadline = time.monotonic() + timeout
    last = _metrics(server)
    while time.monotonic() < deadline:
        if until is not None and until(last):
            return last
        # Settled means a heartbeat came in between (a replica reports at most every REPORT_S after requests,
        # so its last counts may wait for the next heartbeat): scrapes further apart than one.
        time.sleep(HEARTBEAT_S / 2 if until is not None else HEARTBEAT_S + 0.5)
        now = _metrics(server)
        if until is None and now == last:
            return now
        last = now
    return last


def _metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_an_idle_replica_stays_ready_on_its_heartbeat_alone(server):
    """No request for longer than a report lives: only the health-check heartbeat keeps the replica counted."""
    import time

    from ortpilot.serve.counts import HEARTBEAT_S, REPLICA_TTL_S

    time.sleep(REPLICA_TTL_S + 2 * HEARTBEAT_S)
    with urllib.request.urlopen(f"http://{server.url}/v2/health/ready", timeout=30) as resp:
        assert resp.status == 200
    assert _metrics(server)['ortpilot_replica_verified{model="mlp"}'] == 1


def test_the_request_id_comes_back_and_a_request_past_its_deadline_is_504(server):
    """X-Request-Id comes back once (or Ray Serve's own); X-Request-Timeout shortens the deadline: a
    microsecond passes before the replica could run the request, so it answers 504 in the protocol's shape
    without running it."""
    x = np.ones((1, 64), np.float32)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]})

    def post(headers):
        req = urllib.request.Request(
            f"http://{server.url}/v2/models/mlp/infer",
            data=body.encode(),
            headers={"Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.headers, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, json.loads(exc.read())

    status, headers, doc = post({"X-Request-Id": "e2e-trace-1"})
    assert status == 200 and headers.get_all("X-Request-Id") == ["e2e-trace-1"] and doc["outputs"][0]["name"] == "y"
    status, headers, doc = post({})  # Ray Serve's own request id then (a UUID)
    assert status == 200 and re.fullmatch(r"[!-~]{1,128}", headers["X-Request-Id"])
    assert headers["X-Request-Id"] != "e2e-trace-1"
    status, headers, doc = post({"X-Request-Timeout": "0.000001", "X-Request-Id": "e2e-late"})
    assert status == 504 and headers["X-Request-Id"] == "e2e-late", doc
    assert "within its deadline of 1e-06 s" in doc["error"] and "was not run" in doc["error"]
    status, _headers, doc = post({"X-Request-Timeout": "never"})
    assert status == 400 and "X-Request-Timeout 'never'" in doc["error"]
