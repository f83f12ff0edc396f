"""The search space, from what this machine and this model really have.

Candidates come in two layers: model variants (passes: transformer fusion where a transformer
pattern is found, INT8 quantization variants) at ORT's default session settings, then session
knobs (level, intra-op threads, inter-op threads + parallel mode, IOBinding, arena) around the
best model variants. Invalid or pointless combinations are ruled out here, each with a reason
that the report prints.
"""

from __future__ import annotations

import importlib.util
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from ortpilot.eps import CPU_EP
from ortpilot.graph.shapes import graph_inputs
from ortpilot.modelio import model_bytes
from ortpilot.passes.base import given_quantized_ops
from ortpilot.passes.decoder_fusion import count_layers
from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass
from ortpilot.passes.quantize import QuantizePass
from ortpilot.passes.registry import Step
from ortpilot.providers.cpubudget import default_threads_in_budget, ort_default_threads, this_budget
from ortpilot.providers.cpuisa import Int8Rule, int8_rule
from ortpilot.providers.names import ProviderSpec
from ortpilot.providers.openvino import OPENVINO
from ortpilot.providers.plugins import compute_providers, is_plugin_ep
from ortpilot.providers.spec import NOT_COMPUTE
from ortpilot.quantmodes import DYNAMIC, FULL, INT4, INT8_WEIGHTS, QDQ, STATIC
from ortpilot.session.options import LEVELS
from ortpilot.tuning.candidate import Candidate
from ortpilot.tuning.transform import attention_dims

log = logging.getLogger("ortpilot")
HEAVY_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Attention", "LSTM", "GRU", "RNN", "Einsum"}
# Quantization variants, by what usually pays off first. Dynamic (weights INT8, activations at
# run time) suits MatMul-heavy graphs; "w" leaves embeddings and activation x activation
# products float. Static QDQ (calibrated) suits conv nets, where dynamic ConvInteger is slow.
# Which of them, in which order and with which weight range, depends on the CPU's INT8 kernels:
# ``int8_variants`` applies the rule ``providers.cpuisa.int8_rule`` found for this CPU.
DYN_W_PC = Step("quantize", {"mode": DYNAMIC, "per_channel": True, "weights_only": True})
DYN_PC = Step("quantize", {"mode": DYNAMIC, "per_channel": True})
DYN = Step("quantize", {"mode": DYNAMIC, "per_channel": False})
QDQ_PC = Step("quantize", {"mode": QDQ, "per_channel": True})
FULL_PC = Step("quantize", {"mode": FULL, "per_channel": True})
QUANT_VARIANTS: tuple[Step, ...] = (DYN_W_PC, DYN_PC, QDQ_PC, DYN, FULL_PC)
CONV_QUANT_VARIANTS: tuple[Step, ...] = (QDQ_PC, FULL_PC, DYN_W_PC, DYN_PC, DYN)
# Decoders (a KV cache in, presents out): attention fused into GroupQueryAttention, and weight-only
# MatMulNBits, the two things that pay on a decode step, each alone and together.
GQA = Step("decoder_fusion")
W4 = Step("weight_only", {"mode": INT4})
W8 = Step("weight_only", {"mode": INT8_WEIGHTS})
SPIN_KEY = "session.intra_op.allow_spinning"
# OpenVINO: the float model and NNCF's QDQ model (``passes.openvino_int8``), its threads at the CPU budget.
OV_INT8 = Step("openvino_int8")
# A transformer's second INT8 recipe on OpenVINO: SmoothQuant at 0.8 with min-max activation ranges. NNCF's own
# (0.95, its estimator) left MiniLM's worst of 1,000 real sentences at 0.013-0.015 cosine error, this one at
# 0.0047-0.0059 (BENCHMARKS.md, issue 46): which one keeps a model's worst sample is measured, not assumed.
OV_INT8_SMOOTHED = Step("openvino_int8", {"smooth_quant": 0.8, "activation_ranges": "minmax"})
OPENVINO_NOT_TRIED = (
    "transformer fusion and the CPU EP's INT8 variants on OpenVINO",
    "fused contrib ops (Attention, SkipLayerNormalization) do not run on OpenVINO, and a QDQ model from ORT's "
    "quantizer over every op it supports loses the answers there (MiniLM: cosine -0.09); NNCF's QDQ placement "
    "(int8-openvino) is OpenVINO's INT8",
)


