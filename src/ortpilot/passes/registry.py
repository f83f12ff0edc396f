"""Passes by name, and one pipeline step as data: what a tune candidate holds and journals.

A tune candidate is a pipeline of passes that a child process rebuilds and a journal replays, so
each step travels as JSON, ``{"pass": NAME, **options}``. :class:`Step` is that record with a
type: ``name`` picks the pass class registered under it, ``options`` are what that class's
``Pass.from_options`` takes, and ``label()`` is the pass's own (``fusion(bert)``,
``int8-dynamic-w-pc-x2``, ``gqa``, ``int4-weights``). The JSON form is canonical (a candidate's
id hashes it), so a step reads as the very mapping it is written as: ``step["pass"]``,
``step.get("exclude")``, ``step == {...}`` all see that JSON.

Step names are the journal's vocabulary and differ from ``Pass.name`` where the record's name
was chosen first (``decoder_fusion`` builds ``DecoderFusionPass``, named ``decoder-fusion``).
Classes are imported on first use, so naming a step imports nothing heavy.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpilot.passes.base import Pass

# step name -> "module:Class"; register() adds to it
_PASSES: dict[str, str | type[Pass]] = {
    "fusion": "ortpilot.passes.fusion:FusionPass",
    "prepare": "ortpilot.passes.quantize:PrepareForQuantization",
    "quantize": "ortpilot.passes.quantize:QuantizePass",
    "decoder_fusion": "ortpilot.passes.decoder_fusion:DecoderFusionPass",
    "weight_only": "ortpilot.passes.weight_only:WeightOnlyPass",
    "openvino_int8": "ortpilot.passes.openvino_int8:OpenVINOInt8Pass",
}


def register(name: str, cls: type[Pass]) -> None:
    """Make ``Step(name, ...)`` build ``cls`` (``cls.from_options`` turns the options into the pass)."""
    _PASSES[name] = cls


def pass_class(name: str) -> type[Pass]:
    entry = _PASSES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"unknown pass {name!r}")
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = _PASSES[name] = getattr(importlib.import_module(module), attr)
    return entry


@dataclass(frozen=True, eq=False)
class Step(Mapping):
    """One pass of a pipeline as its registered name and the options that rebuild it."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, step: Step | Mapping[str, Any]) -> Step:
        """A ``Step``, from itself or from its JSON form ``{"pass": NAME, **options}``."""
        if isinstance(step, Step):
            return step
        return cls(step.get("pass"), {k: v for k, v in step.items() if k != "pass"})

    def build(self, *, calibration: Sequence[Mapping[str, np.ndarray]] = (), prepared: bool = False) -> Pass:
        """The pass this step stands for (``Pass.from_options``); see there for ``calibration``/``prepared``."""
        return pass_class(self.name).from_options(self.options, calibration=calibration, prepared=prepared)

    @functools.cached_property
    def spec(self) -> Pass:
        """The pass built without calibration data: for reading its settings and its label."""
        return self.build()

    def label(self) -> str:
        """The pass's short label (a name no pass is registered under labels itself)."""
        try:
            return self.spec.label()
        except ValueError:
            return str(self.name)

    def with_options(self, **changes: Any) -> Step:
        """The same step with ``changes`` applied (None removes an option)."""
        options = {**self.options, **changes}
        return Step(self.name, {k: v for k, v in options.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.name, **self.options}

    # the JSON view (Mapping): what a journal, a profile and ``Candidate.id`` see
    def __getitem__(self, key: str) -> Any:
        return self.name if key == "pass" else self.options[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return 1 + len(self.options)

    def __repr__(self) -> str:
        return repr(self.to_dict())


__all__ = ["Step", "pass_class", "register"]
