"""``ortpilot run``: one verified inference, with providers, placement and fallbacks reported."""

from __future__ import annotations

import warnings

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import (
    JSON_OPTION,
    LEVEL_OPTION,
    MODEL_FILE_OPTION,
    POLICY_OPTION,
    SHAPE_OPTION,
    emit_json,
    handle_errors,
    isolate_option,
    load_input_files,
    resolve_model_arg,
    stderr,
    stdout,
)
from ortpilot.cli.flags import INPUT_OPTION, PROVIDER_OPTION


@click.command("run")
@MODEL_FILE_OPTION
@click.argument("model")
@PROVIDER_OPTION
@POLICY_OPTION
@click.option(
    "--min-coverage",
    type=click.FloatRange(0, 1),
    default=None,
    help="Least share of estimated FLOPs (of nodes where FLOPs are unknown) on the first provider (default 0.95).",
)
@LEVEL_OPTION
@INPUT_OPTION
@SHAPE_OPTION
@isolate_option(help="Create the session in a child process first (survives ORT crashes).")
@JSON_OPTION
@handle_errors
def command(
    model: str,
    providers: tuple[str, ...],
    policy: str,
    min_coverage: float | None,
    level: str,
    inputs: tuple[str, ...],
    shapes: tuple[str, ...],
    isolate: bool,
    as_json: bool,
) -> None:
    """Run MODEL once on the requested providers and show where it really ran."""
    from ortpilot.api import run_once

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_once(
            resolve_model_arg(model),
            list(providers) or None,
            policy=policy,
            min_coverage=min_coverage,
            level=level,
            feeds=load_input_files(inputs),
            shapes=list(shapes),
            isolate=isolate,
        )
    result["warnings"] = [str(w.message) for w in caught]
    for text in result["warnings"]:
        stderr.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)
    if as_json:
        emit_json(result)
        return
    render(result)


def render(result: dict) -> None:
    session = result["session"]
    stdout.print(f"[bold]providers loaded:[/] {escape(', '.join(session['providers']))}   policy: {session['policy']}")
    if result.get("generated_inputs"):
        stdout.print(f"[dim]generated inputs: {escape(result['generated_inputs'])}[/]")
    for fb in session["fallbacks"]:
        stdout.print(
            f"[yellow]fallback (layer {fb['layer']}):[/] "
            + escape(f"{fb['requested']}: {fb['title']}. {fb['reason']}"),
            highlight=False,
        )
    placement = session.get("placement")
    if placement:
        table = Table(title=escape(f"Placement ({placement['source']})"))
        for col in ("provider", "nodes", "share", "FLOPs share"):
            table.add_column(col, justify="right" if col != "provider" else "left")
        for provider, info in placement["providers"].items():
            flops = "-" if info["flops_share"] is None else f"{info['flops_share']:.1%}"
            table.add_row(escape(provider), str(info["nodes"]), f"{info['share']:.1%}", flops)
        stdout.print(table)
    table = Table(title="Outputs")
    for col in ("name", "shape", "dtype", "min", "max"):
        table.add_column(col)
    for out in result["outputs"]:
        table.add_row(
            escape(out["name"]), escape(str(out["shape"])), out["dtype"], f"{out['min']:.4g}", f"{out['max']:.4g}"
        )
    stdout.print(table)