SESSION_KNOBS_OFF = (
    "left to the deployment (--no-session-knobs), so threads, optimization level, IOBinding, shape buckets and an "
    "EP's own knobs stay at ORT's defaults; model variants and providers are searched"
)


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
    attention: tuple[int, int] = (0, 0)  # (num_heads, hidden_size) read from the graph, 0 = let ORT detect
    conv_heavy: bool = False
    decoder: bool = False  # past_* inputs: a KV-cache decoder
    gqa_fusion: bool = False  # onnxscript is there to fuse its attention
    int8: Int8Rule | None = None  # this CPU's INT8 rule (None: quantization off)
    default_threads: int = 0  # the intra-op threads ORT's default session starts here (counted)
    int8_reasons: dict[str, str] = field(default_factory=dict)  # INT8 step label -> why it is in the space
    shape_plan: dict[str, Any] | None = None  # the workload's buckets (session.shapeplan), tried as a session knob
    batch: int = 1  # the requests' batch a timed run replays (the first --batch): a server's batches are padded already
    given_int8: dict[str, int] = field(default_factory=dict)  # the quantizer's ops the model came with, by count
    model_mb: float = 0.0  # the model's size with its weights (what a variant's preparation scales with)
    symbolic_inputs: bool = False  # an input has a dim without a fixed size (a sequence, a batch)
    session_knobs: bool = True  # session options (and an EP's own knobs) searched; off keeps ORT's defaults

    @property
    def model_label(self) -> str:
        """What the model without passes is, as candidate labels say it (``Candidate.given``)."""
        return "int8 (as given)" if self.given_int8 else "fp32"

    @property
    def requantize(self) -> bool:
        """Whether quantization variants are searched: asked for, and the model is not quantized already."""
        return self.quantize and not self.given_int8

    @property
    def fusion_step(self) -> Step | None:
        if not self.model_type:
            return None
        heads, hidden = self.attention
        return Step("fusion", {"model_type": self.model_type, "num_heads": heads, "hidden_size": hidden})

    @property
    def default_oversubscribes(self) -> bool:
        """ORT's default pool starts more threads than this process may use: it cannot be the winner."""
        return default_threads_in_budget(self.default_threads, self.cores) > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "default_threads": self.default_threads,
            "providers": [p.to_dict() for p in self.providers],
            "model_type": self.model_type,
            "attention": list(self.attention),
            "conv_heavy": self.conv_heavy,
            "decoder": self.decoder,
            "parallel_branches": self.parallel_branches,
            "quantize": self.quantize,
            "session_knobs": self.session_knobs,
            "int8_rule": self.int8.to_dict() if self.int8 else None,
            "int8_variants": dict(self.int8_reasons),
            "given_int8": dict(self.given_int8),
            "model_mb": round(self.model_mb, 2),
            "excluded": [e.to_dict() for e in self.excluded],
            "shape_plan": self.shape_plan,
            "batch": self.batch,
            "symbolic_inputs": self.symbolic_inputs,
        }


def physical_cores() -> int:
    """The CPUs this process may use (``providers.cpubudget``): intra-op threads never exceed it."""
    return this_budget().cpus


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


