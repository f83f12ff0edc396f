"""``ortpilot tune``: find the fastest configuration that passes the accuracy gate; write a profile."""

from __future__ import annotations

import click
from rich.markup import escape

from ortpilot.cli.common import (
    MODEL_FILE_OPTION,
    REAL_DATA_OPTIONS,
    SHAPE_OPTION,
    emit_json,
    handle_errors,
    interrupt_exit_code,
    interrupt_name,
    json_option,
    real_data_arg,
    resolve_model_arg,
    stderr,
)
from ortpilot.cli.flags import PROVIDER_OPTION, gate_flags
from ortpilot.cli.groups import arg_group
from ortpilot.gate.outputs import DEFAULT_MAX_ERROR
from ortpilot.tuning.request import (
    DEFAULT_OBJECTIVE,
    DEFAULT_OUT_DIR,
    DEMO_BUDGET_S,
    DEMO_MODEL,
    MODEL_BUDGET_S,
    OBJECTIVES,
    TuneRequest,
)


def build_request(
    models: tuple[str, ...],
    out_dir: str,
    shapes: tuple[str, ...],
    budget: float | None,
    objective: str,
    max_error: float | None,
    metric: tuple[str, ...],
    outputs: tuple[str, ...],
    calibration: str | None,
    providers: tuple[str, ...],
    no_quantize: bool,
    no_session_knobs: bool,
    resume: bool,
    workload: str | None,
    batches: str,
) -> TuneRequest:
    """The tune flags as a ``TuneRequest`` for MODELS' first (the demo encoder without one)."""
    model = models[0] if models else None
    data = real_data_arg(model if model else DEMO_MODEL)
    if data is not None and calibration is not None:
        raise click.UsageError("Give --calibration or --calibration-text/--calibration-images, not both.")
    return TuneRequest(
        model=resolve_model_arg(model) if model else None,
        out_dir=out_dir,
        budget_s=budget,
        shapes=shapes,
        objective=objective,
        max_error=max_error,
        metric=metric,
        outputs=outputs,
        calibration=data if data is not None else calibration,
        providers=providers,
        quantize=not no_quantize,
        session_knobs=not no_session_knobs,
        resume=resume,
        workload=workload,
        batches=batches,
    )


TUNE_REQUEST = arg_group(
    "request",
    build_request,
    click.option(
        "-o",
        "--out",
        "out_dir",
        default=DEFAULT_OUT_DIR,
        show_default=True,
        help="Output folder (a bundle with --ray).",
    ),
    SHAPE_OPTION,
    click.option(
        "--budget",
        type=float,
        default=None,
        help=f"Seconds for the whole tune (default {MODEL_BUDGET_S:.0f}; {DEMO_BUDGET_S:.0f} for the demo).",
    ),
    click.option("--objective", type=click.Choice(OBJECTIVES), default=DEFAULT_OBJECTIVE, show_default=True),
    gate_flags(f"Largest accepted error per output (default {DEFAULT_MAX_ERROR:g})."),
    click.option(
        "--calibration",
        type=click.Path(),
        default=None,
        help="Samples for static INT8's calibration and the accuracy gate (held out), read as quantize and "
        "compare read them: a folder of .npy/.npz, one .npz (arrays with a leading sample axis), or FILE.py:FACTORY.",
    ),
    REAL_DATA_OPTIONS,
    PROVIDER_OPTION,
    click.option("--no-quantize", is_flag=True, help="Leave INT8 variants out of the search."),
    click.option(
        "--no-session-knobs",
        is_flag=True,
        help="Leave session options (threads, optimization level, IOBinding, an EP's own knobs) out of the search: "
        "model variants and providers run with ORT's defaults, for a deployment that sets its own.",
    ),
    click.option("--resume", is_flag=True, help="Continue an interrupted tune from OUTDIR's journal."),
    click.option(
        "--workload",
        type=click.Path(),
        default=None,
        help="What the deployment sends, to time on: a .txt (a request a line, at its own length), an .npz of "
        'requests, or a .json histogram {"dims": {"sequence": {"17": 120, "32": 40}}}. Default: the '
        "calibration data at its own sizes.",
    ),
    click.option(
        "--batch",
        "batches",
        default="1",
        show_default=True,
        metavar="B,B,...",
        help="Batch sizes a server forms (requests sorted by size and padded to the longest): the first is "
        "tuned for, each is timed.",
    ),
    uses=("models",),
)


