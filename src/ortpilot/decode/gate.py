"""Running decoders for the generation gate, and weight-only quantization gated on generation.

The gate itself (top-1 agreement, KL, divergence position; numpy only) is
``gate.generation.GenerationGate``. What lives here is what needs the decode loops: the
reference decoder generating greedily, the candidate teacher-forced on the reference's tokens
(:class:`TeacherForcedProbe`, the gate's probe for decoders), and the weight-only modes of
``ortpilot quantize --mode int4|int8-weights`` in the one gated-quantization flow
(``gate.flow``): :class:`WeightOnlyFlow` quantizes, gates on generation, and with a failing gate
keeps the most sensitive layer groups in higher precision (8-bit or float) through the one
auto-exclude loop (``gate.exclude``: groups ranked by ``gate.rankings.GroupSensitivity``, the
fewest found by ``Bisect``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ortpilot.artifacts.fields import record_or_fields
from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.gate.core import Gate, ModelGate, Probe
from ortpilot.gate.exclude import Bisect, ExcludeResult, nodes_of
from ortpilot.gate.flow import QuantizeReport, quantize_and_gate, search
from ortpilot.gate.generation import DecoderComparison, GenerationGate, ReferenceRun, log_softmax
from ortpilot.gate.options import DEFAULT_NEW_TOKENS
from ortpilot.gate.rankings import GroupSensitivity
from ortpilot.gate.result import GateResult
from ortpilot.passes.base import Outcome, PassResult, SourceModel
from ortpilot.passes.options import DecoderFusionOptions, WeightOnlyOptions
from ortpilot.passes.weight_only import WeightOnlyPass, layer_groups, weight_bytes, weight_only_nodes

if TYPE_CHECKING:
    from ortpilot.session import SessionSettings

log = logging.getLogger("ortpilot")


# --------------------------------------------------------------------------- running decoders

# Held-out text for real models (none of it is a benchmark question); tokenize with the model's tokenizer.
HELD_OUT_TEXTS = (
    "The history of the Roman Empire begins with",
    "To bake a simple loaf of bread, you need flour, water,",
    "Photosynthesis is the process by which plants",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors are",
    "In machine learning, overfitting happens when",
    "Water boils at 100 degrees Celsius at sea level because",
    "The quick brown fox jumps over the lazy dog. This sentence is famous because",
)


def text_prompts(tokenizer: str | os.PathLike, texts: Sequence[str] = HELD_OUT_TEXTS) -> list[list[int]]:
    """Token ids of ``texts`` with a Hugging Face ``tokenizer.json`` (the ``--tokenizer`` of the CLI)."""
    from ortpilot.decode import text

    tok = text.load_tokenizer(tokenizer)
    return [list(text.encode(tok, t)) for t in texts]


def make_prompts(vocab_size: int, count: int = 8, length: int = 12, seed: int = 0) -> list[list[int]]:
    """Random held-out token-id prompts, for decoders without a tokenizer (the demo decoder)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=length).tolist() for _ in range(count)]


class _Decoder:
    """One model's session and loop choice, reused for every prompt (sessions are the slow part)."""

    def __init__(self, model: Any, settings: SessionSettings | None, providers: Any, loop: str) -> None:
        from ortpilot.decode.generate import Generator

        self.generator = Generator(model, providers=providers, settings=settings)
        self.loop, _ = self.generator.choose_loop(loop)

    def teacher_forced(self, prompt: Sequence[int], tokens: Sequence[int] | None, new_tokens: int) -> np.ndarray:
        """Next-token logits [new_tokens, vocab]; feeds ``tokens`` (or its own greedy choice when None)."""
        from ortpilot.decode.loops import make_loop

        ids = np.asarray(prompt, dtype=np.int64)[None, :]
        runner = make_loop(
            self.loop, self.generator.vsession.session, self.generator.signature, ids.shape[1] + new_tokens
        )
        # Copies: the bound loops may hand back a view of an output buffer that the next step reuses.
        logits = [np.array(runner.prefill(ids, np.ones_like(ids))[0])]
        for i in range(new_tokens - 1):
            token = int(np.argmax(logits[-1])) if tokens is None else int(tokens[i])
            logits.append(np.array(runner.step(np.array([[token]], dtype=np.int64))[0]))
        return np.stack(logits)