def gather_facts(
    model: onnx.ModelProto,
    providers: Sequence[ProviderSpec] | None,
    *,
    quantize: bool = True,
    session_knobs: bool = True,
    int8: Int8Rule | None = None,
    folder_attention: tuple[int, int] = (0, 0),
) -> Facts:
    """What the space is built from; ``int8`` overrides this CPU's measured INT8 rule (tests, what-ifs);
    ``folder_attention``: (num_heads, hidden_size) from the model folder's config.json, used when the
    graph does not say them (a fused model is gated like any candidate, so a wrong config fails there)."""
    excluded: list[Excluded] = []
    if providers:
        chosen = list(providers)
    else:
        chosen = []
        for name in compute_providers():
            if name in NOT_COMPUTE:
                excluded.append(Excluded(name, NOT_COMPUTE[name]))
            else:
                chosen.append(ProviderSpec(name))
    from ortpilot.passes.fusion import detect_model_type

    model_type, why = detect_model_type(model)
    if model_type is None:
        excluded.append(Excluded("transformer fusion", why))
    parallel = has_parallel_branches(model)
    cores = physical_cores()
    if not parallel:
        excluded.append(Excluded("parallel execution mode", "the graph has no parallel branches of heavy ops"))
    elif cores < 2:
        excluded.append(
            Excluded("parallel execution mode", "needs inter-op threads > 1, and this machine has one core")
        )
    ops = [n.op_type for n in model.graph.node]
    conv_heavy = ops.count("Conv") + ops.count("ConvTranspose") > ops.count("MatMul") + ops.count("Gemm")
    decoder = count_layers(model) > 0 and "MatMul" in ops
    gqa = decoder and "GroupQueryAttention" not in ops and importlib.util.find_spec("onnxscript") is not None
    if decoder and not gqa:
        excluded.append(
            Excluded(
                "decoder fusion (GroupQueryAttention)",
                "already fused" if "GroupQueryAttention" in ops else "needs onnxscript (pip install onnxscript)",
            )
        )
    attention = attention_dims(model) if model_type else (0, 0)
    if model_type and attention == (0, 0):
        attention = tuple(folder_attention)  # type: ignore[assignment]
    given_int8 = given_quantized_ops(model)
    if given_int8 and quantize:
        why = (
            f"the model is already quantized ({', '.join(f'{op} x{n}' for op, n in given_int8.items())}): quantizing "
            "it again changes nothing where its weights are INT8 already and breaks it where it meets its quantize "
            "nodes (ORT's QDQ quantizer writes duplicate node names there), so no INT8 variant is built"
        )
        excluded.append(Excluded("INT8 variants", why))
        log.info("INT8 variants left out: %s.", why)
    if not session_knobs:
        excluded.append(Excluded("session knobs", SESSION_KNOBS_OFF))
    default_threads = ort_default_threads()
    if default_threads_in_budget(default_threads, cores):
        excluded.append(
            Excluded(
                "ORT's default threads as the winner",
                (
                    f"ORT's default pool starts {default_threads} intra-op threads and this process may use {cores} CPU"
                    f"{'s' if cores != 1 else ''} ({this_budget().source}): it is measured as the baseline, and "
                    f"'intra={cores}' stands in for it as a deployable choice"
                ),
            )
        )
    return Facts(
        cores,
        chosen,
        model_type,
        parallel,
        quantize,
        excluded,
        attention,
        conv_heavy,
        decoder,
        gqa,
        (int8 or int8_rule()) if quantize else None,
        default_threads=default_threads,
        given_int8=given_int8,
        model_mb=model_bytes(model) / 2**20,
        symbolic_inputs=any(i.symbolic for i in graph_inputs(model)),
        session_knobs=session_knobs,
    )