@click.command(
    help="Search providers x levels x fusion x INT8 x threads x IOBinding for the fastest configuration "
    "that passes the accuracy gate, and write the winning model, profile.json, report.html and "
    "report.md to OUTDIR. Without MODEL, tunes the built-in demo encoder. With --ray ADDRESS, tunes "
    "every machine class of that Ray cluster and writes a bundle (one profile per class) per MODEL."
)
@MODEL_FILE_OPTION
@click.argument("models", nargs=-1)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Tune on this Ray cluster (HOST:PORT, or auto): one search per machine class of its nodes, one "
    "bundle per MODEL (docs: Tuning a fleet). Several MODELs need it.",
)
@json_option(help="Print the result as one JSON document on stdout.")
@handle_errors
@TUNE_REQUEST
def command(models: tuple[str, ...], request: TuneRequest, ray_address: str | None, as_json: bool) -> None:
    from ortpilot.tuning import tune

    if len(models) > 1 and ray_address is None:
        raise click.UsageError("Several MODELs are tuned on a Ray cluster: add --ray ADDRESS (or tune one MODEL).")
    if ray_address is not None:
        _tune_fleet(list(models) or [DEMO_MODEL], ray_address, request, as_json)
        return
    stderr.print(
        escape(
            f"Tuning {models[0] if models else f'the built-in demo encoder ({DEMO_MODEL})'} for up to "
            f"{request.budget:.0f} s (objective {request.objective}) into {request.out_dir}/"
        ),
        highlight=False,
    )
    with _ProgressView(request.budget) as view:
        try:
            result = tune(request, progress=view.update)
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP
            view.stop()
            stderr.print(
                f"[yellow]interrupted[/] ({interrupt_name(exc)}): {escape(_kept(request.out_dir))}", highlight=False
            )
            raise SystemExit(interrupt_exit_code(exc)) from None
    doc = result.to_dict()
    if as_json:
        emit_json(doc)
    render_summary(doc)


def _tune_fleet(models: list[str], address: str, request: TuneRequest, as_json: bool) -> None:
    """``--ray``: every machine class of the cluster, one bundle per model; progress lines on stderr."""
    import contextlib
    import sys

    from ortpilot.errors import FleetError
    from ortpilot.fleet.run import tune_fleet

    targets = [m if m.startswith("demo:") else resolve_model_arg(m) for m in models]
    stderr.print(
        escape(
            f"Tuning {', '.join(models)} on every machine class of the Ray cluster {address}, up to "
            f"{request.budget:.0f} s per class, into {request.out_dir}/"
        ),
        highlight=False,
    )

    def say(line: str) -> None:
        stderr.print(escape(line), highlight=False)

    try:  # Ray prints what its raylets report (a worker that died) on stdout: --json keeps stdout for its document
        with contextlib.redirect_stdout(sys.stderr):
            result = tune_fleet(targets, address, request, progress=say)
    except FleetError as exc:
        if as_json and exc.result is not None:
            emit_json(exc.result.to_dict())
        raise
    if as_json:
        emit_json(result.to_dict())
    bundles = [str(m.bundle) for m in result.models]
    stderr.print(
        escape(
            f"Serve with 'ortpilot serve {' '.join(bundles)} --address {address}'; each replica loads its node's class."
        ),
        highlight=False,
    )


