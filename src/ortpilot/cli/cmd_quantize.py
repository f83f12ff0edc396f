"""``ortpilot quantize``: INT8 quantization, gated by accuracy on held-out samples."""

from __future__ import annotations

import warnings
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.cmd_compare import render_comparison
from ortpilot.cli.cmd_optimize import OUTPUTS_HELP, render_record
from ortpilot.cli.common import (
    ISOLATE_OPTION,
    JSON_OPTION,
    METRIC_HELP,
    MODEL_FILE_OPTION,
    REAL_DATA_OPTIONS,
    SHAPE_OPTION,
    data_flags,
    emit_json,
    handle_errors,
    preflight_isolated,
    real_data_arg,
    resolve_model_arg,
    stderr,
    stdout,
)
from ortpilot.gate.generation import DEFAULT_MIN_TOP1
from ortpilot.quantmodes import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, FULL, INT8_MODES, WEIGHT_ONLY_MODES

_WEIGHT_ONLY = "/".join(WEIGHT_ONLY_MODES)  # names the modes in the help of the options only they read


@click.command("quantize")
@MODEL_FILE_OPTION
@click.argument("model")
@click.option("-o", "--output", required=True, help="Where to write the quantized model (.onnx).")
@click.option(
    "--mode",
    type=click.Choice([*INT8_MODES, "openvino", *WEIGHT_ONLY_MODES]),
    required=True,
    help="dynamic: INT8 weights, activations at run time; static: QOperator, calibrated; qdq: Q/DQ pairs "
    "around weighted ops, calibrated; full: QDQ on every supported op (always gated); openvino: NNCF's QDQ "
    "model for the OpenVINO EP (calibrated; needs the openvino-plugin extra or nncf); "
    f"{' / '.join(WEIGHT_ONLY_MODES)}: weight-only MatMulNBits for decoders, gated on generation.",
)
@click.option("--per-channel", is_flag=True, help="One scale per output channel of each weight.")
@click.option("--reduce-range", is_flag=True, help="7-bit weights (for CPUs without VNNI).")
@click.option("--weight-type", type=click.Choice(["qint8", "quint8"]), default="qint8", show_default=True)
@click.option(
    "--activation-type",
    type=click.Choice(["qint8", "quint8"]),
    default="quint8",
    show_default=True,
    help="Activation type for static/qdq/full.",
)
@click.option(
    "--calibration",
    default=None,
    help="Folder of .npy/.npz samples, one .npz with stacked samples, or FILE.py:FACTORY returning a "
    "CalibrationDataReader. Without it (or --calibration-text/--calibration-images), synthetic inputs "
    "(with a warning).",
)
@REAL_DATA_OPTIONS
@click.option(
    "--method",
    type=click.Choice(["minmax", "entropy", "percentile"]),
    default="minmax",
    show_default=True,
    help="Calibration method.",
)
@click.option(
    "--max-error",
    type=float,
    default=None,
    help="Refuse to write the model if its error on held-out samples exceeds this (each output by its metric: "
    "see --metric).",
)
@click.option("--metric", "metric", multiple=True, help=METRIC_HELP + " INT8 modes.")
@click.option("--outputs", "outputs", multiple=True, metavar="NAME", help=OUTPUTS_HELP + " INT8 modes.")
@click.option("--auto-exclude", is_flag=True, help="Leave the worst layers in float until --max-error passes.")
@click.option("--max-rounds", type=click.IntRange(1), default=6, show_default=True, help="Rounds of --auto-exclude.")
@click.option("--exclude", "exclude", multiple=True, help="Node name to leave in float (repeatable).")
@click.option("--op-types", default=None, help="Comma-separated op types to quantize (default: per mode).")
@click.option("--no-preprocess", is_flag=True, help="Skip quant_pre_process.")
@SHAPE_OPTION
@click.option(
    "--block-size",
    type=click.IntRange(16),
    default=DEFAULT_BLOCK_SIZE,
    show_default=True,
    help=f"{_WEIGHT_ONLY}: weights per quantization block (a power of 2).",
)
@click.option("--asymmetric", is_flag=True, help=f"{_WEIGHT_ONLY}: zero points per block.")
@click.option(
    "--accuracy-level",
    type=click.IntRange(0, 4),
    default=DEFAULT_ACCURACY_LEVEL,
    show_default=True,
    help=f"{_WEIGHT_ONLY}: MatMulNBits compute type on CPU (4 = int8, fast with VNNI).",
)
@click.option("--fuse", is_flag=True, help=f"{_WEIGHT_ONLY}: fuse attention into GroupQueryAttention first.")
@click.option(
    "--max-positions",
    type=click.IntRange(min=0),
    default=None,
    help="With --fuse: positions the fused model's constant rotary tables cover, its length limit "
    "(default: the export's recorded context length, else 8192; 0 keeps them computed per step).",
)
@click.option(
    "--min-top1",
    type=click.FloatRange(0, 1),
    default=DEFAULT_MIN_TOP1,
    show_default=True,
    help=f"{_WEIGHT_ONLY}: least top-1 next-token agreement with the float model.",
)
@ISOLATE_OPTION
@JSON_OPTION
@handle_errors
def command(
    model: str,
    output: str,
    mode: str,
    per_channel: bool,
    reduce_range: bool,
    weight_type: str,
    activation_type: str,
    calibration: str | None,
    method: str,
    max_error: float | None,
    metric: tuple[str, ...],
    outputs: tuple[str, ...],
    auto_exclude: bool,
    max_rounds: int,
    exclude: tuple[str, ...],
    op_types: str | None,
    no_preprocess: bool,
    shapes: tuple[str, ...],
    block_size: int,
    asymmetric: bool,
    accuracy_level: int,
    fuse: bool,
    max_positions: int | None,
    min_top1: float,
    isolate: bool,
    as_json: bool,
) -> None:
    """Quantize MODEL, measure it against MODEL on held-out samples, and write OUTPUT only if it passes."""
    from ortpilot.api import quantize_gated
    from ortpilot.graph.shapes import parse_shape_args

    weight_only = mode in WEIGHT_ONLY_MODES
    data, tokenizer = _parse(model, output, mode, calibration, max_error, auto_exclude, fuse, max_positions)
    model = resolve_model_arg(model)
    if isolate:
        preflight_isolated([model])
    int8 = (
        {}
        if weight_only
        else _int8_options(per_channel, reduce_range, weight_type, activation_type, method, op_types, no_preprocess)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synthetic-data warning is already logged loudly
        report = quantize_gated(
            model,
            output,
            mode,
            calibration=data if data is not None else calibration,
            max_error=max_error,
            shapes=parse_shape_args(list(shapes)),
            auto_exclude=auto_exclude,
            max_rounds=max_rounds,
            nodes_to_exclude=list(exclude),
            block_size=block_size,
            symmetric=not asymmetric,
            accuracy_level=accuracy_level,
            fuse=fuse,
            max_positions=max_positions,
            min_top1=min_top1,
            tokenizer=tokenizer,
            metric=list(metric) or None,
            outputs=list(outputs) or None,
            **int8,
        )
    _render(report, output, weight_only, as_json)


def _parse(
    model: str,
    output: str,
    mode: str,
    calibration: str | None,
    max_error: float | None,
    auto_exclude: bool,
    fuse: bool,
    max_positions: int | None,
) -> tuple[Any, str | None]:
    """The flags checked against each other and the output path, before any work (calibration and
    quantization take minutes on big models): the real data they give, and the prompts' tokenizer."""
    from ortpilot.artifacts.atomic import check_output_path

    weight_only = mode in WEIGHT_ONLY_MODES
    if max_positions is not None and not (weight_only and fuse):
        raise click.UsageError(
            "--max-positions sets the rotary tables that --fuse stores; it needs --mode int4|int8-weights with --fuse."
        )
    if auto_exclude and max_error is None and mode != FULL and not weight_only:
        raise click.UsageError("--auto-exclude needs --max-error (the gate it works towards).")
    check_output_path(output)
    data = real_data_arg(model, lone_tokenizer=weight_only)
    if data is not None and weight_only:
        raise click.UsageError(
            "--calibration-text/--calibration-images calibrate and gate the INT8 modes; int4/int8-weights "
            "gate on generation, with prompts from --tokenizer."
        )
    if data is not None and calibration is not None:
        raise click.UsageError("Give --calibration or --calibration-text/--calibration-images, not both.")
    return data, data_flags().get("tokenizer") if weight_only else None


def _int8_options(
    per_channel: bool,
    reduce_range: bool,
    weight_type: str,
    activation_type: str,
    method: str,
    op_types: str | None,
    no_preprocess: bool,
) -> dict[str, Any]:
    """The ``QuantizePass`` settings of the INT8 modes."""
    return dict(
        per_channel=per_channel,
        reduce_range=reduce_range,
        weight_type=weight_type,
        activation_type=activation_type,
        method=method,
        op_types=[t.strip() for t in op_types.split(",") if t.strip()] if op_types else None,
        preprocess=not no_preprocess,
    )


def _render(report: Any, output: str, weight_only: bool, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_dict())
    elif weight_only:
        _render_weight_only(report.to_dict(), output)
    else:
        _render_int8(report)


def _render_int8(report) -> None:
    render_record(report.record)
    render_comparison(report.gate.comparison)
    calibrated = report.calibration_data or {}
    if calibrated.get("samples") and calibrated.get("source") != "synthetic":
        stderr.print(
            escape(
                f"{calibrated['source']} from {calibrated['path']}: {calibrated['samples']} of "
                f"{calibrated.get('total', calibrated['samples'])} samples calibrate, "
                f"{report.gate_data.get('samples')} held out for the gate (never calibrated on)"
            ),
            highlight=False,
        )
    if report.history:
        table = Table(title="auto-exclude")
        for col in ("round", "layers in float", "error", "passed"):
            table.add_column(col)
        for row in report.history:
            table.add_row(str(row["round"]), str(len(row["excluded"])), str(row["error"]), str(row["passed"]))
        stdout.print(table)
    if report.synthetic:
        stderr.print(
            "[bold yellow]warning:[/] accuracy was measured on synthetic inputs; pass --calibration-text, "
            "--calibration-images or --calibration with real samples."
        )
    from ortpilot.data import gate_phrase

    gated = gate_phrase(report.gate_data)
    stdout.print(
        f"[bold green]wrote[/] {escape(f'{report.output}  ({report.gate.describe()}; {gated})')}", highlight=False
    )


def _render_weight_only(report: dict[str, Any], output: str) -> None:
    """Weight-only MatMulNBits quantization of a decoder, gated on next-token agreement."""
    weights, gate = report["weights"], report["gate"]
    for note in report["fusion_notes"]:
        stderr.print(f"[dim]decoder fusion: {escape(note)}[/]", highlight=False)
    stdout.print(
        f"[bold green]wrote[/] {escape(output)}: {weights['weight_only_nodes']} weight-only nodes, weights "
        f"{weights['weight_bytes_before'] / 1e6:.1f} -> {weights['weight_bytes_after'] / 1e6:.1f} MB "
        f"({weights['compression']}x); top-1 agreement {gate['top1_agreement']:.3f}, "
        f"KL {gate['kl_mean']:.4f}",
        highlight=False,
    )
