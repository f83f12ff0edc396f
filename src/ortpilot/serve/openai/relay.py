"""A generation relayed to a decoder replica: a streaming handle call, run again on another replica when
its replica dies before the first token (a stream that already sent tokens ends with an error event),
and its events shaped into one JSON answer or server-sent events ending in ``data: [DONE]``.

When a client goes away, Ray cancels the ingress's request and its handle call; the replica's
generator cancels the stream, and the scheduler frees the slot before its next step. The request's
``RequestContext`` goes to the replica with it: a streamed answer must start (its first token) before
the deadline, a whole answer must be complete by then; past it the relay cancels the call and the
pipeline answers 504 (the replica, which has the deadline too, never runs a request that expired in its
queue).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from ortpilot.serve.context import DeadlineExceeded, RequestContext, new_request_id
from ortpilot.serve.defaults import REPLICA_RETRIES, retry_delay_s
from ortpilot.serve.errorbody import OPENAI
from ortpilot.serve.http import Reply, replica_gone
from ortpilot.serve.openai.wire import (
    DELTA,
    END,
    ERROR,
    RESTART,
    ROUTE_PREFIX,
    ApiError,
    DecodeEvent,
    GenerationRequest,
    chunk_body,
    completion_body,
    deadline_error,
    finish_reason,
    json_answer,
    new_id,
    not_found,
    now,
    sse,
    usage,
)

log = logging.getLogger("ortpilot")


def unavailable(model: str) -> ApiError:
    """503 + Retry-After for a model none of whose replicas can take a call now (starting, restarting, or all
    of them gone): not the request's fault, and it may succeed in a moment (it was a 500)."""
    return ApiError(
        503,
        f"No replica of '{model}' can take the request now (starting, restarting or draining); retry.",
        kind="server_error",
        code="unavailable",
        retry_after_s=1,
    )


