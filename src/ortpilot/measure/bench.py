"""Benchmark one session: warm-up, timed runs, statistics, memory, optionally under concurrency.

What is timed is ORT's own ``InferenceSession.run`` (or ``run_with_iobinding``), each call
between two ``perf_counter_ns`` reads: the same thing ``onnxruntime_perf_test`` times. Feeds are
validated once before timing, so the numbers hold no ortpilot overhead. The ``Runner`` is shared
with ``measure.interleave``, which alternates several of them in one process.
"""

from __future__ import annotations

import itertools
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import numpy as np
import onnxruntime as ort

from ortpilot.eps import CPU_EP
from ortpilot.errors import UsageError, VerificationError
from ortpilot.graph.feeds import batch_size_of, make_feeds, plan_feeds
from ortpilot.measure.options import (
    DEFAULT_DURATION_S,
    MAX_CONCURRENCY,
    BenchConfig,
    BenchOptions,
    bench_records,
    check_budget,
    check_concurrency,
)
from ortpilot.measure.stats import Stats, summarize
from ortpilot.session import SessionSettings, VerifiedSession, load

MIN_RUNS = 10  # a duration-bound benchmark still does at least this many runs
# Auto warm-up: stop when the median of the last WINDOW runs is within SETTLE_TOL of the window
# before it; give up (and say so) after WARMUP_MAX_RUNS runs or WARMUP_MAX_S seconds.
WARMUP_WINDOW = 10
WARMUP_SETTLE_TOL = 0.05
WARMUP_MAX_RUNS = 500
WARMUP_MAX_S = 10.0
_TICK_S = 0.1  # progress callbacks and RSS samples at most this often

# progress(phase, done, total): phase "warmup" or "runs"; done/total count runs, or seconds in
# duration mode. Called from the measuring thread between runs, throttled to _TICK_S.
Progress = Callable[[str, float, float], None]


class BenchmarkRunError(VerificationError):
    """A run failed mid-benchmark: ``phase`` (first_run, warmup, runs) and ``run_index`` (0-based
    within that phase) name it; ``partial`` holds the statistics of the runs that completed."""

    def __init__(self, message: str, *, phase: str, run_index: int, partial: BenchResult | None) -> None:
        super().__init__(message)
        self.phase = phase
        self.run_index = run_index
        self.partial = partial


# ---------------------------------------------------------------------------------------------
# Memory: Linux /proc/self/status, else resource (peak only).


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb() -> float | None:
    """Resident set size of this process now, MiB (None where /proc is missing)."""
    kib = _status_kib("VmRSS")
    return kib / 1024 if kib is not None else None


