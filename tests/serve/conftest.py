"""Fixtures for tests/serve: one local Ray instance for the whole session, shared by every server.

Every ``ortpilot serve`` a test starts is a real process that joins this instance with
``--address``, listens on 127.0.0.1 on a free port, and is stopped with SIGTERM by its PID.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("ray.serve")

# Lean Ray on loopback only: no usage stats, and Ray's single-machine mode (without it Ray rewrites
# 127.0.0.1 to this machine's network address when a process joins).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """A local one-node Ray instance (2 CPUs, no dashboard) for the session; stopped at its end."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 2, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    try:
        yield cluster.address
    finally:
        cluster.shutdown()
