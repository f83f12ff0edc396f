"""What a command tells its accuracy gate, as one frozen record: ``GateOptions``.

``ortpilot quantize``'s gate flags build it, ``api.quantize_gated`` and ``api.compare`` take it, and a
tune's request gives its own (``TuneRequest.gate``): the limit, how each output is compared, the
outputs the deployment reads, the held-out data, whether a failing model is rescued by leaving
layers in float, and, for decoders, the generation gate's least top-1 agreement and its prompts.
Every default is defined here once; a bad value is a ``UsageError`` (exit 2) as the record is made.
What a field means for a flow that has no use for it (``metric`` for a decoder pair) is that
flow's to refuse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ortpilot.artifacts.fields import as_strings, path_or_none, record_of, record_or_fields
from ortpilot.errors import UsageError
from ortpilot.gate.generation import DEFAULT_MIN_TOP1, GenerationGate
from ortpilot.gate.outputs import OutputGate

DEFAULT_MAX_ROUNDS = 6  # tries of the auto-exclude loop after the first
DEFAULT_PER_ROUND = 2  # layers one round of the INT8 loop leaves in float
DEFAULT_NEW_TOKENS = 16  # greedy tokens per prompt the generation gate compares


@dataclass(frozen=True)
class GateOptions:
    """How a transformed model is held to its source.

    Output gate (INT8 quantization, compare, tune): ``max_error`` (None: the flow's default: measured and
    never refused by quantize, ``gate.outputs.DEFAULT_MAX_ERROR`` for a tune); ``metric``: ``METRIC`` for
    every output and/or ``OUTPUT=METRIC`` (``measure.metrics``); ``outputs``: the outputs the deployment
    reads (() for all); ``calibration``: what ``passes.calibration.load_calibration`` reads (a path,
    arrays, a reader, ``data.real_data`` text or images), split into calibration and held-out samples.
    ``auto_exclude``: leave the worst layers in float until the gate passes, ``max_rounds`` rounds of
    ``per_round`` layers (INT8).
    Generation gate (decoders): ``min_top1`` least top-1 next-token agreement, ``new_tokens`` compared
    per prompt, prompts from ``tokenizer`` (a tokenizer.json; None: random token ids).
    """

    max_error: float | None = None
    metric: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    calibration: Any = field(default=None, compare=False)
    auto_exclude: bool = False
    max_rounds: int = DEFAULT_MAX_ROUNDS
    per_round: int = DEFAULT_PER_ROUND
    min_top1: float = DEFAULT_MIN_TOP1
    new_tokens: int = DEFAULT_NEW_TOKENS
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "metric", as_strings(self.metric))
        set_(self, "outputs", as_strings(self.outputs))
        if self.tokenizer is not None:
            set_(self, "tokenizer", os.fspath(self.tokenizer))
        if self.max_error is not None:
            if isinstance(self.max_error, bool) or not float(self.max_error) >= 0:
                raise UsageError(f"--max-error must be >= 0, got {self.max_error}.")
            set_(self, "max_error", float(self.max_error))
        for name, flag in (("max_rounds", "--max-rounds"), ("per_round", "per_round"), ("new_tokens", "--new-tokens")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{flag} must be a whole number >= 1, got {value!r}.")
        if not 0.0 <= self.min_top1 <= 1.0:
            raise UsageError(f"--min-top1 must be between 0 and 1, got {self.min_top1}.")
        set_(self, "auto_exclude", bool(self.auto_exclude))

    @property
    def rescue(self) -> bool:
        """The auto-exclude loop has a limit to work towards (it needs ``max_error`` for the output gate)."""
        return self.auto_exclude and self.max_error is not None

    def output_gate(
        self, model: Any, folder: Any = None, *, default: float | None = None, compare: bool = False
    ) -> OutputGate:
        """The output gate for ``model`` (an ``onnx.ModelProto``), each output's metric chosen on evidence and
        ``metric`` overriding it (a bad one is a ``UsageError`` now, before any work); ``default`` stands in
        for a ``max_error`` not given."""
        limit = self.max_error if self.max_error is not None else default
        return OutputGate.for_model(model, limit, metrics=list(self.metric) or None, folder=folder, compare=compare)

    def generation_gate(self) -> GenerationGate:
        return GenerationGate(min_top1=self.min_top1)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: every field but in-memory calibration data (a path travels)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        return {
            **doc,
            "metric": list(self.metric),
            "outputs": list(self.outputs),
            "calibration": path_or_none(self.calibration),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> GateOptions:
        return record_of(cls, doc, "A GateOptions record")


def gate_keywords(gate: GateOptions | None, keywords: Mapping[str, Any]) -> tuple[GateOptions, dict[str, Any]]:
    """``gate``, or the ``GateOptions`` made of the keywords that are its fields, and the other keywords (given
    both, a ``UsageError``)."""
    return record_or_fields(GateOptions, gate, keywords, others=True)


__all__ = [
    "DEFAULT_MAX_ROUNDS",
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_PER_ROUND",
    "GateOptions",
    "gate_keywords",
]
