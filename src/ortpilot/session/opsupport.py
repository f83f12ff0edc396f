"""Which of a model's ops an execution provider will not run, from real sources only.

Two sources, both of this machine's ORT: the CPU EP's kernel registry
(``get_all_opkernel_def``: an op with no kernel for its opset fails session creation), and,
for every other available provider, a real session on ``[provider, CPU]`` whose placement
shows which nodes the provider left to the CPU. Providers not available here are reported as
unchecked rather than guessed from documentation tables that drift between releases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from ortpilot.eps import CPU_EP
from ortpilot.graph.summary import iter_subgraph_nodes, op_key

# Ops ORT never runs: its graph turns every Constant node (subgraphs too) into an initializer at
# load (onnxruntime/core/graph/graph.cc), so no provider has, or needs, a kernel for them.
FOLDED_AT_LOAD = {("", "Constant")}
NOT_CHECKED = {"AzureExecutionProvider": "runs remote endpoints; it takes no graph nodes"}


@dataclass
class OpSupport:
    """Op types a provider is known not to run for this model, and where that knowledge comes from."""

    provider: str
    source: str
    checked: bool
    ops: dict[str, int] = field(default_factory=dict)  # op key -> node count
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "source": self.source,
            "checked": self.checked,
            "unsupported": [{"op": k, "nodes": v} for k, v in self.ops.items()],
            "note": self.note,
        }


def _since_version(op_type: str, domain: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except Exception:  # contrib and custom ops have no onnx schema
        return None


def _expands_to_function(op_type: str, domain: str, opset: int) -> bool:
    """ORT inlines ops that ONNX defines as functions when no kernel exists (e.g. Gelu)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def kernel_gaps(model: onnx.ModelProto) -> OpSupport:
    """Ops with no CPU kernel in this ORT build for the model's opset (checked by version, not dtype)."""
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C

    kernels: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for kdef in C.get_all_opkernel_def():
        if kdef.provider == CPU_EP:
            kernels.setdefault((kdef.domain or "", kdef.op_name), []).append(tuple(kdef.version_range))
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}
    missing: Counter[str] = Counter()
    for node in [*model.graph.node, *iter_subgraph_nodes(model.graph)]:
        domain = node.domain if node.domain != "ai.onnx" else ""
        if (domain, node.op_type) in local or (domain, node.op_type) in FOLDED_AT_LOAD:
            continue
        ranges = kernels.get((domain, node.op_type))
        opset = opsets.get(domain, 1)
        since = _since_version(node.op_type, domain, opset)
        if ranges and (since is None or any(lo <= since <= hi for lo, hi in ranges)):
            continue
        if _expands_to_function(node.op_type, domain, opset):
            continue
        missing[op_key(node)] += 1
    return OpSupport(
        CPU_EP,
        f"kernel registry of onnxruntime {ort.__version__} (op type and opset version; data types not checked)",
        True,
        dict(missing.most_common()),
    )


def measured_gaps(
    model: str | bytes | onnx.ModelProto, provider: str, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> OpSupport:
    """Build a real session on ``[provider, CPU]`` and list the op types placed on CPU instead.

    Uses the verified session (one layer up, imported here) with policy ``allow`` so that a
    fallback is recorded, not raised.
    """
    from ortpilot.errors import OrtpilotError
    from ortpilot.session.verified import load

    source = "measured: placement of a real session on [provider, CPU]"
    try:
        sess = load(model, [provider, "cpu"], policy="allow", min_coverage=0.0, shapes=shapes)
    except OrtpilotError as exc:
        return OpSupport(provider, source, False, note=f"session could not be built: {exc}")
    failed = [f for f in sess.fallbacks if f.requested == sess.requested[0].name and f.layer in (1, 2, 3)]
    if failed:
        return OpSupport(provider, source, False, note=f"{provider} did not load: {failed[0].reason}")
    if sess.placement is None:
        return OpSupport(provider, source, False, note="placement unavailable in this ORT build")
    left = Counter(n.op_type for n in sess.placement.nodes if n.provider != sess.requested[0].name)
    note = (
        "node names and op types are those of the optimized graph ORT built (fused ops such as "
        "FusedConv appear under their fused names)"
    )
    return OpSupport(provider, source, True, dict(left.most_common()), note)


def unsupported_ops(
    model: onnx.ModelProto,
    source: str | bytes | onnx.ModelProto | None = None,
    providers: list[str] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> list[OpSupport]:
    """Per available provider (or the given ones): ops it will not run, and how that was found out.

    ``model`` is the proto (without external data is fine) for the kernel check; ``source`` is
    what a session is built from (a path for models with external data; default: the proto).
    """

    from ortpilot.providers.plugins import compute_providers

    if providers is None:
        providers = compute_providers()
    out = []
    for provider in providers:
        if provider in NOT_CHECKED:
            out.append(OpSupport(provider, "", False, note=NOT_CHECKED[provider]))
        elif provider == CPU_EP:
            out.append(kernel_gaps(model))
        else:
            out.append(measured_gaps(source if source is not None else model, provider, shapes))
    return out


__all__ = ["OpSupport", "kernel_gaps", "measured_gaps", "unsupported_ops"]
