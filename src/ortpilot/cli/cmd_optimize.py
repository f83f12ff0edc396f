"""``ortpilot optimize``: ORT graph optimization (offline, cached, stamped) and transformer fusion."""

from __future__ import annotations

import math
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import (
    ISOLATE_OPTION,
    JSON_OPTION,
    LEVEL_OPTION,
    MODEL_FILE_OPTION,
    emit_json,
    handle_errors,
    preflight_isolated,
    resolve_model_arg,
    stdout,
)
from ortpilot.cli.flags import OUTPUTS_HELP, PROVIDER_OPTION
from ortpilot.cli.groups import arg_group
from ortpilot.passes.options import FusionOptions

NO_FUSION = "none"


def build_fusion(fusion: str, num_heads: int, hidden_size: int) -> FusionOptions | None:
    """``--fusion`` (and the attention's sizes) as the transformer fusion to run (None: ``none``)."""
    return None if fusion == NO_FUSION else FusionOptions(fusion, num_heads=num_heads, hidden_size=hidden_size)


FUSION = arg_group(
    "fusion",
    build_fusion,
    click.option(
        "--fusion",
        default=NO_FUSION,
        show_default=True,
        help="Transformer fusion: auto (detect the model type), none, or an onnxruntime.transformers model "
        "type (bert, gpt2, vit, ...).",
    ),
    click.option(
        "--num-heads", type=int, default=FusionOptions.num_heads, help="Attention heads for fusion (0: detect)."
    ),
    click.option(
        "--hidden-size", type=int, default=FusionOptions.hidden_size, help="Hidden size for fusion (0: detect)."
    ),
)


@click.command("optimize")
@MODEL_FILE_OPTION
@click.argument("model")
@click.option("-o", "--output", required=True, help="Where to write the optimized model (.onnx).")
@LEVEL_OPTION
@PROVIDER_OPTION
@click.option("--free-dim", "free_dims", multiple=True, help="Fix a symbolic dim while optimizing: NAME=VALUE.")
@click.option("--no-cache", is_flag=True, help="Build without the content-addressed cache.")
@click.option("--outputs", "outputs", multiple=True, metavar="NAME", help=OUTPUTS_HELP)
@ISOLATE_OPTION
@JSON_OPTION
@handle_errors
@FUSION
def command(
    model: str,
    output: str,
    level: str,
    providers: tuple[str, ...],
    fusion: FusionOptions | None,
    free_dims: tuple[str, ...],
    no_cache: bool,
    outputs: tuple[str, ...],
    isolate: bool,
    as_json: bool,
) -> None:
    """Optimize MODEL with ORT at --level for the first --provider, stamp it, write it to OUTPUT.

    With --fusion, ORT's transformer fusions run instead of (after a basic-level pass of) the
    level optimization, and the fused operator counts are reported.
    """
    from ortpilot.artifacts.atomic import check_output_path
    from ortpilot.cli.common import parse_kv_list
    from ortpilot.errors import UsageError
    from ortpilot.passes.optimize import OptimizePass
    from ortpilot.session import SessionSettings

    check_output_path(output)  # before the build fills the cache
    try:
        free = {k: int(v) for k, v in parse_kv_list(free_dims).items()}
    except ValueError:
        raise UsageError(f"--free-dim takes NAME=INTEGER, got {' '.join(free_dims)}.") from None
    settings = SessionSettings(level=level, free_dimension_overrides=free)  # each fixed at 1 or more: before any work
    chain = list(providers) or None
    path = resolve_model_arg(model)
    if free:  # a name the model lacks would be ignored by ORT, silently
        from ortpilot.graph.shapes import check_shape_names, graph_inputs
        from ortpilot.modelio import load_model

        check_shape_names(graph_inputs(load_model(path, load_external_data=False)), free, "--free-dim")
    source: Any = path
    if outputs:  # pruned before optimizing, so fusion sees only what the named outputs need
        from ortpilot.graph.prune import prune_to_outputs
        from ortpilot.modelio import load_model

        source = prune_to_outputs(load_model(path), list(outputs))  # a name it lacks: exit 2, nothing written
    if isolate:
        preflight_isolated([path], chain, settings)
    if fusion is not None:
        from ortpilot.passes.fusion import FusionPass

        step = FusionPass(fusion, providers=chain)
    else:
        step = OptimizePass(level, chain, free_dimension_overrides=free, use_cache=not no_cache)
    result = step.run(source)
    if fusion is not None and not result.record.fused:  # before anything is written (zero counts are dropped)
        raise UsageError(
            f"--fusion {fusion.model_type} fused nothing in {path}: "
            + "; ".join(n for n in result.record.notes if n.startswith(("model type", "no fusion")))
            + ". Nothing was written. Use --fusion auto to detect the model type, or leave --fusion out for "
            "ORT's graph optimizations alone."
        )
    result.save(output)
    doc = {"output": output, "record": result.record.to_dict(), "outputs": list(outputs) or None}
    if as_json:
        emit_json(doc)
        return
    render_record(result.record)
    stdout.print(f"[bold green]wrote[/] {escape(str(output))}", highlight=False)


def _num(value: Any, fmt: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    return format(value, fmt)


def render_record(record: Any) -> None:
    """One pass record: node counts, size, op changes, fusions, notes."""
    r = record.to_dict() if hasattr(record, "to_dict") else record
    stdout.print(f"[bold]{escape(r['name'])}[/] {escape(str(r['options']))}  ({r['seconds']:.2f} s)", highlight=False)
    stdout.print(
        f"nodes {r['nodes_before']} -> {r['nodes_after']}   size {r['size_before'] / 1e6:.2f} MB -> "
        f"{r['size_after'] / 1e6:.2f} MB   quantized nodes {r['quantized_nodes']}"
    )
    if r["fused"]:
        table = Table(title="Fused operators")
        table.add_column("op")
        table.add_column("count", justify="right")
        for op, count in r["fused"].items():
            table.add_row(escape(op), str(count))
        stdout.print(table)
    if r["op_diff"]:
        stdout.print(
            "op changes: " + escape(", ".join(f"{op} {d:+d}" for op, d in r["op_diff"].items())), highlight=False
        )
    for note in r["notes"]:
        stdout.print(f"[dim]- {escape(note)}[/]", highlight=False)
