"""``ortpilot tune MODEL ... --ray ADDRESS -o OUTDIR``: every machine class of a cluster, one bundle per model.

The steps, one function each: ``_models`` checks each model's request here, before the
cluster is touched (bad input is exit 2 with nothing written), and packs it for Ray's object
store; the cluster (a ``cluster.Cluster``: Ray's, or the tests' in-process one) finds the
classes and hosts among the alive nodes and runs the searches; ``_Driver.run`` hands out the
(model, class) searches with ``schedule.pick`` (one search per host at a time, longest first),
keeps each search's journal as it streams in (``OUTDIR/.fleet/``), resumes a search whose node
or worker died on another node of its class (or on the same node, if it is alive), and writes
each class's profile folder as it arrives; ``_write_bundles`` writes each model's
``bundle.json`` last, ``complete: false`` when a class is missing, and a missing class is a
``FleetError`` (exit 1) naming it, its node and what happened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_dir
from ortpilot.artifacts.bundle import BUNDLE_FILE, write_bundle
from ortpilot.artifacts.dirlock import one_writer
from ortpilot.errors import FleetError, UsageError
from ortpilot.fleet.cluster import Cluster, Fleet, FleetNode, RayCluster
from ortpilot.fleet.payload import folder_files, model_payload, pack, unpack
from ortpilot.fleet.remote import SearchJob
from ortpilot.fleet.result import ClassOutcome, FleetResult, ModelOutcome, SearchSummary
from ortpilot.fleet.schedule import Job, Slot, overlapping, pick
from ortpilot.fleet.schedule import plan as plan_schedule
from ortpilot.providers.machineclass import MachineClass
from ortpilot.tuning.request import TuneRequest

log = logging.getLogger("ortpilot")
FLEET_DIR = ".fleet"  # OUTDIR/.fleet/MODEL/CLASS/: each search's journal, for a resume elsewhere
MAX_ATTEMPTS = 3
START_TIMEOUT_S = 300.0  # a search whose node does not free its CPUs by then is given up there
WAIT_NOTE_S = 20.0  # a search not started by then says what it waits for
POLL_S = 1.0
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def fleet_request(
    models: Sequence[str | os.PathLike | None] | str | os.PathLike | None,
    out_dir: str | os.PathLike | None = None,
    budget_s: float | None = None,
    **options: Any,
) -> tuple[list[str | None], TuneRequest]:
    """``ortpilot.tune(..., ray_address=...)``'s arguments as the models and the one request each gets
    (``options`` are a ``TuneRequest``'s fields; the request's own ``model`` is the first model's)."""
    listed = [models] if models is None or isinstance(models, (str, os.PathLike)) else list(models)
    names = [None if m is None else os.fspath(m) for m in listed]
    located = {"out_dir": out_dir} if out_dir is not None else {}
    return names, TuneRequest(model=names[0] if names else None, budget_s=budget_s, **located, **options)


def tune_fleet(
    models: Sequence[str | None],
    ray_address: str,
    request: TuneRequest,
    *,
    progress: Callable[[str], None] | None = None,
) -> FleetResult:
    """Tune every model on every machine class of the Ray cluster at ``ray_address``; one bundle per model.

    ``request`` holds every option of the searches (its ``model`` is replaced by each of ``models``). One
    model: the request's OUTDIR is its bundle; several: OUTDIR/NAME/ each. Every search gets the request's
    budget; ``resume`` continues each search from the journal OUTDIR/.fleet/ kept. Raises ``UsageError``
    (exit 2) for bad input or a cluster with no usable node, before anything is written, and ``FleetError``
    (exit 1) after writing the bundles when a class is missing.
    """
    return tune_cluster(models, RayCluster(ray_address), request, progress=progress)


def tune_cluster(
    models: Sequence[str | None],
    cluster: Cluster,
    request: TuneRequest,
    *,
    progress: Callable[[str], None] | None = None,
) -> FleetResult:
    """:func:`tune_fleet` on the cluster ``cluster`` holds (Ray's, ``cluster.RayCluster``, or the tests'
    in-process one): every step but how nodes are found and searches run is the same."""
    started = time.monotonic()
    say = progress or (lambda line: log.info("%s", line))
    if not models:
        raise UsageError("Give at least one MODEL to tune on the cluster.")
    if request.calibration is not None and len(models) > 1:
        raise UsageError("--calibration data fits one model's inputs: tune one MODEL with it, or leave it out.")
    out = _check_out(Path(request.out_dir))
    entries = _models(models, out, request)
    with one_writer(out, "ortpilot tune --ray"), cluster.connect():
        fleet = cluster.discover()
        _say_fleet(fleet, say)
        for entry in entries:  # an old bundle.json must not describe the folders this run rewrites
            with contextlib.suppress(FileNotFoundError):
                (entry.root / BUNDLE_FILE).unlink()
        driver = _Driver(cluster, fleet, entries, out, request, say, started)
        driver.run()
    result = driver.result(time.monotonic() - started)
    _write_bundles(result, fleet, entries, driver)
    _finish(result, say)
    return result


# ------------------------------------------------------------------ the request


@dataclass
class _Model:
    """One model of the catalogue, checked here and packed for the object store."""

    name: str  # its bundle's folder name (OUTDIR itself for one model)
    label: str
    path: Path
    root: Path
    payload: bytes
    model_file: str  # the model's name inside the payload
    calibration: Any  # the user's samples (a CalibrationSet), or None
    sha256: str


def _check_out(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"Output folder '{out}' is a file, not a folder: a fleet tune writes a bundle folder. Give -o a folder path."
        )
    if (out / "profile.json").is_file():
        raise UsageError(
            f"'{out}' holds a local tune's profile.json; a bundle (bundle.json and one folder per class) goes into "
            "a folder of its own. Choose another -o folder."
        )
    return out


def _models(listed: Sequence[str | None], out: Path, request: TuneRequest) -> list[_Model]:
    """Each model's request checked here (``tune.check_request``), named, and packed."""
    from ortpilot.modelio import file_sha256
    from ortpilot.tuning.tune import check_request

    entries: list[_Model] = []
    seen: dict[str, str] = {}
    for model in listed:
        label, path, given = check_request(request.for_model(model))
        name = _model_name(label, path)
        if name in seen:
            raise UsageError(
                f"Two models would share the bundle folder '{name}' ({seen[name]} and {label}); tune them into "
                "separate -o folders, or rename one file."
            )
        seen[name] = label
        payload, model_file = model_payload(path)
        root = out if len(listed) == 1 else out / name
        entries.append(_Model(name, label, Path(path), root, payload, model_file, given, file_sha256(path)))
    return entries


def _model_name(label: str, path: Path) -> str:
    """The bundle folder's name: the demo's name, a model folder's name (``onnx/model.onnx`` is its folder's), or
    the file's stem."""
    path = Path(path).resolve()
    if label.startswith("demo:"):
        base = label.split(":", 1)[1]
    elif Path(label).is_dir():
        base = Path(label).resolve().name
    elif path.parent.name == "onnx":
        base = path.parent.parent.name
    elif path.stem == "model":
        base = path.parent.name
    else:
        base = path.stem
    return _NAME.sub("_", base).strip("._-") or "model"


def _say_fleet(fleet: Fleet, say: Callable[[str], None]) -> None:
    classes = fleet.classes()
    say(
        f"Cluster {fleet.address}: {len(fleet.nodes)} node(s) on {fleet.host_count} host(s), {len(classes)} machine "
        f"class(es): "
        + "; ".join(f"{c.name} ({', '.join(n.node.short for n in fleet.of_class(c.id))})" for c in classes.values())
    )
    for left in fleet.left_out:
        say(f"Left out node {left['node']}: {left['why']}.")


# ------------------------------------------------------------------ the searches


@dataclass
class _Search:
    """One (model, class) search and everything it went through."""

    model: _Model
    cls: MachineClass  # the class, under its name in the bundle (made unique)
    job: Job
    outcome: ClassOutcome
    title: str  # how progress lines name it: CLASS, or MODEL/CLASS in a catalogue
    journal: bytes | None = None  # the last journal it streamed: where a resume starts
    avoid: set[str] = field(default_factory=set)  # nodes not to go back to


@dataclass
class _Running:
    search: _Search
    node: FleetNode
    since: float
    started: bool = False
    waited: bool = False  # the wait for the node's CPUs was said


class _Driver:
    """Hands the searches to hosts as they free up, and keeps what each streams back."""

    def __init__(
        self,
        cluster: Cluster,
        fleet: Fleet,
        models: Sequence[_Model],
        out: Path,
        request: TuneRequest,
        say: Callable[[str], None],
        started: float,
    ) -> None:
        self.fleet, self.models, self.out, self.budget_s = fleet, list(models), out, request.budget
        self.request, self.say, self.t0, self.cluster = request, say, started, cluster
        resume = request.resume
        self.dead: set[str] = set()
        names = _class_names(list(fleet.classes().values()))
        self.searches = [
            self._search(m, MachineClass(names[c.id], c.id, c.key), resume)
            for m in self.models
            for c in fleet.classes().values()
        ]
        self.slots = [Slot(n.node.id, n.host, n.machine_class.id) for n in fleet.nodes]
        self.plan = plan_schedule([s.job for s in self.searches], self.slots)

    def _search(self, model: _Model, cls: MachineClass, resume: bool) -> _Search:
        title = cls.name if len(self.models) == 1 else f"{model.name}/{cls.name}"
        search = _Search(
            model, cls, Job(model.name, cls.id, self.budget_s), ClassOutcome(cls.name, cls.to_dict()), title
        )
        kept = self._journal_dir(search)
        if resume and kept.is_dir():
            search.journal = pack(folder_files(kept)) or None
        return search

    def _journal_dir(self, search: _Search) -> Path:
        return self.out / FLEET_DIR / search.model.name / search.cls.name

    # -------------------------------------------------------------- the loop

    def run(self) -> None:
        put = self.cluster.put
        refs = {m.name: (put(m.payload), put(m.calibration)) for m in self.models}
        pending = list(self.searches)
        running: dict[Any, _Running] = {}
        while pending or running:
            self._start(pending, running, refs)
            if not running:  # nothing runs and nothing could start: no alive node for what is left
                for search in pending:
                    self._give_up(search, self._no_node_reason(search))
                break
            for gen in self.cluster.ready(list(running), POLL_S):
                self._receive(gen, running, pending)
            self._watch(running, pending)

    def _start(self, pending: list[_Search], running: dict[Any, _Running], refs: Mapping[str, tuple]) -> None:
        """Every host with nothing running takes its next search (``schedule.pick``)."""
        busy_hosts = {r.node.host for r in running.values()}
        for search in pending:  # a node to avoid is only avoided while another of the class is alive
            alive = {n.node.id for n in self.fleet.of_class(search.cls.id)} - self.dead
            if alive and alive <= search.avoid:
                search.avoid.clear()
        for host in sorted({s.host for s in self.slots} - busy_hosts):
            by_job = {s.job: s for s in pending}
            avoid = {s.job: s.avoid for s in pending if s.avoid}
            chosen = pick(host, [s.job for s in pending], self.slots, busy=self.dead, avoid=avoid)
            if chosen is None:
                continue
            search = by_job[chosen[0]]
            node = self.fleet.node(chosen[1].node)
            pending.remove(search)
            job = SearchJob(
                search.model.model_file,
                self.request.to_dict(),
                node.machine_class.cpus,
                str(search.model.path.resolve()),
                search.model.label,
            )
            payload, calibration = refs[search.model.name]
            gen = self.cluster.start(node, job, payload, calibration, search.journal)
            running[gen] = _Running(search, node, time.monotonic())
            verb = "resuming" if search.journal else "searching"
            self.say(
                f"{search.title}: {verb} on node {node.node.id[:8]} (host {node.host}), budget {self.budget_s:.0f} s"
            )

    def _receive(self, gen: Any, running: dict[Any, _Running], pending: list[_Search]) -> None:
        run = running[gen]
        try:
            message = self.cluster.receive(gen)
        except StopIteration:
            running.pop(gen)
            self._failed(run, pending, "its task ended without a result", retry=True)
            return
        except Exception as exc:  # NodeDiedError, WorkerCrashedError, TaskUnschedulableError, ...
            running.pop(gen)
            self._failed(run, pending, self._why(exc, run), retry=True)
            return
        kind = message.get("kind")
        if kind == "started":
            run.started = True
            run.search.outcome.start_s = run.search.outcome.start_s or time.monotonic() - self.t0
        elif kind == "journal":
            run.search.journal = message["data"]
            self._keep_journal(run.search, message["data"])
        elif kind == "done":
            running.pop(gen)
            self._done(run, message)
        elif kind == "failed":
            running.pop(gen)
            why = f"its search on node {run.node.node.short} failed: {message['message']}"
            self._failed(run, pending, why, retry=bool(message.get("retry")), code=int(message["exit_code"]))

    def _watch(self, running: dict[Any, _Running], pending: list[_Search]) -> None:
        """Give up on a search whose node never started it, or that ran far past its budget."""
        now = time.monotonic()
        for gen, run in list(running.items()):
            if not run.started and not run.waited and now - run.since > WAIT_NOTE_S:
                run.waited = True
                self.say(
                    f"{run.search.title}: waiting for node {run.node.node.id[:8]}'s {run.node.node.cpus} CPU(s); other "
                    f"Ray work (a Serve application?) holds them. Given up after {START_TIMEOUT_S:.0f} s."
                )
            late = not run.started and now - run.since > START_TIMEOUT_S
            over = run.started and now - run.since > 2 * self.budget_s + START_TIMEOUT_S
            if late or over:
                self.cluster.cancel(gen)
                running.pop(gen)
                why = (
                    f"node {run.node.node.short} did not start it within {START_TIMEOUT_S:.0f} s (other Ray work holds its "
                    f"{run.node.node.cpus} CPUs?)"
                    if late
                    else f"it ran past twice its budget on node {run.node.node.short} and was stopped"
                )
                self._failed(run, pending, why, retry=True)

    # -------------------------------------------------------------- outcomes

    def _keep_journal(self, search: _Search, data: bytes) -> None:
        with atomic_dir(self._journal_dir(search), replace=True) as tmp:
            unpack(data, tmp)

    def _done(self, run: _Running, message: Mapping[str, Any]) -> None:
        search, outcome = run.search, run.search.outcome
        with atomic_dir(search.model.root / search.cls.name, replace=True) as tmp:
            unpack(message["folder"], tmp)
        outcome.summary = summary = SearchSummary.from_dict(message["summary"])
        outcome.node = {"id": run.node.node.id, "ip": run.node.node.ip, "host": run.node.host}
        outcome.attempts.append({"node": run.node.node.id, "ended": "done"})
        outcome.end_s = time.monotonic() - self.t0
        speed = summary.speedup
        self.say(
            f"{search.title}: {summary.winner or '?'}, {speed.get('ratio', 0):.2f}x {summary.measured_against} "
            f"(95% CI {speed.get('ci_low', 0):.2f}-{speed.get('ci_high', 0):.2f}) on node {run.node.node.short} in "
            f"{summary.wall_s:.0f} s"
        )

    def _failed(self, run: _Running, pending: list[_Search], why: str, *, retry: bool, code: int = 1) -> None:
        search, node = run.search, run.node.node.id
        search.outcome.attempts.append({"node": node, "ended": why})
        if node not in self.cluster.alive():
            self.dead.add(node)
        alive = [n for n in self.fleet.of_class(search.cls.id) if n.node.id not in self.dead]
        if any(n.node.id != node for n in alive):
            search.avoid.add(node)
        if retry and alive and len(search.outcome.attempts) < MAX_ATTEMPTS:
            self.say(f"{search.title}: {why}; it resumes from its journal")
            pending.append(search)
            return
        if retry:
            why += (
                f"; gave up after {MAX_ATTEMPTS} attempts"
                if alive
                else f"; no other node of class {search.cls.name} is alive"
            )
        self._give_up(search, why, code)

    def _give_up(self, search: _Search, why: str, code: int = 1) -> None:
        search.outcome.missing = why
        search.outcome.exit_code = code
        self.say(f"{search.title}: not tuned: {why}")

    def _no_node_reason(self, search: _Search) -> str:
        nodes = ", ".join(n.node.short for n in self.fleet.of_class(search.cls.id)) or "none"
        last = search.outcome.attempts[-1]["ended"] if search.outcome.attempts else ""
        return (f"{last}; " if last else "") + f"no alive node of class {search.cls.name} is left (its nodes: {nodes})"

    def _why(self, exc: BaseException, run: _Running) -> str:
        name = type(exc).__name__
        node = run.node.node.short
        if name in ("NodeDiedError", "TaskUnschedulableError"):
            return f"node {node} died during its search ({name})"
        if name == "WorkerCrashedError":
            return f"the Ray worker running its search on node {node} died ({name}: killed, or out of memory)"
        return f"its task on node {node} failed ({name}: {str(exc)[:300]})"

    def result(self, wall_s: float) -> FleetResult:
        finished = [
            (s.outcome.start_s, s.outcome.end_s or 0.0)
            for s in self.searches
            if s.outcome.done and s.outcome.start_s is not None
        ]
        tuned, why = _mode(self.fleet, finished)
        models = [
            ModelOutcome(m.name, m.label, m.root, [s.outcome for s in self.searches if s.model is m])
            for m in self.models
        ]
        return FleetResult(
            self.out, self.fleet.address, self.fleet.to_dict(), models, tuned, why, wall_s, self.plan.to_dict()
        )


def _class_names(classes: Sequence[MachineClass]) -> dict[str, str]:
    """Class id -> its folder and name in the bundle: the readable name, with the id's start where two share one."""
    counts: dict[str, int] = {}
    for c in classes:
        counts[c.name] = counts.get(c.name, 0) + 1
    return {c.id: c.name if counts[c.name] == 1 else f"{c.name}-{c.id[:6]}" for c in classes}


def _mode(fleet: Fleet, spans: Sequence[tuple[float, float]]) -> tuple[str, str]:
    """Whether the searches ran one after the other or at once, and why."""
    at_once = overlapping(spans)
    if fleet.host_count == 1:
        host = fleet.nodes[0].host
        shared = fleet.hosts.why.get(host) or "one host"
        return (
            "one after the other",
            f"all {len(fleet.nodes)} node(s) share one host ({host}: {shared}); two searches on one host disturb each "
            "other's timings, so they ran one after the other",
        )
    if at_once:
        return "at once", f"at once on {fleet.host_count} hosts, never two searches on one host"
    return "one after the other", f"one search per host at a time on {fleet.host_count} hosts; none overlapped"


# ------------------------------------------------------------------ the bundles


def _write_bundles(result: FleetResult, fleet: Fleet, models: Sequence[_Model], driver: _Driver) -> None:
    import onnxruntime as ort

    for model, outcome in zip(models, result.models):
        entries, missing = [], []
        for c in outcome.classes:
            if c.summary is not None and c.done:
                entries.append(
                    {
                        "class": c.machine_class,
                        "folder": c.name,
                        "winner": c.summary.winner,
                        "speedup": dict(c.summary.speedup),
                        "measured_against": c.summary.measured_against,
                        "default_best": c.summary.default_best,
                        "node": {k: str(v) for k, v in c.node.items()},
                        "attempts": len(c.attempts),
                        "wall_s": c.summary.wall_s,
                        "start_s": float(c.start_s or 0.0),
                        "end_s": float(c.end_s or 0.0),
                    }
                )
            else:
                missing.append({"class": c.machine_class, "why": c.missing, "nodes": [a["node"] for a in c.attempts]})
        write_bundle(
            model.root,
            entries,
            model={"name": model.name, "source": model.label, "sha256": model.sha256},
            missing=missing,
            tuned=result.tuned,
            schedule={
                "why": result.why,
                "hosts": fleet.host_count,
                "nodes": len(fleet.nodes),
                "wall_s": result.wall_s,
                "budget_s": driver.budget_s,
            },
            onnxruntime=ort.__version__,
        )


def _finish(result: FleetResult, say: Callable[[str], None]) -> None:
    say(f"Tuned {result.tuned}: {result.why}.")
    for model in result.models:
        done = [c.name for c in model.classes if c.done]
        say(
            f"Wrote {model.bundle / BUNDLE_FILE} ({len(done)} of {len(model.classes)} classes"
            f"{', complete' if model.complete else ', INCOMPLETE'}) in {result.wall_s:.0f} s."
        )
    missing = [(m, c) for m in result.models for c in m.classes if not c.done]
    if missing:
        lines = "; ".join(f"{c.name} of {m.label} ({m.bundle}): {c.missing}" for m, c in missing)
        code = max(c.exit_code or 1 for _, c in missing)
        raise FleetError(
            f"The fleet tune could not tune every machine class: {lines}. Each bundle.json says complete: false and "
            "lists what is missing; the classes that were tuned are in it. Bring a node of each missing class up "
            "and run the same command with --resume (finished classes replay from their journals).",
            exit_code=code,
            result=result,
        )


__all__ = ["FLEET_DIR", "fleet_request", "tune_cluster", "tune_fleet"]
