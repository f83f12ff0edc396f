"""``ortpilot serve`` of text models with the real clients: the ``openai`` client's ``embeddings.create`` (float and
base64) and ``models.list``, ``tritonclient`` with BYTES inputs (HTTP binary and JSON, gRPC), /v1/rerank and
/v1/classify, a tuned profile of the sentence encoder, sentences of different lengths batched together (each
vector equal to ``ortpilot.embed`` of that sentence alone), every bad input with its status and message, and
the text batching in /metrics.

One server for the module, joined to the session's Ray instance: the three built-in text folders, a tune of
the sentence encoder (calibrated on real sentences) and the demo MLP (a model without a tokenizer).
"""

from __future__ import annotations

import base64
import json
import struct
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")
openai = pytest.importorskip("openai")

from serve_procs import free_port, routed

import ortpilot
from ortpilot.data import real_data
from ortpilot.models import text_folder

SENTENCES = [
    "the cat sat on the mat",
    "hi",
    "where is the nearest train station",
    "onnx runtime runs the model fast on the cpu while the server answers every request from every client",
    "a dog runs fast",
    "rain all day and the match was on monday",
]
LONG = "onnx runtime runs the model fast on the cpu while the server answers every request " * 12  # > 128 tokens
MAX_TEXTS = 16


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-text")
    return {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank", "classify")}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, folders) -> Path:
    """A real tune of the sentence-encoder folder, calibrated and gated on real sentences (its OUTDIR)."""
    root = tmp_path_factory.mktemp("serve-text-tune")
    pairs = [f"{SENTENCES[i % 6]} {SENTENCES[(i + 1) % 6]}".split() for i in range(64)]
    lines = [" ".join(words[: 3 + (i * 5) % 17]) for i, words in enumerate(pairs)]  # 3 to 19 words
    text = root / "sentences.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ortpilot.tune(
        str(folders["embed"]),
        str(root / "out"),
        12,
        calibration=real_data(text=text, folder=folders["embed"]),
        quantize=False,  # what is served is a profile of the folder, whichever candidate won
    )
    return root / "out"


@pytest.fixture(scope="module")
def server(start_module_server, ray_address, folders, tuned, demo_paths):
    names = ["embed", "rerank", "classify", "tuned", "mlp"]
    targets = [str(folders["embed"]), str(folders["rerank"]), str(folders["classify"]), str(tuned), "demo:mlp"]
    args = [*targets, *[a for n in names for a in ("--name", n)], "--address", ray_address]
    grpc_port = free_port()
    args += ["--max-texts", str(MAX_TEXTS), "--max-request-tokens", "2000", "--batch-wait-ms", "20"]
    srv = start_module_server(*args, "--grpc-port", str(grpc_port))
    assert srv.ready and len(srv.ready) == 5, srv.stderr[-3000:]
    srv.grpc_port = grpc_port
    return srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="unused", max_retries=0)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _alone(folder: Path, texts: list[str]) -> np.ndarray:
    """Each text embedded on its own, in-process: the vectors a batched server must reproduce."""
    model = ortpilot.text_model(folder)
    return np.concatenate([model.embed([t]) for t in texts])


