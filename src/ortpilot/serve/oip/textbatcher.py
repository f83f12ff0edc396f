"""Text requests of every length in one run: the requests that wait while a run is busy share the next one.

The tensor batcher (``batcher``) joins only requests of the same shape, so sentences of different lengths
never share a run. Text requests arrive here tokenized (``TextModel.encode``, on the replica's tokenizer
thread), and the texts themselves are batched: when the run thread is free, the batcher takes the waiting
requests' texts in arrival order, at most ``max_items`` of them (a request whose list does not fit is split:
its rest waits at the front for the next run), and hands them to one ``run`` (``TextModel.run``), which
sorts them by length, cuts runs of at most its ``max_batch`` texts and pads each to its longest text or
its length bucket, with attention mask 0 on the padding. Each request gets its own texts' values back, in
its own order. A joined call that raises runs again request by request, so one request's failure stays its
own. A request whose deadline passes while it waits is not run (``Expired``: its caller answers 504), and
one whose caller went away is left out. ``wait_s`` > 0 holds a short batch that long for more (as the
tensor batcher does); otherwise a batch is what waited while the last run was busy, and a lone request
waits for nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from ortpilot.data.textinput import Tokenized
from ortpilot.serve.oip.batcher import Expired
from ortpilot.session.text import TextRun


@dataclass
class _Waiting:
    """One request in the queue: its tokens, its caller's future, its deadline, and how far it got."""

    tokens: Tokenized
    future: asyncio.Future
    deadline: float | None
    taken: int = 0  # texts handed to runs so far
    filled: int = 0  # texts whose values came back
    values: np.ndarray | None = field(default=None, repr=False)

    def put(self, start: int, values: np.ndarray) -> None:
        """The values of texts ``start``.. of this request; the caller gets them all once every part is back."""
        if self.future.done():
            return
        if self.values is None:
            self.values = np.empty((len(self.tokens), *values.shape[1:]), dtype=values.dtype)
        self.values[start : start + len(values)] = values
        self.filled += len(values)
        if self.filled == len(self.tokens):
            self.future.set_result(self.values)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_result(exc)


Part = tuple[_Waiting, int, int]  # a request and the span of its texts in one batch


class TextBatcher:
    """``await batcher.submit(tokens, deadline)`` -> the values of ``tokens`` (``[n, ...]``, in their order),
    from ``run`` calls that may hold other requests' texts too; ``observe(run, requests)`` sees each call."""

    def __init__(
        self,
        run: Callable[[Tokenized], TextRun],
        executor: Executor,
        max_items: int,
        wait_s: float = 0.0,
        observe: Callable[[TextRun, Tokenized, int], None] | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self.run, self.executor = run, executor
        self.max_items, self.wait_s = max_items, wait_s
        self.observe = observe
        self._waiting: deque[_Waiting] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, tokens: Tokenized, deadline: float | None = None) -> np.ndarray:
        """The values of ``tokens``; ``Expired`` when ``deadline`` (seconds since the epoch) passed before all
        of its texts were run; the exception a run raised for this request alone otherwise."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._work())
        future = loop.create_future()
        self._waiting.append(_Waiting(tokens, future, deadline))
        assert self._arrived is not None
        self._arrived.set()
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def waiting_items(self) -> int:
        return sum(len(w.tokens) - w.taken for w in self._waiting if not w.future.done())

    def _next_batch(self) -> list[Part]:
        """The waiting requests' texts in arrival order, up to ``max_items``: requests whose caller went away
        are dropped, those whose deadline passed get ``Expired``, and a request that does not fit whole is
        split (its rest stays at the front)."""
        now = time.time()
        live: deque[_Waiting] = deque()
        for waiting in self._waiting:
            if waiting.future.done():  # its caller went away (or an earlier part failed)
                continue
            if waiting.deadline is not None and now >= waiting.deadline:
                waiting.fail(Expired())
                continue
            live.append(waiting)
        parts: list[Part] = []
        room = self.max_items
        for waiting in live:
            if room == 0:
                break
            take = min(room, len(waiting.tokens) - waiting.taken)
            parts.append((waiting, waiting.taken, waiting.taken + take))
            waiting.taken += take
            room -= take
        self._waiting = deque(w for w in live if w.taken < len(w.tokens))
        return parts

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._arrived is not None
        while True:
            if not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            if self.wait_s > 0 and self.waiting_items() < self.max_items:
                await asyncio.sleep(self.wait_s)
            parts = self._next_batch()
            if parts:
                await self._run(loop, parts)

    async def _run(self, loop: asyncio.AbstractEventLoop, parts: list[Part]) -> None:
        """One call for every part; when it raises, one call per part, each failure its request's alone."""
        joined = Tokenized.join([w.tokens.part(a, b) for w, a, b in parts])
        try:
            run = await loop.run_in_executor(self.executor, self.run, joined)
        except Exception as exc:
            if len(parts) == 1:  # this request's own failure
                parts[0][0].fail(exc)
                return
            for part in parts:
                await self._run(loop, [part])
            return
        if self.observe is not None:
            self.observe(run, joined, len({id(w) for w, _, _ in parts}))
        offset = 0
        for waiting, start, stop in parts:
            waiting.put(start, run.values[offset : offset + stop - start])
            offset += stop - start


__all__ = ["TextBatcher"]
