"""A decoder replica: the engine adapter between the OpenAI wire format and one continuous-batching
scheduler, with a tokenizer and a chat template.

``DecoderReplica`` is the class a Ray Serve deployment wraps (nothing here imports Ray): its
constructor loads the (GroupQueryAttention-fused) decoder strictly on the CPU with ORT's
intra-op threads set to the replica's CPUs and starts one :class:`~ortpilot.decode.Scheduler`;
``generate`` turns a checked OpenAI request into tokens and yields ``DecodeEvent`` records
(``start`` once the engine made the first token, ``delta`` text, ``end`` with the finish reason and
usage, or one ``error``) as the engine makes them. A caller that stops reading (a client gone)
cancels the request, and the scheduler frees its slot before its next step. The request's
``RequestContext`` deadline goes to the scheduler: a request still queued then is never run, and one
whose first token does not come in time is cancelled; both end in one 504 ``error``. What a replica
loads is ``spec`` (checked in the driver, before Ray starts).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ortpilot.errors import QueueFullError, UsageError
from ortpilot.serve.context import DeadlineExceeded, RequestContext, new_request_id
from ortpilot.serve.errorbody import OPENAI
from ortpilot.serve.openai.info import DecoderInfo, EngineSummary, StreamRecord
from ortpilot.serve.openai.spec import DecoderSpec
from ortpilot.serve.openai.wire import (
    DEFAULT_COMPLETION_TOKENS,
    DELTA,
    END,
    START,
    ApiError,
    DecodeEvent,
    GenerationRequest,
    deadline_error,
)
from ortpilot.serve.options import DecoderOptions

log = logging.getLogger("ortpilot")


class DecoderReplica:
    """One batched loop behind the OpenAI endpoints (see the module docstring)."""

    def __init__(self, spec: DecoderSpec | Mapping[str, Any], threads: int = 0) -> None:
        from ortpilot.decode import Scheduler
        from ortpilot.decode import text as textmod
        from ortpilot.session import SessionSettings

        started = time.perf_counter()
        self.spec = spec if isinstance(spec, DecoderSpec) else DecoderSpec.from_dict(spec)
        options = self.spec.options
        self.tokenizer = textmod.load_tokenizer(self.spec.tokenizer)
        self.stop_ids = frozenset(textmod.stop_ids(self.tokenizer))
        self.template = textmod.chat_template(self.spec.tokenizer) if options.chat_template == "auto" else None
        self.scheduler = Scheduler(
            self.spec.model,
            max_streams=options.max_streams,
            max_queue=options.max_queue,
            max_length=options.max_length,
            prefill_chunk=options.prefill_chunk,
            providers=["cpu"],
            policy="strict",
            settings=SessionSettings(intra_op_threads=threads),
            options=options.engine(),
            gate_prompts=self._gate_prompts(options),
        ).start()
        self.threads = threads
        self.recent: deque[StreamRecord] = deque(maxlen=64)
        self.load_s = time.perf_counter() - started
        self.pid = os.getpid()

    def _gate_prompts(self, options: DecoderOptions) -> list[list[int]] | None:
        """Real text for the weight formats' generation gate (only built when there is more than one)."""
        if len(options.formats) < 2:
            return None
        from ortpilot.decode.gate import text_prompts

        return text_prompts(self.spec.tokenizer)

    # Prompts.
    def prompt_text(self, request: GenerationRequest) -> str:
        from ortpilot.decode import text as textmod

        if request.kind == "completion":
            return request.prompt  # type: ignore[return-value]
        if self.template is not None:
            return textmod.render_chat(self.template, request.messages, self.tokenizer)
        if self.spec.options.chat_template == "chatml" or self.tokenizer.token_to_id("<|im_start|>") is not None:
            return textmod.chatml(request.messages)
        raise ApiError(
            400,
            f"The model '{self.spec.name}' has no chat template (no chat_template in its "
            "tokenizer_config.json, no <|im_start|> token); use /v1/completions, or start the server "
            "with --chat-template chatml.",
            param="messages",
            code="no_chat_template",
        )

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if isinstance(request.prompt, list):
            return list(request.prompt)
        ids = self.tokenizer.encode(self.prompt_text(request), add_special_tokens=False).ids
        if not ids:
            raise ApiError(400, "The prompt encodes to no tokens.", param="prompt", code="invalid_value")
        return list(ids)

    def max_tokens(self, request: GenerationRequest, prompt_tokens: int) -> int:
        room = self.scheduler.max_length - prompt_tokens
        if request.max_tokens is not None:
            return request.max_tokens
        return min(room, DEFAULT_COMPLETION_TOKENS) if request.kind == "completion" else room

    # Requests.
    def check_room(self, request: GenerationRequest, ids: list[int]) -> int:
        """The request's max_tokens once its prompt and answer fit a stream; a 400 naming the limit otherwise."""
        length = self.scheduler.max_length
        if len(ids) >= length:
            limit = self.scheduler.generator.signature.max_positions
            model = f" and the model {limit} positions" if limit else ""
            raise ApiError(
                400,
                f"The prompt has {len(ids)} tokens, but a stream of this server holds "
                f"{length} (--max-length){model}; shorten the prompt.",
                param="messages" if request.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        max_tokens, room = self.max_tokens(request, len(ids)), length - len(ids)
        if max_tokens > room:
            raise ApiError(
                400,
                f"max_tokens {max_tokens} is above the limit: the prompt has {len(ids)} tokens "
                f"and a stream holds {length}, so at most {room} more.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return max_tokens

    def submit(
        self, request: GenerationRequest, tokens: asyncio.Queue, context: RequestContext | None = None
    ) -> tuple[list[int], Any]:
        """(prompt ids, the scheduler's stream) for a checked request; each token the engine makes lands
        in ``tokens`` (None at the end); the engine admits it only before ``context``'s deadline. Raises
        ApiError for what the client must change."""
        from ortpilot.decode import SamplingConfig

        loop = asyncio.get_running_loop()
        ids = self.prompt_ids(request)
        max_tokens = self.check_room(request, ids)
        sampling = SamplingConfig(temperature=request.temperature, top_p=request.top_p, seed=request.seed)
        deadline = None  # the context's, on this process's monotonic clock (the engine's)
        if context is not None and context.deadline is not None:
            deadline = time.monotonic() + context.remaining_s()
        try:
            return ids, self.scheduler.submit(
                ids,
                max_tokens,
                sampling=sampling,
                stop_tokens=sorted(self.stop_ids),
                on_token=lambda _s, t: loop.call_soon_threadsafe(tokens.put_nowait, t),
                deadline=deadline,
            )
        except QueueFullError as exc:
            raise ApiError(
                429, str(exc), kind="rate_limit_error", code="rate_limit_exceeded", retry_after_s=exc.retry_after_s
            ) from None
        except UsageError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from None

    async def generate(
        self, request: GenerationRequest | Mapping[str, Any], context: RequestContext | None = None
    ) -> AsyncIterator[DecodeEvent]:
        """Events for one request: ``start`` (once its first token is made, before ``context``'s deadline),
        ``delta`` (text), ``end``; or a single ``error`` (504 when the deadline came first)."""
        if not isinstance(request, GenerationRequest):
            request = GenerationRequest.from_dict(request)
        context = context or RequestContext(new_request_id(), OPENAI, None, model=request.model)
        tokens: asyncio.Queue[int | None] = asyncio.Queue()
        try:
            ids, stream = self.submit(request, tokens, context)
        except ApiError as exc:
            yield exc.to_event()
            return
        from ortpilot.decode.text import TextStream

        text = TextStream(self.tokenizer, request.stop, self.stop_ids)
        try:
            try:
                first = await context.within(tokens.get())  # the engine admitted it and made a token
            except DeadlineExceeded:
                first = None
            if first is None and (stream.stop_reason == "deadline" or context.expired):
                raise deadline_error(context)
            yield DecodeEvent(START, prompt_tokens=len(ids))
            async for event in self._deltas(text, stream, tokens, first, context.request_id):
                yield event
            yield DecodeEvent(
                END,
                finish_reason="stop_string" if text.stopped else stream.stop_reason or "max_new_tokens",
                prompt_tokens=len(ids),
                completion_tokens=len(stream.tokens),
            )
        except ApiError as exc:
            yield exc.to_event()
        finally:
            if not stream.done:
                stream.cancel()  # the caller went away: free the slot before the next step
            self._record(stream)

    async def _deltas(
        self, text: Any, stream: Any, tokens: asyncio.Queue, first: int | None, ident: str | None = None
    ) -> AsyncIterator[DecodeEvent]:
        """``delta`` events of the stream's ``text`` as its tokens arrive (``first`` already taken), up to
        the end or a stop string (which cancels the stream). A failed engine step is an ApiError (500) naming the
        request id."""
        ended, pending = False, [first]
        while not ended:
            batch = pending or [await tokens.get()]
            pending = []
            while not tokens.empty():  # a slow reader gets what piled up in one delta
                batch.append(tokens.get_nowait())
            delta = ""
            for token in batch:
                if token is None:
                    ended = True
                    break
                delta += text.push(token)
                if text.stopped:
                    stream.cancel()
                    ended = True
                    break
            if ended and not text.stopped:
                delta += text.finish()
            if delta:
                yield DecodeEvent(DELTA, text=delta)
        if stream.error is not None and not text.stopped:  # this stream's alone: the others decode on
            from ortpilot.serve.http import internal_error
            from ortpilot.serve.ortmessage import clean_ort_message

            logged = internal_error(f"stream {stream.id} of '{self.spec.name}'", stream.error, ident)
            raise ApiError(
                500, f"generation failed: {clean_ort_message(str(stream.error))}; {logged}", kind="server_error"
            )

    def _record(self, stream: Any) -> None:
        async def later() -> None:  # the engine retires a cancelled stream at its next step
            for _ in range(200):
                if stream.done:
                    break
                await asyncio.sleep(0.01)
            self.recent.append(StreamRecord.of(stream))

        asyncio.get_running_loop().create_task(later())

    def describe(self) -> DecoderInfo:
        """What this replica loaded and runs with (``GET /v1/models/NAME``; the ingress calls it across Ray)."""
        sig = self.scheduler.generator.signature
        return DecoderInfo(
            name=self.spec.name,
            source=self.spec.source,
            pid=self.pid,
            intra_op_threads=self.threads,
            load_s=round(self.load_s, 3),
            max_positions=sig.max_positions,
            chat_template="tokenizer" if self.template is not None else self.spec.options.chat_template,
            notes=tuple(self.spec.notes),
            engine=EngineSummary.from_dict(self.scheduler.stats()),
            recent=tuple(self.recent),
        )

    def close(self) -> None:
        self.scheduler.close()


__all__ = ["DecoderReplica"]
