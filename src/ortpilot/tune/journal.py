"""The tune journal: append-only JSON lines in OUTDIR, fsynced per record.

Every finished step (a candidate prepared, a batch of runs timed) is one line. A tune killed at
any moment leaves at most one torn last line, which reading skips; ``--resume`` replays the
rest, so finished candidates are never measured twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

JOURNAL_NAME = "journal.jsonl"


def read_journal(path: Path) -> list[dict[str, Any]]:
    """All complete records; a torn (half-written) line is dropped."""
    if not path.is_file():
        return []
    records = []
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # torn last line: the process died mid-write
            try:
                records.append(json.loads(raw))
            except ValueError:
                continue
    return records


class Journal:
    """Append records; look up finished steps by key."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = path
        self.resume = resume and path.is_file()
        self.replayed = read_journal(path) if self.resume else []
        self._done = {self.key(r): r for r in self.replayed if "kind" in r}
        self._pending: list[bytes] = []
        self._fh = None  # opened by commit(): until then nothing is written (a failed start leaves no file)

    def commit(self) -> None:
        """Open the file (truncating a fresh tune's, keeping a resumed one's) and write pending records."""
        if self._fh is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.resume:
            self._truncate_torn_tail()
        self._fh = open(self.path, "ab" if self.resume else "wb")
        for line in self._pending:
            self._write(line)
        self._pending.clear()

    def _write(self, line: bytes) -> None:
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def _truncate_torn_tail(self) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(end)

    @staticmethod
    def key(record: dict[str, Any]) -> tuple[str, str, str]:
        return (record.get("kind", ""), record.get("id", ""), record.get("stage", ""))

    def get(self, kind: str, cid: str = "", stage: str = "") -> dict[str, Any] | None:
        return self._done.get((kind, cid, stage))

    def header(self) -> dict[str, Any] | None:
        return self.get("start")

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        line = (json.dumps(record, default=str) + "\n").encode()
        if self._fh is None:
            self._pending.append(line)
        else:
            self._write(line)
        self._done[self.key(record)] = record
        return record

    def records(self) -> Iterator[dict[str, Any]]:
        return iter(read_journal(self.path))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
