"""A hostile client against ``ortpilot serve``'s OpenAI endpoints, with the ``openai`` client and raw
sockets.

One server for the module: two replicas of a decoder whose embedding row for token 255 is NaN (a
broken model, served for real), an API key, a 1 MiB body limit and short timeouts. Every route needs
the key (401 in OpenAI's shape), every client mistake is a 4xx in that shape, a request whose logits
turn NaN fails alone while the streams beside it get their text, slow clients are cut off, a
replica SIGKILLed under 8 clients loses no request that had not started streaming, and SIGTERM
answers new requests with 503 + Retry-After while the streams in flight finish.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from openai_procs import OpenAIServer, client_modules

openai, httpx = client_modules()
import slow_clients as slow
from onnx import numpy_helper

from ortpilot.models import demo_tokenizer_path, make_decoder

KEY = "openai-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
POISON = 255  # the byte 0xff: no ASCII prompt holds it
PROMPTS = [
    f"Client {i} asks about the {word} of ONNX"
    for i, word in enumerate(["speed", "size", "shape", "cost", "use", "age"])
]
NEW = 60


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo decoder with token 255's embedding row NaN: a broken model, saved for the server."""
    from ortpilot.artifacts.atomic import save_model

    folder = tmp_path_factory.mktemp("poison")
    model = make_decoder()
    for init in model.graph.initializer:
        if init.name == "model.embed_tokens.weight":
            table = numpy_helper.to_array(init).copy()
            table[POISON] = np.nan
            init.CopyFrom(numpy_helper.from_array(table, init.name))
    save_model(model, folder / "poison.onnx")
    return folder / "poison.onnx"


@pytest.fixture(scope="module")
def clean_prompts(poisoned: Path) -> list[str]:
    """The prompts whose 200-token greedy answer never chooses token 255 (one of them does: its answer
    then fails with NaN logits, rightly, which the kill test must not count as a lost request)."""
    from tokenizers import Tokenizer

    from ortpilot.decode.generate import Generator
    from ortpilot.errors import SamplingError

    tokenizer = Tokenizer.from_file(str(demo_tokenizer_path()))
    generator, clean = Generator(str(poisoned)), []  # one session for every prompt
    for prompt in PROMPTS:
        try:
            generator.generate(tokenizer.encode(prompt).ids, 200, max_length=512, speculation="off")
            clean.append(prompt)
        except SamplingError:
            pass
    assert 0 < len(clean) < len(PROMPTS), clean  # the poison is reachable, and most prompts avoid it
    return clean


@pytest.fixture(scope="module")
def server(ray_address: str, poisoned: Path) -> Iterator[OpenAIServer]:
    folder = poisoned.parent
    srv = OpenAIServer(
        [
            str(poisoned),
            *("--tokenizer", str(demo_tokenizer_path()), "--api-key", KEY),
            *("--replicas", "2", "--cpus-per-replica", "1", "--max-streams", "4", "--max-length", "512"),
            *("--max-request-mb", "1", "--max-header-kb", "16"),
            *("--header-timeout", "2", "--idle-timeout", "3", "--request-timeout", "30"),
        ],
        ray_address,
        folder / "serve.err",
        access_log=True,
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def client(server: OpenAIServer):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def _error(reply) -> dict:
    """OpenAI's error object: message (one line, no traceback, no path), type, code."""
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "code"}, error
    assert "\n" not in error["message"] and "Traceback" not in error["message"], error
    assert "/tmp/" not in error["message"] and ".py" not in error["message"], error
    return error


