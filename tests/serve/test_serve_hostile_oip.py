"""A hostile client against ``ortpilot serve`` over the Open Inference Protocol, REST and gRPC, with the
real clients (tritonclient.http, tritonclient.grpc) and raw sockets.

One server for the module, with keys (one literal, one from a key file), a browser origin, gRPC and
short timeouts: every route but health needs a key (401 in each protocol's shape), keys rotate with
the file, foreign Host names and origins are refused, every malformed body is a 4xx with a one-line
message and no internal path, ORT's own refusals become 400s naming the input and the limit, slow
clients are cut off by the timeouts, and metadata shows no PIDs, hosts or paths.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
import slow_clients as slow
from serve_procs import free_port, refused
from tritonclient.utils import InferenceServerException

import ortpilot
from ortpilot.graph.feeds import make_feeds

KEY = "literal-key-0123"
FILE_KEY = "file-key-4567"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example"
HEADER_S, IDLE_S, REQUEST_S = 2, 3, 4


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# rotated by the test\n{FILE_KEY}\n")
    return path


@pytest.fixture(scope="module")
def server(start_module_server, ray_address, written_encoder, keyfile):
    srv = start_module_server(
        str(written_encoder / "profile.json"),
        "demo:mlp",
        *("--name", "m", "--name", "mlp", "--address", ray_address),
        *("--api-key", KEY, "--api-key-file", str(keyfile), "--cors-origin", ORIGIN),
        *("--grpc-port", str(free_port()), "--max-request-mb", "1", "--max-header-kb", "16"),
        *("--header-timeout", str(HEADER_S), "--idle-timeout", str(IDLE_S), "--request-timeout", str(REQUEST_S)),
    )
    assert srv.ready, srv.stderr[-3000:]
    srv.grpc = re.search(r"KServe v2 gRPC on (\S+);", srv.ingress).group(1)
    return srv


@pytest.fixture(scope="module")
def reference(written_encoder):
    sess = ortpilot.load_profile(written_encoder / "profile.json")
    return sess, make_feeds(sess.model, seed=3)


def _call(server, method, path, body=None, headers=None):
    """(status, headers, body) of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _inputs(module, feeds):
    items = []
    for name, value in feeds.items():
        item = module.InferInput(name, list(value.shape), "INT64" if value.dtype == np.int64 else "FP32")
        item.set_data_from_numpy(value)
        items.append(item)
    return items


def _error(body: bytes) -> str:
    """The Open Inference Protocol's error: one line, no traceback, no path inside the server."""
    doc = json.loads(body)
    assert set(doc) == {"error"} and isinstance(doc["error"], str), doc
    message = doc["error"]
    assert "\n" not in message and "Traceback" not in message and "onnxruntime_src" not in message, message
    assert not re.search(r"(/[\w.-]+){2,}\.(py|h|cc|onnx|json)\b", message), message
    return message


ROUTES = [
    ("GET", "/v2"),
    ("GET", "/v2/models/m"),
    ("GET", "/v2/models/m/ready"),
    ("GET", "/v2/models/m/versions/1"),
    ("POST", "/v2/models/m/infer"),
    ("POST", "/v2/models/mlp/infer"),
    ("POST", "/v2/repository/index"),
    ("GET", "/metrics"),
    ("GET", "/v2/models/nope"),
    ("GET", "/no/such/path"),
]


def test_every_route_but_health_needs_a_key(server, reference):
    for method, path in ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY}):
            status, head, body = _call(server, method, path, b"{}" if method == "POST" else None, headers)
            assert status == 401 and head["www-authenticate"] == "Bearer", (method, path, headers, status)
            assert "key" in _error(body).lower() and KEY not in body.decode()
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert _call(server, "GET", path)[0] == 200
    assert _call(server, "GET", "/-/routes")[0] == 404  # Ray's route list names every model
    for key in (KEY, FILE_KEY):
        status, _h, body = _call(server, "GET", "/v2/models/m", headers={"Authorization": f"Bearer {key}"})
        assert status == 200 and json.loads(body)["name"] == "m"
    sess, feeds = reference
    client = th.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("m", _inputs(th, feeds))
    assert info.value.status() == "401"
    result = client.infer("m", _inputs(th, feeds), headers=dict(AUTH))  # tritonclient adds to the dict it gets
    assert result.as_numpy(sess.get_outputs()[0].name).tobytes() == sess.run(None, feeds)[0].tobytes()
    assert KEY not in server.stderr and FILE_KEY not in server.stderr and KEY not in "\n".join(server.ready)


