"""The tuner's accuracy gate: every output of a candidate against ORT's default session.

The metric is chosen per output by ``measure.compare.choose_metric`` (cosine distance for
embeddings and hidden states, top-1 disagreement for class scores, relative L2 otherwise) or
forced with ``metric``. Every metric is an error (0 = identical), so one limit serves them all:
0.01 by default, strict enough that plain dynamic INT8 of MiniLM (cosine 0.88) fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.measure.compare import METRIC_DESCRIPTIONS, choose_metric, metric_error

DEFAULT_MAX_ERROR = 0.01


@dataclass
class Gate:
    """Compares candidate outputs (saved by the worker) with the baseline's."""

    reference: dict[str, list[np.ndarray]]
    max_error: float = DEFAULT_MAX_ERROR
    metric: str | None = None

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in METRIC_DESCRIPTIONS:
            raise UsageError(f"Unknown --metric '{self.metric}'; use one of {', '.join(METRIC_DESCRIPTIONS)}.")
        if not (self.max_error >= 0):
            raise UsageError(f"--max-error must be >= 0, got {self.max_error}.")

    @classmethod
    def from_file(cls, path: str | Path, max_error: float | None, metric: str | None) -> Gate:
        return cls(read_outputs(path), DEFAULT_MAX_ERROR if max_error is None else float(max_error), metric)

    def metrics(self) -> dict[str, str]:
        """Output name -> metric used (printed before the search starts)."""
        return {name: self.metric or choose_metric(name, arrays[0].shape, arrays[0].dtype)
                for name, arrays in self.reference.items()}

    def check(self, path: str | Path) -> dict[str, Any]:
        test = read_outputs(path)
        outputs = []
        for name, metric in self.metrics().items():
            if name not in test:
                outputs.append({"name": name, "metric": metric, "error": math.inf, "note": "output missing"})
                continue
            ref = self.reference[name]
            got = test[name]
            if [a.shape for a in ref] != [b.shape for b in got]:
                outputs.append({"name": name, "metric": metric, "error": math.inf, "note": "shape changed"})
                continue
            error = metric_error(metric, ref, got)
            outputs.append({"name": name, "metric": metric, "error": float(error) if math.isfinite(error) else math.inf})
        worst = max((o["error"] for o in outputs), default=0.0)
        return {"passed": bool(worst <= self.max_error), "max_error": self.max_error,
                "worst_error": worst, "outputs": outputs}


def read_outputs(path: str | Path) -> dict[str, list[np.ndarray]]:
    """``{i}/{name}`` arrays from the worker's npz into name -> one array per sample."""
    per: dict[str, dict[int, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            index, _, name = key.partition("/")
            per.setdefault(name, {})[int(index)] = data[key]
    return {name: [by_index[i] for i in sorted(by_index)] for name, by_index in per.items()}


def describe(metric: str) -> str:
    return METRIC_DESCRIPTIONS.get(metric, metric)
