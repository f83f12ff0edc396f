"""A tune of the lengths users send: the workload from real sentences, shape buckets gated at each request's
own size, and a profile whose session takes requests at their own size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ortpilot
from ortpilot.artifacts.atomic import atomic_write_json
from ortpilot.data import real_data
from ortpilot.models import text_folder
from ortpilot.session.shaped import ShapedSession
from ortpilot.tuning.report import shape_plan_line

WORDS = [
    "the",
    "model",
    "runs",
    "fast",
    "on",
    "this",
    "machine",
    "and",
    "every",
    "sentence",
    "has",
    "its",
    "own",
    "length",
    "when",
    "users",
    "send",
    "it",
]


def _sentences(path: Path, n: int = 48) -> Path:
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=int(k))) for k in rng.integers(2, 30, size=n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tune(folder: Path, text: Path, out: Path):
    data = real_data(text=text, folder=folder)
    return ortpilot.tune(str(folder), str(out), 25, calibration=data, quantize=False)


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    root = tmp_path_factory.mktemp("masked")
    folder = text_folder(root / "embed")
    result = _tune(folder, _sentences(root / "s.txt"), root / "out")
    return folder, root / "out", result.to_dict()


def test_the_workload_is_the_sentences_at_their_own_length_and_buckets_come_from_it(masked):
    _, out, doc = masked
    workload = doc["workload"]
    (dim,) = workload["dims"]
    assert dim["name"] == "sequence" and dim["min"] < dim["p50"] < dim["max"]
    plan = doc["facts"]["shape_plan"]
    assert plan["dim"] == "sequence" and plan["sizes"][-1] == dim["max"] and len(plan["sizes"]) >= 2
    assert "per request of this workload (sequence" in " ".join(doc_headline(doc).split())
    profile = json.loads((out / "profile.json").read_text())
    assert profile["workload"]["summary"] == workload["summary"] and (out / profile["workload"]["file"]).is_file()


def test_padding_a_masked_encoder_to_its_buckets_passes_the_gate_at_each_requests_own_size(masked):
    _, _, doc = masked
    shaped = [c for c in doc["candidates"] if c.get("shape_plan")]
    assert shaped and shaped[0]["status"] == "ok", shaped[0]["reason"] if shaped else "no bucketed candidate"
    gate = shaped[0]["accuracy"]
    assert (
        gate["worst_error"] < 1e-4
    )  # the worst held-out sentence, padded to its bucket, against the model at its length
    assert "passed the gate" in shape_plan_line(doc) or "Shape plan:" in shape_plan_line(doc)


def test_a_model_whose_padding_leaks_gets_no_buckets_and_the_report_says_why(tmp_path):
    folder = text_folder(tmp_path / "leak", leak=True)
    doc = _tune(folder, _sentences(tmp_path / "s.txt"), tmp_path / "out").to_dict()
    shaped = [c for c in doc["candidates"] if c.get("shape_plan")]
    # the model as given, padded, fails the gate; every later bucketed candidate is skipped for it, not built
    first, *later = shaped
    assert not first["passes"] and first["status"] == "rejected" and "accuracy" in first["reason"], first
    assert later and all(c["status"] == "skipped" for c in later), [(c["label"], c["status"]) for c in later]
    assert all(c["reason"].startswith("not tried: padded to the buckets, the model as given failed") for c in later)
    assert doc["winner"].get("shape_plan") is None
    line = shape_plan_line(doc)
    assert "rejected by the gate: padding changed the outputs" in line and "does not make padding" in line
    assert line in (tmp_path / "out" / "report.md").read_text()


def test_a_profile_with_a_shape_plan_runs_requests_at_their_own_size(masked, tmp_path):
    _, out, doc = masked
    profile = json.loads((out / "profile.json").read_text())
    profile["shape_plan"] = doc["facts"]["shape_plan"]  # as a tune whose bucketed winner wrote it
    atomic_write_json(out / "profile.json", profile)
    session = ortpilot.load_profile(str(out / "profile.json"))
    assert isinstance(session, ShapedSession)
    plain = ortpilot.load(str(out / "model.onnx"))
    for n in (3, 11, int(profile["shape_plan"]["sizes"][-1]) + 5):
        feeds = {
            "input_ids": np.full((1, n), 7, np.int64),
            "attention_mask": np.ones((1, n), np.int64),
            "token_type_ids": np.zeros((1, n), np.int64),
        }
        got, want = session.run(None, feeds)[0], plain.run(None, feeds)[0]
        assert got.shape == want.shape and np.allclose(got, want, atol=1e-5)
    assert session.served["beyond"] == 1


def doc_headline(doc):
    from ortpilot.tuning.report import headline

    return headline(doc)


def test_the_worker_times_a_batch_sizes_replay_set_on_the_candidates_own_sessions(tmp_path, demo_paths):
    """The step after the final: the winner and ORT's default, interleaved, on the workload's requests in
    batches of 8 (``replay-b8.npz``), journaled so a resume replays it."""
    from ortpilot.data.workload import batched_requests
    from ortpilot.graph.shapes import graph_inputs
    from ortpilot.modelio import load_model
    from ortpilot.tuning.candidate import baseline_candidate
    from ortpilot.tuning.journal import Journal
    from ortpilot.tuning.steps import StepRunner
    from ortpilot.tuning.tune import pad_values
    from ortpilot.tuning.worker import REPLAY_FILE, WorkerClient, batch_file, save_samples

    model = demo_paths["encoder"]
    requests = [
        {
            "input_ids": np.full((1, n), 7, np.int64),
            "attention_mask": np.ones((1, n), np.int64),
            "token_type_ids": np.zeros((1, n), np.int64),
        }
        for n in range(3, 27)
    ]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    save_samples(scratch / "heldout.npz", requests[:2])
    save_samples(scratch / "calibration.npz", requests[:2])
    save_samples(scratch / REPLAY_FILE, requests[:2])
    batches = batched_requests(requests, 8, graph_inputs(load_model(model)), pad_values(0))
    assert [b["input_ids"].shape[0] for b in batches] == [8, 8, 8]
    save_samples(scratch / batch_file("b8"), batches)
    (scratch / "worker.json").write_text(json.dumps({"model": str(model), "shapes": {}}))
    worker = WorkerClient(scratch)
    journal = Journal(tmp_path / "journal.jsonl", resume=False)
    try:
        steps = StepRunner(worker, journal, lambda ref: None)
        base = baseline_candidate()
        other = base.with_settings(intra_op_threads=1)
        record = steps.batch([other, base], "b8", 2, 2, 120.0)
        assert record["status"] == "ok" and record["stage"] == "b8"
        assert {cid: len(s) for cid, s in record["samples_s"].items()} == {other.id: 4, base.id: 4}
        assert steps.batch([other, base], "b8", 2, 2, 120.0) is record  # journaled: asked again, not re-timed
    finally:
        worker.close()
        journal.close()


def test_a_tune_of_batches_screens_four_and_times_every_batch_in_the_final(tmp_path):
    """48 sentences in batches of 8 are 6 calls: the search's screening replays 4 of them, and the final, whose
    figures make the headline, replays all 6 (4 of 6 keep both extremes, and OpenVINO's INT8 read 3.07x there
    against 2.89x on all 6 of MiniLM's); OUTDIR's workload.npz, which verify --bench replays, holds the 6."""
    folder = text_folder(tmp_path / "embed")
    data = real_data(text=_sentences(tmp_path / "s.txt"), folder=folder)
    result = ortpilot.tune(str(folder), str(tmp_path / "out"), 20, calibration=data, quantize=False, batches=(8, 1))
    records = [json.loads(line) for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    (final,) = [r for r in records if r["kind"] == "final"]
    assert final["status"] == "ok" and final["replay"] == "b8"
    doc = result.to_dict()
    assert doc["screened"] == [4, 6]
    with np.load(tmp_path / "out" / "workload.npz") as kept:
        ids = sorted(k for k in kept.files if k.endswith("/input_ids"))
        assert len(ids) == 6 and all(kept[k].shape[0] == 8 for k in ids)
    assert (
        "A search run replayed 4 of the 6 batches of 8 a final run replays"
        in (tmp_path / "out" / "report.md").read_text()
    )
    # a run of the search and of the final is a call of 8 items; batch 1, asked second, has a figure or its reason
    profile = json.loads((tmp_path / "out" / "profile.json").read_text())
    assert profile["latency"]["winner"]["items_per_run"] == 8
    if not result.default_best:
        gain = profile["latency"]["speedup_vs_default"]
        assert "1" in gain.get("by_batch", {}) or "1" in gain.get("batches_not_timed", {}), gain


def test_a_first_batch_size_the_workload_cannot_form_is_refused_before_anything_is_written(tmp_path):
    """--batch 256,8 on 48 sentences: the search would time calls of 1 and the headline multiply them by 256."""
    from ortpilot.errors import UsageError

    folder = text_folder(tmp_path / "embed")
    data = real_data(text=_sentences(tmp_path / "s.txt"), folder=folder)
    with pytest.raises(UsageError, match="--batch 256: the workload has 48 request"):
        ortpilot.tune(str(folder), str(tmp_path / "out"), 20, calibration=data, quantize=False, batches=(256, 8))
    assert not (tmp_path / "out").exists()


def test_an_npz_workload_alone_is_the_gates_data_too(tmp_path):
    """The user's requests are real inputs: gated on 4 generated ones instead, an OCR recognizer's INT8 model
    shipped reading 28 of 30 real lines wrong (a CTC gate on blank lines checks nothing)."""
    from ortpilot.data import load_tokenizer

    folder = text_folder(tmp_path / "embed")
    tok = load_tokenizer(folder / "tokenizer.json")
    tok.no_padding()
    requests = {}
    for i, line in enumerate(_sentences(tmp_path / "s.txt", 24).read_text().splitlines()):
        ids = np.asarray([tok.encode(line).ids], np.int64)
        requests.update({f"{i}/input_ids": ids, f"{i}/attention_mask": 0 * ids + 1, f"{i}/token_type_ids": 0 * ids})
    np.savez(tmp_path / "traffic.npz", **requests)
    from ortpilot.tuning.request import TuneRequest
    from ortpilot.tuning.tune import _set_up

    setup = _set_up(TuneRequest(str(folder), str(tmp_path / "out"), workload=str(tmp_path / "traffic.npz")))
    origin = setup.given.origin  # what the gate's held-out samples and the calibration are taken from
    assert origin.kind == "files" and origin.path.endswith("traffic.npz") and not setup.given.synthetic
    assert len(setup.given) == 24 and setup.workload.requests == 24 and setup.workload.varies
    assert not (tmp_path / "out").exists()  # set-up writes nothing


def test_a_workload_request_past_the_models_position_limit_is_refused_by_its_shape(tmp_path):
    """A request of 600 tokens to an encoder of 512 positions: the replay set's quantiles leave it out, so ORT's
    default session runs the workload's smallest and largest request first, and the tune stops naming it."""
    from ortpilot.errors import UsageError

    folder = text_folder(tmp_path / "embed")
    workload = tmp_path / "traffic.npz"
    requests = {}
    for i, n in enumerate([12, 30, 17, 600, 22]):
        ids = np.full((1, n), 7, np.int64)
        requests.update({f"{i}/input_ids": ids, f"{i}/attention_mask": ids * 0 + 1, f"{i}/token_type_ids": ids * 0})
    np.savez(workload, **requests)
    with pytest.raises(UsageError, match=r"request of shapes input_ids \[1, 600\].*does not run on ORT's default"):
        ortpilot.tune(str(folder), str(tmp_path / "out"), 20, workload=str(workload), quantize=False)


def test_batch_figures_read_as_items_per_second_in_the_headline():
    from ortpilot.tuning.report import batch_clause
    from ortpilot.tuning.tune import _throughputs

    figures = _throughputs(8, [0.010] * 5, [0.020] * 5, None)
    assert figures["ratio"] == pytest.approx(2.0) and figures["winner_items_per_s"] == pytest.approx(800)
    assert figures["default_items_per_s"] == pytest.approx(400)
    clause = batch_clause({"by_batch": {"8": figures, "32": {**figures, "ratio": 3.0}}})
    assert clause == " In batches of 8: 2.00x (800 vs 400 items/s); of 32: 3.00x (800 vs 400 items/s)."
    # one slow outlier of the winner's: its mean would read fewer items/s than ORT's default beside a 2.00x
    noisy = _throughputs(8, [0.010] * 4 + [0.200], [0.020] * 5, None)
    assert noisy["ratio"] == pytest.approx(2.0) and noisy["winner_items_per_s"] == pytest.approx(800)


def test_a_batch_size_the_budget_could_not_time_is_named_in_the_headline_with_its_reason():
    """A user who asked for --batch 1,32 and got a figure for batch 1 only hears why batch 32 has none."""
    from ortpilot.tuning.report import batch_clause
    from ortpilot.tuning.tune import _throughputs

    figures = _throughputs(1, [0.010] * 5, [0.020] * 5, None)
    why = "about 40 s were needed and 1 s of the budget were left"
    clause = batch_clause({"by_batch": {"1": figures}, "batches_not_timed": {"32": why}})
    assert clause == (
        f" In batches of 1: 2.00x (100 vs 50 items/s). Batches of 32 not timed: {why} (a larger --budget times them)."
    )
    assert batch_clause({"batches_not_timed": {"32": why}}).startswith(" Batches of 32 not timed")


def test_the_profile_records_the_winners_first_run_cost_at_a_new_size(masked):
    """Measured on a fresh session of the winner; the plan warms every size of the workload's range, and asks
    for a warm-up only where ``worth_warming`` says so (the CPU EP's cost is a fraction of a millisecond)."""
    from ortpilot.session.warmup import worth_warming
    from ortpilot.tuning.report import warmup_line

    _, out, doc = masked
    profile = json.loads((out / "profile.json").read_text())
    if doc["winner"].get("shape_plan"):  # a bucket's session is static: nothing to warm
        assert "warmup" not in profile and doc["warmup"] is None
        return
    plan, (dim,) = profile["warmup"], doc["workload"]["dims"]
    assert plan == doc["warmup"] and plan["dim"] == "sequence"
    assert sorted(plan["sizes"]) == list(range(dim["min"], dim["max"] + 1))
    assert plan["run_ms"] > 0 and plan["warm"] == worth_warming(plan["first_run_ms"], plan["run_ms"])
    assert plan["batches"] == doc["workload"]["batches"]
    assert warmup_line(doc) in (out / "report.md").read_text() and "first run at a new 'sequence'" in warmup_line(doc)


def _warming_profile(masked, tmp_path):
    """A copy of the tuned folder whose profile asks for a warm-up, as a tune whose OpenVINO winner writes it."""
    import shutil

    from ortpilot.data.workload import DimStats
    from ortpilot.session.warmup import WarmupPlan, sizes_to_warm

    out = masked[1]
    copy = tmp_path / "tuned"
    shutil.copytree(out, copy)
    profile = json.loads((copy / "profile.json").read_text())
    profile.pop("shape_plan", None)
    dim = DimStats.from_dict(profile["workload"]["dims"][0])
    plan = WarmupPlan(dim.name, dim.axes, sizes_to_warm(dim.histogram), 8.0, 2.0, batches=(1, 4))
    profile["warmup"] = plan.to_dict()
    profile["workload"]["batches"] = [1, 4]  # as a tune given --batch 1,4 records it
    atomic_write_json(copy / "profile.json", profile)
    return copy, profile


def test_a_profile_that_asks_for_a_warm_up_runs_its_session_at_every_size_when_it_loads(masked, tmp_path):
    folder, profile = _warming_profile(masked, tmp_path)
    session = ortpilot.load_profile(str(folder / "profile.json"), warm_budget_s=600)
    sizes = profile["warmup"]["sizes"]
    assert session.warmed.shapes == tuple((b, n) for b in (1, 4) for n in sizes)
    assert session.warmed.planned == 2 * len(sizes)
    plain = ortpilot.load(str(folder / "model.onnx"))
    feeds = {
        "input_ids": np.full((1, 9), 7, np.int64),
        "attention_mask": np.ones((1, 9), np.int64),
        "token_type_ids": np.zeros((1, 9), np.int64),
    }
    assert np.allclose(session.run(None, feeds)[0], plain.run(None, feeds)[0], atol=1e-5)
    assert ortpilot.load_profile(str(folder / "profile.json"), warm=False).warmed is None


def test_a_changed_workload_file_skips_the_warm_up_with_a_warning_and_the_session_still_loads(masked, tmp_path, caplog):
    folder, profile = _warming_profile(masked, tmp_path)
    (folder / profile["workload"]["file"]).write_bytes(b"not an npz")
    with caplog.at_level("WARNING", logger="ortpilot"):
        session = ortpilot.load_profile(str(folder / "profile.json"))
    assert session.warmed.shapes == () and session.warmed.note.startswith("skipped")
    assert "no warm-up at load" in caplog.text and "changed since the tune" in caplog.text


def test_verify_warms_as_the_profile_asks_and_still_reproduces_the_reference_bit_for_bit(masked, tmp_path):
    """The warmed session is the one verified: its reference outputs are unchanged by having run other sizes, and
    the verification says what the warm-up did (the CLI prints it as a row)."""
    from click.testing import CliRunner

    from ortpilot.cli.main import cli
    from ortpilot.tuning.verify import verify_profile

    folder, profile = _warming_profile(masked, tmp_path)
    result = verify_profile(folder / "profile.json")
    assert result.passed and result.mode == "bit-exact", result.to_dict()
    planned = 2 * len(profile["warmup"]["sizes"])  # batches 1 and 4
    assert result.to_dict()["warmed"]["planned"] == planned
    shown = CliRunner().invoke(cli, ["verify", str(folder)])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.replace("│", " ").split())  # the table's rows, unwrapped
    assert "warm-up" in text and f"of the {planned} shapes its profile's warm-up plan names" in text


