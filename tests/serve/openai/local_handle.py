"""Ray's deployment handle as the OpenAI ingress uses it, calling a real ``DecoderReplica`` in this process
(streamed ``generate`` with ``cancel``, awaitable ``describe``): the ingress without Ray."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


class _Events:
    def __init__(self, events: AsyncIterator[dict[str, Any]]) -> None:
        self.events = events

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self.events.__anext__()

    def cancel(self) -> None:
        asyncio.get_running_loop().create_task(self.events.aclose())


class _Method:
    def __init__(self, call: Any) -> None:
        self.remote = call


class LocalHandle:
    def __init__(self, replica: Any) -> None:
        self.replica = replica

    def options(self, stream: bool = False) -> LocalHandle:
        return self

    @property
    def generate(self) -> _Method:
        return _Method(lambda request, context=None: _Events(self.replica.generate(request, context)))

    @property
    def describe(self) -> _Method:
        async def describe() -> Any:  # a DecoderInfo
            return self.replica.describe()

        return _Method(describe)