def _check_prompts(prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    if new_tokens < 1:
        raise UsageError(f"new_tokens must be at least 1, got {new_tokens}.")
    out = [list(map(int, p)) for p in prompts]
    if not out or any(not p for p in out):
        raise UsageError("The generation gate needs at least one non-empty prompt (a list of token ids).")
    return out


def reference_run(
    model: Any,
    prompts: Sequence[Sequence[int]],
    new_tokens: int = DEFAULT_NEW_TOKENS,
    *,
    settings: SessionSettings | None = None,
    providers: Any = None,
    loop: str = "auto",
) -> ReferenceRun:
    """Greedy-generate ``new_tokens`` per prompt with the reference model, keeping its log-probs."""
    prompts = _check_prompts(prompts, new_tokens)
    decoder = _Decoder(model, settings, providers, loop)
    tokens, logprobs = [], []
    for prompt in prompts:
        lp = log_softmax(decoder.teacher_forced(prompt, None, new_tokens))
        tokens.append(lp.argmax(axis=-1).astype(int).tolist())
        logprobs.append(lp)
    return ReferenceRun(prompts, tokens, logprobs)


def candidate_logits(
    model: Any,
    reference: ReferenceRun,
    *,
    settings: SessionSettings | None = None,
    providers: Any = None,
    loop: str = "auto",
) -> list[np.ndarray]:
    """The candidate's next-token logits with the reference's tokens fed in (teacher forcing)."""
    decoder = _Decoder(model, settings, providers, loop)
    return [decoder.teacher_forced(p, t, len(t)) for p, t in zip(reference.prompts, reference.tokens)]


def _vocab_size(model: Any) -> int:
    from ortpilot.decode.signature import detect_signature

    vocab = detect_signature(_load(model)).vocab_size
    if not vocab:
        raise UsageError("Cannot tell the decoder's vocabulary size to make prompts; pass prompts explicitly.")
    return vocab


@dataclass
class TeacherForcedProbe:
    """The generation gate's probe: the reference generates greedily, a candidate is fed its tokens."""

    prompts: Sequence[Sequence[int]]
    new_tokens: int = DEFAULT_NEW_TOKENS
    settings: SessionSettings | None = None
    providers: Any = None
    loop: str = "auto"

    def run(self, model: Any, reference: ReferenceRun | None = None) -> ReferenceRun | list[np.ndarray]:
        if reference is None:
            return reference_run(
                model, self.prompts, self.new_tokens, settings=self.settings, providers=self.providers, loop=self.loop
            )
        return candidate_logits(model, reference, settings=self.settings, providers=self.providers, loop=self.loop)


def compare_decoders(
    model_a: Any,
    model_b: Any,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    gate: GenerationGate | None = None,
    settings: SessionSettings | None = None,
    providers: Any = None,
    loop: str = "auto",
    reference: ReferenceRun | None = None,
) -> DecoderComparison:
    """Generation accuracy of decoder ``model_b`` against the reference ``model_a``.

    ``prompts``: token-id lists (default: 8 random prompts of 12 tokens from the vocabulary).
    ``reference``: a previous :func:`reference_run` of ``model_a`` to reuse.
    """
    gate = gate or GenerationGate()
    if reference is not None:
        probe = TeacherForcedProbe(reference.prompts, new_tokens, settings, providers, loop)
        return _ClockedGate(gate, probe, reference).measure(model_b).comparison
    if prompts is None:
        prompts = make_prompts(_vocab_size(model_a))
    probe = TeacherForcedProbe(prompts, new_tokens, settings, providers, loop)
    return _ClockedGate.of(gate, probe, model_a).measure(model_b).comparison


class _ClockedGate(ModelGate):
    """A ``ModelGate`` of the generation gate whose results say how long they took, the reference
    run included (``DecoderComparison.seconds``, the ``gate.seconds`` of reports)."""

    reference_seconds = 0.0

    @classmethod
    def of(cls, gate: Gate, probe: Probe, reference_model: Any) -> _ClockedGate:
        start = time.perf_counter()
        clocked = cls(gate, probe, probe.run(reference_model))
        clocked.reference_seconds = time.perf_counter() - start
        return clocked

    def measure(self, model: Any) -> GateResult:
        start = time.perf_counter()
        result = super().measure(model)
        result.comparison.seconds = self.reference_seconds + time.perf_counter() - start
        return result


# --------------------------------------------------------------------------- weight-only, gated


@dataclass
class WeightOnlyStep:
    """``WeightOnlyPass`` as the auto-exclude loop builds it: ``excluded`` nodes go to ``fallback``
    precision ("int8": 8-bit MatMulNBits, half the bytes of float; "float": left unquantized). The nodes
    ``options`` names stay as ``excluded`` and ``skip`` say (the loop decides them)."""

    source: onnx.ModelProto
    options: WeightOnlyOptions = field(default_factory=WeightOnlyOptions)
    fallback: str = "int8"
    excluded: list[str] = field(default_factory=list)
    skip: tuple[str, ...] = ()  # left float and out of the search (quantize one group alone)
    stamped: bool = False  # build with Pass.run: the model stamped and its record (one build, no search)

    @property
    def mode(self) -> str:
        return self.options.mode

    def excluding(self, nodes: Sequence[str]) -> WeightOnlyStep:
        return replace(self, excluded=[*self.excluded, *(n for n in nodes if n not in self.excluded)])

    def only(self, nodes: Sequence[str], every: Sequence[str]) -> onnx.ModelProto:
        """The model with just ``nodes`` of ``every`` quantizable node quantized (a group's sensitivity)."""
        keep = set(nodes)
        return replace(self, excluded=[], skip=tuple(n for n in every if n not in keep), stamped=False).build().model

    def groups(self) -> dict[str, list[str]]:
        # The int8 path never quantizes the embedding, so its groups must not name it.
        return layer_groups(self.source, embedding=self.options.quantizes_embedding)

    def build(self) -> Outcome | PassResult:
        wide = list(self.excluded)
        qpass = WeightOnlyPass(
            self.options,
            nodes_to_exclude=list(self.skip) + (wide if self.fallback == "float" else []),
            nodes_in_int8=wide if self.fallback == "int8" else [],
        )
        if self.stamped:
            return qpass.run(SourceModel.of(self.source))
        # transform, not run: the search needs the model, not a stamped record per attempt (on a
        # 500 MB decoder the record's serialisations cost more than the quantization itself).
        return qpass.transform(SourceModel(self.source, None, ""))


@dataclass
class AutoExcludeResult:
    """The quantized model that passed (or the last try), what was left in float, and how we got there."""

    model: onnx.ModelProto
    comparison: DecoderComparison
    excluded_groups: list[str]
    excluded_nodes: list[str]
    sensitivity: dict[str, float]  # group -> mean KL with only that group quantized
    attempts: list[dict[str, Any]]
    fallback: str = "float"  # the precision of the excluded groups: int8 or float

    @property
    def passed(self) -> bool:
        return self.comparison.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "fallback": self.fallback,
            "excluded_groups": self.excluded_groups,
            "excluded_nodes": len(self.excluded_nodes),
            "sensitivity": self.sensitivity,
            "attempts": self.attempts,
            "comparison": self.comparison.to_dict(),
        }


