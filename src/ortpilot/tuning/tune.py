"""``ortpilot.tune``: search, pick, write the winning model, profile.json and the reports.

The orchestration only: the space comes from ``space``, the measurements from ``search``
(which runs candidates in ``worker`` children and journals every step), the files from
``artifacts.profile`` and ``report``. Nothing lands in OUTDIR until ORT's default session has
been measured within the budget, and the profile is written last, atomically. What a resume
needs besides the journal (the default session's outputs, the held-out inputs) is kept in
``OUTDIR/.ortpilot-tune/`` (``state``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ortpilot.artifacts.atomic import atomic_write_bytes, check_output_path
from ortpilot.artifacts.dirlock import one_writer
from ortpilot.artifacts.profile import write_profile
from ortpilot.artifacts.scratch import scratch_dir
from ortpilot.data import DataSource, ModelFolder, folder_of
from ortpilot.errors import UsageError
from ortpilot.gate.core import ModelGate
from ortpilot.gate.outputs import DEFAULT_MAX_ERROR, OutputGate, SavedOutputs
from ortpilot.gate.result import few_samples_warning
from ortpilot.graph.feeds import batch_size_of, generate_samples, plan_feeds, read_samples
from ortpilot.graph.shapes import parse_shape_args
from ortpilot.measure.metrics import MetricOverrides
from ortpilot.measure.stats import summarize
from ortpilot.modelio import file_sha256, load_model
from ortpilot.providers.cpubudget import ort_default_threads
from ortpilot.providers.machine import machine_facts
from ortpilot.providers.names import resolve_providers
from ortpilot.tuning.budget import CANDIDATE_TIMEOUT_S, Budget
from ortpilot.tuning.candidate import baseline_candidate
from ortpilot.tuning.journal import JOURNAL_NAME, JOURNAL_VERSION, Journal, check_version
from ortpilot.tuning.reference import REFERENCE_FILE, feeds_digest, read_reference
from ortpilot.tuning.search import OUTPUT_RESERVE_S, Entry, Progress, Search, cost, speedup
from ortpilot.tuning.space import Facts, default_stand_in, gather_facts
from ortpilot.tuning.state import KEPT, keep_for_resume, kept_file, sweep
from ortpilot.tuning.steps import StepRunner
from ortpilot.tuning.worker import WorkerClient, WorkerCrash, load_samples, save_samples

log = logging.getLogger("ortpilot")
HELDOUT_SEED = 10_000  # held-out inputs never share a seed with calibration inputs (0..)
CALIBRATION_SAMPLES = 8
MODEL_FILE = "model.onnx"


@dataclass
class TuneResult:
    """What a tune found, and where it wrote it."""

    out_dir: Path
    model: str
    objective: str
    winner: Entry
    baseline: Entry
    entries: list[Entry]
    speedup: dict[str, float]
    default_best: bool
    default_best_reason: str
    metrics: dict[str, str]
    max_error: float
    facts: Facts
    shapes: dict[str, tuple[int, ...]]
    wall_s: float
    batch: int = 1
    files: dict[str, str] = field(default_factory=dict)
    resumed: bool = False
    heldout_sha256: str = ""
    load_avg: list[float] = field(default_factory=list)  # 1-min load average at the start and the end
    metric_evidence: dict[str, str] = field(default_factory=dict)  # output -> why its metric (measure.metrics)
    gate_samples: int = 0  # held-out samples the gate decided on
    gate_data: dict[str, Any] = field(default_factory=dict)  # the held-out samples the gate ran on
    calibration_data: dict[str, Any] = field(default_factory=dict)  # the samples static INT8 calibrated on

    def stats(self, entry: Entry) -> dict[str, Any]:
        samples = entry.final or entry.samples
        if not samples:
            return {}
        return summarize(samples, items_per_run=self.batch).to_dict()

    def to_dict(self) -> dict[str, Any]:
        from ortpilot.tuning.report import vs_default

        baseline = self._entry(self.baseline)
        candidates = [self._entry(e) for e in self.entries]
        winner = self._entry(self.winner)
        for c in [winner, *candidates]:
            c["vs_default"] = vs_default(baseline, c)
        return {
            "model": self.model,
            "out_dir": str(self.out_dir),
            "objective": self.objective,
            "winner": winner,
            "baseline": baseline,
            "speedup": self.speedup,
            "default_best": self.default_best,
            "default_best_reason": self.default_best_reason,
            "metrics": self.metrics,
            "metric_evidence": self.metric_evidence,
            "max_error": self.max_error,
            "gate_samples": self.gate_samples,
            "gate_warning": few_samples_warning(self.gate_samples) or None,
            "facts": self.facts.to_dict(),
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "wall_s": self.wall_s,
            "files": self.files,
            "resumed": self.resumed,
            "onnxruntime": ort.__version__,
            "load_avg": self.load_avg,
            "load_note": load_note(self.load_avg, self.facts.cores),
            "gate_data": self.gate_data,
            "calibration_data": self.calibration_data,
            "candidates": candidates,
        }

    def _entry(self, e: Entry) -> dict[str, Any]:
        d = e.to_dict()
        d.pop("samples_s")
        d.pop("final_samples_s")
        d.pop("final_blocks")
        d["latency"] = self.stats(e)
        d["screen_latency"] = summarize(e.samples).to_dict() if e.samples else {}
        d["timing"] = "interleaved" if e.final else "search"  # where ``latency`` comes from
        return d


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
    """
    start = time.monotonic()
    load_start = _load1()
    if not budget_s or budget_s <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {budget_s}.")
    out = check_out_dir(Path(out_dir))
    with one_writer(out, "ortpilot tune"):  # a second tune on this OUTDIR exits 2 naming this one's PID
        return _tune(
            model,
            out,
            budget_s,
            start,
            load_start,
            shapes=shapes,
            objective=objective,
            max_error=max_error,
            metric=metric,
            calibration=calibration,
            providers=providers,
            resume=resume,
            quantize=quantize,
            samples=samples,
            progress=progress,
        )


