"""serve.textwire: OpenAI's /v1/embeddings, Cohere's /v1/rerank (as Infinity serves it) and Infinity's
/v1/classify, parsed into checked records and answered in those shapes, called directly."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from ortpilot.serve.openaiapi import ApiError
from ortpilot.serve.textwire import (
    TextRequest,
    classify_reply,
    embeddings_reply,
    endpoint_kind,
    parse_text_request,
    rerank_reply,
)


def _parse(kind: str, doc, model: str | None = None) -> TextRequest:
    return parse_text_request(kind, json.dumps(doc).encode(), model)


def test_each_endpoint_parses_into_a_record_that_travels():
    embed = _parse("embed", {"model": "m", "input": "one", "encoding_format": "base64", "dimensions": 8, "user": "u"})
    assert embed == TextRequest("embed", "m", ("one",), encoding_format="base64", dimensions=8)
    assert TextRequest.from_dict(json.loads(json.dumps(embed.to_dict()))) == embed
    rerank = _parse("rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1, "return_documents": True}, "m")
    assert rerank.texts == ("a", "b") and rerank.query == "q" and rerank.top_n == 1 and rerank.field == "documents"
    assert _parse("classify", {"model": "m", "input": ["x", "y"], "raw_scores": False}).texts == ("x", "y")
    assert endpoint_kind("/embeddings") == "embed" and endpoint_kind("/completions") is None


def test_a_null_optional_field_reads_as_its_default():
    doc = {"model": "m", "input": "a", "encoding_format": None, "dimensions": None, "user": None}
    embed = _parse("embed", doc)
    assert embed.encoding_format == "float" and embed.dimensions is None


@pytest.mark.parametrize(
    ("kind", "doc", "param", "words"),
    [
        ("embed", [1, 2], None, "must be a JSON object, not a list"),
        ("embed", {"model": "m"}, "input", "has no 'input'"),
        ("embed", {"model": "m", "input": [[1, 2]]}, "input", "holds token ids"),
        ("embed", {"model": "m", "input": []}, "input", "The input texts are an empty list"),
        ("embed", {"model": "m", "input": "a", "dimensions": 0}, "dimensions", "must be a positive integer"),
        ("embed", {"model": 3, "input": "a"}, "model", "must name its model"),
        ("rerank", {"model": "m", "query": "", "documents": ["a"]}, "query", "query is empty"),
        ("rerank", {"model": "m", "documents": ["a"]}, "query", "The request has no 'query'"),
        ("embed", {"model": "m", "input": "a", "encoding_format": True}, "encoding_format", "got true"),
        ("rerank", {"model": "m", "query": "q", "documents": ["a"], "top_n": -1}, "top_n", "positive integer"),
        ("rerank", {"model": "m", "query": "q", "documents": ["a"], "max_tokens_per_doc": 5}, "max_tokens_per_doc", ""),
        ("classify", {"model": "m", "input": "a", "raw_scores": True}, "raw_scores", "only false"),
    ],
)
def test_bad_requests_are_400_naming_the_field(kind, doc, param, words):
    with pytest.raises(ApiError) as refused:
        _parse(kind, doc)
    assert refused.value.status == 400 and refused.value.param == param and words in refused.value.message


def test_answers_in_each_shape_say_usage_and_which_texts_were_cut():
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    embed = TextRequest("embed", "m", ("a", "b"))
    doc = json.loads(embeddings_reply(embed, vectors, (3, 5), (False, True)).body)
    assert doc["usage"] == {"prompt_tokens": 8, "total_tokens": 8} and doc["truncated"] == [1]
    np.testing.assert_allclose([d["embedding"] for d in doc["data"]], vectors, rtol=1e-6)
    b64 = TextRequest("embed", "m", ("a", "b"), encoding_format="base64")
    doc = json.loads(embeddings_reply(b64, vectors, (3, 5), (False, False)).body)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(doc["data"][1]["embedding"]), "<f4"), vectors[1])
    rerank = TextRequest("rerank", "m", ("a", "b", "c"), query="q", top_n=2, return_documents=True)
    doc = json.loads(rerank_reply(rerank, np.array([0.2, 0.9, 0.2], np.float32), (4, 4, 4), (False,) * 3).body)
    assert [r["index"] for r in doc["results"]] == [1, 0] and doc["results"][0]["document"] == "b"
    assert doc["object"] == "rerank" and doc["usage"]["total_tokens"] == 12
    classify = TextRequest("classify", "m", ("x",))
    doc = json.loads(classify_reply(classify, np.array([[0.1, 0.7, 0.2]]), ("neg", "pos", "neu"), (3,), (False,)).body)
    assert [e["label"] for e in doc["data"][0]] == ["pos", "neu", "neg"] and doc["object"] == "classify"
