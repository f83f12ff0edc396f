"""The engine's cumulative counters and histograms, as a served decoder's /metrics would read them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ortpilot.decode import Generator, Scheduler
from ortpilot.decode.options import EngineOptions
from ortpilot.decode.stats import Histogram
from ortpilot.errors import QueueFullError


def test_histogram_buckets_are_cumulative_with_inf_last() -> None:
    h = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 7.0):
        h.observe(value)
    doc = h.to_dict()
    assert doc["buckets"] == [[1.0, 2], [2.0, 3], ["+Inf", 4]]  # le: 1.0 counts the value equal to it
    assert doc["count"] == 4 and doc["sum"] == pytest.approx(10.0)


def test_counters_add_up_over_a_run(fused_decoder: onnx.ModelProto) -> None:
    rng = np.random.default_rng(5)
    prompts = [rng.integers(1, 256, size=n).tolist() for n in (6, 11, 3)]
    new = [5, 8, 4]
    scheduler = Scheduler(
        Generator(fused_decoder), max_streams=2, max_queue=1, max_length=64, options=EngineOptions(speculation="off")
    )
    streams = [scheduler.submit(p, n) for p, n in zip(prompts, new)]
    with pytest.raises(QueueFullError):
        scheduler.submit(prompts[0], 2)
    assert scheduler.counters()["queue_depth"] == 3  # nothing admitted before the first step
    streams[2].cancel()
    scheduler.run_until_idle()
    c = scheduler.counters()
    assert c["requests"] == 3 and c["rejected"] == 1 and c["prompt_tokens"] == 6 + 11 + 3
    assert c["finished"] == {"max_new_tokens": 2, "cancelled": 1}
    assert c["completion_tokens"] == 5 + 8 == sum(len(s.tokens) for s in streams)
    assert c["ttft_seconds"]["count"] == 2 and c["inter_token_seconds"]["count"] == 5 + 8 - 2
    rows = c["rows_per_step"]
    assert rows["count"] == c["decode_steps"] == sum(rows["exact"].values()) > 0
    assert sum(r * n for r, n in rows["exact"].items()) >= c["rows_decoded"]  # rows include riders
    assert c["queue_depth"] == c["active"] == c["prefilling"] == 0
    assert c["formats"]["per_format"]["base"]["decode_steps"] == c["decode_steps"]
    assert c["prefill_tokens"] == 6 + 11 and c["prefix_cache"]["misses"] == 2
    assert c["speculation"]["mode"] == "off" and c["speculation"]["verify_runs"] == 0
