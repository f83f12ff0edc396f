"""One class's search on its node: ``python -m ortpilot.fleet.child SPEC.json``, started by ``fleet.remote``.

The local tune runs here unchanged (its worker children, journal and resume), in a process of
its own so that a crash or a kill takes this search down and not the Ray worker that reports
on it. First the process pins itself to the node's CPUs (the first ``cpus`` of its affinity):
the CPU budget the tune reads, the threads it tries and the ``machine_class`` its profile
records are then the node's, not the whole host's. The profile's ``source_model.path`` is set
to the model's path on the machine that asked (the node had only a copy in its scratch folder).
The outcome goes to SPEC's ``result`` file: the tune's summary, or the error with its exit code.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.childproc import die_with_parent
from ortpilot.errors import OrtpilotError
from ortpilot.fleet.remote import SearchSpec
from ortpilot.fleet.result import SearchSummary


def pin(cpus: int) -> list[int]:
    """Restrict this process (and the tune's children, which inherit it) to ``cpus`` of its CPUs."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux: the budget then comes from the machine
        return []
    chosen = allowed[: max(1, cpus)]
    if len(chosen) < len(allowed):
        os.sched_setaffinity(0, chosen)
    return chosen


def summary(doc: dict[str, Any]) -> SearchSummary:
    """What the driver keeps of a class's TuneResult (``TuneResult.to_dict()``)."""
    from ortpilot.tuning.report import reference_name

    return SearchSummary.of_result(doc, reference_name(doc.get("baseline") or {}))


def _relabel(profile: Path, source_path: str) -> None:
    """``source_model.path``: the asking machine's path, not the node's scratch copy."""
    doc = json.loads(profile.read_text(encoding="utf-8"))
    doc["source_model"] = {**(doc.get("source_model") or {}), "path": source_path}
    atomic_write_json(profile, doc)


def run(spec: SearchSpec) -> int:
    """The search SPEC describes; its outcome in SPEC's ``result`` file; the exit code."""
    from ortpilot.tuning import tune

    result_file = Path(spec.result)
    cpus = pin(spec.job.cpus)
    calibration = None
    if spec.calibration:
        with open(spec.calibration, "rb") as fh:  # written by fleet.remote from what the driver sent
            calibration = pickle.load(fh)
    try:
        result = tune(spec.request(calibration))
        _relabel(Path(spec.out) / "profile.json", spec.job.source_path)
        atomic_write_json(result_file, {"ok": summary(result.to_dict()).to_dict(), "cpus": cpus})
        return 0
    except OrtpilotError as exc:
        atomic_write_json(
            result_file, {"error": {"type": type(exc).__name__, "exit_code": exc.exit_code, "message": str(exc)}}
        )
        return exc.exit_code


def main(argv: list[str]) -> int:
    die_with_parent()
    spec = SearchSpec.from_dict(json.loads(Path(argv[1]).read_text(encoding="utf-8")))
    return run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
