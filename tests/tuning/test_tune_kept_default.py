"""A kept default is ORT's default: the profile of a tune whose pick stays ORT's default session records exactly
that session's settings (ORT's own thread pool), not an explicit-thread twin the tune measured as a candidate of
its own; a default capped at the CPU budget records its cap and says why."""

from __future__ import annotations

import dataclasses
import json

from ortpilot.session import SessionSettings
from ortpilot.session.profile import load_profile
from ortpilot.tuning import tune
from ortpilot.tuning.candidate import Candidate, baseline_candidate
from ortpilot.tuning.outputs import profile_settings, write_outputs
from ortpilot.tuning.reference import REFERENCE_FILE, read_reference
from ortpilot.tuning.search import Entry
from ortpilot.tuning.space import DYN_PC
from ortpilot.tuning.verify import verify_profile


def test_the_profile_records_ort_s_default_as_it_ran_and_explicit_threads_for_every_other_winner():
    default = Entry(baseline_candidate(), "baseline")
    assert profile_settings(default, default_threads=2) == SessionSettings()  # intra 0, inter 0: ORT's own pool
    capped = Entry(baseline_candidate().with_settings(intra_op_threads=1), "sessions")  # the CPU-budget stand-in
    assert profile_settings(capped, default_threads=2).intra_op_threads == 1
    int8 = Entry(Candidate((DYN_PC,)), "model variants")  # a variant timed at ORT's default thread count
    explicit = profile_settings(int8, default_threads=2)
    assert (explicit.intra_op_threads, explicit.inter_op_threads) == (2, 1)


def test_a_tune_that_keeps_the_default_writes_a_profile_that_loads_as_ort_s_default(tmp_path, demo_paths):
    result = tune(str(demo_paths["mlp"]), tmp_path / "tune", budget_s=12)
    feeds = read_reference(tmp_path / "tune" / REFERENCE_FILE)[0]
    base = next(e for e in result.entries if e.candidate.baseline)
    # the same search's outputs, as if the pick had kept ORT's default
    result.pick = dataclasses.replace(
        result.pick, winner=base, default_best=True, default_best_reason="ORT's default measured fastest"
    )
    result.out_dir = tmp_path / "kept"
    write_outputs(result, demo_paths["mlp"], demo_paths["mlp"], feeds)
    doc = json.loads((tmp_path / "kept" / "profile.json").read_text())
    assert doc["session_settings"] == SessionSettings().to_dict()  # nothing ORT's default does not have
    assert doc["default_best"] is True and doc["default_best_reason"] == "ORT's default measured fastest"
    sess = load_profile(tmp_path / "kept" / "profile.json")
    assert sess.settings == SessionSettings()
    assert verify_profile(tmp_path / "kept").passed
