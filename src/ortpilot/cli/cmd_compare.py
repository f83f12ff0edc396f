"""``ortpilot compare``: two models, or one model on two providers, output by output."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.cmd_optimize import _num
from ortpilot.cli.common import (
    ISOLATE_OPTION,
    JSON_OPTION,
    METRIC_HELP,
    MODEL_FILE_OPTION,
    PROVIDER_HELP,
    REAL_DATA_OPTIONS,
    SHAPE_OPTION,
    data_flags,
    emit_json,
    handle_errors,
    load_input_files,
    preflight_isolated,
    real_data_arg,
    resolve_model_arg,
    stdout,
)
from ortpilot.cli.flags import INPUT_OPTION, count_option, min_top1_option, provider_option
from ortpilot.cli.groups import arg_group
from ortpilot.data import samples_phrase
from ortpilot.gate.options import DEFAULT_NEW_TOKENS, GateOptions
from ortpilot.measure.compare import COMPARE_SAMPLES, Tolerances


def build_gate(
    model: str,
    inputs: tuple[str, ...],
    metric: tuple[str, ...],
    calibration: str | None,
    new_tokens: int,
    min_top1: float,
) -> GateOptions:
    """How the outputs are held to each other: the metrics, the held-out data, and a decoder pair's gate."""
    data = real_data_arg(model, lone_tokenizer=True)
    if data is not None and (calibration is not None or inputs):
        raise click.UsageError("Give one of --input, --calibration or --calibration-text/--calibration-images.")
    return GateOptions(
        metric=metric,
        calibration=data if data is not None else calibration,
        new_tokens=new_tokens,
        min_top1=min_top1,
        tokenizer=data_flags().get("tokenizer") if data is None else None,
    )


def build_tolerances(atol: tuple[str, ...], rtol: tuple[str, ...]) -> Tolerances:
    return Tolerances.parse(list(atol) or None, list(rtol) or None)


COMPARE_GATE = arg_group(
    "gate",
    build_gate,
    click.option("--metric", "metric", multiple=True, help=METRIC_HELP),
    click.option(
        "--calibration",
        default=None,
        help="Compare on the held-out part of these samples (folder of .npy/.npz, or one .npz).",
    ),
    REAL_DATA_OPTIONS,
    count_option("--new-tokens", DEFAULT_NEW_TOKENS, "Decoder pairs: greedy tokens generated per prompt."),
    min_top1_option("Decoder pairs: least top-1 next-token agreement (exit 1 below it)."),
    uses=("model", "inputs"),
)
TOLERANCES = arg_group(
    "tolerances",
    build_tolerances,
    click.option(
        "--atol", "atol", multiple=True, help="Absolute tolerance, or NAME:VALUE for one output (repeatable)."
    ),
    click.option(
        "--rtol", "rtol", multiple=True, help="Relative tolerance, or NAME:VALUE for one output (repeatable)."
    ),
)


@click.command("compare")
@MODEL_FILE_OPTION
@click.argument("model")
@click.argument("model_b", required=False)
@provider_option(PROVIDER_HELP + " With one MODEL: exactly two, reference first.")
@INPUT_OPTION
@click.option(
    "--all-samples",
    is_flag=True,
    help="With --calibration/--calibration-text/--calibration-images: compare on every sample, not only "
    "the held-out ones quantize and tune gate on.",
)
@SHAPE_OPTION
@count_option("--samples", COMPARE_SAMPLES, "Generated input sets when no inputs are given.", dest="n_samples")
@ISOLATE_OPTION
@JSON_OPTION
@handle_errors
@TOLERANCES
@COMPARE_GATE
def command(
    model: str,
    model_b: str | None,
    providers: tuple[str, ...],
    inputs: tuple[str, ...],
    all_samples: bool,
    shapes: tuple[str, ...],
    n_samples: int,
    isolate: bool,
    as_json: bool,
    tolerances: Tolerances,
    gate: GateOptions,
) -> None:
    """Run MODEL and MODEL_B (or MODEL on two providers) on the same inputs and report the error per output.

    Exits 1 when tolerances were given (--atol/--rtol) and an output exceeds them.
    """
    from ortpilot.api import compare, compare_failure
    from ortpilot.gate.generation import DecoderComparison

    model = resolve_model_arg(model)
    other = resolve_model_arg(model_b) if model_b else None
    if isolate:
        if other is None:  # one model on two providers: each provider builds its own session
            for provider in providers:
                preflight_isolated([model], [provider])
        else:
            preflight_isolated([model, other], list(providers) or None)
    result = compare(
        model,
        other,
        list(providers) or None,
        gate,
        inputs=load_input_files(inputs) if inputs else None,
        all_samples=all_samples,
        shapes=list(shapes),
        n_samples=n_samples,
        tolerances=tolerances,
    )
    if as_json:
        emit_json(result.to_dict())
    elif isinstance(result, DecoderComparison):
        stdout.print(escape(result.summary()), highlight=False)
    else:
        render_comparison(result)
    failure = compare_failure(result)
    if failure is not None:
        raise failure


