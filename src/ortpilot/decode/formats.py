"""More than one weight format of one decoder, bound to one KV buffer; each step on the fastest.

Which weight format is fastest depends on how many rows a run has, and the scheduler knows that
number before every step. On the 2-core VNNI machine of BENCHMARKS.md a one-row decode step of
SmolLM2-135M is 3.5x faster with 4-bit ``MatMulNBits`` than in fp32, but a 128-token prefill is
faster in fp32 (its int8-compute kernel quantizes activations and unpacks the weights again for
every pair of rows). So a :class:`FormatSet` holds several sessions of the same decoder (the
model as given, ``base``, and formats built from it or loaded), each with a
:class:`~ortpilot.decode.batched.BatchedLoop` on the very same cache arrays and lengths, and a
:class:`FormatPlan` that names the format for a decode step of R rows and a prefill run of T
tokens. The plan comes from a measurement (:func:`measure_formats`, at load, formats taking turns
for a few rounds), never from a constant, and it is plain data: ``to_dict`` / ``from_dict`` keep
it for the next start.

Every format's session has the base session's settings, spinning threads included. Measured on
2 cores (SmolLM2-135M, 8-row int4 step): 19.2 ms with ORT's spinning idle threads, 23.6 ms
without; but 37.7 ms right after another session's run while its threads still spin (19.8 ms
without spinning). A plan usually keeps every decode step on one format and switches at a
prefill, so the switch costs about a step per prefill, and spinning stays as configured
(``session.intra_op.allow_spinning`` 0 in the settings turns it off for all of them). The
measurement runs one untimed step of a format before timing it, so that the switch is not
charged to its first row count.

Every format but ``base`` passes the generation gate against ``base`` first (the decode probe of
decode/gate.py), and formats that disagree on the vocabulary or the cache layout are refused:
they could not share a buffer. Greedy identity with several formats: each token is the argmax
of the format that ran its step, reading cache rows that the formats which ran the earlier
steps wrote, so a stream's tokens depend on which formats ran it (its batch's row counts), not
only on its prompt; with one format the old guarantee holds (tokens equal single-stream
``generate``'s). The benchmark counts the answers that changed (docs/concepts/decode-engine.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ortpilot.decode.batched import BatchedLoop, kv_layout
from ortpilot.decode.generate import Generator
from ortpilot.decode.options import BASE, DEFAULT_FORMAT_MIN_TOP1, format_name
from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.quantmodes import WEIGHT_ONLY_MODES

log = logging.getLogger("ortpilot")
BUILT_FORMATS = WEIGHT_ONLY_MODES  # WeightOnlyPass modes built from the base model at load
MAX_PREFILL_MEASURED = 128  # longer prefills take the plan's choice for this many tokens
_ROW_POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class FormatPlan:
    """The format for a decode step of R rows and a prefill run of T tokens, and the timings behind it.

    ``decode`` and ``prefill`` hold (measured count, fastest format) sorted by count; a count
    between two measured ones takes the next measured one above it, a larger one the largest.
    """

    decode: tuple[tuple[int, str], ...]
    prefill: tuple[tuple[int, str], ...]
    timings_ms: Mapping[str, Mapping[str, Mapping[int, float]]] = field(default_factory=dict)

    @classmethod
    def single(cls, name: str) -> FormatPlan:
        return cls(((1, name),), ((1, name),))

    @property
    def formats(self) -> set[str]:
        return {f for _, f in self.decode} | {f for _, f in self.prefill}

    def for_step(self, rows: int) -> str:
        return _pick(self.decode, rows)

    def for_prefill(self, tokens: int) -> str:
        return _pick(self.prefill, tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "decode": [list(p) for p in self.decode],
            "prefill": [list(p) for p in self.prefill],
            "timings_ms": {
                k: {f: {str(n): ms for n, ms in v.items()} for f, v in t.items()} for k, t in self.timings_ms.items()
            },
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FormatPlan:
        timings = {
            kind: {f: {int(n): float(ms) for n, ms in v.items()} for f, v in per.items()}
            for kind, per in (doc.get("timings_ms") or {}).items()
        }
        return cls(
            tuple((int(n), str(f)) for n, f in doc["decode"]),
            tuple((int(n), str(f)) for n, f in doc["prefill"]),
            timings,
        )


def _pick(points: Sequence[tuple[int, str]], count: int) -> str:
    for measured, name in points:
        if count <= measured:
            return name
    return points[-1][1]


def row_points(max_rows: int) -> list[int]:
    """Decode row counts to measure: 1, 2, 3, 4, 6, 8, 12, ... up to ``max_rows``, and ``max_rows``."""
    return sorted({r for r in _ROW_POINTS if r <= max_rows} | {max_rows})


def prefill_points(max_length: int) -> list[int]:
    """Prefill lengths to measure: 2, 4, 8, ... up to 128 tokens, as far as a stream holds them."""
    top = min(MAX_PREFILL_MEASURED, max_length - 1)
    points, n = [], 2
    while n <= top:
        points.append(n)
        n *= 2
    return points or [max(1, top)]


def measure_formats(
    loops: Mapping[str, BatchedLoop],
    *,
    rows: Sequence[int] | None = None,
    prefill: Sequence[int] | None = None,
    rounds: int = 3,
    seed: int = 0,
) -> FormatPlan:
    """Time each format's decode steps and prefill runs on the shared buffer; the fastest per count.

    Runs before any request (it writes garbage into the slots and leaves every length 0). The
    formats take turns within each round, in an order rotated every round, so that a noisy moment
    hits all of them; a count's time is the median over rounds. Decode steps run at a context of
    up to 64 tokens per row.
    """
    names = list(loops)
    first = loops[names[0]]
    rows = list(rows or row_points(first.slots))
    prefill = list(prefill or prefill_points(first.max_length))
    vocab = first.sig.vocab_size or 2
    context = max(1, min(64, first.max_length // 2))
    rng = np.random.default_rng(seed)
    decode_ms: dict[str, dict[int, list[float]]] = {n: {r: [] for r in rows} for n in names}
    prefill_ms: dict[str, dict[int, list[float]]] = {n: {t: [] for t in prefill} for n in names}

    def step(loop: BatchedLoop, count: int) -> float:
        first.lengths[:count] = context
        tokens = {slot: int(rng.integers(0, vocab)) for slot in range(count)}
        start = time.perf_counter()
        loop.step(tokens)
        return time.perf_counter() - start

    def fill(loop: BatchedLoop, count: int) -> float:
        first.lengths[0] = 0
        ids = rng.integers(0, vocab, size=count)
        start = time.perf_counter()
        loop.prefill(0, ids)
        return time.perf_counter() - start

    try:
        for name in names:  # warm-up: the first run of each shape builds its binding and ORT's buffers
            for r in rows:
                step(loops[name], r)
            fill(loops[name], prefill[0])
        for rnd in range(rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                step(loops[name], rows[0])  # untimed: the previous format's threads may still spin
                for r in rows:
                    decode_ms[name][r].append(step(loops[name], r) * 1e3)
                for t in prefill:
                    prefill_ms[name][t].append(fill(loops[name], t) * 1e3)
    finally:
        first.lengths[:] = 0
    decode = {n: {r: float(np.median(v)) for r, v in per.items()} for n, per in decode_ms.items()}
    filled = {n: {t: float(np.median(v)) for t, v in per.items()} for n, per in prefill_ms.items()}
    return FormatPlan(
        tuple((r, min(names, key=lambda n: decode[n][r])) for r in rows),
        tuple((t, min(names, key=lambda n: filled[n][t])) for t in prefill),
        {"decode": decode, "prefill": filled},
    )


def check_same_decoder(generators: Mapping[str, Generator]) -> None:
    """Refuse formats that could not share one KV buffer: another vocabulary or another cache layout."""
    names = list(generators)
    ref = generators[names[0]].signature
    for name in names[1:]:
        sig = generators[name].signature
        if sig.vocab_size != ref.vocab_size:
            raise UsageError(
                f"formats: '{name}' has a vocabulary of {sig.vocab_size} tokens and '{names[0]}' one of "
                f"{ref.vocab_size}; weight formats of one engine must be the same decoder."
            )
        if kv_layout(sig) != kv_layout(ref):
            raise UsageError(
                f"formats: '{name}' and '{names[0]}' disagree on the KV cache layout ({len(sig.cache)} vs "
                f"{len(ref.cache)} past/present pairs, dims and dtypes must match), so they cannot share one KV "
                "buffer; build every format from the same fused decoder."
            )


def _base_proto(base: Generator) -> onnx.ModelProto:
    """The base model with its weights (a session loaded from a path keeps only the graph)."""
    from ortpilot.modelio import load_model

    vs = base.vsession
    return load_model(vs.model_path) if vs.model_path is not None else vs.model


def build_format(base: onnx.ModelProto, spec: str) -> onnx.ModelProto | str:
    """The model of format ``spec``: a weight-only build of ``base`` (``int4``, ``int8-weights``), or
    the file of ``NAME=PATH``."""
    if "=" in spec:
        path = spec.split("=", 1)[1]
        if not os.path.isfile(path):
            raise UsageError(f"formats: '{spec}' names the file '{path}', which does not exist.")
        return path
    if spec not in BUILT_FORMATS:
        raise UsageError(
            f"formats: unknown weight format '{spec}'; give {BASE} (the model as given), "
            f"{', '.join(BUILT_FORMATS)} (built from it at load) or NAME=PATH (a model file)."
        )
    from ortpilot.passes.base import SourceModel
    from ortpilot.passes.weight_only import WeightOnlyPass

    return WeightOnlyPass(spec).transform(SourceModel(base, None, "")).model


def gate_formats(
    base: Generator, others: Mapping[str, Generator], prompts: Sequence[Sequence[int]] | None, min_top1: float
) -> dict[str, Any]:
    """The generation gate of every format against ``base``; AccuracyGateError (exit 1) for one that fails."""
    from ortpilot.decode.gate import compare_decoders, make_prompts, reference_run
    from ortpilot.gate.generation import GenerationGate

    if not others:
        return {}
    prompts = prompts or make_prompts(base.signature.vocab_size or 2)
    reference = reference_run(base.vsession, prompts)
    gate = GenerationGate(min_top1=min_top1)
    out = {}
    for name, gen in others.items():
        result = compare_decoders(base.vsession, gen.vsession, gate=gate, reference=reference)
        out[name] = result.to_dict()
        if not result.passed:
            raise AccuracyGateError(
                f"Weight format '{name}' fails the generation gate against the base model "
                f"({'; '.join(result.failures)}), so the engine does not run steps on it. Drop it from formats, "
                f"or accept its accuracy with a lower format_min_top1 (now {min_top1})."
            )
    return out


class FormatSet:
    """The engine's weight formats: a generator and a loop on the one KV buffer per format, and the plan."""

    def __init__(
        self,
        base: Generator,
        specs: Sequence[str],
        slots: int,
        max_length: int,
        *,
        min_top1: float = DEFAULT_FORMAT_MIN_TOP1,
        rounds: int = 3,
        plan: FormatPlan | None = None,
        gate_prompts: Sequence[Sequence[int]] | None = None,
    ) -> None:
        from ortpilot.session import load

        names = [format_name(s) for s in specs]
        vs = base.vsession
        proto = _base_proto(base) if any(n != BASE for n in names) else None
        self.generators: dict[str, Generator] = {}
        for spec, name in zip(specs, names):
            if name == BASE:
                self.generators[name] = base
                continue
            model = build_format(proto, spec)  # type: ignore[arg-type]
            session = load(model, vs.requested, vs.policy, settings=vs.settings, placement=False)
            self.generators[name] = Generator(session)
        check_same_decoder({BASE: base, **self.generators})
        self.gate = gate_formats(base, {n: g for n, g in self.generators.items() if n != BASE}, gate_prompts, min_top1)
        first = self.generators[names[0]]
        self.primary = BatchedLoop(first.vsession.session, first.signature, slots, max_length)
        self.loops = {names[0]: self.primary}
        for name in names[1:]:
            gen = self.generators[name]
            self.loops[name] = BatchedLoop(gen.vsession.session, gen.signature, slots, max_length, share=self.primary)
        if plan is not None and not plan.formats <= set(names):
            raise UsageError(
                f"The format plan names {', '.join(sorted(plan.formats - set(names)))}, which formats does not hold."
            )
        if plan is None:
            plan = FormatPlan.single(names[0]) if len(names) == 1 else measure_formats(self.loops, rounds=rounds)
        self.plan = plan
        self.steps = dict.fromkeys(names, 0)
        self.prefills = dict.fromkeys(names, 0)
        self.prefill_tokens = dict.fromkeys(names, 0)
        self.verifies = dict.fromkeys(names, 0)
        if len(names) > 1:
            log.info("weight formats per step: %s", plan.to_dict())

    @property
    def names(self) -> list[str]:
        return list(self.loops)

    def for_step(self, rows: int) -> BatchedLoop:
        name = self.plan.for_step(rows)
        self.steps[name] += 1
        return self.loops[name]

    def for_prefill(self, tokens: int) -> BatchedLoop:
        name = self.plan.for_prefill(tokens)
        self.prefills[name] += 1
        self.prefill_tokens[name] += tokens
        return self.loops[name]

    def for_verify(self, tokens: int) -> BatchedLoop:
        """A speculative verify run of ``tokens`` tokens: one batch-1 run, as fast as a prefill chunk that long."""
        name = self.plan.for_prefill(tokens)
        self.verifies[name] += 1
        return self.loops[name]

    def counters(self) -> dict[str, dict[str, int]]:
        return {
            n: {
                "decode_steps": self.steps[n],
                "prefill_runs": self.prefills[n],
                "prefill_tokens": self.prefill_tokens[n],
                "verify_runs": self.verifies[n],
            }
            for n in self.names
        }


__all__ = [
    "BUILT_FORMATS",
    "FormatPlan",
    "FormatSet",
    "build_format",
    "check_same_decoder",
    "gate_formats",
    "measure_formats",
    "prefill_points",
    "row_points",
]
