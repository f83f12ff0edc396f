"""An accuracy gate that fits generation: next-token distributions and greedy continuations.

Raw logit error says little about a decoder: a 4-bit model can move every logit and still pick
the same tokens, or move one logit a little and flip a token that changes the rest of the
answer. So the gate compares what generation uses. For each held-out prompt the reference
(float) model generates ``new_tokens`` greedily; the candidate is fed the same tokens (teacher
forcing), so at every position both models see the same context and we get

- top-1 agreement: the candidate's argmax equals the reference's token,
- KL(reference || candidate) of the next-token distributions (nats),
- the divergence position: the first generated token where the candidate's greedy choice differs
  (until then teacher forcing and free-running greedy decoding are the same run), so "tokens
  identical for the first N" is ``identical_tokens >= N``.

The gate is on these. With a failing gate, ``auto_exclude`` finds which layers to keep in higher
precision (8-bit or float; sensitivity: quantize one layer at a time, rank by KL) and retries until
the gate passes.

It lives in the decode layer because it runs models through the decode loops; the metric
functions are plain numpy.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ortpilot.errors import AccuracyGateError, UsageError
from ortpilot.passes.base import SourceModel
from ortpilot.passes.weight_only import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, WeightOnlyPass, layer_groups

if TYPE_CHECKING:
    from ortpilot.session import SessionSettings

log = logging.getLogger("ortpilot")
DEFAULT_NEW_TOKENS = 16
DEFAULT_MIN_TOP1 = 0.9


# --------------------------------------------------------------------------- metrics (numpy only)

def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities in float64 (KL of near-equal distributions needs the precision)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(ref_logp: np.ndarray, cand_logp: np.ndarray) -> np.ndarray:
    """KL(P_ref || P_cand) per row, in nats, from log-probabilities."""
    return np.maximum((np.exp(ref_logp) * (ref_logp - cand_logp)).sum(axis=-1), 0.0)


def divergence_position(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """Index of the first differing token, or None if one sequence is a prefix of the other."""
    for i, (a, b) in enumerate(zip(reference, candidate)):
        if a != b:
            return i
    return None


@dataclass
class PromptComparison:
    """One prompt: the reference's greedy tokens and how the candidate did on them."""

    prompt_length: int
    reference_tokens: list[int]
    candidate_top1: list[int]  # the candidate's argmax at each position, fed the reference's tokens
    top1_agreement: float
    kl_mean: float
    kl_max: float
    divergence: int | None  # first generated position where the candidate's greedy token differs
    identical_tokens: int  # greedy tokens identical to the reference from the start

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GenerationGate:
    """The limits; ``None`` switches one off."""

    min_top1: float | None = DEFAULT_MIN_TOP1
    max_kl: float | None = None
    min_identical: int | None = None

    def check(self, top1: float, kl_mean: float, min_identical: int) -> list[str]:
        """Why the gate fails (empty when it passes)."""
        reasons = []
        if self.min_top1 is not None and top1 < self.min_top1:
            reasons.append(f"top-1 next-token agreement {top1:.3f} < {self.min_top1}")
        if self.max_kl is not None and kl_mean > self.max_kl:
            reasons.append(f"mean KL divergence {kl_mean:.4f} > {self.max_kl}")
        if self.min_identical is not None and min_identical < self.min_identical:
            reasons.append(f"a greedy continuation diverges at token {min_identical} < {self.min_identical}")
        return reasons

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DecoderComparison:
    """The reference against the candidate over all prompts, and the gate's verdict."""

    prompts: list[PromptComparison]
    new_tokens: int
    top1_agreement: float
    kl_mean: float
    kl_max: float
    min_identical: int
    mean_identical: float
    gate: GenerationGate
    failures: list[str]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "failures": self.failures, "top1_agreement": self.top1_agreement,
                "kl_mean": self.kl_mean, "kl_max": self.kl_max, "min_identical_tokens": self.min_identical,
                "mean_identical_tokens": self.mean_identical, "new_tokens": self.new_tokens,
                "gate": self.gate.to_dict(), "seconds": round(self.seconds, 3), "notes": self.notes,
                "prompts": [p.to_dict() for p in self.prompts]}

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED: " + "; ".join(self.failures)
        return (f"top-1 agreement {self.top1_agreement:.3f}, KL mean {self.kl_mean:.4f} max {self.kl_max:.4f}, "
                f"greedy tokens identical for {self.min_identical}..{self.new_tokens} "
                f"(mean {self.mean_identical:.1f}) over {len(self.prompts)} prompt(s): {verdict}")


