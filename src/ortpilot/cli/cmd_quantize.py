"""``ortpilot quantize``: INT8 quantization, gated by accuracy on held-out samples."""

from __future__ import annotations

import warnings
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.cmd_compare import render_comparison
from ortpilot.cli.cmd_optimize import render_record
from ortpilot.cli.common import (
    ISOLATE_OPTION,
    JSON_OPTION,
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
from ortpilot.cli.flags import AUTO_EXCLUDE_FLAGS, choice_option, fusion_flags, gate_flags, min_top1_option
from ortpilot.cli.groups import arg_group
from ortpilot.gate.options import GateOptions
from ortpilot.passes.options import (
    ACTIVATION_RANGES,
    DEFAULT_ACTIVATION_TYPE,
    DEFAULT_METHOD,
    DEFAULT_WEIGHT_TYPE,
    METHODS,
    QUANT_TYPES,
    QUANTIZE_MODES,
    DecoderFusionOptions,
    QuantizeModeOptions,
    WeightOnlyOptions,
    quantize_options,
)
from ortpilot.quantmodes import FULL, WEIGHT_ONLY_MODES

_WEIGHT_ONLY = "/".join(WEIGHT_ONLY_MODES)  # names the modes in the help of the options only they read


def build_options(
    mode: str,
    per_channel: bool,
    reduce_range: bool,
    weight_type: str,
    activation_type: str,
    method: str,
    exclude: tuple[str, ...],
    op_types: str | None,
    no_preprocess: bool,
    block_size: int,
    asymmetric: bool,
    accuracy_level: int,
    smooth_quant: float | None,
    activation_ranges: str,
) -> QuantizeModeOptions:
    """The mode's options record from its flags (``passes.options.quantize_options``); the flags of the other
    family are left out (weight-only flags with an INT8 mode and the reverse do nothing, as their help says)."""
    if mode in WEIGHT_ONLY_MODES:
        settings: dict[str, Any] = dict(block_size=block_size, symmetric=not asymmetric, accuracy_level=accuracy_level)
    else:
        settings = dict(
            per_channel=per_channel,
            reduce_range=reduce_range,
            weight_type=weight_type,
            activation_type=activation_type,
            method=method,
            op_types=[t.strip() for t in op_types.split(",") if t.strip()] if op_types else None,
            preprocess=not no_preprocess,
            smooth_quant=smooth_quant,
            activation_ranges=activation_ranges,
        )
    return quantize_options(mode, nodes_to_exclude=exclude, **settings)


def build_fusion(mode: str, fuse: bool, max_positions: int | None) -> DecoderFusionOptions | None:
    """``--fuse`` as the decoder fusion the weight-only modes run first (None without it, or for an INT8 mode)."""
    weight_only = mode in WEIGHT_ONLY_MODES
    if max_positions is not None and not (weight_only and fuse):
        raise click.UsageError(
            "--max-positions sets the rotary tables that --fuse stores; it needs --mode int4|int8-weights with --fuse."
        )
    return DecoderFusionOptions(max_positions=max_positions) if weight_only and fuse else None


def build_gate(
    model: str,
    mode: str,
    calibration: str | None,
    max_error: float | None,
    metric: tuple[str, ...],
    outputs: tuple[str, ...],
    auto_exclude: bool,
    max_rounds: int,
    min_top1: float,
) -> GateOptions:
    """The gate flags as a ``GateOptions``, checked against each other before any work (calibration and
    quantization take minutes on big models): the real data they give, and the prompts' tokenizer."""
    weight_only = mode in WEIGHT_ONLY_MODES
    if auto_exclude and max_error is None and mode != FULL and not weight_only:
        raise click.UsageError("--auto-exclude needs --max-error (the gate it works towards).")
    data = real_data_arg(model, lone_tokenizer=weight_only)
    if data is not None and weight_only:
        raise click.UsageError(
            "--calibration-text/--calibration-images calibrate and gate the INT8 modes; int4/int8-weights "
            "gate on generation, with prompts from --tokenizer."
        )
    if data is not None and calibration is not None:
        raise click.UsageError("Give --calibration or --calibration-text/--calibration-images, not both.")
    return GateOptions(
        max_error=max_error,
        metric=metric,
        outputs=outputs,
        calibration=data if data is not None else calibration,
        auto_exclude=auto_exclude,
        max_rounds=max_rounds,
        min_top1=min_top1,
        tokenizer=data_flags().get("tokenizer") if weight_only else None,
    )


QUANTIZE_OPTIONS = arg_group(
    "options",
    build_options,
    click.option("--per-channel", is_flag=True, help="One scale per output channel of each weight."),
    click.option("--reduce-range", is_flag=True, help="7-bit weights (for CPUs without VNNI)."),
    choice_option("--weight-type", QUANT_TYPES, DEFAULT_WEIGHT_TYPE),
    choice_option("--activation-type", QUANT_TYPES, DEFAULT_ACTIVATION_TYPE, "Activation type for static/qdq/full."),
    choice_option("--method", METHODS, DEFAULT_METHOD, "Calibration method."),
    click.option("--exclude", "exclude", multiple=True, help="Node name to leave in float (repeatable)."),
    click.option("--op-types", default=None, help="Comma-separated op types to quantize (default: per mode)."),
    click.option("--no-preprocess", is_flag=True, help="Skip quant_pre_process."),
    click.option(
        "--block-size",
        type=click.IntRange(16),
        default=WeightOnlyOptions.block_size,
        show_default=True,
        help=f"{_WEIGHT_ONLY}: weights per quantization block (a power of 2).",
    ),
    click.option("--asymmetric", is_flag=True, help=f"{_WEIGHT_ONLY}: zero points per block."),
    click.option(
        "--accuracy-level",
        type=click.IntRange(0, 4),
        default=WeightOnlyOptions.accuracy_level,
        show_default=True,
        help=f"{_WEIGHT_ONLY}: MatMulNBits compute type on CPU (4 = int8, fast with VNNI).",
    ),
    click.option(
        "--smooth-quant",
        type=click.FloatRange(0, 1),
        default=None,
        help="openvino: SmoothQuant's alpha for a transformer's MatMuls (NNCF's own: 0.95; tune also tries 0.8).",
    ),
    choice_option(
        "--activation-ranges",
        ACTIVATION_RANGES,
        "nncf",
        "openvino: activation ranges by NNCF's estimator, or the calibration's min and max.",
    ),
    uses=("mode",),
)
DECODER_FUSION = arg_group(
    "fusion",
    build_fusion,
    fusion_flags(f"{_WEIGHT_ONLY}: fuse attention into GroupQueryAttention first."),
    uses=("mode",),
)
QUANTIZE_GATE = arg_group(
    "gate",
    build_gate,
    click.option(
        "--calibration",
        default=None,
        help="Folder of .npy/.npz samples, one .npz with stacked samples, or FILE.py:FACTORY returning a "
        "CalibrationDataReader. Without it (or --calibration-text/--calibration-images), synthetic inputs "
        "(with a warning).",
    ),
    REAL_DATA_OPTIONS,
    gate_flags(
        "Refuse to write the model if its error on held-out samples exceeds this (each output by its metric: "
        "see --metric).",
        applies="INT8 modes.",
    ),
    AUTO_EXCLUDE_FLAGS,
    min_top1_option(f"{_WEIGHT_ONLY}: least top-1 next-token agreement with the float model."),
    uses=("model", "mode"),
)


@click.command("quantize")
@MODEL_FILE_OPTION
@click.argument("model")
@click.option("-o", "--output", required=True, help="Where to write the quantized model (.onnx).")
@click.option(
    "--mode",
    type=click.Choice(QUANTIZE_MODES),
    required=True,
    help="dynamic: INT8 weights, activations at run time; static: QOperator, calibrated; qdq: Q/DQ pairs "
    "around weighted ops, calibrated; full: QDQ on every supported op (always gated); openvino: NNCF's QDQ "
    "model for the OpenVINO EP (calibrated; needs the openvino-plugin extra or nncf); "
    f"{' / '.join(WEIGHT_ONLY_MODES)}: weight-only MatMulNBits for decoders, gated on generation.",
)
@SHAPE_OPTION
@ISOLATE_OPTION
@JSON_OPTION
@handle_errors
@QUANTIZE_OPTIONS
@DECODER_FUSION
@QUANTIZE_GATE
def command(
    model: str,
    output: str,
    mode: str,
    options: QuantizeModeOptions,
    fusion: DecoderFusionOptions | None,
    gate: GateOptions,
    shapes: tuple[str, ...],
    isolate: bool,
    as_json: bool,
) -> None:
    """Quantize MODEL, measure it against MODEL on held-out samples, and write OUTPUT only if it passes."""
    from ortpilot.api import quantize_gated
    from ortpilot.artifacts.atomic import check_output_path
    from ortpilot.graph.shapes import parse_shape_args

    check_output_path(output)  # before calibration and quantization, which take minutes on big models
    model = resolve_model_arg(model)
    if isolate:
        preflight_isolated([model])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synthetic-data warning is already logged loudly
        report = quantize_gated(model, output, options, gate, shapes=parse_shape_args(list(shapes)), fusion=fusion)
    _render(report, output, mode in WEIGHT_ONLY_MODES, as_json)


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
