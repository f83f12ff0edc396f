"""serve.oip.textroutes without Ray: a text model's replica answering /v2/models/NAME/v1/... and KServe v2 BYTES
infer (JSON, binary, gRPC), the server-wide application's /v1/... relayed to it through a local handle, the
tensor API unchanged, and text sent to a model that takes none, all on real sessions of the demo folders."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from unit_requests import GrpcContext, body, request

import ortpilot
from ortpilot.models import text_folder
from ortpilot.serve.oip.app import replica_config
from ortpilot.serve.oip.grpc_codec import messages
from ortpilot.serve.oip.replica import ModelReplica
from ortpilot.serve.oip.server import ServerApp
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions, resolve_models
from ortpilot.serve.textfacts import text_facts

TEXTS = ["the cat sat on the mat", "hi", "where is the nearest train station"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("textroutes")
    return {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank", "classify")}


def _replica(target: str, name: str) -> ModelReplica:
    (spec,) = resolve_models([target], [name])
    return ModelReplica(spec, replica_config(spec, ServeOptions(access_log=False), ServerOptions(), 1.0, None))


@pytest.fixture(scope="module")
def replicas(folders, demo_paths) -> dict[str, ModelReplica]:
    made = {kind: _replica(str(folder), kind) for kind, folder in folders.items()}
    made["mlp"] = _replica(str(demo_paths["mlp"]), "mlp")
    return made


def _call(replica, method: str, path: str, doc=None, headers=None):
    response = asyncio.run(replica(request(method, path, doc, headers)))
    return response.status_code, body(response)


def test_embeddings_on_the_models_own_route_equal_ortpilot_embed(replicas, folders):
    reference = ortpilot.embed(str(folders["embed"]), TEXTS)
    status, doc = _call(replicas["embed"], "POST", "/v2/models/embed/v1/embeddings", {"input": TEXTS})
    assert status == 200 and doc["object"] == "list" and doc["model"] == "embed" and doc["truncated"] == []
    vectors = np.array([d["embedding"] for d in doc["data"]], np.float32)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    assert [d["index"] for d in doc["data"]] == [0, 1, 2]
    assert (
        doc["usage"]["prompt_tokens"]
        == doc["usage"]["total_tokens"]
        == sum(ortpilot.text_model(str(folders["embed"]))(TEXTS).tokens)
    )
    status, doc = _call(
        replicas["embed"], "POST", "/v2/models/embed/v1/embeddings", {"input": "hi", "encoding_format": "base64"}
    )
    decoded = np.frombuffer(base64.b64decode(doc["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, reference[1], atol=1e-5)


@pytest.mark.parametrize(
    ("doc", "status", "param", "words"),
    [
        ({"input": ["a", ""]}, 400, "input", "Item 1 of the input texts is empty or only whitespace"),
        ({"input": ["a", 3]}, 400, "input", "Item 1 of the input texts is a number, not a string"),
        ({"input": [1, 2, 3]}, 400, "input", "holds token ids"),
        ({"input": [[1, 2], [3]]}, 400, "input", "holds token ids"),
        ({"input": ["a", ["b"]]}, 400, "input", "Item 1 of the input texts is a list, not a string"),
        ({"input": {"a": 1}}, 400, "input", "must be a string or a list of strings, not an object"),
        ({"input": "a", "dimensions": 64}, 400, "dimensions", "gives 128-dimensional vectors"),
        ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format", "'float' or 'base64'"),
        ({"input": "a", "repetition_penalty": 1}, 400, "repetition_penalty", "does not take 'repetition_penalty'"),
        (
            {"input": "a", "model": "other"},
            400,
            "model",
            "This route belongs to model 'embed', and the body names 'other'",
        ),
    ],
)
def test_bad_embedding_requests_are_400_in_openais_shape(replicas, doc, status, param, words):
    got, answer = _call(replicas["embed"], "POST", "/v2/models/embed/v1/embeddings", doc)
    error = answer["error"]
    assert got == status and error["param"] == param and words in error["message"], error


def test_a_body_that_is_not_json_and_a_wrong_route_are_answered_in_openais_shape(replicas):
    for raw in (b'{"input": "\xff"}', b'{"input": "a\\ud800"}'):  # not UTF-8; a lone surrogate (orjson refuses it)
        got, answer = _call(replicas["embed"], "POST", "/v2/models/embed/v1/embeddings", raw)
        message = answer["error"]["message"]
        assert got == 400 and ("not valid JSON" in message or "lone surrogate" in message), message
        if raw.startswith(b'{"input": "\xff'):  # the body's encoding is named, at its byte
            assert "it is not UTF-8: byte 11 (0xff)" in message, message
    got, answer = _call(replicas["embed"], "POST", "/v2/models/embed/v1/rerank", {"query": "q", "documents": ["d"]})
    assert got == 400 and "is a sentence encoder: it answers POST /v1/embeddings" in answer["error"]["message"]
    got, answer = _call(replicas["embed"], "GET", "/v2/models/embed/v1/embeddings")
    assert got == 405 and answer["error"]["code"] == "method_not_allowed"
    got, answer = _call(replicas["embed"], "GET", "/v2/models/embed/v1/models")
    assert got == 200 and [m["id"] for m in answer["data"]] == ["embed"]


def test_rerank_and_classify_answer_in_infinitys_shape(replicas, folders):
    docs = ["the cat sat on the mat", "where is the train station", "a dog"]
    scores = ortpilot.rerank(str(folders["rerank"]), "where is the cat", docs)
    status, doc = _call(
        replicas["rerank"],
        "POST",
        "/v2/models/rerank/v1/rerank",
        {"query": "where is the cat", "documents": docs, "top_n": 2, "return_documents": True},
    )
    assert status == 200 and doc["object"] == "rerank" and len(doc["results"]) == 2
    best = int(np.argmax(scores))
    assert doc["results"][0]["index"] == best and doc["results"][0]["document"] == docs[best]
    assert doc["results"][0]["relevance_score"] == pytest.approx(float(scores[best]), abs=1e-5)
    status, doc = _call(replicas["classify"], "POST", "/v2/models/classify/v1/classify", {"input": ["great", "awful"]})
    assert status == 200 and doc["object"] == "classify" and len(doc["data"]) == 2
    labels = ortpilot.classify(str(folders["classify"]), ["great", "awful"])
    assert [row[0]["label"] for row in doc["data"]] == [label for label, _ in labels]
    assert sum(entry["score"] for entry in doc["data"][0]) == pytest.approx(1.0, abs=1e-5)


def test_kserve_bytes_inputs_json_binary_and_grpc_give_the_embedding_tensor(replicas, folders):
    reference = ortpilot.embed(str(folders["embed"]), TEXTS)
    infer = {"inputs": [{"name": "text", "shape": [3, 1], "datatype": "BYTES", "data": TEXTS}]}
    status, doc = _call(replicas["embed"], "POST", "/v2/models/embed/infer", infer)
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert status == 200 and outputs["embedding"]["shape"] == [3, 128] and outputs["embedding"]["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(outputs["embedding"]["data"], np.float32).reshape(3, 128), reference, atol=1e-5)
    assert outputs["truncated"]["data"] == [False] * 3 and outputs["tokens"]["datatype"] == "INT64"
    blob = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in TEXTS)
    head = json.dumps(
        {
            "inputs": [
                {"name": "text", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
            ],
            "outputs": [{"name": "embedding"}],
        }
    ).encode()
    response = asyncio.run(
        replicas["embed"](
            request("POST", "/v2/models/embed/infer", head + blob, {"inference-header-content-length": str(len(head))})
        )
    )
    assert response.status_code == 200 and [o["name"] for o in body(response)["outputs"]] == ["embedding"]
    pb = messages()
    call = pb.ModelInferRequest(model_name="embed", id="g1")
    call.inputs.add(name="text", datatype="BYTES", shape=[3])
    call.raw_input_contents.append(blob)
    context = GrpcContext()
    answer = asyncio.run(replicas["embed"].ModelInfer(call, context))
    assert context.code is None and list(answer.outputs[0].shape) == [3, 128]
    np.testing.assert_allclose(
        np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(3, 128), reference, atol=1e-5
    )


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ([{"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}], "send [N] or [N, 1]"),
        (
            [{"name": "sentence", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
            "takes 'text' (BYTES [N] or [N, 1])",
        ),
        (
            [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", 3]}],
            "element 1 is a number: BYTES elements are strings",
        ),
        ([{"name": "text", "shape": [1], "datatype": "BYTES", "data": [""]}], "empty or only whitespace"),
    ],
)
def test_bad_bytes_inputs_are_400_naming_what_the_model_takes(replicas, inputs, words):
    status, doc = _call(replicas["embed"], "POST", "/v2/models/embed/infer", {"inputs": inputs})
    assert status == 400 and words in doc["error"], doc


def test_non_utf8_bytes_are_refused_by_index(replicas):
    blob = struct.pack("<I", 2) + b"ok" + struct.pack("<I", 2) + b"\xff\xfe"
    head = json.dumps(
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}]}
    ).encode()
    response = asyncio.run(
        replicas["embed"](
            request("POST", "/v2/models/embed/infer", head + blob, {"inference-header-content-length": str(len(head))})
        )
    )
    assert response.status_code == 400 and "Item 1 of the texts of input 'text' is not UTF-8" in body(response)["error"]


def test_the_tensor_api_stays_and_a_model_without_a_tokenizer_says_what_is_missing(replicas):
    ids = {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [2, 10, 11, 3]}
    mask = {"name": "attention_mask", "shape": [1, 4], "datatype": "INT64", "data": [1, 1, 1, 1]}
    types = {"name": "token_type_ids", "shape": [1, 4], "datatype": "INT64", "data": [0, 0, 0, 0]}
    status, doc = _call(replicas["embed"], "POST", "/v2/models/embed/infer", {"inputs": [ids, mask, types]})
    assert status == 200 and doc["outputs"][0]["name"] == "last_hidden_state"
    text = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    status, doc = _call(replicas["mlp"], "POST", "/v2/models/mlp/infer", text)
    assert status == 400 and "Model 'mlp' takes no text: model 'mlp' is served from a model file" in doc["error"]
    meta = _call(replicas["mlp"], "GET", "/v2/models/mlp")[1]
    assert "text" not in meta["ortpilot"]  # a tensor model's metadata is as before
    for method, path in (("POST", "/v2/models/mlp/v1/embeddings"), ("GET", "/v2/models/mlp/v1/models")):
        status, doc = _call(replicas["mlp"], method, path, {"input": "hi"} if method == "POST" else None)
        assert status == 400 and doc["error"]["code"] == "model_not_text", doc  # OpenAI's shape, not a bare 404
        assert "takes no text" in doc["error"]["message"] and "/v2/models/mlp/infer" in doc["error"]["message"]
    meta = _call(replicas["embed"], "GET", "/v2/models/embed")[1]["ortpilot"]["text"]
    assert meta["kind"] == "embed" and meta["dim"] == 128 and meta["outputs"][0]["shape"] == [-1, 128]


class _Handle:
    """A Serve handle's ``text_answer`` calling a replica in this process (awaitable, cancellable)."""

    def __init__(self, replica: ModelReplica) -> None:
        self.replica = replica

    @property
    def text_answer(self):
        replica = self.replica

        class _Method:
            @staticmethod
            def remote(req, context):
                return asyncio.ensure_future(replica.text_answer(req, context))

        return _Method


