"""The report cannot mislead: final figures and search estimates in separate columns, the finalists first, and
a line for every candidate whose estimate beats the shipped figure saying why it is not the winner.

The documents are tune documents as ``TuneResult.to_dict`` writes them, cut to the fields the report reads;
a real tune's are checked in tests/cli/test_cmd_tune.py."""

from __future__ import annotations

import base64
import math
from typing import Any

import pytest

from ortpilot.tuning.report import final_cells, pareto_png, ranked_candidates, render_md, search_cells, why_not_lines


def _cand(cid: str, *, final_ms: float | None, screen_ms: float | None, paired: float | None, **kw: Any) -> dict:
    return {
        "id": cid,
        "label": cid,
        "status": kw.pop("status", "ok"),
        "reason": kw.pop("reason", ""),
        "phase": "model variants",
        "baseline": kw.pop("baseline", False),
        "timing": "interleaved" if final_ms else "search",
        "latency": {"p50_ms": final_ms or screen_ms, "p99_ms": (final_ms or screen_ms or 0) * 1.2}
        if (final_ms or screen_ms)
        else {},
        "screen_latency": {"p50_ms": screen_ms} if screen_ms else {},
        "paired_cost": paired,
        "accuracy": {"worst_error": 0.001},
        **kw,
    }


def _doc(candidates: list[dict], winner: str, *, default_best: bool = False) -> dict:
    by_id = {c["id"]: c for c in candidates}
    base = by_id["default"]
    return {
        "model": "m.onnx",
        "objective": "p50",
        "winner": by_id[winner],
        "baseline": base,
        "speedup": {"ratio": base["latency"]["p50_ms"] / by_id[winner]["latency"]["p50_ms"], "ci_low": 1, "ci_high": 2},
        "default_best": default_best,
        "default_best_reason": "",
        "candidates": candidates,
        "facts": {},
        "metrics": {"y": "cosine"},
        "max_error": 0.01,
        "onnxruntime": "1.32.0",
        "shapes": {"x": [1, 4]},
        "wall_s": 10.0,
    }


def _issue_doc() -> dict:
    """Issue 38's encoder: a row at ~2.22x est. that never reached the final, a finalist at ~2.38x est. that
    the final measured at 1.66x, and the winner at 1.92x final."""
    return _doc(
        [
            _cand("default", final_ms=53.4, screen_ms=130.0, paired=1.0, baseline=True),
            _cand("fast-in-search", final_ms=None, screen_ms=30.4, paired=0.45),
            _cand("lost-in-final", final_ms=32.1, screen_ms=46.9, paired=0.42),
            _cand("winner", final_ms=27.8, screen_ms=39.9, paired=0.40),
            _cand("slow", final_ms=None, screen_ms=60.0, paired=0.9),
            _cand("rejected", final_ms=None, screen_ms=None, paired=None, status="rejected", reason="accuracy"),
        ],
        "winner",
    )


def test_the_finalists_come_first_by_their_final_figure_then_the_rest_by_estimate():
    doc = _issue_doc()
    assert [c["id"] for c in ranked_candidates(doc)] == [
        "winner",
        "lost-in-final",
        "default",
        "fast-in-search",
        "slow",
        "rejected",
    ]


def test_final_and_search_figures_never_share_a_cell():
    doc = _issue_doc()
    rows = {c["id"]: c for c in doc["candidates"]}
    assert final_cells(doc, rows["winner"])[1] == f"{53.4 / 27.8:.2f}x"
    assert search_cells(doc, rows["winner"]) == ("39.900", f"~{1.0 / 0.40:.2f}x")
    assert final_cells(doc, rows["fast-in-search"]) == ("-", "-")  # not in the final: no final figure
    assert search_cells(doc, rows["fast-in-search"])[1] == f"~{1.0 / 0.45:.2f}x"
    md = render_md(doc)
    assert "| final p50 ms (95% CI) | final vs default | search p50 ms | search vs default |" in md
    assert "| winner **(profile)** | ok | 27.800 | 1.92x | 39.900 | ~2.50x |" in md


def test_each_row_whose_estimate_beats_the_shipped_figure_says_why_it_is_not_the_winner():
    doc = _issue_doc()
    lines = why_not_lines(doc)
    assert len(lines) == 2, lines  # "slow" (~1.11x est.) is below the winner's 1.92x: no line
    fast, lost = sorted(lines, key=lambda x: "fast-in-search" not in x)
    assert "fast-in-search (~2.22x est.)" in fast and "ranked #3 by its search figure" in fast
    assert "lost-in-final (~2.38x est.)" in lost and "the final measured it at 1.66x" in lost
    assert all(line in render_md(doc) for line in lines)


