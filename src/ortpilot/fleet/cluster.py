"""The cluster a fleet tune runs on: connect to it, find the classes among its alive nodes, run searches there.

:func:`connect` refuses an address where no Ray cluster answers at once (Ray's own client
would wait a minute or more for a GCS that is not there) and says how to start one.
:func:`discover` runs one small task pinned to each alive node (``NodeAffinitySchedulingStrategy``,
no CPUs asked, so a busy node answers too) that reports the node's machine class
(``fleet.nodes.node_report``), then groups the nodes by host. A node with no CPUs for Ray
tasks (a head started with ``--num-cpus 0``), or whose report failed, is left out and said; a
cluster left with no node is exit 2.

:class:`Cluster` is everything the driver (``fleet.run``) asks of a cluster, in one small interface:
connect, discover, the alive nodes, put an object, start a search on a node and read what it
streams, cancel it. :class:`RayCluster` does it with Ray; the tests run the driver against an
in-process one (``tests/fleet/inprocess.py``) whose searches are real local tunes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ortpilot.errors import UsageError
from ortpilot.fleet.nodes import Hosts, RayNode, alive_nodes, group_hosts, node_report
from ortpilot.fleet.remote import SearchJob, search
from ortpilot.providers.machineclass import MachineClass, check_class
from ortpilot.rayenv import join_error, ray_environment, unreachable

INSTALL_HINT = "pip install 'ortpilot[serve]' (Ray) on this machine and on every node"
PROBE_TIMEOUT_S = 180.0


@contextlib.contextmanager
def connected(address: str) -> Iterator[None]:
    """Connect this process to the Ray cluster at ``address`` for the block (an existing connection is kept)."""
    why = unreachable(address, "--ray")
    if why:
        raise UsageError(why)
    ray_environment(address)
    try:
        import ray
    except ImportError:
        raise UsageError(f"A fleet tune (--ray) runs on a Ray cluster and needs Ray: {INSTALL_HINT}.") from None
    if ray.is_initialized():
        yield
        return
    try:
        ray.init(address=address, log_to_driver=False, logging_level="WARNING", configure_logging=True)
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError: what Ray raises varies by version
        raise UsageError(join_error(address, exc)) from None
    try:
        yield
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class FleetNode:
    """A node that can run searches: where it is, its class, its host."""

    node: RayNode
    machine_class: MachineClass
    host: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.node.id,
            "ip": self.node.ip,
            "hostname": self.node.hostname,
            "cpus": self.node.cpus,
            "host": self.host,
            "class": self.machine_class.name,
        }


@dataclass
class Fleet:
    """The cluster's usable nodes by class and host, and the nodes left out (with why)."""

    address: str
    nodes: list[FleetNode]
    hosts: Hosts
    left_out: list[dict[str, str]] = field(default_factory=list)

    def classes(self) -> dict[str, MachineClass]:
        """Class id -> class, in the order their first node appears."""
        out: dict[str, MachineClass] = {}
        for n in self.nodes:
            out.setdefault(n.machine_class.id, n.machine_class)
        return out

    def of_class(self, class_id: str) -> list[FleetNode]:
        return [n for n in self.nodes if n.machine_class.id == class_id]

    def node(self, node_id: str) -> FleetNode:
        return next(n for n in self.nodes if n.node.id == node_id)

    @property
    def host_count(self) -> int:
        return len({n.host for n in self.nodes})

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "nodes": [n.to_dict() for n in self.nodes],
            "hosts": {
                h: {"nodes": self.hosts.nodes(h), "shared_by": self.hosts.why.get(h, "")}
                for h in set(self.hosts.of.values())
            },
            "classes": {c.name: c.to_dict() for c in self.classes().values()},
            "left_out": list(self.left_out),
        }


