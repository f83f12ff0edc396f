"""serve.oip.readiness before Ray starts: a taken port or a profile that cannot load fails at once, naming
itself (exit 2), and the gRPC readiness check is skipped without --grpc-port."""

from __future__ import annotations

import socket

import pytest

from ortpilot.errors import OrtpilotError, UsageError
from ortpilot.serve.oip.readiness import _grpc_ready, run_server
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
    assert _grpc_ready(ServerOptions(), "m", {}) is True
