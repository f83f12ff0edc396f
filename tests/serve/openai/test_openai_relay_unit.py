"""serve.openai.relay: a generation whose replica went away before its first token runs again on
another (the retry rule of serve.defaults), a full deployment is a 429, and the answer is shaped from
the real demo decoder's events through an in-process handle."""

from __future__ import annotations

import asyncio

import pytest
from local_handle import LocalHandle, _Events

from ortpilot.serve.defaults import REPLICA_RETRIES
from ortpilot.serve.openai.decoder import DecoderReplica
from ortpilot.serve.openai.relay import Relay
from ortpilot.serve.openai.spec import prepare_decoder
from ortpilot.serve.openai.wire import ApiError, GenerationRequest
from ortpilot.serve.options import DecoderOptions


class ReplicaUnavailableError(Exception):
    """Named like Ray Serve's: a replica that went away (``http.replica_gone``)."""


class BackPressureError(Exception):
    """Named like Ray Serve's: every replica is at its max ongoing requests."""


class _Failing:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise self.error

    def cancel(self) -> None:
        pass


class FlakyHandle(LocalHandle):
    """The first ``failures`` calls fail with ``error`` before their first event, the rest reach the replica."""

    def __init__(self, replica, error: Exception, failures: int) -> None:
        super().__init__(replica)
        self.error, self.failures, self.calls = error, failures, 0

    @property
    def generate(self):
        def call(request, context=None):
            self.calls += 1
            if self.calls <= self.failures:
                return _Failing(self.error)
            return _Events(self.replica.generate(request, context))

        return type("Method", (), {"remote": staticmethod(call)})()


@pytest.fixture(scope="module")
def replica():
    replica = DecoderReplica(prepare_decoder("demo:decoder", "d", DecoderOptions(max_streams=2, max_length=64)), 1)
    yield replica
    replica.close()


REQUEST = GenerationRequest("completion", "d", prompt="hi", max_tokens=3)


def test_a_replica_gone_before_the_first_token_is_replaced(replica):
    handle = FlakyHandle(replica, ReplicaUnavailableError("gone"), REPLICA_RETRIES)
    reply = asyncio.run(Relay({"d": handle}).answer(REQUEST))
    assert reply.status == 200 and handle.calls == REPLICA_RETRIES + 1, reply.body


class DeploymentUnavailableError(Exception):
    """Named like Ray Serve's: the deployment has no replica at all (starting, or every one of them gone)."""


@pytest.mark.parametrize("error", [ReplicaUnavailableError("gone"), DeploymentUnavailableError("none")])
def test_past_the_retries_a_model_with_no_replica_to_take_it_is_503_with_retry_after(replica, error):
    # not the request's fault, and it may succeed in a moment: it was a 500 (an "internal error") before
    handle = FlakyHandle(replica, error, REPLICA_RETRIES + 1)
    with pytest.raises(ApiError) as info:
        asyncio.run(Relay({"d": handle}).answer(REQUEST))
    assert info.value.status == 503 and info.value.code == "unavailable" and handle.calls == REPLICA_RETRIES + 1
    assert info.value.reply().headers == {"Retry-After": "1"} and "No replica of 'd'" in str(info.value)


def test_a_full_deployment_is_429_with_retry_after(replica):
    handle = FlakyHandle(replica, BackPressureError("full"), 1)
    with pytest.raises(ApiError) as info:
        asyncio.run(Relay({"d": handle}).answer(REQUEST))
    assert info.value.status == 429 and info.value.reply().headers == {"Retry-After": "1"}
    assert handle.calls == 1  # not retried: the deployment said it is full


def test_an_unknown_model_is_404(replica):
    with pytest.raises(ApiError) as info:
        asyncio.run(Relay({"d": LocalHandle(replica)}).answer(GenerationRequest("completion", "x", prompt="hi")))
    assert info.value.status == 404 and info.value.code == "model_not_found"


class _StartThenGone:
    """A replica's events that give ``start``, then (once the request's deadline passed) die."""

    def __init__(self, context) -> None:
        self.context, self.sent = context, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        from ortpilot.serve.openai.wire import START, DecodeEvent

        if not self.sent:
            self.sent = True
            return DecodeEvent(START, prompt_tokens=2)
        while not self.context.expired:
            await asyncio.sleep(0.02)
        raise ReplicaUnavailableError("gone")

    def cancel(self) -> None:
        pass


def test_a_stream_whose_replica_died_before_its_text_and_whose_deadline_passed_ends_with_a_504_event(replica):
    import json

    from ortpilot.serve.context import request_context
    from ortpilot.serve.records import RequestSettings

    class Handle(LocalHandle):
        @property
        def generate(self):
            return type("Method", (), {"remote": staticmethod(lambda request, context: _StartThenGone(context))})()

    context = request_context({"x-request-timeout": "2"}, RequestSettings(), "openai", "d")
    streamed = GenerationRequest("completion", "d", prompt="hi", max_tokens=3, stream=True)

    async def main():
        reply = await Relay({"d": Handle(replica)}).answer(streamed, context)
        return reply.status, [chunk async for chunk in reply.stream]

    status, chunks = asyncio.run(main())
    error = json.loads(chunks[-1].decode().removeprefix("data: "))["error"]
    assert status == 200 and error["code"] == "timeout" and "deadline of 2 s" in error["message"], chunks
