"""``ortpilot.tune``: search, pick, write the winning model, profile.json and the reports.

The orchestration only, one function per step: ``_set_up`` checks the request (model, shapes,
gate, the user's samples, the facts), ``_open_journal`` opens or resumes the journal,
``_choose_data`` picks the held-out and calibration samples, ``_scratch_space`` gives the worker
its folder, ``_search`` runs the search and picks the winner, ``_result`` builds the
``TuneResult`` (``result``) and ``outputs.write_outputs`` writes OUTDIR. The space comes from
``space``, the measurements from ``search`` (which runs candidates in ``worker`` children and
journals every step). Nothing lands in OUTDIR until ORT's default session has been measured
within the budget, and the profile is written last, atomically. What a resume needs besides the
journal (the default session's outputs, the held-out inputs) is kept in ``OUTDIR/.ortpilot-tune/``
(``state``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ortpilot.artifacts.atomic import check_output_path
from ortpilot.artifacts.dirlock import one_writer
from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.data import DataSource, ModelFolder, digest_files, folder_of, real_data
from ortpilot.data.workload import Workload, batched_requests, extremes, read_workload, replay_set, screening_set
from ortpilot.errors import UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import DEFAULT_MAX_ERROR, OutputGate, SavedOutputs, samples_needed
from ortpilot.gate.result import gate_data_warning
from ortpilot.graph.feeds import FeedPlan, batch_size_of, generate_samples, plan_feeds, refuse_all_empty
from ortpilot.graph.prune import check_outputs
from ortpilot.graph.shapes import check_shape_names, graph_inputs, parse_shape_args
from ortpilot.measure import cpushare
from ortpilot.measure.metrics import MetricOverrides
from ortpilot.modelio import file_sha256, load_model
from ortpilot.providers.names import resolve_providers
from ortpilot.tuning.budget import CANDIDATE_TIMEOUT_S, SAFETY, Budget, PrepCosts
from ortpilot.tuning.candidate import baseline_candidate
from ortpilot.tuning.journal import JOURNAL_NAME, JOURNAL_VERSION, Journal, check_version
from ortpilot.tuning.machinestates import TuneStates
from ortpilot.tuning.outputs import winner_model, write_outputs
from ortpilot.tuning.pruned import pruned_model
from ortpilot.tuning.reference import HELDOUT_SEED, feeds_digest
from ortpilot.tuning.report import reference_name
from ortpilot.tuning.request import TuneRequest
from ortpilot.tuning.result import GateRecord, Pick, RunRecord, TuneResult, load_note
from ortpilot.tuning.search import OUTPUT_RESERVE_S, Entry, Progress, Search, cost, speedup, speedup_of
from ortpilot.tuning.space import Facts, gather_facts
from ortpilot.tuning.state import KEPT, keep_for_resume, kept_file, sweep
from ortpilot.tuning.steps import StepRunner
from ortpilot.tuning.worker import PROBE_FILE, REPLAY_FILE, WorkerClient, batch_file, load_samples, save_samples

log = logging.getLogger("ortpilot")
CALIBRATION_SAMPLES = 8
Sample = dict[str, Any]


def tune(
    model: str | os.PathLike | TuneRequest | None = None,
    out_dir: str | os.PathLike | None = None,
    budget_s: float | None = None,
    *,
    progress: Callable[[Progress], None] | None = None,
    **options: Any,
) -> TuneResult:
    """Find the fastest configuration that passes the accuracy gate and write it to ``out_dir``.

    Takes a ``TuneRequest`` (``tuning.request``: every option, its default and its meaning), or the
    request's fields as arguments: ``tune("m.onnx", "out", 120, quantize=False)``. ``model`` None tunes
    the built-in demo encoder. ``budget_s`` bounds the search (the final interleaved measurement is
    reserved inside it). Raises UsageError for bad input before anything is written; Ctrl-C leaves the
    journal, so ``resume=True`` continues (and on a finished tune replays it: the same winner, nothing
    measured again).

    ``calibration``: what ``passes.calibration.load_calibration`` reads (arrays, a reader, or
    ``ortpilot.data.real_data`` text and images). Its split gives static INT8 variants their
    calibration samples and the accuracy gate its held-out samples (``gate_data`` in the result,
    the reports and profile.json); without it both are generated, and the result says so.

    ``outputs``: the outputs the deployment reads (``--outputs``). The model is pruned to them
    (``graph.prune.prune_to_outputs``) before anything else, so every candidate is built from the
    pruned graph, the gate and the timings see only those, and OUTDIR's model and profile hold just them.
    """
    start = time.monotonic()
    load_start = (_load1(), cpushare.sample())
    request = as_request(model, out_dir, budget_s, **options)
    out = check_out_dir(Path(request.out_dir))
    with one_writer(out, "ortpilot tune"):  # a second tune on this OUTDIR exits 2 naming this one's PID
        return _tune(partial(_set_up, request), out, request, start, load_start, progress=progress)


def as_request(
    model: str | os.PathLike | TuneRequest | None = None,
    out_dir: str | os.PathLike | None = None,
    budget_s: float | None = None,
    **options: Any,
) -> TuneRequest:
    """A ``TuneRequest`` as given, or built from ``tune``'s arguments (a request and arguments together is a
    ``UsageError``: one says what the other would)."""
    if isinstance(model, TuneRequest):
        if out_dir is not None or budget_s is not None or options:
            raise UsageError("Give tune() a TuneRequest or its fields as arguments, not both.")
        return model
    unknown = sorted(set(options) - set(TuneRequest.__dataclass_fields__))
    if unknown:
        raise UsageError(f"tune() got unknown options: {', '.join(unknown)} (a TuneRequest's fields are the options).")
    located = {"out_dir": out_dir} if out_dir is not None else {}
    return TuneRequest(model=model, budget_s=budget_s, **located, **options)


def _tune(
    set_up: Callable[[], _Setup],
    out: Path,
    request: TuneRequest,
    start: float,
    load_start: tuple[float | None, cpushare.CpuSample | None],
    *,
    progress: Callable[[Progress], None] | None,
) -> TuneResult:
    """``tune`` once OUTDIR is this process's: the steps in order (module docstring); ``set_up`` is
    ``_set_up`` of the request, run under the OUTDIR lock like every other step."""
    setup = set_up()
    budget_s = request.budget
    with contextlib.ExitStack() as stack:  # closes the worker, the scratch folder and the journal
        journal = _open_journal(out, setup.config, request.resume)
        stack.callback(journal.close)
        data = _choose_data(setup, journal, out, request.samples)
        _record_start(journal, out, setup, budget_s)
        worker = _scratch_space(stack, setup, data)
        replay_only = _search_ended(journal)
        budget = Budget(
            start + budget_s - OUTPUT_RESERVE_S, binding=not replay_only, after_final=_batch_reserve(setup, budget_s)
        )
        search, pick = _search(setup, data, journal, out, worker, budget, progress)
        load_avg, others_cpu = _load(journal, replay_only, load_start)
        run = RunRecord(time.monotonic() - start, bool(journal.replayed), load_avg, budget_s, others_cpu=others_cpu)
        result = _result(out, setup, data, search, pick, run)
        built = winner_model(worker, pick.winner, setup.path)
        write_outputs(result, setup.source, built, data.heldout[0], setup.timed if result.screened else setup.replay)
        result.run = dataclasses.replace(run, total_s=time.monotonic() - start)
        journal.append(
            {
                "kind": "done",
                "winner": pick.winner.candidate.id,
                "files": result.files,
                "load_avg": result.load_avg,
                "others_cpu": result.others_cpu,
            }
        )
        sweep(out)  # a temp file too young to judge at the start is old enough now
        return result


@dataclass(frozen=True)
class _Setup:
    """The tune as asked, checked before anything is written (bad input is exit 2 here)."""

    label: str  # the model as the user named it
    source: Path  # the model file the user named
    path: Path  # the model every candidate is built from: ``source``, or it pruned to ``outputs``
    proto: Any  # the source's graph, without external data (inputs are generated from it)
    outputs: list[str] | None  # the outputs the deployment reads (--outputs), None for all
    objective: str
    plan: FeedPlan  # the input shapes timed and gated
    facts: Facts  # what the search space is built from
    gate: OutputGate  # the accuracy gate, without its held-out inputs yet
    given: Any  # the user's samples (passes.calibration.CalibrationSet), None without any
    given_split: tuple[list[Sample], list[Sample]]  # their (calibration, held-out) split; empty without
    config: dict[str, Any]  # what the journal's start record pins: a resume must match it
    workload: Workload  # what the deployment sends: the user's samples at their own sizes, or the plan's shape
    replay: list[Sample]  # the requests one timed run of the search replays (data.workload.replay_set, or the first
    # batch size's screening_set); [] without user data
    batched: dict[int, list[Sample]]  # batch size -> its replay set (data.workload.batched_requests); batch 1's
    # (the replay set) only where another size is the first
    replay_batch: int = 1  # the batch of each request in ``replay`` (the first --batch)
    probe: tuple[Sample, ...] = ()  # the workload's smallest and largest requests (data.workload.extremes), run
    # once by ORT's default session before the search: a size the model cannot take is refused by name

    @property
    def timed(self) -> list[Sample]:
        """The requests the final, the headline and ``verify --bench`` replay: the first batch size's whole replay
        set where the search screens a part of it, else ``replay``."""
        return self.batched.get(self.replay_batch, self.replay) if self.replay_batch > 1 else self.replay

    @property
    def final_replay(self) -> tuple[str, int] | None:
        """(the worker's name for ``timed``, its request count) where the final replays more than the search."""
        return (f"b{self.replay_batch}", len(self.timed)) if len(self.timed) > len(self.replay) else None


def _set_up(request: TuneRequest) -> _Setup:
    """Read the model, the flags and the user's samples; gather the facts the space is built from."""
    label = request.label
    source = _model_path(request.model)
    proto = load_model(source, load_external_data=False)
    names = (
        check_outputs(proto, list(request.outputs)) if request.outputs else None
    )  # a name it lacks: exit 2, nothing written
    path = pruned_model(source, names) if names else source
    graph = load_model(path, load_external_data=False) if names else proto  # what candidates are built from
    parsed = parse_shape_args(request.shapes)
    overrides = MetricOverrides.parse(list(request.metric) or None)
    folder = folder_of(path)  # config.json and pooling: metric evidence, and sizes for a fusion the graph cannot size
    gate_spec = request.gate.output_gate(graph, folder, default=DEFAULT_MAX_ERROR)  # bad flags: exit 2 now
    inputs = graph_inputs(proto)
    check_shape_names(inputs, parsed)
    traffic, traffic_source = (
        read_workload(request.workload, proto, inputs, folder, parsed) if request.workload else ([], "")
    )
    calibration = request.calibration
    if calibration is None and traffic_source == "text":  # real sentences: the gate's data too
        calibration = real_data(text=request.workload, folder=folder)
    elif calibration is None and traffic_source == "files":  # real requests too: gated on 4 generated inputs
        calibration = _traffic_as_data(traffic, Path(str(request.workload)))  # instead, an OCR recognizer's INT8
        # shipped at 1.56x reading 28 of 30 real lines otherwise (a CTC gate on blank inputs checks nothing)
    given = _given_data(proto, parsed, calibration)
    given_split: tuple[list[Sample], list[Sample]] = ([], [])
    if given is not None:  # the samples' own shapes (a text's sequence length) are the ones timed and gated
        given_split = given.split()
    requests = traffic or (given.samples if given is not None else [])
    workload = Workload.of_samples(requests, inputs, traffic_source or given.origin.kind) if requests else None
    replay = replay_set(requests)
    if workload is not None:
        parsed = {**parsed, **(workload.shapes if workload.varies else _shapes(requests[0]))}
    plan = plan_feeds(proto, parsed)  # a dim with no default raises here, naming the input
    _refuse_empty(plan.shapes, requests)
    if workload is None:
        workload = Workload("synthetic", 1, shapes=dict(plan.shapes))
    workload = dataclasses.replace(workload, batches=request.batches)
    specs = resolve_providers(request.providers) if request.providers else None
    facts = gather_facts(
        graph,
        specs,
        quantize=request.quantize,
        session_knobs=request.session_knobs,
        folder_attention=_folder_attention(folder),
    )
    pad = pad_values(_text_pad_id(calibration))
    # a session per bucket is a session knob too: a deployment that sets its own sessions runs one
    facts.shape_plan = propose_plan(workload, facts, pad) if request.session_knobs else None
    batched = _batched(requests, request.batches, inputs, pad, facts)
    replay_batch = request.batches[0]
    if replay_batch > 1:  # the search times what the server forms
        replay = screening_set(batched[replay_batch])
    facts.batch = replay_batch
    config = {
        "model_sha256": file_sha256(source),
        "outputs": names,
        "shapes": {k: list(v) for k, v in plan.shapes.items()},
        "objective": request.objective,
        "max_error": request.max_error,
        "metric": overrides.describe(),
        "quantize": request.quantize,
        "session_knobs": request.session_knobs,
        "providers": [s.to_dict() for s in facts.providers],
        "ort": ort.__version__,
        "data_sha256": given.origin.sha256 if given is not None else None,
        "workload_sha256": workload.sha256 or None,  # the requests timed (their shapes)
        "batches": list(request.batches),
    }
    return _Setup(
        label,
        source,
        path,
        proto,
        names,
        request.objective,
        plan,
        facts,
        gate_spec,
        given,
        given_split,
        config,
        workload,
        replay,
        batched,
        replay_batch,
        tuple(extremes(requests, inputs)) if workload.varies else (),
    )


def propose_plan(workload: Workload, facts: Facts, pad: Callable[[str], float]) -> dict[str, Any] | None:
    """The shape plan the search tries as a knob (``session.shapeplan``: buckets at the workload's quantiles of
    its one varying dim), or None with the reason in ``facts.excluded``."""
    from ortpilot.session.shapeplan import ShapePlan, choose_sizes
    from ortpilot.tuning.space import Excluded

    why = ""
    if not workload.varies:
        why = "the requests tuned on all have one shape"
    elif len(workload.dims) > 1:
        why = f"the requests vary in {len(workload.dims)} dims ({', '.join(d.name for d in workload.dims)}); buckets pad one"
    elif facts.decoder:
        why = "a decoder's sequence grows every step: its KV cache, not buckets, sizes it"
    dim = workload.dims[0] if workload.dims and not why else None
    if dim is not None and (":" in dim.name or any(axis == 0 for _, axis in dim.axes)):
        why = f"the varying dim '{dim.name}' has no name in the graph, or is the batch (ORT fixes dims by name)"
    sizes = choose_sizes([int(s) for s in dim.sizes]) if dim is not None and not why else ()
    if not why and len(sizes) < 2:
        why = "the requests' sizes fit one bucket"
    if why:
        facts.excluded.append(Excluded("shape buckets", why))
        return None
    assert dim is not None
    pads = {name: pad(name) for name, _ in dim.axes}
    return ShapePlan(dim.name, sizes, dim.axes, tuple(pads.items())).to_dict()


def pad_values(token_pad_id: int) -> Callable[[str], float]:
    """What pads each input when requests are padded (to a bucket, or to the longest of a batch): a mask 0, token
    ids the tokenizer's pad id, anything else 0."""

    def pad(name: str) -> float:
        if "mask" in name.lower():
            return 0.0
        return float(token_pad_id) if name == "input_ids" else 0.0

    return pad


def _batched(
    requests: list[Sample], batches: Sequence[int], inputs: Any, pad: Callable[[str], float], facts: Facts
) -> dict[int, list[Sample]]:
    """Each batch size's replay set (``data.workload.batched_requests``; batch 1's is the workload's replay set,
    kept where another size is the first); one that cannot be formed is said in ``facts.excluded``, and the first
    (the size the search times) refused: its figures would be of another size's calls."""
    from ortpilot.tuning.space import Excluded

    out = {}
    for batch in batches:
        if batch == 1:
            if batches[0] != 1:
                out[1] = replay_set(requests)
            continue
        made = batched_requests(requests, batch, inputs, pad)
        if made:
            out[batch] = made
        elif batch == batches[0]:
            raise UsageError(
                f"--batch {batch}: the workload has {len(requests)} request(s), and the first --batch, the size "
                f"tuned for, needs {batch} requests of batch 1 at least to form one call; give more "
                "--calibration or --workload data, or put a size the requests can form first."
            )
        else:
            facts.excluded.append(
                Excluded(
                    f"batch {batch}",
                    f"the workload has {len(requests)} request(s) of batch 1; {batch} at least are needed to form one "
                    "(give more --calibration or --workload data)",
                )
            )
    return out


def _text_pad_id(calibration: Any) -> int:
    """The pad id of ``--calibration-text``'s tokenizer (0 for any other data)."""
    from ortpilot.data import TextData

    if not isinstance(calibration, TextData):
        return 0
    from ortpilot.data.text import load_tokenizer, pad_id

    return pad_id(load_tokenizer(calibration.tokenizer))


def check_request(request: TuneRequest) -> tuple[str, Path, Any]:
    """What ``tune`` checks before any work (``_set_up``: bad input is exit 2 here), writing nothing:
    (the model as named, its file, the user's samples as a ``CalibrationSet`` or None). A fleet tune
    checks each model's request once here before sending it to the nodes."""
    setup = _set_up(request)
    return setup.label, setup.source, setup.given


def _open_journal(out: Path, config: dict[str, Any], resume: bool) -> Journal:
    """OUTDIR's journal: a fresh one (nothing is written until the first record), or, with ``resume``,
    the one there, refused (exit 2) if it belongs to another tune or lacks what a resume needs."""
    journal = Journal(out / JOURNAL_NAME, resume=resume)
    _check_resume(journal, config, out)
    return journal


@dataclass(frozen=True)
class _Data:
    """The samples this tune gates and calibrates on, and where they came from."""

    heldout: list[Sample]  # the gate decides on these; the first is the reference sample
    calibration: list[Sample]  # static INT8 variants calibrate on these
    gate_data: dict[str, Any]  # data.DataSource.describe of each side
    calibration_data: dict[str, Any]
    warning: str  # gate.result.gate_data_warning: generated inputs, too few, or "" for neither
    synthetic: str | None = None  # the generated inputs' shapes (plan.describe()), None for the user's data


def _choose_data(setup: _Setup, journal: Journal, out: Path, samples: int) -> _Data:
    """The user's split, else ``samples`` generated held-out inputs and ``CALIBRATION_SAMPLES`` calibration
    inputs; a resume gates on the held-out inputs it kept (the journaled outputs were computed on them)."""
    proto, plan, given = setup.proto, setup.plan, setup.given
    calib, real_heldout = setup.given_split
    if given is None:
        calib = generate_samples(proto, CALIBRATION_SAMPLES, plan=plan)
    kept = journal.get(KEPT)
    if kept is not None:  # the inputs the journaled outputs were computed on, not a regeneration
        kept_file(out, kept, "reference")  # checked now, before any work, not when the gate needs it
        heldout = load_samples(kept_file(out, kept, "heldout"))
    elif given is not None:
        heldout = real_heldout
    else:
        heldout = generate_samples(proto, max(1, samples), plan=plan, first_seed=HELDOUT_SEED)
    if given is not None:
        gate_data, calibration_data = given.gate_data(), given.calibration_data()
    else:
        gate_data = DataSource.of_samples(heldout).describe(len(heldout))
        calibration_data = DataSource.of_samples(calib).describe(len(calib))
    warning = gate_data_warning(len(heldout), plan.describe() if given is None else None)
    if warning:  # said once, as the tune starts (the reports keep it as gate_warning)
        log.warning(
            "%s%s.", "NO GATE DATA: the accuracy gate is " if given is None else "The accuracy gate is ", warning
        )
    return _Data(heldout, calib, gate_data, calibration_data, warning, plan.describe() if given is None else None)


def _record_start(journal: Journal, out: Path, setup: _Setup, budget_s: float) -> None:
    """Sweep OUTDIR's stale temp files; a fresh journal gets its start record (the config a resume must match)."""
    sweep(out)
    if journal.get("start") is None:
        journal.append(
            {
                "kind": "start",
                **setup.config,
                "budget_s": budget_s,
                "model": setup.label,
                "journal_version": JOURNAL_VERSION,
            }
        )


def _scratch_space(stack: contextlib.ExitStack, setup: _Setup, data: _Data) -> WorkerClient:
    """The worker child's client and its scratch folder, holding what the child reads (the samples, the
    model and its shapes); both closed by ``stack``, and the folder swept by a later tune if this one is killed."""
    scratch = stack.enter_context(scratch_dir("ortpilot-tune-"))
    worker = WorkerClient(scratch)
    stack.callback(worker.close)
    save_samples(scratch / "heldout.npz", data.heldout)
    save_samples(scratch / "calibration.npz", data.calibration)
    save_samples(scratch / REPLAY_FILE, setup.replay or data.heldout[:1])
    for batch, requests in setup.batched.items():
        save_samples(scratch / batch_file(f"b{batch}"), requests)
    if setup.probe:
        save_samples(scratch / PROBE_FILE, list(setup.probe))
    (scratch / "worker.json").write_text(
        json.dumps(
            {"model": str(Path(setup.path).resolve()), "shapes": {k: list(v) for k, v in setup.plan.shapes.items()}}
        )
    )
    return worker


def _search(
    setup: _Setup,
    data: _Data,
    journal: Journal,
    out: Path,
    worker: WorkerClient,
    budget: Budget,
    progress: Callable[[Progress], None] | None,
) -> tuple[Search, Pick]:
    """Run (or replay) the search within ``budget`` and pick the winner among its finalists."""
    references: list[Path] = []
    steps = StepRunner(
        worker,
        journal,
        lambda ref: _gate(journal, out, ref, references, replace(setup.gate, inputs=data.heldout)),
        replay_only=not budget.binding,  # the budget binds unless the journaled search had ended
        on_first_record=lambda: _keep(journal, out, references, worker.scratch / "heldout.npz"),
    )
    budget.costs = PrepCosts(setup.facts.model_mb, len(data.calibration), len(data.heldout), setup.facts.conv_heavy)
    search = Search(
        steps,
        budget,
        objective=setup.objective,
        progress=progress,
        requests_per_run=max(1, len(setup.replay)),
        samples_per_request=setup.replay_batch,
        final_replay=setup.final_replay,
        cached=_cache_reader(setup, data),
    )
    base = baseline_candidate()
    finalists = search.run(base, setup.facts)
    base_entry = search.entries[base.id]
    reference = search.reference or base_entry
    # the machine's states are read where the search and the final timed the same requests: ORT's default's p50
    # per request of 4 calls of 32 against 6 tells a mix, not a state (and verify --bench replays the final's)
    alike = search.screened is None
    states = TuneStates.read(list(search.entries.values()), reference) if setup.objective == "p50" and alike else None
    winner, default_best, reason = _pick(finalists, reference, setup.objective, states)
    gain = speedup(reference, winner, setup.objective)
    if states is not None and not default_best and states.defaults_ms:
        gain = {**gain, "by_state": states.record(winner), "states_seen_ms": states.defaults_ms}
    by_batch, not_timed = _batch_figures(setup, steps, budget, winner, reference)
    if by_batch:
        gain = {**gain, "by_batch": by_batch}
    if not_timed:
        gain = {**gain, "batches_not_timed": not_timed}
    return search, Pick(
        winner, reference, gain, default_best, reason, _passed_over(finalists, winner, reference, states)
    )


def _cache_reader(setup: _Setup, data: _Data) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``Search.cached``: the leading part of a pipeline the model cache holds built from this tune's model and
    calibration samples (``transform.cached_prefix``, the keys ``build_model`` uses in the worker)."""
    import functools

    from ortpilot.tuning.transform import cached_prefix, samples_digest

    source = Path(setup.path)
    sha = setup.config["model_sha256"] if source == Path(setup.source) else file_sha256(source)
    digest = functools.cache(lambda: samples_digest(data.calibration))  # once a tune, not once a candidate
    return lambda steps: cached_prefix(sha, steps, data.calibration, digest)


BATCH_ROUNDS, BATCH_RUNS = 4, 2  # a batch size's timing: as a short final (winner and ORT's default, interleaved)
BATCH_RESERVE_SHARE = 0.25  # the most of the budget kept from the search for the other batch sizes' timings


def _batch_seconds(per_request: float, requests: int, batch: int, first: int) -> float:
    """What timing one more batch size costs: the winner and ORT's default, ``BATCH_ROUNDS`` rounds of
    ``BATCH_RUNS`` runs (and a warm-up) over its ``requests`` batches, at ``per_request`` seconds per request of
    the first batch size."""
    return 2 * BATCH_ROUNDS * (BATCH_RUNS + 1) * per_request * requests * batch / first * SAFETY


def _batch_reserve(setup: _Setup, budget_s: float) -> Callable[[float], float]:
    """``Budget.after_final``: the seconds the other batch sizes the user asked for need, from ORT's default
    latency (one run of the replay set), kept from the search so that they are timed; 0 where they would need
    more than ``BATCH_RESERVE_SHARE`` of the budget (the report then says which were not timed and why)."""
    first = setup.workload.batches[0]
    sizes = [(b, len(r)) for b, r in setup.batched.items() if b != first and r]

    def seconds(latency: float) -> float:
        per_request = latency / max(1, len(setup.replay))
        need = sum(_batch_seconds(per_request, n, b, first) for b, n in sizes)
        return need if need <= BATCH_RESERVE_SHARE * budget_s else 0.0

    return seconds


def _batch_figures(
    setup: _Setup, steps: StepRunner, budget: Budget, winner: Entry, reference: Entry
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """(batch size -> the winner's speedup over ORT's default and both throughputs (items/s) on that batch
    size's replay set, batch size -> why it was not timed). The first batch size's figure comes from the
    final, each other's is timed now, interleaved, if the budget affords it; a batch size the user asked
    for is never dropped without its reason. Both empty when ORT's default won (there is nothing to
    compare) or only batch 1 was asked for."""
    batches = setup.workload.batches
    if winner is reference or batches == (1,):
        return {}, {}
    out: dict[str, dict[str, float]] = {}
    not_timed: dict[str, str] = {}
    first = batches[0]
    if winner.final and reference.final:
        out[str(first)] = _throughputs(
            first, winner.final, reference.final, (reference.final_blocks, winner.final_blocks)
        )
    per_request = cost(reference.final or reference.samples, "p50")  # seconds per request of the first batch size
    for batch in batches:
        requests = setup.batched.get(batch)
        if batch == first or not requests:
            continue
        estimate = _batch_seconds(per_request, len(requests), batch, first)
        if budget.binding and budget.left() < estimate:
            not_timed[str(batch)] = (
                f"about {estimate:.0f} s were needed and {max(0.0, budget.left()):.0f} s of the budget were left"
            )
            log.info("Batch %d was not timed: %s.", batch, not_timed[str(batch)])
            continue
        timeout = max(5.0, budget.left() + 5.0) if budget.binding else CANDIDATE_TIMEOUT_S
        record = steps.batch([winner.candidate, reference.candidate], f"b{batch}", BATCH_RUNS, BATCH_ROUNDS, timeout)
        samples, blocks = (record or {}).get("samples_s") or {}, (record or {}).get("blocks") or {}
        mine, theirs = samples.get(winner.candidate.id), samples.get(reference.candidate.id)
        if (record or {}).get("status") == "ok" and mine and theirs:
            rounds = (blocks.get(reference.candidate.id) or [], blocks.get(winner.candidate.id) or [])
            out[str(batch)] = _throughputs(batch, mine, theirs, rounds if all(rounds) else None)
        else:
            not_timed[str(batch)] = f"its timing did not finish ({(record or {}).get('status') or 'no record'})"
    return out, not_timed


def _throughputs(
    batch: int, winner: Sequence[float], default: Sequence[float], blocks: tuple[Sequence[int], Sequence[int]] | None
) -> dict[str, float]:
    """Seconds per run of ``batch`` items each (interleaved in rounds ``blocks``: default's, winner's) -> the p50
    speedup with its paired CI, and both throughputs in items/s at the p50 too: means beside a ratio of medians
    could contradict it on a busy machine (a "1.34x" over fewer items/s)."""
    import numpy as np

    ratio = speedup_of(default, winner, "p50", blocks)
    return {
        **ratio,
        "batch": float(batch),
        "winner_items_per_s": batch / float(np.median(winner)),
        "default_items_per_s": batch / float(np.median(default)),
    }


def _result(out: Path, setup: _Setup, data: _Data, search: Search, pick: Pick, run: RunRecord) -> TuneResult:
    """The ``TuneResult`` of a finished search (its ``files`` are filled in as OUTDIR is written)."""
    warning = data.warning
    if search.gate is not None:  # the metrics chosen from the real outputs may need more samples (ctc: 59)
        warning = gate_data_warning(len(data.heldout), data.synthetic, *samples_needed(_choices(search.gate)))
        if warning and warning != data.warning:
            log.warning("The accuracy gate was %s.", warning)
    gate = GateRecord(
        metrics=_metrics(search.gate),
        metric_evidence={n: c.evidence for n, c in _choices(search.gate).items()},
        max_error=search.gate.gate.max_error if search.gate else 0.0,
        samples=len(data.heldout),
        gate_data=data.gate_data,
        calibration_data=data.calibration_data,
        heldout_sha256=feeds_digest(data.heldout[0]),
        warning=warning,
    )
    return TuneResult(
        out,
        setup.label,
        setup.objective,
        pick,
        gate,
        run,
        list(search.entries.values()),
        setup.facts,
        dict(setup.plan.shapes),
        batch=setup.replay_batch if setup.replay_batch > 1 else batch_size_of(data.heldout[0]),  # items a run
        outputs=setup.outputs,
        workload=setup.workload,
        screened=search.screened,
    )


def check_out_dir(out: Path) -> Path:
    """Refuse an OUTDIR that is a file or cannot be written, before any work: exit 2, nothing written."""
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"Output folder '{out}' is a file, not a folder: tune writes model.onnx, profile.json, "
            "the reports and its journal into a folder. Give -o a folder path (it is created if "
            "missing)."
        )
    check_output_path(out / JOURNAL_NAME, "Tune journal", JOURNAL_NAME)
    return out


def _gate(journal: Journal, out: Path, ref: str, references: list[Path], gate: OutputGate) -> ModelGate:
    """The gate on the default session's outputs: the worker's file in a fresh run, the copy kept in
    OUTDIR on resume (the run that wrote ``ref`` has deleted its scratch folder since)."""
    kept = journal.get(KEPT)
    path = kept_file(out, kept, "reference") if kept is not None else Path(ref)
    if not path.is_file():  # a journal from an ortpilot that kept nothing in OUTDIR
        raise UsageError(
            f"Cannot resume the tune in '{out}': its journal points at the default session's outputs "
            f"in '{path}', which is gone (the run that wrote them has ended). Drop --resume to start "
            "the tune over, or choose another -o folder."
        )
    references.append(path)
    return ModelGate.of(gate, SavedOutputs(), path)


def _metrics(gate: ModelGate | None) -> dict[str, str]:
    """Output name -> the metric the gate held it to (printed, and in the reports)."""
    return {n: c.metric for n, c in _choices(gate).items()}


def _choices(gate: ModelGate | None) -> dict[str, Any]:
    """Output name -> the gate's ``MetricChoice`` (metric and evidence)."""
    return gate.gate.choices_for(gate.reference) if gate is not None else {}


def _keep(journal: Journal, out: Path, references: list[Path], heldout: Path) -> None:
    """Before the journal's first write: keep what a resume needs in OUTDIR (once per journal)."""
    if journal.get(KEPT) is None and references:
        journal.append(keep_for_resume(out, {"reference": references[0], "heldout": heldout}))


def _search_ended(journal: Journal) -> bool:
    """Whether the journaled search had finished (final measurement or outputs done): replay it only."""
    return journal.get("done") is not None or journal.get("final", "", "final") is not None


def _load(
    journal: Journal, replay_only: bool, start: tuple[float | None, cpushare.CpuSample | None]
) -> tuple[list[float], float | None]:
    """This run's load average at its start and now, and the share of the machine's CPU time other
    processes used in between (``measure.cpushare``); a replay reports the run that measured."""
    done = journal.get("done")
    if replay_only and done is not None and "load_avg" in done:
        return list(done["load_avg"]), done.get("others_cpu")
    load_start, cpu_start = start
    load_avg = [x for x in (load_start, _load1()) if x is not None]
    return load_avg, cpushare.others_share(cpu_start, cpushare.sample())


def _load1() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - no load average on this platform
        return None


def _model_path(model: str | os.PathLike | None) -> Path:
    if model is None:
        from ortpilot.models import demo_model_path

        return demo_model_path("encoder")
    text = str(model)
    if text.startswith("demo:"):
        from ortpilot.models import demo_model_path

        return demo_model_path(text.split(":", 1)[1])
    if Path(text).is_dir():  # a model folder: its model file (data.folder)
        from ortpilot.data import model_path_of

        return model_path_of(text)
    return Path(text)


def _shapes(sample: Sample) -> dict[str, tuple[int, ...]]:
    return {k: tuple(int(d) for d in v.shape) for k, v in sample.items()}


def _traffic_as_data(requests: list[Sample], file: Path) -> Any:
    """A ``--workload`` .npz's requests as the calibration and gate data, named by the file they came from."""
    from ortpilot.passes.calibration import CalibrationSet

    return CalibrationSet(list(requests), str(file), data=DataSource("files", str(file), digest_files([file])))


def _given_data(proto: Any, shapes: Mapping[str, tuple[int, ...]], calibration: Any) -> Any:
    """User samples through the one loader quantize and compare use (names, dtypes and ranks checked against
    the model, so a mismatch is an error now, not a failed candidate later); None without any."""
    if calibration is None:
        return None
    from ortpilot.passes.calibration import load_calibration

    return load_calibration(calibration, proto, shapes=shapes)


def _refuse_empty(shapes: Mapping[str, tuple[int, ...]], samples: Sequence[Sample]) -> None:
    """A tune of inputs that are all empty (a 0 dim) would time and gate nothing and still ship a "winner":
    refused, naming the samples or the shapes."""
    refuse_all_empty(samples, "a tune")
    if shapes and all(0 in dims for dims in shapes.values()):
        shown = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
        raise UsageError(
            f"Every input would be empty at the shapes to tune ({shown}): a 0 dim leaves nothing to time or "
            "compare. Give each dim 1 or more with --shape."
        )


def _folder_attention(folder: ModelFolder | None) -> tuple[int, int]:
    """(num_heads, hidden_size) from the model folder's config.json, for a fusion the graph cannot size."""
    return (int(folder.get("num_heads") or 0), int(folder.get("hidden_size") or 0)) if folder else (0, 0)


_BEFORE_FIELD = {"session_knobs": True}  # what a journal written before a start field existed did


def _check_resume(journal: Journal, config: dict[str, Any], out: Path) -> None:
    header = journal.get("start")
    if journal.replayed:
        check_version(journal.path, header)
    if journal.replayed and (header is None or journal.get(KEPT) is None):
        # the gate would read the default session's outputs from a path the journal names
        raise UsageError(
            f"The journal in '{out}' lacks its {'start' if header is None else 'kept'} record, which "
            "every resumable tune writes first; it was damaged or edited. Drop --resume to start over, "
            "or choose another -o folder."
        )
    if header is None:
        return
    differs = [k for k, v in config.items() if header.get(k, _BEFORE_FIELD.get(k)) != v]
    if differs:
        raise UsageError(
            f"The journal in '{out}' belongs to a different tune (it differs in: {', '.join(differs)}). "
            "Drop --resume to start over, or choose another -o folder."
        )


def _pick(
    finalists: list[Entry], reference: Entry, objective: str, states: TuneStates | None = None
) -> tuple[Entry, bool, str]:
    """The finalist with the best interleaved figure; ``reference`` (ORT's default, or that session capped
    at the CPU budget where its pool would start more threads: ``Search._reference``) unless the gain is
    outside noise. Where the machine ran in two states during the tune (``states``), a finalist timed in both
    counts with its worse state's figure too: a user's process may run in either."""
    measured = [e for e in finalists if e.final] or [e for e in finalists if e.samples]
    best = min(measured, key=lambda e: _relative_cost(e, reference, objective, states))
    if best is not reference:
        best = min(_alike(best, measured, reference, objective), key=lambda e: e.error_share)
    name = reference_name(reference.candidate.to_dict())
    why_capped = (
        ""
        if reference.candidate.baseline
        else "; uncapped, ORT's default starts more intra-op threads and pins them to CPUs outside this "
        "process's own, so it is neither the choice nor the measure"
    )
    if best is reference:
        rivals = [e.candidate.label for e in measured if e is not reference]
        if not rivals:
            return reference, True, f"no other candidate passed the gate and was measured{why_capped}"
        where = "in the final interleaved measurement" if reference.final else "in the search"
        return reference, True, f"{name} measured fastest {where}, against {' and '.join(rivals)}{why_capped}"
    gain = speedup(reference, best, objective)
    if gain["ci_low"] <= 1.0:
        return (
            reference,
            True,
            (
                f"the best alternative ({best.candidate.label}) is within noise of {name} "
                f"({gain['ratio']:.2f}x, 95% CI {gain['ci_low']:.2f}-{gain['ci_high']:.2f}){why_capped}"
            ),
        )
    return best, False, ""


# Alike to the fastest finalist: the 95% CI of their ratio holds 1 and its median is at most this much slower
# (a final timed in a few noisy rounds gave one measured 3.5x slower a CI of 0.26-1.72: noise, not alike).
ALIKE_RATIO = 1.10


def _alike(best: Entry, measured: list[Entry], reference: Entry, objective: str) -> list[Entry]:
    """``best`` and the finalists the final cannot tell from it (the 95% CI of their ratio holds 1, the median
    within ``ALIKE_RATIO``), ``best`` first: at the same speed the more accurate one ships, since a model that passed near its limit on the
    held-out samples breaks on traffic first (MiniLM: NNCF's INT8 at 0.0048 of an aim of 0.005 left a
    sentence of 2,000 at 0.0132, the recipe beside it at 0.0028 none under 0.99; BENCHMARKS.md, issue 46)."""
    if not best.final:
        return [best]

    def alike(e: Entry) -> bool:
        gain = speedup(e, best, objective)
        return gain["ci_low"] <= 1.0 and gain["ratio"] <= ALIKE_RATIO

    return [best] + [e for e in measured if e is not best and e is not reference and e.final and alike(e)]


def _relative_cost(entry: Entry, reference: Entry, objective: str, states: TuneStates | None) -> float:
    """``entry``'s cost over ``reference``'s, lower is better: from the final (or the search), and no lower than
    in the worse of the machine's two states where the tune saw both and timed ``entry`` in each."""
    own = cost(entry.final or entry.samples, objective) / cost(reference.final or reference.samples, objective)
    worst = states.worst(entry) if states is not None and entry is not reference else None
    return max(own, 1 / worst) if worst else own


def _passed_over(finalists: list[Entry], winner: Entry, reference: Entry, states: TuneStates | None) -> dict[str, str]:
    """The finalist the final alone ranks first when it is not the winner, its id and why, for the report ({}
    otherwise): its worse machine state's figure, or a winner within noise of it that is more accurate."""
    timed = [e for e in finalists if e.final]
    if not timed or not reference.final:
        return {}
    first = min(timed, key=lambda e: cost(e.final, "p50"))
    if first is winner or first is reference:
        return {}
    ranked = min(timed, key=lambda e: _relative_cost(e, reference, "p50", states))
    if first is ranked:  # the tie-break chose the winner (_alike), or ORT's default stayed on noise
        if winner is reference or winner not in _alike(first, timed, reference, "p50"):
            return {}
        gain = speedup(winner, first, "p50")
        why = (
            f"{first.candidate.label} measured {gain['ratio']:.2f}x the winner in the final (95% CI "
            f"{gain['ci_low']:.2f}-{gain['ci_high']:.2f}): within noise, and at the same speed the more accurate "
            f"ships (worst held-out error {first.error_share:.0%} of its limit, the winner's "
            f"{winner.error_share:.0%})"
        )
        return {"id": first.candidate.id, "why": why}
    worst = states.worst(first) if states is not None else None
    if states is None or worst is None:
        return {}  # the state figures did not change the order (ORT's default may still win on noise)
    final = speedup(reference, first, "p50")["ratio"]
    figures = states.figures[first.candidate.id]
    state = min(figures, key=lambda s: figures[s].speedup)
    why = (
        f"{first.candidate.label} measured {final:.2f}x in the final, but {worst:.2f}x in the machine's {state} "
        f"state (this tune saw two: ORT's default p50 {_state_ms(states, first)}); the pick goes by the worse "
        "state's figure, as a user's process may run in either"
    )
    return {"id": first.candidate.id, "why": why}


def _state_ms(states: TuneStates, entry: Entry) -> str:
    figures = states.figures[entry.candidate.id]
    return " and ".join(f"{figures[s].default_p50_ms:.3f} ms {s}" for s in sorted(figures))


__all__ = [
    "HELDOUT_SEED",
    "TuneRequest",
    "TuneResult",
    "as_request",
    "check_out_dir",
    "check_request",
    "feeds_digest",
    "load_note",
    "tune",
]
