"""Candidates, space rules and the journal, without running a search."""

from __future__ import annotations

import importlib.util
import json

import pytest

from ortpilot.modelio import load_model
from ortpilot.tuning.candidate import Candidate, baseline_candidate
from ortpilot.tuning.journal import Journal, read_journal
from ortpilot.tuning.space import (
    combine,
    first_candidates,
    gather_facts,
    has_parallel_branches,
    knob_variants,
)


def test_candidate_id_is_stable_and_roundtrips():
    cand = Candidate(({"pass": "quantize", "mode": "dynamic", "per_channel": True},)).with_settings(intra_op_threads=1)
    again = Candidate.from_dict(json.loads(json.dumps(cand.to_dict())))
    assert again.id == cand.id and again.label == cand.label
    assert cand.id != cand.with_iobinding().id
    assert baseline_candidate().label == "ORT default"


def test_space_follows_the_model(demo_paths):
    enc = gather_facts(load_model(demo_paths["encoder"]), None)
    mlp = gather_facts(load_model(demo_paths["mlp"]), None)
    assert enc.model_type == "bert" and mlp.model_type is None
    assert has_parallel_branches(load_model(demo_paths["encoder"]))  # Q, K and V projections
    assert any("fusion" in e.what for e in mlp.excluded)
    assert any("Azure" in e.what for e in mlp.excluded)  # listed by ORT, runs nothing locally
    enc_labels = [c.label for c in first_candidates(enc, baseline_candidate())]
    assert any(label.startswith("fusion(bert)") for label in enc_labels)
    assert not any("fusion" in c.label for c in first_candidates(mlp, baseline_candidate()))
    knobs = knob_variants(baseline_candidate(), mlp)
    assert all(c.settings.intra_op_threads <= mlp.cores for c in knobs)
    assert not any(c.settings.execution_mode == "parallel" for c in knobs) or mlp.parallel_branches
    spin = [c for c in knobs if "spin=off" in c.label]
    assert len(spin) == (1 if mlp.cores >= 2 else 0)
    assert all(c.settings.config_entries == {"session.intra_op.allow_spinning": "0"} for c in spin)


def test_buckets_come_first_for_single_requests_and_wait_as_a_knob_for_a_servers_batches(demo_paths):
    """At a batch of 32 each call is padded to its longest already: on MiniLM the bucket sessions ran 0.85x
    OpenVINO's dynamic one and 0.7x on the CPU EP, and screening them first took 25 s of a 120 s tune."""
    facts = gather_facts(load_model(demo_paths["encoder"]), None)
    facts.shape_plan = {"dim": "sequence", "sizes": [16, 32], "axes": [["input_ids", 1]], "pad_values": {}}
    base = baseline_candidate()
    assert any(c.shape_plan == facts.shape_plan for c in first_candidates(facts, base))  # one request a call
    facts.batch = 32
    assert not any(c.shape_plan for c in first_candidates(facts, base))
    assert any(c.shape_plan == facts.shape_plan for c in knob_variants(base, facts))  # tried by its gain per second


def test_a_fused_candidate_has_a_knob_that_leaves_skip_layer_norm_unfused(demo_paths):
    """The knob changes the fusion step only (the INT8 step after it stays), once; combined with a session knob
    that also won, both apply."""
    facts = gather_facts(load_model(demo_paths["encoder"]), None)
    fused = next(c for c in first_candidates(facts, baseline_candidate()) if len(c.passes) == 2 and "fusion" in c.label)
    apart = [c for c in knob_variants(fused, facts) if "no SkipLayerNorm" in c.label]
    assert len(apart) == 1 and apart[0].passes[1] == fused.passes[1]
    assert apart[0].passes[0].options.skip_layer_norm is False and fused.passes[0].options.skip_layer_norm is True
    assert all(c.passes == apart[0].passes for c in knob_variants(apart[0], facts))  # no second model knob
    assert not any("SkipLayerNorm" in c.label for c in knob_variants(baseline_candidate(), facts))
    both = combine(fused, [apart[0], fused.with_settings(level="basic")])
    assert both is not None and both.passes == apart[0].passes and both.settings.level == "basic"
    assert Candidate.from_dict(json.loads(json.dumps(both.to_dict()))).id == both.id