@dataclass
class WeightOnlyFlow:
    """The weight-only modes in the one gated-quantization flow (``gate.flow.QuantizeFlow``):
    ``WeightOnlyStep`` as the step, the generation gate on a teacher-forced decoder, layer groups
    ranked by sensitivity (``GroupSensitivity``) and the fewest found by ``Bisect``."""

    step: WeightOnlyStep
    gate: ModelGate
    ranking: GroupSensitivity
    schedule: Bisect
    auto: bool = True  # rescue: move layer groups to the fallback precision until the gate passes
    fused: bool = False
    fusion_notes: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        step: WeightOnlyStep,
        probe: TeacherForcedProbe,
        gate: GenerationGate,
        *,
        auto: bool = True,
        max_excluded: int | None = None,
        fused: bool = False,
        fusion_notes: Sequence[str] = (),
    ) -> WeightOnlyFlow:
        groups = step.groups()  # the pass's settings are checked here, before the reference run
        every = [n for names in groups.values() for n in names]
        judge = _ClockedGate.of(gate, probe, step.source)
        ranking = GroupSensitivity(groups, lambda nodes: step.only(nodes, every), judge)
        schedule = Bisect(max_excluded, keep=1 if step.fallback == "float" else 0)
        return cls(step, judge, ranking, schedule, auto, fused, list(fusion_notes))

    @property
    def max_tries(self) -> int | None:
        return None if self.auto else 1

    def history(self, outcome: ExcludeResult) -> list[dict[str, Any]]:
        return _attempts(outcome) if self.auto else []

    def result(self, outcome: ExcludeResult) -> AutoExcludeResult:
        best = outcome.best
        return AutoExcludeResult(
            best.built.model,
            best.result.comparison,
            [layer.name for layer in best.layers],
            nodes_of(best.layers),
            self.ranking.sensitivity,
            _attempts(outcome),
            self.step.fallback,
        )

    def failure(self, outcome: ExcludeResult, history: Sequence[dict[str, Any]]) -> Exception:
        failures = "; ".join(outcome.best.result.comparison.failures)
        mode = self.step.mode
        if not self.auto:
            return AccuracyGateError(
                f"Weight-only {mode} fails the generation gate: {failures}. Nothing was written. Try "
                "--auto-exclude, --mode int8-weights, a smaller --block-size or --asymmetric."
            )
        chosen = [layer.name for layer in outcome.best.layers]
        return AccuracyGateError(
            f"Weight-only {mode} fails the generation gate even with {len(chosen)} layer group(s) in "
            f"{self.step.fallback} ({', '.join(chosen) or 'none'}): {failures}. Try --mode int8-weights, "
            "a smaller --block-size, --asymmetric, or a looser gate."
        )

    def finish(
        self, outcome: ExcludeResult, history: list[dict[str, Any]], output: Any, written: Path | None
    ) -> dict[str, Any]:
        best = outcome.best
        quantized = best.built.model
        doc: dict[str, Any] = {
            "mode": self.step.mode,
            "fused": self.fused,
            "output": str(output),
            "fusion_notes": self.fusion_notes,
        }
        if self.auto:
            doc["auto_exclude"] = {k: v for k, v in self.result(outcome).to_dict().items() if k != "comparison"}
        before, after = weight_bytes(self.step.source), weight_bytes(quantized)
        doc["weights"] = {
            "weight_bytes_before": before,
            "weight_bytes_after": after,
            "compression": round(before / after, 3),
            "weight_only_nodes": weight_only_nodes(quantized),
            "excluded_nodes": [*self.step.skip, *nodes_of(best.layers)],
        }
        doc["gate"] = best.result.comparison.to_dict()
        return doc