def _kept(out_dir: str) -> str:
    """What an interrupted tune leaves: its journal (resumable) or, before the first measurement, nothing."""
    from pathlib import Path

    from ortpilot.tuning.journal import JOURNAL_NAME

    if (Path(out_dir) / JOURNAL_NAME).is_file():
        return (
            f"the journal in {out_dir}/ keeps every finished candidate; run the same command with --resume "
            "to continue. No profile was written; the worker and scratch files are gone."
        )
    return (
        "it stopped before the first measurement was journaled, so nothing was kept; the worker and scratch "
        "files are gone."
    )


class _ProgressView:
    """A rich progress bar on stderr: candidates done, current best, time left."""

    def __init__(self, budget_s: float) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TextColumn("[dim]{task.fields[left]}"),
            console=stderr,
            transient=True,
        )
        self.task = self.progress.add_task("screening", total=None, best="", left=f"{budget_s:.0f} s left")

    def __enter__(self) -> _ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.progress.stop()

    def update(self, p) -> None:
        best = escape(f"best: {p.best} {p.best_ms:.3f} ms") if p.best_ms is not None else ""
        self.progress.update(
            self.task,
            description=escape(p.phase),
            completed=p.done,
            total=p.total,
            best=best,
            left=f"{p.time_left_s:.0f} s left",
        )


def render_summary(doc: dict) -> None:
    from rich.table import Table

    from ortpilot.tuning.report import (
        data_line,
        failed_provider_lines,
        final_cells,
        gate_line,
        headline,
        provider_line,
        ratio_note,
        search_cells,
        shape_plan_line,
        table_rows,
        time_line,
        untried_line,
        warmup_line,
        why_not_lines,
    )

    stderr.print(escape(gate_line(doc)), highlight=False)
    table = Table(
        title=f"Top candidates ({doc['objective']}, ORT {doc['onnxruntime']})", caption=escape(ratio_note(doc))
    )
    for col in (
        "candidate",
        "final p50 ms (95% CI)",
        "final vs default",
        "search p50 ms",
        "search vs default",
        "error",
    ):
        table.add_column(col)
    shown = table_rows(doc)
    for c in shown:
        acc = (c.get("accuracy") or {}).get("worst_error")
        mark = " [green]<- profile[/]" if c["id"] == doc["winner"]["id"] else ""
        table.add_row(
            escape(c["label"]) + mark,
            *map(escape, final_cells(doc, c)),
            *map(escape, search_cells(doc, c)),
            "-" if acc is None else f"{acc:.1e}",
        )
    stderr.print(table)
    for line in why_not_lines(doc):
        stderr.print(escape(line), highlight=False)
    for line in (shape_plan_line(doc), warmup_line(doc)):
        if line:
            stderr.print(escape(line), highlight=False)
    counts: dict[str, int] = {}
    for c in doc["candidates"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    stderr.print("Candidates: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), highlight=False)
    for line in failed_provider_lines(doc):
        stderr.print("[yellow]" + escape(line) + "[/]", highlight=False)
    if untried_line(doc):
        stderr.print(escape(untried_line(doc)) + ".", highlight=False)
    rule = doc["facts"].get("int8_rule")
    if rule:
        stderr.print(f"INT8 rule for this CPU: {rule['name']} ({rule['reason']}).", highlight=False, markup=False)
    if doc.get("gate_data"):
        stderr.print(escape(data_line(doc)), highlight=False)
    stderr.print(
        ("[bold]" if not doc["default_best"] else "[bold yellow]") + escape(headline(doc)) + "[/]", highlight=False
    )
    providers = provider_line(doc)
    if providers:
        stderr.print(escape(providers), highlight=False)
    if doc.get("load_note"):
        stderr.print(f"[yellow]Note: {escape(doc['load_note'])}.[/]", highlight=False)
    files = doc["files"]
    stderr.print(
        escape(
            f"Wrote {files['model']}, {files['profile']}, {files['report_html']}, {files['report_md']}: "
            f'{time_line(doc)}. Load it with ortpilot.load_profile("{files["profile"]}").'
        ),
        highlight=False,
    )
