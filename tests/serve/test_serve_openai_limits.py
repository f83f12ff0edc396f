"""``ortpilot serve`` under load: a full queue gets 429 with Retry-After, a client gone frees its slot.

The server runs a slower decoder (6 layers, hidden 384) so that long requests are still running
while the test acts on them; it observes the replica through ``GET /v1/models/NAME``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from openai_procs import OpenAIServer, client_modules

openai, httpx = client_modules()

from ortpilot.models import demo_tokenizer_path, make_decoder

SLOW_TOKENS = 600


@pytest.fixture(scope="module")
def slow_server(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAIServer]:
    from ortpilot.artifacts.atomic import save_model

    folder = tmp_path_factory.mktemp("slow")
    save_model(make_decoder(layers=6, hidden=384, heads=6, kv_heads=2), folder / "slow.onnx")
    server = OpenAIServer(
        [
            str(folder / "slow.onnx"),
            "--tokenizer",
            str(demo_tokenizer_path()),
            "--max-streams",
            "2",
            "--max-queue",
            "1",
            "--max-length",
            "1024",
            "--debug-info",  # GET /v1/models/NAME lists the replica's recent requests only then
        ],
        ray_address,
        folder / "slow.err",
    )
    yield server
    assert server.stop() == 0, server.log.read_text(errors="replace")


def _info(server: OpenAIServer) -> dict:
    return httpx.get(f"{server.base_url}/models/slow", timeout=30).json()["ortpilot"]


def _wait(server: OpenAIServer, check, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _info(server)
        if check(info):
            return info
        time.sleep(0.05)
    raise AssertionError(f"condition not met; last state {info}")


def _wait_opened(opened: list, count: int, timeout: float = 60.0) -> None:
    """Until ``count`` held requests have their first chunks (the server admits a request before its client reads)."""
    deadline = time.monotonic() + timeout
    while len(opened) < count:
        assert time.monotonic() < deadline, f"{len(opened)} of {count} streams opened"
        time.sleep(0.02)


def _hold(server: OpenAIServer, prompt: str, opened: list) -> threading.Thread:
    """A streamed request that reads two chunks, then waits with the connection open until closed."""

    def run() -> None:
        body = {"model": "slow", "prompt": prompt, "max_tokens": SLOW_TOKENS, "temperature": 0, "stream": True}
        with (
            httpx.Client(timeout=120) as http,
            http.stream("POST", f"{server.base_url}/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            next(lines), next(lines)
            opened.append(response)  # streaming now: the server holds a slot for it
            while not getattr(response, "release", False):
                time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_disconnect_frees_the_slot_within_one_step(slow_server: OpenAIServer) -> None:
    opened: list = []
    thread = _hold(slow_server, "a client that goes away", opened)
    _wait_opened(opened, 1)
    _wait(slow_server, lambda i: i["pending"] == 1)
    opened[0].release = True  # the client closes the connection mid-stream
    thread.join(30)
    info = _wait(slow_server, lambda i: i["pending"] == 0 and i["recent"])
    record = info["recent"][-1]
    assert record["stop_reason"] == "cancelled" and record["completion_tokens"] < SLOW_TOKENS
    assert record["tokens_after_cancel"] <= 1  # the step running when the cancel came, no more


def test_full_queue_gets_429_with_retry_after(slow_server: OpenAIServer) -> None:
    opened: list = []
    threads = [_hold(slow_server, f"request {i}", opened) for i in range(2)]
    _wait_opened(opened, 2)
    _wait(slow_server, lambda i: i["pending"] == 2)
    queued = threading.Thread(
        target=lambda: httpx.post(
            f"{slow_server.base_url}/completions",
            json={"model": "slow", "prompt": "queued", "max_tokens": 4, "temperature": 0},
            timeout=120,
        ),
        daemon=True,
    )
    queued.start()
    _wait(slow_server, lambda i: i["pending"] == 3)  # 2 streams busy, 1 queued: the limit
    reply = httpx.post(
        f"{slow_server.base_url}/completions", json={"model": "slow", "prompt": "one too many"}, timeout=30
    )
    assert reply.status_code == 429 and int(reply.headers["retry-after"]) >= 1
    assert reply.json()["error"]["code"] == "rate_limit_exceeded" and "retry later" in reply.json()["error"]["message"]
    for response in opened:
        response.release = True
    for thread in [*threads, queued]:
        thread.join(60)
    _wait(slow_server, lambda i: i["pending"] == 0)
    ok = openai.OpenAI(base_url=slow_server.base_url, api_key="unused", max_retries=0).completions.create(
        model="slow", prompt="room again", max_tokens=3, temperature=0
    )
    assert ok.usage.completion_tokens == 3
