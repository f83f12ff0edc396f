"""The floor ``bench_serve.py`` holds ``ortpilot serve`` against: one Python process, Starlette on uvicorn
(uvloop, httptools), the same verified session (``ortpilot.load_profile``) and the same Open
Inference Protocol codec (``ortpilot.serve.oip.codec``), no Ray. What it costs over a bare
``session.run`` is the cost of Python HTTP alone; what ``ortpilot serve`` costs over it is Ray's.

    .venv-test/bin/python benchmarks/floor_server.py PROFILE PORT [--max-batch 8]

``--max-batch``: requests that arrive while a run is busy are stacked into the next run (a plain
queue, no timer), as a simple dynamic batcher would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import ortpilot
from ortpilot.errors import InputError
from ortpilot.serve.oip.codec import BINARY_TYPE, HEADER_LENGTH, decode_request, encode_response


def app_for(profile: str, max_batch: int) -> Starlette:
    session = ortpilot.load_profile(profile)
    names = [o.name for o in session.get_outputs()]
    pool = ThreadPoolExecutor(max_workers=1)
    queue: asyncio.Queue = asyncio.Queue()

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, feeds)))

    async def batcher() -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            while len(batch) < max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            stacked = {k: np.concatenate([f[k] for f, _ in batch]) for k in batch[0][0]}
            out = await loop.run_in_executor(pool, run, stacked)
            for i, (_, future) in enumerate(batch):
                future.set_result({k: v[i : i + 1] for k, v in out.items()})

    async def infer(request: Request) -> Response:
        body = await request.body()
        header = request.headers.get(HEADER_LENGTH)
        try:
            decoded = decode_request(body, int(header) if header else None)
            feeds = session.check_feeds(decoded.feeds)
        except InputError as exc:
            return Response(f'{{"error": "{exc}"}}', 400, media_type="application/json")
        if max_batch > 1:
            future = asyncio.get_running_loop().create_future()
            await queue.put((feeds, future))
            outputs = await future
        else:
            outputs = await asyncio.get_running_loop().run_in_executor(pool, run, feeds)
        wanted = decoded.outputs or names
        binary = decoded.binary_outputs if decoded.outputs is not None else decoded.binary_default
        payload, head = encode_response("m", {n: outputs[n] for n in wanted}, binary, decoded.id)
        if head is None:
            return Response(payload, media_type="application/json")
        return Response(payload, media_type=BINARY_TYPE, headers={"Inference-Header-Content-Length": str(head)})

    async def ready(request: Request) -> Response:
        return Response('{"ready": true}', media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        task = asyncio.get_running_loop().create_task(batcher()) if max_batch > 1 else None
        yield
        if task is not None:
            task.cancel()

    return Starlette(
        routes=[Route("/v2/models/m/infer", infer, methods=["POST"]), Route("/v2/health/ready", ready)],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("port", type=int)
    parser.add_argument("--max-batch", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    uvicorn.run(
        app_for(args.profile, args.max_batch),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