@dataclass
class ReferenceRun:
    """The reference model's greedy tokens and next-token log-probabilities, per prompt."""

    prompts: list[list[int]]
    tokens: list[list[int]]
    logprobs: list[np.ndarray]  # [new_tokens, vocab] per prompt


def score(reference: ReferenceRun, candidate_logits: Sequence[np.ndarray],
          gate: GenerationGate | None = None) -> DecoderComparison:
    """Compare the candidate's teacher-forced logits ([new_tokens, vocab] per prompt) with the reference."""
    gate = gate or GenerationGate()
    rows: list[PromptComparison] = []
    all_kl: list[np.ndarray] = []
    agree = total = 0
    for prompt, tokens, ref_lp, logits in zip(reference.prompts, reference.tokens, reference.logprobs,
                                              candidate_logits):
        cand_lp = log_softmax(logits)
        kl = kl_divergence(ref_lp, cand_lp)
        top1 = cand_lp.argmax(axis=-1).astype(int).tolist()
        hits = sum(a == b for a, b in zip(tokens, top1))
        first = divergence_position(tokens, top1)
        rows.append(PromptComparison(len(prompt), list(tokens), top1, hits / len(tokens), float(kl.mean()),
                                     float(kl.max()), first, len(tokens) if first is None else first))
        all_kl.append(kl)
        agree += hits
        total += len(tokens)
    kl_all = np.concatenate(all_kl) if all_kl else np.zeros(1)
    top1 = agree / max(total, 1)
    identical = [r.identical_tokens for r in rows] or [0]
    new_tokens = len(reference.tokens[0]) if reference.tokens else 0
    return DecoderComparison(rows, new_tokens, top1, float(kl_all.mean()), float(kl_all.max()), min(identical),
                             float(np.mean(identical)), gate, gate.check(top1, float(kl_all.mean()), min(identical)))


# --------------------------------------------------------------------------- running decoders

