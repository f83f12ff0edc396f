"""report.html (every candidate, a Pareto plot of latency vs error) and report.md (for a PR).

Both are rendered from ``TuneResult.to_dict()``, so they show exactly what the JSON says, and
so does the terminal summary (``cli.cmd_tune``), from the same helpers here: the headline, the
gate line (each output's metric and its evidence) and each candidate's ratio to ORT's default.
The reports also keep the gate-data warning (synthetic inputs, fewer than 16 samples), which the
terminal shows once, when the tune starts. Two kinds of figure never share a column: the finalists and ORT's
default timed round-robin in one process at the end (``final``: they pick the winner and make the
headline), and every candidate's search-phase timings, a few runs round-robin beside ORT's default
(``search``: the ratio of those side-by-side costs, an estimate that ranks candidates for the final).
A candidate whose estimate beats the shipped figure gets a line saying why it is not the winner.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_text
from ortpilot.eps import CPU_EP
from ortpilot.session.warmup import WARM_BUDGET_S


def write_reports(result: Any) -> None:
    doc = result.to_dict()
    atomic_write_text(result.files["report_html"], render_html(doc))
    atomic_write_text(result.files["report_md"], render_md(doc))


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _err(c: dict[str, Any]) -> str:
    acc = c.get("accuracy") or {}
    worst = acc.get("worst_error")
    if worst is None:
        return "-"
    return "inf" if isinstance(worst, float) and math.isinf(worst) else f"{worst:.2e}"


def _figures(figures: dict[str, Any] | None) -> str:
    """A ctc check's figures beside its error: per-step top-1 agreement and the decoded sequences kept."""
    if not figures or "sequence_exact_match" not in figures:
        return ""
    return (
        f" (steps {figures['step_top1_agreement']:.1%} top-1, {figures['sequence_exact_match']:.1%} of "
        f"{int(figures.get('sequences') or 0)} sequences identical)"
    )


def _ctc(c: dict[str, Any]) -> str:
    """The figures of a candidate's ctc checks, for its error cell."""
    return "".join(_figures(o.get("figures")) for o in (c.get("accuracy") or {}).get("outputs", []))


def _lat(c: dict[str, Any]) -> dict[str, Any]:
    return c.get("latency") or c.get("screen_latency") or {}


def _final_lat(c: dict[str, Any]) -> dict[str, Any]:
    """The candidate's latency from the interleaved final measurement ({} when it was not a finalist)."""
    return (c.get("latency") or {}) if c.get("timing") == "interleaved" else {}


def final_ratio(doc: dict[str, Any], c: dict[str, Any]) -> float | None:
    """``c``'s p50 speedup over the reference in the interleaved final (None when either was not in it)."""
    base, mine = _final_lat(doc["baseline"]).get("p50_ms"), _final_lat(c).get("p50_ms")
    return base / mine if base and mine else None


def search_ratio(doc: dict[str, Any], c: dict[str, Any]) -> float | None:
    """``c``'s search-phase estimate: its cost over the reference's, each timed beside ORT's default (the
    search's anchor), or the ratio of their screening p50s where one never ran beside it."""
    base = doc["baseline"]
    if c.get("paired_cost") and base.get("paired_cost"):
        return base["paired_cost"] / c["paired_cost"]
    b, m = (base.get("screen_latency") or {}).get("p50_ms"), (c.get("screen_latency") or {}).get("p50_ms")
    return b / m if b and m else None


