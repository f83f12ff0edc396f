"""serve.oip.textrunner on real sessions of the demo text folders, without Ray: the request limits (texts per
request, tokens per text cut or refused, tokens per request) with their statuses and messages, bad texts,
the cross-encoder's query, the warm-up's embedding width, and a missed deadline."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ortpilot.errors import UsageError
from ortpilot.models import text_folder
from ortpilot.serve.context import DeadlineExceeded, RequestContext
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.oip.textrunner import TextRefused, TextRunner, text_model
from ortpilot.serve.options import ServeOptions, TextOptions, resolve_models
from ortpilot.serve.textfacts import text_facts
from ortpilot.session import load

LONG = "onnx runtime runs the model fast on the cpu while the server answers every request " * 12  # > 128 tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("textrunner")
    return {kind: text_folder(root / kind, kind) for kind in ("embed", "rerank")}


def _runner(folder: Path, **options) -> TextRunner:
    (spec,) = resolve_models([str(folder)])
    facts = text_facts(spec)
    text = TextOptions(**options)
    model = text_model(spec, load(spec.path, ["cpu"], "strict"), facts, text)
    return TextRunner(model, text, ThreadPoolExecutor(1), name=spec.name)


def _context(timeout: float = 30.0) -> RequestContext:
    return RequestContext("unit", OIP, time.time() + timeout, timeout, "m")


def _answer(runner: TextRunner, texts, **kw):
    return asyncio.run(runner.answer(texts, kw.pop("context", None) or _context(), **kw))


def test_the_runner_embeds_as_the_folder_does_and_measures_its_width(folders):
    import ortpilot

    runner = _runner(folders["embed"])
    assert runner.dim == 128 and runner.limit == 128
    got = _answer(runner, ["the cat sat on the mat", b"a dog runs fast", LONG])  # bytes are UTF-8 text too
    assert got.truncated == (False, False, True) and got.tokens[2] == 128
    np.testing.assert_allclose(
        got.values,
        ortpilot.embed(str(folders["embed"]), ["the cat sat on the mat", "a dog runs fast", LONG]),
        atol=1e-5,
    )
    assert runner.counts.snapshot().batches == 1 and runner.counts.snapshot().tokens == sum(got.tokens)


@pytest.mark.parametrize(
    ("options", "texts", "status", "words"),
    [
        ({"max_texts": 2}, ["a", "b", "c"], 413, "has 3 texts in 'input'; this server takes at most 2 per request"),
        ({"truncate": False}, ["fine", LONG], 400, "Text 1 (254 tokens) of 'input' is over this server's limit of 128"),
        ({"max_text_tokens": 8, "truncate": False}, ["the cat sat on the mat today"], 400, "limit of 8 tokens"),
        (
            {"max_request_tokens": 20},
            ["the cat sat on the mat"] * 3,
            413,
            "make 24 tokens, over this server's limit of 20",
        ),
        ({}, ["ok", b"\xff\xfe"], 400, "Item 1 of the input texts is not UTF-8"),
        ({}, ["ok", "   "], 400, "Item 1 of the input texts is empty or only whitespace"),
        ({}, ["ok", 7], 400, "Item 1 of the input texts is a number, not a string"),
    ],
)
def test_limits_and_bad_texts_are_refused_naming_the_limit_and_the_value(folders, options, texts, status, words):
    runner = _runner(folders["embed"], **options)
    with pytest.raises(TextRefused) as refused:
        _answer(runner, texts)
    assert refused.value.status == status and words in refused.value.message, refused.value.message
    assert refused.value.param == "input"


def test_a_server_that_refuses_long_texts_counts_no_megabyte_and_reads_spaced_words_whole(folders):
    """Under --no-truncate a 10 MB text was tokenized whole on the event loop only to print its count (12 s, every
    other request waiting); it is refused by the limit instead. A short text after 13,000 spaces is 6 tokens:
    the server took it as cut at [CLS] [SEP] (another text's vector) and refused it under --no-truncate."""
    runner = _runner(folders["embed"], truncate=False)
    with pytest.raises(TextRefused) as refused:
        _answer(runner, ["fine", "ab " * 200_000])
    assert "Text 1 (over 128 tokens) of 'input'" in refused.value.message, refused.value.message
    spaced = " " * 13_000 + "the cat sat on the mat"
    got = _answer(runner, [spaced])
    assert got.truncated == (False,) and got.tokens == (8,)
    np.testing.assert_allclose(got.values, _answer(runner, ["the cat sat on the mat"]).values, atol=1e-6)


def test_model_metadata_says_the_token_limit_the_server_cuts_at(folders):
    from dataclasses import replace

    from ortpilot.serve.options import resolve_models

    runner = _runner(folders["embed"], max_text_tokens=64)
    (spec,) = resolve_models([str(folders["embed"])])
    public = replace(text_facts(spec), dim=runner.dim).public_dict(runner.limit)
    assert public["max_tokens"] == 64 and "64 tokens" in public["task"], public


def test_a_lower_max_text_tokens_cuts_texts_sooner_and_says_so(folders):
    runner = _runner(folders["embed"], max_text_tokens=8)
    got = _answer(runner, ["the cat sat on the mat today", "hi"])
    assert got.tokens == (8, 4) and got.truncated == (True, False)  # "hi": 4 tokens, [CLS] and [SEP] included


def test_the_cross_encoder_scores_documents_against_the_query(folders):
    import ortpilot

    runner = _runner(folders["rerank"])
    assert runner.dim is None and runner.kind == "rerank"
    docs = ["the cat sat on the mat", "where is the train station"]
    got = _answer(runner, docs, query="where is the cat")
    np.testing.assert_allclose(got.values, ortpilot.rerank(str(folders["rerank"]), "where is the cat", docs), atol=1e-6)
    with pytest.raises(TextRefused, match="Item 0 of the query is empty"):
        _answer(runner, docs, query=" ")


def test_a_request_past_its_deadline_is_a_deadline_exceeded(folders):
    runner = _runner(folders["embed"])
    with pytest.raises(DeadlineExceeded):
        _answer(runner, ["the cat"], context=RequestContext("late", OIP, time.time() - 1, 1.0, "m"))


def test_text_options_are_checked_as_they_are_made():
    with pytest.raises(UsageError, match="--max-text-tokens must be an integer of at least 2"):
        TextOptions(max_text_tokens=1)
    with pytest.raises(UsageError, match="--text-batch must be an integer of at least 1"):
        ServeOptions(text={"batch": 0})
    options = ServeOptions(text={"batch": 8, "truncate": False})
    assert ServeOptions.from_dict(options.to_dict()) == options and options.text.flags() == [
        "--text-batch",
        "--no-truncate",
    ]