def test_combine_never_builds_parallel_mode_without_inter_op_threads():
    base = Candidate()
    bad = base.with_settings(execution_mode="parallel")  # inter_op_threads stays 0
    assert combine(base, [bad, base.with_iobinding()]) is None
    good = combine(base, [base.with_settings(level="basic"), base.with_iobinding()])
    assert good is not None and good.iobinding and good.settings.level == "basic"


def test_journal_drops_a_torn_last_line_and_defers_writing(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal(path, resume=False)
    journal.append({"kind": "prepared", "id": "a", "status": "failed"})
    assert not path.exists()  # nothing on disk before commit (a failed start writes nothing)
    journal.commit()
    journal.append({"kind": "bench", "id": "a", "stage": "screen", "status": "ok", "samples_s": [0.1]})
    journal.close()
    with open(path, "ab") as fh:
        fh.write(b'{"kind": "bench", "id": "b", "sta')  # killed mid-write
    assert [r["id"] for r in read_journal(path)] == ["a", "a"]
    resumed = Journal(path, resume=True)
    assert resumed.get("bench", "a", "screen") is not None and resumed.get("bench", "b", "screen") is None
    resumed.commit()
    resumed.append({"kind": "bench", "id": "b", "stage": "screen", "status": "ok", "samples_s": [0.1]})
    resumed.close()
    assert [r["id"] for r in read_journal(path)] == ["a", "a", "b"]


def test_load_note_warns_when_other_work_held_the_cores_at_the_start_or_during_the_run():
    from ortpilot.tuning.tune import load_note

    assert load_note([0.4, 2.1], cores=2) == ""  # the tune's own worker raises the end figure
    assert "busy" in load_note([3.0, 2.0], cores=2) and "intra=1" in load_note([3.0], cores=2)
    assert load_note([], cores=2) == ""
    # load that arrived mid-tune: the start figure was quiet, other processes took 40 % of the CPU time
    mid = load_note([0.4, 2.1], cores=2, others_cpu=0.4)
    assert "other processes used 40%" in mid and "verify OUTDIR --bench" in mid and "busy" not in mid
    assert load_note([0.4, 2.1], cores=2, others_cpu=0.1) == ""


def test_state_note_warns_when_the_default_ran_at_another_speed_in_the_final_than_in_the_search():
    """The figures of a real flip on a 2-core VM (the demo encoder's default at 0.45 ms, then 0.73 ms, with
    nothing in /proc/stat): the search and the headline came from two machine states."""
    from ortpilot.tuning.result import state_note

    fast, slow = [0.00044, 0.00045, 0.00046], [0.00072, 0.00073, 0.00074]
    note = state_note(fast, slow)
    assert "0.450 ms in the search and 0.730 ms in the final" in note and "verify OUTDIR --bench" in note
    assert "0.730 ms in the search and 0.450 ms in the final" in state_note(slow, fast)
    assert state_note(fast, [0.00050]) == ""  # 1.11x: within one state's spread
    assert state_note(fast, []) == "" and state_note([], slow) == ""  # no final figure: nothing to compare


def test_model_variants_run_on_the_cpu_too_when_another_provider_comes_first(demo_paths):
    """With an accelerator EP first (OpenVINO, CUDA), INT8 on the CPU must still compete."""
    from ortpilot.providers.names import ProviderSpec

    facts = gather_facts(
        load_model(demo_paths["cnn"]), [ProviderSpec("OpenVINOExecutionProvider"), ProviderSpec("CPUExecutionProvider")]
    )
    cands = first_candidates(facts, baseline_candidate())
    on = {
        name: [c for c in cands if c.providers[0]["name"] == name]
        for name in ("OpenVINOExecutionProvider", "CPUExecutionProvider")
    }
    quantized = {name: [c for c in group if c.passes] for name, group in on.items()}
    assert quantized["CPUExecutionProvider"]
    # On OpenVINO, INT8 is NNCF's QDQ model (where NNCF is installed), never the CPU EP's QDQ variants.
    if importlib.util.find_spec("nncf") is not None:
        assert quantized["OpenVINOExecutionProvider"]
        assert {c.passes[-1].name for c in quantized["OpenVINOExecutionProvider"]} == {"openvino_int8"}
    else:
        assert not quantized["OpenVINOExecutionProvider"]
        assert any(e.what == "int8-openvino" and "nncf" in e.reason for e in facts.excluded)
    assert len({c.id for c in cands}) == len(cands)  # no candidate twice
    assert any(not c.passes for c in on["OpenVINOExecutionProvider"])  # the plain model on OpenVINO


def test_openvino_is_tried_compiled_per_shape_where_a_dim_is_free_and_never_on_a_decoder(demo_paths):
    """onnxruntime-openvino's ``disable_dynamic_shapes`` is an OpenVINO knob where the model leaves a dim free,
    not on a shape plan's static buckets, not on a decoder (every step a new shape), never twice."""
    from ortpilot.models import make_decoder
    from ortpilot.providers.names import ProviderSpec
    from ortpilot.tuning.space import PER_SHAPE_OPTION, compiles_per_shape, openvino_knobs

    ov = ProviderSpec("OpenVINOExecutionProvider", {"num_of_threads": "2"})
    encoder = gather_facts(load_model(demo_paths["encoder"]), [ov])
    assert encoder.symbolic_inputs and compiles_per_shape(encoder)
    base = baseline_candidate().derived(passes=(), providers=({"name": ov.name, "options": dict(ov.options)},))
    per_shape = [c for c in openvino_knobs(base, encoder) if PER_SHAPE_OPTION in c.providers[0]["options"]]
    assert len(per_shape) == 1 and per_shape[0].providers[0]["options"][PER_SHAPE_OPTION] == "True"
    assert "disable_dynamic_shapes=True" in per_shape[0].label
    assert not [c for c in openvino_knobs(per_shape[0], encoder) if c.providers == per_shape[0].providers]
    plan = {"dim": "sequence", "sizes": [8, 16], "axes": [["input_ids", 1]], "pad_values": {}, "beyond": "dynamic"}
    assert not [c for c in openvino_knobs(base.with_shape_plan(plan), encoder) if PER_SHAPE_OPTION in c.label]
    both = combine(base, [per_shape[0], base.with_shape_plan(plan)])  # two knobs that beat it: buckets fix the shapes
    assert both is not None and both.shape_plan and PER_SHAPE_OPTION not in both.providers[0]["options"]
    decoder = gather_facts(make_decoder(), [ov])
    assert decoder.decoder and decoder.symbolic_inputs and not compiles_per_shape(decoder)
    static = load_model(demo_paths["encoder"])
    for graph_input in static.graph.input:
        for dim in graph_input.type.tensor_type.shape.dim:
            dim.dim_value = 8
    assert not gather_facts(static, [ov]).symbolic_inputs


def test_no_candidate_but_the_baseline_oversubscribes_the_cpu_budget(demo_paths):
    """Under ``taskset -c 0`` ORT's default still starts its usual pool: every other candidate gets
    explicit threads within the budget, and the capped default comes first as its stand-in."""
    from ortpilot.tuning.space import default_stand_in

    facts = gather_facts(load_model(demo_paths["encoder"]), None)
    facts.default_threads = facts.cores + 1
    base = baseline_candidate()
    cands = first_candidates(facts, base)
    assert cands[0] == default_stand_in(facts, base) and cands[0].settings.intra_op_threads == facts.cores
    assert all(0 < c.settings.intra_op_threads <= facts.cores for c in cands)
    for knob_base in (base, *cands[:3]):
        assert all(0 < c.settings.intra_op_threads <= facts.cores for c in knob_variants(knob_base, facts))
    facts.default_threads = facts.cores
    assert all(c.settings.intra_op_threads == 0 for c in first_candidates(facts, base))


@pytest.mark.isa
@pytest.mark.parametrize("rule", ["vnni", "amx", "x86-no-vnni", "arm-dot", "unknown"])
def test_int8_variants_follow_the_cpus_int8_rule(demo_paths, rule):
    from ortpilot.providers.cpuisa import Int8Rule
    from ortpilot.tuning.candidate import pass_label

    facts = gather_facts(
        load_model(demo_paths["encoder"]), None, int8=Int8Rule(rule, rule == "x86-no-vnni", f"{rule} reason")
    )
    steps = [
        c.passes[-1]
        for c in first_candidates(facts, baseline_candidate())
        if c.passes and c.passes[-1]["pass"] == "quantize"
    ]
    labels = list(dict.fromkeys(pass_label(s) for s in steps))
    assert set(labels) == set(facts.to_dict()["int8_variants"]) and all(facts.int8_reasons.values())
    if rule == "x86-no-vnni":  # 7-bit weights first, per channel first; U8U8 next; u8s8 as-is last
        assert labels[:2] == ["int8-dynamic-w-pc-rr", "int8-dynamic-pc-rr"]
        assert "int8-dynamic-w-pc-u8u8" in labels and "saturate" in facts.int8_reasons["int8-dynamic-w-pc-rr"]
        plain = [i for i, s in enumerate(steps) if not s.get("reduce_range") and s.get("weight_type") != "quint8"]
        assert plain and min(plain) > max(i for i, s in enumerate(steps) if s.get("reduce_range"))
    else:
        assert not any(s.get("reduce_range") or s.get("weight_type") == "quint8" for s in steps)
    if rule == "arm-dot":
        assert labels[0] == "int8-qdq-pc-s8s8" and "S8S8 QDQ" in facts.int8_reasons[labels[0]]
    if rule in ("vnni", "amx", "unknown"):
        assert labels[0] == "int8-dynamic-w-pc"


@pytest.mark.isa
def test_this_cpus_measured_rule_decides_the_space(demo_paths):
    from ortpilot.providers.cpuisa import int8_rule

    facts = gather_facts(load_model(demo_paths["encoder"]), None)
    assert facts.int8 == int8_rule()
    reduced = any(s.get("reduce_range") for c in first_candidates(facts, baseline_candidate()) for s in c.passes)
    assert reduced == int8_rule().u8s8_saturates


class SteppingClock:
    """A clock that moves only when a run is made: each ``step()`` takes ``run_s`` of its time."""

    def __init__(self, run_s: float) -> None:
        self.now, self.run_s, self.runs = 100.0, run_s, 0

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.run_s
        self.runs += 1


def test_each_final_turn_settles_for_settle_s_by_the_clock_and_the_plan_pays_for_it(demo_paths):
    """The final's turns start with untimed runs (the session before may still spin its pool for ~30 ms),
    by the clock however fast the model, capped in runs only where a bench asks; the final's plan leaves
    time for them. The settle's logic is checked on a clock that moves one run at a time (the machine's
    speed is the benchmarks' business), its wiring on a real session by counts alone."""
    import time

    from ortpilot.measure.bench import Runner
    from ortpilot.measure.interleave import settle
    from ortpilot.tuning.budget import FINAL_ROUNDS, SETTLE_S, Budget

    run_s = 1 / 1024  # exact in binary: the clock's sums carry no rounding
    fast = SteppingClock(run_s)  # a fast model: by the clock, many runs
    assert settle(fast.step, 50 * run_s, clock=fast) == 50 * run_s and fast.runs == 50
    capped = SteppingClock(run_s)  # capped where a bench asks
    assert settle(capped.step, 50 * run_s, most=5, clock=capped) == 5 * run_s and capped.runs == 5
    slow = SteppingClock(4 * SETTLE_S)  # a run longer than the settle: one run, however long
    assert settle(slow.step, SETTLE_S, clock=slow) == pytest.approx(4 * SETTLE_S) and slow.runs == 1
    none = SteppingClock(run_s)
    assert settle(none.step, 0.0, clock=none) == run_s and none.runs == 1  # never less than one run

    runner = Runner(str(demo_paths["cnn"]), name="cnn")
    runner.warm_up(3)
    runs = []
    settle(lambda: runs.append(runner.step_fn()()), 3600.0, most=7)  # a real session's runs, bound by count
    assert len(runs) == 7
    runs.clear()
    settle(lambda: runs.append(runner.step_fn()()), 0.0)
    assert len(runs) == 1

    class TenSecondsLeft(Budget):  # the plan's arithmetic, not how long this test took to get here
        def left(self) -> float:
            return 10.0

    budget = TenSecondsLeft(time.monotonic() + 10.0)
    runs_without, _ = budget.final_plan(0.01, screen_runs=1000, finalists=0)
    runs_with, rounds = budget.final_plan(0.01, screen_runs=1000, finalists=3)
    assert rounds == FINAL_ROUNDS and runs_with < runs_without