def int8_variants(rule: Int8Rule, conv_heavy: bool) -> list[tuple[Step, str]]:
    """The INT8 steps to try on a CPU with ``rule``, most promising first, each with the rule's reason.

    From ORT's quantization guide: x86 without VNNI runs u8s8 through ``vpmaddubsw``, whose pair
    sums saturate, so 7-bit weights (``reduce_range``, per channel first) and U8U8 weights come
    first, and the u8s8 steps as they are last; VNNI and AMX accumulate exactly (no reduced
    range needed); on Arm, S8S8 QDQ is ORT's first choice and its dynamic kernels are exact.
    """
    base = CONV_QUANT_VARIANTS if conv_heavy else QUANT_VARIANTS
    if rule.name == "x86-no-vnni":
        why = "x86 without VNNI: u8s8 pair sums saturate in vpmaddubsw"
        out = [
            (s.with_options(reduce_range=True), f"{why}; reduce_range (7-bit weights) keeps them in int16")
            for s in base
        ]
        out += [
            (s.with_options(weight_type="quint8"), f"{why}; U8U8 weights take ORT's exact u8u8 kernel")
            for s in base
            if s.spec.mode == DYNAMIC and s.spec.per_channel
        ]
        out += [(s, f"{why}: tried as they are, last (ORT: saturation is often harmless)") for s in base]
        return out
    if rule.name == "arm-dot":
        s8s8 = QDQ_PC.with_options(activation_type="qint8")
        return [(s8s8, "Arm: S8S8 QDQ is ORT's first choice there")] + [
            (s, "Arm dot product: ORT's INT8 kernels are exact") for s in base
        ]
    reason = {
        "vnni": "VNNI: u8s8 products accumulate exactly; 8-bit weights as they are",
        "amx": "AMX: u8s8 products accumulate exactly; 8-bit weights as they are",
    }.get(rule.name, "no INT8 rule for this CPU: the default INT8 variants, measured like any other")
    return [(s, reason) for s in base]


def model_variants(facts: Facts) -> list[tuple[Step, ...]]:
    """Pass pipelines to try, most promising first: fusion, then each INT8 variant fused then plain."""
    fusion = facts.fusion_step
    prefixes: list[tuple[Step, ...]] = [(fusion,), ()] if fusion else [()]
    variants: list[tuple[Step, ...]] = [(fusion,)] if fusion else []
    if facts.decoder:  # before the INT8 variants: what a decode step is made of, weights and attention
        if facts.gqa_fusion:
            variants.append((GQA,))
        if facts.requantize:
            variants.extend([(GQA, W4)] if facts.gqa_fusion else [])
            variants.extend([(W4,), (W8,)])
    if facts.requantize and facts.int8 is not None:
        for quant, reason in int8_variants(facts.int8, facts.conv_heavy):
            facts.int8_reasons[quant.label()] = reason
            variants.extend(prefix + (quant,) for prefix in prefixes)
    return variants


def provider_chain(spec: ProviderSpec) -> tuple[dict[str, Any], ...]:
    return ({"name": spec.name, "options": dict(spec.options)},)


def first_candidates(facts: Facts, baseline: Candidate) -> list[Candidate]:
    """Model variants on the first provider, every other provider with the plain model, and, when
    the first provider is not the CPU, the model variants on the CPU too (an INT8 model on the
    CPU can beat the float one on an accelerator EP: the search must see both)."""
    out: list[Candidate] = [default_stand_in(facts, baseline)] if facts.default_oversubscribes else []
    if facts.batch == 1:  # at a batch of many, the buckets wait as knobs (``shaped_candidates``)
        out.extend(shaped_candidates(facts, baseline))
    primary = facts.providers[0] if facts.providers else ProviderSpec(CPU_EP)
    out.extend(_variants_on(primary, facts, baseline))
    for spec in facts.providers:
        if spec.name == OPENVINO:
            out.extend(_variants_on(spec, facts, baseline) if primary.name != OPENVINO else [])
        elif spec.name != CPU_EP or primary.name != CPU_EP:
            cand = baseline.derived(passes=(), providers=provider_chain(spec))
            if cand.id != baseline.id:
                out.append(cand)
    cpu = next((spec for spec in facts.providers if spec.name == CPU_EP), None)
    if cpu is not None and primary.name != CPU_EP:
        out.extend(_variants_on(cpu, facts, baseline))
    return within_budget(out, facts)


