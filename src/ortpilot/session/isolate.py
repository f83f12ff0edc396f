"""Create a session in a child process first, so that a model which crashes ORT kills only the child.

ORT checks less than it parses: some malformed models make it segfault or abort inside
``InferenceSession``, which no ``try`` can catch. ``preflight_in_child`` runs the very same
``ortpilot.session.load`` in a fresh interpreter (``python -m ortpilot.session.isolate_child``).
If the child dies from a signal, the parent raises ``OrtCrashError`` (exit 1: the model does
not verify under this ORT) with what to do. If the child merely raises, the parent returns and
its own in-process load produces the proper, specific error message.

Testing hook: ``ORTPILOT_TEST_CRASH_IN_CHILD=SIGSEGV`` (any signal name) makes the child kill
itself with that signal after its imports, and ``=hang`` makes it sleep, so the crash and
timeout paths can be proven without depending on an ORT bug. Only the child reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.childproc import child_process
from ortpilot.errors import OrtCrashError
from ortpilot.providers.names import ProviderSpec
from ortpilot.session.options import SessionSettings

CRASH_ENV = "ORTPILOT_TEST_CRASH_IN_CHILD"
TIMEOUT_ENV = "ORTPILOT_ISOLATE_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
_WHAT_TO_DO = (
    "Run 'ortpilot inspect MODEL' and onnx.checker.check_model on it, re-export or re-download it, "
    "or try another onnxruntime version; if the model is valid, report it to ONNX Runtime with the model attached."
)


def default_timeout() -> float:
    """``$ORTPILOT_ISOLATE_TIMEOUT`` seconds, else 600 (large models take minutes to load)."""
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def preflight_in_child(
    source: str | bytes, requested: list[ProviderSpec], settings: SessionSettings, timeout_s: float | None = None
) -> None:
    """Create the session in a child process; raise ``OrtCrashError`` if ORT crashes or hangs there.

    Returns normally when the child succeeded or raised an ordinary error (the caller's own load
    then reports that error properly). ``bytes`` are written to a private temp file first.
    """
    timeout = default_timeout() if timeout_s is None else timeout_s
    with scratch_dir("ortpilot-isolate-") as tmp:
        folder = Path(tmp)
        if isinstance(source, (bytes, bytearray)):
            model_path = folder / "model.onnx"
            model_path.write_bytes(bytes(source))  # private temp folder, removed below: not a user artifact
        else:
            model_path = Path(source)
        spec_file, result_file = folder / "spec.json", folder / "result.json"
        spec_file.write_text(json.dumps(_spec(model_path, requested, settings)))
        returncode, tail = _run_child(spec_file, result_file, folder, timeout)
        if returncode is None:
            raise OrtCrashError(
                f"ORT did not finish loading this model within {timeout:g} s (in an isolated child process, "
                f"now stopped). The model may be huge or malformed in a way that makes ORT loop. "
                f"Raise the limit with {TIMEOUT_ENV}=SECONDS if it is just large. {_WHAT_TO_DO}"
            )
        if returncode != 0 and not result_file.is_file():
            raise OrtCrashError(
                f"ORT crashed while loading this model ({describe_exit(returncode)}); only the "
                f"isolated child process died.{_last_words(tail)} {_WHAT_TO_DO}"
            )


def describe_exit(returncode: int) -> str:
    """``signal 11: SIGSEGV`` for a negative return code, ``exit status N`` otherwise."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"signal {-returncode}: {name}"
    return f"exit status {returncode}"


def _spec(model_path: Path, requested: list[ProviderSpec], settings: SessionSettings) -> dict[str, Any]:
    data = settings.to_dict()
    data["optimized_model_filepath"] = ""  # the parent writes that file; the child must not
    return {
        "model": str(model_path),
        "providers": [{"name": s.name, "options": dict(s.options)} for s in requested],
        "settings": data,
    }


def _run_child(spec_file: Path, result_file: Path, folder: Path, timeout: float) -> tuple[int | None, str]:
    """Run the child; (return code or None on timeout, tail of its stderr).

    The child's $TMPDIR is inside ``folder``, so whatever a killed child leaves goes with it.
    """
    env = dict(os.environ)
    (folder / "tmp").mkdir()
    env["TMPDIR"] = str(folder / "tmp")
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "ortpilot.session.isolate_child", str(spec_file), str(result_file)]
    # The child is in its own session (a terminal's Ctrl-C misses it); leaving this block in any way,
    # a timeout or an interrupt included, kills its group and reaps it.
    with child_process(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    ) as proc:
        try:
            _, err = proc.communicate(timeout=timeout)
            return proc.returncode, err.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return None, ""
        finally:
            if proc.stderr:
                proc.stderr.close()


def _last_words(stderr_text: str) -> str:
    lines = [
        ln.strip() for ln in stderr_text.splitlines() if ln.strip() and not ln.startswith(("Fatal Python", "  File"))
    ]
    return f" Its last output: {lines[-1][:300]}." if lines else ""
