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
from ortpilot.data import DataSource, ModelFolder, folder_of
from ortpilot.errors import UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import DEFAULT_MAX_ERROR, OutputGate, SavedOutputs, samples_needed
from ortpilot.gate.result import gate_data_warning
from ortpilot.graph.feeds import FeedPlan, batch_size_of, generate_samples, plan_feeds
from ortpilot.graph.prune import check_outputs
from ortpilot.graph.shapes import parse_shape_args
from ortpilot.measure import cpushare
from ortpilot.measure.metrics import MetricOverrides
from ortpilot.modelio import file_sha256, load_model
from ortpilot.providers.names import resolve_providers
from ortpilot.tuning.budget import Budget, PrepCosts
from ortpilot.tuning.candidate import baseline_candidate
from ortpilot.tuning.journal import JOURNAL_NAME, JOURNAL_VERSION, Journal, check_version
from ortpilot.tuning.machinestates import TuneStates
from ortpilot.tuning.outputs import winner_model, write_outputs
from ortpilot.tuning.pruned import pruned_model
from ortpilot.tuning.reference import HELDOUT_SEED, feeds_digest
from ortpilot.tuning.report import reference_name
from ortpilot.tuning.result import GateRecord, Pick, RunRecord, TuneResult, load_note
from ortpilot.tuning.search import OUTPUT_RESERVE_S, Entry, Progress, Search, cost, speedup
from ortpilot.tuning.space import Facts, gather_facts
from ortpilot.tuning.state import KEPT, keep_for_resume, kept_file, sweep
from ortpilot.tuning.steps import StepRunner
from ortpilot.tuning.worker import WorkerClient, load_samples, save_samples

log = logging.getLogger("ortpilot")
CALIBRATION_SAMPLES = 8
Sample = dict[str, Any]


def tune(
    model: str | os.PathLike | None = None,
    out_dir: str | os.PathLike = "ortpilot-out",
    budget_s: float = 300,
    *,
    shapes: Sequence[str] | Mapping[str, Any] | None = None,
    objective: str = "p50",
    max_error: float | None = None,
    metric: str | Sequence[str] | None = None,
    calibration: Any = None,
    providers: Sequence[Any] | None = None,
    resume: bool = False,
    quantize: bool = True,
    samples: int = 4,
    progress: Callable[[Progress], None] | None = None,
    outputs: Sequence[str] | None = None,
) -> TuneResult:
    """Find the fastest configuration that passes the accuracy gate and write it to ``out_dir``.

    ``model`` None tunes the built-in demo encoder. ``metric``: ``"METRIC"`` for every output and/or
    ``"OUTPUT=METRIC"`` items (``measure.metrics``); the rest is chosen per output on evidence.
    ``budget_s`` bounds the search (the final
    interleaved measurement is reserved inside it). Raises UsageError for bad input before
    anything is written; Ctrl-C leaves the journal, so ``resume=True`` continues (and on a
    finished tune replays it: the same winner, nothing measured again).

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
    if not budget_s or budget_s <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {budget_s}.")
    if budget_s <= OUTPUT_RESERVE_S:
        raise UsageError(
            f"--budget {budget_s:g} s leaves no time to search: a tune keeps the last {OUTPUT_RESERVE_S:g} s of its "
            "budget for writing its outputs (model, profile, reports). Give --budget "
            f"{2 * OUTPUT_RESERVE_S:g} or more (a small model tunes in 10-30 s, a transformer wants 60-120)."
        )
    out = check_out_dir(Path(out_dir))
    set_up = partial(
        _set_up,
        model,
        shapes=shapes,
        objective=objective,
        max_error=max_error,
        metric=metric,
        calibration=calibration,
        providers=providers,
        quantize=quantize,
        outputs=outputs,
    )
    with one_writer(out, "ortpilot tune"):  # a second tune on this OUTDIR exits 2 naming this one's PID
        return _tune(set_up, out, budget_s, start, load_start, resume=resume, samples=samples, progress=progress)


def _tune(
    set_up: Callable[[], _Setup],
    out: Path,
    budget_s: float,
    start: float,
    load_start: tuple[float | None, cpushare.CpuSample | None],
    *,
    resume: bool,
    samples: int,
    progress: Callable[[Progress], None] | None,
) -> TuneResult:
    """``tune`` once OUTDIR is this process's: the steps in order (module docstring); ``set_up`` is
    ``_set_up`` with the caller's arguments, run under the OUTDIR lock like every other step."""
    setup = set_up()
    with contextlib.ExitStack() as stack:  # closes the worker, the scratch folder and the journal
        journal = _open_journal(out, setup.config, resume)
        stack.callback(journal.close)
        data = _choose_data(setup, journal, out, samples)
        _record_start(journal, out, setup, budget_s)
        worker = _scratch_space(stack, setup, data)
        replay_only = _search_ended(journal)
        budget = Budget(start + budget_s - OUTPUT_RESERVE_S, binding=not replay_only)
        search, pick = _search(setup, data, journal, out, worker, budget, progress)
        load_avg, others_cpu = _load(journal, replay_only, load_start)
        run = RunRecord(time.monotonic() - start, bool(journal.replayed), load_avg, budget_s, others_cpu=others_cpu)
        result = _result(out, setup, data, search, pick, run)
        write_outputs(result, setup.source, winner_model(worker, pick.winner, setup.path), data.heldout[0])
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