class Relay:
    """Generations to the decoder deployments behind ``handles`` (model name -> Serve handle)."""

    def __init__(self, handles: Mapping[str, Any]) -> None:
        self.handles = handles

    async def open(self, req: GenerationRequest, context: RequestContext) -> tuple[DecodeEvent, Any]:
        """(the replica's first event, its event stream), on another replica when the first one died first;
        ``DeadlineExceeded`` (the call cancelled) when the first event does not come before the deadline."""
        handle = self.handles.get(req.model)
        if handle is None:
            raise not_found(req.model, list(self.handles))
        for attempt in range(REPLICA_RETRIES + 1):
            events = handle.options(stream=True).generate.remote(req, context)
            try:
                return await context.within(events.__anext__()), events
            except DeadlineExceeded:
                events.cancel()
                raise
            except StopAsyncIteration:
                raise ApiError(
                    500, "the decoder replica ended the request without an answer", kind="server_error"
                ) from None
            except Exception as exc:
                if type(exc).__name__ == "BackPressureError":
                    raise ApiError(
                        429,
                        f"Every replica of '{req.model}' is at its limit; retry later.",
                        kind="rate_limit_error",
                        code="rate_limit_exceeded",
                        retry_after_s=1,
                    ) from None
                if not replica_gone(exc):
                    raise
                if attempt == REPLICA_RETRIES:
                    raise unavailable(req.model) from None
                log.warning("A replica of '%s' went away before answering; retrying on another.", req.model)
                await asyncio.sleep(retry_delay_s(attempt))
        raise AssertionError("unreachable")

    async def events(
        self, req: GenerationRequest, context: RequestContext, events: Any, restart: bool
    ) -> AsyncIterator[DecodeEvent]:
        """The events after the first. A replica that dies before the first ``delta`` (or, with ``restart``,
        at any point: a request nothing was sent for yet) is replaced by a new run on another replica; then a
        ``restart`` event tells the caller to forget what it collected."""
        retries, sent = 0, False
        try:
            while True:
                try:
                    async for event in events:
                        sent = sent or event.type == DELTA
                        yield event
                    return
                except Exception as exc:
                    if not replica_gone(exc) or retries >= REPLICA_RETRIES or (sent and not restart):
                        raise
                    retries += 1
                    log.warning("A replica of '%s' died during a request; running it again on another.", req.model)
                    first, events = await self.open(req, context)
                    if first.type == ERROR:
                        yield first
                        return
                    sent = False
                    yield DecodeEvent(RESTART)
        finally:
            events.cancel()  # a client gone: the replica cancels its stream (a no-op after the end)

    async def answer(
        self,
        req: GenerationRequest,
        context: RequestContext | None = None,
        on_stream_end: Callable[[], None] = lambda: None,
    ) -> Reply:
        """One JSON answer, or (``stream``) server-sent events ending in ``data: [DONE]``; ``on_stream_end``
        runs once a stream's last chunk went out or its client went away. ``DeadlineExceeded`` when the
        answer (a stream: its first token) does not come before ``context``'s deadline (None: no deadline)."""
        context = context or RequestContext(new_request_id(), OPENAI, None, model=req.model)
        first, events = await self.open(req, context)
        if first.type == ERROR:
            return ApiError.from_event(first).reply()
        ident, created = new_id(req.kind), now()
        if req.stream:
            stream = self._sse(req, context, ident, created, first, events, on_stream_end)
            return Reply(200, b"", "text/event-stream", {"Cache-Control": "no-cache"}, stream=stream)
        return await context.within(self._whole(req, context, ident, created, events))

    async def _whole(
        self, req: GenerationRequest, context: RequestContext, ident: str, created: int, events: Any
    ) -> Reply:
        """The JSON answer of a request that is not streamed, from its events after the first."""
        parts, end = [], None
        async with aclosing(self.events(req, context, events, restart=True)) as stream:
            async for event in stream:
                if event.type == RESTART:
                    parts, end = [], None
                elif event.type == DELTA:
                    parts.append(event.text)
                elif event.type == END:
                    end = event
                elif event.type == ERROR:
                    return ApiError.from_event(event).reply()
        if end is None:
            raise ApiError(500, "the decoder replica ended the request without an answer", kind="server_error")
        return json_answer(
            200,
            completion_body(
                req,
                ident,
                created,
                "".join(parts),
                finish_reason(end.finish_reason),
                usage(end.prompt_tokens, end.completion_tokens),
            ),
        )

    async def _sse(
        self,
        req: GenerationRequest,
        context: RequestContext,
        ident: str,
        created: int,
        first: DecodeEvent,
        events: Any,
        on_end: Callable[[], None],
    ) -> AsyncIterator[bytes]:
        stream = self.events(req, context, events, restart=False)
        try:
            if req.kind == "chat":
                yield sse(chunk_body(req, ident, created, None, first=True))
            async for event in stream:
                if event.type == DELTA:
                    yield sse(chunk_body(req, ident, created, event.text))
                elif event.type == END:
                    yield sse(chunk_body(req, ident, created, None, finish_reason(event.finish_reason)))
                    if req.include_usage:
                        yield sse(
                            chunk_body(
                                req,
                                ident,
                                created,
                                None,
                                counts=usage(event.prompt_tokens, event.completion_tokens),
                            )
                        )
                elif event.type == ERROR:
                    yield sse(ApiError.from_event(event).body())
                    return
            yield sse("[DONE]")
        except DeadlineExceeded:  # its replica died before its first text and no other started it in time
            yield sse(deadline_error(context).body())
        except Exception as exc:  # the replica died after tokens were sent: the stream ends with an error event
            from ortpilot.serve.http import internal_error

            gone = replica_gone(exc)
            message = (
                "The replica generating this stream went away after it had sent tokens; send the request again."
                if gone
                else internal_error(f"stream {ROUTE_PREFIX} {req.kind}", exc, context.request_id)
            )
            yield sse(ApiError(503 if gone else 500, message, kind="server_error").body())
        finally:
            await stream.aclose()  # cancels the replica's stream (a no-op after the end)
            on_end()


__all__ = ["Relay", "unavailable"]