def test_grpc_needs_the_key_as_metadata(server, reference):
    sess, feeds = reference
    client = tg.InferenceServerClient(server.grpc)
    key = {"authorization": f"Bearer {KEY}"}  # gRPC metadata keys are lowercase
    assert client.is_server_live()  # health stays open
    # ready once every model's replica has reported in: a heartbeat can be late on a loaded machine
    deadline = time.monotonic() + 30
    while not client.is_server_ready() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert client.is_server_ready()
    for call in (
        lambda h: client.get_model_metadata("m", headers=h),
        lambda h: client.is_model_ready("m", headers=h),
        lambda h: client.get_server_metadata(headers=h),
        lambda h: client.infer("m", _inputs(tg, feeds), headers=h),
        lambda h: client.infer("m", _inputs(tg, feeds), headers={**(h or {}), "application": "m"}),
    ):
        with pytest.raises(InferenceServerException) as info:
            call(None)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED", info.value
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            call({"authorization": "Bearer wrong"})
        assert call(key) is not False
    expected = sess.run(None, feeds)[0].tobytes()
    for headers in (key, {**key, "application": "m"}):  # through the server-wide relay, and in one hop
        assert client.infer("m", _inputs(tg, feeds), headers=headers).as_numpy(
            sess.get_outputs()[0].name
        ).tobytes() == (expected)
    assert client.get_model_metadata("m", headers=key).name == "m"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_repository_index(headers=key)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED" and "ModelInfer" in info.value.message()


def test_keys_rotate_with_the_key_file(server, keyfile):
    new = "rotated-key-89ab"
    staged = keyfile.with_name("keys.new")
    staged.write_text(f"{new}\n")
    os.replace(staged, keyfile)  # rotation: a new file renamed over the old one, no restart
    deadline = time.monotonic() + 30
    # Every replica and the server-wide application read the file themselves (at most once a second).
    for path in ("/v2", "/v2/models/mlp", "/v2/models/m"):
        while _call(server, "GET", path, headers={"Authorization": f"Bearer {new}"})[0] != 200:
            assert time.monotonic() < deadline, f"the new key was not taken on {path}"
            time.sleep(0.25)
        assert _call(server, "GET", path, headers={"Authorization": f"Bearer {FILE_KEY}"})[0] == 401, path
        assert _call(server, "GET", path, headers=AUTH)[0] == 200, path  # --api-key keys stay


def test_foreign_host_names_and_origins_are_refused(server):
    status, _h, body = _call(server, "GET", "/v2/models/m", headers={**AUTH, "Host": "attacker.example:80"})
    assert status == 403 and "--allowed-host" in _error(body)
    assert _call(server, "GET", "/v2/health/live", headers={"Host": "attacker.example"})[0] == 403
    assert _call(server, "GET", "/v2/models/m", headers={**AUTH, "Host": f"localhost:{server.port}"})[0] == 200
    status, _h, body = _call(server, "GET", "/v2/models/m", headers={**AUTH, "Origin": "https://evil.example"})
    assert status == 403 and "--cors-origin" in _error(body)
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    status, head, _b = _call(server, "OPTIONS", "/v2/models/m/infer", headers=preflight)
    assert status == 204 and head["access-control-allow-origin"] == ORIGIN
    assert "authorization" in head["access-control-allow-headers"]
    status, head, _b = _call(server, "GET", "/v2/models/m/ready", headers={**AUTH, "Origin": ORIGIN})
    assert status == 200 and head["access-control-allow-origin"] == ORIGIN and head["vary"] == "Origin"


def _tensor(name, shape, datatype, data):
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def _encoder_body(seq: int, value: int = 1, token_type: int = 0) -> bytes:
    return json.dumps(
        {
            "inputs": [
                _tensor("input_ids", [1, seq], "INT64", [value] * seq),
                _tensor("attention_mask", [1, seq], "INT64", [1] * seq),
                _tensor("token_type_ids", [1, seq], "INT64", [token_type] * seq),
            ]
        }
    ).encode()


