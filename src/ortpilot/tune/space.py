"""The search space, from what this machine and this model really have.

Candidates come in two layers: model variants (passes: transformer fusion where a transformer
pattern is found, INT8 quantization variants) at ORT's default session settings, then session
knobs (level, intra-op threads, inter-op threads + parallel mode, IOBinding, arena) around the
best model variants. Invalid or pointless combinations are ruled out here, each with a reason
that the report prints.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnxruntime as ort

from ortpilot.providers.names import ProviderSpec
from ortpilot.session.options import LEVELS
from ortpilot.tune.candidate import Candidate, PassStep
from ortpilot.tune.transform import detect_transformer

CPU = "CPUExecutionProvider"
# Providers that ORT lists but that run nothing locally.
NOT_COMPUTE = {"AzureExecutionProvider": "a remote-endpoint provider; it runs no local compute"}
HEAVY_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Attention", "LSTM", "GRU", "RNN", "Einsum"}
# Quantization variants: dynamic (weights INT8, activations at run time), weights-only dynamic
# (attention score products stay float), static QDQ of weight ops, and full QDQ of every op.
QUANT_VARIANTS: tuple[PassStep, ...] = (
    {"pass": "quantize", "mode": "dynamic", "per_channel": True, "weights_only": True},
    {"pass": "quantize", "mode": "dynamic", "per_channel": True},
    {"pass": "quantize", "mode": "dynamic", "per_channel": False},
    {"pass": "quantize", "mode": "qdq", "per_channel": True},
    {"pass": "quantize", "mode": "full", "per_channel": True},
)
# Only the CPU EP has the integer kernels dynamic quantization emits (MatMulInteger & co.).
INT8_DYNAMIC_PROVIDERS = {CPU}


@dataclass(frozen=True)
class Excluded:
    """A combination not tried, and why."""

    what: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "reason": self.reason}


@dataclass
class Facts:
    """What the search space is built from."""

    cores: int
    providers: list[ProviderSpec]
    model_type: str | None
    parallel_branches: bool
    quantize: bool = True
    excluded: list[Excluded] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "providers": [p.to_dict() for p in self.providers], "model_type": self.model_type,
                "parallel_branches": self.parallel_branches, "quantize": self.quantize,
                "excluded": [e.to_dict() for e in self.excluded]}


def physical_cores() -> int:
    """Cores this process may use (affinity), which is what intra-op threads should not exceed."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def has_parallel_branches(model: onnx.ModelProto) -> bool:
    """True when two heavy nodes sit at the same depth of the graph (could run concurrently)."""
    depth: dict[str, int] = {}
    per_level: dict[int, int] = defaultdict(int)
    for node in model.graph.node:  # nodes are topologically sorted in a valid model
        level = 1 + max((depth.get(i, 0) for i in node.input if i), default=0)
        for out in node.output:
            depth[out] = level
        if node.op_type in HEAVY_OPS:
            per_level[level] += 1
            if per_level[level] >= 2:
                return True
    return False


def gather_facts(model: onnx.ModelProto, providers: Sequence[ProviderSpec] | None, *, quantize: bool = True) -> Facts:
    excluded: list[Excluded] = []
    if providers:
        chosen = list(providers)
    else:
        chosen = []
        for name in ort.get_available_providers():
            if name in NOT_COMPUTE:
                excluded.append(Excluded(name, NOT_COMPUTE[name]))
            else:
                chosen.append(ProviderSpec(name))
    model_type = detect_transformer(model)
    if model_type is None:
        excluded.append(Excluded("transformer fusion", "no attention pattern (Softmax + MatMul + LayerNorm) in the graph"))
    parallel = has_parallel_branches(model)
    cores = physical_cores()
    if not parallel:
        excluded.append(Excluded("parallel execution mode", "the graph has no parallel branches of heavy ops"))
    elif cores < 2:
        excluded.append(Excluded("parallel execution mode", "needs inter-op threads > 1, and this machine has one core"))
    return Facts(cores, chosen, model_type, parallel, quantize, excluded)