def test_a_kept_text_model_warms_as_its_profile_asks_and_a_one_shot_embed_does_not(masked, tmp_path, caplog):
    """``ortpilot.embed`` loads the model for one call: seconds of warm-up for the sizes of many calls would be
    wasted there; ``text_model`` keeps its session for many calls and warms it."""
    folder, _ = _warming_profile(masked, tmp_path)
    with caplog.at_level("INFO", logger="ortpilot"):
        vectors = ortpilot.embed(str(folder), ["the model runs fast", "on this machine"])
    assert vectors.shape[0] == 2 and "shapes in" not in caplog.text
    kept = ortpilot.text_model(str(folder), warm_budget_s=600)
    assert kept.session.warmed is not None and kept.session.warmed.shapes
    assert np.allclose(kept.embed(["the model runs fast", "on this machine"]), vectors, atol=1e-5)


def _encoder_request(n: int, batch: int = 1) -> dict[str, np.ndarray]:
    ids = np.full((batch, n), 7, np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def test_the_warm_up_plan_holds_the_workloads_range_and_batches_and_its_own_measurement(demo_paths):
    """``measure_warmup`` on the demo encoder's CPU session: every size of the range, most frequent first, the
    workload's batch sizes, and ``warm`` as ``worth_warming`` reads the two timings it took."""
    from ortpilot.data.workload import DimStats, Workload
    from ortpilot.session.options import SessionSettings
    from ortpilot.session.warmup import worth_warming
    from ortpilot.tuning.warmup import measure_warmup

    axes = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))
    workload = Workload("text", 9, (DimStats("sequence", axes, ((4, 2), (9, 5), (30, 2))),), batches=(1, 8))
    replay = [_encoder_request(n) for n in (4, 9, 30)]
    model = demo_paths["encoder"]
    plan = measure_warmup(model, [{"name": "CPUExecutionProvider"}], SessionSettings(), workload, replay)
    assert plan is not None and plan.sizes[:3] == (9, 4, 30) and sorted(plan.sizes) == list(range(4, 31))
    assert plan.batches == (1, 8) and plan.warm == worth_warming(plan.first_run_ms, plan.run_ms)
    batched = [_encoder_request(n, batch=8) for n in (4, 9, 30)]  # a tune whose first --batch size is 8
    plan = measure_warmup(model, [{"name": "CPUExecutionProvider"}], SessionSettings(), workload, batched)
    assert plan is not None and plan.batches == (1, 8)
    assert measure_warmup(model, [{"name": "CPUExecutionProvider"}], SessionSettings(), workload, replay[:1]) is None