X = "x"  # the MLP's input
HOSTILE = [
    ("huge dim", "mlp", json.dumps({"inputs": [_tensor(X, [2**63 - 1, 64], "FP32", [0.5])]}), {}, 400, "shape"),
    ("wrapping shape", "mlp", json.dumps({"inputs": [_tensor(X, [2**40, 2**40], "FP32", [0.5])]}), {}, 400, "shape"),
    ("negative dim", "mlp", json.dumps({"inputs": [_tensor(X, [-1, 64], "FP32", [0.5])]}), {}, 400, "shape"),
    (
        "parameters not an object",
        "mlp",
        json.dumps({"inputs": [_tensor(X, [1, 64], "FP32", [0.5] * 64)], "parameters": [1]}),
        {},
        400,
        "parameters",
    ),
    (
        "tensor parameters not an object",
        "mlp",
        json.dumps({"inputs": [{**_tensor(X, [1, 64], "FP32", [0.5] * 64), "parameters": "x"}]}),
        {},
        400,
        "parameters",
    ),
    ("nested JSON", "mlp", "[" * 100000 + "]" * 100000, {}, 400, "nests JSON"),
    ("not JSON", "mlp", "{inputs", {}, 400, "not valid JSON"),
    ("no inputs", "mlp", json.dumps({"outputs": []}), {}, 400, '"inputs"'),
    ("non-ASCII header length", "mlp", "{}", {"Inference-Header-Content-Length": "²"}, 400, "byte count"),
    ("header length past the body", "mlp", "{}", {"Inference-Header-Content-Length": "99"}, 400, "99"),
    ("fractions for INT64", "m", _encoder_body(4).replace(b"[1, 1, 1, 1]", b"[1.5, 1, 1, 1]", 1), {}, 400, "1.5"),
    ("text for INT64", "m", _encoder_body(4).replace(b"[1, 1, 1, 1]", b'["a", 1, 1, 1]', 1), {}, 400, "text"),
    ("too few values", "mlp", json.dumps({"inputs": [_tensor(X, [1, 64], "FP32", [0.5] * 3)]}), {}, 400, "needs 64"),
    ("unknown datatype", "mlp", json.dumps({"inputs": [_tensor(X, [1], "FP99", [1])]}), {}, 400, "FP99"),
    ("wrong dtype", "mlp", json.dumps({"inputs": [_tensor(X, [1, 64], "INT64", [1] * 64)]}), {}, 400, "float32"),
    ("longer than the positions", "m", _encoder_body(600), {}, 400, "'input_ids' has 600 positions"),
    ("a token past the vocabulary", "m", _encoder_body(4, value=5000), {}, 400, "table of 1000 rows"),
    ("a token type past its table", "m", _encoder_body(4, token_type=9), {}, 400, "'token_type_ids' holds 9"),
    ("a negative token id", "m", _encoder_body(4, value=-5), {}, 400, "'input_ids' holds -5"),
    ("a negative token id within the table's size", "m", _encoder_body(4, value=-1000), {}, 400, "from 0 to 999"),
    ("unknown version", "m/versions/999", _encoder_body(4), {}, 404, "no version '999'"),
    ("unknown model", "nope", _encoder_body(4), {}, 404, "Unknown model 'nope'"),
    (
        "over --max-request-mb",
        "mlp",
        json.dumps({"inputs": [_tensor(X, [1, 64], "FP32", [0.5] * 300000)]}),
        {},
        413,
        "limit",
    ),
]