def ranked_candidates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A tune document's candidates: the finalists fastest first by their final measurement (the figures
    that pick the winner), then the others measured in the search by their estimate, then the rest."""
    final = sorted((c for c in doc["candidates"] if _final_lat(c)), key=lambda c: _final_lat(c)["p50_ms"])
    searched = [c for c in doc["candidates"] if c not in final and c["status"] == "ok" and _lat(c)]
    searched.sort(key=lambda c: -(search_ratio(doc, c) or 0.0))
    rest = [c for c in doc["candidates"] if c not in final and c not in searched]
    return final + searched + rest


def why_not_lines(doc: dict[str, Any]) -> list[str]:
    """One line for each candidate whose search estimate beats the figure the profile ships with (the
    winner's final speedup, 1.0 where ORT's default stays): why it is not the winner."""
    won = 1.0 if doc["default_best"] else final_ratio(doc, doc["winner"]) or doc["speedup"]["ratio"]
    order = sorted(
        (c for c in doc["candidates"] if c["status"] == "ok" and c.get("paired_cost") and not c.get("baseline")),
        key=lambda c: c["paired_cost"],
    )
    over = doc.get("passed_over") or {}
    lines = [f"Not the winner though the final measured it faster: {over['why']}."] if over else []
    for c in doc["candidates"]:
        est = search_ratio(doc, c)
        if c["status"] != "ok" or c["id"] in (doc["winner"]["id"], over.get("id")) or c.get("baseline"):
            continue
        if not est or est <= won:
            continue
        final = final_ratio(doc, c)
        if final is not None:
            why = f"the final measured it at {final:.2f}x" + ("" if doc["default_best"] else ", and its figures decide")
        else:
            rank = next((i for i, o in enumerate(order, 1) if o["id"] == c["id"]), None)
            # a finalist ranked below it: Search._finalists gave the runner-up's place to a more accurate one
            below = next((o for o in order[rank or len(order) :] if final_ratio(doc, o) is not None), None)
            if not rank:
                why = "it never ran beside ORT's default, so it could not be ranked"
            elif below is not None:
                why = (
                    f"it ranked #{rank} by its search figure, and the final's second place went to "
                    f"{below['label']}, more accurate and within the search's noise of the leader"
                )
            else:
                why = f"it ranked #{rank} by its search figure and the final measures the top two"
        lines.append(f"Not the winner though its estimate is higher: {c['label']} (~{est:.2f}x est.): {why}.")
    return lines


def warmup_line(doc: dict[str, Any]) -> str:
    """What a first run at a new size costs the winner, and what a load does about it ("" when not measured)."""
    plan = doc.get("warmup")
    if not plan:
        return ""
    sizes = plan["sizes"]
    extra = float(plan["first_run_ms"])  # a median of differences: at or under 0 where none is measurable
    cost = f"{extra:.2f} ms more than the next" if extra > 0 else "no more than the next (within the noise)"
    measured = f"a first run at a new '{plan['dim']}' cost the winner {cost} (a run: {plan['run_ms']:.2f} ms)"
    if not plan.get("warm"):
        return f"Warm-up: {measured}; not worth warming at load."
    batches = plan.get("batches") or [1]
    at = f" at batch {batches[0]}" + "".join(f", then {b}" for b in batches[1:]) if batches != [1] else ""
    return (
        f"Warm-up: {measured}, so load_profile runs it once at each of {len(sizes)} sizes ({min(sizes)}-{max(sizes)}, "
        f"the workload's most frequent first){at} before the first request, within "
        f"{WARM_BUDGET_S:g} s; the headline is that prepared session's."
    )


def shape_plan_line(doc: dict[str, Any]) -> str:
    """What became of the workload's shape buckets: the winner runs them, the gate rejected them (the model's
    mask does not make padding invisible), or they passed and ran no faster ("" when none were proposed)."""
    plan = doc["facts"].get("shape_plan")
    if not plan:
        return ""
    where = f"buckets({','.join(map(str, plan['sizes']))}) of '{plan['dim']}'"
    winner_plan = doc["winner"].get("shape_plan")
    if winner_plan:
        memory = (doc["winner"].get("prepared") or {}).get("session_mb")
        held = f" ({len(winner_plan['sizes'])} sessions, {memory:.0f} MB resident)" if memory is not None else ""
        return (
            f"Shape plan: {where}, a session per bucket{held}; each request is padded up to its bucket (mask 0) "
            "and its outputs cut back, and every padded held-out request passed the gate at its own size."
        )
    tried = [c for c in doc["candidates"] if c.get("shape_plan") and c["status"] in ("ok", "rejected")]
    if not tried:  # none measured: the budget, a skip, a failure (each one's row says which)
        return f"Shape buckets {where} were proposed but not measured before the budget ran out."
    passed = [c for c in tried if c["status"] == "ok"]
    if not passed and any(c["status"] == "rejected" for c in tried):
        worst = min(
            (c for c in tried if c["status"] == "rejected"),
            key=lambda c: (c.get("accuracy") or {}).get("worst_error") or 0,
        )
        reshaped = [
            o["name"] for o in (worst.get("accuracy") or {}).get("outputs", []) if o.get("note") == "shape changed"
        ]
        if reshaped:  # an output whose size follows the dim another way than in proportion (a CTC head's steps)
            return (
                f"Shape buckets {where} were rejected by the gate: a padded request's '{reshaped[0]}', cut back, did "
                f"not have the shape it has at the request's own size ({worst['label']}), so this model's outputs "
                "cannot be cut back from a bucket; the profile leaves the dim free."
            )
        return (
            f"Shape buckets {where} were rejected by the gate: padding changed the outputs ({worst['label']}: error "
            f"{_err(worst)} on the worst held-out request at its own size), so this model's mask does not make padding "
            "invisible; the profile leaves the dim free."
        )
    best = max(passed, key=lambda c: search_ratio(doc, c) or 0.0, default=None)
    est = search_ratio(doc, best) if best else None
    return (
        f"Shape buckets {where} passed the gate but were not faster on this workload"
        + (f" (best: {best['label']}, ~{est:.2f}x est.)" if best and est else "")
        + "; the profile leaves the dim free."
    )


def table_rows(doc: dict[str, Any], count: int = 6) -> list[dict[str, Any]]:
    """The terminal table's rows: the fastest passing candidates, always with the profile's winner and ORT's
    default among them (the two the headline compares), in ranked order."""
    ok = [c for c in ranked_candidates(doc) if c["status"] == "ok"]
    must = {doc["winner"]["id"], doc["baseline"]["id"]}
    others = [c for c in ok if c["id"] not in must][: max(0, count - len(must))]
    keep = must | {c["id"] for c in others}
    return [c for c in ok if c["id"] in keep]


def int8_lines(doc: dict[str, Any]) -> list[str]:
    """Which INT8 rule this CPU got, and why each INT8 variant is in the space (empty when quantization was off)."""
    rule = doc["facts"].get("int8_rule")
    if not rule:
        return []
    lines = [f"INT8 rule for this CPU: {rule['name']} ({rule['reason']})."]
    lines += [f"- {label}: {reason}" for label, reason in (doc["facts"].get("int8_variants") or {}).items()]
    return lines


def untried(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The candidates the budget left unmeasured (status ``budget``), those that cost one session each first."""
    left = [c for c in doc["candidates"] if c["status"] == "budget"]
    return sorted(left, key=lambda c: bool(c.get("passes")))


