"""Fixtures for tests/serve: one local Ray instance for the session, a written profile, servers by PID.

Every ``ortpilot serve`` a test starts is a real process joining the session's Ray instance with
``--address`` (one Ray start instead of one per server), listening on 127.0.0.1 on a free port;
it is stopped with SIGTERM by its PID before the test (or module) ends, and must exit 0.

Under pytest-xdist (``.ci/run`` runs ``-n 2 --dist loadfile``) each module runs whole in one worker: its
module-scoped servers start once, on that worker's own Ray instance (``ray_address`` is per session, and each
worker is a session). Two modules may run at once in two workers, each on its own Ray: ``ortpilot serve``
gives every port it opens a free one, so two servers on one host do not collide.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from serve_procs import WAIT_READY_S, Server, free_port, local_cluster


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """A local one-node Ray instance (2 CPUs, no dashboard) shared by every serve test; stopped at the end."""
    cluster, _ = local_cluster(2)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


@pytest.fixture(scope="session")
def two_nodes() -> Iterator[dict]:
    """A head (2 CPUs) and a worker node (1 CPU) on this machine, shared by the ``raycluster`` tests (``.ci/run``
    runs them as one step, so the cluster starts once): ``{"cluster", "worker"}``. A test that adds or removes
    nodes puts the cluster back as it found it."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two nodes of this machine's CPUs (two classes) need a machine with two CPUs")
    cluster, (worker,) = local_cluster(2, 1)
    state = {"cluster": cluster, "worker": worker}
    try:
        yield state
    finally:
        cluster.shutdown()


@pytest.fixture(scope="session")
def written_encoder(tmp_path_factory: pytest.TempPathFactory, demo_paths: dict[str, Path]) -> Path:
    """The demo encoder's profile written without a tune (ORT's default settings, its reference sample and outputs
    in reference.npz, so replicas verify it bit for bit), its folder: for a test about serving, not about what a
    tune wrote (a real tune's profile is served and verified in test_serve_text.py, ``tuned``)."""
    import json

    from export_profiles import with_real_reference, write_cpu_profile

    from ortpilot.providers.machine import machine_facts

    profile = with_real_reference(
        write_cpu_profile(tmp_path_factory.mktemp("written") / "encoder", demo_paths["encoder"], settings={})
    )
    doc = json.loads(profile.read_text())
    doc["machine"] = machine_facts()  # this machine's kernels, as a tune records them: outputs must match bit for bit
    profile.write_text(json.dumps(doc, indent=2))
    return profile.parent


def _starter(folder: Path) -> tuple:
    started: list[Server] = []

    def start(
        *args: str, timeout: float = WAIT_READY_S, env: dict[str, str] | None = None, new_session: bool = False
    ) -> Server:
        server = Server(list(args), free_port(), folder / f"serve-{len(started)}.err", timeout, env, new_session)
        started.append(server)
        return server

    return start, started


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    """``start_server(args..., env={...})`` -> a running Server (``env``: added to its environment); every one
    it started is stopped after the test."""
    start, started = _starter(tmp_path)
    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def start_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The same for servers a whole test module shares."""
    start, started = _starter(tmp_path_factory.mktemp("serve"))
    yield start
    for server in started:
        server.stop()