def discover(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Fleet:
    """The alive nodes' classes and hosts (``connected`` must hold); exit 2 when no node can run a search."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes()
    probe = ray.remote(node_report)
    pending = {
        n.id: probe.options(
            num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False)
        ).remote(n.cpus)
        for n in nodes
    }
    reports: dict[str, dict[str, Any]] = {}
    left_out: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout_s
    for n in nodes:
        try:
            reports[n.id] = ray.get(pending[n.id], timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:  # the node died, or cannot import ortpilot: it takes no search
            left_out.append({"node": n.short, "why": f"its report failed ({type(exc).__name__}: {str(exc)[:200]})"})
    hosts = group_hosts([n for n in nodes if n.id in reports], reports)
    usable = []
    for n in nodes:
        report = reports.get(n.id)
        if report is None:
            continue
        if "class" not in report:
            left_out.append(
                {"node": n.short, "why": f"it has {n.cpus} CPUs for Ray tasks (started with --num-cpus 0?)"}
            )
            continue
        usable.append(FleetNode(n, check_class(report["class"], f"node {n.short}'s class"), hosts.of[n.id]))
    if not usable:
        seen = "; ".join(f"{x['node']}: {x['why']}" for x in left_out) or "none"
        raise UsageError(
            f"The Ray cluster at '{address}' has no alive node that can run a search (nodes: {seen}). Add a node "
            f"with CPUs ('ray start --address {address} --num-cpus N' on it), with ortpilot installed there."
        )
    return Fleet(address, usable, hosts, left_out)


class Cluster(Protocol):
    """What the fleet driver asks of a cluster. A search is a stream: :meth:`start` returns a handle,
    :meth:`ready` says which handles have a message waiting, :meth:`receive` takes it (``fleet.remote``'s
    messages), raising ``StopIteration`` when the stream ended or the error that ended it (Ray's, whose
    type name the driver reads: ``NodeDiedError``, ``WorkerCrashedError``, ...)."""

    address: str

    def connect(self) -> AbstractContextManager[None]:
        """Hold the connection for the block."""

    def discover(self) -> Fleet:
        """The alive nodes' classes and hosts; ``UsageError`` (exit 2) when no node can run a search."""

    def alive(self) -> set[str]:
        """The ids of the nodes alive now (none when the cluster itself is gone)."""

    def put(self, value: Any) -> Any:
        """``value`` stored once for every search that takes it (a model's payload, its calibration)."""

    def start(self, node: FleetNode, job: SearchJob, model: Any, calibration: Any, journal: bytes | None) -> Any:
        """``fleet.remote.search`` on ``node``, with all its CPUs; the stream's handle."""

    def ready(self, streams: Sequence[Any], timeout_s: float) -> list[Any]:
        """The streams (at most one) with a message waiting, after waiting up to ``timeout_s`` for one."""

    def receive(self, stream: Any) -> dict[str, Any]:
        """The stream's next message."""

    def cancel(self, stream: Any) -> None:
        """Stop the stream's search (its node may never have started it)."""


class RayCluster:
    """The Ray cluster at ``address``: each search a streaming task pinned to its node."""

    def __init__(self, address: str) -> None:
        self.address = address

    def connect(self) -> AbstractContextManager[None]:
        return connected(self.address)

    def discover(self) -> Fleet:
        return discover(self.address)

    def alive(self) -> set[str]:
        try:
            return {n.id for n in alive_nodes()}
        except Exception:  # the GCS itself is gone: every node counts as dead
            return set()

    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def start(self, node: FleetNode, job: SearchJob, model: Any, calibration: Any, journal: bytes | None) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(search).options(
            num_cpus=node.node.cpus,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node.id, soft=False),
        )
        return task.remote(job, model, calibration, journal)

    def ready(self, streams: Sequence[Any], timeout_s: float) -> list[Any]:
        import ray

        ready, _ = ray.wait(list(streams), num_returns=1, timeout=timeout_s)
        return ready

    def receive(self, stream: Any) -> dict[str, Any]:
        import ray

        return ray.get(next(stream))

    def cancel(self, stream: Any) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.cancel(stream, force=True)


__all__ = ["Cluster", "Fleet", "FleetNode", "RayCluster", "connected", "discover"]
