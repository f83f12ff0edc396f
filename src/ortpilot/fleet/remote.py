"""The Ray task that runs one class's search on its node and streams what the driver keeps.

:func:`search` is a generator (a Ray streaming task, pinned to one node by the driver). It
unpacks the model (and, for a resume, the journal the driver kept) into a scratch folder, runs
the local tune in a child process (``fleet.child``) pinned to the node's CPUs, and yields:

- ``{"kind": "started", ...}`` at once (which process, which node);
- ``{"kind": "journal", "data": TAR}`` whenever the journal grew: the journal and what
  ``--resume`` needs beside it (``tuning.state``), so that a search whose node dies can resume
  on another node of its class from its last finished step;
- at the end ``{"kind": "done", "folder": TAR, "summary": ...}`` (the profile folder: model,
  profile.json, reference.npz, reports) or ``{"kind": "failed", "exit_code": N, "message": ...}``.

Nothing is shared with the driver but what goes through Ray's object store.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.childproc import child_process
from ortpilot.fleet.payload import folder_files, pack, unpack
from ortpilot.tuning.journal import JOURNAL_NAME
from ortpilot.tuning.state import STATE_DIR


@dataclass(frozen=True)
class SearchJob:
    """What the driver sends a node for one class's search (the model and calibration go beside it, through
    the object store): the request as plain data (``TuneRequest.to_dict``), and the node's CPUs."""

    model_file: str  # the model's name inside the payload
    request: dict[str, Any]  # the fleet's TuneRequest.to_dict(); its model and OUTDIR are the node's own
    cpus: int  # the node's CPUs: the child pins itself to this many
    source_path: str  # the model's path on the machine that asked (the profile records it)
    source_label: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchJob:
        return cls(**dict(doc))


@dataclass(frozen=True)
class SearchSpec:
    """What ``fleet.child`` runs, in its scratch folder: the job's request made local (the unpacked model,
    the scratch OUTDIR, ``resume`` when a journal came along), where the loaded calibration samples are
    (a pickle, or None) and where the outcome goes."""

    job: SearchJob
    model: str
    out: str
    resume: bool
    calibration: str | None
    result: str

    def request(self, calibration: Any = None) -> Any:
        """The local ``TuneRequest``: the fleet's, on this node's copy of the model, into the scratch OUTDIR."""
        from ortpilot.tuning.request import TuneRequest

        asked = TuneRequest.from_dict({**self.job.request, "calibration": None})
        return replace(asked, model=self.model, out_dir=self.out, resume=self.resume, calibration=calibration)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "job": self.job.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SearchSpec:
        doc = dict(doc)
        return cls(**{**doc, "job": SearchJob.from_dict(doc["job"])})


POLL_S = 0.2  # how often the child and its journal are looked at (a stat each)
JOURNAL_EVERY_S = 3.0  # a grown journal is sent at most this often (and once more at the end)
LOG_TAIL = 3000


def resume_files(out: Path) -> list[tuple[str, Path]]:
    """What a resume elsewhere needs: the journal and the state folder beside it."""
    return folder_files(out, lambda rel: rel == JOURNAL_NAME or rel.startswith(f"{STATE_DIR}/"))


def profile_files(out: Path) -> list[tuple[str, Path]]:
    """The profile folder a class contributes to the bundle: everything but the journal, its state and locks."""
    return folder_files(out, lambda rel: rel != JOURNAL_NAME and not rel.startswith("."))


def search(job: SearchJob, model_tar: bytes, calibration: Any, journal: bytes | None) -> Iterator[dict[str, Any]]:
    """One class's search (module docstring); ``journal``: the tar of a previous attempt's journal, or None."""
    yield {"kind": "started", "pid": os.getpid(), "host": socket.gethostname(), "node": _node_id()}
    with scratch_dir("ortpilot-fleet-") as work:
        model_dir, out = work / "model", work / "out"
        unpack(model_tar, model_dir)
        if journal:
            unpack(journal, out)
        spec = SearchSpec(
            job,
            str(model_dir / job.model_file),
            str(out),
            bool(journal),
            None if calibration is None else str(work / "calibration.pickle"),
            str(work / "result.json"),
        )
        if spec.calibration is not None:
            with open(spec.calibration, "wb") as fh:
                pickle.dump(calibration, fh)
        (work / "spec.json").write_text(json.dumps(spec.to_dict()), encoding="utf-8")
        log = work / "search.log"
        with (
            open(log, "wb") as sink,
            child_process(
                [sys.executable, "-m", "ortpilot.fleet.child", str(work / "spec.json")], stdout=sink, stderr=sink
            ) as proc,
        ):
            seen, sent = None, 0.0
            while True:
                finished = proc.poll() is not None
                state = _journal_state(out)
                due = finished or time.monotonic() - sent >= JOURNAL_EVERY_S
                if state is not None and state != seen and due:
                    seen, sent = state, time.monotonic()
                    yield {"kind": "journal", "data": pack(resume_files(out))}
                if finished:
                    break
                time.sleep(POLL_S)
        yield _outcome(proc.returncode, work / "result.json", out, log)


def _outcome(returncode: int, result_file: Path, out: Path, log: Path) -> dict[str, Any]:
    try:
        result = json.loads(result_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        result = {}
    if returncode == 0 and "ok" in result:
        return {"kind": "done", "folder": pack(profile_files(out)), "summary": result["ok"], "cpus": result.get("cpus")}
    error = result.get("error") or {}
    tail = log.read_bytes()[-LOG_TAIL:].decode("utf-8", "replace") if log.is_file() else ""
    return {
        "kind": "failed",
        "retry": not error,  # the child died without a result (a kill, OOM): another try may finish it
        "exit_code": int(error.get("exit_code") or 1),
        "message": error.get("message")
        or f"the search exited with {returncode} without a result; its log ends: {tail.strip()[-600:]}",
        "log_tail": tail,
    }


def _journal_state(out: Path) -> tuple[int, int] | None:
    journal = out / JOURNAL_NAME
    try:
        info = journal.stat()
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns


def _node_id() -> str:
    """The Ray node this runs on; "" outside Ray, where asking Ray would start a local instance of it."""
    ray = sys.modules.get("ray")  # a Ray worker has imported it
    if ray is None or not ray.is_initialized():
        return ""
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # an old Ray, or its GCS gone: the driver knows the node anyway
        return ""


__all__ = ["SearchJob", "SearchSpec", "profile_files", "resume_files", "search"]