def _tune(
    model: str | os.PathLike | None,
    out: Path,
    budget_s: float,
    start: float,
    load_start: float | None,
    *,
    shapes: Sequence[str] | Mapping[str, Any] | None,
    objective: str,
    max_error: float | None,
    metric: str | Sequence[str] | None,
    calibration: Any,
    providers: Sequence[Any] | None,
    resume: bool,
    quantize: bool,
    samples: int,
    progress: Callable[[Progress], None] | None,
) -> TuneResult:
    """``tune`` once OUTDIR is this process's."""
    label = str(model) if model is not None else "demo:encoder"
    path = _model_path(model)
    proto = load_model(path, load_external_data=False)
    parsed = parse_shape_args(shapes) if shapes else {}
    overrides = MetricOverrides.parse(metric)
    limit = DEFAULT_MAX_ERROR if max_error is None else float(max_error)
    folder = folder_of(path)  # config.json and pooling: metric evidence, and sizes for a fusion the graph cannot size
    gate_spec = OutputGate.for_model(proto, limit, metrics=overrides, folder=folder)  # bad flags: exit 2 now
    given = _given_data(proto, parsed, calibration)
    if given is not None:  # the samples' own shapes (a text's sequence length) are the ones timed and gated
        calib, real_heldout = given.split()
        parsed = {**parsed, **{k: tuple(v.shape) for k, v in real_heldout[0].items()}}
    plan = plan_feeds(proto, parsed)  # a dim with no default raises here, naming the input
    specs = resolve_providers(providers) if providers else None
    facts = gather_facts(proto, specs, quantize=quantize, folder_attention=_folder_attention(folder))
    if given is None:
        calib = generate_samples(proto, CALIBRATION_SAMPLES, plan=plan)
    config = {
        "model_sha256": file_sha256(path),
        "shapes": {k: list(v) for k, v in plan.shapes.items()},
        "objective": objective,
        "max_error": max_error,
        "metric": overrides.describe(),
        "quantize": quantize,
        "providers": [s.to_dict() for s in facts.providers],
        "ort": ort.__version__,
        "data_sha256": given.origin.sha256 if given is not None else None,
    }
    journal = Journal(out / JOURNAL_NAME, resume=resume)
    _check_resume(journal, config, out)
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
        log.warning(
            "NO GATE DATA: the accuracy gate compares candidates on %d synthetic inputs (%s), which say "
            "little about real inputs; pass --calibration-text, --calibration-images or --calibration.",
            len(heldout),
            plan.describe(),
        )
    sweep(out)
    if journal.get("start") is None:
        journal.append(
            {"kind": "start", **config, "budget_s": budget_s, "model": label, "journal_version": JOURNAL_VERSION}
        )
    scratch_owner = contextlib.ExitStack()  # the folder is swept by a later tune if this one is killed
    scratch = scratch_owner.enter_context(scratch_dir("ortpilot-tune-"))
    worker = WorkerClient(scratch)
    try:
        save_samples(scratch / "heldout.npz", heldout)
        save_samples(scratch / "calibration.npz", calib)
        (scratch / "worker.json").write_text(
            json.dumps({"model": str(Path(path).resolve()), "shapes": {k: list(v) for k, v in plan.shapes.items()}})
        )
        references: list[Path] = []
        replay_only = _search_ended(journal)
        steps = StepRunner(
            worker,
            journal,
            lambda ref: _gate(journal, out, ref, references, replace(gate_spec, inputs=heldout)),
            replay_only=replay_only,
            on_first_record=lambda: _keep(journal, out, references, scratch / "heldout.npz"),
        )
        search = Search(
            steps,
            Budget(start + budget_s - OUTPUT_RESERVE_S, binding=not replay_only),
            objective=objective,
            progress=progress,
        )
        base = baseline_candidate()
        finalists = search.run(base, facts)
        entries = list(search.entries.values())
        base_entry = search.entries[base.id]
        stand_in = search.entries.get(default_stand_in(facts, base).id) if facts.default_oversubscribes else None
        winner, default_best, reason = _pick(finalists, base_entry, objective, stand_in)
        result = TuneResult(
            out,
            label,
            objective,
            winner,
            base_entry,
            entries,
            speedup(base_entry, winner, objective),
            default_best,
            reason,
            _metrics(search.gate),
            search.gate.gate.max_error if search.gate else 0.0,
            facts,
            dict(plan.shapes),
            time.monotonic() - start,
            batch=batch_size_of(heldout[0]),
            resumed=bool(journal.replayed),
            heldout_sha256=feeds_digest(heldout[0]),
            load_avg=_load_avg(journal, replay_only, load_start),
            metric_evidence={n: c.evidence for n, c in _choices(search.gate).items()},
            gate_samples=len(heldout),
            gate_data=gate_data,
            calibration_data=calibration_data,
        )
        _write_outputs(result, path, _winner_model(worker, winner, path), heldout[0])
        journal.append(
            {"kind": "done", "winner": winner.candidate.id, "files": result.files, "load_avg": result.load_avg}
        )
        sweep(out)  # a temp file too young to judge at the start is old enough now
        return result
    finally:
        worker.close()
        journal.close()
        scratch_owner.close()


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