@pytest.mark.parametrize("case, model, body, headers, status, words", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_client_mistakes_are_4xx_with_a_one_line_message(server, case, model, body, headers, status, words):
    got, _h, raw = _call(
        server,
        "POST",
        f"/v2/models/{model}/infer",
        body.encode() if isinstance(body, str) else body,
        {**AUTH, "Content-Type": "application/json", **headers},
    )
    assert got == status, (case, got, raw[:300])
    assert words in _error(raw), (case, raw[:300])


def test_grpc_client_mistakes_are_grpc_status_codes(server, reference):
    _sess, feeds = reference
    client = tg.InferenceServerClient(server.grpc)
    key = {"authorization": f"Bearer {KEY}"}
    long = {name: np.ones((1, 600), np.int64) for name in feeds}
    cases = [
        (_inputs(tg, long), "INVALID_ARGUMENT", "'input_ids' has 600 positions"),
        (_inputs(tg, {**feeds, "input_ids": np.full_like(feeds["input_ids"], 5000)}), "INVALID_ARGUMENT", "1000 rows"),
        (_inputs(tg, dict(list(feeds.items())[1:])), "INVALID_ARGUMENT", "input_ids"),
    ]
    for inputs, code, words in cases:
        with pytest.raises(InferenceServerException) as info:
            client.infer("m", inputs, headers=key)
        assert info.value.status() == f"StatusCode.{code}" and words in info.value.message(), info.value
        assert "onnxruntime_src" not in info.value.message()
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.infer("m", _inputs(tg, feeds), model_version="999", headers=key)


def test_a_grpc_message_that_does_not_parse_is_invalid_argument(server):
    """Two models: a call without ``application`` is relayed by the server-wide application, one with it
    goes to the model's replicas; both answer INVALID_ARGUMENT, after the key check."""
    import grpc

    key = [("authorization", f"Bearer {KEY}")]
    with grpc.insecure_channel(server.grpc) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        for metadata in (key, [*key, ("application", "m")]):
            error = refused(infer, b"\x0a\xff\xff", metadata)  # a length past the end of the message
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (metadata, error.details())
            assert "not a valid inference.ModelInferRequest" in error.details()
        with pytest.raises(grpc.RpcError) as info:
            infer(b"\x0a\xff\xff", timeout=60)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("path", ["/v2", "/v2/models/m/infer", "/v2/health/live"])
def test_an_unknown_method_gets_the_protocols_json_error(server, path):
    outcome = slow.one_request(server.port, "FOO", path, AUTH)
    assert outcome.status == 501, outcome
    assert "GET, HEAD, POST" in _error(outcome.body)
    status, _h, body = _call(server, "PATCH", "/v2", headers=AUTH)  # a method the replicas know: their 405
    assert status == 405 and "use GET" in _error(body)


def test_metadata_shows_no_pids_hosts_or_paths(server, written_encoder):
    status, _h, body = _call(server, "GET", "/v2/models/m", headers=AUTH)
    assert status == 200
    doc = json.loads(body)
    for replica in doc["ortpilot"]["replicas"]:
        assert not {"pid", "host", "node"} & set(replica), replica
    text = body.decode()
    assert str(written_encoder) not in text and "profile.json" not in text and str(os.getpid()) not in text


def test_refusals_are_counted_and_the_access_log_is_escaped(server):
    key = 'ortpilot_requests_total{code="401",model="m"}'

    def metrics():
        status, _h, body = _call(server, "GET", "/metrics", headers=AUTH)
        assert status == 200
        return {
            ln.rpartition(" ")[0]: float(ln.rpartition(" ")[2])
            for ln in body.decode().splitlines()
            if ln and ln[0] != "#"
        }

    before = metrics().get(key, 0)
    _call(server, "GET", "/v2/models/m/%1b%5B31mred")
    deadline = time.monotonic() + 20
    while metrics().get(key, 0) <= before:
        assert time.monotonic() < deadline, "the 401 was not counted"
        time.sleep(0.5)
    # The replica's access log reaches serve's stderr through Ray's log monitor, a moment after the count.
    while not (lines := [ln for ln in server.stderr.splitlines() if "/v2/models/m/" in ln and "red" in ln]):
        assert time.monotonic() < deadline + 20, "the refused request never reached the access log"
        time.sleep(0.5)
    line = lines[0]
    logged = re.search(r'"GET (\S+)" 401 ', line)  # Ray colours its own prefix; the request line is ours
    assert logged and logged.group(1) == "/v2/models/m/\\x1b[31mred", line


def test_slow_and_malformed_clients_are_cut_off(server):
    """Real slow clients on raw sockets, side by side (each waits for a timeout)."""
    grpc_port = int(server.grpc.rpartition(":")[2])
    outcomes = slow.side_by_side(
        {
            "short body": lambda: slow.short_body(server.port, "/v2/models/mlp/infer", AUTH),
            "dribble": lambda: slow.dribble(server.port),
            "idle keep-alive": lambda: slow.idle_after_request(server.port, "/v2/health/live", {}),
            "idle connection": lambda: slow.idle_connection(server.port),
            "headers over the limit": lambda: slow.big_headers(server.port, "/v2/health/live", 20 * 1024),
            "headers over the buffer": lambda: slow.big_headers(server.port, "/v2/health/live", 300 * 1024),
            "grpc idle": lambda: slow.grpc_idle(grpc_port),
            "grpc truncated message": lambda: slow.grpc_truncated(grpc_port),
        }
    )
    body = outcomes["short body"]
    assert body.status == 408 and "--header-timeout" in _error(body.body), body  # HAProxy, in the protocol's shape
    assert body.seconds is not None and body.seconds < REQUEST_S + HEADER_S + 5
    assert outcomes["dribble"].status == 408 and outcomes["dribble"].seconds is not None
    assert outcomes["idle keep-alive"].status == 200 and outcomes["idle keep-alive"].seconds is not None
    assert outcomes["idle connection"].seconds is not None
    over = outcomes["headers over the limit"]
    assert over.status == 431 and "--max-header-kb" in _error(over.body)
    assert outcomes["headers over the buffer"].status == 400
    assert outcomes["grpc idle"].seconds is not None
    seconds, frames = outcomes["grpc truncated message"]
    assert seconds is not None and any(stream == 1 for _kind, stream in frames), frames
