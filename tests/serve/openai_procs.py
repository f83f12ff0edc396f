"""An ``ortpilot serve`` process serving decoders at /v1: started on a free port, stopped by PID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serve_procs import Server, free_port


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


class OpenAIServer(Server):
    """``ortpilot serve MODEL ... --address RAY`` on a free port; ``base_url`` is its OpenAI API."""

    def __init__(
        self, args: list[str], ray_address: str, log: Path, timeout: float = 240.0, access_log: bool = False
    ) -> None:
        extra = [] if access_log else ["--no-access-log"]
        super().__init__([*args, "--address", ray_address, *extra], free_port(), log, timeout)
        self.base_url = f"http://{self.url}/v1"
        if not self.ready:
            self.stop()
            raise RuntimeError(
                f"ortpilot serve did not become ready (exit {self.proc.returncode}):\n"
                f"{self.log.read_text(errors='replace')}"
            )
