"""A verified session that runs a shape plan: one session per bucket, requests padded up to their bucket.

``ShapedSession`` is a ``VerifiedSession`` (its providers, placement and settings are those of its largest
bucket's session) whose ``run`` takes requests at their own size: it pads each to the smallest bucket that
holds it (``data.padding.pad_feeds``), runs that bucket's session, and cuts the outputs back
(``cut_outputs``). A request beyond the largest bucket runs on the model with the dim left free, or is
refused when the plan says so; ``served`` counts both. ``load_shaped`` builds it, the free-dim session
included: made on first need, the first long request would pay a session's creation (an OpenVINO compile
of MiniLM's INT8 model made one round of 300 sentences run 0.83x ORT's default; made at load, 1.49-2.09x).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from ortpilot.data.padding import cut_outputs, pad_feeds
from ortpilot.errors import InputError
from ortpilot.session.options import SessionSettings
from ortpilot.session.shapeplan import ShapePlan, bucket_settings
from ortpilot.session.verified import VerifiedSession, load


class ShapedSession(VerifiedSession):
    """A ``VerifiedSession`` over a shape plan's bucket sessions (module docstring)."""

    def __init__(
        self,
        plan: ShapePlan,
        buckets: Mapping[int, VerifiedSession],
        make_dynamic: Any,
        create_s: float = 0.0,
        dynamic: VerifiedSession | None = None,
    ) -> None:
        primary = buckets[max(buckets)]
        self.__dict__.update(primary.__dict__)
        self.plan = plan
        self.buckets = dict(buckets)
        self.create_s = create_s  # every bucket's session (and the free-dim one, where made at load)
        self._make_dynamic = make_dynamic
        self._dynamic: VerifiedSession | None = dynamic
        self._lock = threading.Lock()
        self._output_axes = output_axes(primary.model, plan)
        self._names = [o.name for o in primary.session.get_outputs()]
        self.served: Counter[str] = Counter()  # bucket size (as text) or "beyond" -> requests run

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """Same signature as ``InferenceSession.run``; the request at its own size."""
        size = self.plan.size_of(input_feed)
        bucket = self.plan.bucket_for(size)
        if bucket is None:
            self.served["beyond"] += 1
            return self._beyond(size).run(output_names, input_feed, run_options)
        self.served[str(bucket)] += 1
        padded = pad_feeds(input_feed, self.plan.axes, bucket, self.plan.pad_value)
        outputs = self.buckets[bucket].run(output_names, padded, run_options)
        names = list(output_names) if output_names else self._names
        axes = [self._output_axes.get(n, ()) for n in names]
        return cut_outputs(outputs, axes, size, bucket)

    def _beyond(self, size: int) -> VerifiedSession:
        if self.plan.beyond == "refuse":
            raise InputError(
                f"This request's '{self.plan.dim}' is {size}, beyond the largest bucket the profile was tuned with "
                f"({self.plan.sizes[-1]}), and its shape plan refuses longer requests: send at most "
                f"{self.plan.sizes[-1]}, or re-tune with a workload that holds such requests."
            )
        with self._lock:
            if self._dynamic is None:
                self._dynamic = self._make_dynamic()
        return self._dynamic

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "shape_plan": self.plan.to_dict(),
            "served": dict(self.served),
            "beyond_session": self._dynamic is not None,
        }


def output_axes(model: onnx.ModelProto, plan: ShapePlan) -> dict[str, tuple[tuple[int, str], ...]]:
    """Output name -> the axes a padded run may have grown: ``same`` where the graph names the plan's dim,
    ``scaled`` where it names a dim no input has (a CTC recognizer's steps) or none; never axis 0, the batch."""
    input_dims = {
        d.dim_param
        for i in model.graph.input
        for d in i.type.tensor_type.shape.dim
        if d.dim_param and d.dim_param != plan.dim
    }
    out: dict[str, tuple[tuple[int, str], ...]] = {}
    for output in model.graph.output:
        axes = []
        for axis, dim in enumerate(output.type.tensor_type.shape.dim):
            if axis == 0 or dim.HasField("dim_value"):
                continue
            if dim.dim_param == plan.dim:
                axes.append((axis, "same"))
            elif dim.dim_param not in input_dims:
                axes.append((axis, "scaled"))
        out[output.name] = tuple(axes)
    return out


def load_shaped(
    model: str,
    providers: Any,
    policy: str,
    plan: ShapePlan,
    *,
    settings: SessionSettings | None = None,
    beyond_at_load: bool = True,
    **kwargs: Any,
) -> ShapedSession:
    """A session per bucket of ``plan`` on ``model`` (each with the plan's dim fixed by
    ``free_dimension_overrides``), as one ``ShapedSession``; ``kwargs`` go to ``session.load``.

    ``beyond_at_load``: make the free-dim session for longer requests now (what a user's first long request
    would otherwise wait for); tune's timing, whose requests all fit the largest bucket, leaves it to need."""
    base = (settings or SessionSettings()).to_dict()
    start = time.perf_counter()
    buckets = {
        size: load(
            model, providers, policy, settings=SessionSettings.from_dict(bucket_settings(base, plan, size)), **kwargs
        )
        for size in plan.sizes
    }

    def dynamic() -> VerifiedSession:
        return load(model, providers, policy, settings=SessionSettings.from_dict(base), **kwargs)

    made = dynamic() if beyond_at_load and plan.beyond == "dynamic" else None
    return ShapedSession(plan, buckets, dynamic, time.perf_counter() - start, made)


__all__ = ["ShapedSession", "load_shaped", "output_axes"]
