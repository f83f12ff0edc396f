"""serve.openaiapi: OpenAI's error answers and model objects, shared by the decoder stack and the text routes."""

from __future__ import annotations

import json
import time

from ortpilot.serve.context import RequestContext
from ortpilot.serve.errorbody import OPENAI
from ortpilot.serve.openai.wire import ApiError as DecoderApiError
from ortpilot.serve.openaiapi import ApiError, OpenAIErrors, model_object


def test_errors_answer_in_openais_shape_and_the_decoder_stack_subclasses_them():
    error = ApiError(429, "busy", kind="rate_limit_error", code="rate_limit_exceeded", retry_after_s=2)
    reply = error.reply("m")
    assert reply.status == 429 and reply.headers == {"Retry-After": "2"} and reply.model == "m"
    assert json.loads(reply.body) == {
        "error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}
    }
    context = RequestContext("r", OPENAI, time.time() - 1, 2.5, "m")
    late = DecoderApiError.expired(context)
    assert isinstance(late, DecoderApiError) and late.status == 504 and "2.5 s" in late.message
    assert OpenAIErrors().failure("x", late, context).status == 504  # a route's ApiError is its own answer
    assert ApiError.unknown_model("x", ["a"]).code == "model_not_found"
    assert model_object("m", 5) == {"id": "m", "object": "model", "created": 5, "owned_by": "ortpilot"}