@pytest.fixture
def server(replicas, folders, demo_paths) -> ServerApp:
    specs = [*resolve_models([str(folders["embed"]), str(folders["rerank"])], ["embed", "rerank"])]
    specs.append(ModelSpec("mlp", "model", str(demo_paths["mlp"]), "demo:mlp"))
    app = ServerApp(
        {s.name: s.name for s in specs},
        ServerOptions().requests(ServeOptions(access_log=False)),
        {s.name: text_facts(s) for s in specs},
    )
    app._handles = {name: _Handle(replicas[name]) for name in ("embed", "rerank", "mlp")}
    return app


def test_the_server_wide_v1_routes_relay_to_the_model_the_body_names(server, folders):
    status, doc = _call(server, "POST", "/v1/embeddings", {"model": "embed", "input": TEXTS})
    assert status == 200 and len(doc["data"]) == 3
    np.testing.assert_allclose(
        np.array([d["embedding"] for d in doc["data"]], np.float32),
        ortpilot.embed(str(folders["embed"]), TEXTS),
        atol=1e-5,
    )
    status, doc = _call(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in doc["data"]] == ["embed", "rerank"]  # text models only
    assert doc["data"][1]["ortpilot"] == {"task": "rerank", "endpoint": "POST /v1/rerank"}