def model_variants(facts: Facts) -> list[tuple[PassStep, ...]]:
    """Pass pipelines to try, most promising first (fusion before quantization)."""
    fusions: list[tuple[PassStep, ...]] = [()]
    if facts.model_type:
        fusions.insert(0, ({"pass": "fusion", "model_type": facts.model_type},))
    variants: list[tuple[PassStep, ...]] = [f for f in fusions if f]
    if facts.quantize:
        for quant in QUANT_VARIANTS:
            for fused in fusions:
                variants.append(tuple(fused) + (quant,))
    return variants


def provider_chain(spec: ProviderSpec) -> tuple[dict[str, Any], ...]:
    return ({"name": spec.name, "options": dict(spec.options)},)


def first_candidates(facts: Facts, baseline: Candidate) -> list[Candidate]:
    """Model variants on the first provider, plus every other provider with the plain model."""
    out: list[Candidate] = []
    primary = facts.providers[0] if facts.providers else ProviderSpec(CPU)
    for passes in model_variants(facts):
        quant = any(p.get("pass") == "quantize" for p in passes)
        if quant and primary.name not in INT8_DYNAMIC_PROVIDERS and any(p.get("mode") == "dynamic" for p in passes):
            facts.excluded.append(Excluded(f"{'+'.join(map(str, passes))} on {primary.short}",
                                           "dynamic INT8 ops (MatMulInteger, DynamicQuantizeLinear) run only on CPU"))
            continue
        out.append(Candidate(passes, provider_chain(primary), baseline.settings))
    for spec in facts.providers:
        if spec.name != CPU or primary.name != CPU:
            cand = Candidate((), provider_chain(spec), baseline.settings)
            if cand.id != baseline.id:
                out.append(cand)
    return out


def knob_variants(base: Candidate, facts: Facts) -> list[Candidate]:
    """One knob changed at a time from ``base``; what is ruled out goes to ``facts.excluded``."""
    out: list[Candidate] = []
    for level in ("basic", "extended"):
        if level in LEVELS and base.settings.level != level:
            out.append(base.with_settings(level=level))
    threads = sorted({1, max(1, facts.cores // 2), facts.cores})
    for n in threads:
        if n != base.settings.intra_op_threads:
            out.append(base.with_settings(intra_op_threads=n))
    if facts.parallel_branches and facts.cores >= 2:
        out.append(base.with_settings(execution_mode="parallel", inter_op_threads=2,
                                      intra_op_threads=max(1, facts.cores // 2)))
    out.append(base.with_iobinding(True))
    on_cpu = base.providers[0]["name"] == CPU
    if on_cpu:
        out.append(base.with_settings(enable_cpu_mem_arena=False))
    return [c for c in out if c.id != base.id]


def combine(base: Candidate, winners: Sequence[Candidate]) -> Candidate | None:
    """``base`` with every knob that beat it on its own, applied together."""
    if len(winners) < 2:
        return None
    default = base.settings.to_dict()
    data = dict(default)
    iobinding = base.iobinding
    for cand in winners:
        for key, value in cand.settings.to_dict().items():
            if value != default[key]:
                data[key] = value
        iobinding = iobinding or cand.iobinding
    if data.get("execution_mode") == "parallel" and int(data.get("inter_op_threads", 0)) <= 1:
        return None  # parallel mode needs inter-op threads > 1
    from ortpilot.session import SessionSettings

    return Candidate(base.passes, base.providers, SessionSettings.from_dict(data), iobinding)


RULES = ("parallel execution mode needs inter-op threads > 1",
         "intra-op threads never exceed the cores this process may use",
         "dynamic INT8 only on the CPU EP (its integer kernels)",
         "fusion only where a transformer pattern is detected")
