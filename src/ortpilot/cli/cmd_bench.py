"""``ortpilot bench``: latency statistics of one configuration, or several interleaved (--vs)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import (
    ISOLATE_OPTION,
    JSON_OPTION,
    LEVEL_NAMES,
    MODEL_FILE_OPTION,
    POLICY_OPTION,
    SHAPE_OPTION,
    emit_json,
    handle_errors,
    load_input_files,
    parse_kv_list,
    resolve_model_arg,
    stderr,
    stdout,
)
from ortpilot.cli.flags import INPUT_OPTION, PROVIDER_OPTION
from ortpilot.cli.groups import arg_group
from ortpilot.errors import UsageError, VerificationError
from ortpilot.measure.options import DEFAULT_DURATION_S, DEFAULT_WARMUP, BenchConfig, BenchOptions
from ortpilot.session import SessionSettings

LEVELS = list(LEVEL_NAMES)
_SESSION = SessionSettings()  # the session flags' defaults are its
# flag -> the SessionSettings field it sets (--free-dim sets free_dimension_overrides, parsed)
SESSION_FLAGS = {
    "level": "level",
    "threads": "intra_op_threads",
    "inter_threads": "inter_op_threads",
    "mode": "execution_mode",
    "arena": "enable_cpu_mem_arena",
    "mem_pattern": "enable_mem_pattern",
}
_CONFIG = BenchConfig()


def _knobs(base: bool) -> list[Callable]:
    """Options that describe one configuration. On the command they carry defaults; inside
    ``--vs`` every default is None, so that only the flags given there override the base."""

    def d(value: Any) -> Any:
        return value if base else None

    return [
        PROVIDER_OPTION,
        click.option(
            "--level", type=click.Choice(LEVELS), default=d(_SESSION.level), help="ORT graph optimization level."
        ),
        click.option(
            "--threads", type=int, default=d(_SESSION.intra_op_threads), help="Intra-op threads (0 = ORT's default)."
        ),
        click.option(
            "--inter-threads", type=int, default=d(_SESSION.inter_op_threads), help="Inter-op threads (parallel mode)."
        ),
        click.option(
            "--mode",
            type=click.Choice(["sequential", "parallel"]),
            default=d(_SESSION.execution_mode),
            help="Execution mode.",
        ),
        click.option("--arena/--no-arena", default=d(_SESSION.enable_cpu_mem_arena), help="CPU memory arena on/off."),
        click.option(
            "--mem-pattern/--no-mem-pattern",
            default=d(_SESSION.enable_mem_pattern),
            help="Memory pattern planning on/off.",
        ),
        click.option(
            "--iobinding/--no-iobinding",
            default=d(_CONFIG.iobinding),
            help="Bind inputs once as OrtValues and outputs to CPU; time run_with_iobinding.",
        ),
        SHAPE_OPTION,
        click.option(
            "--free-dim",
            "free_dims",
            multiple=True,
            help="DIM=N: an ORT free-dimension override (also sizes generated inputs).",
        ),
        INPUT_OPTION,
        click.option(
            "--concurrency",
            type=int,
            default=d(_CONFIG.concurrency),
            help="Threads running the one session at once (1-256).",
        ),
    ]


def _apply(options: list[Callable], cmd: click.Command) -> click.Command:
    """Add options to a built command, in order (after its own)."""
    for option in options:
        option(cmd)
    return cmd


@click.command("vs", add_help_option=False)
@click.option("--model", default=None, help="Another model for this configuration.")
@click.option("--name", default=None, help="Label of this configuration.")
def _vs_command(**params: Any) -> dict[str, Any]:
    return params


_vs_command = _apply(_knobs(base=False), _vs_command)


@dataclass(frozen=True)
class ConfigFlags:
    """One configuration's flags as given (the command's, a ``--vs``'s, a ``--configs`` entry's): what the
    others are layered over, flag by flag, before any of them becomes a ``BenchConfig``."""

    model: str
    name: str | None
    providers: tuple[str, ...]
    level: str
    threads: int
    inter_threads: int
    mode: str
    arena: bool
    mem_pattern: bool
    iobinding: bool
    shapes: tuple[str, ...]
    free_dims: tuple[str, ...]
    inputs: tuple[str, ...]
    concurrency: int

    def over(self, text: str, where: str = "--vs") -> ConfigFlags:
        """The flags of another configuration, over these. Unknown flags exit 2."""
        try:
            args = shlex.split(text)
        except ValueError as exc:
            raise UsageError(f"{where} '{text}' cannot be split into flags: {exc}.") from None
        try:
            ctx = _vs_command.make_context("--vs", args)
        except click.exceptions.ClickException as exc:
            raise UsageError(
                f"{where} '{text}': {exc.format_message()} Allowed inside it: the session flags "
                "(-p, --level, --threads, --inter-threads, --mode, --[no-]arena, --[no-]mem-pattern, "
                "--[no-]iobinding, --shape, --free-dim, --input, --concurrency) and --model, --name."
            ) from None
        return replace(self, **{k: v for k, v in ctx.params.items() if v is not None and v != ()})

    def config(self) -> BenchConfig:
        """The ``BenchConfig`` these flags describe (``api.bench_config``)."""
        from ortpilot import api

        settings = SessionSettings(
            **{setting: getattr(self, flag) for flag, setting in SESSION_FLAGS.items()},
            free_dimension_overrides=api.free_dims(parse_kv_list(self.free_dims)),
        )
        return api.bench_config(
            resolve_model_arg(self.model),
            settings,
            name=self.name or "",
            providers=self.providers,
            iobinding=self.iobinding,
            shapes=self.shapes,
            feeds=load_input_files(self.inputs),
            concurrency=self.concurrency,
        )


def _configs(base: ConfigFlags, vs: tuple[str, ...], configs_file: str | None) -> list[BenchConfig]:
    """This command's configuration (the baseline), then each ``--vs``, then each ``--configs`` entry."""
    from ortpilot import api

    entries: list[tuple[str | None, str, str]] = [(None, text, "--vs") for text in vs]
    if configs_file:
        entries += [
            (e.name, e.flags, f"--configs entry '{e.name or e.flags}'") for e in api.read_bench_configs(configs_file)
        ]
    flags = [base] + [replace(base, name=n).over(text, where) for n, text, where in entries]
    return [f.config() for f in flags]


