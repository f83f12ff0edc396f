"""One accuracy gate: a quantized or otherwise transformed model is kept only if it still answers right.

- ``result``: ``Check`` (one output: metric, value, limit, passed) and ``GateResult``;
- ``core``: the ``Gate`` protocol (``check(reference, candidate)``), the ``Probe`` that runs a
  model for it, and ``ModelGate`` binding both to a reference model;
- ``outputs``: ``OutputGate``, a metric per output (``quantize``, ``tune``, ``verify``);
- ``generation``: ``GenerationGate``, next-token agreement and KL for decoders (its probe, which
  runs decode loops, is ``decode.gate.TeacherForcedProbe``);
- ``exclude``: the one auto-exclude loop (rankings in ``rankings``, schedules beside it);
- ``flow``: the one gated quantization of every ``ortpilot quantize`` mode (quantize, gate, rescue,
  write what passes) and its ``QuantizeReport``; ``quantize``: its INT8 modes (the weight-only
  modes, which run decode loops, are ``decode.gate.WeightOnlyFlow``).
"""

from ortpilot.gate.core import Gate, ModelGate, Probe
from ortpilot.gate.result import Check, GateResult, gate_failure

__all__ = ["Check", "Gate", "GateResult", "ModelGate", "Probe", "gate_failure"]
