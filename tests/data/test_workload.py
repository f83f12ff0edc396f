"""``data.workload``: which dims vary across the user's requests, a replay set that stands for them, a summary."""

from __future__ import annotations

import json

import numpy as np

from ortpilot.data.workload import Workload, batched_requests, replay_set, shapes_digest, spread, varying_dims
from ortpilot.graph.shapes import graph_inputs
from ortpilot.modelio import load_model


def _sentence(n: int) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.arange(n, dtype=np.int64)[None],
        "attention_mask": np.ones((1, n), np.int64),
        "token_type_ids": np.zeros((1, n), np.int64),
    }


def test_axes_the_graph_names_alike_are_one_dim_and_unnamed_ones_are_input_axis(demo_paths):
    inputs = graph_inputs(load_model(demo_paths["encoder"]))
    samples = [_sentence(n) for n in (5, 9, 9, 17)]
    assert varying_dims(samples, inputs) == {
        "sequence": [("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1)]
    }
    assert varying_dims([_sentence(8), _sentence(8)], inputs) == {}
    unnamed = [{"x": np.zeros((1, w), np.float32)} for w in (3, 4)]
    assert varying_dims(unnamed, []) == {"x:1": [("x", 1)]}


def test_the_replay_set_takes_evenly_spaced_quantiles_by_size_smallest_first():
    samples = [_sentence(n) for n in range(1, 101)]  # lengths 1..100, in order
    replay = replay_set(samples, 8)
    lengths = [s["input_ids"].shape[1] for s in replay]
    assert lengths == [7, 19, 32, 44, 57, 69, 82, 94]  # the 1/16, 3/16, ... 15/16 quantiles
    assert abs(np.mean(lengths) - np.mean(range(1, 101))) < 1.0  # one pass costs what the workload does on average
    assert [s["input_ids"].shape[1] for s in replay_set(samples[:5], 8)] == [1, 2, 3, 4, 5]
    assert len(replay_set([_sentence(8)] * 3)) == 1  # one shape: one request stands for all


def test_spread_picks_evenly_spaced_quantiles_and_all_of_a_few():
    assert spread(16, 8) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert spread(100, 4) == [12, 37, 62, 87]
    assert spread(3, 8) == [0, 1, 2] and spread(0, 4) == []


def test_a_workload_summarises_each_varying_dim_and_travels_as_json(demo_paths):
    inputs = graph_inputs(load_model(demo_paths["encoder"]))
    lengths = [5, 6, 8, 8, 9, 17, 17, 17, 36, 64]
    samples = [_sentence(n) for n in lengths]
    workload = Workload.of_samples(samples, inputs, "text")
    (dim,) = workload.dims
    assert dim.name == "sequence" and dim.histogram[0] == (5, 1) and dim.histogram[-1] == (64, 1)
    assert (dim.quantile(0.5), dim.quantile(0.9)) == (17, 64)  # the size at or above the quantile
    assert workload.varies and workload.requests == 10 and workload.replay == 8
    assert workload.describe() == "sequence 5-64 (p50 17, p90 64, p99 64) over 10 text requests"
    assert Workload.of_samples(samples, inputs, "files").describe().endswith("over 10 file requests")
    assert workload.shapes["input_ids"] == (1, 17)  # the median request's shapes
    doc = json.loads(json.dumps(workload.to_dict()))
    assert Workload.from_dict(doc) == workload
    assert workload.sha256 == shapes_digest(samples) != shapes_digest(list(reversed(samples)))


def test_one_shape_is_a_workload_that_does_not_vary(demo_paths):
    inputs = graph_inputs(load_model(demo_paths["encoder"]))
    workload = Workload.of_samples([_sentence(16)] * 3, inputs, "files")
    assert not workload.varies and workload.replay == 1
    assert workload.describe() == "one shape (input_ids=1x16, attention_mask=1x16, token_type_ids=1x16)"


def test_a_server_batch_sorts_by_size_pads_to_the_longest_and_stacks(demo_paths):
    inputs = graph_inputs(load_model(demo_paths["encoder"]))
    requests = [_sentence(n) for n in (9, 3, 17, 5, 12, 4, 30, 7)]

    def pad(name: str) -> float:
        return 0.0 if "mask" in name else 1.0

    batches = batched_requests(requests, 4, inputs, pad)
    assert [b["input_ids"].shape for b in batches] == [(4, 7), (4, 30)]  # 3,4,5,7 then 9,12,17,30
    first = batches[0]
    assert first["attention_mask"].sum(axis=1).tolist() == [3, 4, 5, 7]
    assert first["input_ids"][0, 3:].tolist() == [1, 1, 1, 1]  # token ids padded with the pad value
    assert batched_requests(requests, 16, inputs, pad) == []  # fewer requests than one batch
    assert batched_requests([{"x": np.zeros((2, 3), np.float32)}] * 4, 2, [], pad) == []  # not batch 1


def test_a_few_server_batches_are_all_replayed_and_many_are_sampled_evenly(demo_paths):
    inputs = graph_inputs(load_model(demo_paths["encoder"]))

    def pad(name: str) -> float:
        return 0.0 if "mask" in name else 1.0

    six = batched_requests([_sentence(n) for n in range(3, 27)], 4, inputs, pad)  # 24 requests: 6 runs of 4
    assert [b["input_ids"].shape[1] for b in six] == [6, 10, 14, 18, 22, 26]  # every one, not 4 with both ends
    eight = batched_requests([_sentence(n) for n in range(3, 35)], 4, inputs, pad)
    assert len(eight) == 8  # 2 x runs: still all
    nine = batched_requests([_sentence(n) for n in range(3, 39)], 4, inputs, pad)  # 9 runs: 4 at quantiles
    assert [b["input_ids"].shape[1] for b in nine] == [10, 18, 26, 34]  # runs 1, 3, 5, 7


def test_a_workload_file_is_text_requests_or_a_histogram_and_bad_ones_name_the_problem(tmp_path, demo_paths):
    import pytest

    from ortpilot.data.workload import read_workload
    from ortpilot.errors import UsageError

    proto = load_model(demo_paths["encoder"])
    inputs = graph_inputs(proto)
    histogram = tmp_path / "w.json"
    histogram.write_text(json.dumps({"dims": {"sequence": {"17": 120, "32": 40, "64": 8}}}))
    requests, source = read_workload(histogram, proto, inputs)
    lengths = sorted({r["input_ids"].shape[1] for r in requests})
    assert source == "synthetic" and lengths == [17, 32, 64] and len(requests) == 40
    assert sum(r["input_ids"].shape[1] == 17 for r in requests) > sum(r["input_ids"].shape[1] == 64 for r in requests)
    stacked = tmp_path / "w.npz"
    np.savez(
        stacked,
        input_ids=np.ones((3, 1, 9), np.int64),
        attention_mask=np.ones((3, 1, 9), np.int64),
        token_type_ids=np.zeros((3, 1, 9), np.int64),
    )
    requests, source = read_workload(stacked, proto, inputs)
    assert source == "files" and len(requests) == 3 and requests[0]["input_ids"].shape == (1, 9)
    bad = tmp_path / "bad.json"
    for content, message in [
        ("{", "is not a workload histogram"),
        (json.dumps({"sizes": {}}), "is not a workload histogram \\(it has no 'dims' object\\)"),
        (json.dumps({"dims": {}}), "gives no dims; name the model's dynamic dims with their sizes: batch, sequence"),
        (json.dumps({"dims": {"nosuch": {"4": 1}}}), "names dims the model does not have \\(nosuch\\)"),
        (json.dumps({"dims": {"sequence": {"0": 1}}}), "sizes must be >= 1"),
    ]:
        bad.write_text(content)
        with pytest.raises(UsageError, match=message):
            read_workload(bad, proto, inputs)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, pixels=np.zeros((2, 1, 3), np.float32))
    with pytest.raises(UsageError, match="does not fit the model"):
        read_workload(wrong, proto, inputs)
    with pytest.raises(UsageError, match="is not a file"):
        read_workload(tmp_path / "missing.txt", proto, inputs)


def test_a_workload_npz_reads_requests_of_the_inputs_rank_and_refuses_what_is_no_request(tmp_path, demo_paths):
    """Arrays of the inputs' own rank hold requests of batch 1, as calibration files read; keys that are no
    input, arrays with no axis, keys not INDEX/INPUT and requests whose mask is not as long as their ids are
    refused by name (each was a traceback or a tune of requests the model reads otherwise)."""
    import pytest

    from ortpilot.data.workload import read_workload
    from ortpilot.errors import UsageError

    proto = load_model(demo_paths["encoder"])
    inputs = graph_inputs(proto)
    flat = tmp_path / "flat.npz"
    ids = np.ones((5, 9), np.int64)
    np.savez(flat, input_ids=ids, attention_mask=ids, token_type_ids=0 * ids)
    requests, _ = read_workload(flat, proto, inputs)
    assert len(requests) == 5 and {r["input_ids"].shape for r in requests} == {(1, 9)}
    bad = tmp_path / "bad.npz"
    stacked = np.ones((4, 1, 8), np.int64)
    for arrays, message in [
        ({"input_ids": stacked, "attention_mask": stacked, "note": np.array(3)}, "'note' that are not model inputs"),
        (
            {"input_ids": stacked, "attention_mask": stacked, "token_type_ids": np.array(0)},
            "token_type_ids has no axis",
        ),
        ({"a/input_ids": stacked[0]}, "has an array named 'a/input_ids'; samples are stored as INDEX/INPUT"),
        (
            {"input_ids": stacked, "attention_mask": np.ones((4, 1, 3), np.int64), "token_type_ids": 0 * stacked},
            "request #0 sizes the model's dim 'sequence' differently \\(input_ids\\[1\\] 8, attention_mask\\[1\\] 3",
        ),
    ]:
        np.savez(bad, **arrays)
        with pytest.raises(UsageError, match=message):
            read_workload(bad, proto, inputs)


def test_the_extremes_are_the_smallest_and_largest_request_of_each_varying_dim(demo_paths):
    from ortpilot.data.workload import extremes

    inputs = graph_inputs(load_model(demo_paths["encoder"]))
    requests = [_sentence(n) for n in (9, 3, 40, 17, 3)]
    picked = extremes(requests, inputs)
    assert [r["input_ids"].shape[1] for r in picked] == [3, 40]
    assert extremes([_sentence(5)] * 3, inputs) == []


def test_buckets_from_a_histogram_end_at_its_own_quantiles(tmp_path, demo_paths):
    """{16: 50, 24: 30, 32: 15, 64: 5}: the median 16, p80 24, p95 32 and the longest 64 (32 generated requests
    put the p95 at 64 and the plan lost its 32 bucket)."""
    from ortpilot.data.workload import read_workload
    from ortpilot.session.shapeplan import choose_sizes

    proto = load_model(demo_paths["encoder"])
    inputs = graph_inputs(proto)
    histogram = tmp_path / "w.json"
    histogram.write_text(json.dumps({"dims": {"sequence": {"16": 50, "24": 30, "32": 15, "64": 5}}}))
    requests, _ = read_workload(histogram, proto, inputs)
    (dim,) = Workload.of_samples(requests, inputs, "synthetic").dims
    assert choose_sizes([int(s) for s in dim.sizes]) == (16, 24, 32, 64)


def test_a_histograms_other_dims_take_the_shapes_given_where_they_have_no_default(tmp_path):
    """An OCR recognizer's input is ``[DynamicDimension.0, 3, 48, DynamicDimension.1]``: a histogram of widths
    left the first dim with no default, and the --shape the error suggested did not reach the histogram."""
    import onnx
    import pytest
    from onnx import TensorProto, helper

    from ortpilot.data.workload import read_workload
    from ortpilot.errors import UsageError

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["DynamicDimension.0", 3, 48, "DynamicDimension.1"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["DynamicDimension.0", 3, 48, "DynamicDimension.1"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "rec", [x], [y])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    inputs = graph_inputs(proto)
    widths = tmp_path / "widths.json"
    widths.write_text(json.dumps({"dims": {"DynamicDimension.1": {"120": 3, "320": 1}}}))
    with pytest.raises(UsageError, match="DynamicDimension.0"):
        read_workload(widths, proto, inputs)
    requests, _ = read_workload(widths, proto, inputs, shapes={"DynamicDimension.0": (1,)})
    assert {r["x"].shape for r in requests} == {(1, 3, 48, 120), (1, 3, 48, 320)}