def _warmup_arg(text: str) -> int | str:
    if text == DEFAULT_WARMUP:
        return DEFAULT_WARMUP
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--warmup must be 'auto' or a run count, got '{text}'.") from None
    if value < 0:
        raise UsageError(f"--warmup must be >= 0, got {value}.")
    return value


def build_options(
    warmup: str, runs: int | None, duration: float | None, block: int | None, policy: str, roofline: bool
) -> BenchOptions:
    """The measurement flags as a ``BenchOptions`` (a bad budget exits 2 here, before any session)."""
    return BenchOptions(
        runs=runs, duration_s=duration, warmup=_warmup_arg(warmup), block=block, policy=policy, roofline=roofline
    )


BENCH_OPTIONS = arg_group(
    "options",
    build_options,
    click.option(
        "--warmup",
        default=DEFAULT_WARMUP,
        show_default=True,
        help="Warm-up runs before timing, or 'auto': until the rolling median settles.",
    ),
    click.option("--runs", type=int, default=None, help="Timed runs (per configuration)."),
    click.option(
        "--duration",
        type=float,
        default=None,
        help=f"Seconds of timed runs (default {DEFAULT_DURATION_S:g}; all configurations together).",
    ),
    click.option("--block", type=int, default=None, help="Runs per turn when interleaving (default: about 20 ms)."),
    POLICY_OPTION,
    click.option(
        "--roofline/--no-roofline",
        default=True,
        show_default=True,
        help="Achieved GFLOP/s vs this machine's measured matmul peak (measured once, cached).",
    ),
)
BASE_CONFIG = arg_group("base", ConfigFlags, *_knobs(base=True), uses=("model", "name"))


