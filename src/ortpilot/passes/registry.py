"""Passes by name, and one pipeline step as data: what a tune candidate holds and journals.

A tune candidate is a pipeline of passes that a child process rebuilds and a journal replays, so
each step travels as JSON, ``{"pass": NAME, **options}``. :class:`Step` is that record with types:
``name`` picks the pass class registered under it, ``options`` is that pass's options record
(``passes.options``: ``QuantizeOptions``, ``FusionOptions`` ...; a mapping given is read into it),
which ``Pass.from_options`` takes, and ``label()`` is the pass's own (``fusion(bert)``,
``int8-dynamic-w-pc-x2``, ``gqa``, ``int4-weights``). The JSON form is the record's ``to_dict``
and canonical (a candidate's id hashes it), so a step reads as the very mapping it is written as:
``step["pass"]``, ``step.get("exclude")``, ``step == {...}`` all see that JSON.

Step names are the journal's vocabulary and differ from ``Pass.name`` where the record's name
was chosen first (``decoder_fusion`` builds ``DecoderFusionPass``, named ``decoder-fusion``).
Classes are imported on first use, so naming a step imports nothing heavy (the records are in
``passes.options``, which imports no pass).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpilot.passes.base import Pass
from ortpilot.passes.options import (
    DecoderFusionOptions,
    FusionOptions,
    NoOptions,
    OpenVINOInt8Options,
    PassOptions,
    QuantizeOptions,
    RawOptions,
    WeightOnlyOptions,
)

# step name -> "module:Class"; register() adds to it
_PASSES: dict[str, str | type[Pass]] = {
    "fusion": "ortpilot.passes.fusion:FusionPass",
    "prepare": "ortpilot.passes.quantize:PrepareForQuantization",
    "quantize": "ortpilot.passes.quantize:QuantizePass",
    "decoder_fusion": "ortpilot.passes.decoder_fusion:DecoderFusionPass",
    "weight_only": "ortpilot.passes.weight_only:WeightOnlyPass",
    "openvino_int8": "ortpilot.passes.openvino_int8:OpenVINOInt8Pass",
}
# step name -> its options record (a name with none keeps its options as given: ``RawOptions``)
_OPTIONS: dict[str, type[PassOptions]] = {
    "fusion": FusionOptions,
    "prepare": NoOptions,
    "quantize": QuantizeOptions,
    "decoder_fusion": DecoderFusionOptions,
    "weight_only": WeightOnlyOptions,
    "openvino_int8": OpenVINOInt8Options,
}


def register(name: str, cls: type[Pass], options: type[PassOptions] = RawOptions) -> None:
    """Make ``Step(name, ...)`` build ``cls`` from an ``options`` record (``cls.from_options`` turns it into
    the pass; ``RawOptions``, the default, hands it the options as keywords)."""
    _PASSES[name] = cls
    _OPTIONS[name] = options


def options_class(name: str) -> type[PassOptions]:
    """The options record of the pass registered as ``name`` (``RawOptions`` for a name none is registered under)."""
    return _OPTIONS.get(name, RawOptions) if isinstance(name, str) else RawOptions


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
    """One pass of a pipeline as its registered name and the options record that rebuilds it (a mapping
    given, the JSON form, is read into the record: ``Step("quantize", {"mode": "qdq"})``)."""

    name: str
    options: PassOptions = None  # type: ignore[assignment]  # None or the JSON form: read into the record

    def __post_init__(self) -> None:
        record = options_class(self.name)
        if not isinstance(self.options, record):
            if isinstance(self.options, PassOptions):
                raise TypeError(f"Step {self.name!r} takes {record.__name__}, not {type(self.options).__name__}.")
            object.__setattr__(self, "options", record.from_dict(self.options or {}))

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
        """The same step with ``changes`` to its JSON form applied (None puts an option back to its default)."""
        options = {**self.options.to_dict(), **changes}
        return Step(self.name, {k: v for k, v in options.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.name, **self.options.to_dict()}

    # the JSON view (Mapping): what a journal, a profile and ``Candidate.id`` see
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __repr__(self) -> str:
        return repr(self.to_dict())


__all__ = ["Step", "options_class", "pass_class", "register"]
