"""The isolated child (``python -m ortpilot.session.isolate_child SPEC RESULT``): the same ``load`` the parent
will run, in a process of its own, so that a crash in ORT kills only this process (``session.isolate``).

A module apart from the parent's side, so that ``session.verified`` (which starts the child)
and this entry point (which runs ``session.verified.load``) do not import each other.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ortpilot.childproc import die_with_parent
from ortpilot.session.isolate import CRASH_ENV
from ortpilot.session.options import SessionSettings
from ortpilot.session.verified import load


def _child_main(spec_file: str, result_file: str) -> int:
    """Child side: the same ``load`` the parent will run, without placement or optional writes."""
    die_with_parent()
    _test_fault()
    spec = json.loads(Path(spec_file).read_text())
    started = time.perf_counter()
    try:
        load(
            spec["model"],
            spec["providers"],
            "allow",
            settings=SessionSettings.from_dict(spec["settings"]),
            placement=False,
            isolate=False,
        )
        result: dict[str, Any] = {"ok": True}
    except Exception as exc:
        result = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    result["seconds"] = time.perf_counter() - started
    Path(result_file).write_text(json.dumps(result))
    return 0


def _test_fault() -> None:
    """Deliberate fault for tests (see module docstring); never set in normal use."""
    fault = os.environ.get(CRASH_ENV, "").strip()
    if not fault:
        return
    if fault.lower() == "hang":
        time.sleep(3600)
    os.kill(os.getpid(), getattr(signal, fault.upper()))


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