@pytest.mark.parametrize(
    ("path", "doc", "status", "words"),
    [
        (
            "/v1/embeddings",
            {"model": "nope", "input": "a"},
            404,
            "The model 'nope' does not exist; this server has embed, rerank",
        ),
        (
            "/v1/embeddings",
            {"model": "mlp", "input": "a"},
            400,
            "Model 'mlp' takes no text: model 'mlp' is served from a model file",
        ),
        ("/v1/embeddings", {"model": "rerank", "input": "a"}, 400, "is a cross-encoder: it answers POST /v1/rerank"),
        ("/v1/rerank", {"model": "rerank", "query": "q", "documents": "d"}, 400, "must be a list of strings"),
        ("/v1/embeddings", {"input": "a"}, 400, "must name its model"),
        ("/v1/chat/completions", {"model": "embed"}, 404, "No route POST /v1/chat/completions"),
    ],
)
def test_the_server_wide_routes_refuse_in_openais_shape(server, path, doc, status, words):
    got, answer = _call(server, "POST", path, doc)
    assert got == status and words in answer["error"]["message"], answer


def test_relayed_requests_are_counted_under_their_model(server):
    _call(server, "POST", "/v1/embeddings", {"model": "embed", "input": "a"})
    _call(server, "POST", "/v1/embeddings", {"model": "mlp", "input": "a"})
    assert server.metrics.local_requests("embed").codes == {"200": 1}
    assert server.metrics.local_requests("mlp").codes == {"400": 1}


