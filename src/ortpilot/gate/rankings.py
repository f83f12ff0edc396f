"""Rankings for the auto-exclude loop: which layers cost the most accuracy, worst first.

- :class:`DynamicNoise`: dynamic INT8. Each weighted node's product replayed on the calibration
  activations with ORT's own integer kernels, the noise leaving it in float removes
  (``passes.sensitivity``). Depends on the float model only: ranked once.
- :class:`QdqErrors`: static/QDQ/full. ORT's ``qdq_loss_debug`` matches every activation of the
  quantized model with its float twin; a node's figure is the SQNR lost at it (``passes.debug``).
  Re-ranked on every try's model (leaving one layer in float moves the error downstream).
- :class:`GroupSensitivity`: weight-only decoders. Each layer group quantized alone and measured
  with the generation gate; ranked by mean KL. Ranked once.

All of them rank on calibration data or on the gate's own probe, never on what would let a
layer's ranking see the held-out answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ortpilot.gate.core import ModelGate
from ortpilot.gate.exclude import Layer, Try
from ortpilot.passes.base import SourceModel
from ortpilot.passes.debug import LayerError, layer_errors
from ortpilot.passes.options import NOISE_RANKING
from ortpilot.passes.quantize import QuantizePass

log = logging.getLogger("ortpilot")


def _layers(errors: Sequence[LayerError]) -> list[Layer]:
    return [
        Layer(e.node, tuple(e.exclude), e.noise_share if e.noise_share is not None else e.drop_db, e) for e in errors
    ]


class DynamicNoise:
    """Dynamic INT8: layers by the noise their integer product adds on the calibration activations."""

    def __init__(self, step: QuantizePass, source: SourceModel, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        self.step, self.source, self.samples = step, source, list(samples)
        self._ranked: list[Layer] | None = None

    def rank(self, attempt: Try) -> list[Layer]:
        if self._ranked is None:
            built = attempt.built.model if attempt.built is not None else None
            self._ranked = _layers(layer_errors(self.step, self.source, built, self.samples))
        return self._ranked


class QdqErrors:
    """Static, QDQ and full INT8: layers by the SQNR lost at each, on the variant the try measured."""

    def __init__(self, source: SourceModel, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        self.source, self.samples = source, list(samples)
        self._by_try: dict[tuple[str, ...], list[Layer]] = {}

    def rank(self, attempt: Try) -> list[Layer]:
        key = tuple(attempt.excluded)
        if key not in self._by_try:
            self._by_try[key] = _layers(
                layer_errors(attempt.step.pass_, self.source, attempt.built.model, self.samples)
            )
        return self._by_try[key]


def int8_ranking(
    step: QuantizePass, source: SourceModel, samples: Sequence[Mapping[str, np.ndarray]]
) -> DynamicNoise | QdqErrors:
    """The ranking ``step``'s options ask for (rank on calibration samples, not the gate's held-out ones)."""
    return DynamicNoise(step, source, samples) if step.config.ranking == NOISE_RANKING else QdqErrors(source, samples)


class GroupSensitivity:
    """Layer groups by the gate's ``metric`` with only that group quantized (a decoder's layers, LM head,
    embedding: per-group is the granularity that decides accuracy in practice and keeps the search short)."""

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        quantize_only: Callable[[Sequence[str]], Any],
        gate: ModelGate,
        metric: str = "kl_mean",
    ) -> None:
        """``quantize_only(nodes)``: the model with just ``nodes`` quantized."""
        self.groups = {name: list(nodes) for name, nodes in groups.items()}
        self.quantize_only, self.gate, self.metric = quantize_only, gate, metric
        self._ranked: list[Layer] | None = None

    def rank(self, attempt: Try) -> list[Layer]:
        if self._ranked is None:
            log.warning(
                "The quantized model fails the gate (%s); ranking %d layer groups by sensitivity.",
                attempt.result.describe() if attempt.result else "not measured",
                len(self.groups),
            )
            scores = {}
            for group, nodes in self.groups.items():
                check = self.gate.measure(self.quantize_only(nodes)).check(self.metric)
                scores[group] = check.value if check is not None else 0.0
            order = sorted(scores, key=scores.__getitem__, reverse=True)
            self._ranked = [Layer(g, tuple(self.groups[g]), scores[g]) for g in order]
        return self._ranked

    @property
    def sensitivity(self) -> dict[str, float]:
        """Group -> its figure, in the groups' own order (empty when nothing had to be ranked)."""
        if self._ranked is None:
            return {}
        scores = {layer.name: layer.score for layer in self._ranked}
        return {g: scores[g] for g in self.groups}


def noise_layers(records: Sequence[Mapping[str, Any]]) -> list[Layer]:
    """``passes.sensitivity.rank_dynamic`` records (as a tune worker journals them) as ranked layers."""
    return [Layer(str(r["node"]), (str(r["node"]),), float(r.get("nsr", 0.0)), dict(r)) for r in records]


__all__ = ["DynamicNoise", "GroupSensitivity", "QdqErrors", "int8_ranking", "noise_layers"]