def _post(server, path: str, doc) -> tuple[int, dict]:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    req = urllib.request.Request(f"http://{server.url}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_openai_client_embeds_as_ortpilot_embed_does_float_and_base64(server, client, folders):
    alone = _alone(folders["embed"], SENTENCES)
    for fmt in ("float", "base64"):  # asked for base64, the client hands the text over as it came
        answer = client.embeddings.create(model="embed", input=SENTENCES, encoding_format=fmt)
        rows = [
            d.embedding if fmt == "float" else np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in answer.data
        ]
        got = np.array(rows, np.float32)
        assert got.shape == (6, 128) and [d.index for d in answer.data] == list(range(6))
        assert (_cosines(got, alone) > 0.9999).all()
    default = client.embeddings.create(model="embed", input="the cat sat on the mat")  # base64, decoded by the client
    assert _cosines(np.array([default.data[0].embedding]), alone[:1])[0] > 0.9999
    tokens = ortpilot.text_model(folders["embed"])(SENTENCES).tokens
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(tokens)
    own = openai.OpenAI(base_url=f"http://{server.url}/v2/models/embed/v1", api_key="unused", max_retries=0)
    direct = own.embeddings.create(model="embed", input=SENTENCES[:2])  # the model's own route: one hop
    assert (_cosines(np.array([d.embedding for d in direct.data], np.float32), alone[:2]) > 0.9999).all()


def test_models_list_names_the_text_models_and_the_ready_lines_their_endpoints(server, client):
    assert sorted(m.id for m in client.models.list()) == ["classify", "embed", "rerank", "tuned"]
    lines = {line.split(":")[0]: line for line in server.ready}
    assert lines["embed"].endswith("; text: POST /v1/embeddings or KServe v2 BYTES input 'text'")
    assert lines["rerank"].endswith("; text: POST /v1/rerank or KServe v2 BYTES inputs 'query' and 'text'")
    assert "text:" not in lines["mlp"]


def test_sentences_of_different_lengths_batched_together_keep_their_own_vectors(server, client, folders):
    """Concurrent requests of every length (and lists mixing short and long) share runs, padded to the
    longest: each vector equals the one of its sentence embedded alone."""
    texts = SENTENCES + [s + " " + s for s in SENTENCES] + ["hi there"] * 2
    alone = _alone(folders["embed"], texts)
    requests = [texts[i : i + 1] for i in range(len(texts))] + [texts[:8], texts[4:]]

    def embed(batch: list[str]) -> np.ndarray:
        answer = client.embeddings.create(model="embed", input=batch, encoding_format="float")
        return np.array([d.embedding for d in answer.data], np.float32)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(embed, requests))
    for batch, got in zip(requests, results):
        expected = np.concatenate([alone[texts.index(t) : texts.index(t) + 1] for t in batch])
        assert (_cosines(got, expected) > 0.9999).all(), batch


def test_a_tuned_profile_embeds_as_its_folder_does(client, folders, tuned):
    answer = client.embeddings.create(model="tuned", input=SENTENCES, encoding_format="float")
    got = np.array([d.embedding for d in answer.data], np.float32)
    assert (_cosines(got, ortpilot.embed(str(folders["embed"]), SENTENCES)) > 0.99).all()  # the tune's gate
    assert (_cosines(got, ortpilot.embed(str(tuned), SENTENCES)) > 0.9999).all()  # the profile in-process


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_http_bytes_input_returns_the_embedding_tensor(server, folders, binary):
    client = th.InferenceServerClient(server.url)
    text = th.InferInput("text", [len(SENTENCES), 1], "BYTES")
    text.set_data_from_numpy(np.array([[s.encode()] for s in SENTENCES], dtype=object), binary_data=binary)
    result = client.infer("embed", [text])
    vectors = result.as_numpy("embedding")
    assert vectors.shape == (6, 128) and vectors.dtype == np.float32
    assert (_cosines(vectors, _alone(folders["embed"], SENTENCES)) > 0.9999).all()
    assert result.as_numpy("truncated").tolist() == [False] * 6 and result.as_numpy("tokens").dtype == np.int64


def test_tritonclient_grpc_bytes_input(server, folders):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    text = grpcclient.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES[:2]], dtype=object))
    result = routed(lambda: client.infer("embed", [text]))  # relayed by name: several models are served
    assert (_cosines(result.as_numpy("embedding"), _alone(folders["embed"], SENTENCES[:2])) > 0.9999).all()