def test_a_row_the_final_passed_over_for_a_more_accurate_runner_up_says_which_one_took_its_place():
    """bw20 on MiniLM: NNCF's own recipe ranked #2 (~2.95x est.), the smoothed recipe below it went to the final
    as the more accurate runner-up (Search._finalists)."""
    doc = _doc(
        [
            _cand("default", final_ms=45.6, screen_ms=49.8, paired=1.0, baseline=True),
            _cand("winner", final_ms=15.8, screen_ms=16.1, paired=0.33),
            _cand("twin", final_ms=None, screen_ms=15.8, paired=0.339),
            _cand("accurate", final_ms=16.1, screen_ms=17.0, paired=0.346),
        ],
        "winner",
    )
    (line,) = [x for x in why_not_lines(doc) if "twin" in x.split(":")[1]]
    assert "ranked #2 by its search figure, and the final's second place went to accurate" in line, line


def test_when_ortpilot_keeps_the_default_every_faster_estimate_is_explained_against_1x():
    doc = _issue_doc()
    doc["default_best"] = True
    doc["default_best_reason"] = "the best alternative (winner) is within noise of ORT's default"
    doc["winner"] = doc["baseline"]
    lines = {line.split(":")[1].split("(")[0].strip(): line for line in why_not_lines(doc)}
    assert set(lines) == {"winner", "fast-in-search", "lost-in-final", "slow"}
    assert lines["winner"].endswith("the final measured it at 1.92x.")  # the headline says why the default stays


def test_a_ctc_check_shows_its_steps_and_sequences_beside_its_error():
    doc = _issue_doc()
    rows = {c["id"]: c for c in doc["candidates"]}
    rows["rejected"]["accuracy"] = {
        "worst_error": 0.0625,
        "outputs": [
            {
                "name": "387",
                "metric": "ctc",
                "error": 0.0625,
                "figures": {"step_top1_agreement": 0.988, "sequence_exact_match": 0.9375, "sequences": 16.0},
            }
        ],
    }
    assert "| 6.25e-02 (steps 98.8% top-1, 93.8% of 16 sequences identical) |" in render_md(doc)


def test_a_tune_that_saw_two_machine_states_says_so_and_why_the_faster_finalist_lost():
    """The fused finalist measured faster in the final (all in the slow state) but gained less in the fast one:
    the line says why it is not the winner, and the headline carries the winner's figure in each state."""
    from ortpilot.tuning.report import headline

    doc = _doc(
        [
            _cand("default", final_ms=0.757, screen_ms=0.444, paired=1.0, baseline=True),
            _cand("fused", final_ms=0.549, screen_ms=0.376, paired=0.85),
            _cand("plain", final_ms=0.610, screen_ms=0.358, paired=0.81),
        ],
        "plain",
    )
    doc["winner"]["label"] = "int8-dynamic"
    doc["speedup"]["by_state"] = {
        "fast": {"default_p50_ms": 0.444, "speedup": 1.24, "runs": 10},
        "slow": {"default_p50_ms": 0.757, "speedup": 1.241, "runs": 48},
    }
    doc["passed_over"] = {
        "id": "fused",
        "why": "fused measured 1.38x in the final, but 1.18x in the machine's fast state",
    }
    assert why_not_lines(doc) == [
        "Not the winner though the final measured it faster: fused measured 1.38x in the final, but 1.18x in the "
        "machine's fast state."
    ]
    line = headline(doc)
    assert "ORT's default ran at two speeds during the tune; the winner's speedup beside each" in line
    assert "the winner's speedup beside each: 1.24x fast (ORT's default 0.444 ms), " in line
    assert "1.24x slow (ORT's default 0.757 ms)." in line


def test_a_winner_timed_in_one_of_two_states_says_its_figure_in_the_other_is_unknown():
    """A demo CNN tune (2026-12-04): ORT's default ran at 0.050 and 0.088 ms, the winner was timed beside it at
    0.088 ms only (1.87x); verify --bench, the default at 0.049 ms, read 1.30x."""
    from ortpilot.tuning.report import state_clause

    speedup = {
        "ratio": 1.85,
        "by_state": {"slow": {"default_p50_ms": 0.088, "speedup": 1.87, "runs": 400}},
        "states_seen_ms": {"fast": 0.050, "slow": 0.088},
    }
    assert state_clause(speedup) == (
        " ORT's default ran at two speeds during the tune (0.050 ms fast and 0.088 ms slow); the winner was timed "
        "beside it only in the slow one (1.87x): its speedup in the other is not known, and `ortpilot verify OUTDIR "
        "--bench` measures it there."
    )
    assert state_clause({"ratio": 1.2, "by_state": {}}) == ""


def test_the_provider_line_ends_with_one_period_after_a_search_estimate():
    """'best on the CPU EP: int8-dynamic ~1.34x est..' read with two periods."""
    from ortpilot.tuning.report import provider_line

    ov = [{"name": "OpenVINOExecutionProvider", "options": {}}]
    cpu = [{"name": "CPUExecutionProvider", "options": {}}]
    doc = _doc(
        [
            _cand("default", final_ms=None, screen_ms=10.0, paired=1.0, baseline=True, providers=cpu),
            _cand("ov", final_ms=5.0, screen_ms=5.0, paired=0.5, providers=ov),
            _cand("int8-dynamic", final_ms=None, screen_ms=7.46, paired=0.75, providers=cpu),
        ],
        "ov",
    )
    for c in doc["candidates"]:
        c["vs_default"] = {"ratio": 10.0 / c["latency"]["p50_ms"], "timing": c["timing"]}
    line = provider_line(doc)
    assert line.endswith("best on the CPU EP: int8-dynamic ~1.34x est."), line
    assert ".." not in line
    doc["candidates"][2]["vs_default"]["timing"] = "interleaved"
    assert provider_line(doc).endswith("int8-dynamic 1.34x.")