@click.command("bench")
@MODEL_FILE_OPTION
@click.argument("model")
@click.option(
    "--vs",
    "vs",
    multiple=True,
    help="Flags of another configuration to run interleaved with this one, "
    'e.g. --vs "--threads 1" (repeatable; flags not given keep this command\'s values).',
)
@click.option(
    "--configs",
    "configs_file",
    default=None,
    help='JSON file: more configurations, as flag strings or {"name": ..., "flags": ...}.',
)
@click.option("--name", default=None, help="Label of this (the baseline) configuration.")
@click.option("--samples/--no-samples", default=True, show_default=True, help="Per-run latencies in the JSON.")
@JSON_OPTION
@click.option("--report", default=None, help="Write a self-contained HTML report (histogram, time series, comparison).")
@ISOLATE_OPTION
@click.option(
    "--baseline",
    default=None,
    help="A saved 'bench --json' result of the old build: exit 1 when this "
    "one is slower by more than --max-slowdown beyond the noise (give the old model with --vs "
    '"--model OLD.onnx" to compare interleaved).',
)
@click.option("--max-slowdown", default=None, help="Percent slower than --baseline that still passes, e.g. 10.")
@handle_errors
@BENCH_OPTIONS
@BASE_CONFIG
def command(
    model: str,
    vs: tuple[str, ...],
    configs_file: str | None,
    name: str | None,
    samples: bool,
    as_json: bool,
    report: str | None,
    isolate: bool,
    baseline: str | None,
    max_slowdown: str | None,
    options: BenchOptions,
    base: ConfigFlags,
) -> None:
    """Benchmark MODEL: latency percentiles with a CI of the median, throughput, memory, roofline.

    With --vs or --configs, every configuration runs interleaved in this process and each one's
    median is compared with this command's configuration (the baseline).
    """
    from ortpilot import api

    if report:
        api.check_report_path(report)  # before minutes of measuring, not after
    configs = _configs(base, vs, configs_file)
    saved = api.prepare_baseline(baseline, max_slowdown, configs)
    if isolate:
        api.preflight_bench(configs)

    def output(result: Any, verdict: Any = None) -> None:
        _output(result, as_json, samples, report, verdict)

    result = _measure(configs, options, output)
    verdict = api.judge_regression(saved, result) if saved is not None else None
    output(result, verdict)
    if verdict is not None and verdict.slower:
        raise VerificationError(f"Performance regression against --baseline: {verdict.line()}")


def _measure(configs: list[BenchConfig], options: BenchOptions, output: Callable[[Any], None]) -> Any:
    """``api.bench`` behind a progress bar; a failing run still shows the statistics of the runs before it."""
    from ortpilot import api

    progress, bar = _progress()
    try:
        with bar:
            return api.bench(configs, options, progress=progress)
    except VerificationError as exc:
        partial = api.bench_partial(exc)
        if partial is not None:
            output(partial)
        raise


def _progress():
    """A rich progress bar on stderr, and the callback the benchmark drives it with."""
    import contextlib

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    if not stderr.is_terminal:  # a log file or a pipe gets no bar
        return None, contextlib.nullcontext()
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    )
    tasks: dict[str, Any] = {}

    def update(phase: str, done: float, total: float) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)

    return update, bar


def _output(result: Any, as_json: bool, samples: bool, report: str | None, verdict: Any = None) -> None:
    """The results first, then the report: a report that cannot be written (full disk) keeps the numbers."""
    if as_json:
        doc = result.to_dict(samples=samples)
        if verdict is not None:
            doc["regression"] = verdict.to_dict()
        emit_json(doc)
    else:
        render(result)
    if verdict is not None:
        (stderr if as_json else stdout).print(
            ("[red]" if verdict.slower else "[green]") + escape(verdict.line()) + "[/]", highlight=False
        )
    if report:
        from ortpilot import api

        path = api.write_bench_report(report, result)
        stderr.print(escape(f"report written to {path}"), highlight=False)


def _results(result: Any) -> list[Any]:
    return list(result.results) if hasattr(result, "results") else [result]