def _attempts(outcome: ExcludeResult) -> list[dict[str, Any]]:
    return [
        {
            "excluded_groups": [layer.name for layer in t.layers],
            "passed": t.passed,
            "top1_agreement": t.result.comparison.top1_agreement,
            "kl_mean": t.result.comparison.kl_mean,
            "min_identical_tokens": t.result.comparison.min_identical,
        }
        for t in outcome.tries
    ]


def _fallback(options: WeightOnlyOptions, fallback: str) -> str:
    if fallback not in ("int8", "float"):
        raise UsageError(f"fallback must be int8 or float, got {fallback!r}.")
    return fallback if options.bits == 4 else "float"  # nothing sits between 8-bit weights and float


def weight_only_options(options: WeightOnlyOptions | str | None, keywords: Mapping[str, Any]) -> WeightOnlyOptions:
    """``options``, or the ``WeightOnlyOptions`` of the mode it names (None: the default) and the keywords."""
    if isinstance(options, str):
        keywords = {**keywords, "mode": options}
    return record_or_fields(WeightOnlyOptions, options if isinstance(options, WeightOnlyOptions) else None, keywords)[0]


def auto_exclude(
    model: str | os.PathLike | onnx.ModelProto,
    prompts: Sequence[Sequence[int]] | None = None,
    options: WeightOnlyOptions | str | None = None,
    *,
    gate: GenerationGate | None = None,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    fallback: str = "int8",
    max_excluded: int | None = None,
    settings: SessionSettings | None = None,
    providers: Any = None,
    raise_on_failure: bool = True,
    **keywords: Any,
) -> AutoExcludeResult:
    """Weight-only quantize ``model`` as ``options`` say (a ``WeightOnlyOptions``, or its mode with its other
    fields as keywords: ``mode="int4", block_size=64``) so that it passes the generation gate, keeping the
    most sensitive layers in higher precision if needed.

    First everything is quantized. If the gate fails, each layer group (see
    :func:`~ortpilot.passes.weight_only.layer_groups`) is quantized alone to rank the groups by
    mean KL; then the top k groups go to ``fallback`` precision ("int8": 8-bit MatMulNBits, half
    the bytes of float; "float": left unquantized), with k = 1, 2, 4, ... until the gate passes and
    a bisection down to the smallest passing k (about 2·log2(groups) tries, not one per group).
    Past ``max_excluded`` groups it stops: ``AccuracyGateError`` unless ``raise_on_failure`` is False.
    """
    options = weight_only_options(options, keywords)
    fallback = _fallback(options, fallback)
    source = _load(model)
    if prompts is None:
        prompts = make_prompts(_vocab_size(source))
    step = WeightOnlyStep(source, options, fallback)
    probe = TeacherForcedProbe(prompts, new_tokens, settings, providers)
    flow = WeightOnlyFlow.of(step, probe, gate or GenerationGate(), max_excluded=max_excluded)
    found = search(flow)
    if not found.passed and raise_on_failure:
        raise flow.failure(found, flow.history(found))
    return flow.result(found)