def test_the_provider_line_names_the_fastest_on_each_ep_not_the_first_ranked():
    """ORT's default, timed in the final, ranks above a CPU INT8 variant timed only in the search: the line
    said 'best on the CPU EP: ORT default 1.00x' beside a measured ~1.62x."""
    from ortpilot.tuning.report import provider_line

    ov = [{"name": "OpenVINOExecutionProvider", "options": {}}]
    cpu = [{"name": "CPUExecutionProvider", "options": {}}]
    doc = _doc(
        [
            _cand("default", final_ms=10.0, screen_ms=10.0, paired=1.0, baseline=True, providers=cpu),
            _cand("ov", final_ms=5.0, screen_ms=5.0, paired=0.5, providers=ov),
            _cand("int8-dynamic-pc-x8", final_ms=None, screen_ms=6.17, paired=0.62, providers=cpu),
        ],
        "ov",
    )
    for c in doc["candidates"]:
        c["vs_default"] = {"ratio": 10.0 / c["latency"]["p50_ms"], "timing": c["timing"]}
    assert provider_line(doc).endswith("best on the CPU EP: int8-dynamic-pc-x8 ~1.62x est."), provider_line(doc)


def test_buckets_whose_outputs_cannot_be_cut_back_are_said_so_not_called_a_leaking_mask():
    """A CTC recognizer's steps are not a proportion of its padded width for every width: the gate saw another
    shape (error inf), and the report said the model's mask leaks, which is not what happened."""
    from ortpilot.tuning.report import shape_plan_line

    plan = {"dim": "W", "sizes": [152, 200]}
    rejected = {
        "label": "fp32 · buckets(152,200)",
        "status": "rejected",
        "shape_plan": plan,
        "accuracy": {
            "worst_error": float("inf"),
            "outputs": [{"name": "logits", "error": float("inf"), "note": "shape changed"}],
        },
    }
    doc = {"facts": {"shape_plan": plan}, "winner": {}, "candidates": [rejected]}
    line = shape_plan_line(doc)
    assert "'logits', cut back, did not have the shape" in line and "mask" not in line
    rejected["accuracy"]["outputs"][0]["note"] = ""
    assert "does not make padding invisible" in shape_plan_line(doc)
    # bucket candidates the budget left unmeasured passed no gate: the line said they had
    unmeasured = {"label": "fp32 · buckets(152,200)", "status": "budget", "shape_plan": plan}
    doc["candidates"] = [unmeasured, {**unmeasured, "status": "skipped"}]
    assert shape_plan_line(doc).endswith("were proposed but not measured before the budget ran out.")


@pytest.mark.parametrize("max_error", [1e-9, math.inf])
def test_the_latency_error_plot_draws_errors_that_are_all_alike_and_a_limit_of_inf_without_a_warning(
    recwarn, max_error
):
    # every candidate at the error floor and the limit there too (--max-error 1e-9): no empty y range;
    # --max-error inf (no limit): nothing to draw for it (setting the plot's range on it raised)
    doc = _issue_doc()
    for cand in doc["candidates"]:
        cand["accuracy"] = {"worst_error": 0.0}
    doc["max_error"] = max_error
    png = pareto_png(doc)
    assert base64.b64decode(png).startswith(b"\x89PNG")
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)], [str(w.message) for w in recwarn]


def test_when_orts_default_ships_the_headline_still_names_each_batch_size_asked_for():
    """--batch 1,8 on an OCR recognizer where ORT's default shipped: batch 8 left no trace but the profile."""
    from ortpilot.tuning.report import headline

    doc = {
        "speedup": {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0},
        "gate_data": {},
        "default_best": True,
        "default_best_reason": "ORT's default session measured fastest in the final interleaved measurement",
        "objective": "p50",
        "workload": {"batches": [1, 8], "dims": [], "summary": ""},
        "candidates": [],
    }
    assert headline(doc).endswith(
        "Batches of 8 not timed: they compare a winner with ORT's default, and ORT's default ships."
    )
    doc["workload"]["batches"] = [1]
    assert "Batches" not in headline(doc)


def test_a_first_run_that_cost_nothing_measurable_is_not_said_to_cost_a_negative_time():
    from ortpilot.tuning.report import warmup_line

    plan = {"dim": "DynamicDimension.1", "sizes": [60, 800], "first_run_ms": -1.02, "run_ms": 8.4, "warm": False}
    line = warmup_line({"warmup": plan})
    assert "cost the winner no more than the next (within the noise)" in line and "-1.02" not in line
    plan["first_run_ms"] = 3.3
    assert "cost the winner 3.30 ms more than the next (a run: 8.40 ms)" in warmup_line({"warmup": plan})
