"""The CPUs this process may really use, and the threads ORT's default pool starts anyway.

ORT sizes its default intra-op pool from the machine's cores: it ignores CPU affinity
(``taskset``, cpusets) and container quotas (cgroup ``cpu.max``), and ``OMP_NUM_THREADS`` does
not reach it. A session with ORT's default threads in a container limited to one CPU runs
two or more busy threads on it. :func:`cpu_budget` is the one answer ortpilot uses for "how
many threads": affinity ∩ cgroup v2 ``cpu.max`` (every level of the process's cgroup path) ∩
cgroup v1 CFS quota, each quota rounded down, at least 1. A cgroup file that cannot be read is
skipped and said (``notes``); affinity alone then decides.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.eps import CPU_EP


@dataclass(frozen=True)
class CpuBudget:
    """How many CPUs this process may use, which limit decided it, and every limit found."""

    cpus: int
    source: str  # "affinity" | "cgroup v2 cpu.max" | "cgroup v1 cpu.cfs_quota_us" | "cpu_count"
    affinity: int
    limits: dict[str, float] = field(default_factory=dict)  # limit name -> CPUs it allows (fractional for quotas)
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"{self.cpus} CPU{'s' if self.cpus != 1 else ''} ({self.source})"]
        others = [f"{name} {value:g}" for name, value in self.limits.items() if name != self.source]
        if others:
            parts.append("other limits: " + ", ".join(others))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "source": self.source,
            "affinity": self.affinity,
            "limits": dict(self.limits),
            "notes": list(self.notes),
        }


def _affinity() -> tuple[int, str]:
    try:
        return max(1, len(os.sched_getaffinity(0))), "affinity"
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1), "cpu_count"


def _read(path: Path, notes: list[str]) -> str | None:
    """A cgroup file's text, or None when it is absent; unreadable files are noted, never raised."""
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"could not read {path} ({exc.strerror or exc}); it was left out of the CPU budget")
        return None


def _cgroup_paths(proc_self: Path, notes: list[str]) -> tuple[str | None, dict[str, str]]:
    """(the v2 path, {v1 controller: path}) from ``/proc/self/cgroup``."""
    text = _read(proc_self / "cgroup", notes)
    if text is None and not notes:
        notes.append(f"{proc_self / 'cgroup'} is missing: cgroup quotas unknown, affinity alone decides")
    v2, v1 = None, {}
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for name in controllers.split(","):
            if name:
                v1[name] = path
    return v2, v1


def _levels(root: Path, path: str) -> list[Path]:
    """``root/path`` and each parent folder up to ``root``: a parent's limit binds its children."""
    here = root / path.strip("/") if path.strip("/") else root
    out = [here]
    while here != root and root in here.parents:
        here = here.parent
        out.append(here)
    return out


def _v2_quota(root: Path, path: str, notes: list[str]) -> float | None:
    best = None
    for level in _levels(root, path):
        text = _read(level / "cpu.max", notes)
        if not text:
            continue
        quota, _, period = text.partition(" ")
        if quota == "max":
            continue
        try:
            cpus = int(quota) / int(period or 100000)
        except ValueError:
            notes.append(f"{level / 'cpu.max'} holds {text!r}, not 'QUOTA PERIOD'; it was left out of the CPU budget")
            continue
        best = cpus if best is None else min(best, cpus)
    return best


def _v1_quota(root: Path, path: str, notes: list[str]) -> float | None:
    best = None
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / mount
        if not base.is_dir():
            continue
        # The process's own folder, then its parents up to the mount (inside a container whose
        # cgroup is the mount's root, the path reads "/" and the mount's own files are the limit).
        for level in _levels(base, path):
            quota_text = _read(level / "cpu.cfs_quota_us", notes)
            period_text = _read(level / "cpu.cfs_period_us", notes)
            if not quota_text or not period_text:
                continue
            try:
                quota, period = int(quota_text), int(period_text)
            except ValueError:
                notes.append(f"{level} holds a CFS quota that is not a number; it was left out of the CPU budget")
                continue
            if quota > 0 and period > 0:
                best = quota / period if best is None else min(best, quota / period)
        break
    return best


def cpu_budget(
    proc_self: str | os.PathLike = "/proc/self", cgroup_root: str | os.PathLike = "/sys/fs/cgroup"
) -> CpuBudget:
    """The CPUs this process may use: affinity ∩ cgroup v2 ``cpu.max`` ∩ cgroup v1 CFS quota."""
    notes: list[str] = []
    affinity, source = _affinity()
    limits: dict[str, float] = {source: float(affinity)}
    root = Path(cgroup_root)
    v2_path, v1_paths = _cgroup_paths(Path(proc_self), notes)
    if v2_path is not None:
        v2_root = (
            root / "unified" if (root / "unified").is_dir() and not (root / "cgroup.controllers").exists() else root
        )
        quota = _v2_quota(v2_root, v2_path, notes)
        if quota is not None:
            limits["cgroup v2 cpu.max"] = quota
    if "cpu" in v1_paths:
        quota = _v1_quota(root, v1_paths["cpu"], notes)
        if quota is not None:
            limits["cgroup v1 cpu.cfs_quota_us"] = quota
    cpus, chosen = affinity, source
    for name, value in limits.items():
        allowed = max(1, math.floor(value + 1e-9))
        if allowed < cpus:
            cpus, chosen = allowed, name
    return CpuBudget(cpus, chosen, affinity, limits, tuple(notes))