def quantize_weight_only_gated(
    model: str | os.PathLike | onnx.ModelProto,
    out: str | os.PathLike,
    options: WeightOnlyOptions | str | None = None,
    *,
    prompts: Sequence[Sequence[int]] | None = None,
    gate: GenerationGate | None = None,
    auto: bool = False,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    settings: SessionSettings | None = None,
    fusion: DecoderFusionOptions | None = None,
    **keywords: Any,
) -> QuantizeReport:
    """What ``ortpilot quantize --mode int4|int8-weights`` does: (fuse,) quantize, gate, write if it passes.

    ``options``: a ``WeightOnlyOptions``, or its mode with its other fields as keywords. ``fusion``: fuse
    attention into GroupQueryAttention first, as a ``DecoderFusionOptions`` says (its ``max_positions``: the
    rows of the fused model's constant rotary tables); ``fuse=True`` and ``max_positions=N`` as keywords
    say the same.

    ``auto``: leave the most sensitive layers in higher precision until the gate passes (``auto_exclude``;
    the options' ``nodes_to_exclude`` are for a run without it). Returns the ``QuantizeReport`` of the one
    flow (``gate.flow``; ``report["gate"]`` and ``to_dict()`` read its JSON document); raises
    ``AccuracyGateError`` (exit 1) without writing when the gate fails.
    """
    fusion = _fusion(fusion, keywords.pop("fuse", None), keywords.pop("max_positions", None))
    options = weight_only_options(options, keywords)
    source = _load(model)
    fusion_notes: list[str] = []
    if fusion is not None:
        from ortpilot.passes.decoder_fusion import DecoderFusionPass

        fused = DecoderFusionPass(fusion).run(source)
        source, fusion_notes = fused.model, list(fused.record.notes)
    if prompts is None:
        prompts = make_prompts(_vocab_size(source))
    # Without the search the step is built once, with its stamp (as a plain pass run writes it).
    skip = () if auto else options.nodes_to_exclude
    step = WeightOnlyStep(source, options, _fallback(options, "int8"), skip=skip, stamped=not auto)
    probe = TeacherForcedProbe(prompts, new_tokens, settings)
    flow = WeightOnlyFlow.of(
        step, probe, gate or GenerationGate(), auto=auto, fused=fusion is not None, fusion_notes=fusion_notes
    )
    return quantize_and_gate(flow, out)


def _fusion(
    fusion: DecoderFusionOptions | None, fuse: bool | None, max_positions: int | None
) -> DecoderFusionOptions | None:
    """The decoder fusion to run first: ``fusion``, or the one ``fuse=True`` (and ``max_positions``) ask for."""
    if fusion is not None and (fuse is not None or max_positions is not None):
        raise UsageError("Give fusion=DecoderFusionOptions(...) or fuse=/max_positions=, not both.")
    if max_positions is not None and not fuse:
        raise UsageError("max_positions sets the rotary tables the decoder fusion stores; it needs fuse=True.")
    return DecoderFusionOptions(max_positions=max_positions) if fuse else fusion


def _load(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    from ortpilot.modelio import load_model

    return model if isinstance(model, onnx.ModelProto) else load_model(model)


__all__ = [
    "HELD_OUT_TEXTS",
    "AutoExcludeResult",
    "TeacherForcedProbe",
    "WeightOnlyFlow",
    "WeightOnlyStep",
    "auto_exclude",
    "candidate_logits",
    "compare_decoders",
    "make_prompts",
    "quantize_weight_only_gated",
    "reference_run",
    "text_prompts",
]
