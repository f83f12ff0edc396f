"""The generation gate: next-token distributions and greedy continuations (numpy only).

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

The gate is on these. Running the decoders (the reference's greedy tokens, the candidate's
teacher-forced logits) is the decode layer's: ``decode.gate.TeacherForcedProbe``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ortpilot.gate.result import Check, GateResult

DEFAULT_MIN_TOP1 = 0.9


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


@dataclass
class ReferenceRun:
    """The reference model's greedy tokens and next-token log-probabilities, per prompt."""

    prompts: list[list[int]]
    tokens: list[list[int]]
    logprobs: list[np.ndarray]  # [new_tokens, vocab] per prompt


@dataclass(frozen=True)
class GenerationGate:
    """The limits; ``None`` switches one off."""

    min_top1: float | None = DEFAULT_MIN_TOP1
    max_kl: float | None = None
    min_identical: int | None = None

    def failures(self, top1: float, kl_mean: float, min_identical: int) -> list[str]:
        """Why the gate fails (empty when it passes)."""
        reasons = []
        if self.min_top1 is not None and top1 < self.min_top1:
            reasons.append(f"top-1 next-token agreement {top1:.3f} < {self.min_top1}")
        if self.max_kl is not None and kl_mean > self.max_kl:
            reasons.append(f"mean KL divergence {kl_mean:.4f} > {self.max_kl}")
        if self.min_identical is not None and min_identical < self.min_identical:
            reasons.append(f"a greedy continuation diverges at token {min_identical} < {self.min_identical}")
        return reasons

    def check(self, reference: ReferenceRun, candidate: Sequence[np.ndarray]) -> GateResult:
        """``candidate``: its teacher-forced logits, [new_tokens, vocab] per prompt (see ``score``)."""
        comparison = score(reference, candidate, self)
        return GateResult(
            comparison.checks(), samples=len(comparison.prompts), summary=comparison.summary(), comparison=comparison
        )

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

    def checks(self) -> list[Check]:
        """The three statistics against the gate's limits (top-1 and identical tokens are lower limits)."""
        g = self.gate
        return [
            Check(
                "top1_agreement",
                "top-1 next-token agreement",
                self.top1_agreement,
                g.min_top1,
                g.min_top1 is None or self.top1_agreement >= g.min_top1,
            ),
            Check(
                "kl_mean",
                "mean KL divergence (nats)",
                self.kl_mean,
                g.max_kl,
                g.max_kl is None or self.kl_mean <= g.max_kl,
            ),
            Check(
                "min_identical_tokens",
                "greedy tokens identical from the start",
                float(self.min_identical),
                g.min_identical,
                g.min_identical is None or self.min_identical >= g.min_identical,
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failures": self.failures,
            "top1_agreement": self.top1_agreement,
            "kl_mean": self.kl_mean,
            "kl_max": self.kl_max,
            "min_identical_tokens": self.min_identical,
            "mean_identical_tokens": self.mean_identical,
            "new_tokens": self.new_tokens,
            "gate": self.gate.to_dict(),
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "prompts": [p.to_dict() for p in self.prompts],
        }

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED: " + "; ".join(self.failures)
        return (
            f"top-1 agreement {self.top1_agreement:.3f}, KL mean {self.kl_mean:.4f} max {self.kl_max:.4f}, "
            f"greedy tokens identical for {self.min_identical}..{self.new_tokens} "
            f"(mean {self.mean_identical:.1f}) over {len(self.prompts)} prompt(s): {verdict}"
        )


def score(
    reference: ReferenceRun, candidate_logits: Sequence[np.ndarray], gate: GenerationGate | None = None
) -> DecoderComparison:
    """Compare the candidate's teacher-forced logits ([new_tokens, vocab] per prompt) with the reference."""
    gate = gate or GenerationGate()
    rows: list[PromptComparison] = []
    all_kl: list[np.ndarray] = []
    agree = total = 0
    for prompt, tokens, ref_lp, logits in zip(
        reference.prompts, reference.tokens, reference.logprobs, candidate_logits
    ):
        cand_lp = log_softmax(logits)
        kl = kl_divergence(ref_lp, cand_lp)
        top1 = cand_lp.argmax(axis=-1).astype(int).tolist()
        hits = sum(a == b for a, b in zip(tokens, top1))
        first = divergence_position(tokens, top1)
        rows.append(
            PromptComparison(
                len(prompt),
                list(tokens),
                top1,
                hits / len(tokens),
                float(kl.mean()),
                float(kl.max()),
                first,
                len(tokens) if first is None else first,
            )
        )
        all_kl.append(kl)
        agree += hits
        total += len(tokens)
    kl_all = np.concatenate(all_kl) if all_kl else np.zeros(1)
    top1 = agree / max(total, 1)
    identical = [r.identical_tokens for r in rows] or [0]
    new_tokens = len(reference.tokens[0]) if reference.tokens else 0
    return DecoderComparison(
        rows,
        new_tokens,
        top1,
        float(kl_all.mean()),
        float(kl_all.max()),
        min(identical),
        float(np.mean(identical)),
        gate,
        gate.failures(top1, float(kl_all.mean()), min(identical)),
    )


__all__ = [
    "DEFAULT_MIN_TOP1",
    "DecoderComparison",
    "GenerationGate",
    "PromptComparison",
    "ReferenceRun",
    "divergence_position",
    "kl_divergence",
    "log_softmax",
    "score",
]
