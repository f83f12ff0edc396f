"""A server that starts its own Ray instance (no ``--address``): one model, gRPC, and its key from
``ORTPILOT_API_KEY``.

Its own instance on purpose: only then are Ray's processes (GCS, raylet, the workers the raylet
starts, HAProxy) children of the serve process, inheriting its environment, and the key must reach
none of them (the replicas check digests). With one model, a gRPC call that names no
``application`` goes straight to the model's replicas, which must answer every server-wide call
(ServerMetadata) and a message that does not parse as the server-wide application would.
"""

from __future__ import annotations

import http.client
import re
from pathlib import Path

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")
import grpc
from serve_procs import free_port, refused, routed
from tritonclient.utils import InferenceServerException

KEY = "own-ray-env-key-0123"
AUTH = {"authorization": f"Bearer {KEY}"}  # gRPC metadata keys are lowercase


@pytest.fixture(scope="module")
def server(start_module_server):
    srv = start_module_server("demo:mlp", "--grpc-port", str(free_port()), env={"ORTPILOT_API_KEY": KEY})
    assert srv.ready, srv.stderr[-3000:]
    srv.grpc = re.search(r"KServe v2 gRPC on (\S+);", srv.ingress).group(1)
    return srv


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _status(server, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("GET", "/v2/models/mlp", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_key_from_the_environment_reaches_no_ray_process(server):
    assert KEY.encode() in Path(f"/proc/{server.proc.pid}/environ").read_bytes()  # what the user started it with
    seen: dict[int, tuple[bytes, bytes]] = {}
    for pid in _descendants(server.proc.pid):
        try:
            seen[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes(), Path(f"/proc/{pid}/environ").read_bytes())
        except OSError:  # gone meanwhile
            continue
    commands = b"\n".join(cmd for cmd, _env in seen.values())
    expected = [b"gcs_server", b"raylet", b"ServeController", b"ServeReplica:mlp", b"ServeReplica:ortpilot"]
    expected += [b"haproxy"] if server.ingress.startswith("ingress: HAProxy") else []
    for name in expected:
        assert name in commands, (name, commands.decode(errors="replace")[:3000])
    leaked = [cmd[:100] for cmd, env in seen.values() if KEY.encode() in env or KEY.encode() in cmd]
    assert not leaked, leaked
    assert _status(server, {}) == 401 and _status(server, {"Authorization": f"Bearer {KEY}"}) == 200  # still held


def test_server_metadata_needs_no_application_with_one_model(server):
    client = tg.InferenceServerClient(server.grpc)
    for headers in (AUTH, {**AUTH, "application": "mlp"}, {**AUTH, "application": "ortpilot"}):
        meta = routed(lambda: client.get_server_metadata(headers=headers))  # noqa: B023 - called at once
        assert meta.name == "ortpilot" and list(meta.extensions) == ["binary_tensor_data"], headers
    for headers in (None, {"application": "mlp"}):
        with pytest.raises(InferenceServerException) as info:
            client.get_server_metadata(headers=headers)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED", info.value


def test_a_message_that_does_not_parse_is_invalid_argument(server):
    with grpc.insecure_channel(server.grpc) as channel:
        for rpc in ("ModelInfer", "ModelMetadata", "ServerMetadata"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}")  # bytes in, bytes out
            for extra in ({}, {"application": "mlp"}):
                error = refused(call, b"\xff\xff\xff\xff", list({**AUTH, **extra}.items()))
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (rpc, extra, error.details())
                assert f"not a valid inference.{rpc}Request" in error.details(), error.details()
                assert "DecodeError" not in error.details() and "Traceback" not in error.details()
            with pytest.raises(grpc.RpcError) as info:  # the key is checked first
                call(b"\xff\xff\xff\xff", timeout=60)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    client = tg.InferenceServerClient(server.grpc)  # and the replica goes on answering
    x = tg.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.ones((1, 64), np.float32))
    output = client.get_model_metadata("mlp", headers=AUTH).outputs[0].name
    assert np.isfinite(client.infer("mlp", [x], headers=AUTH).as_numpy(output)).all()