def _winner_model(worker: WorkerClient, winner: Entry, source: Path) -> Path:
    """The winner's built model; rebuilt through the model store when a resumed tune finds its cache
    entry gone (the cache was cleared in between), and refused if the rebuild differs."""
    built = winner.prepared.get("model_path")
    if not built:
        return source
    if _trusted_model(Path(built), source, winner.prepared.get("model_sha256")):
        return Path(built)
    try:
        result = worker.request("prepare", winner.candidate.to_dict(), CANDIDATE_TIMEOUT_S)
    except WorkerCrash as exc:
        result = {"status": "crashed", "error": str(exc)}
    if result.get("status") != "ok" or result.get("model_sha256") != winner.prepared.get("model_sha256"):
        raise UsageError(
            f"The winner's model ({winner.candidate.label}) is gone from the model cache and "
            f"rebuilding it gave {'a different model' if result.get('status') == 'ok' else result.get('error')}"
            "; its measurements do not hold for the rebuild. Drop --resume to tune again."
        )
    return Path(result["model_path"])


def _trusted_model(path: Path, source: Path, sha256: Any) -> bool:
    """A journaled model path is used only if it is the source or a model-cache entry, with the journaled hash:
    a journal must not make tune copy an arbitrary file into OUTDIR."""
    from ortpilot.artifacts.store import ModelStore

    real = Path(os.path.realpath(path))
    inside = real == Path(os.path.realpath(source)) or Path(os.path.realpath(ModelStore().root)) in real.parents
    return inside and real.is_file() and not path.is_symlink() and file_sha256(real) == sha256