def untried_line(doc: dict[str, Any]) -> str:
    """What the budget did not measure, in one line ('' when it measured everything): how many, how many of
    them cost one session each, and the first few by name."""
    left = untried(doc)
    if not left:
        return ""
    sessions = sum(1 for c in left if not c.get("passes"))
    names = ", ".join(c["label"] for c in left[:4]) + (", ..." if len(left) > 4 else "")
    kinds = " and ".join(
        part
        for part in (
            f"{sessions} that cost one session each" if sessions else "",
            f"{len(left) - sessions} model variant{'s' * (len(left) - sessions != 1)}" if len(left) > sessions else "",
        )
        if part
    )
    return (
        f"Not measured within the budget: {len(left)} candidate{'s' * (len(left) != 1)} ({kinds}: {names}); "
        "the report gives each one's reason, and a larger --budget measures them"
    )


def load_line(doc: dict[str, Any]) -> str:
    return f"Note: {doc['load_note']}." if doc.get("load_note") else ""


def headline(doc: dict[str, Any]) -> str:
    from ortpilot.data import gate_phrase

    sp = doc["speedup"]
    data = doc.get("gate_data") or {}
    gated = gate_phrase(data) if data.get("source") != "synthetic" else ""  # synthetic: gate_warning says so
    gated = f" {gated[0].upper()}{gated[1:]}." if gated else ""
    if doc["default_best"]:
        timed = f" on {doc['objective']}{workload_clause(doc)}" if workload_clause(doc) else ""
        left = untried(doc)
        later = [int(b) for b in ((doc.get("workload") or {}).get("batches") or [1])[1:]]
        batches = (  # each size the user asked for is said, timed or not
            f" Batches of {', '.join(map(str, later))} not timed: they compare a winner with ORT's default, and ORT's "
            "default ships."
            if later
            else ""
        )
        if left:  # never "already best" while the budget left something unmeasured
            return (
                f"ORT's default session ships{timed}: {doc['default_best_reason']}; {len(left)} candidate"
                f"{'s were' if len(left) != 1 else ' was'} not measured within the budget, so it is the best "
                f"of what was measured, not of everything.{batches}{gated}"
            )
        return f"ORT's default session was already best{timed}: {doc['default_best_reason']}.{batches}{gated}"
    timing = (
        "interleaved final measurement"
        if (doc["winner"].get("vs_default") or {}).get("timing", "interleaved") == "interleaved"
        else "search-phase estimate, not interleaved"
    )
    return (
        f"Winner: {doc['winner']['label']} — {sp['ratio']:.2f}x {reference_name(doc['baseline'])} on {doc['objective']}"
        f"{workload_clause(doc)} (95% CI {sp['ci_low']:.2f}-{sp['ci_high']:.2f}; {timing}).{batch_clause(sp)}"
        f"{state_clause(sp)}{gated}"
    )