def test_every_route_needs_the_key(server: OpenAIServer, client) -> None:
    for method, path in (
        ("GET", "/models"),
        ("GET", "/models/poison"),
        ("POST", "/completions"),
        ("POST", "/chat/completions"),
        ("GET", "/nowhere"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            reply = httpx.request(method, f"{server.base_url}{path}", headers=headers, json={}, timeout=30)
            assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer", (path, headers)
            error = _error(reply)
            assert error["code"] == "invalid_api_key" and KEY not in reply.text
    wrong = openai.OpenAI(base_url=server.base_url, api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert [m.id for m in client.models.list().data] == ["poison"]
    reply = client.completions.create(model="poison", prompt="Hi", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4
    assert KEY not in server.stderr and KEY not in "\n".join(server.ready)


CASES = [
    ("nested JSON", b"[" * 100000, 400, "invalid_json"),
    ("not JSON", b"{model", 400, "invalid_json"),
    ("negative seed", {"model": "poison", "prompt": "x", "seed": -1}, 400, "invalid_value"),
    ("seed past 2**64", {"model": "poison", "prompt": "x", "seed": 2**64}, 400, "invalid_value"),
    ("a million-character stop", {"model": "poison", "prompt": "x", "stop": "s" * 1_000_000}, 400, "invalid_value"),
    ("five stops", {"model": "poison", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value"),
    ("token past the vocabulary", {"model": "poison", "prompt": [5, 300]}, 400, "invalid_value"),
    ("temperature 3", {"model": "poison", "prompt": "x", "temperature": 3}, 400, "invalid_value"),
    ("over --max-request-mb", {"model": "poison", "prompt": "x" * (2 * 1024 * 1024)}, 413, "request_too_large"),
    ("unknown model", {"model": "nope", "prompt": "x"}, 404, "model_not_found"),
    ("presence_penalty 1e308", {"model": "poison", "prompt": "x", "presence_penalty": 1e308}, 400, "unsupported"),
    ("frequency_penalty 0.5", {"model": "poison", "prompt": "x", "frequency_penalty": 0.5}, 400, "unsupported"),
    ("logit_bias", {"model": "poison", "prompt": "x", "logit_bias": {"5": 10}}, 400, "unsupported"),
    ("echo", {"model": "poison", "prompt": "x", "echo": True}, 400, "unsupported"),
]


@pytest.mark.parametrize("case, body, status, code", CASES, ids=[c[0] for c in CASES])
def test_client_mistakes_are_4xx_in_openais_shape(server: OpenAIServer, case, body, status, code) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(
        f"{server.base_url}/completions",
        content=content,
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
    assert reply.status_code == status, (case, reply.text[:300])
    assert _error(reply)["code"] == code, (case, reply.text[:300])


def test_wrong_methods_paths_and_origins(server: OpenAIServer) -> None:
    reply = httpx.get(f"{server.base_url}/completions", headers=AUTH, timeout=30)
    assert reply.status_code == 405 and _error(reply)["code"] == "method_not_allowed"
    reply = httpx.get(f"{server.base_url}/nowhere", headers=AUTH, timeout=30)
    assert reply.status_code == 404 and _error(reply)["code"] == "not_found"
    outside = httpx.get(f"http://{server.url}/elsewhere", headers=AUTH, timeout=30)  # outside /v1: no API route
    assert outside.status_code == 404 and _error(outside)["code"] == "not_found"
    assert "GET /elsewhere:" in _error(outside)["message"], outside.text
    unprefixed = httpx.post(f"http://{server.url}/completions", json={"model": "poison", "prompt": "x"}, headers=AUTH)
    assert unprefixed.status_code == 404 and _error(unprefixed)["code"] == "not_found"
    reply = httpx.get(f"{server.base_url}/models", headers={**AUTH, "Host": "attacker.example"}, timeout=30)
    assert reply.status_code == 403 and _error(reply)["code"] == "host_not_allowed"
    reply = httpx.get(f"{server.base_url}/models", headers={**AUTH, "Origin": "https://evil.example"}, timeout=30)
    assert reply.status_code == 403 and _error(reply)["code"] == "origin_not_allowed"


def test_penalties_of_zero_are_taken_and_others_refused_by_name(server: OpenAIServer, client) -> None:
    body = {"model": "poison", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    reply = client.completions.create(**body, presence_penalty=0, frequency_penalty=0.0)
    assert reply.usage.completion_tokens == 2
    for name in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**body, **{name: -2})
        assert info.value.body["param"] == name and "no penalty" in info.value.body["message"]


def test_an_unknown_method_gets_openais_json_error(server: OpenAIServer) -> None:
    outcome = slow.one_request(server.port, "FOO", "/v1/models", AUTH)
    assert outcome.status == 501, outcome
    error = outcome.json()["error"]
    assert error["code"] == "method_not_implemented" and "GET, HEAD, POST" in error["message"], error


def test_model_info_shows_no_other_clients_requests(server: OpenAIServer, client) -> None:
    client.completions.create(model="poison", prompt="someone else's prompt", max_tokens=3, temperature=0)
    info = httpx.get(f"{server.base_url}/models/poison", headers=AUTH, timeout=30).json()["ortpilot"]
    assert not {"recent", "pid", "source"} & set(info), sorted(info)
    assert info["max_streams"] == 4 and "pending" in info


def test_a_request_whose_logits_turn_nan_fails_alone(server: OpenAIServer, client) -> None:
    alone = [
        client.completions.create(model="poison", prompt=p, max_tokens=NEW, temperature=0).choices[0].text
        for p in PROMPTS
    ]
    assert len(set(alone)) == len(alone)
    texts: dict[int, str] = {}
    opened = threading.Barrier(len(PROMPTS) + 1)

    def stream(i: int) -> None:
        pieces = client.completions.create(
            model="poison", prompt=PROMPTS[i], max_tokens=NEW, temperature=0, stream=True
        )
        first = next(iter(pieces))
        opened.wait(60)  # every stream is decoding when the broken requests arrive
        texts[i] = first.choices[0].text + "".join(c.choices[0].text for c in pieces)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    opened.wait(60)
    broken = [
        httpx.post(
            f"{server.base_url}/completions",
            json={"model": "poison", "prompt": [72, 105, POISON], "max_tokens": 20, "temperature": 1.0, "seed": i},
            headers=AUTH,
            timeout=60,
        )
        for i in range(2)
    ]
    for thread in threads:
        thread.join(120)
    for reply in broken:  # the broken model's failure: a 5xx with a request id, never another stream's
        assert reply.status_code == 500 and "NaN" in _error(reply)["message"] and "request id" in reply.text
    assert [texts.get(i) for i in range(len(PROMPTS))] == alone


def test_slow_and_malformed_clients_are_cut_off(server: OpenAIServer) -> None:
    outcomes = slow.side_by_side(
        {
            "short body": lambda: slow.short_body(server.port, "/v1/completions", AUTH),
            "dribble": lambda: slow.dribble(server.port, "/v1/models"),
            "idle keep-alive": lambda: slow.idle_after_request(server.port, "/v1/models", AUTH),
            "headers over the limit": lambda: slow.big_headers(server.port, "/v1/models", 20 * 1024),
        }
    )
    body = outcomes["short body"]
    assert body.status == 408 and body.json()["error"]["code"] == "request_timeout", body
    assert outcomes["dribble"].status == 408 and outcomes["dribble"].seconds is not None
    assert outcomes["idle keep-alive"].status == 200 and outcomes["idle keep-alive"].seconds is not None
    over = outcomes["headers over the limit"]
    assert over.status == 431 and over.json()["error"]["code"] == "headers_too_large", over


def _replica_pids() -> list[int]:
    """The decoder replicas' processes (Ray names them ray::ServeReplica:APP:DEPLOYMENT)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(b"ray::ServeReplica:ortpilot-openai:decoder-poison"):
                found.append(int(entry.name))
    return found


def test_no_request_is_lost_when_a_replica_is_killed_under_load(server: OpenAIServer, clean_prompts: list[str]) -> None:
    """Eight clients and a stream on two replicas of four streams each; one replica is killed: every request in
    flight on it runs again on the survivor, and the requests beyond its four streams wait in its queue. The
    module's --request-timeout is 30 s so that waiting is no deadline on how fast the machine is (at 4 s, one
    request queued behind generations got its 504 at 4.05 s in a whole .ci/run on a 2-core machine; the
    slow-client test's 408s come from --header-timeout, not from it)."""
    tokens = 100  # what each request asks for, and must get
    deadline = time.monotonic() + 60
    while len(_replica_pids()) < 2:
        assert time.monotonic() < deadline, "two decoder replicas did not start"
        time.sleep(0.5)
    victim = _replica_pids()[0]
    outcomes: list[tuple[float, float, str]] = []
    streams: list[str] = []
    done = threading.Event()

    def ask(i: int) -> None:
        mine = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)
        while not done.is_set():
            started = time.monotonic()
            try:
                reply = mine.completions.create(
                    model="poison", prompt=clean_prompts[i % len(clean_prompts)], max_tokens=tokens, temperature=0
                )
                outcomes.append(
                    (started, time.monotonic(), "ok" if reply.usage.completion_tokens == tokens else "short")
                )
            except Exception as exc:
                outcomes.append((started, time.monotonic(), repr(exc)[:300]))

    def stream() -> None:  # a stream that already sent tokens may end with an error event, in OpenAI's shape
        body = {"model": "poison", "prompt": "a long stream", "max_tokens": 400, "temperature": 0, "stream": True}
        while not done.is_set():
            with httpx.stream("POST", f"{server.base_url}/completions", json=body, headers=AUTH, timeout=120) as r:
                lines = [ln for ln in r.iter_lines() if ln]
            last = lines[-1][6:] if lines else ""
            streams.append("done" if last == "[DONE]" else json.loads(last)["error"]["type"])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)] + [threading.Thread(target=stream)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    time.sleep(8.0)
    done.set()
    for thread in threads:
        thread.join(180)
    failed = [o for o in outcomes if o[2] != "ok"]
    assert outcomes and not failed, failed[:5]
    assert sum(s < killed < e for s, e, _ in outcomes) >= 4, "too few requests were in flight at the kill"
    assert streams and set(streams) <= {"done", "server_error"}, streams


def test_sigterm_answers_503_with_retry_after_while_streams_finish(server: OpenAIServer) -> None:
    """The module's last test: it stops the server."""
    body = {"model": "poison", "prompt": "the last stream", "max_tokens": 450, "temperature": 0, "stream": True}
    lines: list[str] = []
    opened = threading.Event()

    def last_stream() -> None:
        with httpx.stream("POST", f"{server.base_url}/completions", json=body, headers=AUTH, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    opened.set()

    thread = threading.Thread(target=last_stream)
    thread.start()
    assert opened.wait(60)
    os.kill(server.proc.pid, signal.SIGTERM)
    seen: list[tuple] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            reply = httpx.get(f"{server.base_url}/models", headers=AUTH, timeout=10)
        except httpx.TransportError:
            break
        seen.append((reply.status_code, reply.headers.get("retry-after")))
        if reply.status_code == 503:
            assert _error(reply)["code"] == "unavailable"
        time.sleep(0.02)
    thread.join(120)
    assert (503, "1") in seen and set(seen) <= {(200, None), (503, "1")}, sorted(set(seen))
    assert lines and lines[-1] == "data: [DONE]"  # the stream in flight at SIGTERM finished
    server.proc.wait(90)
