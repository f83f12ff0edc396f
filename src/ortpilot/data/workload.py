"""What a deployment sends: the shapes of its requests, and the batch sizes a server forms.

A tune measures a *workload*, not one tensor shape: real sentences have a median of 17 tokens, and a
configuration chosen at the 128 a tokenizer pads to can lose to ORT's default at the lengths users send.
This module holds the record and its pure parts: which dims vary across requests (``varying_dims``), a
small *replay set* that stands for the whole when timing (``replay_set``: requests at evenly spaced
quantiles of their size, so the mean over one pass is close to the mean over the workload), and a summary
a report can print. The requests themselves come from the user's data at their natural sizes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.graph.shapes import InputInfo

REPLAY_SIZE = 8  # requests timed per pass: the workload's 1/16, 3/16, ... 15/16 quantiles by size
Sample = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class DimStats:
    """One dim that varies across requests: its name and the distribution of its sizes."""

    name: str  # the graph's symbol (``sequence``), or ``INPUT:AXIS`` for an unnamed dim
    axes: tuple[tuple[str, int], ...]  # every (input, axis) it sizes
    histogram: tuple[tuple[int, int], ...]  # (size, requests), by size

    @property
    def sizes(self) -> np.ndarray:
        return np.repeat([s for s, _ in self.histogram], [n for _, n in self.histogram])

    def quantile(self, q: float) -> int:
        return int(np.quantile(self.sizes, q, method="higher"))

    def describe(self) -> str:
        low, high = self.histogram[0][0], self.histogram[-1][0]
        return (
            f"{self.name} {low}-{high} (p50 {self.quantile(0.5)}, p90 {self.quantile(0.9)}, p99 {self.quantile(0.99)})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "axes": [[i, a] for i, a in self.axes],
            "histogram": {str(s): n for s, n in self.histogram},
            "min": self.histogram[0][0],
            "p50": self.quantile(0.5),
            "p90": self.quantile(0.9),
            "p99": self.quantile(0.99),
            "max": self.histogram[-1][0],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> DimStats:
        histogram = sorted((int(s), int(n)) for s, n in dict(doc["histogram"]).items())
        return cls(str(doc["name"]), tuple((str(i), int(a)) for i, a in doc["axes"]), tuple(histogram))


@dataclass(frozen=True)
class Workload:
    """The requests a tune measures: where they came from, how many, each varying dim's distribution, the
    batch sizes timed, and the digest of their shapes (a resume or a verify checks it)."""

    source: str  # the user's data kind (text, images, files ...), or synthetic
    requests: int
    dims: tuple[DimStats, ...] = ()
    batches: tuple[int, ...] = (1,)
    replay: int = 1  # requests in the replay set (one timed pass)
    sha256: str = ""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the median request's shapes

    @property
    def varies(self) -> bool:
        return bool(self.dims)

    def describe(self) -> str:
        """``sequence 5-134 (p50 17, p90 36, p99 64) over 200 requests`` or ``one shape: input_ids=1x128``."""
        if not self.dims:
            shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.shapes.items())
            return f"one shape ({shapes})" if shapes else "one shape"
        kind = {"images": "image", "files": "file", "synthetic": "generated"}.get(self.source, self.source)
        return f"{'; '.join(d.describe() for d in self.dims)} over {self.requests} {kind} requests"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "requests": self.requests,
            "dims": [d.to_dict() for d in self.dims],
            "batches": list(self.batches),
            "replay": self.replay,
            "sha256": self.sha256,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "summary": self.describe(),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Workload:
        return cls(
            source=str(doc["source"]),
            requests=int(doc["requests"]),
            dims=tuple(DimStats.from_dict(d) for d in doc.get("dims") or ()),
            batches=tuple(int(b) for b in doc.get("batches") or (1,)),
            replay=int(doc.get("replay") or 1),
            sha256=str(doc.get("sha256") or ""),
            shapes={k: tuple(int(d) for d in v) for k, v in (doc.get("shapes") or {}).items()},
        )

    @classmethod
    def of_samples(
        cls, samples: Sequence[Sample], inputs: Sequence[InputInfo], source: str, *, replay: int = REPLAY_SIZE
    ) -> Workload:
        """The workload ``samples`` describe (the user's requests at their natural sizes)."""
        dims = varying_dims(samples, inputs)
        stats = []
        for name, axes in dims.items():
            first_input, first_axis = axes[0]
            sizes = [int(s[first_input].shape[first_axis]) for s in samples]
            counts = sorted({size: sizes.count(size) for size in sizes}.items())
            stats.append(DimStats(name, tuple(axes), tuple(counts)))
        median = sorted(samples, key=_size)[len(samples) // 2] if samples else {}
        return cls(
            source=source,
            requests=len(samples),
            dims=tuple(stats),
            replay=len(replay_set(samples, replay)) if samples else 1,
            sha256=shapes_digest(samples),
            shapes={k: tuple(int(d) for d in np.shape(v)) for k, v in median.items()},
        )


def varying_dims(samples: Sequence[Sample], inputs: Sequence[InputInfo]) -> dict[str, list[tuple[str, int]]]:
    """Dim name -> the (input, axis) pairs it sizes, for every axis whose size differs between ``samples``.
    Axes the graph names with one symbol are one dim (``input_ids`` and ``attention_mask`` share ``sequence``)."""
    by_name = {i.name: i for i in inputs}
    dims: dict[str, list[tuple[str, int]]] = {}
    if not samples:
        return dims
    for name in samples[0]:
        rank = np.ndim(samples[0][name])
        for axis in range(rank):
            sizes = {int(np.shape(s[name])[axis]) for s in samples if name in s and np.ndim(s[name]) == rank}
            if len(sizes) < 2:
                continue
            info = by_name.get(name)
            symbol = info.dims[axis] if info is not None and axis < len(info.dims) else None
            key = symbol if isinstance(symbol, str) and symbol else f"{name}:{axis}"
            dims.setdefault(key, []).append((name, axis))
    return dims


def replay_set(samples: Sequence[Sample], size: int = REPLAY_SIZE) -> list[Sample]:
    """At most ``size`` of ``samples`` at evenly spaced quantiles of their size (elements over all inputs),
    smallest first; every sample when there are no more than ``size``; the first alone when all are one shape."""
    if not samples:
        return []
    shapes = {tuple((k, np.shape(v)) for k, v in sorted(s.items())) for s in samples}
    if len(shapes) == 1:
        return [samples[0]]
    ordered = sorted(samples, key=_size)
    return [ordered[i] for i in spread(len(ordered), size)]


def extremes(samples: Sequence[Sample], inputs: Sequence[InputInfo]) -> list[Sample]:
    """The smallest and the largest request along each dim that varies: the replay set's quantiles leave them
    out, so a size the model cannot take (past a position limit, under a convolution's window) is met here
    first, by ORT's default session before the search (``tuning.worker``'s probe). [] where nothing varies."""
    out: dict[int, Sample] = {}
    for axes in varying_dims(samples, inputs).values():
        name, axis = axes[0]
        sized = [s for s in samples if name in s and np.ndim(s[name]) > axis]
        for pick in (min, max):
            chosen = pick(sized, key=lambda s: int(np.shape(s[name])[axis]))
            out.setdefault(id(chosen), chosen)
    return list(out.values())


def spread(n: int, count: int) -> list[int]:
    """``count`` indices of ``n`` items at evenly spaced quantiles (the 1/2count, 3/2count ... ones), in order;
    all of them when there are no more than ``count``."""
    if n <= count:
        return list(range(n))
    return [min(n - 1, int((2 * i + 1) * n / (2 * count))) for i in range(count)]


SCREEN_BATCHES = 4  # a batch size's runs the search's screening replays (``screening_set``)


def batched_requests(
    requests: Sequence[Sample], batch: int, inputs: Sequence[InputInfo], pad_value: Any, *, runs: int = SCREEN_BATCHES
) -> list[dict[str, np.ndarray]]:
    """The requests as a server batches them: sorted by size, cut into runs of ``batch``, each request padded
    to its run's longest in every dim that varies (``pad_value(input)``: a mask 0, token ids the pad id) and
    stacked on axis 0. Every run when there are at most ``2 * runs`` of them: each run is one call of equal weight
    in the traffic, and ``runs`` evenly spaced ones of a few keep both extremes (4 of 6 time the longest run a
    quarter of the replay against a sixth of the traffic: OpenVINO's INT8, faster at long lengths, read 3.07x
    ORT's default on those 4 and 2.89x on all 6 of MiniLM's). Beyond, ``runs`` of them at evenly spaced
    positions. [] when the requests are not of batch 1 or there are fewer than ``batch`` of them."""
    from ortpilot.data.padding import pad_feeds

    if batch < 1 or len(requests) < batch or any(np.shape(v)[:1] != (1,) for r in requests for v in r.values()):
        return []
    dims = varying_dims(requests, inputs)
    ordered = sorted(requests, key=_size)
    groups = [ordered[i : i + batch] for i in range(0, len(ordered) - batch + 1, batch)]
    chosen = range(len(groups)) if len(groups) <= 2 * runs else spread(len(groups), runs)
    out = []
    for members in (groups[i] for i in chosen):
        padded = [dict(r) for r in members]
        for axes in dims.values():
            name, axis = axes[0]
            longest = max(int(r[name].shape[axis]) for r in members)
            padded = [pad_feeds(r, axes, longest, pad_value) for r in padded]
        out.append({name: np.concatenate([p[name] for p in padded]) for name in members[0]})
    return out


def screening_set(batches: Sequence[Sample], count: int = SCREEN_BATCHES) -> list[Sample]:
    """The ``count`` of a batch size's replay set (``batched_requests``) that the search's screening replays, at
    evenly spaced positions: it ranks candidates at two thirds of the cost of six calls of 32, and the final, whose
    figures make the headline, replays them all."""
    return [batches[i] for i in spread(len(batches), count)]


def shapes_digest(samples: Sequence[Sample]) -> str:
    """sha256 of every request's input shapes, in order."""
    doc = [{k: list(np.shape(v)) for k, v in sorted(s.items())} for s in samples]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def _size(sample: Sample) -> int:
    return int(sum(np.size(v) for v in sample.values()))


def read_workload(
    path: str | os.PathLike,
    model: Any,
    inputs: Sequence[InputInfo],
    folder: Any = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[list[dict[str, np.ndarray]], str]:
    """(requests, source) of a ``--workload`` file, checked against the model's inputs (a UsageError names
    what does not fit): ``.txt`` lines tokenized at their own length with the model folder's tokenizer,
    ``.npz`` requests (``{i}/{input}`` arrays, or arrays whose first axis counts requests), or ``.json``
    ``{"dims": {DIM: {SIZE: COUNT}}}``, each request then generated at a size drawn from the histogram, its other
    dims at ``shapes`` (parsed ``--shape``) or their defaults."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--workload '{file}' is not a file: give a .txt (a request a line), .npz or .json.")
    suffix = file.suffix.lower()
    if suffix == ".txt":
        from ortpilot.data import real_data

        data = real_data(text=file, folder=folder, text_flag="--workload")
        assert data is not None
        requests, _ = data.samples(inputs)
        return _checked(requests, inputs, file), "text"
    if suffix == ".npz":
        from ortpilot.graph.feeds import read_npz, read_samples

        arrays = read_npz(file, "--workload")
        if arrays and all("/" in k for k in arrays):
            return _checked(read_samples(file, "--workload"), inputs, file), "files"
        return _checked(_stacked_requests(arrays, inputs, file), inputs, file), "files"
    if suffix == ".json":
        return _from_histogram(file, model, inputs, shapes or {}), "synthetic"
    raise UsageError(f"--workload '{file}' is not a .txt, .npz or .json file.")


def _stacked_requests(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[InputInfo], file: Path
) -> list[dict[str, np.ndarray]]:
    """The requests in arrays whose first axis counts them: an array of one dim more than its input holds whole
    requests (``(N, 1, L)``), one of the input's own rank holds requests of batch 1 (``(N, L)``), as calibration
    files read. Names that are no input, and arrays with no axis to count, are refused by name."""
    ranks = {i.name: len(i.dims) for i in inputs}
    unknown = sorted(k for k in arrays if k not in ranks)
    if unknown:
        raise UsageError(
            f"--workload '{file}' does not fit the model: it has arrays {', '.join(map(repr, unknown))} that are "
            f"not model inputs; the inputs are {', '.join(ranks)} (or store one request per key as '0/input_ids', "
            "'1/input_ids', ...)."
        )
    flat = sorted(k for k, v in arrays.items() if np.ndim(v) == 0)
    counts = {len(v) for v in arrays.values() if np.ndim(v)}
    if flat or len(counts) != 1:
        said = f"{', '.join(flat)} {'has' if len(flat) == 1 else 'have'} no axis" if flat else f"{sorted(counts)}"
        raise UsageError(
            f"--workload '{file}': its arrays do not share a first axis counting requests ({said}); "
            "store one request per key as '0/input_ids', '1/input_ids', ... instead."
        )
    (n,) = counts

    def request(i: int) -> dict[str, np.ndarray]:
        return {k: v[i] if np.ndim(v) > ranks[k] else v[i : i + 1] for k, v in arrays.items()}

    return [request(i) for i in range(n)]


def _from_histogram(
    file: Path, model: Any, inputs: Sequence[InputInfo], fixed: Mapping[str, tuple[int, ...]]
) -> list[dict[str, np.ndarray]]:
    """``HISTOGRAM_REQUESTS`` requests at sizes spread over the histogram (by its quantiles)."""
    from ortpilot.graph.feeds import make_feeds, plan_feeds

    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
        dims = {
            str(d): {int(s): _count(c, file, d, s) for s, c in dict(h).items()} for d, h in dict(doc["dims"]).items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = f"it has no {exc} object" if isinstance(exc, KeyError) else " ".join(str(exc).split())[:160]
        raise UsageError(
            f"--workload '{file}' is not a workload histogram ({why}); write "
            '{"dims": {"sequence": {"17": 120, "32": 40}}}: each dim, its sizes and how many requests had each.'
        ) from None
    known = {d for i in inputs for d in i.dims if isinstance(d, str)}
    unknown = sorted(set(dims) - known)
    if not dims:
        raise UsageError(
            f"--workload '{file}' gives no dims; name the model's dynamic dims with their sizes: "
            f"{', '.join(sorted(known)) or 'none'}."
        )
    if unknown:
        raise UsageError(
            f"--workload '{file}' names dims the model does not have ({', '.join(unknown)}); its "
            f"dynamic dims are: {', '.join(sorted(known)) or 'none'}."
        )
    bad = {d: [s for s, c in h.items() if s < 1 or c < 0] for d, h in dims.items()}
    if any(bad.values()) or not all(sum(h.values()) for h in dims.values()):
        raise UsageError(f"--workload '{file}': sizes must be >= 1 and counts >= 0, with some requests per dim.")
    count = HISTOGRAM_REQUESTS
    requests = []
    for i in range(count):
        q = (2 * i + 1) / (2 * count)
        shapes = {**fixed, **{d: (_quantile(h, q),) for d, h in dims.items()}}
        requests.append(make_feeds(model, plan=plan_feeds(model, shapes, inputs=inputs), seed=i))
    return requests


# Requests generated from a histogram, at its quantiles: a multiple of 20, so the quantiles shape buckets end at
# (``session.shapeplan.BUCKET_QUANTILES``: 0.5, 0.8, 0.95) fall on a request and the generated sizes keep the
# histogram's there (32 requests put {16: 50, 24: 30, 32: 15, 64: 5}'s p95 at 64, not 32).
HISTOGRAM_REQUESTS = 40


def _count(value: Any, file: Path, dim: Any, size: Any) -> float:
    """A histogram's count as JSON wrote it: a number of requests or a share of them (only proportions matter:
    ``120``, ``120.0`` and ``0.75`` all read as written). ``true`` or ``"3"`` is a typo for one, and was read as 1
    and 3; NaN and infinity are no proportion."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(
            f"--workload '{file}': the count of {dim}={size} is {json.dumps(value)}; each count is a number of "
            'requests (or their share), as in {"dims": {"sequence": {"17": 120, "32": 40}}}.'
        )
    return value


def _quantile(histogram: Mapping[int, int], q: float) -> int:
    sizes = sorted(histogram)
    total = sum(histogram.values())
    seen = 0
    for size in sizes:
        seen += histogram[size]
        if seen >= q * total:
            return size
    return sizes[-1]


def _checked(
    requests: list[dict[str, np.ndarray]], inputs: Sequence[InputInfo], file: Path
) -> list[dict[str, np.ndarray]]:
    """The requests, each fed through ``graph.feeds.validate_feeds`` (names, dtypes, ranks, static dims), and
    each one's axes that the graph names with one symbol of one size (an ``attention_mask`` as long as its
    ``input_ids``: the size a request is timed, bucketed and padded at is read off the first of them)."""
    from ortpilot.graph.feeds import validate_feeds

    if not requests:
        raise UsageError(f"--workload '{file}' holds no request.")
    try:
        checked = [validate_feeds(inputs, r) for r in requests]
    except UsageError as exc:
        raise UsageError(f"--workload '{file}' does not fit the model: {exc}") from None
    for index, request in enumerate(checked):
        sizes: dict[str, dict[str, int]] = {}
        for info in inputs:
            for axis, dim in enumerate(info.dims):
                if isinstance(dim, str) and dim and info.name in request:
                    sizes.setdefault(dim, {})[f"{info.name}[{axis}]"] = int(np.shape(request[info.name])[axis])
        for dim, seen in sizes.items():
            if len(set(seen.values())) > 1:
                said = ", ".join(f"{axis} {size}" for axis, size in seen.items())
                raise UsageError(
                    f"--workload '{file}': request #{index} sizes the model's dim '{dim}' differently ({said}); "
                    f"the graph names these axes '{dim}' alike, so one request gives them one size."
                )
    return checked


__all__ = [
    "REPLAY_SIZE",
    "DimStats",
    "Workload",
    "batched_requests",
    "extremes",
    "read_workload",
    "replay_set",
    "screening_set",
    "shapes_digest",
    "spread",
    "varying_dims",
]
