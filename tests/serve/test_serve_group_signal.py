"""A server that starts its own Ray instance, stopped by a SIGTERM to its whole process group (``kill -TERM
-PGID``, what a process manager that signals the group sends): Ray's own processes get the signal too, so
there is nothing to drain through. The server must still exit 0 at once, not wait 60 s for Ray's head and
exit 1, and leave nothing behind: no HAProxy holding its port (HAProxy runs in a session of its own)."""

from __future__ import annotations

import os
import re
import signal
import socket
import time


def _listened(port: int) -> bool:
    """Whether something listens on ``port`` (a bind with SO_REUSEADDR fails only on a listener)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_a_sigterm_to_the_whole_process_group_ends_every_process_and_frees_the_ports(start_server):
    srv = start_server("demo:mlp", new_session=True)
    assert srv.ready, srv.stderr[-3000:]
    # HAProxy's listeners: the server's port, its stats and Prometheus ports
    ports = [srv.port] + [int(p) for p in re.findall(r"haproxy_(?:stats|metrics) (\d+)", srv.ingress)]
    assert all(_listened(p) for p in ports)
    os.killpg(srv.proc.pid, signal.SIGTERM)
    code = srv.proc.wait(300)  # Ray alone waits 60 s for its head, then ends the process with exit 1
    srv.stop()
    stderr = srv.log.read_text(errors="replace")
    assert code == 0 and "nothing left to drain" in stderr, (code, stderr[-3000:])
    assert not [p for p in ports if _listened(p)], stderr[-3000:]


def test_a_second_signal_while_it_drains_stops_it_at_once_and_leaves_nothing(start_server):
    """The server's own handler takes the second signal (Ray's, which ray.init installs, would exit 1 at once)."""
    srv = start_server("demo:mlp", new_session=True)
    assert srv.ready, srv.stderr[-3000:]
    ports = [srv.port] + [int(p) for p in re.findall(r"haproxy_(?:stats|metrics) (\d+)", srv.ingress)]
    os.kill(srv.proc.pid, signal.SIGTERM)  # the serve process alone: a drain
    while "Stopping: draining" not in srv.stderr and srv.proc.poll() is None:
        time.sleep(0.05)
    os.kill(srv.proc.pid, signal.SIGTERM)
    code = srv.proc.wait(300)
    srv.stop()
    stderr = srv.log.read_text(errors="replace")
    assert code == 0 and "A second signal: stopping now" in stderr, (code, stderr[-3000:])
    assert not [p for p in ports if _listened(p)], stderr[-3000:]
