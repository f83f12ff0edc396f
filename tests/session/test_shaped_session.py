"""``session.shapeplan`` and ``session.shaped``: a session per bucket, each request padded up to its bucket."""

from __future__ import annotations

import numpy as np
import pytest

from ortpilot.data.padding import cut_outputs, pad_feeds
from ortpilot.errors import InputError, UsageError
from ortpilot.models import text_folder
from ortpilot.session import load
from ortpilot.session.binding import run_session
from ortpilot.session.shaped import ShapedSession, load_shaped
from ortpilot.session.shapeplan import ShapePlan, choose_sizes, tensorrt_profiles

AXES = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))


def _request(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return {
        "input_ids": rng.integers(5, 60, (1, n)).astype(np.int64),
        "attention_mask": np.ones((1, n), np.int64),
        "token_type_ids": np.zeros((1, n), np.int64),
    }


def test_bucket_sizes_come_from_the_workloads_quantiles_rounded_up_but_never_past_the_longest():
    lengths = [5] * 10 + [17] * 60 + [36] * 20 + [64] * 9 + [134]
    assert choose_sizes(lengths) == (24, 40, 64, 134)
    assert choose_sizes([3, 4, 5]) == (5,)
    assert choose_sizes([]) == ()


def test_a_plan_is_checked_and_travels_as_data():
    plan = ShapePlan("sequence", (32, 8, 16, 8), AXES, (("input_ids", 1),))
    assert plan.sizes == (8, 16, 32) and plan.label == "buckets(8,16,32)"
    assert (plan.bucket_for(1), plan.bucket_for(8), plan.bucket_for(9), plan.bucket_for(33)) == (8, 8, 16, None)
    assert ShapePlan.from_dict(plan.to_dict()) == plan and plan.pad_value("input_ids") == 1.0
    with pytest.raises(UsageError, match="positive bucket sizes"):
        ShapePlan("sequence", (0,), AXES)
    with pytest.raises(UsageError, match="'beyond'"):
        ShapePlan("sequence", (8,), AXES, beyond="truncate")
    with pytest.raises(UsageError, match="malformed"):
        ShapePlan.from_dict({"dim": "sequence"})


def test_tensorrt_gets_one_optimization_profile_per_bucket():
    plan = ShapePlan("sequence", (16, 64), AXES[:2])
    options = tensorrt_profiles(plan, {"input_ids": [1, 1], "attention_mask": [1, 1]})
    assert options == {
        "trt_profile_min_shapes": "attention_mask:1x1,input_ids:1x1,attention_mask:1x17,input_ids:1x17",
        "trt_profile_opt_shapes": "attention_mask:1x16,input_ids:1x16,attention_mask:1x64,input_ids:1x64",
        "trt_profile_max_shapes": "attention_mask:1x16,input_ids:1x16,attention_mask:1x64,input_ids:1x64",
    }


def test_padding_and_cutting_put_a_request_back_at_its_own_size():
    feeds = _request(5)
    padded = pad_feeds(feeds, AXES, 8, lambda name: 3 if name == "input_ids" else 0)
    assert padded["input_ids"].shape == (1, 8) and padded["input_ids"][0, 5:].tolist() == [3, 3, 3]
    assert padded["attention_mask"][0].tolist() == [1] * 5 + [0] * 3
    out = np.zeros((1, 8, 8), np.float32)  # [batch, sequence, hidden] with hidden == the bucket
    steps = np.zeros((1, 2, 10), np.float32)  # a recognizer's steps: a quarter of the padded width
    (hidden, ctc) = cut_outputs([out, steps], [((1, "same"),), ((1, "scaled"),)], 4, 8)
    assert hidden.shape == (1, 4, 8) and ctc.shape == (1, 1, 10)  # the hidden axis is not the plan's


def test_a_masked_encoder_gives_the_same_outputs_padded_and_the_plan_counts_what_it_served(tmp_path):
    folder = text_folder(tmp_path / "embed")
    model = str(folder / "model.onnx")
    plan = ShapePlan("sequence", (8, 16), AXES)
    shaped = load_shaped(model, ["cpu"], "strict", plan)
    plain = load(model, ["cpu"], "strict")
    assert isinstance(shaped, ShapedSession) and shaped.providers == plain.providers
    # the session for longer requests is made at load, not by the first long request (a compile on OpenVINO)
    assert shaped.to_dict()["beyond_session"] is True
    for n in (3, 8, 11, 20):
        want = plain.run(None, _request(n))[0]
        got = shaped.run(None, _request(n))[0]
        assert got.shape == want.shape == (1, n, want.shape[-1])
        assert np.allclose(got, want, atol=1e-5), n
        assert run_session(shaped, _request(n), iobinding=True)["last_hidden_state"].shape == want.shape
    assert dict(shaped.served) == {"8": 4, "16": 2, "beyond": 2}  # 3 and 8 tokens share the 8 bucket
    assert shaped.to_dict()["shape_plan"]["sizes"] == [8, 16]


def test_tunes_timing_leaves_the_free_dim_session_to_the_first_request_that_needs_it(tmp_path):
    folder = text_folder(tmp_path / "embed")
    shaped = load_shaped(
        str(folder / "model.onnx"), ["cpu"], "strict", ShapePlan("sequence", (8,), AXES), beyond_at_load=False
    )
    shaped.run(None, _request(5))
    assert shaped.to_dict()["beyond_session"] is False
    assert shaped.run(None, _request(12))[0].shape[1] == 12 and shaped.to_dict()["beyond_session"] is True


def test_a_leaking_encoder_is_changed_by_padding(tmp_path):
    folder = text_folder(tmp_path / "leak", leak=True)
    model = str(folder / "model.onnx")
    shaped = load_shaped(model, ["cpu"], "strict", ShapePlan("sequence", (16,), AXES))
    plain = load(model, ["cpu"], "strict")
    want, got = plain.run(None, _request(5))[0], shaped.run(None, _request(5))[0]
    assert got.shape == want.shape and not np.allclose(got, want, atol=1e-3)


def test_a_plan_that_refuses_longer_requests_says_which_size_to_send(tmp_path):
    folder = text_folder(tmp_path / "embed")
    shaped = load_shaped(
        str(folder / "model.onnx"), ["cpu"], "strict", ShapePlan("sequence", (8,), AXES, beyond="refuse")
    )
    with pytest.raises(InputError, match="'sequence' is 12, beyond the largest bucket .* \\(8\\)"):
        shaped.run(None, _request(12))
