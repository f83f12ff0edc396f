"""All loops must produce the same greedy tokens; bound and shared must not copy the KV cache."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ortpilot.decode import Generator
from ortpilot.errors import UsageError

NEW_TOKENS = 16


def _prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, size=length).tolist()


@pytest.fixture(scope="module")
def plain_gen(demo_decoder: onnx.ModelProto) -> Generator:
    return Generator(demo_decoder)


@pytest.fixture(scope="module")
def fused_gen(fused_decoder: onnx.ModelProto) -> Generator:
    return Generator(fused_decoder)


@pytest.mark.parametrize("length", [1, 7, 64])
def test_all_loops_give_identical_greedy_tokens(plain_gen: Generator, fused_gen: Generator, length: int) -> None:
    prompt = _prompt(length, seed=length)
    reference = plain_gen.generate(prompt, NEW_TOKENS, "plain")
    assert reference.loop == "plain" and len(reference.tokens[0]) == NEW_TOKENS
    runs = {"bound": plain_gen.generate(prompt, NEW_TOKENS, "bound")}
    for loop in ("plain", "bound", "shared"):
        runs[f"fused-{loop}"] = fused_gen.generate(prompt, NEW_TOKENS, loop)
    for name, result in runs.items():
        assert result.tokens == reference.tokens, name
    # The tokens are not a constant: a different prompt gives a different continuation.
    assert plain_gen.generate(_prompt(length, seed=99), NEW_TOKENS, "plain").tokens != reference.tokens


def test_bound_and_shared_never_copy_the_cache(plain_gen: Generator, fused_gen: Generator) -> None:
    prompt = _prompt(32)
    plain = plain_gen.generate(prompt, 8, "plain")
    bound = plain_gen.generate(prompt, 8, "bound")
    shared = fused_gen.generate(prompt, 8, "shared")
    assert plain.kv_host_bytes_per_token > 0
    assert bound.kv_host_bytes_per_token == 0 and shared.kv_host_bytes_per_token == 0
    assert 0 < bound.host_bytes_per_token < plain.host_bytes_per_token
    # Shared buffers are sized to prompt + new tokens once; the plain cache is the same data.
    assert shared.kv_cache_bytes >= plain.kv_cache_bytes > 0


def test_auto_picks_the_fastest_supported_loop(plain_gen: Generator, fused_gen: Generator) -> None:
    # CPU session without GQA: IOBinding saves no device copy, so the plain loop (see choose_loop).
    result = plain_gen.generate([1, 2, 3], 2)
    assert result.loop == "plain" and "CPU session" in result.loop_reason
    assert fused_gen.generate([1, 2, 3], 2).loop == "shared"


def test_measurements_are_filled(plain_gen: Generator) -> None:
    result = plain_gen.generate(_prompt(8), 6, "bound")
    assert len(result.step_ms) == 5 and result.p50_ms > 0 and result.p99_ms >= result.p50_ms
    assert result.prefill_tokens_per_s > 0 and result.decode_tokens_per_s > 0
    assert result.peak_rss_bytes > 0
    doc = result.to_dict()
    assert doc["loop"] == "bound" and doc["stop_reason"] == "max_new_tokens"


def test_stop_tokens_and_streaming(plain_gen: Generator) -> None:
    prompt = _prompt(5)
    full = plain_gen.generate(prompt, 10, "plain").tokens[0]
    stop = full[3]
    first = full.index(stop)
    seen: list[int] = []
    result = plain_gen.generate(prompt, 10, "bound", stop_tokens=[stop], stream=lambda t: seen.append(int(t[0])))
    assert result.tokens[0] == full[: first + 1] and result.stop_reason == "stop_token"
    assert seen == result.tokens[0]


def test_max_length_caps_generation(fused_gen: Generator) -> None:
    result = fused_gen.generate([1, 2, 3, 4], 50, "shared", max_length=10)
    assert len(result.tokens[0]) == 6 and result.stop_reason == "max_length"


def test_left_padded_batch_matches_rows_alone(plain_gen: Generator) -> None:
    short, long = _prompt(3, seed=1), _prompt(6, seed=2)
    ids = np.array([[0] * 3 + short, long])
    mask = np.array([[0] * 3 + [1] * 3, [1] * 6])
    for loop in ("plain", "bound"):
        batch = plain_gen.generate(ids, 8, loop, attention_mask=mask)
        assert batch.tokens[0] == plain_gen.generate(short, 8, "plain").tokens[0], loop
        assert batch.tokens[1] == plain_gen.generate(long, 8, "plain").tokens[0], loop


def test_gqa_graph_that_ignores_the_mask_refuses_left_padding(fused_gen: Generator) -> None:
    assert not fused_gen.signature.gqa_reads_mask
    ids = np.array([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    with pytest.raises(UsageError, match="ignores attention_mask"):
        fused_gen.generate(ids, 4, "shared", attention_mask=mask)
    # Unpadded batches are fine.
    result = fused_gen.generate(np.array([[1, 2, 3], [4, 5, 6]]), 4, "shared")
    assert len(result.tokens) == 2


def test_model_without_cache_recomputes(tmp_path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "emb")
    head = numpy_helper.from_array(rng.standard_normal((8, 32)).astype(np.float32), "head")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "input_ids"], ["h"]),
            helper.make_node("CumSum", ["h", "axis"], ["c"]),  # the last logits depend on every token
            helper.make_node("MatMul", ["c", "head"], ["logits"]),
        ],
        "nocache",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", 32])],
        [emb, head, numpy_helper.from_array(np.array(1, dtype=np.int64), "axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    gen = Generator(model)
    result = gen.generate([1, 2, 3], 5, "bound")
    assert result.loop == "recompute" and "recomputes the full sequence" in result.notes[0]
    # Reference: run the whole sequence by hand and take the argmax of the last position.
    ids = [1, 2, 3]
    for _ in range(5):
        (logits,) = gen.vsession.session.run(["logits"], {"input_ids": np.array([ids])})
        ids.append(int(logits[0, -1].argmax()))
    assert result.tokens[0] == ids[3:]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt_ids": [1, 300]}, "outside the vocabulary"),
        ({"prompt_ids": [-1]}, "outside the vocabulary"),
        ({"prompt_ids": []}, "non-empty"),
        ({"prompt_ids": [1], "max_new_tokens": 0}, "at least 1"),
        ({"prompt_ids": [1, 2, 3], "max_length": 3}, "KV buffer holds 3"),
        ({"prompt_ids": [1], "loop": "fast"}, "Unknown loop"),
        ({"prompt_ids": [1], "loop": "shared"}, "no GroupQueryAttention"),
        ({"prompt_ids": [1], "stop_tokens": [-5]}, r"Stop token id\(s\) \[-5\] are outside the vocabulary"),
        ({"prompt_ids": [1], "stop_tokens": [2, 300]}, r"\[300\] are outside the vocabulary"),  # never produced
    ],
)
def test_bad_requests_are_usage_errors(plain_gen: Generator, kwargs: dict, message: str) -> None:
    args = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(UsageError, match=message):
        plain_gen.generate(**args)


def test_prompt_longer_than_max_positions() -> None:
    from ortpilot.models import make_decoder

    gen = Generator(make_decoder(max_positions=16))
    with pytest.raises(UsageError, match="at most 16 positions"):
        gen.generate(list(range(1, 20)), 2)
    assert len(gen.generate(list(range(1, 10)), 50).tokens[0]) == 16 - 9