def _load_avg(journal: Journal, replay_only: bool, load_start: float | None) -> list[float]:
    """This run's load average at its start and now; a replay reports the run that measured."""
    done = journal.get("done")
    if replay_only and done is not None and "load_avg" in done:
        return list(done["load_avg"])
    return [x for x in (load_start, _load1()) if x is not None]


def _load1() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - no load average on this platform
        return None


def load_note(load_avg: Sequence[float], cores: int) -> str:
    """A warning when other work competed for the cores: thread-count choices then reflect that load.

    Judged on the load average at the start only: once the tune runs, its own worker keeps the
    cores busy and the figure says nothing about other work.
    """
    if not load_avg or load_avg[0] < cores * 0.75:
        return ""
    return (
        f"the machine was busy when the tune started (load average {load_avg[0]:.1f} on {cores} "
        "cores): latencies, and thread-count choices such as intra=1, reflect that load; re-tune on a quiet "
        "machine before relying on them"
    )


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
    finalists: list[Entry], base: Entry, objective: str, stand_in: Entry | None = None
) -> tuple[Entry, bool, str]:
    """The finalist with the best interleaved figure; ORT's default unless the gain is outside noise.

    ``stand_in`` (ORT's default with its threads capped at the CPU budget) replaces ORT's default
    as the choice when the default itself starts more threads than this process may use.
    """
    measured = [e for e in finalists if e.final] or [e for e in finalists if e.samples]
    best = min(measured, key=lambda e: cost(e.final or e.samples, objective))
    capped = stand_in is not None and stand_in.measured
    why_capped = (
        (
            f"; recorded with {stand_in.candidate.settings.intra_op_threads} intra-op thread(s), the CPUs "
            "this process may use (ORT's default starts more)"
        )
        if capped
        else ""
    )
    if best is base:
        return (
            (stand_in if capped else base),
            True,
            ("ORT's default session measured fastest of all candidates that passed the gate" + why_capped),
        )
    gain = speedup(base, best, objective)
    if gain["ci_low"] <= 1.0:
        return (
            (stand_in if capped else base),
            True,
            (
                f"the best alternative ({best.candidate.label}) is within noise of ORT's default "
                f"({gain['ratio']:.2f}x, 95% CI {gain['ci_low']:.2f}-{gain['ci_high']:.2f})" + why_capped
            ),
        )
    return best, False, ""