def shaped_candidates(facts: Facts, baseline: Candidate) -> list[Candidate]:
    """The source model on each provider with the workload's shape plan (a session per bucket): early, as they
    cost a session each and tell whether padding is invisible to this model before any variant builds on them.
    Not where a timed request is a server's batch (``Facts.batch`` > 1): each batch is padded to its longest already
    and a bucket pads it further, and its screening replays calls of 32 (MiniLM on a slow 2-CPU machine: ~12 s
    each, OpenVINO's bucket sessions 0.85-0.86x its dynamic one in five tunes, the CPU EP's 0.7x, and the two took
    25 s of a 120 s budget whose INT8 variants then did not fit). There the plan stays a knob: of ORT's default
    session, with the other knobs on the model as given (by their expected gain per second), and around the best
    candidates."""
    if not facts.shape_plan:
        return []
    out = []
    for spec in facts.providers or [ProviderSpec(CPU_EP)]:
        chain = provider_chain(openvino_spec(spec, facts.cores) if spec.name == OPENVINO else spec)
        out.append(baseline.derived(passes=(), providers=chain).with_shape_plan(facts.shape_plan))
    return out


def default_stand_in(facts: Facts, baseline: Candidate) -> Candidate:
    """ORT's default session with its intra-op threads capped at the CPU budget (see ``Facts.default_oversubscribes``)."""
    return baseline.with_settings(intra_op_threads=facts.cores)


def within_budget(cands: Sequence[Candidate], facts: Facts) -> list[Candidate]:
    """``cands`` with ORT's default thread count (0) replaced by the CPU budget where the default
    would start more threads than that: no candidate but the baseline itself oversubscribes."""
    if not facts.default_oversubscribes:
        return list(cands)
    return [
        c.with_settings(intra_op_threads=facts.cores) if c.settings.intra_op_threads == 0 and not c.baseline else c
        for c in cands
    ]


def openvino_spec(spec: ProviderSpec, cores: int) -> ProviderSpec:
    """OpenVINO with its inference threads at the CPU budget unless the user set them (its own default
    counts the machine's cores, not this process's affinity or quota)."""
    return ProviderSpec(spec.name, {"num_of_threads": str(cores), **spec.options})


def _openvino_variants(spec: ProviderSpec, facts: Facts, baseline: Candidate) -> list[Candidate]:
    """The float model and, where quantization is on and NNCF is installed, NNCF's QDQ model, on OpenVINO."""
    ov = openvino_spec(spec, facts.cores)
    # On a CPU with BF16 units OpenVINO runs float layers in bf16 unless told ACCURACY: both are tried
    # (bf16 is faster, and wrong on some models: Magika's fp32 on OpenVINO missed the gate at cosine 0.49).
    chains = [provider_chain(ov)]
    if _has_bf16() and "precision" not in ov.options:
        chains.append(provider_chain(ProviderSpec(ov.name, {**ov.options, "precision": "ACCURACY"})))
    out = [baseline.derived(passes=(), providers=chain) for chain in chains]
    facts.excluded.append(Excluded(*OPENVINO_NOT_TRIED))
    if facts.symbolic_inputs and not facts.decoder and not compiles_per_shape(facts):
        facts.excluded.append(
            Excluded(
                f"OpenVINO compiled per input shape ({PER_SHAPE_OPTION})",
                "the onnxruntime-ep-openvino plugin has no such option; the onnxruntime-openvino distribution has",
            )
        )
    if not facts.requantize:
        return out
    if importlib.util.find_spec("nncf") is None:
        facts.excluded.append(
            Excluded("int8-openvino", "needs NNCF: pip install 'ortpilot[openvino-plugin]' (or pip install nncf)")
        )
        return out
    facts.int8_reasons[OV_INT8.label()] = "OpenVINO: NNCF's QDQ placement (MatMul/Gemm/Conv inputs; norms in float)"
    if facts.model_type:  # a transformer: SmoothQuant applies (on every chain: each recipe meets the same sessions)
        facts.int8_reasons[OV_INT8_SMOOTHED.label()] = (
            "OpenVINO: NNCF's placement with SmoothQuant 0.8 and min-max activation ranges (a transformer's "
            "activation outliers)"
        )
        # First of the two, where a budget affords one: the same prior gain and cost, and the one measured to keep
        # MiniLM's worst sentence (a gate of 50 held-out sentences read both at 0.0028: a 120 s tune that reached
        # NNCF's own first shipped it, and its worst of 2,000 sentences of traffic was 0.9868)
        out += [baseline.derived(passes=(OV_INT8_SMOOTHED,), providers=chain) for chain in chains]
    out += [baseline.derived(passes=(OV_INT8,), providers=chain) for chain in chains]
    return out