def peak_rss_mb() -> float:
    """Peak resident set size of this process, MiB (since the last ``reset_peak_rss``)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = maxrss // 1024 if platform.system() == "Darwin" else maxrss
    return kib / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0), so the peak covers this benchmark only."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@dataclass
class MemoryInfo:
    """RSS at the stages of a benchmark; ``growth_mb`` across the timed runs shows a leak."""

    before_load_mb: float | None = None
    after_load_mb: float | None = None
    after_warmup_mb: float | None = None
    end_mb: float | None = None
    peak_mb: float | None = None
    peak_scope: str = "process"  # "benchmark" when the peak mark could be reset at the start
    trace: list[tuple[int, float]] = field(default_factory=list)  # (runs done, RSS MiB)

    @property
    def growth_mb(self) -> float | None:
        if self.end_mb is None or self.after_warmup_mb is None:
            return None
        return self.end_mb - self.after_warmup_mb

    def growth_per_1k_runs_mb(self) -> float | None:
        """Slope of RSS over runs (least squares over the trace), MiB per 1000 runs."""
        if len(self.trace) < 3:
            return None
        runs = np.array([t[0] for t in self.trace], dtype=float)
        mem = np.array([t[1] for t in self.trace], dtype=float)
        if np.ptp(runs) == 0:
            return None
        return float(np.polyfit(runs, mem, 1)[0] * 1000)

    def to_dict(self) -> dict[str, Any]:
        return {
            "before_load_mb": self.before_load_mb,
            "after_load_mb": self.after_load_mb,
            "after_warmup_mb": self.after_warmup_mb,
            "end_mb": self.end_mb,
            "peak_mb": self.peak_mb,
            "peak_scope": self.peak_scope,
            "growth_mb": self.growth_mb,
            "growth_per_1k_runs_mb": self.growth_per_1k_runs_mb(),
            "trace": [list(t) for t in self.trace],
        }


# ---------------------------------------------------------------------------------------------
# Result


@dataclass
class WarmupInfo:
    mode: str  # "auto" or "count"
    runs: int = 0
    seconds: float = 0.0
    settled: bool | None = None  # auto mode: did the rolling median settle before the caps?
    median_s: float | None = None  # median warm-up run: sizes interleaving turns

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "runs": self.runs,
            "seconds": self.seconds,
            "settled": self.settled,
            "median_ms": _ms(self.median_s),
        }


@dataclass
class BenchResult:
    """Everything one benchmark measured. Latencies are seconds here, milliseconds in ``to_dict``."""

    name: str
    model: str | None
    model_sha256: str
    providers: list[str]
    settings: dict[str, Any]
    shapes: dict[str, list[int]]
    inputs: str  # "generated" or "given"
    batch_size: int
    iobinding: bool
    concurrency: int
    warmup: WarmupInfo
    session_create_s: float | None
    first_run_s: float | None
    samples_s: list[float]
    load_s: float | None  # ortpilot.load in total: creation plus fallback and placement checks
    offsets_s: list[float]  # start of each run, seconds after the first timed run started
    wall_s: float
    stats: Stats | None
    memory: MemoryInfo
    rounds: list[int] = field(default_factory=list)  # interleaving round of each sample (may be empty)
    roofline: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float | None:
        return self.stats.p50 if self.stats else None

    def to_dict(self, *, samples: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": "bench",
            "name": self.name,
            "model": self.model,
            "model_sha256": self.model_sha256,
            "providers": self.providers,
            "settings": self.settings,
            "shapes": self.shapes,
            "inputs": self.inputs,
            "batch_size": self.batch_size,
            "iobinding": self.iobinding,
            "concurrency": self.concurrency,
            "warmup": self.warmup.to_dict(),
            "session_create_ms": _ms(self.session_create_s),
            "load_ms": _ms(self.load_s),
            "first_run_ms": _ms(self.first_run_s),
            "runs": len(self.samples_s),
            "wall_s": self.wall_s,
            "latency": self.stats.to_dict() if self.stats else None,
            "memory": self.memory.to_dict(),
            "roofline": self.roofline,
            "failure": self.failure,
            "environment": self.environment,
        }
        if samples:
            doc["samples_ms"] = [s * 1e3 for s in self.samples_s]
            doc["offsets_s"] = list(self.offsets_s)
            if self.rounds:
                doc["rounds"] = list(self.rounds)
        return doc


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def environment() -> dict[str, Any]:
    """What a figure depends on besides the model: versions, CPU, load at the start."""
    from ortpilot.measure.roofline import cpu_name

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    try:
        from importlib.metadata import version

        ortpilot_version = version("ortpilot")
    except Exception:
        ortpilot_version = None
    return {
        "onnxruntime": ort.__version__,
        "ortpilot": ortpilot_version,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpus_available": cpus,
        "loadavg_1m": load1,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------------------------------------
# Runner: one verified session, its feeds, and the timed loop


def _iobinding_device(providers: Sequence[str]) -> str:
    first = providers[0] if providers else CPU_EP
    return {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda", "DmlExecutionProvider": "dml"}.get(
        first, "cpu"
    )


class _Failed(Exception):
    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


class Runner:
    """A loaded session ready to time: ``step()`` is one inference; ``measure`` times many.

    Keeps each run's start time, latency and interleaving round so that ``measure`` can be
    called repeatedly (interleaving) and the samples accumulate.

    ``feeds`` may be one request or a sequence of them (a workload's replay set, ``data.workload``):
    one step then runs every request in turn, and its sample is the mean latency per request, so
    every statistic below reads "per request of this workload".
    """

    def __init__(
        self,
        model: Any,
        *,
        name: str = "",
        providers: Any = None,
        settings: SessionSettings | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
        iobinding: bool = False,
        concurrency: int = 1,
        policy: str = "warn",
        seed: int = 0,
    ) -> None:
        check_concurrency(concurrency)
        self.name = name
        self.iobinding = iobinding
        self.concurrency = concurrency
        self.memory = MemoryInfo()
        self.memory.before_load_mb = rss_mb()
        if isinstance(model, VerifiedSession):
            self.vs = model
            self.session_create_s: float | None = None
            self.load_s = None
        else:
            t0 = time.perf_counter()
            self.vs = load(
                model, providers, policy, settings=settings, shapes={k: tuple(v) for k, v in (shapes or {}).items()}
            )
            self.load_s: float | None = time.perf_counter() - t0  # with ortpilot's verification
            self.session_create_s = self.vs.create_s  # ORT's creation alone, as perf_test reports it
        self.memory.after_load_mb = rss_mb()
        if feeds:
            listed = [feeds] if isinstance(feeds, Mapping) else list(feeds)
            self.replay = [self.vs.check_feeds(f) for f in listed]
            self.inputs = "given"
        else:
            plan = plan_feeds(self.vs.model, {k: tuple(v) for k, v in (shapes or {}).items()})
            self.replay = [make_feeds(self.vs.model, plan=plan, seed=seed)]
            self.inputs = "generated"
        self.feeds = self.replay[0]  # the request whose shapes and batch describe the bench
        self.session: ort.InferenceSession = self.vs.session
        self._output_names = [o.name for o in self.session.get_outputs()]
        self._bindings = [self._binding() for _ in range(concurrency)] if iobinding else []
        self.first_run_s: float | None = None
        self.warmup = WarmupInfo("count")
        self.samples: list[float] = []
        self.starts_ns: list[int] = []
        self.rounds: list[int] = []
        self.wall_s = 0.0
        self.origin_ns: int | None = None  # time zero of offsets_s (shared when interleaving)

    @classmethod
    def of(cls, config: BenchConfig, name: str, policy: str, seed: int = 0) -> Runner:
        """The runner of one ``BenchConfig``, labelled ``name``."""
        described = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in ("name", "model")}
        return cls(config.model, name=name, policy=policy, seed=seed, **described)

    # -- one inference ------------------------------------------------------------------------
    def _binding(self) -> list[ort.IOBinding]:
        """Each request's inputs bound once as OrtValues on the first provider's device, outputs to CPU."""
        device = _iobinding_device(self.vs.providers)
        bindings = []
        for feeds in self.replay:
            binding = self.session.io_binding()
            for name, value in feeds.items():
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
            for name in self._output_names:
                binding.bind_output(name, "cpu")
            bindings.append(binding)
        return bindings

    @property
    def requests(self) -> int:
        """Requests one step runs (the replay set's size)."""
        return len(self.replay)

    def step_fn(self, worker: int = 0) -> Callable[[], Any]:
        if self.iobinding:
            bindings, run_bound = self._bindings[worker], self.session.run_with_iobinding
            if len(bindings) == 1:
                one = bindings[0]
                return lambda: run_bound(one)
            return lambda: [run_bound(b) for b in bindings]
        run, names = self.session.run, self._output_names
        if getattr(self.vs, "plan", None) is not None:  # a shape plan: each request padded to its bucket's session
            run = self.vs.run
        if len(self.replay) == 1:
            feeds = self.replay[0]
            return lambda: run(names, feeds)
        replay = self.replay
        return lambda: [run(names, f) for f in replay]

    # -- phases -------------------------------------------------------------------------------
    def first_run(self) -> None:
        step = self.step_fn()
        t0 = time.perf_counter_ns()
        try:
            step()
        except Exception as exc:
            raise _Failed(-1, exc) from exc
        self.first_run_s = (time.perf_counter_ns() - t0) / 1e9

    def warm_up(self, warmup: int | str = "auto", progress: Progress | None = None) -> WarmupInfo:
        """``warmup`` runs, or ("auto") until the rolling median settles. Runs are not kept."""
        step = self.step_fn()
        auto = warmup == "auto"
        count = WARMUP_MAX_RUNS if auto else int(warmup)
        times: list[float] = []
        t_start = time.perf_counter()
        last_tick = t_start
        settled: bool | None = False if auto else None
        for i in range(count):
            t0 = time.perf_counter_ns()
            try:
                step()
            except Exception as exc:
                raise _Failed(i, exc) from exc
            times.append((time.perf_counter_ns() - t0) / 1e9 / self.requests)
            now = time.perf_counter()
            if progress and now - last_tick >= _TICK_S:
                last_tick = now
                progress("warmup", i + 1, count if not auto else max(i + 1, 2 * WARMUP_WINDOW))
            if auto:
                if _settled(times):
                    settled = True
                    break
                if now - t_start >= WARMUP_MAX_S and len(times) >= 3:
                    break
        self.warmup = WarmupInfo(
            "auto" if auto else "count",
            len(times),
            time.perf_counter() - t_start,
            settled,
            float(np.median(times)) if times else None,
        )
        self.memory.after_warmup_mb = rss_mb()
        return self.warmup

    def measure(
        self,
        runs: int | None = None,
        duration_s: float | None = None,
        *,
        round_id: int = -1,
        min_runs: int = 0,
        progress: Progress | None = None,
    ) -> None:
        """Time ``runs`` runs, or run for ``duration_s`` (and at least ``min_runs``); append samples.

        Concurrency C: C threads share the session, each with its own IOBinding; the latency of
        every run is kept, and throughput is runs / wall time of the whole call.
        """
        if runs is None and duration_s is None:
            raise UsageError("measure() needs runs or duration_s.")
        t_begin = time.perf_counter_ns()
        if self.origin_ns is None:
            self.origin_ns = t_begin
        deadline = None if duration_s is None else t_begin + int(duration_s * 1e9)
        total = float(runs) if runs is not None else float(duration_s or 0)
        before = len(self.samples)
        try:
            if self.concurrency == 1:
                self._measure_serial(runs, deadline, min_runs, round_id, progress, total, t_begin)
            else:
                self._measure_threads(runs, deadline, min_runs, round_id, progress, total, t_begin)
        finally:
            self.wall_s += (time.perf_counter_ns() - t_begin) / 1e9
            self.memory.end_mb = rss_mb()
            if self.memory.end_mb is not None and len(self.samples) > before:
                self.memory.trace.append((len(self.samples), self.memory.end_mb))

    def _tick(self, progress: Progress | None, done_runs: int, t_begin: int, total: float, by_time: bool) -> None:
        mem = rss_mb()
        if mem is not None:
            self.memory.trace.append((len(self.samples), mem))
        if progress:
            done = (time.perf_counter_ns() - t_begin) / 1e9 if by_time else done_runs
            progress("runs", min(done, total), total)

    def _measure_serial(
        self,
        runs: int | None,
        deadline: int | None,
        min_runs: int,
        round_id: int,
        progress: Progress | None,
        total: float,
        t_begin: int,
    ) -> None:
        step = self.step_fn()
        samples, starts, rounds = self.samples, self.starts_ns, self.rounds
        per_step = 1e9 * self.requests  # a step's nanoseconds -> seconds per request
        clock = time.perf_counter_ns
        next_tick = t_begin + int(_TICK_S * 1e9)
        limit = runs if runs is not None else math.inf
        i = 0
        while i < limit:
            t0 = clock()
            if deadline is not None and t0 >= deadline and i >= min_runs:
                break
            try:
                step()
            except Exception as exc:
                raise _Failed(len(samples), exc) from exc
            t1 = clock()
            samples.append((t1 - t0) / per_step)
            starts.append(t0)
            rounds.append(round_id)
            i += 1
            if t1 >= next_tick:
                next_tick = t1 + int(_TICK_S * 1e9)
                self._tick(progress, i, t_begin, total, deadline is not None)

    def _measure_threads(
        self,
        runs: int | None,
        deadline: int | None,
        min_runs: int,
        round_id: int,
        progress: Progress | None,
        total: float,
        t_begin: int,
    ) -> None:
        counter = itertools.count()
        stop = threading.Event()
        failures: list[_Failed] = []
        per_thread: list[list[tuple[int, int]]] = [[] for _ in range(self.concurrency)]
        barrier = threading.Barrier(self.concurrency + 1)
        base = len(self.samples)

        def worker(w: int) -> None:
            step = self.step_fn(w)
            out = per_thread[w]
            clock = time.perf_counter_ns
            barrier.wait()
            while not stop.is_set():
                i = next(counter)
                if runs is not None and i >= runs:
                    break
                t0 = clock()
                if deadline is not None and t0 >= deadline and i >= min_runs:
                    break
                try:
                    step()
                except Exception as exc:
                    failures.append(_Failed(base + i, exc))
                    stop.set()
                    break
                out.append((t0, clock()))

        threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(self.concurrency)]
        for t in threads:
            t.start()
        barrier.wait()
        while any(t.is_alive() for t in threads):
            threads[0].join(_TICK_S)
            self._tick(progress, sum(len(p) for p in per_thread), t_begin, total, deadline is not None)
        for t0, t1 in sorted(itertools.chain.from_iterable(per_thread)):
            self.samples.append((t1 - t0) / 1e9 / self.requests)
            self.starts_ns.append(t0)
            self.rounds.append(round_id)
        if failures:
            raise min(failures, key=lambda f: f.index)

    # -- result -------------------------------------------------------------------------------
    def result(self, *, seed: int = 0, failure: dict[str, Any] | None = None, keep_rounds: bool = False) -> BenchResult:
        origin = self.origin_ns or 0
        order = np.argsort(self.starts_ns, kind="stable") if self.starts_ns else np.array([], dtype=int)
        samples = [self.samples[i] for i in order]
        offsets = [(self.starts_ns[i] - origin) / 1e9 for i in order]
        rounds = [self.rounds[i] for i in order] if keep_rounds else []
        batch = batch_size_of(self.feeds)
        # a sample is one request's mean latency: a step of K requests is K inferences of the wall time
        wall = self.wall_s / self.requests if self.wall_s else None
        stats = summarize(samples, wall_s=wall, items_per_run=batch, seed=seed) if samples else None
        self.memory.peak_mb = peak_rss_mb()
        settings = self.vs.settings.to_dict()
        return BenchResult(
            name=self.name,
            model=str(self.vs.model_path) if self.vs.model_path else None,
            model_sha256=self.vs.model_hash,
            providers=self.vs.providers,
            settings=settings,
            shapes={k: list(v.shape) for k, v in self.feeds.items()},
            inputs=self.inputs,
            batch_size=batch,
            iobinding=self.iobinding,
            concurrency=self.concurrency,
            warmup=self.warmup,
            session_create_s=self.session_create_s,
            first_run_s=self.first_run_s,
            samples_s=samples,
            load_s=self.load_s,
            offsets_s=offsets,
            wall_s=self.wall_s,
            stats=stats,
            memory=self.memory,
            rounds=rounds,
            failure=failure,
            environment=environment(),
        )


def _settled(times: list[float]) -> bool:
    if len(times) < 2 * WARMUP_WINDOW:
        return False
    last = float(np.median(times[-WARMUP_WINDOW:]))
    prev = float(np.median(times[-2 * WARMUP_WINDOW : -WARMUP_WINDOW]))
    return prev > 0 and abs(last - prev) / prev <= WARMUP_SETTLE_TOL


# ---------------------------------------------------------------------------------------------
# Failures shared by bench and bench_interleaved


def failure_of(exc: _Failed, phase: str) -> dict[str, Any]:
    message = str(exc.error).strip().splitlines()
    return {
        "phase": phase,
        "run_index": exc.index,
        "error": type(exc.error).__name__,
        "message": message[0] if message else "",
    }


def raise_failure(runner: Runner, exc: _Failed, phase: str, *, seed: int = 0) -> None:
    failure = failure_of(exc, phase)
    partial = runner.result(seed=seed, failure=failure)
    where = "the first run" if phase == "first_run" else f"{phase} run {exc.index}"
    raise BenchmarkRunError(
        f"{runner.name or 'The model'} failed at {where} ({failure['error']}: {failure['message']}). "
        f"{len(partial.samples_s)} timed run(s) completed before it; their statistics are reported.",
        phase=phase,
        run_index=exc.index,
        partial=partial,
    ) from exc.error


# ---------------------------------------------------------------------------------------------
# Public API


def bench(
    config: BenchConfig | Any,
    options: BenchOptions | None = None,
    *,
    progress: Progress | None = None,
    **keywords: Any,
) -> BenchResult:
    """Benchmark one configuration: a ``BenchConfig``, or the model (a path, bytes, ModelProto, or an
    already loaded ``VerifiedSession``) with the configuration's fields as keywords (``providers``,
    ``settings``, ``shapes``, ``feeds``, ``iobinding``, ``concurrency``, ``name``); ``options`` a
    ``BenchOptions``, or its fields as keywords (``runs``, ``duration_s``, ``warmup``, ``policy``,
    ``roofline``, ``seed``).

    Order: session creation (timed), one first run (timed, kept apart), warm-up (``warmup`` runs
    or ``"auto"``: until the rolling median of 10 runs settles within 5%), then ``runs`` timed
    runs or ``duration_s`` seconds (default 5 s, at least 10 runs). ``feeds`` default to
    generated inputs matching ``shapes``. ``concurrency`` threads share the one session.
    ``roofline`` adds achieved vs peak GFLOP/s (measures the peak once per machine, cached).

    A run that raises ends the benchmark with ``BenchmarkRunError`` (exit 1) carrying the
    failing run and a ``partial`` result of the runs that completed.
    """
    config, options = bench_records(config, options, keywords)
    runs, duration_s = options.budget
    seed = options.seed
    check_concurrency(config.concurrency)
    reset = reset_peak_rss()
    runner = Runner.of(config, config.name or "A", options.policy, seed)
    if reset:
        runner.memory.peak_scope = "benchmark"
    phase = "first_run"
    try:
        runner.first_run()
        phase = "warmup"
        runner.warm_up(options.warmup, progress)
        phase = "runs"
        runner.measure(runs, duration_s, min_runs=MIN_RUNS if runs is None else 0, progress=progress)
    except _Failed as exc:
        raise_failure(runner, exc, phase, seed=seed)
    result = runner.result(seed=seed)
    if options.roofline:
        from ortpilot.measure.roofline import roofline_for

        result.roofline = roofline_for(runner.vs.model, result)
    return result


__all__ = [
    "DEFAULT_DURATION_S",
    "MAX_CONCURRENCY",
    "BenchConfig",
    "BenchOptions",
    "BenchResult",
    "BenchmarkRunError",
    "Runner",
    "bench",
    "check_budget",
    "check_concurrency",
]