def test_haproxy_reloads_its_routes_when_asked_and_every_grpc_route_answers_after(server, ray_address):
    """What readiness does when a model answers over HTTP but HAProxy missed its gRPC route
    (``proxyroutes.reload_routes``): run from another driver of the same Ray, it reloads the one HAProxy
    manager, and each model still answers ``ModelReady`` by its ``application`` afterwards."""
    import subprocess
    import sys

    from serve_procs import cli_env

    from ortpilot.serve.oip.grpc_service import model_ready

    code = (
        f"from ortpilot.rayenv import ray_environment; ray_environment({ray_address!r})\n"
        f"import ray; ray.init(address={ray_address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "from ortpilot.serve.proxyroutes import reload_routes; print(reload_routes())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "1", done.stderr[-2000:]
    address = f"127.0.0.1:{server.grpc_port}"
    for name in ("embed", "rerank", "classify", "tuned", "mlp"):
        deadline = time.monotonic() + 30
        while not model_ready(address, name, {"application": name}) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert model_ready(address, name, {"application": name}), name


def test_rerank_and_classify_answer_in_the_shape_embedding_servers_use(server, folders):
    docs = SENTENCES[:4]
    status, doc = _post(server, "/v1/rerank", {"model": "rerank", "query": "where is the cat", "documents": docs})
    scores = ortpilot.rerank(str(folders["rerank"]), "where is the cat", docs)
    assert status == 200 and doc["object"] == "rerank" and len(doc["results"]) == 4
    assert [r["index"] for r in doc["results"]] == [int(i) for i in np.argsort(-scores, kind="stable")]
    assert doc["results"][0]["relevance_score"] == pytest.approx(float(scores.max()), abs=1e-4)
    status, doc = _post(server, "/v1/classify", {"model": "classify", "input": ["great", "awful day"]})
    expected = ortpilot.classify(str(folders["classify"]), ["great", "awful day"])
    assert status == 200 and [row[0]["label"] for row in doc["data"]] == [label for label, _ in expected]


def test_text_requests_to_v1_take_one_hop_to_the_model_the_body_names(server):
    """HAProxy hands a /v1 request naming a text model to that model's replica, on its own route: the replica's
    access line has the model's path (Ray's log monitor forwards it to the server's stderr a moment later); the
    ready lines say so. A model without text keeps the server-wide answer."""
    assert "/v1 text requests go straight to the replicas of the model they name (embed, rerank, classify, tuned)" in (
        server.ingress
    )
    status, _ = _post(server, "/v1/rerank", {"model": "rerank", "query": "q", "documents": ["one hop"]})
    assert status == 200
    deadline = time.monotonic() + 20
    while '"POST /v2/models/rerank/v1/rerank" 200' not in server.stderr and time.monotonic() < deadline:
        time.sleep(0.2)
    assert '"POST /v2/models/rerank/v1/rerank" 200' in server.stderr
    status, doc = _post(server, "/v1/embeddings", {"model": "mlp", "input": "x"})
    assert status == 400 and "takes no text" in doc["error"]["message"]


def test_a_text_over_the_models_limit_is_cut_and_the_answer_says_so(server):
    status, doc = _post(server, "/v1/embeddings", {"model": "embed", "input": ["hi", LONG]})
    assert status == 200 and doc["truncated"] == [1]


@pytest.mark.parametrize(
    ("path", "doc", "status", "words"),
    [
        ("/v1/embeddings", {"model": "embed", "input": ["a", ""]}, 400, "Item 1 of the input texts is empty"),
        (
            "/v1/embeddings",
            {"model": "embed", "input": ["a", 5]},
            400,
            "Item 1 of the input texts is a number, not a string",
        ),
        ("/v1/embeddings", {"model": "embed", "input": 5}, 400, "must be a string or a list of strings, not a number"),
        ("/v1/embeddings", {"model": "embed", "input": [[1, 2]]}, 400, "holds token ids"),
        ("/v1/embeddings", {"model": "embed", "input": "a", "dimensions": 32}, 400, "does not support shortening"),
        ("/v1/embeddings", {"model": "nope", "input": "a"}, 404, "The model 'nope' does not exist"),
        (
            "/v1/embeddings",
            {"model": "mlp", "input": "a"},
            400,
            "Model 'mlp' takes no text: model 'mlp' is served from",
        ),
        (
            "/v1/embeddings",
            {"model": "embed", "input": ["a"] * (MAX_TEXTS + 1)},
            413,
            "at most 16 per request (--max-texts)",
        ),
        ("/v1/embeddings", {"model": "embed", "input": [LONG] * 16}, 413, "over this server's limit of 2000 tokens"),
        ("/v1/rerank", {"model": "embed", "query": "q", "documents": ["d"]}, 400, "is a sentence encoder"),
        ("/v1/classify", {"model": "classify", "input": "a", "top_k": 2}, 400, "does not take 'top_k'"),
    ],
)
def test_bad_text_requests_get_their_status_and_a_message_naming_the_problem(server, path, doc, status, words):
    got, answer = _post(server, path, doc)
    assert got == status and words in answer["error"]["message"], answer


def test_bad_bytes_and_text_for_a_model_without_a_tokenizer_over_kserve(server):
    blob = struct.pack("<I", 2) + b"ok" + struct.pack("<I", 2) + b"\xff\xfe"
    head = json.dumps(
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}]}
    ).encode()
    req = urllib.request.Request(
        f"http://{server.url}/v2/models/embed/infer",
        data=head + blob,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert (
        refused.value.code == 400
        and "Item 1 of the texts of input 'text' is not UTF-8" in refused.value.read().decode()
    )
    client = th.InferenceServerClient(server.url)
    text = th.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi"], dtype=object))
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="takes no text: model 'mlp' is served from a model file"):
        client.infer("mlp", [text])
    with pytest.raises(openai.BadRequestError, match="takes no text"):
        openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="x", max_retries=0).embeddings.create(
            model="mlp", input="hi"
        )


