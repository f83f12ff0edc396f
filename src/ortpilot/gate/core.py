"""The gate's two roles: a ``Gate`` compares outputs, a ``Probe`` produces them.

Polygraphy splits a comparison the same way: runners produce outputs, the comparator judges
them. Here a ``Gate`` checks a candidate's outputs against the reference's (``check(reference,
candidate) -> GateResult``) and knows nothing about models; a ``Probe`` runs a model the way the
gate needs (held-out samples through a verified session, a decoder teacher-forced on the
reference's tokens, the outputs a tune worker saved). ``ModelGate`` binds the two to a reference
model whose outputs are computed once, so ``measure(model)`` judges any number of candidates.
"""

from __future__ import annotations

from typing import Any, Protocol

from ortpilot.gate.result import GateResult


class Gate(Protocol):
    """Checks a candidate's outputs against the reference's."""

    def check(self, reference: Any, candidate: Any) -> GateResult: ...


class Probe(Protocol):
    """Runs a model the way a gate needs its outputs."""

    def run(self, model: Any, reference: Any = None) -> Any:
        """The outputs of ``model``. ``reference`` is the reference model's (None while computing
        it), for probes that feed it back: a decoder is teacher-forced on the reference's tokens."""


class ModelGate:
    """A gate, the probe that feeds it and the reference outputs: ``measure(model)`` per candidate."""

    def __init__(self, gate: Gate, probe: Probe, reference: Any) -> None:
        """``reference``: the reference model's outputs as ``probe`` made them (see :meth:`of`)."""
        self.gate = gate
        self.probe = probe
        self.reference = reference

    @classmethod
    def of(cls, gate: Gate, probe: Probe, reference_model: Any) -> ModelGate:
        """Run ``reference_model`` through ``probe`` once; every candidate is compared with that."""
        return cls(gate, probe, probe.run(reference_model))

    def measure(self, model: Any) -> GateResult:
        return self.gate.check(self.reference, self.probe.run(model, self.reference))


__all__ = ["Gate", "ModelGate", "Probe"]
