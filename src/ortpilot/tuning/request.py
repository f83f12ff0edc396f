"""What a tune is asked to do, as one frozen record.

``ortpilot tune``'s argument group and ``ortpilot.tune(...)`` build a ``TuneRequest``; the tune,
its request check, the journal's start record and a fleet's job and child take it whole. Every
default and every choice of a tune's options is defined here once, so a new option is one field
(and its flag).

Arguments are normalised as the record is made (sequences become tuples, a shape mapping becomes
``NAME=DIMS`` strings) and checked where a check needs nothing but the request: a bad budget, an
unknown objective or a non-positive sample count is a ``UsageError`` (exit 2) before anything runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ortpilot.artifacts.fields import as_strings, path_or_none, record_of
from ortpilot.errors import UsageError, require_bools
from ortpilot.gate.options import GateOptions
from ortpilot.tuning.budget import OUTPUT_RESERVE_S

MAX_BUDGET_S = 7 * 86_400.0  # a week: a longer budget (or inf) is a typo

DEMO_MODEL = "demo:encoder"  # what a tune without MODEL tunes
DEFAULT_OUT_DIR = "ortpilot-out"
MODEL_BUDGET_S = 300.0
DEMO_BUDGET_S = 60.0  # the demo is small: a new user sees the whole tune in a minute
OBJECTIVES = ("p50", "p99", "throughput")
DEFAULT_OBJECTIVE = "p50"
DEFAULT_SAMPLES = 4  # generated held-out inputs when the user gives no data
MAX_BATCH = 1024


@dataclass(frozen=True)
class TuneRequest:
    """One tune: which model, where its outputs go, how long, what to search and how to judge it.

    ``calibration`` is what ``passes.calibration.load_calibration`` reads (a path, arrays, a reader,
    ``data.real_data`` text or images). Only a path travels in ``to_dict``: in-memory data is checked
    where the request is made and, for a fleet, shipped loaded through Ray's object store.
    """

    model: str | None = None  # a model file, a model folder or demo:NAME; None tunes DEMO_MODEL
    out_dir: str = DEFAULT_OUT_DIR
    budget_s: float | None = None  # None: MODEL_BUDGET_S, or DEMO_BUDGET_S without a model (``budget``)
    shapes: tuple[str, ...] = ()  # NAME=DIMS / DIM=N (graph.shapes.parse_shape_args)
    objective: str = DEFAULT_OBJECTIVE
    max_error: float | None = None  # None: the gate's default (gate.outputs.DEFAULT_MAX_ERROR)
    metric: tuple[str, ...] = ()  # METRIC for every output and/or OUTPUT=METRIC (measure.metrics)
    calibration: Any = field(default=None, compare=False)
    providers: tuple[Any, ...] = ()  # provider names, "name:key=value" or {"name", "options"}; () is CPU
    quantize: bool = True  # INT8 variants in the search
    session_knobs: bool = True  # session options (threads, levels, IOBinding, an EP's knobs) in the search
    outputs: tuple[str, ...] = ()  # the outputs the deployment reads; () for all
    workload: str | None = None  # a traffic sample (data.workload.read_workload); None: the user's data
    batches: tuple[int, ...] = (1,)  # the batch sizes a server forms: the first is tuned for, each is timed
    resume: bool = False  # continue from OUTDIR's journal
    samples: int = DEFAULT_SAMPLES

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.model is not None:
            set_(self, "model", os.fspath(self.model))
        set_(self, "out_dir", os.fspath(self.out_dir))
        if not self.out_dir.strip():
            raise UsageError("-o/--out needs a folder path, got an empty one (give -o DIR, or leave -o out).")
        set_(self, "shapes", _shape_items(self.shapes))
        set_(self, "metric", as_strings(self.metric))
        set_(self, "outputs", as_strings(self.outputs))
        set_(self, "providers", _providers(self.providers))
        if self.workload is not None:
            set_(self, "workload", os.fspath(self.workload))
        set_(self, "batches", _batches(self.batches))
        budget = self.budget_s
        if budget is None:
            budget = self.budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= MAX_BUDGET_S:
            raise UsageError(
                f"--budget must be a positive number of seconds, at most {MAX_BUDGET_S:,.0f} (a week), got {budget!r}."
            )
        if budget <= OUTPUT_RESERVE_S:
            raise UsageError(
                f"--budget {budget:g} s leaves no time to search: a tune keeps the last {OUTPUT_RESERVE_S:g} s of "
                "its budget for writing its outputs (model, profile, reports). Give --budget "
                f"{2 * OUTPUT_RESERVE_S:g} or more (a small model tunes in 10-30 s, a transformer wants 60-120)."
            )
        if self.budget_s is not None:
            set_(self, "budget_s", float(budget))
        if self.objective not in OBJECTIVES:
            raise UsageError(f"Unknown objective '{self.objective}'; use one of {', '.join(OBJECTIVES)}.")
        if self.max_error is not None:
            set_(self, "max_error", float(self.max_error))
        require_bools({name: getattr(self, name) for name in ("quantize", "session_knobs", "resume")})
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise UsageError(f"samples must be a positive whole number, got {self.samples!r}.")

    @property
    def label(self) -> str:
        """The model as the user named it (the demo's name when none was)."""
        return self.model if self.model is not None else DEMO_MODEL

    @property
    def budget(self) -> float:
        """Seconds for the whole tune: ``budget_s``, or the default for this model (the demo's is shorter)."""
        if self.budget_s is not None:
            return float(self.budget_s)
        return DEMO_BUDGET_S if self.model is None else MODEL_BUDGET_S

    def for_model(self, model: str | os.PathLike | None, out_dir: str | os.PathLike | None = None) -> TuneRequest:
        """The same request for another model (a fleet's catalogue)."""
        return replace(self, model=model, out_dir=self.out_dir if out_dir is None else out_dir)

    @property
    def gate(self) -> GateOptions:
        """The tune's accuracy gate as every command's gate is told (``gate.options``)."""
        return GateOptions(self.max_error, self.metric, self.outputs, self.calibration)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (a fleet job, JSON): every field but in-memory calibration data."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc.update(shapes=list(self.shapes), metric=list(self.metric), outputs=list(self.outputs))
        doc["batches"] = list(self.batches)
        doc["providers"] = [p if isinstance(p, str) else dict(p) for p in self.providers]
        doc["calibration"] = path_or_none(self.calibration)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TuneRequest:
        return record_of(cls, doc, "A tune request")


def _batches(items: Any) -> tuple[int, ...]:
    """Batch sizes as given (``--batch 1,8,32`` or a sequence), each a whole number from 1 to MAX_BATCH, each once:
    an empty item (``1,,32``) or a size given twice is a typo for another size, refused rather than dropped."""
    given = items
    if isinstance(items, str):
        items = items.replace(" ", "").split(",")
    try:
        values = [int(b) for b in (items if isinstance(items, (list, tuple)) else [items])]
    except (TypeError, ValueError):
        raise UsageError(f"--batch takes batch sizes like 1,8,32, got {given!r}.") from None
    if not values or any(b < 1 or b > MAX_BATCH for b in values):
        raise UsageError(f"--batch sizes must be from 1 to {MAX_BATCH}, got {values}.")
    repeated = sorted({b for b in values if values.count(b) > 1})
    if repeated:
        raise UsageError(
            f"--batch names {', '.join(map(str, repeated))} more than once ({given!r}); give each batch size once."
        )
    return tuple(values)


def _shape_items(shapes: Sequence[str] | Mapping[str, Any] | None) -> tuple[str, ...]:
    """``--shape`` items as ``NAME=DIMS`` strings; a mapping's dims (an int or a sequence) are written out."""
    if not shapes:
        return ()
    if isinstance(shapes, Mapping):
        items = []
        for name, dims in shapes.items():
            if isinstance(dims, (list, tuple)):
                dims = "x".join(str(d) for d in dims) if dims else "scalar"
            items.append(f"{name}={dims}")
        return tuple(items)
    return as_strings(shapes)


def _providers(items: Any) -> tuple[Any, ...]:
    """Providers checked (an unknown name is exit 2 now) and kept as plain data: names and ``name:options``
    strings as given, anything else (a spec, a mapping, a (name, options) pair) as ``{"name", "options"}``."""
    from ortpilot.providers.names import resolve_providers

    if not items:
        return ()
    listed = [items] if isinstance(items, (str, Mapping, tuple)) and not _is_chain(items) else list(items)
    out: list[Any] = []
    for item in listed:
        spec = resolve_providers([item], apply_defaults=False)[0]
        out.append(item if isinstance(item, str) else {"name": spec.name, "options": dict(spec.options)})
    return tuple(out)


def _is_chain(items: Any) -> bool:
    """A tuple of providers, not one ``(name, options)`` pair."""
    return isinstance(items, tuple) and not (len(items) == 2 and isinstance(items[1], Mapping))


__all__ = [
    "DEFAULT_OBJECTIVE",
    "DEFAULT_OUT_DIR",
    "DEFAULT_SAMPLES",
    "DEMO_BUDGET_S",
    "DEMO_MODEL",
    "MODEL_BUDGET_S",
    "OBJECTIVES",
    "TuneRequest",
]
