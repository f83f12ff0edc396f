"""Dynamic batching that costs a lone request nothing: requests that arrive while a run is busy share
the next one.

A timer-based batcher (Ray's ``serve.batch``) holds the first request of a batch for its wait
time even when nothing else comes, which at one client is pure latency. Here one worker runs
the session: when it is free it takes the oldest waiting request and every other waiting one of
the same signature (the same inputs with the same non-batch dims and dtypes), up to
``max_batch``, and runs them as one; under load the queue fills while a run is busy, so batches
form by themselves. ``wait_s`` > 0 adds a timer as well (hold a short batch that long for more).
A request whose caller went away before its run is left out of it, and so is one whose deadline passed
while it waited (it gets ``Expired``: the caller answers 504).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

import numpy as np

Feeds = Mapping[str, np.ndarray]


class Expired(Exception):
    """A request whose deadline passed before the run thread took it: it was not run."""


def signature(feeds: Feeds) -> tuple:
    """Requests that may share a batch: the same inputs with the same non-batch dims and dtypes."""
    return tuple((name, value.shape[1:], value.dtype.str) for name, value in sorted(feeds.items()))


class Batcher:
    """``await batcher.submit(feeds)`` -> what ``run_group`` returned for that request (a result or an
    exception, which is raised for that request alone)."""

    def __init__(
        self,
        run_group: Callable[[list[Feeds]], list[Any]],
        executor: Executor,
        max_batch: int,
        wait_s: float = 0.0,
    ) -> None:
        self.run_group, self.executor = run_group, executor
        self.max_batch, self.wait_s = max_batch, wait_s
        self._waiting: deque[tuple[tuple, Feeds, asyncio.Future, float | None]] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, feeds: Feeds, deadline: float | None = None) -> Any:
        """What ``run_group`` returned for ``feeds``; ``Expired`` when ``deadline`` (seconds since the epoch)
        passed before a run took them."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._work())
        future = loop.create_future()
        self._waiting.append((signature(feeds), feeds, future, deadline))
        self._arrived.set()
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _next_group(self) -> list[tuple[Feeds, asyncio.Future]]:
        """The oldest waiting request and the waiting ones of its signature, up to ``max_batch``; requests
        whose caller went away are dropped, and those whose deadline passed get ``Expired``."""
        now = time.time()
        live: deque[tuple[tuple, Feeds, asyncio.Future, float | None]] = deque()
        for entry in self._waiting:
            future, deadline = entry[2], entry[3]
            if future.done():  # its caller went away
                continue
            if deadline is not None and now >= deadline:
                future.set_result(Expired())
                continue
            live.append(entry)
        if not live:
            self._waiting = live
            return []
        first = live[0][0]
        group, rest = [], deque()
        for entry in live:
            if entry[0] == first and len(group) < self.max_batch:
                group.append((entry[1], entry[2]))
            else:
                rest.append(entry)
        self._waiting = rest
        return group

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._arrived is not None
        while True:
            if not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            if self.wait_s > 0 and len(self._waiting) < self.max_batch:
                await asyncio.sleep(self.wait_s)
            group = self._next_group()
            if not group:
                continue
            try:
                results = await loop.run_in_executor(self.executor, self.run_group, [f for f, _ in group])
            except Exception as exc:  # the run itself failed: every request of this group gets the error
                results = [exc] * len(group)
            for (_, future), result in zip(group, results):
                if not future.done():
                    future.set_result(result)


__all__ = ["Batcher", "Expired", "signature"]