def render(result: Any) -> None:
    """One column per configuration; ratios against the baseline underneath."""
    results = _results(result)
    table = Table(title="Benchmark" if len(results) == 1 else "Benchmark (interleaved)")
    table.add_column("")
    for res in results:
        table.add_column(escape(res.name or "A"), justify="right")
    for label, cell in _ROWS:
        table.add_row(label, *[escape(cell(r)) for r in results])
    stdout.print(table)
    first = results[0]
    stdout.print(
        "[dim]"
        + escape(
            f"{first.model} on {', '.join(first.providers)}; inputs {first.inputs}: "
            + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in first.shapes.items())
            + f"; ORT {first.environment.get('onnxruntime')}"
        )
        + "[/]",
        highlight=False,
    )
    for res in results:
        if res.stats and res.stats.noisy:
            stdout.print(
                f"[yellow]noisy ({escape(res.name)}):[/] "
                + escape("; ".join(res.stats.noise_reasons))
                + ". Close other programs, pin threads, or run longer.",
                highlight=False,
            )
        if res.roofline:
            stdout.print(escape(f"roofline ({res.name}): {res.roofline['reading']}"), highlight=False)
    for ratio in getattr(result, "ratios", []):
        stdout.print(
            f"[bold]{escape(ratio.config)} / {escape(ratio.baseline)}[/]: ratio {ratio.ratio:.3f} (95% CI {ratio.ci_low:.3f}-"
            f"{ratio.ci_high:.3f}): {escape(ratio.verdict)}  [dim](pooled medians {ratio.pooled:.3f}, "
            f"CI {ratio.pooled_low:.3f}-{ratio.pooled_high:.3f})[/]",
            highlight=False,
        )
    drift = getattr(result, "drift", None)
    if drift is not None and abs(drift - 1) > 0.05:
        stdout.print(
            f"[yellow]the machine drifted:[/] baseline median late/early = {drift:.2f}; interleaving "
            "kept the comparison fair.",
            highlight=False,
        )
    if first.failure:
        stdout.print(f"[red]failed:[/] {escape(str(first.failure))}", highlight=False)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3f} ms"


def _stat(attr: str) -> Callable[[Any], str]:
    return lambda r: _ms(getattr(r.stats, attr)) if r.stats else "-"


def _ci(r: Any) -> str:
    return f"{r.stats.median_ci[0] * 1e3:.3f}-{r.stats.median_ci[1] * 1e3:.3f}" if r.stats else "-"


def _mem(r: Any) -> str:
    m = r.memory
    if m.peak_mb is None:
        return "-"
    growth = m.growth_mb
    return f"{m.peak_mb:.0f} MiB" + ("" if growth is None else f" ({growth:+.1f})")


def _roof(r: Any) -> str:
    rf = r.roofline
    if not rf:
        return "-"
    return f"{rf['achieved_gflops']:.1f}/{rf['peak_gflops']:.0f} GFLOP/s ({rf['fraction']:.1%})"


def _config(r: Any) -> str:
    s = r.settings
    return (
        f"{s['level']}, t={s['intra_op_threads']}/{s['inter_op_threads']}, {s['execution_mode'][:3]}"
        + ("" if s["enable_cpu_mem_arena"] else ", no-arena")
        + ("" if s["enable_mem_pattern"] else ", no-pattern")
        + (", iobinding" if r.iobinding else "")
        + (f", C={r.concurrency}" if r.concurrency > 1 else "")
    )


_ROWS: list[tuple[str, Callable[[Any], str]]] = [
    ("config", _config),
    (
        "runs (warm-up)",
        lambda r: f"{len(r.samples_s)} ({r.warmup.runs}{'' if r.warmup.settled is not False else ', unsettled'})",
    ),
    ("session create", lambda r: _ms(r.session_create_s)),
    ("first run", lambda r: _ms(r.first_run_s)),
    ("min", _stat("min")),
    ("mean", _stat("mean")),
    ("p50", _stat("p50")),
    ("p50 95% CI", _ci),
    ("p90", _stat("p90")),
    ("p95", _stat("p95")),
    ("p99", _stat("p99")),
    ("p999", _stat("p999")),
    ("max", _stat("max")),
    ("std", _stat("std")),
    ("inferences/s", lambda r: f"{r.stats.inferences_per_s:,.1f}" if r.stats else "-"),
    ("items/s", lambda r: f"{r.stats.items_per_s:,.1f}" if r.stats else "-"),
    ("peak RSS (growth)", _mem),
    ("roofline", _roof),
    ("noisy", lambda r: ("yes" if r.stats.noisy else "no") if r.stats else "-"),
]