def test_the_replicas_text_batching_reaches_metrics_through_its_heartbeat(replicas):
    from ortpilot.serve.oip.metrics import Heartbeat, ServeMetrics

    replica = replicas["embed"]
    _call(replica, "POST", "/v2/models/embed/v1/embeddings", {"input": ["hi", "where is the nearest train station"]})
    counts = replica.text.counts.snapshot()
    metrics = ServeMetrics(["embed", "mlp"])
    metrics.report(Heartbeat("embed", "r1", replica.info, text=counts))
    metrics.report(Heartbeat("mlp", "r2", replicas["mlp"].info))
    text = metrics.render()[0].decode()
    assert f'ortpilot_text_tokens_total{{kind="real",model="embed"}} {float(counts.tokens)}' in text
    assert f'ortpilot_text_tokens_total{{kind="padded",model="embed"}} {float(counts.padded)}' in text
    assert counts.padded > counts.tokens  # "hi" was padded to the longer sentence in one run
    assert f'ortpilot_text_run_fill_count{{model="embed"}} {float(counts.runs)}' in text
    assert 'ortpilot_text_batch_requests_bucket{le="+Inf",model="embed"}' in text
    assert 'model="mlp"' not in "".join(line for line in text.splitlines() if line.startswith("ortpilot_text"))
