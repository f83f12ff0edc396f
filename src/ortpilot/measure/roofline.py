"""How close a model runs to this machine's limit: achieved GFLOP/s over a measured peak.

The peak is what a large float32 matmul reaches through ORT (and numpy; the higher counts),
measured once per machine and ORT version and cached in ``<cache root>/peak.json``. A model at
a few percent of it is bound by overhead, memory or small ops, and tuning can pay; a model near
it can only get faster by doing less work (quantization, a smaller model). INT8 kernels run
above the float32 peak, so a quantized model's fraction can exceed 1.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.artifacts.cache import cache_root
from ortpilot.eps import CPU_EP
from ortpilot.errors import UsageError

log = logging.getLogger("ortpilot")

PEAK_FILE = "peak.json"
# 2*N^3 = 2.1 GFLOP per matmul: tens of ms, so that best-of-many finds a quiet moment on a busy
# machine (one long matmul on a shared machine measures the neighbours, not the CPU).
PEAK_N = 1024
PEAK_REPEATS = 30  # at least this many timed matmuls per library ...
PEAK_BUDGET_S = 3.0  # ... and more until this much time has passed


@dataclass(frozen=True)
class Peak:
    """Measured float32 matmul peak of this machine (GFLOP/s), and how it was measured."""

    gflops: float
    ort_gflops: float
    numpy_gflops: float
    n: int
    fingerprint: str
    cpu: str
    cpus: int
    onnxruntime: str
    measured_at: str
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_fingerprint() -> str:
    """CPU model, ISA flags, usable cores, architecture and ORT version: what the peak depends on."""
    text = "|".join([cpu_name(), _cpu_flags(), str(_cpus()), platform.machine(), ort.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _matmul_model(n: int) -> bytes:
    a = onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [n, n])
    b = onnx.helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [n, n])
    c = onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [n, n])
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["a", "b"], ["c"])], "peak", [a, b], [c])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model.SerializeToString()


def _best_seconds(fn, repeats: int, budget_s: float) -> float:
    """Fastest of at least ``repeats`` calls, continued until ``budget_s``: the peak is the best
    the machine does, so more tries on a busy machine find a quieter moment."""
    fn()  # warm-up: thread pool start, page faults
    best = float("inf")
    start = time.perf_counter()
    count = 0
    while count < repeats or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        count += 1
    return best


def measure_peak(n: int = PEAK_N, repeats: int = PEAK_REPEATS, budget_s: float = PEAK_BUDGET_S) -> Peak:
    """Time an n x n float32 matmul through ORT (default threads) and numpy; best of many."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    flops = 2.0 * n**3
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(_matmul_model(n), opts, providers=[CPU_EP])
    ort_s = _best_seconds(lambda: sess.run(None, {"a": a, "b": b}), repeats, budget_s)
    np_s = _best_seconds(lambda: a @ b, repeats, budget_s)
    ort_g, np_g = flops / ort_s / 1e9, flops / np_s / 1e9
    return Peak(
        gflops=max(ort_g, np_g),
        ort_gflops=ort_g,
        numpy_gflops=np_g,
        n=n,
        fingerprint=machine_fingerprint(),
        cpu=cpu_name(),
        cpus=_cpus(),
        onnxruntime=ort.__version__,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def peak(refresh: bool = False) -> Peak:
    """The cached peak for this machine, measured (a few seconds) when missing or ``refresh``."""
    key = machine_fingerprint()
    table: dict[str, Any] = {}
    path: Path | None = None
    try:
        path = cache_root() / PEAK_FILE
        table = json.loads(path.read_text())
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError, UsageError):  # no cache (unwritable, a file, not ours): measure anyway
        table = {}
    entry = table.get(key)
    if entry and not refresh:
        try:
            return Peak(**{**entry, "cached": True})
        except TypeError:
            pass  # written by another version: measure again
    fresh = measure_peak()
    table[key] = {k: v for k, v in fresh.to_dict().items() if k != "cached"}
    try:
        if path is not None:
            atomic_write_json(path, table)
    except UsageError as exc:  # a full or read-only cache must not discard a finished benchmark
        log.warning(
            "The machine's peak was measured but could not be cached, so the next benchmark measures it again: %s", exc
        )
    return fresh


def model_flops(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> float:
    """Estimated FLOPs of one inference at these input shapes (``graph.flops``)."""
    from ortpilot.graph.flops import total_flops

    return total_flops(model, shapes)


def roofline(flops: float, seconds_per_inference: float, machine: Peak) -> dict[str, Any]:
    """Achieved GFLOP/s and its fraction of the peak, with a one-line reading of it."""
    achieved = flops / seconds_per_inference / 1e9 if seconds_per_inference > 0 else 0.0
    fraction = achieved / machine.gflops if machine.gflops > 0 else 0.0
    return {
        "model_gflop": flops / 1e9,
        "achieved_gflops": achieved,
        "peak_gflops": machine.gflops,
        "fraction": fraction,
        "reading": reading(fraction, flops),
        "peak": machine.to_dict(),
    }


def reading(fraction: float, flops: float) -> str:
    if flops <= 0:
        return "no FLOPs could be estimated for this model (unknown ops or shapes)"
    if fraction > 1.0:
        return (
            "above the measured float32 peak: INT8 kernels, or a peak measured on a busy machine "
            "(measure it again with refresh)"
        )
    if fraction >= 0.5:
        return "near the machine's matmul peak: only less work (quantization, a smaller model) can help much"
    if fraction >= 0.15:
        return "a fair share of peak: tuning may gain some; fewer FLOPs gain more"
    return "far below peak: overhead-, memory- or small-op-bound; threads, fusions and IOBinding can pay"


def roofline_for(model: onnx.ModelProto, result: Any) -> dict[str, Any] | None:
    """Roofline of a ``BenchResult``: per inference time is the median (1 / throughput under
    concurrency, where runs overlap)."""
    if result.stats is None:
        return None
    flops = model_flops(model, {k: tuple(v) for k, v in result.shapes.items()})
    seconds = result.stats.p50 if result.concurrency == 1 else 1.0 / result.stats.inferences_per_s
    doc = roofline(flops, seconds, peak())
    doc["time_basis"] = "p50" if result.concurrency == 1 else "1/throughput"
    return doc
