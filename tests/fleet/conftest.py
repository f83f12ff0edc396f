"""A real two-class bundle without a cluster: two local tunes of demo:mlp, one with this process's CPUs and
one in a process pinned to one CPU (so its CPU budget, and its class, is the one-CPU one), filed into a
bundle by the writer the fleet tune uses (``artifacts.bundle.write_bundle``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import file_bundle

from ortpilot.providers.machineclass import this_class

BUDGET_S = 12


@pytest.fixture(scope="session")
def two_class_bundle(tmp_path_factory: pytest.TempPathFactory, demo_paths: dict[str, Path], tuned_mlp: Path) -> Path:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("a second class needs a machine with two CPUs (one tune pinned to one of them)")
    root = tmp_path_factory.mktemp("bundles") / "mlp"
    here, one = this_class(), this_class(1)
    shutil.copytree(tuned_mlp, root / here.name)  # this process's class: the session's tune (tests/conftest.py)
    code = f"import ortpilot; ortpilot.tune({str(demo_paths['mlp'])!r}, {str(root / one.name)!r}, {BUDGET_S})"
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    for name in (here.name, one.name):  # a bundle's class folder holds the profile, not the journal
        shutil.rmtree(root / name / ".ortpilot-tune")
        (root / name / "journal.jsonl").unlink()
    return file_bundle(root, [here.name, one.name])


@pytest.fixture
def bundle_copy(two_class_bundle: Path, tmp_path: Path) -> Path:
    """A copy of the bundle a test may damage."""
    return Path(shutil.copytree(two_class_bundle, tmp_path / "mlp"))
