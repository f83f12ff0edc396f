"""serve.context: the record the pipeline hands every route. Its id comes from X-Request-Id (or is made),
its deadline from the request timeout, shortened (never lengthened) by X-Request-Timeout; a value the
server cannot take is refused by name; ``within`` answers DeadlineExceeded and cancels the work."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re

import pytest

from ortpilot.serve.context import ContextError, DeadlineExceeded, RequestContext, request_context
from ortpilot.serve.errorbody import OIP, OPENAI
from ortpilot.serve.records import RequestSettings

SETTINGS = RequestSettings(request_timeout_s=30)


def test_the_id_is_the_clients_or_a_new_one_and_the_deadline_the_request_timeout():
    given = request_context({"x-request-id": "abc-123"}, SETTINGS, OIP, "m", now=1000.0)
    assert given == RequestContext("abc-123", OIP, 1030.0, 30.0, "m")
    made = [request_context({}, SETTINGS, OPENAI, now=0.0) for _ in range(2)]
    assert made[0].request_id != made[1].request_id and len(made[0].request_id) == 16
    assert made[0].deadline == 30.0 and made[0].model is None and made[0].protocol == OPENAI


@pytest.mark.parametrize("asked, timeout", [("2.5", 2.5), (" 0.000001 ", 0.000001), ("30", 30.0), ("600", 30.0)])
def test_a_client_may_shorten_the_deadline_never_lengthen_it(asked, timeout):
    context = request_context({"x-request-timeout": asked}, SETTINGS, OIP, now=100.0)
    assert context.timeout_s == timeout and context.deadline == 100.0 + timeout


@pytest.mark.parametrize(
    "headers, words",
    [
        ({"x-request-timeout": "0"}, "X-Request-Timeout '0' is not a number of seconds above 0"),
        ({"x-request-timeout": "-1"}, "above 0"),
        ({"x-request-timeout": "nan"}, "above 0"),
        ({"x-request-timeout": "inf"}, "above 0"),
        ({"x-request-timeout": "soon"}, "'soon'"),
        ({"x-request-id": "has space"}, "X-Request-Id 'has space' is not a request id"),
        ({"x-request-id": "x" * 129}, "1 to 128 visible ASCII"),
        ({"x-request-id": "caf\xe9"}, "'caf\\xe9'"),
    ],
)
def test_values_the_server_cannot_take_are_refused_by_name(headers, words):
    with pytest.raises(ContextError, match=re.escape(words)) as info:
        request_context(headers, SETTINGS, OIP)
    assert info.value.header in headers


def test_the_record_is_frozen_plain_and_names_its_deadline():
    context = request_context({"x-request-timeout": "5"}, SETTINGS, OPENAI, now=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.deadline = 1.0  # type: ignore[misc]
    assert RequestContext.from_dict(context.to_dict()) == context
    assert context.for_model("d").model == "d" and context.model is None
    assert context.expired and "within its deadline of 5 s" in context.expired_message()
    free = RequestContext("r", OIP, None)
    assert free.remaining_s() == math.inf and not free.expired


def test_within_answers_before_the_deadline_or_cancels_the_work():
    cancelled: list[bool] = []

    async def work(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "done"

    async def main() -> None:
        soon = request_context({"x-request-timeout": "0.05"}, SETTINGS, OIP)
        assert await request_context({}, SETTINGS, OIP).within(work(0)) == "done"
        with pytest.raises(DeadlineExceeded) as info:
            await soon.within(work(3600))  # never finishes by itself: only the deadline ends the wait
        assert info.value.context is soon and cancelled == [True]
        past = RequestContext("r", OIP, 0.0, 1.0)  # a deadline long gone: the work never starts
        coroutine = work(0)
        with pytest.raises(DeadlineExceeded):
            await past.within(coroutine)
        assert coroutine.cr_frame is None  # closed, never run

    asyncio.run(main())
