"""serve.oip.readiness before Ray starts: a taken port or a profile that cannot load fails at once, naming
itself (exit 2), and the gRPC readiness check is skipped without --grpc-port."""

from __future__ import annotations

import socket

import pytest

from ortpilot.errors import OrtpilotError, UsageError
from ortpilot.serve.oip.readiness import _grpc_missing, _probe, run_server
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions


def test_a_taken_port_stops_the_server_before_ray(demo_paths):
    spec = ModelSpec("m", "model", str(demo_paths["mlp"]), "demo:mlp")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(UsageError, match="--port"):
            run_server([spec], ServeOptions(), ServerOptions(port=sock.getsockname()[1]))


def test_a_profile_that_cannot_load_names_itself_before_ray(tmp_path):
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(OrtpilotError) as info:
        run_server([ModelSpec("m", "profile", str(bad), str(bad))], ServeOptions(), ServerOptions(port=port))
    assert str(bad) in str(info.value) or "profile" in str(info.value)
    assert info.value.exit_code == 2


def test_without_grpc_port_grpc_readiness_is_not_asked():
    assert _grpc_missing(ServerOptions(), "m", {}) == ""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_model_not_ready_says_what_it_still_lacks():
    """What the ready-timeout error names when Ray gave no reason: no HTTP answer at all, or HTTP ready but
    no gRPC route (nothing listens on either port here, so both checks fail as they would)."""
    server = ServerOptions(port=_closed_port(), grpc_port=_closed_port())
    lacking = _probe(None, "m", server, {}, 1, False, 0.0)
    assert lacking == "GET /v2/models/m/ready answered nothing; its replicas did not start"
    way = _grpc_missing(server, "m", {})
    assert way.startswith(f"at 127.0.0.1:{server.grpc_port} with 'application: m'"), way
