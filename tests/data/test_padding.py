"""data.padding: ids padded on the right, the mask of real tokens, length buckets, batches sorted by length."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ortpilot.data.padding import Batch, attention_mask, check_buckets, pad_ids, padded_length, plan_batches


def test_pad_ids_puts_each_sequence_first_and_the_pad_value_after() -> None:
    out = pad_ids([[5, 6, 7], [8], []], 4, pad_value=9, dtype=np.int32)
    assert out.dtype == np.int32
    assert out.tolist() == [[5, 6, 7, 9], [8, 9, 9, 9], [9, 9, 9, 9]]


def test_pad_ids_refuses_a_sequence_longer_than_the_length() -> None:
    with pytest.raises(ValueError, match="sequence 1 has 3 tokens"):
        pad_ids([[1], [1, 2, 3]], 2)


def test_attention_mask_is_one_on_real_tokens_only() -> None:
    mask = attention_mask([3, 1, 0], 4)
    assert mask.dtype == np.int64
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="do not fit"):
        attention_mask([5], 4)


def test_padded_length_takes_the_smallest_bucket_that_holds_the_longest() -> None:
    assert padded_length(7) == 7
    assert padded_length(7, [32, 8, 16]) == 8
    assert padded_length(8, [8, 16]) == 8
    assert padded_length(17, [8, 16]) == 17  # beyond the largest bucket: the longest itself


def test_check_buckets_sorts_and_refuses_what_is_no_length() -> None:
    assert check_buckets(None) is None
    assert check_buckets([64, 16, 16, 32]) == (16, 32, 64)
    for bad in ([], [0], [-4], [1.5], [True]):
        with pytest.raises(ValueError, match="positive integers"):
            check_buckets(bad)


def test_plan_batches_sorts_longest_first_and_cuts_at_max_batch() -> None:
    lengths = [3, 10, 5, 10, 1]
    batches = plan_batches(lengths, 2, run_cost=math.inf)  # every run costs the same: as few as fit
    assert batches == [Batch((1, 3), 10), Batch((2, 0), 5), Batch((4,), 1)]  # ties keep their order
    assert sorted(i for b in batches for i in b.items) == list(range(len(lengths)))
    assert batches[1].fill(lengths) == pytest.approx(8 / 10)
    # at 12 tokens a run, padding 3 to 5 costs less than a run: 5 runs alone, 3 and 1 share one
    assert plan_batches(lengths, 2) == [Batch((1, 3), 10), Batch((2,), 5), Batch((0, 4), 3)]


def test_plan_batches_cuts_where_padding_costs_more_than_a_run() -> None:
    """16 sentences of 6 to 60 tokens padded to 60 are 960 tokens; cut into runs of similar lengths they are
    383 in 6 runs (455 with a run's cost), and no cut has a cheaper total."""
    lengths = [6, 45, 10, 39, 60, 30, 25, 22, 9, 20, 18, 17, 15, 14, 12, 8]
    batches = plan_batches(lengths, 32)
    assert sorted(i for b in batches for i in b.items) == list(range(16))
    assert all(lengths[b.items[0]] == b.length == max(lengths[i] for i in b.items) for b in batches)
    padded = sum(b.rows * b.length for b in batches)
    assert (padded, len(batches)) == (383, 6) and padded + 12 * len(batches) < 16 * 60 + 12
    assert [b.rows for b in plan_batches(lengths, 32, run_cost=1e6)] == [16]  # a costly run: one run
    assert [b.rows for b in plan_batches(lengths, 4, run_cost=1e6)] == [4, 4, 4, 4]
    assert [b.rows for b in plan_batches(lengths, 32, run_cost=0)] == [1] * 16  # free runs: no padding at all


def test_plan_batches_pads_to_buckets() -> None:
    batches = plan_batches([3, 20, 5, 40], 2, buckets=[8, 32])
    assert [(b.items, b.length) for b in batches] == [((3, 1), 40), ((2, 0), 8)]
    # runs that pad to the same bucket are never cut apart: another run would cost more and pad no less
    assert [b.rows for b in plan_batches([30, 29, 28, 27], 8, buckets=[32])] == [4]
    with pytest.raises(ValueError, match="max_batch"):
        plan_batches([1], 0)
