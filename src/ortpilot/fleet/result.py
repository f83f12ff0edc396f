"""What a fleet tune returns: per model, the classes tuned (where, with which winner) and those missing.

``FleetResult.to_dict`` is the ``--json`` document of ``ortpilot tune ... --ray``; the bundles
themselves (``bundle.json`` per model) hold the same per-class facts for the readers of the
bundle (``artifacts.bundle``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_REFERENCE = "ORT's default"


@dataclass(frozen=True)
class SearchSummary:
    """What the driver keeps of one class's ``TuneResult`` (``fleet.child`` makes it on the node): the winner,
    its speedup over what it was measured against, how the run went."""

    winner: str = ""
    speedup: dict[str, float] = field(default_factory=dict)  # ratio, ci_low, ci_high
    measured_against: str = DEFAULT_REFERENCE
    default_best: bool = False
    default_best_reason: str = ""
    wall_s: float = 0.0
    resumed: bool = False
    candidates: int = 0
    gate_warning: str | None = None
    load_note: str = ""

    @classmethod
    def of_result(cls, doc: Mapping[str, Any], measured_against: str) -> SearchSummary:
        """From a ``TuneResult.to_dict()``."""
        return cls(
            winner=str((doc.get("winner") or {}).get("label", "")),
            speedup={k: float(v) for k, v in (doc.get("speedup") or {}).items() if isinstance(v, (int, float))},
            measured_against=measured_against or DEFAULT_REFERENCE,
            default_best=bool(doc.get("default_best")),
            default_best_reason=str(doc.get("default_best_reason") or ""),
            wall_s=float(doc.get("wall_s") or 0.0),
            resumed=bool(doc.get("resumed")),
            candidates=len(doc.get("candidates") or []),
            gate_warning=doc.get("gate_warning"),
            load_note=str(doc.get("load_note") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchSummary:
        return cls(**dict(doc))


@dataclass
class ClassOutcome:
    """One (model, class) search: where it ran, its attempts, and its winner or why it is missing."""

    name: str  # the class's name in the bundle (its folder)
    machine_class: dict[str, Any]  # {name, id, key}
    node: dict[str, str] = field(default_factory=dict)  # the node that finished it: id, ip, host
    attempts: list[dict[str, str]] = field(default_factory=list)  # each try: node, and why it ended
    summary: SearchSummary | None = None  # the finished search's, from its node
    start_s: float | None = None  # seconds since the fleet tune started
    end_s: float | None = None
    missing: str = ""  # why the class is not in the bundle ("" when it is)
    exit_code: int = 0  # of the failure that made it missing

    @property
    def done(self) -> bool:
        return not self.missing and self.summary is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.name,
            "machine_class": self.machine_class,
            "done": self.done,
            "node": self.node,
            "attempts": self.attempts,
            "winner": self.summary.winner if self.summary else None,
            "speedup": self.summary.speedup if self.summary else None,
            "default_best": self.summary.default_best if self.summary else None,
            "wall_s": self.summary.wall_s if self.summary else None,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "missing": self.missing or None,
        }


@dataclass
class ModelOutcome:
    """One model of the catalogue: its bundle and its classes."""

    name: str
    label: str
    bundle: Path  # the folder holding bundle.json
    classes: list[ClassOutcome]

    @property
    def complete(self) -> bool:
        return all(c.done for c in self.classes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.label,
            "bundle": str(self.bundle),
            "complete": self.complete,
            "classes": [c.to_dict() for c in self.classes],
        }


@dataclass
class FleetResult:
    """Every model's bundle, the cluster it was tuned on, and how the searches were spread."""

    out_dir: Path
    address: str
    fleet: dict[str, Any]
    models: list[ModelOutcome]
    tuned: str  # "one after the other" | "at once"
    why: str
    wall_s: float
    plan: dict[str, Any]  # the scheduler's plan on the budgets (fleet.schedule.plan), for comparison

    @property
    def complete(self) -> bool:
        return all(m.complete for m in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "address": self.address,
            "complete": self.complete,
            "tuned": self.tuned,
            "why": self.why,
            "wall_s": self.wall_s,
            "fleet": self.fleet,
            "models": [m.to_dict() for m in self.models],
            "plan": self.plan,
        }


__all__ = ["ClassOutcome", "FleetResult", "ModelOutcome", "SearchSummary"]