# Held-out text for real models (none of it is a benchmark question); tokenize with the model's tokenizer.
HELD_OUT_TEXTS = (
    "The history of the Roman Empire begins with",
    "To bake a simple loaf of bread, you need flour, water,",
    "Photosynthesis is the process by which plants",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
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
        runner = make_loop(self.loop, self.generator.vsession.session, self.generator.signature,
                           ids.shape[1] + new_tokens)
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


def reference_run(model: Any, prompts: Sequence[Sequence[int]], new_tokens: int = DEFAULT_NEW_TOKENS, *,
                  settings: SessionSettings | None = None, providers: Any = None, loop: str = "auto") -> ReferenceRun:
    """Greedy-generate ``new_tokens`` per prompt with the reference model, keeping its log-probs."""
    prompts = _check_prompts(prompts, new_tokens)
    decoder = _Decoder(model, settings, providers, loop)
    tokens, logprobs = [], []
    for prompt in prompts:
        lp = log_softmax(decoder.teacher_forced(prompt, None, new_tokens))
        tokens.append(lp.argmax(axis=-1).astype(int).tolist())
        logprobs.append(lp)
    return ReferenceRun(prompts, tokens, logprobs)


def candidate_logits(model: Any, reference: ReferenceRun, *, settings: SessionSettings | None = None,
                     providers: Any = None, loop: str = "auto") -> list[np.ndarray]:
    """The candidate's next-token logits with the reference's tokens fed in (teacher forcing)."""
    decoder = _Decoder(model, settings, providers, loop)
    return [decoder.teacher_forced(p, t, len(t)) for p, t in zip(reference.prompts, reference.tokens)]


def compare_decoders(model_a: Any, model_b: Any, prompts: Sequence[Sequence[int]] | None = None, *,
                     new_tokens: int = DEFAULT_NEW_TOKENS, gate: GenerationGate | None = None,
                     settings: SessionSettings | None = None, providers: Any = None, loop: str = "auto",
                     reference: ReferenceRun | None = None) -> DecoderComparison:
    """Generation accuracy of decoder ``model_b`` against the reference ``model_a``.

    ``prompts``: token-id lists (default: 8 random prompts of 12 tokens from the vocabulary).
    ``reference``: a previous :func:`reference_run` of ``model_a`` to reuse.
    """
    start = time.perf_counter()
    if reference is None:
        if prompts is None:
            prompts = make_prompts(_vocab_size(model_a))
        reference = reference_run(model_a, prompts, new_tokens, settings=settings, providers=providers, loop=loop)
    result = score(reference, candidate_logits(model_b, reference, settings=settings, providers=providers,
                                               loop=loop), gate)
    result.seconds = time.perf_counter() - start
    return result


def _vocab_size(model: Any) -> int:
    from ortpilot.decode.signature import detect_signature
    from ortpilot.modelio import load_model

    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    vocab = detect_signature(proto).vocab_size
    if not vocab:
        raise UsageError("Cannot tell the decoder's vocabulary size to make prompts; pass prompts explicitly.")
    return vocab


# --------------------------------------------------------------------------- auto-exclude loop

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
        return {"passed": self.passed, "fallback": self.fallback, "excluded_groups": self.excluded_groups,
                "excluded_nodes": len(self.excluded_nodes), "sensitivity": self.sensitivity,
                "attempts": self.attempts, "comparison": self.comparison.to_dict()}


def auto_exclude(model: str | os.PathLike | onnx.ModelProto, prompts: Sequence[Sequence[int]] | None = None, *,
                 mode: str = "int4", block_size: int = DEFAULT_BLOCK_SIZE, symmetric: bool = True,
                 accuracy_level: int | None = DEFAULT_ACCURACY_LEVEL, embedding: bool = True,
                 gate: GenerationGate | None = None, new_tokens: int = DEFAULT_NEW_TOKENS,
                 fallback: str = "int8", max_excluded: int | None = None, settings: SessionSettings | None = None,
                 providers: Any = None, raise_on_failure: bool = True) -> AutoExcludeResult:
    """Weight-only quantize ``model`` so that it passes the generation gate, keeping the most sensitive
    layers in higher precision if needed.

    First everything is quantized. If the gate fails, each layer group (see
    :func:`~ortpilot.passes.weight_only.layer_groups`) is quantized alone to rank the groups by
    mean KL; then the top k groups go to ``fallback`` precision ("int8": 8-bit MatMulNBits, half
    the bytes of float; "float": left unquantized), with k = 1, 2, 4, ... until the gate passes and
    a bisection down to the smallest passing k (about 2·log2(groups) tries, not one per group).
    Past ``max_excluded`` groups it stops: ``AccuracyGateError`` unless ``raise_on_failure`` is False.
    """
    from ortpilot.modelio import load_model

    if fallback not in ("int8", "float"):
        raise UsageError(f"fallback must be int8 or float, got {fallback!r}.")
    if mode != "int4":
        fallback = "float"  # nothing sits between 8-bit weights and float
    source = model if isinstance(model, onnx.ModelProto) else load_model(model)
    gate = gate or GenerationGate()
    if prompts is None:
        prompts = make_prompts(_vocab_size(source))
    ref = reference_run(source, prompts, new_tokens, settings=settings, providers=providers)
    # The int8 path never quantizes the embedding, so its groups must not name it.
    effective_embedding = WeightOnlyPass(mode, block_size=block_size, embedding=embedding).embedding
    groups = layer_groups(source, embedding=effective_embedding)
    every = [n for names in groups.values() for n in names]

    def attempt(wide: Sequence[str], narrow_only: Sequence[str] | None = None) -> tuple[onnx.ModelProto,
                                                                                         DecoderComparison]:
        """``wide``: nodes in fallback precision; ``narrow_only``: quantize just these (sensitivity)."""
        skip = [n for n in every if n not in narrow_only] if narrow_only is not None else []
        qpass = WeightOnlyPass(mode, block_size=block_size, symmetric=symmetric, accuracy_level=accuracy_level,
                               embedding=embedding,
                               nodes_to_exclude=list(skip) + (list(wide) if fallback == "float" else []),
                               nodes_in_int8=list(wide) if fallback == "int8" else [])
        # transform, not run: the search needs the model, not a stamped record per attempt (on a
        # 500 MB decoder the record's serialisations cost more than the quantization itself).
        quantized = qpass.transform(SourceModel(source, None, "")).model
        return quantized, score(ref, candidate_logits(quantized, ref, settings=settings, providers=providers), gate)

    attempts: list[dict[str, Any]] = []
    quantized, result = attempt([])
    attempts.append(_attempt_record([], result))
    sensitivity: dict[str, float] = {}
    chosen: list[str] = []
    if not result.passed:
        log.warning("Weight-only %s fails the generation gate (%s); ranking %d layer groups by sensitivity.",
                    mode, "; ".join(result.failures), len(groups))
        for group, names in groups.items():
            sensitivity[group] = attempt([], narrow_only=names)[1].kl_mean
        ranked = sorted(sensitivity, key=sensitivity.__getitem__, reverse=True)
        limit = len(ranked) - (fallback == "float") if max_excluded is None else min(max_excluded, len(ranked))
        tried: dict[int, tuple[onnx.ModelProto, DecoderComparison]] = {0: (quantized, result)}

        def trial(k: int) -> bool:
            if k not in tried:
                wide = [n for g in ranked[:k] for n in groups[g]]
                tried[k] = attempt(wide)
                attempts.append(_attempt_record(ranked[:k], tried[k][1]))
                log.info("%s in %s: %s -> %s", k, fallback, ", ".join(ranked[:k]), tried[k][1].summary())
            return tried[k][1].passed

        low, high, k = 0, None, 1
        while k <= limit:
            if trial(k):
                high = k
                break
            low, k = k, (k * 2 if k * 2 <= limit or k == limit else limit)
        while high is not None and high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if trial(mid) else (mid, high)
        best = high if high is not None else low
        quantized, result = tried[best]
        chosen = ranked[:best]
    nodes = [n for g in chosen for n in groups[g]]
    outcome = AutoExcludeResult(quantized, result, chosen, nodes, sensitivity, attempts, fallback)
    if not result.passed and raise_on_failure:
        raise AccuracyGateError(
            f"Weight-only {mode} fails the generation gate even with {len(chosen)} layer group(s) in {fallback} "
            f"({', '.join(chosen) or 'none'}): {'; '.join(result.failures)}. Try --mode int8-weights, "
            "a smaller --block-size, --asymmetric, or a looser gate.")
    return outcome


def quantize_weight_only_gated(model: str | os.PathLike | onnx.ModelProto, out: str | os.PathLike, mode: str = "int4",
                               *, block_size: int = DEFAULT_BLOCK_SIZE, symmetric: bool = True,
                               accuracy_level: int | None = DEFAULT_ACCURACY_LEVEL, embedding: bool = True,
                               fuse: bool = False, prompts: Sequence[Sequence[int]] | None = None,
                               gate: GenerationGate | None = None, auto: bool = False,
                               nodes_to_exclude: Sequence[str] = (),
                               new_tokens: int = DEFAULT_NEW_TOKENS, settings: SessionSettings | None = None,
                               max_positions: int | None = None) -> dict[str, Any]:
    """What ``ortpilot quantize --mode int4|int8-weights`` does: (fuse,) quantize, gate, write if it passes.

    ``max_positions``: with ``fuse``, the rows of the fused model's constant rotary tables (see
    :class:`~ortpilot.passes.decoder_fusion.DecoderFusionPass`).

    ``auto``: leave the most sensitive layers in float until the gate passes (``auto_exclude``).
    Returns a JSON-ready report; raises ``AccuracyGateError`` (exit 1) without writing when the
    gate fails.
    """
    from ortpilot.modelio import load_model, save_model
    from ortpilot.passes.weight_only import quantize_weight_only, weight_bytes, weight_only_nodes

    source = model if isinstance(model, onnx.ModelProto) else load_model(model)
    gate = gate or GenerationGate()
    if max_positions is not None and not fuse:
        raise UsageError("max_positions sets the rotary tables the decoder fusion stores; it needs fuse=True.")
    fusion_notes: list[str] = []
    if fuse:
        from ortpilot.passes.decoder_fusion import DecoderFusionPass

        fused = DecoderFusionPass(max_positions=max_positions).run(source)
        source, fusion_notes = fused.model, list(fused.record.notes)
    if prompts is None:
        prompts = make_prompts(_vocab_size(source))
    report: dict[str, Any] = {"mode": mode, "fused": fuse, "output": str(out), "fusion_notes": fusion_notes}
    if auto:
        found = auto_exclude(source, prompts, mode=mode, block_size=block_size, symmetric=symmetric,
                             accuracy_level=accuracy_level, embedding=embedding, gate=gate, new_tokens=new_tokens,
                             settings=settings)
        quantized, comparison = found.model, found.comparison
        report["auto_exclude"] = {k: v for k, v in found.to_dict().items() if k != "comparison"}
        excluded = found.excluded_nodes
    else:
        quantized = quantize_weight_only(source, None, mode, block_size=block_size, symmetric=symmetric,
                                         accuracy_level=accuracy_level, embedding=embedding,
                                         nodes_to_exclude=nodes_to_exclude).model
        comparison = compare_decoders(source, quantized, prompts, new_tokens=new_tokens, gate=gate,
                                      settings=settings)
        excluded = list(nodes_to_exclude)
    before, after = weight_bytes(source), weight_bytes(quantized)
    summary = {"weight_bytes_before": before, "weight_bytes_after": after, "compression": round(before / after, 3),
               "weight_only_nodes": weight_only_nodes(quantized), "excluded_nodes": list(excluded)}
    report.update(weights=summary, gate=comparison.to_dict())
    if not comparison.passed:
        raise AccuracyGateError(f"Weight-only {mode} fails the generation gate: {'; '.join(comparison.failures)}. "
                                "Nothing was written. Try --auto-exclude, --mode int8-weights, a smaller "
                                "--block-size or --asymmetric.")
    save_model(quantized, out)
    return report


def _attempt_record(excluded: list[str], result: DecoderComparison) -> dict[str, Any]:
    return {"excluded_groups": list(excluded), "passed": result.passed, "top1_agreement": result.top1_agreement,
            "kl_mean": result.kl_mean, "min_identical_tokens": result.min_identical}


__all__ = ["AutoExcludeResult", "DecoderComparison", "GenerationGate", "PromptComparison", "ReferenceRun",
           "auto_exclude", "candidate_logits", "compare_decoders", "divergence_position", "kl_divergence",
           "HELD_OUT_TEXTS", "log_softmax", "make_prompts", "text_prompts", "quantize_weight_only_gated",
           "reference_run", "score"]