def _has_bf16() -> bool:
    from ortpilot.providers.cpuisa import this_cpu

    flags = this_cpu().flags
    return bool(flags.get("amx_bf16") or flags.get("avx512_bf16"))


def _variants_on(spec: ProviderSpec, facts: Facts, baseline: Candidate) -> list[Candidate]:
    if spec.name == OPENVINO:
        return _openvino_variants(spec, facts, baseline)
    out = []
    for passes in model_variants(facts):
        if spec.name != CPU_EP and any(p.options.cpu_only for p in passes):  # dynamic INT8's integer kernels
            facts.excluded.append(
                Excluded(
                    f"{'+'.join(map(str, passes))} on {spec.short}",
                    "dynamic INT8 ops (MatMulInteger, DynamicQuantizeLinear) run only on CPU",
                )
            )
            continue
        out.append(baseline.derived(passes=passes, providers=provider_chain(spec)))
    return out


def knob_variants(base: Candidate, facts: Facts) -> list[Candidate]:
    """One knob changed at a time from ``base``; what is ruled out goes to ``facts.excluded``. Only the model
    knob (``fusion_knobs``) when the tune leaves session options to the deployment (``--no-session-knobs``)."""
    if not facts.session_knobs:
        return [c for c in within_budget(fusion_knobs(base), facts) if c.id != base.id]
    if base.providers[0]["name"] == OPENVINO:
        return openvino_knobs(base, facts)
    out: list[Candidate] = []
    for level in ("basic", "extended"):
        if level in LEVELS and base.settings.level != level:
            out.append(base.with_settings(level=level))
    threads = sorted({1, max(1, facts.cores // 2), facts.cores})
    for n in threads:
        if n != base.settings.intra_op_threads:
            out.append(base.with_settings(intra_op_threads=n))
    if facts.parallel_branches and facts.cores >= 2:
        out.append(
            base.with_settings(execution_mode="parallel", inter_op_threads=2, intra_op_threads=max(1, facts.cores // 2))
        )
    if not base.shape_plan:
        out.append(base.with_iobinding(True))
    if facts.shape_plan and not base.shape_plan:
        out.append(base.with_shape_plan(facts.shape_plan))
    out.extend(fusion_knobs(base))
    on_cpu = base.providers[0]["name"] == CPU_EP
    if on_cpu:
        out.append(base.with_settings(enable_cpu_mem_arena=False))
    if facts.cores >= 2:
        # Idle intra-op threads spin by default; on a VM with few vCPUs the spinning competes with
        # the threads doing the work (measured here: MiniLM fp32 45 ms spinning vs 32 ms not).
        out.append(base.with_settings(config_entries={**base.settings.config_entries, SPIN_KEY: "0"}))
    return [c for c in within_budget(out, facts) if c.id != base.id]


def fusion_knobs(base: Candidate) -> list[Candidate]:
    """``base`` with its transformer fusion's residual Adds and LayerNormalizations left apart (no
    SkipLayerNormalization): a model knob, since which runs faster is the CPU kernel's to say, and the
    steps after the fusion (an INT8 recipe and its exclusions) build on the other fused model the same way."""
    steps = base.passes
    if not steps or steps[0].name != "fusion" or not steps[0].options.skip_layer_norm:
        return []
    return [base.derived(passes=(steps[0].with_options(skip_layer_norm=False), *steps[1:]))]


def openvino_knobs(base: Candidate, facts: Facts) -> list[Candidate]:
    """OpenVINO's own knobs (ORT's session knobs do not reach its kernels): its precision (on a CPU with
    AMX or AVX-512 BF16 it runs a float model in bf16 unless told ACCURACY), fewer inference threads, and
    a compile per input shape (``compiles_per_shape``)."""
    options = dict(base.providers[0].get("options") or {})
    out = []
    if options.get("precision") is None:
        out.append(base.with_provider_options(precision="ACCURACY"))
    if compiles_per_shape(facts) and not base.shape_plan and options.get(PER_SHAPE_OPTION) is None:
        out.append(base.with_provider_options(**{PER_SHAPE_OPTION: "True"}))
    threads = int(options.get("num_of_threads") or facts.cores)
    if threads > 1:
        out.append(base.with_provider_options(num_of_threads=str(max(1, threads // 2))))
    if facts.shape_plan and not base.shape_plan:  # OpenVINO compiles each bucket for its static shape
        out.append(base.with_shape_plan(facts.shape_plan))
    return [c for c in out if c.id != base.id]


# onnxruntime-openvino's option to compile the model for each input shape it meets (kept per shape in the
# session) instead of once with its dims left dynamic. OpenVINO's static-shape kernels are its fastest (native
# OpenVINO compiled per exact shape: 3.10x ORT's default at 32 sentences per call against 2.72x dynamic, MiniLM
# INT8, AMD VNNI), but through the EP the measurements split (2.84x against 2.96x dynamic in one benchmark, 2.90-
# 3.02x against 2.72-2.82x in scratch runs, 2.92x against 2.94x in a tune): a knob the tune measures, not a rule.
# A new shape's first run costs 20-55 ms; 48 shapes up to 32x128 held less memory than the dynamic session.
PER_SHAPE_OPTION = "disable_dynamic_shapes"


def compiles_per_shape(facts: Facts) -> bool:
    """Whether the tune tries OpenVINO compiled per input shape: the model has a dim left free, it is not a
    decoder (whose every step is a new shape), and the EP is the distribution's (the plugin has no such
    option; ``_openvino_variants`` says so in the report)."""
    return facts.symbolic_inputs and not facts.decoder and not is_plugin_ep(OPENVINO)


def combine(base: Candidate, winners: Sequence[Candidate]) -> Candidate | None:
    """``base`` with every knob that beat it on its own, applied together."""
    if len(winners) < 2:
        return None
    default = base.settings.to_dict()
    data = dict(default)
    iobinding = base.iobinding
    options = dict(base.providers[0].get("options") or {})
    for cand in winners:
        options.update(cand.providers[0].get("options") or {})
        for key, value in cand.settings.to_dict().items():
            if value != default[key]:
                data[key] = value
        iobinding = iobinding or cand.iobinding
    if data.get("execution_mode") == "parallel" and int(data.get("inter_op_threads", 0)) <= 1:
        return None  # parallel mode needs inter-op threads > 1
    from ortpilot.session import SessionSettings

    shape_plan = base.shape_plan or next((c.shape_plan for c in winners if c.shape_plan), None)
    if shape_plan:  # its bucket sessions have static shapes: nothing is left to compile per shape
        options.pop(PER_SHAPE_OPTION, None)
    providers = ({**base.providers[0], "options": options}, *base.providers[1:])
    passes = next((c.passes for c in winners if c.passes != base.passes), base.passes)  # a model knob's
    return base.derived(
        passes=passes,
        providers=providers,
        settings=SessionSettings.from_dict(data),
        iobinding=iobinding and not shape_plan,
        shape_plan=shape_plan,
    )


EXCLUDING_PASSES = (QuantizePass, OpenVINOInt8Pass)  # INT8 steps that leave named nodes in float


def with_exclusions(cand: Candidate, nodes: Sequence[str]) -> Candidate:
    """``cand`` with ``nodes`` left in float by its (last) INT8 step (ORT's quantizer or NNCF's)."""
    steps = list(cand.passes)
    last = max(i for i, step in enumerate(steps) if isinstance(step.spec, EXCLUDING_PASSES))
    steps[last] = steps[last].with_options(exclude=sorted({*steps[last].spec.nodes_to_exclude, *nodes}))
    return cand.derived(passes=tuple(steps))


# What a model variant's steps are expected to gain over ORT's default (speedup - 1): the prior the search orders
# model variants by, per second of their estimated preparation (``Search``), not a figure it reports. From this
# project's measurements (BENCHMARKS.md, "Quantization: dynamic vs static QDQ on conv nets, MiniLM", AMD VNNI CPU):
# dynamic INT8 made MiniLM 1.9-2.2x faster and both conv nets 3-5x slower (ConvInteger); static QDQ per channel
# ran the conv nets 1.29-1.69x, full QDQ 1.53-1.95x. Transformer and decoder fusion and weight-only INT4/INT8 have
# no such table here; their priors are set below the INT8 ones they usually come with (the demo decoder's gqa ran
# 1.30x). OpenVINO's INT8 (NNCF) on MiniLM: 4.2-4.4x ORT's default at 1x128 (Intel AMX, the plugin), 2.9-3.3x at
# batches of 32 and 1.7-2.1x one sentence per call of real lengths (AMD VNNI, the distribution), where dynamic INT8
# ran 1.5-1.8x: ranked below it, a cold 120 s tune of batches of 32 spent its budget on the dynamic variants and
# missed OpenVINO's INT8 by a second (1.55x shipped). On the demo CNN it ran 1.45x (AMX) and lost on AMD.
# Steps of one pipeline compound. Variants with equal priors and costs keep the space's order (the INT8 rule's).
STEP_GAINS = {
    "fusion": 0.2,
    "decoder_fusion": 0.3,
    "openvino_int8": (1.5, 0.45),  # (MatMul-heavy, conv net)
    ("quantize", DYNAMIC): (0.9, 0.05),  # (MatMul-heavy, conv net)
    ("quantize", QDQ): (0.3, 0.5),
    ("quantize", STATIC): (0.3, 0.5),
    ("quantize", FULL): (0.3, 0.6),
    ("weight_only", INT4): 0.3,
    ("weight_only", INT8_WEIGHTS): 0.2,
}


# What one session knob on the model as given is expected to gain (speedup - 1), the same kind of prior: the
# knobs alone moved float models 0.57-1.02x in this project's tunes (PP-OCRv6 det: arena=off 1.02x; MiniLM fp32 at
# batches of 32: level=extended 1.01x, intra=1 0.57x; AMD VNNI). The search runs the knobs on the model as given
# where this per second of a session and its screening beats the next model variant's prior per second.
KNOB_GAIN = 0.05


def expected_gain(cand: Candidate, facts: Facts) -> float:
    """The prior speedup - 1 of ``cand``'s passes (``STEP_GAINS``, compounded); 0 for a candidate without passes."""
    speedup = 1.0
    for step in cand.passes:
        gain = STEP_GAINS.get((step.name, step.get("mode")), STEP_GAINS.get(step.name, 0.0))
        if isinstance(gain, tuple):
            gain = gain[1] if facts.conv_heavy else gain[0]
        speedup *= 1.0 + float(gain)
    return speedup - 1.0


def _dynamic_int8(step: Step) -> bool:
    return isinstance(step.spec, QuantizePass) and step.spec.mode == DYNAMIC