def _set_up(
    model: str | os.PathLike | None,
    *,
    shapes: Sequence[str] | Mapping[str, Any] | None,
    objective: str,
    max_error: float | None,
    metric: str | Sequence[str] | None,
    calibration: Any,
    providers: Sequence[Any] | None,
    quantize: bool,
    outputs: Sequence[str] | None = None,
) -> _Setup:
    """Read the model, the flags and the user's samples; gather the facts the space is built from."""
    label = str(model) if model is not None else "demo:encoder"
    source = _model_path(model)
    proto = load_model(source, load_external_data=False)
    names = check_outputs(proto, list(outputs)) if outputs else None  # a name it lacks: exit 2, nothing written
    path = pruned_model(source, names) if names else source
    graph = load_model(path, load_external_data=False) if names else proto  # what candidates are built from
    parsed = parse_shape_args(shapes) if shapes else {}
    overrides = MetricOverrides.parse(metric)
    limit = DEFAULT_MAX_ERROR if max_error is None else float(max_error)
    folder = folder_of(path)  # config.json and pooling: metric evidence, and sizes for a fusion the graph cannot size
    gate_spec = OutputGate.for_model(graph, limit, metrics=overrides, folder=folder)  # bad flags: exit 2 now
    given = _given_data(proto, parsed, calibration)
    given_split: tuple[list[Sample], list[Sample]] = ([], [])
    if given is not None:  # the samples' own shapes (a text's sequence length) are the ones timed and gated
        given_split = given.split()
        parsed = {**parsed, **{k: tuple(v.shape) for k, v in given_split[1][0].items()}}
    plan = plan_feeds(proto, parsed)  # a dim with no default raises here, naming the input
    specs = resolve_providers(providers) if providers else None
    facts = gather_facts(graph, specs, quantize=quantize, folder_attention=_folder_attention(folder))
    config = {
        "model_sha256": file_sha256(source),
        "outputs": names,
        "shapes": {k: list(v) for k, v in plan.shapes.items()},
        "objective": objective,
        "max_error": max_error,
        "metric": overrides.describe(),
        "quantize": quantize,
        "providers": [s.to_dict() for s in facts.providers],
        "ort": ort.__version__,
        "data_sha256": given.origin.sha256 if given is not None else None,
    }
    return _Setup(label, source, path, proto, names, objective, plan, facts, gate_spec, given, given_split, config)


def check_request(model: str | os.PathLike | None, **options: Any) -> tuple[str, Path, Any]:
    """What ``tune`` checks before any work (``_set_up``: bad input is exit 2 here), writing nothing:
    (the model as named, its file, the user's samples as a ``CalibrationSet`` or None). A fleet tune
    checks its request once here before sending it to the nodes. ``options``: ``tune``'s own
    (``shapes``, ``objective``, ``max_error``, ``metric``, ``calibration``, ``providers``, ``quantize``,
    ``outputs``)."""
    defaults = {"shapes": None, "objective": "p50", "max_error": None, "metric": None, "calibration": None}
    setup = _set_up(model, **{**defaults, "providers": None, "quantize": True, **options})
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
    search = Search(steps, budget, objective=setup.objective, progress=progress)
    base = baseline_candidate()
    finalists = search.run(base, setup.facts)
    base_entry = search.entries[base.id]
    reference = search.reference or base_entry
    states = TuneStates.read(list(search.entries.values()), reference) if setup.objective == "p50" else None
    winner, default_best, reason = _pick(finalists, reference, setup.objective, states)
    gain = speedup(reference, winner, setup.objective)
    if states is not None and not default_best and states.defaults_ms:
        gain = {**gain, "by_state": states.record(winner), "states_seen_ms": states.defaults_ms}
    return search, Pick(
        winner, reference, gain, default_best, reason, _passed_over(finalists, winner, reference, states)
    )


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
        batch=batch_size_of(data.heldout[0]),
        outputs=setup.outputs,
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


def _given_data(proto: Any, shapes: Mapping[str, tuple[int, ...]], calibration: Any) -> Any:
    """User samples through the one loader quantize and compare use (names, dtypes and ranks checked against
    the model, so a mismatch is an error now, not a failed candidate later); None without any."""
    if calibration is None:
        return None
    from ortpilot.passes.calibration import load_calibration

    return load_calibration(calibration, proto, shapes=shapes)


def _folder_attention(folder: ModelFolder | None) -> tuple[int, int]:
    """(num_heads, hidden_size) from the model folder's config.json, for a fusion the graph cannot size."""
    return (int(folder.get("num_heads") or 0), int(folder.get("hidden_size") or 0)) if folder else (0, 0)


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
    differs = [k for k, v in config.items() if header.get(k) != v]
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


def _relative_cost(entry: Entry, reference: Entry, objective: str, states: TuneStates | None) -> float:
    """``entry``'s cost over ``reference``'s, lower is better: from the final (or the search), and no lower than
    in the worse of the machine's two states where the tune saw both and timed ``entry`` in each."""
    own = cost(entry.final or entry.samples, objective) / cost(reference.final or reference.samples, objective)
    worst = states.worst(entry) if states is not None and entry is not reference else None
    return max(own, 1 / worst) if worst else own


def _passed_over(finalists: list[Entry], winner: Entry, reference: Entry, states: TuneStates | None) -> dict[str, str]:
    """The finalist the final alone ranks first when it is not the winner because of its worse state's figure:
    its id and why, for the report ({} otherwise)."""
    timed = [e for e in finalists if e.final]
    if states is None or not timed or not reference.final:
        return {}
    first = min(timed, key=lambda e: cost(e.final, "p50"))
    ranked = min(timed, key=lambda e: _relative_cost(e, reference, "p50", states))
    worst = states.worst(first)
    if first is ranked or first is winner or first is reference or worst is None:
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


__all__ = ["HELDOUT_SEED", "TuneResult", "check_out_dir", "check_request", "feeds_digest", "load_note", "tune"]
