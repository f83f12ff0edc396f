"""serve.oip.textbatcher on a real TextModel of the demo sentence encoder: requests of different lengths that
wait while a run is busy share the next run, each gets its own vectors (padding never leaks: a short
sentence batched with long ones keeps its vector), a long list is split across runs, one request's failure
stays its own, and a request past its deadline is not run."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import ortpilot
from ortpilot.errors import OrtRunError
from ortpilot.models import text_folder
from ortpilot.serve.oip.batcher import Expired
from ortpilot.serve.oip.textbatcher import TextBatcher

SHORT = "hi"
LONG = "onnx runtime runs the model fast on the cpu while the server answers every request " * 3
TEXTS = ["the cat sat on the mat", SHORT, LONG, "where is the nearest train station", "a dog runs fast"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = text_folder(tmp_path_factory.mktemp("textbatch") / "embed", "embed")
    return ortpilot.text_model(folder, max_batch=4)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


class _Calls:
    """``model.run`` that records each call (texts, requests joined) and can be held busy."""

    def __init__(self, model, hold: threading.Event | None = None, fail_longer_than: int | None = None) -> None:
        self.model, self.hold, self.fail = model, hold, fail_longer_than
        self.texts: list[int] = []
        self.requests: list[int] = []

    def run(self, tokens):
        if self.hold is not None:
            self.hold.wait(10)
        if self.fail is not None and max(tokens.lengths) > self.fail:
            raise OrtRunError("this batch holds a text the stand-in refuses")
        self.texts.append(len(tokens))
        return self.model.run(tokens)

    def observe(self, run, tokens, requests: int) -> None:
        self.requests.append(requests)


def test_requests_that_wait_share_one_run_and_each_gets_its_own_vectors(model):
    hold = threading.Event()
    calls = _Calls(model, hold)

    async def main():
        batcher = TextBatcher(calls.run, ThreadPoolExecutor(1), max_items=64, observe=calls.observe)
        first = asyncio.ensure_future(batcher.submit(model.encode([TEXTS[0]])))
        await asyncio.sleep(0.05)  # the first run is held busy, so the others wait together
        rest = [asyncio.ensure_future(batcher.submit(model.encode([t]))) for t in TEXTS[1:]]
        await asyncio.sleep(0.05)
        hold.set()
        return await asyncio.gather(first, *rest)

    out = asyncio.run(main())
    assert calls.texts == [1, 4] and calls.requests == [1, 4]
    alone = np.concatenate([model.embed([t]) for t in TEXTS])
    got = np.concatenate(out)
    assert got.shape == (5, 128)
    assert (_cosines(got, alone) > 0.9999).all()  # the short sentence beside a long one: padding did not leak


def test_a_list_longer_than_a_batch_is_split_across_runs_and_comes_back_in_order(model):
    calls = _Calls(model)
    texts = [TEXTS[i % len(TEXTS)] + f" number {i}" for i in range(11)]

    async def main():
        batcher = TextBatcher(calls.run, ThreadPoolExecutor(1), max_items=4, observe=calls.observe)
        return await asyncio.gather(batcher.submit(model.encode(texts)), batcher.submit(model.encode([SHORT])))

    values, short = asyncio.run(main())
    assert calls.texts == [4, 4, 4] and calls.requests == [1, 1, 2]  # the list's rest shares a run with "hi"
    assert (_cosines(values, model.embed(texts)) > 0.9999).all()
    assert _cosines(short, model.embed([SHORT]))[0] > 0.9999


def test_a_failing_joined_run_runs_each_request_alone_and_only_the_bad_one_fails(model):
    calls = _Calls(model, fail_longer_than=20)

    async def main():
        batcher = TextBatcher(calls.run, ThreadPoolExecutor(1), max_items=64, wait_s=0.05)
        jobs = [batcher.submit(model.encode([t])) for t in ("the cat", LONG, "a dog runs fast")]
        return await asyncio.gather(*jobs, return_exceptions=True)

    good, bad, other = asyncio.run(main())
    assert isinstance(bad, OrtRunError)
    assert _cosines(good, model.embed(["the cat"]))[0] > 0.9999
    assert _cosines(other, model.embed(["a dog runs fast"]))[0] > 0.9999
    assert calls.texts == [1, 1]  # the joined run failed before counting; the good ones ran alone


def test_a_request_past_its_deadline_is_not_run_and_a_gone_caller_is_left_out(model):
    hold = threading.Event()
    calls = _Calls(model, hold)

    async def main():
        batcher = TextBatcher(calls.run, ThreadPoolExecutor(1), max_items=64, observe=calls.observe)
        busy = asyncio.ensure_future(batcher.submit(model.encode(["the cat"])))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(batcher.submit(model.encode([LONG]), deadline=time.time() - 1))
        gone = asyncio.ensure_future(batcher.submit(model.encode(["a caller that left"])))
        kept = asyncio.ensure_future(batcher.submit(model.encode([SHORT])))
        await asyncio.sleep(0.05)
        gone.cancel()
        hold.set()
        return await asyncio.gather(busy, late, kept, return_exceptions=True)

    busy, late, kept = asyncio.run(main())
    assert isinstance(late, Expired) and busy.shape == (1, 128) and kept.shape == (1, 128)
    assert calls.texts == [1, 1]  # neither the late request nor the one whose caller left ran