def test_a_warm_up_plan_outside_its_workload_or_without_its_file_is_skipped_and_verify_says_so(masked, tmp_path):
    """A profile is an input: a plan naming sizes its workload never had (an edit, or a corrupt file) is not run,
    and neither is one whose workload.npz is gone; the session loads either way and verify shows the row."""
    from click.testing import CliRunner

    from ortpilot.cli.main import cli

    folder, profile = _warming_profile(masked, tmp_path)
    doc_axes = profile["warmup"]["axes"]
    profile["warmup"]["sizes"] = [1, 2**30]
    atomic_write_json(folder / "profile.json", profile)
    session = ortpilot.load_profile(str(folder / "profile.json"))
    assert session.warmed.shapes == () and "not those of the workload's 'sequence'" in session.warmed.note
    profile["warmup"]["axes"] = [["input_ids"]]  # not an (input, axis) pair: the plan does not parse
    atomic_write_json(folder / "profile.json", profile)
    shown = CliRunner().invoke(cli, ["verify", str(folder)])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.replace("│", " ").split())
    assert "warm-up skipped" in text and "warm-up plan is malformed" in text
    profile["warmup"]["axes"] = doc_axes
    atomic_write_json(folder / "profile.json", profile)
    (folder / profile["workload"]["file"]).unlink()
    shown = CliRunner().invoke(cli, ["verify", str(folder)])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.replace("│", " ").split())  # the table's rows, unwrapped
    assert "warm-up skipped" in text and "workload file 'workload.npz' is missing" in text
    # --bench replays the tune's requests to check the headline: timing anything else would check another mix
    timed = CliRunner().invoke(cli, ["verify", str(folder), "--bench"])
    assert timed.exit_code == 2, timed.output
    assert "workload.npz', which is missing: verify --bench replays them" in " ".join(timed.output.split())
