"""serve.batcher: requests that wait while a run is busy share the next run; a lone one waits for nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ortpilot.serve.oip.batcher import Batcher


def _runner(log: list[int], hold: threading.Event | None = None):
    def run_group(group):
        if hold is not None:
            hold.wait(5)
        log.append(len(group))
        return [{"y": g["x"] * 2} if g["x"].sum() >= 0 else ValueError("negative") for g in group]

    return run_group


def test_a_lone_request_runs_at_once_and_waiting_ones_share_the_next_run():
    log: list[int] = []
    hold = threading.Event()

    async def main():
        batcher = Batcher(_runner(log, hold), ThreadPoolExecutor(1), max_batch=8)
        first = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 2))}))
        await asyncio.sleep(0.05)  # the first run is busy (held) ...
        rest = [asyncio.ensure_future(batcher.submit({"x": np.full((1, 2), i)})) for i in range(5)]
        await asyncio.sleep(0.05)
        hold.set()  # ... so the five that arrived meanwhile go together
        out = await asyncio.gather(first, *rest)
        return out

    started = time.perf_counter()
    out = asyncio.run(main())
    assert log == [1, 5]
    assert [o["y"][0, 0] for o in out] == [2, 0, 2, 4, 6, 8]
    assert time.perf_counter() - started < 5


def test_other_signatures_wait_for_their_own_run_and_one_failure_stays_one_requests():
    log: list[int] = []

    async def main():
        batcher = Batcher(_runner(log), ThreadPoolExecutor(1), max_batch=8, wait_s=0.05)
        a = [batcher.submit({"x": np.ones((1, 2))}) for _ in range(3)]
        b = [batcher.submit({"x": np.ones((1, 3))}) for _ in range(2)]
        bad = batcher.submit({"x": -np.ones((1, 2))})
        return await asyncio.gather(*a, *b, bad, return_exceptions=True)

    out = asyncio.run(main())
    assert sorted(log) == [2, 4]  # (1, 2) requests in one run, (1, 3) in another
    assert isinstance(out[-1], ValueError) and all(isinstance(o, dict) for o in out[:-1])


def test_a_request_whose_deadline_passed_while_it_waited_is_left_out_of_the_run():
    from ortpilot.serve.oip.batcher import Expired

    log: list[int] = []
    hold = threading.Event()

    async def main():
        batcher = Batcher(_runner(log, hold), ThreadPoolExecutor(1), max_batch=8)
        first = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 2))}))
        await asyncio.sleep(0.05)  # the first run is busy (held) while the next two wait
        late = asyncio.ensure_future(batcher.submit({"x": np.full((1, 2), 7.0)}, deadline=time.time() - 1))
        timely = asyncio.ensure_future(batcher.submit({"x": np.full((1, 2), 3.0)}, deadline=time.time() + 3600))
        await asyncio.sleep(0.05)
        hold.set()
        return await asyncio.gather(first, late, timely, return_exceptions=True)

    _first, late, timely = asyncio.run(main())
    assert isinstance(late, Expired) and log == [1, 1]  # the second run held the timely request alone
    np.testing.assert_array_equal(timely["y"], np.full((1, 2), 6.0))
