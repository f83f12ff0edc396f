"""A tune candidate: a pipeline of passes, providers, session settings and IOBinding.

A candidate is plain data with a stable id (a hash of its canonical JSON), so the journal can
say which candidates are finished, the worker process can rebuild one from a dict, and the
profile can record exactly what won. Its passes are ``passes.registry.Step`` records (a
registered pass name and its options): each builds its ``Pass`` and gives that pass's label.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from ortpilot.eps import CPU_EP
from ortpilot.passes.registry import Step
from ortpilot.session import SessionSettings

PassStep = Step  # {"pass": "fusion"|"quantize", ...options}, typed


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Candidate:
    """One configuration to build, verify and measure."""

    passes: tuple[PassStep, ...] = ()
    providers: tuple[dict[str, Any], ...] = ({"name": CPU_EP, "options": {}},)
    settings: SessionSettings = field(default_factory=SessionSettings)
    iobinding: bool = False
    baseline: bool = False
    shape_plan: dict[str, Any] | None = None  # session.shapeplan.ShapePlan.to_dict(): a session per bucket
    # What the model without passes is, for the label: "fp32", or "int8 (as given)" for a model that came
    # quantized (``tuning.space.Facts.given_int8``). Not part of the id: the same configuration, named truly.
    given: str = "fp32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "passes", tuple(Step.of(p) for p in self.passes))

    @property
    def id(self) -> str:
        """Stable across processes and runs: the same configuration always has the same id."""
        return hashlib.sha256(_canonical(self._key()).encode()).hexdigest()[:12]

    @property
    def model_key(self) -> str:
        """Candidates with equal passes share one transformed model."""
        return hashlib.sha256(_canonical(self._steps()).encode()).hexdigest()[:16]

    def _steps(self) -> list[dict[str, Any]]:
        return [step.to_dict() for step in self.passes]

    def _key(self) -> dict[str, Any]:
        key = {
            "passes": self._steps(),
            "providers": list(self.providers),
            "settings": self.settings.to_dict(),
            "iobinding": self.iobinding,
        }
        if self.shape_plan is not None:  # only then: the ids of candidates without one stay as they were
            key["shape_plan"] = self.shape_plan
        return key

    @property
    def label(self) -> str:
        """Short human description: what differs from ORT's default session."""
        if self.baseline:
            return "ORT default"
        parts = [step.label() for step in self.passes] or [self.given]
        names = [p["name"].replace("ExecutionProvider", "").lower() for p in self.providers]
        if names != ["cpu"]:
            parts.append("+".join(names))
        parts.extend(f"{k}={v}" for p in self.providers for k, v in sorted((p.get("options") or {}).items()))
        default = SessionSettings().to_dict()
        for key, value in self.settings.to_dict().items():
            if key == "config_entries":
                parts.extend(_ENTRY_LABELS.get((k, str(v)), f"{k}={v}") for k, v in sorted(value.items()))
            elif value != default[key]:
                parts.append(f"{_SHORT.get(key, key)}={_fmt(value)}")
        if self.iobinding:
            parts.append("iobinding")
        if self.shape_plan is not None:
            parts.append(f"buckets({','.join(str(n) for n in self.shape_plan.get('sizes') or ())})")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        given = {"given": self.given} if self.given != "fp32" else {}
        return {
            "id": self.id,
            "label": self.label,
            "baseline": self.baseline,
            "shape_plan": None,
            **self._key(),
            **given,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        return cls(
            passes=tuple(Step.of(p) for p in data.get("passes", ())),
            providers=tuple(dict(p) for p in data.get("providers", ())),
            settings=SessionSettings.from_dict(dict(data.get("settings", {}))),
            iobinding=bool(data.get("iobinding", False)),
            baseline=bool(data.get("baseline", False)),
            shape_plan=dict(data["shape_plan"]) if data.get("shape_plan") else None,
            given=str(data.get("given") or "fp32"),
        )

    def derived(self, **changes: Any) -> Candidate:
        """Another candidate built from this one (never the baseline), ``changes`` applied; it keeps ``given``."""
        return replace(self, baseline=False, **changes)

    def with_settings(self, **changes: Any) -> Candidate:
        data = self.settings.to_dict()
        data.update(changes)
        return self.derived(settings=SessionSettings.from_dict(data))

    def with_provider_options(self, **changes: str) -> Candidate:
        """The first provider with ``changes`` to its options (OpenVINO's precision, threads)."""
        first = dict(self.providers[0])
        first["options"] = {**(first.get("options") or {}), **changes}
        return self.derived(providers=(first, *self.providers[1:]))

    def with_iobinding(self, on: bool = True) -> Candidate:
        return self.derived(iobinding=on)

    def with_shape_plan(self, plan: dict[str, Any] | None) -> Candidate:
        """This configuration on a shape plan's bucket sessions (None: the dim left free). A plan's sessions
        are bound per bucket by their own run, so IOBinding is off with one."""
        return self.derived(shape_plan=dict(plan) if plan else None, iobinding=False if plan else self.iobinding)


_SHORT = {
    "level": "level",
    "intra_op_threads": "intra",
    "inter_op_threads": "inter",
    "execution_mode": "mode",
    "enable_cpu_mem_arena": "arena",
    "enable_mem_pattern": "mem_pattern",
}


_ENTRY_LABELS = {("session.intra_op.allow_spinning", "0"): "spin=off"}


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def pass_label(step: Step | dict[str, Any]) -> str:
    """``fusion(bert)``, ``int8-dynamic-pc``, ``int8-qdq``, ``int8-dynamic-w-pc-x2`` (2 layers left float)...:
    the label of the pass the step builds (``Pass.label``)."""
    return Step.of(step).label()


def baseline_candidate(given: str = "fp32") -> Candidate:
    """ORT's default session: level all, default threads, CPU, no passes, no IOBinding."""
    return Candidate(baseline=True, given=given)