def _write_reference(out: Path, winner: Entry, feeds: Mapping[str, Any]) -> Path:
    """OUTDIR/reference.npz: the first held-out sample and the winner's outputs on it, for ``verify``
    on other machines (hashes alone only prove a bit-exact rerun). The outputs are the worker's (the
    bytes ``output_sha256`` hashes); when a resumed tune's worker files are gone, the winner is rerun."""
    import numpy as np

    from ortpilot.artifacts.atomic import atomic_open

    names = list(winner.prepared.get("output_names") or [])
    outputs: dict[str, Any] = {}
    saved = Path(str(winner.prepared.get("outputs") or ""))
    if names and saved.is_file():
        first = (read_samples(saved) or [{}])[0]
        outputs = {name: first[name] for name in names if name in first}
    if not names or len(outputs) != len(names):
        from ortpilot.session import load
        from ortpilot.tuning.worker import _outputs

        cand = winner.candidate
        sess = load(
            str(out / MODEL_FILE),
            [(p["name"], p.get("options", {})) for p in cand.providers],
            "strict",
            settings=cand.settings,
        )
        outputs = dict(zip([o.name for o in sess.get_outputs()], _outputs(sess, feeds, cand.iobinding)))
    dest = out / REFERENCE_FILE
    with atomic_open(dest, "wb") as fh:
        np.savez(fh, **{f"inputs/{k}": v for k, v in feeds.items()}, **{f"outputs/{k}": v for k, v in outputs.items()})
    return dest


def _write_outputs(result: TuneResult, source: Path, built: Path, reference_feeds: Mapping[str, Any]) -> None:
    from ortpilot.tuning.report import write_reports

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    winner = result.winner
    model_file = out / MODEL_FILE
    atomic_write_bytes(model_file, built.read_bytes())
    latency = {
        "objective": result.objective,
        "winner": result.stats(winner),
        "baseline": result.stats(result.baseline),
        "speedup_vs_default": result.speedup,
        "interleaved": bool(winner.final and result.baseline.final),
        "load_avg": result.load_avg,
    }
    result.files = {
        "model": str(model_file),
        "profile": str(out / "profile.json"),
        "reference": str(out / REFERENCE_FILE),
        "report_html": str(out / "report.html"),
        "report_md": str(out / "report.md"),
        "journal": str(out / JOURNAL_NAME),
    }
    write_reports(result)
    reference = _write_reference(out, winner, reference_feeds)
    settings = winner.candidate.settings.with_explicit_threads(result.facts.default_threads or ort_default_threads())
    optimized = _write_optimized(out, model_file, list(winner.candidate.providers), settings, reference)
    write_profile(
        out / "profile.json",
        model_file=model_file,
        providers=list(winner.candidate.providers),
        settings=settings.to_dict(),
        iobinding=winner.candidate.iobinding,
        machine=machine_facts(),
        passes=winner.prepared.get("passes") or [],
        accuracy=winner.accuracy or {},
        latency=latency,
        extra={
            "candidate": winner.candidate.to_dict(),
            "reference_outputs": {
                **({"heldout_seed": HELDOUT_SEED} if result.gate_data.get("source") == "synthetic" else {}),
                "inputs_sha256": result.heldout_sha256,
                "sha256": winner.prepared.get("output_sha256") or {},
                "file": reference.name,
            },
            "source_model": {"path": str(source), "sha256": file_sha256(source)},
            "shapes": {k: list(v) for k, v in result.shapes.items()},
            "placement": winner.prepared.get("placement"),
            "default_best": result.default_best,
            "gate_data": result.gate_data,
            "calibration_data": result.calibration_data,
            **({"optimized_model": optimized} if optimized else {}),
        },
    )
    if optimized:
        result.files["optimized_model"] = str(out / optimized["file"])


def _write_optimized(
    out: Path, model_file: Path, providers: list[dict[str, Any]], settings: Any, reference: Path
) -> dict[str, Any] | None:
    """The ORT-optimized winner for serving replicas (``tune.optimized``), checked on the reference sample."""
    from ortpilot.tuning.optimized import write_optimized_model

    inputs, outputs = read_reference(reference)
    return write_optimized_model(out, model_file, providers, settings, inputs, outputs)