def render_comparison(comparison: Any) -> None:
    c = comparison.to_dict() if hasattr(comparison, "to_dict") else comparison
    stdout.print(
        f"[bold]reference[/] {escape(str(c['reference']))}   [bold]test[/] {escape(str(c['test']))}   "
        f"samples {c['samples']}",
        highlight=False,
    )
    if c.get("inputs"):
        stdout.print(f"[dim]generated inputs: {escape(str(c['inputs']))}[/]")
    data = c.get("gate_data") or {}
    if data.get("source") not in (None, "synthetic"):
        reading = f" (read as: {data['reading']})" if data.get("reading") else ""
        stdout.print(escape(f"compared on {samples_phrase(data)} from {data['path']}{reading}"), highlight=False)
    table = Table(title="Per-output error (test vs reference)")
    table.add_column("")
    for o in c["outputs"]:
        table.add_column(escape(o["name"]), justify="right", overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("abs error max / mean", lambda o: f"{_num(o['max_abs'])} / {_num(o['mean_abs'])}"),
        ("abs error median / p99", lambda o: f"{_num(o['median_abs'])} / {_num(o['p99_abs'])}"),
        ("rel error max / mean", lambda o: f"{_num(o['max_rel'])} / {_num(o['mean_rel'])}"),
        ("rel error median / p99", lambda o: f"{_num(o['median_rel'])} / {_num(o['p99_rel'])}"),
        ("cosine similarity", lambda o: _num(o["cosine"], ".6f")),
        ("SNR dB", lambda o: _num(o["snr_db"], ".1f")),
        (
            "top-1 / top-5 agreement",
            lambda o: "-" if o["top1_agreement"] is None else f"{o['top1_agreement']:.1%} / {o['top5_agreement']:.1%}",
        ),
        (
            "per-step top-1 / sequences identical",
            lambda o: (
                "-"
                if o.get("step_top1_agreement") is None
                else f"{o['step_top1_agreement']:.1%} / {o['sequence_exact_match']:.1%}"
            ),
        ),
        ("NaN/Inf ref, test", lambda o: f"{o['nan_ref']}/{o['inf_ref']}, {o['nan_test']}/{o['inf_test']}"),
        ("min atol (rtol=0)", lambda o: _num(o["min_atol"])),
        ("min rtol (atol=0)", lambda o: _num(o["min_rtol"])),
        ("gate metric", lambda o: f"{o['metric']} {_num(o['error'])}"),
        (
            "passes atol/rtol",
            lambda o: ("[green]yes[/]" if o["passed"] else "[red]no[/]") + f" ({o['atol']:g}/{o['rtol']:g})",
        ),
    ]
    for label, cell in rows:
        table.add_row(label, *[cell(o) for o in c["outputs"]])
    stdout.print(table)
    for o in c["outputs"]:
        if o.get("metric_evidence"):
            stdout.print(
                f"{escape(o['name'])}: gate metric {o['metric']} ({escape(o['metric_evidence'])})", highlight=False
            )
    for o in c["outputs"]:
        stdout.print(
            f"{escape(o['name'])}: minimum tolerance that passes: atol={_num(o['min_atol'])} (rtol=0) or "
            f"rtol={_num(o['min_rtol'])} (atol=0); checked atol={o['atol']:g} rtol={o['rtol']:g}",
            highlight=False,
        )
    for name in c.get("only_in_reference", []):
        stdout.print(f"[yellow]output '{escape(name)}' only in the reference[/]")
    for name in c.get("only_in_test", []):
        stdout.print(f"[yellow]output '{escape(name)}' only in the test model[/]")
