"""The serve core's small parts without Ray: error bodies, request counts, ready lines, and the
lifecycle's checks that run before Ray starts (ports, the reason a replica failed)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ortpilot.errors import UsageError
from ortpilot.serve.counts import SECONDS_BUCKETS, RequestCounts, cumulative
from ortpilot.serve.errorbody import error_json, oip_error, openai_error
from ortpilot.serve.fastpath import choose
from ortpilot.serve.ready import DecoderReady, ModelReady, Served
from ortpilot.serve.runner import check_port, failure_reason


def test_each_protocol_has_one_error_body():
    assert oip_error("m") == {"error": "m"}
    assert openai_error("m", code="c") == {
        "error": {"message": "m", "type": "invalid_request_error", "param": None, "code": "c"}
    }
    assert json.loads(error_json("oip", "m", "c")) == {"error": "m"}
    assert json.loads(error_json("openai", "m", "c", server_side=True))["error"]["type"] == "server_error"


def test_request_counts_are_cumulative_histograms():
    counts = RequestCounts()
    for code, seconds in ((200, 0.0001), (200, 0.02), (400, 20.0)):
        counts.observe(code, seconds)
    snap = counts.snapshot()
    assert snap.codes == {"200": 2, "400": 1} and snap.count == 3
    buckets = cumulative([snap, snap], SECONDS_BUCKETS)
    assert buckets[0] == ("0.0005", 2) and buckets[-1] == ("+Inf", 6)
    assert [n for _, n in buckets] == sorted(n for _, n in buckets)


def test_ready_lines_and_documents():
    model = ModelReady("m", 2, ["CPUExecutionProvider"], "http://h/v2/models/m", 1.25, ["a note"])
    assert model.line() == (
        "m: 2 replicas ready on CPUExecutionProvider, http://h/v2/models/m (cold start 1.2 s); a note"
    )
    doc = {"id": "d", "ortpilot": {"max_streams": 2, "max_length": 64, "max_queue": 3}}
    decoder = DecoderReady(doc, 1, "http://h/v1", 0.5)
    assert "d: 1 replica ready on CPUExecutionProvider" in decoder.line() and "2 streams of 64 tokens" in decoder.line()
    served = Served([model], path=choose("proxy", True), grpc="127.0.0.1:9")
    lines = served.lines()
    assert lines[0] == model.line() and lines[1].startswith("ingress: Ray Serve proxy -> replica")
    assert "KServe v2 gRPC on 127.0.0.1:9" in lines[1]
    assert served.to_dict()["ingress"]["grpc"] == "127.0.0.1:9" and served.to_dict()["models"][0]["replicas"] == 2


def test_rays_all_interface_grpc_binds_move_to_loopback_only_when_the_environment_asks(monkeypatch):
    from ortpilot.serve import loopback
    from ortpilot.serve.fastpath import GRPC_LOOPBACK_ENV

    binds: list[str] = []
    bind = loopback.on_loopback(lambda server, address: binds.append(address) or 1)
    assert loopback.on_loopback(bind) is bind  # wrapped once however often a stack installs it
    bind(None, "[::]:0")
    bind(None, "[::]:9000")
    bind(None, "10.0.0.5:9000")  # an address Ray was given explicitly stays as it is
    assert binds == ["127.0.0.1:0", "127.0.0.1:9000", "10.0.0.5:9000"]
    monkeypatch.delenv(GRPC_LOOPBACK_ENV, raising=False)
    assert loopback.install() is False  # a server on another host: Ray's binds as they are


def test_a_taken_port_is_a_usage_error_before_anything_starts():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(UsageError, match="--grpc-port"):
            check_port("127.0.0.1", sock.getsockname()[1], "--grpc-port")


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1", "[::1]"])  # no such address; TEST-NET-1; a URL's form
def test_a_host_this_machine_cannot_listen_on_is_named_as_the_host_not_a_taken_port(host):
    with pytest.raises(UsageError) as info:
        check_port(host, 8000)
    message = str(info.value)
    assert f"--host {host} is not an address this machine can listen on" in message and "not free" not in message
    assert ("without brackets (--host ::1)" in message) == host.startswith("[")


def _time_wait_port() -> int:
    """A port on 127.0.0.1 that holds only a TIME-WAIT socket: a listener (with SO_REUSEADDR, as HAProxy's
    and Ray's are; its connections inherit it) that accepted a connection and closed it first, as a
    stopped server does, then closed itself."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end goes to TIME-WAIT once the client closes
        client.recv(1)
        client.close()
    states = [line.split()[3] for line in Path("/proc/net/tcp").read_text().splitlines()[1:] if f":{port:04X} " in line]
    assert "06" in states and "0A" not in states, states  # 06: TIME_WAIT, 0A: LISTEN
    return port


def test_a_port_holding_only_time_wait_sockets_is_free_one_with_a_listener_is_not():
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):  # a bind without SO_REUSEADDR calls it busy
        plain.bind(("127.0.0.1", port))
    check_port("127.0.0.1", port)  # the listeners serve starts bind with SO_REUSEADDR: free for them
    with socket.socket() as live:
        live.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        live.bind(("127.0.0.1", port))
        live.listen()
        with pytest.raises(UsageError, match=f"Port {port} on 127.0.0.1 is not free"):
            check_port("127.0.0.1", port)


@pytest.mark.parametrize(
    "message, reason",
    [
        (
            "Traceback ...\n  File x\nortpilot.errors.VerificationError: outputs differ from the reference\n",
            "VerificationError: outputs differ from the reference",
        ),
        ("the replica\nwent away\n", "went away"),
        ("", "no replica became ready (Ray gave no reason)"),
    ],
)
def test_the_reason_a_replica_failed_is_its_own_error_line(message, reason):
    assert failure_reason(message) == reason


def test_a_deployment_ray_gave_up_is_read_with_its_message_from_serves_own_status_records():
    pytest.importorskip("ray.serve")
    from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger
    from ray.serve.schema import ApplicationStatus, ApplicationStatusOverview, DeploymentStatusOverview

    from ortpilot.serve.runner import deployment_status

    failed = DeploymentStatusOverview(
        DeploymentStatus.DEPLOY_FAILED,
        DeploymentStatusTrigger.REPLICA_STARTUP_FAILED,
        {},
        "A replica failed to start with exception. Error:\nortpilot.errors.UsageError: The KV buffer ... too large",
    )
    apps = {
        "ortpilot-openai": ApplicationStatusOverview(ApplicationStatus.DEPLOY_FAILED, "", 0.0, {"decoder-d": failed})
    }
    status, message = deployment_status(apps, "ortpilot-openai", "decoder-d")
    assert status == "DEPLOY_FAILED" and failure_reason(message) == "UsageError: The KV buffer ... too large"
    assert deployment_status(apps, "ortpilot-openai", "decoder-other") == ("", "")  # not listed (yet)
    assert deployment_status({}, "ortpilot-openai", "decoder-d") == ("", "")  # Serve could not be asked
