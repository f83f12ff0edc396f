"""One stream's failure is that stream's alone: the scheduler ends it with its error and the streams
decoding beside it go on, token for token as if it had never been there.

The failure is real: the demo decoder with one embedding row set to NaN (a broken model, not a mock),
so a stream that feeds that token gets NaN logits from ORT and cannot sample its next token.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ortpilot.decode import Generator, SamplingConfig, Scheduler
from ortpilot.errors import SamplingError

SAMPLED = SamplingConfig(temperature=1.0, seed=11)
PROMPTS = [[5, 9, 13, 17], [40, 41, 42, 43, 44, 45], [100, 120, 140], [200, 3, 250]]
NEW = [24, 18, 30, 20]


def _poisoned(model: onnx.ModelProto, token: int) -> onnx.ModelProto:
    """``model`` with row ``token`` of its embedding table set to NaN."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, init in enumerate(out.graph.initializer):
        if init.name == "model.embed_tokens.weight":
            table = numpy_helper.to_array(init).copy()
            table[token] = np.nan
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(table, init.name))
            return out
    raise AssertionError("the demo decoder has no model.embed_tokens.weight")


@pytest.fixture(scope="module")
def case(fused_decoder: onnx.ModelProto) -> dict:
    """Three greedy streams and one sampled stream (clean model), and a token only the sampled one makes,
    after a few tokens: the one to poison."""
    clean = Generator(fused_decoder)
    greedy = [clean.generate(p, n).tokens[0] for p, n in zip(PROMPTS[:3], NEW[:3])]
    sampled = clean.generate(PROMPTS[3], NEW[3], sampling=SAMPLED).tokens[0]
    others = {t for seq in [*PROMPTS, *greedy] for t in seq}
    index = next(
        i for i in range(2, len(sampled)) if sampled[i] not in others and sampled[i] not in sampled[:i] + PROMPTS[3]
    )
    return {"greedy": greedy, "sampled": sampled, "index": index, "token": sampled[index]}


def test_nan_logits_end_only_the_stream_that_made_them(fused_decoder: onnx.ModelProto, case: dict) -> None:
    broken = Generator(_poisoned(fused_decoder, case["token"]))
    with Scheduler(broken, max_streams=4, max_queue=4, max_length=128) as scheduler:
        streams = [scheduler.submit(p, n) for p, n in zip(PROMPTS[:3], NEW[:3])]
        victim = scheduler.submit(PROMPTS[3], NEW[3], sampling=SAMPLED)
        for stream in [*streams, victim]:
            stream._done.wait(60)
        # It fed the poisoned token at a decode step beside the others: NaN logits, no token to draw.
        assert victim.stop_reason == "error" and isinstance(victim.error, SamplingError), victim.error
        assert victim.tokens == case["sampled"][: case["index"] + 1]
        with pytest.raises(SamplingError):
            victim.wait(0)
        assert [s.tokens for s in streams] == case["greedy"]
        assert all(s.stop_reason == "max_new_tokens" for s in streams)
        # The slot it held serves the next request as if nothing had happened (stale NaN rows are never read).
        again = scheduler.submit(PROMPTS[0], NEW[0])
        assert list(again) == case["greedy"][0]
    assert scheduler.engine.finished["error"] == 1


def test_a_prompt_with_the_poisoned_token_fails_at_prefill_alone(fused_decoder: onnx.ModelProto, case: dict) -> None:
    broken = Generator(_poisoned(fused_decoder, case["token"]))
    scheduler = Scheduler(broken, max_streams=2, max_length=128)
    good = scheduler.submit(PROMPTS[1], NEW[1])
    bad = scheduler.submit([*PROMPTS[3], case["token"]], 8, sampling=SAMPLED)
    scheduler.run_until_idle()
    assert bad.stop_reason == "error" and isinstance(bad.error, SamplingError) and bad.tokens == []
    assert good.tokens == case["greedy"][1] and good.stop_reason == "max_new_tokens"
