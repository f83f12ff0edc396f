"""The tune journal: append-only JSON lines in OUTDIR, fsynced per record.

Every finished step (a candidate prepared, a batch of runs timed) is one line. A tune killed at
any moment leaves at most one torn last line, which reading skips; ``--resume`` replays the
rest, so finished candidates are never measured twice. The journal is read back as input, not
trusted state: a complete line that is not a record this module writes (unknown kind, a field
of the wrong type) is a ``UsageError`` naming the line, and the file is never opened through a
symbolic link, for reading or writing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortpilot.artifacts.oserrors import storage_errors
from ortpilot.errors import UsageError

JOURNAL_NAME = "journal.jsonl"
MAX_JOURNAL_BYTES = 256 * 2**20
# The record format (the ``start`` record's ``journal_version``). Journals written before it was
# recorded have none and are version 1: the format has not changed since, so they resume.
JOURNAL_VERSION = 1
_NUMBER = (int, float)
_OPT_STR = (str, type(None))
_OPT_NUMBER = (int, float, type(None))
# kind -> field -> allowed types (bool is never taken for a number). Fields not listed are refused.
_STEP = {"kind": str, "id": str, "stage": str, "status": _OPT_STR, "error": _OPT_STR, "signal": (int, type(None))}
_FIELDS: dict[str, dict[str, Any]] = {
    "start": {
        "kind": str,
        "model_sha256": str,
        "outputs": (list, type(None)),  # --outputs: the outputs the deployment reads, None for all
        "shapes": dict,
        "objective": str,
        "max_error": _OPT_NUMBER,
        "metric": _OPT_STR,
        "quantize": bool,
        "session_knobs": bool,  # absent in journals written before it (they searched them)
        "providers": list,
        "ort": str,
        "data_sha256": _OPT_STR,  # the calibration / gate data file(s), None for generated inputs
        "workload_sha256": _OPT_STR,  # the shapes of the requests timed (data.workload), None for one shape
        "batches": list,
        "budget_s": _NUMBER,
        "model": str,
        "journal_version": int,
    },
    "kept": {"kind": str, "reference": dict, "heldout": dict},
    "prepared": {
        **_STEP,
        "candidate": dict,
        "phase": str,
        "seconds": _NUMBER,
        "reason": _OPT_STR,
        "model_path": str,
        "model_sha256": str,
        "cache_hit": bool,
        "passes": list,
        "build_s": _NUMBER,
        "session_s": _NUMBER,
        "session_mb": _OPT_NUMBER,  # RSS the candidate's session(s) took (a shape plan's: every bucket's)
        "providers": list,
        "placement": (dict, type(None)),
        "outputs": str,
        "output_names": list,
        "output_sha256": dict,
        "graph_sha256": str,  # the built model's structure (graph.structure); absent for the model as given
        "accuracy": (dict, type(None)),
        "verification": bool,
        "returncode": (int, type(None)),
        "log_tail": str,
        "errno": (int, type(None)),
    },
    # caller_cpus: where the worker ran the calling thread (measure.placement; None: where the OS put it)
    "bench": {
        **_STEP,
        "runs": int,
        "samples_s": list,
        "anchor": str,
        "anchor_samples_s": list,
        "caller_cpus": (list, type(None)),
        "settled_s": _OPT_NUMBER,  # beside the anchor: the shortest untimed settling of any turn
    },
    "rank": {
        **_STEP,
        "passes": list,
        "per_channel": bool,
        "op_types": list,
        "reduce_range": bool,
        "weight_type": str,
        "ranking": list,
    },
    "final": {
        **_STEP,
        "ids": list,
        "samples_s": dict,
        "blocks": dict,
        "caller_cpus": (list, type(None)),
        "settled_s": _OPT_NUMBER,  # the shortest untimed settling of any turn (measure.interleave.settle)
        "rounds_s": _OPT_NUMBER,  # the rounds' own wall time (they stop at the time planned: tuning.steps.final)
        "replay": str,  # the replay set timed where not the search's (a batch size's every batch: "b32")
    },
    # a batch size's replay set timed for the winner and ORT's default after the final (stage: "b8", ...)
    "batch": {
        **_STEP,
        "ids": list,
        "samples_s": dict,
        "blocks": dict,
        "caller_cpus": (list, type(None)),
        "settled_s": _OPT_NUMBER,
        "rounds_s": _OPT_NUMBER,
    },
    "done": {"kind": str, "winner": str, "files": dict, "load_avg": list, "others_cpu": _OPT_NUMBER},
}
_REQUIRED = {
    "start": ("model_sha256",),
    "kept": ("reference", "heldout"),
    "prepared": ("id", "status"),
    "bench": ("id", "stage", "status", "samples_s"),
    "rank": ("id",),
    "final": ("status",),
    "batch": ("status", "stage"),
    "done": ("winner",),
}


def read_journal(path: Path) -> list[dict[str, Any]]:
    """All complete records, each checked (see module docstring); a torn (half-written) last line is dropped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if path.is_symlink():
            raise UsageError(
                f"The tune journal '{path}' is a symbolic link; ortpilot does not follow links in an "
                "output folder. Remove it, or choose another -o folder."
            ) from None
        raise UsageError(f"The tune journal '{path}' cannot be read ({exc.strerror}).") from None
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > MAX_JOURNAL_BYTES:
            raise UsageError(
                f"The tune journal '{path}' is larger than any tune writes ({MAX_JOURNAL_BYTES} bytes); "
                "it is not one. Drop --resume to start over, or choose another -o folder."
            )
        records = []
        for number, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                break  # torn last line: the process died mid-write
            records.append(check_record(raw, path, number))
    return records


