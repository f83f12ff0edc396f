"""The budget policy, on an injected clock: model variants and the session knobs on the model as given by expected
gain per second, each preparation estimated from the model's size and skipped (and said) when it does not fit;
the report never calls ORT's default best while the budget left something unmeasured."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from ortpilot.modelio import load_model
from ortpilot.providers.cpuisa import Int8Rule
from ortpilot.tuning.budget import (
    CALIBRATION_LATENCIES,
    GATE_LATENCIES,
    PREPARE_S_PER_MB,
    QUANTIZE_S_PER_MB,
    SETTLE_S,
    Budget,
    PrepCosts,
)
from ortpilot.tuning.candidate import Candidate, baseline_candidate
from ortpilot.tuning.report import headline, untried_line
from ortpilot.tuning.search import Entry, Search
from ortpilot.tuning.space import DYN_PC, DYN_W_PC, OV_INT8, OV_INT8_SMOOTHED, QDQ_PC, gather_facts
from ortpilot.tuning.worker import MAX_LIVE_SESSIONS


class Clock:
    """A clock the test moves: the scripted steps advance it by what each step costs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedSteps:
    """The step runner's interface (``tuning.steps.StepRunner``), each step costing what the script says on the
    injected clock instead of running a worker: the policy on its own, the same on every machine."""

    def __init__(
        self,
        clock: Clock,
        prep_s: Callable[[Candidate], float],
        latency_s: Callable[[Candidate], float],
        skip: Callable[[Candidate], str] = lambda c: "",
        requests_per_run: int = 1,
        session_s: Callable[[Candidate], float] | None = None,
        graph: Callable[[Candidate], tuple[str, float]] | None = None,
        final_requests: int | None = None,
    ) -> None:
        self.clock, self.prep_s, self.latency_s, self.skip = clock, prep_s, latency_s, skip
        self.graph = graph  # (graph_sha256, worst held-out error) of a built model
        self.session_s = session_s  # a candidate's session creation (recorded, and paid again to reload it)
        self.requests = requests_per_run  # a run replays this many requests; samples are per request
        self.final_requests = final_requests or requests_per_run  # a run of the final, given another replay set
        self.final_replay: str | None = None  # the replay set the final was asked to time
        self.gate = None
        self.held: tuple[str, ...] = ()  # the worker's live sessions, least recently used first
        self.prepared: list[tuple[str, Candidate]] = []  # (phase, candidate), in the order they were started
        self.built: set[str] = set()  # the models built (a knob on one built is one session, as in the cache)
        self.final_ended: float | None = None

    def commit(self) -> None:
        pass

    def prepare(self, cand, phase, timeout, *, affordable=True):
        if not cand.baseline and not affordable:
            return None, False
        hit = cand.model_key in self.built
        seconds = self.prep_s(cand) if not hit else self.prep_s(Candidate())
        self.prepared.append((phase, cand))
        if seconds > timeout:  # the worker is stopped at the reserve, as the real runner does
            self.clock.now += timeout
            self.held = ()
            return {"status": "budget", "reason": "stopped: the budget ran out while it was being prepared"}, True
        self.clock.now += seconds
        if self.skip(cand):  # the pass changed nothing (the worker's NothingToDo)
            return {"status": "skipped", "reason": self.skip(cand), "seconds": seconds}, True
        self.built.add(cand.model_key)
        self._hold(cand)
        graph, worst = self.graph(cand) if self.graph and cand.passes else ("", 0.0)
        accuracy = {"passed": True, "max_error": 0.01, "worst_error": worst, "outputs": []}
        session = self.session_s(cand) if self.session_s else 0.05
        record = {
            "status": "ok",
            "seconds": seconds,
            "session_s": session,
            "model_path": "m.onnx",
            "cache_hit": hit,
            "accuracy": accuracy,
            **({"graph_sha256": graph} if graph else {}),
        }
        return record, True

    def _hold(self, cand) -> None:
        """The worker keeps its MAX_LIVE_SESSIONS most recently used, in order (a set's order made the sessions let
        go depend on PYTHONHASHSEED, and this test pass or fail by the process)."""
        self.held = (*[cid for cid in self.held if cid != cand.id], cand.id)[-MAX_LIVE_SESSIONS:]

    def _use(self, cand) -> None:
        """As the worker's bench: a session it let go is created again, and the one used is the most recent."""
        if cand.id not in self.held:
            self.clock.now += self.session_s(cand) if self.session_s else 0.05
        self._hold(cand)

    def bench(self, cand, stage, runs, timeout, *, anchor=None):
        for used in (anchor, cand) if anchor is not None else (cand,):  # the worker takes the anchor's first
            self._use(used)
        own = self.latency_s(cand)
        beside = self.latency_s(anchor) if anchor is not None else 0.0
        anchor_runs = 6 if anchor is not None else 0
        self.clock.now += (runs * own + anchor_runs * beside) * self.requests
        return {
            "status": "ok",
            "samples_s": [own] * runs,
            "anchor_samples_s": [beside] * anchor_runs,
            "settled_s": 0.05,
        }

    def rank(self, key, data, timeout, *, affordable=True):
        return []

    def final(self, finalists, plan, *, replay=None):
        for cand in finalists:
            if cand.id not in self.held:  # loaded again before the plan is made
                self.clock.now += self.session_s(cand) if self.session_s else 0.5
        runs, rounds, _, _ = plan()
        self.final_replay, requests = replay, self.final_requests if replay else self.requests
        self.clock.now += sum(
            (runs * rounds + 2) * self.latency_s(c) * requests + rounds * SETTLE_S for c in finalists
        )  # its runs, warm-up and settling
        self.final_ended = self.clock.now
        return {
            "status": "ok",
            "samples_s": {c.id: [self.latency_s(c)] * runs * rounds for c in finalists},
            "blocks": {c.id: [i // runs for i in range(runs * rounds)] for c in finalists},
        }


def _facts(demo_paths, name: str, model_mb: float):
    facts = gather_facts(load_model(demo_paths[name]), None, int8=Int8Rule("vnni", False, "VNNI (test)"))
    facts.model_mb = model_mb  # as large as the detector: INT8 preparations take tens of seconds
    return facts


def test_preparation_estimates_grow_with_size_and_calibration_and_learn_from_what_ran():
    clock = Clock()
    costs = PrepCosts(model_mb=20.0, calibration=72, heldout=24)
    budget = Budget(100.0, clock=clock, costs=costs)
    budget.sample_latency = 0.1  # ORT's default, one sample
    budget.record_prepare((), 2.0)  # ORT's default: a session and its held-out outputs
    session, basis = budget.prepare_estimate(())
    assert session == 2.0 and "one session" in basis
    dynamic, basis = budget.prepare_estimate(Candidate((DYN_PC,)).passes)
    assert dynamic == pytest.approx(2.0 + (PREPARE_S_PER_MB + QUANTIZE_S_PER_MB) * 20 + 24 * (GATE_LATENCIES - 1) * 0.1)
    assert basis == "20 MB to prepare and quantize"
    qdq, basis = budget.prepare_estimate(Candidate((QDQ_PC,)).passes)
    assert qdq == pytest.approx(dynamic + 72 * CALIBRATION_LATENCIES * 0.1)
    assert basis == "20 MB to prepare and quantize, 72 calibration samples"
    # what this tune built costs nothing again: the quantizer's preparation, and a model built whole
    built = [Candidate((DYN_PC,)).passes]
    assert budget.prepare_estimate(Candidate((DYN_W_PC,)).passes, built)[0] == pytest.approx(
        dynamic - PREPARE_S_PER_MB * 20
    )
    assert budget.prepare_estimate(Candidate((DYN_PC,)).passes, built) == (
        2.0,
        "its model is built already: one session",
    )
    # a preparation that ran twice as long as estimated doubles the estimates after it
    budget.record_prepare(Candidate((DYN_PC,)).passes, 2 * dynamic)
    again, basis = budget.prepare_estimate(Candidate((QDQ_PC,)).passes)
    assert again == pytest.approx(2 * qdq) and "x2.00, as the 1 variant(s) prepared so far ran" in basis
    # the clock is the injected one
    clock.now = 90.0
    assert budget.left() == pytest.approx(10.0)
    budget.keep(3.0)
    assert budget.left() == pytest.approx(7.0) and budget.affords(0.5) and not budget.affords(7.0)


def _search(demo_paths, name: str, model_mb: float, budget_s: float, steps_of: Callable[[Clock], ScriptedSteps]):
    facts = _facts(demo_paths, name, model_mb)
    clock = Clock()
    budget = Budget(
        budget_s, clock=clock, costs=PrepCosts(facts.model_mb, calibration=8, heldout=4, conv_heavy=facts.conv_heavy)
    )
    steps = steps_of(clock)
    search = Search(steps, budget, objective="p50", requests_per_run=steps.requests)
    search.run(baseline_candidate(), facts)
    return search, steps, budget


def _costs(prep: tuple[float, float], latency: tuple[float, float, float], requests: int = 1):
    """Scripted steps costing (a variant's preparation, a session) and the latencies of (a variant, ORT's default,
    another session)."""
    return lambda clock: ScriptedSteps(
        clock,
        prep_s=lambda c: prep[0] if c.passes else prep[1],
        latency_s=lambda c: latency[0] if c.passes else (latency[1] if c.baseline else latency[2]),
        requests_per_run=requests,
    )


def test_variants_by_gain_per_second_and_what_does_not_fit_is_not_started(demo_paths):
    variants: list[Candidate] = []

    def prep_s(cand: Candidate) -> float:
        """An INT8 preparation of a large model, 30 s; the quantizer prepares the model once (18 s after); a session."""
        if not cand.passes:
            return 0.5
        variants.append(cand)
        return 30.0 if len(variants) == 1 else 18.0

    search, steps, budget = _search(
        demo_paths,
        "encoder",
        60.0,
        60.0,
        lambda clock: ScriptedSteps(
            clock, prep_s=prep_s, latency_s=lambda c: 0.05 if c.passes else (0.1 if c.baseline else 0.09)
        ),
    )
    phases = [phase for phase, _ in steps.prepared]
    assert phases[0] == "baseline"
    # the variant with the most expected gain per second first: dynamic INT8 on a MatMul model (no calibration),
    # whose prior per second (0.9 over ~19 s) beats a session knob's (0.05 over ~3 s)
    first_variant = phases.index("model variants")
    assert first_variant == 1 and steps.prepared[first_variant][1].passes[-1].get("mode") == "dynamic"
    # the variants that would not finish in what was left were not started, each saying its estimate
    skipped = [e for e in search.entries.values() if e.status == "budget" and e.phase == "model variants"]
    assert len(skipped) >= 5
    for e in skipped:
        assert e.reason.startswith("not tried: its preparation and screening would take about "), e.reason
        assert "MB to " in e.reason and "were left before the final measurement" in e.reason
    assert not [c for _, c in steps.prepared if c in [e.candidate for e in skipped]]
    # the knobs on the model as given, due after the variants, took what was left; those that did not fit say so
    knobs = [e for e in search.entries.values() if e.phase == "sessions"]
    started = [i for i, phase in enumerate(phases) if phase == "sessions"]
    assert started and min(started) > max(i for i, phase in enumerate(phases) if phase == "model variants")
    assert len(knobs) >= 6 and {e.status for e in knobs} <= {"ok", "budget"}
    for e in knobs:
        assert e.status == "ok" or e.reason.startswith("not tried: its session and screening would take about ")
    # nothing was started that the budget then had to stop
    assert not [e for e in search.entries.values() if e.reason.startswith("stopped")]
    # and the search, the final included, ended inside the budget
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline


def test_session_knobs_come_first_where_they_are_cheaper_per_expected_gain(demo_paths):
    """A conv net of 120 MB, whose INT8 variants are calibrated (0.5-0.6 expected over ~33 s each): each knob on the
    model as given (0.05 over a 0.5 s session and 10 ms runs) is worth more per second, so they all run first."""
    search, steps, _ = _search(demo_paths, "cnn", 120.0, 120.0, _costs((30.0, 0.5), (0.008, 0.01, 0.009)))
    phases = [phase for phase, _ in steps.prepared]
    first_variant = phases.index("model variants")
    # ORT's default, then everything that costs one session (each knob on the model as given, then those combined)
    assert phases[0] == "baseline" and set(phases[1:first_variant]) == {"sessions"}
    sessions = [e for e in search.entries.values() if e.phase == "sessions"]
    assert len(sessions) >= 6 and all(e.status == "ok" for e in sessions), [
        (e.candidate.label, e.status) for e in sessions
    ]


def test_slow_timed_runs_put_the_int8_variants_before_the_knobs(demo_paths):
    """A server's batches of 32 on a slow CPU (MiniLM, 2026-12-07): a timed run replays four requests of 90 ms, so
    a knob's session and screening cost ~10 s for its 0.05 expected; the INT8 variants, 25 s to prepare for 0.9,
    are measured first, where knobs first spent the whole 120 s budget on float sessions (1.05x shipped)."""
    search, steps, budget = _search(demo_paths, "encoder", 86.0, 120.0, _costs((25.0, 0.7), (0.045, 0.09, 0.088), 4))
    phases = [phase for phase, _ in steps.prepared]
    first_variant, first_knob = phases.index("model variants"), phases.index("sessions")
    assert first_variant < first_knob
    # every variant tried before the first knob was due: its prior per second was above a knob's
    tried = [e for e in search.entries.values() if e.phase == "model variants" and e.status == "ok"]
    assert [c.passes[-1].get("mode") for _, c in steps.prepared[first_variant:first_knob]] == ["dynamic"] * 3
    assert tried and min(search.score(e) for e in tried) < search.score(search.anchor) / 1.5
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline


def test_a_conv_net_tries_calibrated_int8_before_dynamic_int8(demo_paths):
    facts = _facts(demo_paths, "cnn", model_mb=1.0)
    clock = Clock()
    budget = Budget(600.0, clock=clock, costs=PrepCosts(facts.model_mb, calibration=8, heldout=4, conv_heavy=True))
    steps = ScriptedSteps(clock, prep_s=lambda c: 1.0, latency_s=lambda c: 0.01 if c.baseline else 0.008)
    Search(steps, budget, objective="p50").run(baseline_candidate(), facts)
    modes = [c.passes[-1].get("mode") for phase, c in steps.prepared if phase == "model variants"]
    assert modes[0] in ("qdq", "full") and modes.index("dynamic") > modes.index("qdq")


def test_a_fused_variant_waits_for_fusion_alone_and_is_dropped_when_fusion_finds_nothing(demo_paths):
    facts = _facts(demo_paths, "encoder", model_mb=1.0)
    clock = Clock()
    budget = Budget(600.0, clock=clock, costs=PrepCosts(facts.model_mb, calibration=8, heldout=4))
    fusion = facts.fusion_step
    steps = ScriptedSteps(
        clock,
        prep_s=lambda c: 1.0,
        latency_s=lambda c: 0.01 if c.baseline else 0.008,
        skip=lambda c: "transformer fusion (bert) found no pattern to fuse" if c.passes == (fusion,) else "",
    )
    search = Search(steps, budget, objective="p50")
    search.run(baseline_candidate(), facts)
    tried = [c.passes for phase, c in steps.prepared if phase == "model variants"]
    assert (fusion,) in tried and not [p for p in tried if p[:1] == (fusion,) and len(p) > 1]
    fused = [e for e in search.entries.values() if e.candidate.passes[:1] == (fusion,) and len(e.candidate.passes) > 1]
    assert fused and all(e.status == "skipped" and "found no pattern" in e.reason for e in fused)


def _doc(default_best: bool, statuses: list[str]) -> dict:
    cands = [
        {
            "id": f"c{i}",
            "label": f"fp32 · intra={i}" if i % 2 else f"int8-dynamic · intra={i}",
            "status": status,
            "passes": [] if i % 2 else [{"pass": "quantize", "mode": "dynamic"}],
        }
        for i, status in enumerate(statuses)
    ]
    return {
        "default_best": default_best,
        "default_best_reason": "ORT's default measured fastest in the search, against fp32 · intra=1",
        "candidates": cands,
        "gate_data": {"source": "synthetic", "samples": 4},
        "speedup": {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0},
    }


def test_the_headline_never_calls_the_default_best_while_something_was_left_unmeasured():
    measured_all = _doc(True, ["ok", "ok", "rejected"])
    assert headline(measured_all).startswith("ORT's default session was already best: ")
    assert untried_line(measured_all) == ""
    left = _doc(True, ["ok", "budget", "ok", "budget", "budget"])
    said = headline(left)
    assert "already best" not in said and said.startswith("ORT's default session ships: ")
    assert "3 candidates were not measured within the budget" in said
    line = untried_line(left)
    assert line.startswith(
        "Not measured within the budget: 3 candidates (2 that cost one session each and 1 model variant: "
        "fp32 · intra=1, fp32 · intra=3, int8-dynamic · intra=4)"  # the cheap ones first
    )


def test_the_final_is_planned_once_the_worker_holds_every_finalist_again(tmp_path, demo_paths):
    """The worker keeps a few sessions; a finalist it let go is created again (a session, no outputs) before the
    final's runs are planned, so the plan counts the time that is really left."""
    from ortpilot.graph.feeds import generate_samples
    from ortpilot.tuning.journal import Journal
    from ortpilot.tuning.steps import StepRunner
    from ortpilot.tuning.worker import MAX_LIVE_SESSIONS, WorkerClient, save_samples

    proto = load_model(demo_paths["mlp"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    save_samples(scratch / "heldout.npz", generate_samples(proto, 2))
    save_samples(scratch / "calibration.npz", generate_samples(proto, 2))
    (scratch / "worker.json").write_text(json.dumps({"model": str(demo_paths["mlp"]), "shapes": {}}))
    base = baseline_candidate()
    cands = [base, *(base.with_settings(intra_op_threads=n, level=lv) for n in (1, 2) for lv in ("basic", "extended"))]
    cands += [base.with_iobinding(), base.with_settings(enable_cpu_mem_arena=False)]
    assert len(cands) > MAX_LIVE_SESSIONS
    worker = WorkerClient(scratch)
    steps = StepRunner(worker, Journal(tmp_path / "j.jsonl", resume=False), lambda ref: None)
    held_at_plan: list[set[str]] = []

    def plan():
        held_at_plan.append(set(steps.held))
        return 2, 2, 60.0, 60.0

    try:
        for cand in cands:
            assert steps._request("prepare", cand.to_dict(), 120)["status"] == "ok"
        finalists = cands[:3]  # the first ones prepared: let go since
        assert not {c.id for c in finalists} <= set(steps.held)
        record = steps.final(finalists, plan)
        # a final that runs slower than planned stops its rounds at its time, after the fewest it takes
        request = {"candidates": [c.to_dict() for c in finalists], "runs": 2, "rounds": 6, "warmup": 1}
        short = steps._request("bench", {**request, "within_s": 0.0, "min_rounds": 2}, 120)
    finally:
        worker.close()
    assert all(sorted(set(blocks)) == [0, 1] for blocks in short["blocks"].values())
    assert record["status"] == "ok" and held_at_plan and {c.id for c in finalists} <= held_at_plan[0]
    assert all(len(record["samples_s"][c.id]) == 4 for c in finalists)


def test_the_time_the_other_batch_sizes_need_is_kept_from_the_search_and_from_the_final():
    """--batch 1,32: batch 32's timing after the final was 'not timed: about 10 s were needed and 0-4 s were
    left' in every 120 s MiniLM tune, the final having taken all that was left."""
    clock = Clock()
    plain = Budget(100.0, clock=clock)
    kept = Budget(100.0, clock=clock, after_final=lambda latency: 400 * latency)
    for budget in (plain, kept):
        budget.latency = 0.025  # ORT's default's run of the replay set, once measured
    assert kept.after_final_s() == pytest.approx(10.0) and plain.after_final_s() == 0.0
    assert kept.reserve() == pytest.approx(plain.reserve() + 10.0)
    assert kept.affords(100.0 - plain.reserve() - 5.0) is False and plain.affords(100.0 - plain.reserve() - 5.0)
    runs, rounds = plain.final_plan(0.01, screen_runs=1000)
    kept_runs, kept_rounds = kept.final_plan(0.01, screen_runs=1000)
    assert rounds == kept_rounds and kept_runs < runs  # the final leaves the batch timings their 10 s
    replaying = Budget(100.0, binding=False, clock=clock, after_final=lambda latency: 400 * latency)
    assert replaying.after_final_s() == 0.0  # a replayed search is decided by its journal


def test_a_batch_reserve_over_a_quarter_of_the_budget_is_not_kept():
    import importlib
    from types import SimpleNamespace

    from ortpilot.data.workload import Workload

    module = importlib.import_module("ortpilot.tuning.tune")  # the package exports the function of that name
    setup = SimpleNamespace(workload=Workload("text", 8, batches=(1, 32)), batched={32: [{}] * 4}, replay=[{}] * 8)
    seconds = module._batch_reserve(setup, 120.0)
    small = seconds(0.008)  # 1 ms a request
    assert small == pytest.approx(module._batch_seconds(0.001, 4, 32, 1)) and 0 < small <= 30.0
    assert seconds(0.8) == 0.0  # 100 ms a request: batch 32 would take most of the budget


def test_a_workload_search_counts_a_run_as_its_replay_set_and_ends_inside_the_budget(demo_paths):
    """A run of a workload replays 8 requests and its samples are per request: the halving rounds and the
    final's reserve were estimated per request, 8x short, and a 120 s MiniLM tune reached its final with
    5.6 s left of an 11.5 s reserve."""
    facts = _facts(demo_paths, "encoder", model_mb=1.0)
    clock = Clock()
    budget = Budget(60.0, clock=clock, costs=PrepCosts(facts.model_mb, calibration=8, heldout=4))
    steps = ScriptedSteps(  # 1 ms a request: the search has time for halving rounds
        clock,
        prep_s=lambda c: 0.3,
        latency_s=lambda c: 0.0007 if c.passes else (0.001 if c.baseline else 0.0009),
        requests_per_run=8,
    )
    search = Search(steps, budget, objective="p50", requests_per_run=8)
    search.run(baseline_candidate(), facts)
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline


@pytest.mark.parametrize("variants_s", [0.03, 0.09])  # INT8 at a third of ORT's default's time, or as slow
def test_a_final_that_replays_every_batch_of_a_screened_set_is_planned_at_its_own_size(demo_paths, variants_s):
    """Batches of 32 on a slow CPU: the search screens 4 of the 6 calls, the final replays all 6; planned at the
    search's 4 (a run 1.5x short), its reserve and runs would end past the budget, and so would its reserve before
    three likely finalists are known (three of ORT's default's runs: of the final's 6 calls, not the search's 4)."""
    facts = _facts(demo_paths, "encoder", model_mb=1.0)
    for budget_s in [float(b) for b in range(16, 90, 3)]:  # planned at 4: 22, 25, 31, 34 s ended up to 2 s past
        clock = Clock()
        budget = Budget(budget_s, clock=clock, costs=PrepCosts(facts.model_mb, calibration=8, heldout=4))
        steps = ScriptedSteps(
            clock,
            prep_s=lambda c: 1.0 if c.passes else 0.3,
            latency_s=lambda c: variants_s if c.passes else (0.09 if c.baseline else 0.08),
            requests_per_run=4,
            final_requests=6,
        )
        search = Search(
            steps, budget, objective="p50", requests_per_run=4, samples_per_request=32, final_replay=("b32", 6)
        )
        search.run(baseline_candidate(), facts)
        assert steps.final_replay == "b32"
        assert steps.final_ended is not None and steps.final_ended <= budget.deadline, budget_s


def _earlier_tune(demo_paths, reads_cache: bool) -> tuple[Search, set[str]]:
    """A 60 s search of an 86 MB model whose dynamic and QDQ INT8 models an earlier tune left in the cache (a
    session's time to load, 20 s to build anything else); ``reads_cache``: ``Search.cached`` tells it so."""
    facts = _facts(demo_paths, "encoder", model_mb=86.0)
    earlier = {Candidate(p).model_key for p in ((DYN_PC,), (DYN_W_PC,), (QDQ_PC,))}
    clock = Clock()
    budget = Budget(60.0, clock=clock, costs=PrepCosts(facts.model_mb, calibration=150, heldout=50))
    steps = ScriptedSteps(clock, prep_s=lambda c: 20.0 if c.passes else 1.0, latency_s=lambda c: 0.01)
    steps.built = set(earlier)
    cached = (lambda passes: tuple(passes) if Candidate(passes).model_key in earlier else ()) if reads_cache else None
    search = Search(steps, budget, objective="p50", cached=cached)
    search.run(baseline_candidate(), facts)
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline
    return search, earlier


def test_a_model_served_from_the_cache_teaches_no_build_estimate(demo_paths):
    """A cache hit read as a build 14x faster than estimated scaled every later estimate down (x0.07), so the next
    real build was started and stopped by the budget half-way, its time lost."""
    search, _ = _earlier_tune(demo_paths, reads_cache=False)
    assert not [e.candidate.label for e in search.entries.values() if e.reason.startswith("stopped: the budget")]
    assert search.budget.ratios and min(search.budget.ratios) > 0.5  # only builds measure builds


def test_a_variant_an_earlier_tune_built_is_estimated_at_its_load_not_at_a_build(demo_paths):
    """A second tune of MiniLM estimated OpenVINO's INT8 at 38 s to build (86 MB, 150 calibration samples) and left
    it untried with 30 s left, its model in the cache to load in 1.2 s. Read from the cache (``Search.cached``),
    the variants an earlier tune built are estimated as a session each, and all tried."""
    blind, earlier = _earlier_tune(demo_paths, reads_cache=False)
    seeing, _ = _earlier_tune(demo_paths, reads_cache=True)

    def tried(search: Search) -> set[str]:
        return {e.candidate.model_key for e in search.entries.values() if e.status == "ok" and e.candidate.passes}

    assert not earlier <= tried(blind) and earlier <= tried(seeing)
    as_builds = [
        e.reason for e in seeing.entries.values() if e.candidate.model_key in earlier and "quantize" in e.reason
    ]
    assert not as_builds, as_builds


def test_a_quantizers_preparation_an_earlier_tune_left_is_not_estimated_again():
    """``transform.cached_prefix`` ends in ``prepare`` where the prepared model is in the cache and the quantized one
    is not: the estimate then charges the quantization alone, as it does after this tune's own build."""
    from ortpilot.tuning.transform import PREPARE

    costs = PrepCosts(model_mb=86.0, calibration=8, heldout=4)
    cold, _ = costs.estimate((DYN_PC,), 1.0, 0.01)
    prepared, basis = costs.estimate((DYN_PC,), 1.0, 0.01, built=[(PREPARE,)])
    assert prepared == pytest.approx(cold - PREPARE_S_PER_MB * 86.0) and basis.startswith("86 MB to quantize")
    assert costs.estimate((DYN_PC,), 1.0, 0.01, built=[(DYN_W_PC,)])[0] == prepared  # a sibling this tune built


def test_a_cold_tune_of_a_transformer_builds_openvinos_int8_before_dynamic_int8(demo_paths):
    """NNCF's INT8 on OpenVINO ran MiniLM 2.9-3.3x ORT's default at batches of 32 where dynamic INT8 ran 1.5-1.8x;
    ranked below it, a cold 120 s tune built the dynamic variants first and missed OpenVINO's INT8 by a second."""
    facts = _facts(demo_paths, "encoder", model_mb=86.0)
    clock = Clock()
    budget = Budget(120.0, clock=clock, costs=PrepCosts(facts.model_mb, calibration=150, heldout=50))
    steps = ScriptedSteps(clock, prep_s=lambda c: 1.0, latency_s=lambda c: 0.1, requests_per_run=4)
    search = Search(steps, budget, objective="p50", requests_per_run=4, samples_per_request=32)
    search._baseline(baseline_candidate())
    base = baseline_candidate()
    ov = [{"name": "OpenVINOExecutionProvider", "options": {"num_of_threads": "2"}}]
    queue = [
        base.derived(passes=(DYN_W_PC,)),
        base.derived(passes=(DYN_PC,)),
        base.derived(passes=(OV_INT8,), providers=ov),
    ]
    first, _ = search._next(queue, facts)
    assert first.passes == (OV_INT8,)
    assert search._next(queue[:2], facts)[0].passes == (DYN_W_PC,)  # without it, the space's order


def test_a_calibration_sample_is_estimated_at_one_samples_time_in_a_tune_of_batches(demo_paths):
    """A tune of batches of 32 replays 4 of them a run: a calibration or held-out sample runs alone, so it costs the
    default's time a request over the batch, not a run's (counted so, NNCF's 150 calibration samples of MiniLM were
    estimated at 90 s and a 120 s tune never reached its OpenVINO INT8 candidates)."""
    facts = _facts(demo_paths, "encoder", model_mb=1.0)
    clock = Clock()
    costs = PrepCosts(facts.model_mb, calibration=150, heldout=50)
    budget = Budget(120.0, clock=clock, costs=costs)
    steps = ScriptedSteps(
        clock, prep_s=lambda c: 0.3, latency_s=lambda c: 0.03 if c.passes else 0.048, requests_per_run=4
    )
    search = Search(steps, budget, objective="p50", requests_per_run=4, samples_per_request=32)
    search.run(baseline_candidate(), facts)
    assert budget.latency == pytest.approx(4 * 0.048) and budget.sample_latency == pytest.approx(0.048 / 32)
    qdq, _ = costs.estimate(Candidate((QDQ_PC,)).passes, 0.3, budget.sample_latency)
    one_run, _ = costs.estimate(Candidate((QDQ_PC,)).passes, 0.3, budget.latency)
    assert qdq < 2.0 < 90.0 < one_run
    alone = Budget(120.0, clock=Clock(), costs=costs)  # one sample a request: a request's time
    Search(
        ScriptedSteps(Clock(), lambda c: 0.3, lambda c: 0.003, requests_per_run=8),
        alone,
        objective="p50",
        requests_per_run=8,
    ).run(baseline_candidate(), facts)
    assert alone.sample_latency == pytest.approx(0.003) and alone.latency == pytest.approx(8 * 0.003)


@pytest.mark.parametrize("budget_s", [40.0, 44.0])
def test_a_finalist_let_go_is_reloaded_at_its_own_session_time_within_the_reserve(demo_paths, budget_s):
    """A shape plan's bucket sessions take several plain sessions' time to create (MiniLM on OpenVINO: 2.6-2.9 s
    against 0.3-0.7 s); when the worker has let two such finalists go, the reserve counts their own session times,
    so the final (and the batch sizes after it) still end inside the budget. So does halving, which creates again
    the sessions of those it times (at 44 s it counted a plain session for each: four 6 s reloads, 58.5 s of 44)."""
    facts = _facts(demo_paths, "encoder", model_mb=1.0)
    clock = Clock()
    budget = Budget(budget_s, clock=clock, costs=PrepCosts(facts.model_mb, calibration=8, heldout=4))
    steps = ScriptedSteps(
        clock,
        prep_s=lambda c: 6.0 if c.passes else 0.3,
        latency_s=lambda c: 0.0007 if c.passes else (0.001 if c.baseline else 0.0009),
        requests_per_run=8,
        session_s=lambda c: 6.0 if c.passes else 0.3,  # the fast ones are the slow ones to create
    )
    search = Search(steps, budget, objective="p50", requests_per_run=8)
    finalists = search.run(baseline_candidate(), facts)
    assert any(f.candidate.passes for f in finalists)
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline
    # a step that could make the worker let the likely finalists go (stopped by the budget, which takes the worker
    # with it, or a new session pushing them out) counts creating them again at their own session times, two of 6 s
    # and the default's 0.3 s (the reserve alone counts only those let go already: one more went once, and the
    # final ended at 62.8 s of 60)
    held = [e.reason for e in search.entries.values() if "sessions the worker holds" in e.reason]
    assert any("plus 12 s to create again the likely finalists' sessions" in r for r in held), held


@pytest.mark.parametrize(
    ("model_mb", "budget_s", "prep_s", "requests"),
    [
        (86.0, 60.0, 25.0, 1),  # a second INT8 build, estimated to fit, stopped at the reserve: 55.3 s of 47.5
        (20.0, 40.0, 1.0, 8),  # halving four variants the worker let go, each pushing out the next: 36.1 s of 28
    ],
)
def test_the_search_ends_inside_the_budget_where_the_worker_loses_the_finalists(
    demo_paths, model_mb, budget_s, prep_s, requests
):
    """Variants' sessions take 6 s to create, plain ones 3 s: a step stopped by the budget takes the worker and the
    likely finalists' sessions with it, and a bench needs its session and the anchor's again where the worker let
    them go (it keeps MAX_LIVE_SESSIONS): both are counted before a step starts, so the final still fits."""
    search, steps, budget = _search(
        demo_paths,
        "encoder",
        model_mb,
        budget_s,
        lambda clock: ScriptedSteps(
            clock,
            prep_s=lambda c: prep_s if c.passes else 3.0,
            latency_s=lambda c: 0.001 * (0.5 if c.passes else (1.0 if c.baseline else 0.97)),
            requests_per_run=requests,
            session_s=lambda c: 6.0 if c.passes else 3.0,
        ),
    )
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline
    assert search.reference is not None and any(e.candidate.passes for e in search._finalists(search.reference))
    assert not [e for e in search.entries.values() if e.reason.startswith("stopped")]
    if model_mb == 86.0:  # the second build was not started: it fit only were the worker never stopped
        second = [e for e in search.entries.values() if e.phase == "model variants"][1]
        assert (
            second.status == "budget" and "plus 9.0 s to create again the likely finalists' sessions" in second.reason
        )


def test_a_model_found_the_less_accurate_twin_is_not_built_on_another_session(demo_paths):
    """Two INT8 recipes with one graph (NNCF's own, its SmoothQuant 0.8 + min-max): on one session the more accurate
    stays (``_dominated``); on another session of the same provider the less accurate one is skipped unprepared, so
    the budget goes to its twin there (a 120 s MiniLM tune prepared NNCF's own with ACCURACY, shipped it, and broke a
    sentence of traffic at cosine 0.9868, while the smoothed recipe with ACCURACY was left for the budget)."""
    clock = Clock()
    errors = {OV_INT8.label(): 0.0048, OV_INT8_SMOOTHED.label(): 0.0028}
    steps = ScriptedSteps(
        clock,
        prep_s=lambda c: 1.0 if c.passes else 0.3,
        latency_s=lambda c: 0.005 if c.passes else 0.01,
        graph=lambda c: ("one-graph", errors[c.passes[0].label()]),
    )
    search = Search(steps, Budget(600.0, clock=clock), objective="p50")
    base = baseline_candidate()
    search._baseline(base)
    own, smoothed = base.derived(passes=(OV_INT8,)), base.derived(passes=(OV_INT8_SMOOTHED,))
    assert search.evaluate(Entry(own, "model variants")).status == "ok"
    assert search.evaluate(Entry(smoothed, "model variants")).status == "ok"
    assert search.entries[own.id].status == "skipped"  # the same graph on the same session, less accurate
    own_basic = own.with_settings(level="basic")
    entry = search.evaluate(Entry(own_basic, "session knobs"))
    assert entry.status == "skipped" and "less accurate values" in entry.reason and smoothed.label in entry.reason
    assert own_basic not in [c for _, c in steps.prepared]
    assert search.evaluate(Entry(smoothed.with_settings(level="basic"), "session knobs")).status == "ok"


def test_with_only_orts_default_measured_the_reserve_is_a_final_of_two(demo_paths):
    """An OCR recognizer (17 ms a request, 8 requests a run) in a 20 s tune: ORT's default took 5 s, and the
    reserve of a three-way final left 1.1 s for a candidate that needed 6 s; the tune ended at 7 s of 20 having
    measured nothing else. The next candidate measured makes a final of two, and that is what is kept for it."""
    facts = _facts(demo_paths, "encoder", model_mb=8.0)
    clock = Clock()
    budget = Budget(20.0, clock=clock, costs=PrepCosts(facts.model_mb, calibration=54, heldout=18))
    steps = ScriptedSteps(
        clock, prep_s=lambda c: 5.0 if c.baseline else 6.0, latency_s=lambda c: 0.017, requests_per_run=8
    )
    search = Search(steps, budget, objective="p50", requests_per_run=8)
    search.run(baseline_candidate(), facts)
    assert [c.baseline for _, c in steps.prepared] == [True]  # 20 s: only ORT's default fits, as in that tune
    search._plan_reserve()
    assert budget.final_per_run == pytest.approx(2 * budget.latency * budget.final_scale)
    assert steps.final_ended is not None and steps.final_ended <= budget.deadline
