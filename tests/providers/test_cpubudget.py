"""The CPU budget: affinity ∩ cgroup quotas, read from real files, and the threads ORT's default starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ortpilot.providers.cpubudget import cpu_budget, default_threads_in_budget, ort_default_outside, ort_default_threads

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def _tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self and a /sys/fs/cgroup with the given cgroup line and files (paths relative to the root)."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    return proc, root


def test_cgroup_v2_quota_is_rounded_down_and_a_parent_limit_binds(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    proc, root = _tree(
        tmp_path,
        "0::/kube/pod/app\n",
        {"cgroup.controllers": "cpu", "kube/cpu.max": "150000 100000", "kube/pod/app/cpu.max": "max 100000"},
    )
    budget = cpu_budget(proc, root)
    assert budget.limits["cgroup v2 cpu.max"] == 1.5
    assert budget.cpus == 1 and budget.source == "cgroup v2 cpu.max" and budget.affinity == affinity
    (root / "kube/cpu.max").write_text("max 100000")
    assert cpu_budget(proc, root).cpus == affinity and cpu_budget(proc, root).source == "affinity"


def test_a_quota_under_one_cpu_still_allows_one(tmp_path):
    proc, root = _tree(tmp_path, "0::/\n", {"cgroup.controllers": "cpu", "cpu.max": "20000 100000"})
    assert cpu_budget(proc, root).cpus == 1


def test_cgroup_v1_cfs_quota(tmp_path):
    proc, root = _tree(
        tmp_path,
        "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n",
        {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"},
    )
    budget = cpu_budget(proc, root)
    assert budget.cpus == 1 and budget.source == "cgroup v1 cpu.cfs_quota_us"
    (root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1")
    assert "cgroup v1 cpu.cfs_quota_us" not in cpu_budget(proc, root).limits


def test_an_unreadable_or_garbled_cgroup_file_falls_back_to_affinity_and_says_so(tmp_path):
    proc, root = _tree(tmp_path, "0::/app\n", {"cgroup.controllers": "cpu"})
    (root / "app" / "cpu.max").mkdir(parents=True)  # reading it fails with EISDIR, as a broken mount would
    budget = cpu_budget(proc, root)
    assert budget.source == "affinity" and budget.cpus == len(os.sched_getaffinity(0))
    assert any("cpu.max" in note and "left out of the CPU budget" in note for note in budget.notes)
    (root / "app" / "cpu.max").rmdir()
    (root / "app" / "cpu.max").write_text("lots 100000")
    assert any("not 'QUOTA PERIOD'" in note for note in cpu_budget(proc, root).notes)
    assert cpu_budget(tmp_path / "no-proc", root).notes  # /proc/self/cgroup itself missing: noted, no crash


def _on_one_cpu(code: str) -> str:
    """What ``code`` prints in a real Python process pinned to one CPU of this one's."""
    return subprocess.run(
        CLI[:1] + ["-c", code],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    ).stdout


def test_affinity_limits_the_budget_in_a_real_process():
    code = "from ortpilot.providers.cpubudget import cpu_budget; b = cpu_budget(); print(b.cpus, b.source)"
    out = _on_one_cpu(code)
    assert out.split() == ["1", "affinity"]


def test_ort_default_ignores_affinity_and_is_counted():
    """ORT's default pool is sized from the machine, not from the affinity mask (the reason for the budget)."""
    assert ort_default_threads() >= 1
    code = "from ortpilot.providers.cpubudget import ort_default_threads as t; print(t())"
    pinned = _on_one_cpu(code)
    assert int(pinned) == ort_default_threads()


def test_ort_default_is_capped_at_the_budget_only_where_its_pool_is_larger():
    """One rule for the tune's reference and verify --max-slowdown: 0 (ORT's own count) where the pool
    fits, else the budget; in a real process pinned to one CPU it is the budget whenever ORT counts more."""
    assert [default_threads_in_budget(t, c) for t, c in ((4, 2), (2, 2), (1, 2), (2, 1))] == [2, 0, 0, 1]
    code = "from ortpilot.providers.cpubudget import default_threads_in_budget as d; print(d())"
    pinned = _on_one_cpu(code)
    assert int(pinned) == (1 if ort_default_threads() > 1 else 0)


@pytest.fixture
def cpu_cgroup():
    """A real cgroup v1 CPU controller group with a 0.5-CPU quota, where this machine lets us make one."""
    base = Path("/sys/fs/cgroup/cpu")
    if not (base / "cpu.cfs_quota_us").is_file() or not os.access(base, os.W_OK):
        pytest.skip("no writable cgroup v1 cpu controller here (needs root and a cgroup v1 mount)")
    group = base / f"ortpilot-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "cpu.cfs_quota_us").write_text("50000")
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here: {exc}")
    yield group
    group.rmdir()


def test_doctor_reports_a_real_cgroup_quota(cpu_cgroup):
    procs = cpu_cgroup / "cgroup.procs"
    proc = subprocess.run(
        [*CLI, "doctor", "--json", "--no-probe"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: procs.write_text(str(os.getpid())),
    )
    assert proc.returncode in (0, 1), proc.stderr
    budget = json.loads(proc.stdout)["cpu_budget"]
    assert budget["cpus"] == 1 and budget["source"] == "cgroup v1 cpu.cfs_quota_us"
    assert budget["limits"]["cgroup v1 cpu.cfs_quota_us"] == 0.5


def test_the_cpus_ort_puts_its_default_pool_on_outside_the_affinity_are_read_from_the_kernel():
    """In a process on one CPU, what ``ort_default_outside`` names is a CPU of this machine other than that one."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing lies outside the affinity")
    code = (
        "import os; from ortpilot.providers.cpubudget import ort_default_outside as o; "
        "print(sorted(os.sched_getaffinity(0)), sorted(o()))"
    )
    own, outside = (
        subprocess.run(
            CLI[:1] + ["-c", code],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        )
        .stdout.strip()
        .split("] [")
    )
    pinned = {int(own.strip("[]"))}
    named = {int(c) for c in outside.strip("[]").split(",") if c.strip()}
    assert not named & pinned and named <= os.sched_getaffinity(0)
    if os.sched_getaffinity(0) == set(range(os.cpu_count() or 0)):  # unpinned: no CPU lies outside
        assert ort_default_outside() == frozenset()
