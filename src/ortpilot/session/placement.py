"""Which nodes ran on which execution provider.

ORT >= 1.24 records it when the session config ``session.record_ep_graph_assignment_info`` is
1 (``get_provider_graph_assignment_info()``); older builds only tell through the profiler,
whose node events carry ``args.provider``. Both paths produce the same ``Placement``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnxruntime as ort

RECORD_ASSIGNMENT_KEY = "session.record_ep_graph_assignment_info"


def assignment_api_available() -> bool:
    return hasattr(ort.InferenceSession, "get_provider_graph_assignment_info")


@dataclass(frozen=True)
class PlacedNode:
    name: str
    op_type: str
    provider: str
    flops: float | None = None


@dataclass
class Placement:
    """Per-EP node counts, shares and node lists for one session."""

    nodes: list[PlacedNode] = field(default_factory=list)
    source: str = ""  # "assignment_api" or "profiler"

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(n.provider for n in self.nodes))

    @property
    def total(self) -> int:
        return len(self.nodes)

    def share(self, provider: str) -> float:
        """Fraction of nodes on ``provider`` (1.0 for an empty graph: nothing ran elsewhere)."""
        if not self.nodes:
            return 1.0
        return self.counts.get(provider, 0) / len(self.nodes)

    def flops_share(self, provider: str) -> float | None:
        """Fraction of estimated FLOPs on ``provider``; None when FLOPs are unknown."""
        known = [n for n in self.nodes if n.flops is not None]
        total = sum(n.flops for n in known if n.flops)
        if not known or total <= 0:
            return None
        return sum(n.flops for n in known if n.provider == provider and n.flops) / total

    def nodes_on(self, provider: str) -> list[PlacedNode]:
        return [n for n in self.nodes if n.provider == provider]

    def providers(self) -> list[str]:
        return list(self.counts)

    def to_dict(self) -> dict[str, Any]:
        per_ep = {}
        for provider, count in sorted(self.counts.items(), key=lambda kv: -kv[1]):
            per_ep[provider] = {
                "nodes": count,
                "share": round(self.share(provider), 4),
                "flops_share": _round(self.flops_share(provider)),
                "node_list": [{"name": n.name, "op_type": n.op_type} for n in self.nodes_on(provider)],
            }
        return {"source": self.source, "total_nodes": self.total, "providers": per_ep}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def from_assignment_info(session: ort.InferenceSession, flops_by_name: Mapping[str, float] | None = None) -> Placement:
    """Placement from ORT's recorded graph assignment (requires the config entry at creation)."""
    flops_by_name = flops_by_name or {}
    nodes: list[PlacedNode] = []
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            nodes.append(PlacedNode(node.name, node.op_type, subgraph.ep_name, flops_by_name.get(node.name)))
    return Placement(nodes, "assignment_api")


def from_profile(profile_path: str, flops_by_name: Mapping[str, float] | None = None) -> Placement:
    """Placement from an ORT profiler JSON file (events with cat=Node carry args.provider)."""
    flops_by_name = flops_by_name or {}
    with open(profile_path, encoding="utf-8") as fh:
        events = json.load(fh)
    seen: dict[str, PlacedNode] = {}
    for event in events:
        if event.get("cat") != "Node":
            continue
        args = event.get("args") or {}
        provider = args.get("provider")
        if not provider:
            continue
        name = event.get("name", "")
        for suffix in ("_kernel_time", "_fence_before", "_fence_after"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        if name not in seen:
            seen[name] = PlacedNode(name, args.get("op_name", ""), provider, flops_by_name.get(name))
    return Placement(list(seen.values()), "profiler")


def profile_placement(
    model_path_or_bytes: str | bytes,
    providers: list,
    sess_options: ort.SessionOptions,
    feeds: Mapping[str, Any],
    flops_by_name: Mapping[str, float] | None = None,
) -> Placement:
    """Build a profiling twin of a session, run it once, and read placement from the profile.

    Used on ORT < 1.24 (no assignment API). The twin is separate so that the user's session
    does not pay for profiling.
    """
    from ortpilot.artifacts.scratch import scratch_dir

    with scratch_dir("ortpilot-prof-") as tmp:
        sess_options.enable_profiling = True
        sess_options.profile_file_prefix = os.path.join(tmp, "prof")
        sess = ort.InferenceSession(model_path_or_bytes, sess_options, providers=providers)
        sess.run(None, dict(feeds))
        path = sess.end_profiling()
        try:
            return from_profile(path, flops_by_name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