@functools.lru_cache(maxsize=1)
def this_budget() -> CpuBudget:
    """This process's CPU budget, read once (affinity and quotas do not change under a running command)."""
    return cpu_budget()


@functools.lru_cache(maxsize=1)
def _default_pool() -> tuple[int, frozenset[int], frozenset[int]]:
    """(threads, the CPUs its pool threads may run on, the CPUs a pool thread is pinned to alone) of ORT's
    default session here, counted: the pool's new OS threads plus the calling thread, which works too; off
    Linux ``os.cpu_count()`` and no CPUs."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1), frozenset(), frozenset()
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "threads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    before = {t.name for t in tasks.iterdir()}
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=[CPU_EP])
    sess.run(None, {"x": np.zeros(1, np.float32)})
    started = [t for t in tasks.iterdir() if t.name not in before]
    until_run(started)
    allowed = [allowed_cpus(task / "status") for task in started]
    del sess
    return max(1, len(started) + 1), frozenset(set().union(*allowed)), frozenset(pinned_of(allowed))


def pinned_of(allowed: Iterable[set[int]]) -> set[int]:
    """The CPUs that a thread is allowed on alone, from each thread's ``allowed_cpus``: ORT's default session
    pins each pool thread to its own CPU (a thread the process itself holds on one CPU reads the same)."""
    return {next(iter(cpus)) for cpus in allowed if len(cpus) == 1}


def until_run(threads: list[Path], wait_s: float = 1.0) -> None:
    """Wait (at most ``wait_s``) until each of ``threads`` (``/proc/.../task/TID``) has run once
    (``schedstat``), so the CPUs read next are the ones it runs on: CI read no pinned pool thread twice right
    after a default session was made, on a machine both workers kept busy; a pool thread that had not run
    yet would read so."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if all(int((t / "schedstat").read_text().split()[0]) > 0 for t in threads):
                return
        except (OSError, ValueError, IndexError):  # a thread ended, or no schedstat: nothing to wait for
            return
        time.sleep(0.005)


def allowed_cpus(status: Path) -> set[int]:
    """The CPUs one thread may run on, from its ``/proc/.../task/TID/status`` (nothing once it ended)."""
    try:
        text = status.read_text()
    except OSError:  # the thread ended
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("Cpus_allowed_list:")), "")
    return _cpu_list(line.partition(":")[2].strip())


def _cpu_list(text: str) -> set[int]:
    """``0-2,5`` (the kernel's CPU list format) -> {0, 1, 2, 5}; nothing for text it cannot read."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return set()
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def ort_default_threads() -> int:
    """The intra-op threads ORT's default session starts here (counted, ``_default_pool``)."""
    return _default_pool()[0]


def ort_default_pinned() -> frozenset[int]:
    """The CPUs ORT's default session pins a pool thread to, one each (``measure.placement`` says why that
    matters: a calling thread on one of them shares it)."""
    return _default_pool()[2]


def ort_default_outside() -> frozenset[int]:
    """The CPUs outside this process's affinity that ORT's default pool threads may run on. ORT sets
    its pool threads' affinity itself (one logical CPU each), so a process on CPU 0 of two gets a pool
    thread on CPU 1: ORT's default takes CPUs the process's budget leaves to others."""
    try:
        own = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return frozenset()
    return frozenset(_default_pool()[1] - own)


def default_threads_in_budget(default_threads: int | None = None, cpus: int | None = None) -> int:
    """``intra_op_num_threads`` for "ORT's default" within this process's CPUs: 0 (ORT's own choice) where
    its pool fits the budget, else the budget (see ``ort_default_outside``). The one rule for the tune's
    reference and ``verify --max-slowdown``; ``default_threads`` and ``cpus`` default to this process's."""
    cpus = this_budget().cpus if cpus is None else cpus
    threads = ort_default_threads() if default_threads is None else default_threads
    return cpus if threads > cpus else 0


__all__ = [
    "CpuBudget",
    "allowed_cpus",
    "cpu_budget",
    "default_threads_in_budget",
    "ort_default_outside",
    "ort_default_pinned",
    "ort_default_threads",
    "pinned_of",
    "this_budget",
    "until_run",
]
