"""``ortpilot serve`` for decoders: the ``openai`` client as the real client, streaming included.

Greedy text from the server equals ``ortpilot generate``'s for the same prompt; concurrent streams
each get their single-stream text; bad input gets OpenAI's error shape; a full queue gets 429
with Retry-After; a client that disconnects frees its slot within one step.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from listeners import tree_ports
from openai_procs import OpenAIServer, client_modules
from serve_procs import Server, free_port

openai, httpx = client_modules()

from ortpilot.cli.main import cli
from ortpilot.decode.text import chatml
from ortpilot.models import demo_tokenizer_path, make_decoder

PROMPTS = [
    "Hi",
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived",
    "ortpilot serves decoders behind the API every LLM client already speaks: " * 3,
]


def _generate(model: str, prompt: str, new: int, *extra: str) -> dict:
    result = CliRunner().invoke(
        cli, ["generate", model, "--prompt", prompt, "--max-new-tokens", str(new), "--json", *extra]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def demo_server(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAIServer]:
    server = OpenAIServer(
        ["demo:decoder", "--max-streams", "4", "--max-queue", "4", "--max-length", "512"],
        ray_address,
        tmp_path_factory.mktemp("serve") / "demo.err",
    )
    yield server
    assert server.stop() == 0, server.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def client(demo_server: OpenAIServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=demo_server.base_url, api_key="unused", max_retries=0, timeout=60)


def test_ready_line_and_models(demo_server: OpenAIServer, client: openai.OpenAI) -> None:
    assert demo_server.ready[0].startswith("decoder: 1 replica ready on CPUExecutionProvider")
    assert [m.id for m in client.models.list().data] == ["decoder"]
    info = httpx.get(f"{demo_server.base_url}/models/decoder").json()
    assert info["object"] == "model" and info["ortpilot"]["max_streams"] == 4
    assert info["ortpilot"]["chat_template"] == "tokenizer"  # the demo tokenizer's ChatML template
    assert "GroupQueryAttention" in info["ortpilot"]["notes"][0]  # fused before it was served


def test_completion_text_equals_generate(client: openai.OpenAI) -> None:
    reference = _generate("demo:decoder", PROMPTS[2], 24)
    reply = client.completions.create(model="decoder", prompt=PROMPTS[2], max_tokens=24, temperature=0)
    choice = reply.choices[0]
    assert choice.text == reference["text"] and choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == reference["prompt_length"] == len(PROMPTS[2].encode())
    assert reply.usage.completion_tokens == 24 and reply.object == "text_completion"
    # Streamed, the same text arrives in pieces.
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model="decoder", prompt=PROMPTS[2], max_tokens=24, temperature=0, stream=True
        )
    ]
    assert "".join(pieces) == reference["text"] and len(pieces) > 1


def test_streamed_chat_equals_single_stream(client: openai.OpenAI) -> None:
    from tokenizers import Tokenizer

    from ortpilot.decode import Generator
    from ortpilot.passes.decoder_fusion import fuse_decoder

    fused_decoder = fuse_decoder(make_decoder()).model
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is ONNX?"}]
    tok = Tokenizer.from_file(str(demo_tokenizer_path()))
    ids = tok.encode(chatml(messages), add_special_tokens=False).ids
    expected = tok.decode(Generator(fused_decoder).generate(ids, 20).tokens[0])
    chunks = list(
        client.chat.completions.create(
            model="decoder",
            messages=messages,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == 20
    reply = client.chat.completions.create(model="decoder", messages=messages, max_tokens=20, temperature=0)
    assert reply.choices[0].message.content == expected and reply.object == "chat.completion"


def test_raw_stream_ends_with_done(demo_server: OpenAIServer) -> None:
    body = {"model": "decoder", "prompt": "abc", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{demo_server.base_url}/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_four_concurrent_streams_each_equal_their_single_stream(client: openai.OpenAI) -> None:
    new = [40, 25, 30, 35]
    references = [_generate("demo:decoder", p, n)["text"] for p, n in zip(PROMPTS, new)]
    results: dict[int, str] = {}
    barrier = threading.Barrier(len(PROMPTS))

    def ask(i: int) -> None:
        barrier.wait()
        stream = client.completions.create(
            model="decoder", prompt=PROMPTS[i], max_tokens=new[i], temperature=0, stream=True
        )
        results[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results.get(i) for i in range(len(PROMPTS))] == references
    assert len(set(references)) == len(references)


def test_stop_strings_and_seeds(client: openai.OpenAI) -> None:
    full = client.completions.create(model="decoder", prompt=PROMPTS[1], max_tokens=30, temperature=0).choices[0].text
    stop = full[10:12]
    cut = client.completions.create(model="decoder", prompt=PROMPTS[1], max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="decoder", prompt=PROMPTS[1], max_tokens=30, temperature=0, stop=stop, stream=True
        )
    )
    assert streamed == cut.choices[0].text

    def sampled(seed: int) -> str:
        return (
            client.completions.create(
                model="decoder", prompt=PROMPTS[1], max_tokens=30, temperature=1.0, top_p=0.9, seed=seed
            )
            .choices[0]
            .text
        )

    assert sampled(5) == sampled(5) != sampled(6)


@pytest.mark.parametrize(
    "path, body, status, code, words",
    [
        ("/completions", {"model": "nope", "prompt": "x"}, 404, "model_not_found", "does not exist"),
        ("/completions", {"model": "decoder", "prompt": "x", "max_tokens": 0}, 400, "invalid_value", "at least 1"),
        (
            "/completions",
            {"model": "decoder", "prompt": "x", "max_tokens": 600},
            400,
            "context_length_exceeded",
            "prompt has 1 tokens and a stream holds 512, so at most 511",
        ),
        (
            "/completions",
            {"model": "decoder", "prompt": "y" * 600},
            400,
            "context_length_exceeded",
            "The prompt has 600 tokens, but a stream of this server holds 512",
        ),
        ("/chat/completions", {"model": "decoder", "messages": "hello"}, 400, "invalid_value", "non-empty list"),
        (
            "/chat/completions",
            {"model": "decoder", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "invalid_value",
            "is not one of system",
        ),
        (
            "/chat/completions",
            {"model": "decoder", "messages": [{"role": "user"}]},
            400,
            "invalid_type",
            "content must be a string",
        ),
        ("/completions", {"model": "decoder", "prompt": "x", "n": 2}, 400, "unsupported", "one choice"),
        ("/completions", {"model": "decoder", "prompt": "x", "temperature": 3}, 400, "invalid_value", "from 0 to 2"),
        (
            "/completions",
            {"model": "decoder", "prompt": "x", "stream": True, "max_tokens": -1},
            400,
            "invalid_value",
            "at least 1",
        ),
    ],
)
def test_bad_input_gets_openai_errors(
    demo_server: OpenAIServer, path: str, body: dict, status: int, code: str, words: str
) -> None:
    reply = httpx.post(f"{demo_server.base_url}{path}", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["code"] == code and words in error["message"]


def test_bad_json_and_methods(demo_server: OpenAIServer, client: openai.OpenAI) -> None:
    reply = httpx.post(f"{demo_server.base_url}/completions", content=b"{not json", timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"
    assert httpx.get(f"{demo_server.base_url}/completions", timeout=30).status_code == 405
    assert httpx.get(f"{demo_server.base_url}/models/nope", timeout=30).status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "args, words",
    [
        (["/no/such/model.onnx"], "does not exist"),
        (["demo:decoder", "demo:mlp"], "serve them from two `ortpilot serve` processes"),
        (["demo:decoder", "--max-batch", "4"], "--max-batch do(es) not apply to decoders"),
        (["demo:decoder", "--name", "a", "--name", "b"], "--name is given 2 time(s) for 1 model(s)"),
        (["demo:decoder", "--chat-template", "jinja"], "'jinja' is not one of 'auto', 'chatml'"),
        (["demo:decoder", "--max-length", "4096"], "above the model's 2048 positions"),
        (["demo:decoder", "--tokenizer", "/no/tokenizer.json"], "does not exist"),
    ],
)
def test_bad_usage_exits_2_before_ray_starts(args: list[str], words: str) -> None:
    result = CliRunner().invoke(cli, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split()) and "Traceback" not in result.output


def test_taken_port_exits_2() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        result = CliRunner().invoke(cli, ["serve", "demo:decoder", "--port", str(sock.getsockname()[1])])
    assert result.exit_code == 2 and "is not free" in " ".join(result.output.split()), result.output


def _decoder_metrics(server: OpenAIServer) -> dict[str, float]:
    text = httpx.get(f"http://{server.url}/metrics", timeout=30).text
    return {k: float(v) for k, _, v in (ln.rpartition(" ") for ln in text.splitlines() if ln and ln[0] != "#")}


def test_metrics_sum_the_engines_counters_and_count_requests(demo_server: OpenAIServer, client: openai.OpenAI) -> None:
    import time

    from ortpilot.serve.counts import HEARTBEAT_S

    key = 'ortpilot_decode_completion_tokens_total{model="decoder"}'
    deadline = time.monotonic() + 10 * HEARTBEAT_S
    before, settled = _decoder_metrics(demo_server), False
    while not settled and time.monotonic() < deadline:  # the earlier tests' tokens reported, nothing pending
        time.sleep(HEARTBEAT_S * 1.5)
        again = _decoder_metrics(demo_server)
        settled, before = key in before and again.get(key) == before[key], again
    assert settled, "the decoder replica's counters did not settle"
    done = client.completions.create(model="decoder", prompt="Hello there", max_tokens=6, temperature=0)
    assert done.usage.completion_tokens == 6
    deadline = time.monotonic() + 10 * HEARTBEAT_S
    after = _decoder_metrics(demo_server)
    while after.get(key, 0) - before.get(key, 0) < 6 and time.monotonic() < deadline:
        time.sleep(HEARTBEAT_S / 2)
        after = _decoder_metrics(demo_server)
    assert after[key] - before.get(key, 0) == 6
    ok = 'ortpilot_requests_total{code="200",model="decoder"}'
    assert after[ok] - before.get(ok, 0) == 1
    ttft = 'ortpilot_decode_ttft_seconds_count{model="decoder"}'
    assert after[ttft] - before.get(ttft, 0) == 1
    assert after['ortpilot_decode_replicas{model="decoder"}'] == 1
    assert 'ortpilot_decode_prefix_cache_hits_total{model="decoder"}' in after
    assert httpx.get(f"http://{demo_server.url}/v2/health/ready", timeout=30).status_code == 200


def test_nothing_a_decoder_server_starts_listens_beyond_its_host(tmp_path) -> None:
    """Without --address the command starts its own Ray: every TCP listener and bound UDP socket of its
    process tree (Ray, HAProxy, the ingress and both decoder replicas, whose inter-deployment gRPC servers
    Ray binds on every interface) is on 127.0.0.1, the --host."""
    server = Server(
        ["demo:decoder", "--replicas", "2", "--cpus-per-replica", "1", "--no-access-log"],
        free_port(),
        tmp_path / "serve.err",
    )
    try:
        assert server.ready and server.ready[0].startswith("decoder: 2 replicas ready"), server.stderr[-3000:]
        ports = tree_ports(server.proc.pid)
        assert server.port in {port for _p, _a, port in ports}, ports
        wide = [(proto, address, port) for proto, address, port in ports if address != "127.0.0.1"]
        assert not wide, wide
    finally:
        code = server.stop()
    assert code == 0, server.log.read_text(errors="replace")[-3000:]


def test_the_request_id_comes_back_and_a_generation_past_its_deadline_is_504(demo_server: OpenAIServer) -> None:
    body = {"model": "decoder", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    ok = httpx.post(f"{demo_server.base_url}/completions", json=body, headers={"X-Request-Id": "gen-1"}, timeout=60)
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "gen-1"
    late = httpx.post(
        f"{demo_server.base_url}/completions", json=body, headers={"X-Request-Timeout": "0.000001"}, timeout=60
    )
    error = late.json()["error"]
    assert late.status_code == 504 and error["code"] == "timeout" and error["type"] == "server_error", error
    assert "within its deadline of 1e-06 s" in error["message"] and late.headers["x-request-id"]