def batch_clause(speedup: dict[str, Any]) -> str:
    """`` In batches of 8: 2.10x (1,234 vs 587 items/s); of 32: ...`` where batch sizes were timed, and
    `` Batches of 32 not timed: about 40 s were needed ... (a larger --budget times them).`` for each the user
    asked for that was not."""
    figures = speedup.get("by_batch") or {}
    missing = speedup.get("batches_not_timed") or {}
    parts = [
        f"of {int(float(b))}: {f['ratio']:.2f}x ({f['winner_items_per_s']:,.0f} vs {f['default_items_per_s']:,.0f} items/s)"
        for b, f in sorted(figures.items(), key=lambda kv: float(kv[0]))
    ]
    timed = " In batches " + "; ".join(parts) + "." if parts else ""
    untimed = "".join(
        f" Batches of {int(float(b))} not timed: {why} (a larger --budget times them)."
        for b, why in sorted(missing.items(), key=lambda kv: float(kv[0]))
    )
    return timed + untimed


def workload_clause(doc: dict[str, Any]) -> str:
    """`` per request of this workload (sequence 5-134 (p50 17, ...) over 200 text requests)`` where the requests
    the tune timed differ in size ("" for one shape: the shapes line says which)."""
    workload = doc.get("workload") or {}
    if not workload.get("dims"):
        return ""
    return f" per request of this workload ({workload['summary']})"


def state_clause(speedup: dict[str, Any]) -> str:
    """`` ORT's default ran at two speeds during the tune (...); the winner's speedup beside each: 1.18x fast
    (ORT's default 0.444 ms), ...``, or
    where the winner was timed in one of them only, which one and that its figure in the other is unknown."""
    states = speedup.get("by_state") or {}
    seen = speedup.get("states_seen_ms") or {}
    if len(states) == 2:
        figures = ", ".join(
            f"{f['speedup']:.2f}x {state} (ORT's default {f['default_p50_ms']:.3f} ms)"
            for state, f in sorted(states.items())
        )
        return f" ORT's default ran at two speeds during the tune; the winner's speedup beside each: {figures}."
    if len(seen) < 2:
        return ""
    speeds = " and ".join(f"{ms:.3f} ms {state}" for state, ms in sorted(seen.items()))
    timed = next(iter(states), None)
    where = f"only in the {timed} one ({states[timed]['speedup']:.2f}x)" if timed else "in neither for long enough"
    return (
        f" ORT's default ran at two speeds during the tune ({speeds}); the winner was timed beside it {where}: "
        "its speedup in the other is not known, and `ortpilot verify OUTDIR --bench` measures it there."
    )


