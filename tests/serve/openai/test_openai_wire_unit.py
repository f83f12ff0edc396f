"""serve.openai.wire: every field of a request is one the endpoint reads, one that changes no answer, or a
400 naming it; a field OpenAI's API does not have (another server's sampling parameter) is refused, not
ignored."""

from __future__ import annotations

import json

import pytest

from ortpilot.serve.openai.wire import ApiError, parse_request

BASE = {
    "completion": {"model": "m", "prompt": "x"},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
}


def _refusal(kind: str, **fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_request(kind, json.dumps({**BASE[kind], **fields}).encode())
    return info.value


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("name, value", [("repetition_penalty", 1.2), ("top_k", 40), ("min_p", 0.1), ("typo", None)])
def test_unknown_parameters_are_refused_naming_them(kind, name, value):
    error = _refusal(kind, **{name: value})
    assert error.status == 400 and error.code == "unsupported" and error.param == name
    assert f"'{name}' is not a parameter of /v1/" in error.message and "temperature" in error.message


def test_the_refusal_names_an_odd_field_escaped_and_the_endpoint():
    error = _refusal("completion", **{"max_completion_tokens": 4})  # chat's field, not a completions one
    assert error.param == "max_completion_tokens" and "/v1/completions" in error.message
    odd = _refusal("chat", **{"\x1b[31mred": 1})
    assert "\x1b" not in odd.message and "\\x1b[31mred" in odd.message and "/v1/chat/completions" in odd.message


@pytest.mark.parametrize(
    "kind, fields",
    [
        ("completion", {"user": "u", "max_tokens": 3, "temperature": 0, "top_p": 1, "n": 1, "stop": ["."], "seed": 1}),
        ("completion", {"stream": True, "stream_options": {"include_usage": True}}),
        ("chat", {"max_completion_tokens": 3, "metadata": {"a": "b"}, "store": False, "service_tier": "auto"}),
        ("chat", {"tool_choice": "none", "parallel_tool_calls": True, "modalities": ["text"], "user": "u"}),
    ],
)
def test_openais_fields_that_change_no_answer_are_taken(kind, fields):
    request = parse_request(kind, json.dumps({**BASE[kind], **fields}).encode())
    assert request.model == "m" and request.kind == kind


@pytest.mark.parametrize(
    "name, value", [("tool_choice", "required"), ("modalities", ["text", "audio"]), ("reasoning_effort", "high")]
)
def test_chat_fields_that_would_change_the_answer_are_refused_unless_off(name, value):
    error = _refusal("chat", **{name: value})
    assert error.param == name and error.code == "unsupported" and "not supported by this server" in error.message
