"""serve.context: the record the pipeline hands every route. Its id comes from X-Request-Id (or is made),
its deadline from the request timeout; an id the server cannot take is refused by name."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from ortpilot.serve.context import ContextError, RequestContext, request_context
from ortpilot.serve.errorbody import OIP, OPENAI
from ortpilot.serve.records import RequestSettings

SETTINGS = RequestSettings(request_timeout_s=30)


def test_the_id_is_the_clients_or_a_new_one_and_the_deadline_the_request_timeout():
    given = request_context({"x-request-id": "abc-123"}, SETTINGS, OIP, "m", now=1000.0)
    assert given == RequestContext("abc-123", OIP, 1030.0, 30.0, "m")
    made = [request_context({}, SETTINGS, OPENAI, now=0.0) for _ in range(2)]
    assert made[0].request_id != made[1].request_id and len(made[0].request_id) == 16
    assert made[0].deadline == 30.0 and made[0].model is None and made[0].protocol == OPENAI


@pytest.mark.parametrize(
    "headers, words",
    [
        ({"x-request-id": "has space"}, "X-Request-Id 'has space' is not a request id"),
        ({"x-request-id": "x" * 129}, "1 to 128 visible ASCII"),
        ({"x-request-id": "caf\xe9"}, "'caf\\xe9'"),
    ],
)
def test_values_the_server_cannot_take_are_refused_by_name(headers, words):
    with pytest.raises(ContextError, match=re.escape(words)) as info:
        request_context(headers, SETTINGS, OIP)
    assert info.value.header in headers


def test_the_record_is_frozen_and_plain():
    context = request_context({}, SETTINGS, OPENAI, now=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.deadline = 1.0  # type: ignore[misc]
    assert RequestContext.from_dict(context.to_dict()) == context
    assert context.for_model("d").model == "d" and context.model is None
    assert context.expired  # its deadline, 30 s after the epoch, is long gone
    free = RequestContext("r", OIP, None)
    assert free.remaining_s() == math.inf and not free.expired