def provider_line(doc: dict[str, Any]) -> str:
    """Which EP won and by how much, beside the best passing candidate on each other EP ('' when the
    search tried one EP): ``OpenVINO won: 4.36x ORT's default; best on CPU: int8-dynamic-w-pc ~1.82x est.``"""
    best: dict[str, dict[str, Any]] = {}
    for c in ranked_candidates(doc):  # by ratio, not rank: ORT's default, timed in the final, ranks first
        first = ((c.get("providers") or [{}])[0]).get("name", CPU_EP)
        ratio = (c.get("vs_default") or {}).get("ratio")
        if c["status"] == "ok" and ratio and (first not in best or ratio > best[first]["vs_default"]["ratio"]):
            best[first] = c
    if len(best) < 2 or doc["default_best"]:
        return ""
    won = ((doc["winner"].get("providers") or [{}])[0]).get("name", CPU_EP)
    others = [f"best on {_ep_words(ep)}: {c['label']} {ratio_cell(c)}" for ep, c in best.items() if ep != won]
    line = (
        f"{_ep_words(won)[0].upper()}{_ep_words(won)[1:]} won: {doc['speedup']['ratio']:.2f}x {reference_name(doc['baseline'])}; "
        + "; ".join(others)
    )
    return line if line.endswith(".") else f"{line}."  # a last "~1.34x est." ends the sentence already


def failed_provider_lines(doc: dict[str, Any]) -> list[str]:
    """One line per EP the search asked for where every candidate failed, with the first one's reason: the
    profile then runs elsewhere (ORT's CPU EP), which a user who asked for that EP must read on the console,
    not only in the report's table."""
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for c in doc["candidates"]:
        by_ep.setdefault(((c.get("providers") or [{}])[0]).get("name", CPU_EP), []).append(c)
    lines = []
    for ep, tried in by_ep.items():
        failed = [c for c in tried if c["status"] in ("failed", "crashed", "timeout")]
        if ep == CPU_EP or not failed or any(c["status"] in ("ok", "rejected") for c in tried):  # some ran
            continue
        reason = " ".join(str(failed[0].get("reason") or "no reason recorded").split())
        lines.append(
            f"{_ep_words(ep)}: none of its candidates ran ({len(failed)} failed), so the profile does not use it. "
            f"The first one's error: {reason[:400]}{'...' if len(reason) > 400 else ''}"
        )
    return lines


def _ep_words(name: str) -> str:
    return "the CPU EP" if name == CPU_EP else name.removesuffix("ExecutionProvider")


def reference_name(base: dict[str, Any]) -> str:
    """What a tune's speedups are quoted against, from its baseline candidate's dict: ORT's default, or that
    session capped at the CPU budget where the default's pool would take CPUs outside it (``Search._reference``)."""
    if base.get("baseline", True):
        return "ORT's default"
    return f"ORT's default capped at {(base.get('settings') or {}).get('intra_op_threads')} thread(s)"


