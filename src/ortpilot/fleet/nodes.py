"""What a Ray node is: its CPUs as Ray gives them, its machine class, and the host it shares.

These run inside Ray processes (a task pinned to a node, a serving replica) or on the driver
(the list of alive nodes); Ray is imported inside each function, so importing this module
does not import Ray. A node's class is this machine's class (``providers.machineclass``) with
the node's Ray CPUs standing in for the CPU budget where they are fewer: Ray schedules that
many CPUs there, and a search there uses no more.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.providers.machineclass import MachineClass, this_class

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class RayNode:
    """An alive node as Ray's GCS lists it."""

    id: str
    ip: str
    hostname: str
    cpus: int  # Ray's CPU resource, rounded down

    @property
    def short(self) -> str:
        return f"{self.id[:8]} ({self.ip})"


def alive_nodes() -> list[RayNode]:
    """Every alive node of the connected cluster (the driver must have called ``ray.init``)."""
    import ray

    return [
        RayNode(
            str(n["NodeID"]),
            str(n.get("NodeManagerAddress") or "?"),
            str(n.get("NodeManagerHostname") or "?"),
            math.floor(float((n.get("Resources") or {}).get("CPU", 0)) + 1e-9),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def node_report(ray_cpus: int) -> dict[str, Any]:
    """Run on a node (a task pinned there): its class with ``ray_cpus`` as the budget, and what tells
    its host apart from others' (hostname, the kernel's boot id)."""
    report: dict[str, Any] = {"pid": os.getpid(), "hostname": socket.gethostname(), "boot_id": _boot_id()}
    if ray_cpus >= 1:
        report["class"] = this_class(ray_cpus).to_dict()
    return report


def this_node_cpus() -> int | None:
    """Inside a Ray worker: the CPUs Ray gives the node it runs on (None outside Ray, or when unknown)."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        node = ray.get_runtime_context().get_node_id()
        for n in ray.nodes():
            if n.get("NodeID") == node:
                return math.floor(float((n.get("Resources") or {}).get("CPU", 0)) + 1e-9) or None
    except Exception:  # an old Ray, or GCS unreachable: the process's own budget decides
        return None
    return None


def this_node_class() -> MachineClass:
    """The class of the node this process runs on (this machine's class outside Ray)."""
    return this_class(this_node_cpus())


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return ""


@dataclass
class Hosts:
    """Which nodes share a host: one key per host, and why nodes were put together."""

    of: dict[str, str] = field(default_factory=dict)  # node id -> host key
    why: dict[str, str] = field(default_factory=dict)  # host key -> what its nodes share

    def nodes(self, host: str) -> list[str]:
        return [n for n, h in self.of.items() if h == host]


def group_hosts(nodes: Sequence[RayNode], reports: Mapping[str, Mapping[str, Any]]) -> Hosts:
    """Nodes share a host when Ray reports them on one IP or their kernels share a boot id (containers
    on one machine); the host is named by its first node's IP."""
    parent = {n.id: n.id for n in nodes}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    reasons: dict[frozenset[str], set[str]] = {}
    for key, what in (("ip", "one node IP"), ("boot_id", "one booted kernel")):
        seen: dict[str, str] = {}
        for n in nodes:
            value = n.ip if key == "ip" else str((reports.get(n.id) or {}).get("boot_id") or "")
            if not value or value == "?":
                continue
            if value in seen:
                a, b = root(seen[value]), root(n.id)
                parent[b] = a
                reasons.setdefault(frozenset((seen[value], n.id)), set()).add(what)
            else:
                seen[value] = n.id
    hosts = Hosts()
    first_ip: dict[str, str] = {}
    for n in nodes:
        first_ip.setdefault(root(n.id), n.ip)
    for n in nodes:
        hosts.of[n.id] = first_ip[root(n.id)]
    for pair, whats in reasons.items():
        host = hosts.of[next(iter(pair))]
        hosts.why[host] = " and ".join(sorted(whats | set(hosts.why.get(host, "").split(" and ")) - {""}))
    return hosts


__all__ = [
    "Hosts",
    "RayNode",
    "alive_nodes",
    "group_hosts",
    "node_report",
    "this_node_class",
    "this_node_cpus",
]