def test_the_tensor_api_of_a_text_model_stays(server):
    client = th.InferenceServerClient(server.url)
    inputs = []
    for name, values in (
        ("input_ids", [[2, 10, 11, 3]]),
        ("attention_mask", [[1, 1, 1, 1]]),
        ("token_type_ids", [[0] * 4]),
    ):
        item = th.InferInput(name, [1, 4], "INT64")
        item.set_data_from_numpy(np.array(values, np.int64))
        inputs.append(item)
    assert client.infer("embed", inputs).as_numpy("last_hidden_state").shape == (1, 4, 128)


def test_metrics_show_text_batches_their_fill_and_tokens(server, client):
    client.embeddings.create(model="embed", input=["hi", "where is the nearest train station"])
    deadline, text = time.monotonic() + 15, ""
    while time.monotonic() < deadline:  # replicas report on their heartbeat
        with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        if 'ortpilot_text_tokens_total{kind="padded",model="embed"}' in text:
            break
        time.sleep(0.5)
    lines = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("ortpilot_")
    }
    real = lines['ortpilot_text_tokens_total{kind="real",model="embed"}']
    padded = lines['ortpilot_text_tokens_total{kind="padded",model="embed"}']
    assert 0 < real < padded  # "hi" beside a longer sentence was padded
    assert lines['ortpilot_text_run_fill_count{model="embed"}'] >= 1
    assert lines['ortpilot_text_batch_requests_count{model="embed"}'] >= 1
    assert lines['ortpilot_requests_total{code="200",model="embed"}'] >= 1
    assert not any('model="mlp"' in key for key in lines if key.startswith("ortpilot_text"))


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff\xfe{not json", "not valid JSON"),
        (b'{"model": "embed", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}", ""),
        (b'{"model": "embed", "input": "a lone surrogate \\ud800 here"}', ""),
        (b'{"model": "embed", "input": ["ok", "\\udfff"]}', ""),
    ],
    ids=["bytes", "nested", "surrogate", "surrogate-in-list"],
)
def test_hostile_bodies_on_the_text_route_get_a_4xx_in_openais_shape_never_a_5xx(server, body, words):
    """What a hostile client sends to /v1/embeddings: bytes that are not JSON, a 5,000-deep list, and strings that
    JSON allows but UTF-8 cannot hold (lone surrogates, which a tokenizer cannot take)."""
    got, answer = _post(server, "/v1/embeddings", body)
    assert 400 <= got < 500, (got, answer)
    assert answer["error"]["message"] and words in answer["error"]["message"], answer
