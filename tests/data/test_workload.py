"""``data.workload``: which dims vary across the user's requests, a replay set that stands for them, a summary."""

from __future__ import annotations

import json

import numpy as np

from ortpilot.data.workload import Workload, replay_set, shapes_digest, varying_dims
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
    assert workload.shapes["input_ids"] == (1, 17)  # the median request's shapes
    doc = json.loads(json.dumps(workload.to_dict()))
    assert Workload.from_dict(doc) == workload
    assert workload.sha256 == shapes_digest(samples) != shapes_digest(list(reversed(samples)))


def test_one_shape_is_a_workload_that_does_not_vary(demo_paths):
    inputs = graph_inputs(load_model(demo_paths["encoder"]))
    workload = Workload.of_samples([_sentence(16)] * 3, inputs, "files")
    assert not workload.varies and workload.replay == 1
    assert workload.describe() == "one shape (input_ids=1x16, attention_mask=1x16, token_type_ids=1x16)"