def check_record(raw: bytes, path: Path, number: int) -> dict[str, Any]:
    """One journal line as the record this module wrote, or ``UsageError`` naming the line and the problem."""
    try:
        record = json.loads(raw)
        problem = _problem(record)
    except (ValueError, RecursionError) as exc:
        problem = f"it is not JSON ({type(exc).__name__})"
    if problem:
        raise UsageError(
            f"Cannot resume from the tune journal '{path}': line {number} {problem}. A tune writes only "
            "its own records there; this journal was damaged or edited. Drop --resume to start over, "
            "or choose another -o folder."
        )
    return record


def _problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "is not a JSON object"
    kind = record.get("kind")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return f"has an unknown kind {str(kind)[:40]!r}"
    for name in _REQUIRED[kind]:
        if name not in record:
            return f"({kind}) lacks '{name}'"
    for name, value in record.items():
        allowed = fields.get(name)
        if allowed is None:
            return f"({kind}) has a field '{str(name)[:40]}' no tune writes"
        types = allowed if isinstance(allowed, tuple) else (allowed,)
        if type(value) not in types and not (float in types and type(value) is int):
            return f"({kind}) has '{name}' of type {type(value).__name__}"
    return _numbers(record) or _kept_files(record)


def check_version(path: Path, header: Mapping[str, Any] | None) -> None:
    """Refuse (exit 2) a journal whose ``start`` record names a format this ortpilot does not read."""
    version = (header or {}).get("journal_version", 1)
    if version != JOURNAL_VERSION:
        raise UsageError(
            f"Cannot resume from the tune journal '{path}': it was written in journal format "
            f"{version}, and this ortpilot reads format {JOURNAL_VERSION} (journals without a "
            "format number are format 1). Resume it with the ortpilot that wrote it, or drop "
            "--resume to start the tune over."
        )


def _numbers(record: Mapping[str, Any]) -> str | None:
    """Timings must be finite, non-negative numbers; accuracy figures numbers (an error may be inf)."""
    lists = (
        [record.get("samples_s")]
        if isinstance(record.get("samples_s"), list)
        else list((record.get("samples_s") or {}).values())
    )
    for samples in lists:
        if not isinstance(samples, list) or not all(
            type(x) in _NUMBER and math.isfinite(x) and x >= 0 for x in samples
        ):
            return "has timings that are not finite non-negative numbers"
    accuracy = record.get("accuracy")
    if isinstance(accuracy, dict):
        outputs = accuracy.get("outputs")
        if (
            type(accuracy.get("passed")) is not bool
            or not isinstance(outputs, list)
            or type(accuracy.get("max_error")) not in _NUMBER
            or type(accuracy.get("worst_error")) not in _NUMBER
            or not all(
                isinstance(o, dict)
                and isinstance(o.get("name"), str)
                and isinstance(o.get("metric"), str)
                and type(o.get("error")) in _NUMBER
                for o in outputs
            )
        ):
            return "has an accuracy record that is not the gate's"
    if (
        record.get("kind") == "prepared"
        and record.get("status") == "ok"
        and not all(isinstance(record.get(k), str) for k in ("model_path", "model_sha256", "outputs"))
    ):
        return "(prepared, ok) lacks model_path, model_sha256 or outputs"
    return None


def _kept_files(record: Mapping[str, Any]) -> str | None:
    """A ``kept`` record names its files in the state folder and nothing else (no absolute path, no '..')."""
    if record.get("kind") != "kept":
        return None
    from ortpilot.tuning.state import FILES, STATE_DIR

    for key, name in FILES.items():
        entry = record[key]
        if entry.get("file") != f"{STATE_DIR}/{name}" or not isinstance(entry.get("sha256"), str):
            return f"(kept) names '{str(entry.get('file'))[:80]}' instead of {STATE_DIR}/{name}"
    return None


class Journal:
    """Append records; look up finished steps by key."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = path
        self.resume = resume and (path.is_file() or path.is_symlink())  # a link is refused by read_journal
        self.replayed = read_journal(path) if self.resume else []
        self._done = {self.key(r): r for r in self.replayed if "kind" in r}
        self._pending: list[bytes] = []
        self._fh = None  # opened by commit(): until then nothing is written (a failed start leaves no file)

    def commit(self) -> None:
        """Open the file (a fresh tune's new, a resumed one's kept) and write pending records.

        Never through a link: a fresh journal replaces whatever stands at its name (a planted
        link included) with a new file made with ``O_EXCL``; a resumed one is opened ``O_NOFOLLOW``.
        """
        if self._fh is not None:
            return
        with storage_errors(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.resume:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
                self._truncate_torn_tail(fd)
            else:
                if self.path.is_symlink() or self.path.is_file():
                    self.path.unlink()
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND, 0o644)
            self._fh = os.fdopen(fd, "ab")
            if self._pending:
                # One write and one fsync: a kill mid-commit must not leave the default session's
                # records without the ``kept`` record that makes them resumable.
                self._write(b"".join(self._pending))
        self._pending.clear()

    def _write(self, line: bytes) -> None:
        with storage_errors(self.path):
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def _truncate_torn_tail(self, fd: int) -> None:
        with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as fh:
            data = fh.read()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            os.ftruncate(fd, end)

    @staticmethod
    def key(record: dict[str, Any]) -> tuple[str, str, str]:
        return (record.get("kind", ""), record.get("id", ""), record.get("stage", ""))

    def get(self, kind: str, cid: str = "", stage: str = "") -> dict[str, Any] | None:
        return self._done.get((kind, cid, stage))

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        line = (json.dumps(record, default=str) + "\n").encode()
        if self._fh is None:
            self._pending.append(line)
        else:
            self._write(line)
        self._done[self.key(record)] = record
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
