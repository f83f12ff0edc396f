"""A session warmed at the workload's sizes when it loads, where its EP prepares each new input size on first run.

OpenVINO's CPU plugin prepares its kernels for every new input shape the first time it meets it (MiniLM on 2
CPUs, onnxruntime-openvino 1.24: 3.3 ms more on the first run at a new length, a run 4.1 ms). The tune replays
a few lengths, so its figures are those of a prepared session; a fresh process answering real sentences ran its first
600 at 1.3-1.5x ORT's default and the next at 1.9-2.2x (``benchmarks/bench_ov_shapes.py``). So the tune measures
that first-run cost for its winner (``first_run_cost``) and records a ``WarmupPlan`` in the profile: the dim, the
sizes of the workload's range (most frequent first), what it measured and whether that is worth a warm-up.
``load_profile`` then runs the session once at each size, at batch 1 and then at each batch size the workload
names (``warm_at_sizes``, within ``WARM_BUDGET_S``), so the requests meet the session the tune timed: on MiniLM's
INT8 model, calls of 32 sentences sorted by length ran at 1.9-2.0x ORT's default in a fresh process and 3.2-3.4x
warmed (``bench_ov_shapes.py --batch 32``). The CPU EP pays about 0.1 ms per new size: no warm-up.

A request at any size is made from a real one (the workload's largest; a batched tune's first item): each input's
axis is cut, or tiled with its own values, to the size, and stacked on axis 0 for a batch, so every value stays one
the model accepts (token ids in its vocabulary). A profile is an input: ``plan_problem`` checks a plan against its
workload before anything is allocated.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortpilot.data.workload import spread
from ortpilot.errors import UsageError

WARM_BUDGET_S = 5.0  # at most this long warming at load; batch 1 first, the most frequent sizes first
MAX_WARM_SIZES = 512  # sizes a plan lists at most (a wider range is sampled evenly)
MAX_WARM_BYTES = 256 << 20  # the largest warm-up request's inputs, at most (a profile is an input: it is checked)
PROBE_SIZES = 6  # new sizes the tune times twice each to measure the first-run cost
WORTH_MS = 0.5  # a first-run cost below this per new size is not worth a warm-up ...
WORTH_SHARE = 0.25  # ... nor one below this share of a run's own time


@dataclass(frozen=True)
class WarmupPlan:
    """What the profile's ``warmup`` field holds: the dim to warm along and its sizes in the order to warm them,
    the batch sizes to warm each at (the workload's: a batch of 32 is another shape to the EP), the measurement
    (extra milliseconds of a first run at a new size, and of a run) and whether it asks for a warm-up at load
    (``warm``: ``worth_warming``)."""

    dim: str
    axes: tuple[tuple[str, int], ...]
    sizes: tuple[int, ...]
    first_run_ms: float
    run_ms: float
    warm: bool = True
    batches: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        if not self.axes or not self.sizes or min(self.sizes) < 1 or not self.batches or min(self.batches) < 1:
            raise UsageError(f"A warm-up plan for '{self.dim}' needs input axes, positive sizes and batch sizes.")
        object.__setattr__(self, "batches", tuple(sorted({int(b) for b in self.batches})))

    def shapes(self) -> list[tuple[int, int]]:
        """(batch, size) in the order to warm them: every size at the smallest batch, then at the next ..."""
        return [(batch, size) for batch in self.batches for size in self.sizes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "axes": [[i, a] for i, a in self.axes],
            "sizes": list(self.sizes),
            "first_run_ms": round(self.first_run_ms, 3),
            "run_ms": round(self.run_ms, 3),
            "warm": self.warm,
            "batches": list(self.batches),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> WarmupPlan:
        try:
            return cls(
                dim=str(doc["dim"]),
                axes=tuple((str(i), int(a)) for i, a in doc["axes"]),
                sizes=tuple(int(s) for s in doc["sizes"]),
                first_run_ms=float(doc.get("first_run_ms") or 0.0),
                run_ms=float(doc.get("run_ms") or 0.0),
                warm=bool(doc.get("warm", False)),
                batches=tuple(int(b) for b in doc.get("batches") or (1,)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"A profile's warm-up plan is malformed ({type(exc).__name__}: {exc}).") from None


@dataclass(frozen=True)
class Warmed:
    """What a load's warm-up did: the (batch, size) shapes run, of how many planned, how long it took, and why it
    stopped short or did not run (``note``: the budget, a shape the session refused, a workload file missing)."""

    shapes: tuple[tuple[int, int], ...]
    planned: int
    seconds: float
    note: str = ""

    def describe(self) -> str:
        done = f"warmed {len(self.shapes)} of {self.planned} shapes in {self.seconds:.2f} s"
        return f"{done} ({self.note})" if self.note else done

    def to_dict(self) -> dict[str, Any]:
        return {
            "shapes": len(self.shapes),
            "planned": self.planned,
            "seconds": round(self.seconds, 4),
            **({"note": self.note} if self.note else {}),
        }


def sizes_to_warm(histogram: Sequence[tuple[int, int]], limit: int = MAX_WARM_SIZES) -> tuple[int, ...]:
    """Every size from the smallest to the largest the workload holds, the ones it sent most often first (a
    budget cut short still covers the bulk), then the rest of the range smallest first; a range wider than
    ``limit`` is sampled evenly after the sizes seen."""
    if not histogram:
        return ()
    seen = [size for size, _ in sorted(histogram, key=lambda sc: (-sc[1], sc[0])) if size >= 1]
    low, high = min(seen), max(seen)
    rest = sorted(set(range(low, high + 1)) - set(seen))
    room = max(0, limit - len(seen))
    if len(rest) > room:
        rest = [rest[int(i * len(rest) / room)] for i in range(room)] if room else []
    return tuple([*seen, *rest][:limit])


def base_request(
    request: Mapping[str, np.ndarray], axes: Sequence[tuple[str, int]]
) -> tuple[dict[str, np.ndarray], bool]:
    """(one request to warm from, whether it stacks into batches). A batched tune's replay set holds batches: where
    every input has the same size on axis 0 and the warmed dim is not that axis, its first item, which stacks;
    otherwise the request as it is, which does not (an input without a batch axis)."""
    arrays = {name: np.asarray(value) for name, value in request.items()}
    firsts = {value.shape[0] if value.ndim else None for value in arrays.values()}
    if len(firsts) != 1 or None in firsts or any(axis == 0 for _, axis in axes):
        return arrays, False
    return {name: value[:1] for name, value in arrays.items()}, True


def warm_request(
    requests: Sequence[Mapping[str, np.ndarray]], axes: Sequence[tuple[str, int]]
) -> tuple[dict[str, np.ndarray], bool]:
    """The request a warm-up (and the tune's measurement of it) starts from: the largest of ``requests`` along the
    dim (its first axis in ``axes``), as ``base_request`` gives it."""
    name, axis = axes[0]
    return base_request(max(requests, key=lambda r: int(np.shape(r[name])[axis])), axes)


def at_size(
    request: Mapping[str, np.ndarray], axes: Sequence[tuple[str, int]], size: int, batch: int = 1
) -> dict[str, np.ndarray]:
    """``request`` (``base_request``'s) with each of ``axes`` cut, or tiled with its own values, to ``size``; with
    ``batch`` > 1, that request ``batch`` times over on axis 0, as ``data.workload.batched_requests`` stacks them."""
    out = {name: np.asarray(value) for name, value in request.items()}
    if batch > 1:
        if any(value.shape[:1] != (1,) for value in out.values()):
            raise ValueError("the request has an input without a batch axis of 1: it does not stack into batches")
        out = {name: np.concatenate([value] * batch) for name, value in out.items()}
    for name, axis in axes:
        value = out[name]
        have = value.shape[axis]
        if have != size and have > 0:
            out[name] = np.ascontiguousarray(np.take(value, np.arange(size) % have, axis=axis))
    return out


def plan_problem(plan: WarmupPlan, workload: Mapping[str, Any], request: Mapping[str, np.ndarray]) -> str:
    """Why the plan must not run ('' when it may): its dim or axes are not its workload's, it names sizes outside
    the workload's range or more than a plan holds, batch sizes the workload does not, or requests larger than
    ``MAX_WARM_BYTES`` (a profile is an input: each figure is checked before anything is allocated)."""
    dims = {str(d.get("name")): d for d in workload.get("dims") or [] if isinstance(d, Mapping)}
    dim = dims.get(plan.dim)
    if dim is None:
        return f"its workload has no dim '{plan.dim}'"
    try:
        axes = tuple((str(i), int(a)) for i, a in dim.get("axes") or ())
        low, high = int(dim.get("min") or 0), int(dim.get("max") or 0)
        allowed = {1, *(int(b) for b in workload.get("batches") or ())}
    except (TypeError, ValueError):
        return f"its workload's '{plan.dim}' is malformed"
    if plan.axes != axes or any(name not in request or not 0 <= axis < np.ndim(request[name]) for name, axis in axes):
        return f"its plan's axes {[list(a) for a in plan.axes]} are not those of its workload's '{plan.dim}'"
    if len(plan.sizes) > MAX_WARM_SIZES or not all(low <= s <= high for s in plan.sizes):
        return f"its plan's sizes are not those of the workload's '{plan.dim}' ({low}-{high}, at most {MAX_WARM_SIZES})"
    if not set(plan.batches) <= allowed:
        return f"its plan's batch sizes {list(plan.batches)} are not the workload's {sorted(allowed)}"
    largest = 0.0
    for name, value in request.items():
        value = np.asarray(value)
        scale = 1.0
        for axis in (a for n, a in axes if n == name):  # every axis the dim sizes grows with it
            scale *= max(plan.sizes) / max(1, value.shape[axis])
        largest += value.nbytes * scale
    total = int(largest * max(plan.batches))
    if total > MAX_WARM_BYTES:
        return f"its largest warm-up request would take {total >> 20} MiB of inputs"
    return ""


def first_run_cost(
    session: Any, request: Mapping[str, np.ndarray], axes: Sequence[tuple[str, int]], sizes: Sequence[int]
) -> tuple[float, float]:
    """(extra ms of a first run at a new size, ms of a run): the medians over ``sizes``, each run twice in a row on
    ``session``, which must not have met them yet."""
    extra, runs = [], []
    for size in sizes:
        feed = at_size(request, axes, size)
        times = []
        for _ in range(2):
            start = time.perf_counter()
            session.run(None, feed)
            times.append((time.perf_counter() - start) * 1000.0)
        extra.append(times[0] - times[1])
        runs.append(times[1])
    return float(np.median(extra)) if extra else 0.0, float(np.median(runs)) if runs else 0.0


def worth_warming(first_run_ms: float, run_ms: float) -> bool:
    """Whether a first run's extra cost at a new size is worth a warm-up at load."""
    return first_run_ms >= WORTH_MS and first_run_ms >= WORTH_SHARE * run_ms


def probe_sizes(sizes: Sequence[int], skip: Sequence[int], count: int = PROBE_SIZES) -> list[int]:
    """``count`` of ``sizes`` evenly spread and not in ``skip`` (those a session has met already)."""
    fresh = sorted(set(sizes) - set(skip))
    return [fresh[i] for i in spread(len(fresh), count)]


def warm_at_sizes(
    session: Any, request: Mapping[str, np.ndarray], plan: WarmupPlan, budget_s: float = WARM_BUDGET_S
) -> Warmed:
    """Run ``session`` once at each of the plan's shapes (``WarmupPlan.shapes``), in order, until ``budget_s``; a
    shape the session refuses ends it there (``note``). ``request``: ``base_request``'s."""
    start = time.perf_counter()
    planned = plan.shapes()
    done: list[tuple[int, int]] = []
    note = ""
    for batch, size in planned:
        if time.perf_counter() - start >= budget_s:
            note = f"the {budget_s:g} s budget ran out"
            break
        try:
            session.run(None, at_size(request, plan.axes, size, batch))
        except Exception as exc:  # a warm-up only saves time: the session is as it was
            note = f"stopped at batch {batch}, size {size}: {type(exc).__name__}: {str(exc)[:300]}"
            break
        done.append((batch, size))
    return Warmed(tuple(done), len(planned), time.perf_counter() - start, note)


__all__ = [
    "MAX_WARM_BYTES",
    "MAX_WARM_SIZES",
    "WARM_BUDGET_S",
    "Warmed",
    "WarmupPlan",
    "at_size",
    "base_request",
    "first_run_cost",
    "plan_problem",
    "probe_sizes",
    "sizes_to_warm",
    "warm_at_sizes",
    "warm_request",
    "worth_warming",
]
