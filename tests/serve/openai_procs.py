"""An ``ortpilot serve`` process serving decoders at /v1: started on a free port, stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from serve_procs import RAY_ENV, free_port


def client_modules() -> tuple[Any, Any]:
    """(openai, its HTTP library) for a test module, which is skipped without them or the decode extras."""
    openai = pytest.importorskip("openai")
    try:  # the HTTP library the openai client itself uses (httpx2 in its newer releases)
        import httpx2 as httpx
    except ImportError:
        httpx = pytest.importorskip("httpx")
    pytest.importorskip("tokenizers")
    pytest.importorskip("onnxscript")
    return openai, httpx


class OpenAIServer:
    """``ortpilot serve MODEL ... --address RAY --port P``; ``base_url`` once its ready line is out."""

    def __init__(self, args: list[str], ray_address: str, log: Path, timeout: float = 240.0) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self._err = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ortpilot.cli.main", "serve", *args, "--address", ray_address,
             "--port", str(self.port), "--no-access-log"],
            stdout=subprocess.PIPE, stderr=self._err, env={**os.environ, **RAY_ENV})
        self.ready: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self.ready and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not self.ready:
            self.stop()
            raise RuntimeError(f"ortpilot serve did not become ready (exit {self.proc.returncode}):\n{self.stderr}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if " ready on " in line:
                self.ready.append(line)

    @property
    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._err.close()
        return self.proc.returncode
