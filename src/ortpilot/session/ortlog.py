"""Capture what ORT says while it builds a session, so that ortpilot can report it.

ORT speaks through three channels: Python ``UserWarning`` (provider not available), C++ log
lines on stderr (EP library failed to load, nodes not assigned), and ``print`` on stdout (its
own retry-with-CPU path, which ortpilot disables). Left alone they reach the user's terminal
unformatted, or not at all; captured, they become the reason in a fallback record.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

_FD_LOCK = threading.Lock()
_LOG_LINE = re.compile(r"^\S+ \S+ \[(?P<sev>[VIWEF]):onnxruntime:(?P<logid>[^,]*), (?P<where>[^\]]*)\] (?P<msg>.*)$")


@dataclass
class CapturedOrtOutput:
    """Warnings and log lines ORT emitted inside one ``capture_ort_output`` block."""

    warnings: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)

    def messages(self, min_severity: str = "W") -> list[str]:
        """Warning texts plus log messages at or above a severity (V < I < W < E < F)."""
        order = "VIWEF"
        out = list(self.warnings)
        for line in self.log_lines:
            match = _LOG_LINE.match(line)
            if match:
                if order.index(match["sev"]) >= order.index(min_severity):
                    out.append(match["msg"].strip())
            elif line.strip():
                out.append(line.strip())
        return out

    def reason(self) -> str:
        """The most informative line for a fallback message (errors before warnings)."""
        errors = self.messages("E")
        if errors:
            return errors[0]
        msgs = self.messages("W")
        return msgs[0] if msgs else ""


@contextlib.contextmanager
def capture_ort_output(capture_fds: bool = True) -> Iterator[CapturedOrtOutput]:
    """Capture Python warnings and (optionally) fd 1/2 output for the duration of the block.

    fd capture is process-wide; a lock keeps two threads from interleaving captures.
    """
    captured = CapturedOrtOutput()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if capture_fds and _fds_usable():
                files: list[str] = []
                try:
                    with _FD_LOCK, _redirect_fd(2) as err_file, _redirect_fd(1) as out_file:
                        files = [err_file, out_file]
                        yield captured
                finally:
                    for path in files:
                        captured.log_lines.extend(_read_lines(path))
            else:
                yield captured
        finally:
            captured.warnings.extend(str(w.message) for w in caught)


def _fds_usable() -> bool:
    try:
        os.fstat(1)
        os.fstat(2)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _redirect_fd(fd: int) -> Iterator[str]:
    stream = sys.stderr if fd == 2 else sys.stdout
    with contextlib.suppress(Exception):
        stream.flush()
    tmp = tempfile.NamedTemporaryFile(prefix="ortpilot-log-", delete=False)  # noqa: SIM115 - its fd is redirected
    saved = os.dup(fd)
    try:
        os.dup2(tmp.fileno(), fd)
        yield tmp.name
    finally:
        with contextlib.suppress(Exception):
            stream.flush()
        os.dup2(saved, fd)
        os.close(saved)
        tmp.close()


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [line.rstrip("\n") for line in fh if line.strip()]
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
