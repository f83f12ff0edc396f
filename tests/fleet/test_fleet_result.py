"""``fleet.result``: what the driver keeps of each class's search, as it crosses from the node."""

from __future__ import annotations

import json

import pytest

from ortpilot.fleet.result import DEFAULT_REFERENCE, ClassOutcome, SearchSummary


def test_a_summary_round_trips_through_plain_data_and_json():
    summary = SearchSummary(
        winner="ort-all-intra1",
        speedup={"ratio": 1.25, "ci_low": 1.1, "ci_high": 1.4},
        measured_against="ORT's default capped at 1 CPU",
        default_best=False,
        wall_s=9.5,
        resumed=True,
        candidates=7,
        gate_warning="few samples",
        load_note="",
    )
    assert SearchSummary.from_dict(summary.to_dict()) == summary
    assert SearchSummary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary
    assert SearchSummary.from_dict({}) == SearchSummary() and SearchSummary().measured_against == DEFAULT_REFERENCE


def test_a_summary_of_a_tune_result_keeps_its_winner_speedup_and_reference():
    doc = {
        "winner": {"label": "w"},
        "speedup": {"ratio": 1.5, "ci_low": 1.2, "ci_high": 1.8, "note": "text is left out"},
        "default_best": True,
        "wall_s": 3,
        "candidates": [{}, {}],
    }
    summary = SearchSummary.of_result(doc, "")
    assert summary.winner == "w" and summary.speedup == {"ratio": 1.5, "ci_low": 1.2, "ci_high": 1.8}
    assert summary.measured_against == DEFAULT_REFERENCE and summary.default_best and summary.candidates == 2
    assert SearchSummary.of_result(doc, "ORT's default capped at 2 CPUs").measured_against.endswith("2 CPUs")


@pytest.mark.parametrize("summary", [None, SearchSummary(winner="w")])
def test_a_class_is_done_only_with_a_summary_and_nothing_missing(summary):
    outcome = ClassOutcome("x86-vnni-1cpu", {"name": "x86-vnni-1cpu"}, summary=summary)
    assert outcome.done is (summary is not None)
    outcome.missing = "its node died"
    assert not outcome.done and outcome.to_dict()["missing"] == "its node died"