def vs_default(baseline: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """A candidate's p50 ratio to ORT's default, like with like: both from the interleaved final
    measurement when both took part in it, else both from their search-phase benches beside the
    search's anchor (ORT's default; ``paired_cost``), or, without those, their search-phase timings."""
    both_final = c.get("timing") == "interleaved" and baseline.get("timing") == "interleaved"
    if not both_final and c.get("paired_cost") and baseline.get("paired_cost"):
        # both timed beside the search's anchor (ORT's default): the ratio of those side-by-side costs
        return {"ratio": baseline["paired_cost"] / c["paired_cost"], "timing": "search"}
    key = "latency" if both_final else "screen_latency"
    base, mine = (baseline.get(key) or {}).get("p50_ms"), (c.get(key) or {}).get("p50_ms")
    ratio = base / mine if base and mine else None
    return {"ratio": ratio, "timing": "interleaved" if both_final else "search"}


def ratio_cell(c: dict[str, Any]) -> str:
    """``1.13x`` for an interleaved ratio, ``~1.35x est.`` for a search-phase one, ``-`` for none."""
    vs = c.get("vs_default") or {}
    if vs.get("ratio") is None:
        return "-"
    return f"{vs['ratio']:.2f}x" if vs.get("timing") == "interleaved" else f"~{vs['ratio']:.2f}x est."


def final_cells(doc: dict[str, Any], c: dict[str, Any]) -> tuple[str, str]:
    """(p50 ms with its 95% CI, speedup) from the interleaved final; dashes for a candidate not in it."""
    lat, ratio = _final_lat(c), final_ratio(doc, c)
    if not lat:
        return "-", "-"
    ci = lat.get("median_ci95_ms")
    p50 = f"{lat['p50_ms']:.3f}" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
    return p50, "-" if ratio is None else f"{ratio:.2f}x"


def search_cells(doc: dict[str, Any], c: dict[str, Any]) -> tuple[str, str]:
    """(screening p50 ms, search-phase estimate of the speedup), never mixed with the final's figures."""
    lat, ratio = c.get("screen_latency") or {}, search_ratio(doc, c)
    p50 = f"{lat['p50_ms']:.3f}" if lat.get("p50_ms") else "-"
    return p50, "-" if ratio is None else f"~{ratio:.2f}x"


RATIO_NOTE = (
    "'final' columns: the interleaved final measurement of the finalists and ORT's default, the figures that "
    "pick the winner and make the headline; 'search' columns: search-phase estimates from screening and halving "
    "runs, each timed round-robin beside ORT's default (few runs: they rank candidates for the final)."
)


def ratio_note(doc: dict[str, Any]) -> str:
    """``RATIO_NOTE``, and where the search replayed a part of the final's requests, which part."""
    screened = doc.get("screened")
    if not screened:
        return RATIO_NOTE
    batch = (doc.get("workload") or {}).get("batches", [1])[0]
    what = f"batches of {batch}" if batch > 1 else "requests"
    return (
        f"{RATIO_NOTE} A search run replayed {screened[0]} of the {screened[1]} {what} a final run replays, at "
        "evenly spaced positions: its p50 ms are of another mix than the final's."
    )


def time_line(doc: dict[str, Any]) -> str:
    """Where the budget went, as the wall clock saw it: the search and its final measurement, and, once the
    outputs are written (the terminal's summary, ``--json``), the whole call."""
    budget = f" of a {doc['budget_s']:.0f} s budget" if doc.get("budget_s") else ""
    if doc.get("total_s") is None:
        return f"search and final measurement {doc['wall_s']:.0f} s{budget}"
    over = doc["total_s"] - doc["budget_s"] if doc.get("budget_s") else 0.0
    return (
        f"{doc['total_s']:.0f} s in all{budget} (search and final measurement {doc['wall_s']:.0f} s, writing the "
        f"outputs {doc['total_s'] - doc['wall_s']:.0f} s)" + (f"; {over:.0f} s over the budget" if over >= 1 else "")
    )


def gate_line(doc: dict[str, Any]) -> str:
    """Each output's metric, and the evidence it was chosen on, and the limit."""
    evidence = doc.get("metric_evidence") or {}
    return (
        "Accuracy gate per output: "
        + "; ".join(f"{n}: {m}" + (f" ({evidence[n]})" if evidence.get(n) else "") for n, m in doc["metrics"].items())
        + f"; max error {doc['max_error']:g}."
        + (
            " Only the outputs the deployment reads (--outputs): the model was pruned to them."
            if doc.get("outputs")
            else ""
        )
    )


def gate_warning_line(doc: dict[str, Any]) -> str:
    return f"Warning: the accuracy gate was {doc['gate_warning']}." if doc.get("gate_warning") else ""


def data_line(doc: dict[str, Any]) -> str:
    """Where the gate's held-out samples and the calibration samples came from (``gate_data``, ``calibration_data``)."""

    from ortpilot.data import samples_phrase

    def one(d: dict[str, Any] | None) -> str:
        if not d:
            return "-"
        where = f" from {d['path']}" if d.get("path") else ""
        digest = f" (sha256 {d['sha256'][:12]})" if d.get("sha256") else ""
        return f"{samples_phrase(d)}{where}{digest}"

    from ortpilot.gate.result import rare_break_clause

    gate, calibration = doc.get("gate_data") or {}, doc.get("calibration_data") or {}
    reading = gate.get("reading") or calibration.get("reading")
    reach = rare_break_clause(int(gate.get("samples") or 0)) if gate.get("source") not in (None, "synthetic") else ""
    return (
        f"Gate data: {one(gate)}; calibration data: {one(calibration)}."
        + (f" Read as: {reading}." if reading else "")
        + (f" {reach}" if reach else "")
    )


def render_md(doc: dict[str, Any]) -> str:
    lines = [
        f"# ortpilot tune: {doc['model']}",
        "",
        headline(doc),
        "",
        *([providers, ""] if (providers := provider_line(doc)) else []),
        *([load_line(doc), ""] if doc.get("load_note") else []),
        f"ONNX Runtime {doc['onnxruntime']}, shapes "
        + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in doc["shapes"].items())
        + f", objective {doc['objective']}, {time_line(doc)}.",
        "",
        gate_line(doc) + " Outputs compared with ORT's default session's on held-out inputs.",
        "",
        data_line(doc),
        "",
        *([gate_warning_line(doc), ""] if doc.get("gate_warning") else []),
        "| candidate | status | final p50 ms (95% CI) | final vs default | search p50 ms | search vs default "
        "| p99 ms | error | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in ranked_candidates(doc):
        final, search = final_cells(doc, c), search_cells(doc, c)
        mark = " **(profile)**" if c["id"] == doc["winner"]["id"] else ""
        lines.append(
            f"| {c['label']}{mark} | {c['status']} | {final[0]} | {final[1]} | {search[0]} | {search[1]} | "
            f"{_ms(_lat(c).get('p99_ms'))} | {_err(c)}{_ctc(c)} | {c['reason'].replace('|', '/')} |"
        )
    why_not = why_not_lines(doc)
    if why_not:
        lines += ["", *why_not]
    if plan := shape_plan_line(doc):
        lines += ["", plan]
    if warmup := warmup_line(doc):
        lines += ["", warmup]
    if untried(doc):
        lines += ["", untried_line(doc) + "."]
    int8 = int8_lines(doc)
    if int8:
        lines += ["", int8[0], "", *int8[1:]]
    excluded = doc["facts"].get("excluded") or []
    if excluded:
        lines += ["", "Not tried:", ""] + [f"- {e['what']}: {e['reason']}" for e in excluded]
    lines += ["", f"Speedups are over {reference_name(doc['baseline'])}. {ratio_note(doc)}"]
    return "\n".join(lines) + "\n"


def pareto_png(doc: dict[str, Any]) -> str:
    """Latency vs error scatter with the Pareto front, as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for c in doc["candidates"]:
        lat = _lat(c)
        acc = c.get("accuracy") or {}
        if lat.get("p50_ms") is None or acc.get("worst_error") is None or math.isinf(acc["worst_error"]):
            continue
        points.append((lat["p50_ms"], max(acc["worst_error"], 1e-9), c["status"] == "ok", c["label"]))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for ok, color, name in ((True, "tab:blue", "passed gate"), (False, "tab:red", "rejected")):
        xs = [p[0] for p in points if p[2] == ok]
        ys = [p[1] for p in points if p[2] == ok]
        if xs:
            ax.scatter(xs, ys, c=color, label=name, s=22)
    front, best = [], math.inf
    for p in sorted(points):
        if p[1] < best:
            front.append(p)
            best = p[1]
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8, label="Pareto front")
    if math.isfinite(doc["max_error"]):  # --max-error inf: no limit to draw
        ax.axhline(doc["max_error"], color="gray", lw=0.8, ls=":", label="max error")
    drawn = [y for y in [*(p[1] for p in points), doc["max_error"]] if math.isfinite(y) and y > 0]
    if drawn:  # room around what is drawn: every error alike (at the 1e-9 floor, at the limit) is no empty range
        ax.set_ylim(min(drawn) / 3, max(drawn) * 3)
    ax.set_yscale("log")
    ax.set_xlabel("p50 latency (ms)")
    ax.set_ylabel("worst output error")
    ax.legend(fontsize=8)
    ax.set_title("latency vs error")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def render_html(doc: dict[str, Any]) -> str:
    e = html.escape
    rows = []
    for c in ranked_candidates(doc):
        lat = _lat(c)
        final, search = final_cells(doc, c), search_cells(doc, c)
        acc = c.get("accuracy") or {}
        per_out = "; ".join(
            f"{o['name']}: {o['metric']} {o['error']:.2e}{_figures(o.get('figures'))}" for o in acc.get("outputs", [])
        )
        cls = "win" if c["id"] == doc["winner"]["id"] else ("" if c["status"] == "ok" else "rej")
        rows.append(
            f"<tr class='{cls}'><td>{e(c['label'])}</td><td>{e(c['phase'])}</td><td>{e(c['status'])}</td>"
            f"<td>{e(final[0])}</td><td>{e(final[1])}</td><td>{e(search[0])}</td><td>{e(search[1])}</td>"
            f"<td>{_ms(lat.get('p99_ms'))}</td><td>{lat.get('count', '-')}</td>"
            f"<td>{e(per_out) or '-'}</td><td>{e(c['reason'])}</td><td><code>{c['id']}</code></td></tr>"
        )
    excluded = "".join(f"<li>{e(x['what'])}: {e(x['reason'])}</li>" for x in doc["facts"].get("excluded") or [])
    int8 = int8_lines(doc)
    int8_html = (
        (
            f"<h2>INT8 variants</h2><p>{e(int8[0])}</p><ul>"
            + "".join(f"<li>{e(line[2:])}</li>" for line in int8[1:])
            + "</ul>"
        )
        if int8
        else ""
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ortpilot tune report</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}tr.win{{background:#dfd}}tr.rej{{color:#888}}</style></head><body>
<h1>ortpilot tune: {e(doc["model"])}</h1>
<p><b>{e(headline(doc))}</b></p>
{f"<p>{e(providers)}</p>" if (providers := provider_line(doc)) else ""}
{f"<p>{e(load_line(doc))}</p>" if doc.get("load_note") else ""}
<p>ONNX Runtime {e(doc["onnxruntime"])}; shapes {e(str(doc["shapes"]))}; objective {e(doc["objective"])};
{e(time_line(doc))}.</p>
<p>{e(gate_line(doc))}</p>
<p>{e(data_line(doc))}</p>
{f"<p><b>{e(gate_warning_line(doc))}</b></p>" if doc.get("gate_warning") else ""}
<img alt="Pareto plot of latency vs error" src="data:image/png;base64,{pareto_png(doc)}">
<h2>Candidates</h2>
<table><tr><th>candidate</th><th>phase</th><th>status</th><th>final p50 ms (95% CI)</th><th>final vs default</th>
<th>search p50 ms</th><th>search vs default</th><th>p99 ms</th><th>runs</th>
<th>accuracy (per output)</th><th>why rejected / note</th><th>id</th></tr>
{"".join(rows)}</table>
{"".join(f"<p>{e(line)}</p>" for line in [*why_not_lines(doc), shape_plan_line(doc), warmup_line(doc)] if line)}
{f"<p>{e(untried_line(doc))}.</p>" if untried(doc) else ""}
{int8_html}
<h2>Not tried</h2><ul>{excluded or "<li>nothing ruled out</li>"}</ul>
<p>Speedups are over {e(reference_name(doc["baseline"]))}. {e(ratio_note(doc))}</p></body></html>
"""
