"""``ortpilot inspect MODEL``: interface, opsets, ops, parameters, FLOPs and provider gaps."""

from __future__ import annotations

import os

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import (
    ISOLATE_OPTION,
    MODEL_FILE_OPTION,
    PROVIDER_HELP,
    SHAPE_OPTION,
    emit_json,
    handle_errors,
    json_option,
    resolve_model_arg,
    stderr,
    stdout,
)


@click.command("inspect")
@MODEL_FILE_OPTION
@click.argument("model")
@SHAPE_OPTION
@click.option(
    "-p",
    "--provider",
    "providers",
    multiple=True,
    help="Check op support on these providers only (default: every available one). " + PROVIDER_HELP,
)
@click.option(
    "--no-check",
    is_flag=True,
    help="Skip the provider op-support check (no sessions are built). The graph itself is always validated.",
)
@ISOLATE_OPTION
@json_option(help="Print one JSON document.")
@handle_errors
def command(
    model: str, shapes: tuple[str, ...], providers: tuple[str, ...], no_check: bool, isolate: bool, as_json: bool
) -> None:
    """Describe MODEL: inputs/outputs, opsets, op histogram, parameters, FLOPs, provider gaps.

    Exits 2 when the graph is invalid (dangling edge, cycle, malformed Einsum, onnx checker error).
    """
    from ortpilot.api import inspect_model

    ctx = click.get_current_context()
    target = model if os.path.isdir(model) else resolve_model_arg(model)  # a folder: described as one
    doc = inspect_model(target, shapes, providers, not no_check, isolate, ctx.meta.get("ortpilot.model_file"))
    for text in doc["graph_check"]["warnings"]:
        stderr.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)
    if as_json:
        emit_json(doc)
    else:
        render(doc)


def _dims(dims: list) -> str:
    return escape("[" + ", ".join("?" if d is None else str(d) for d in dims) + "]")


def _human(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def flops_text(flops: dict, node_count: int) -> str:
    """The FLOPs row: the total where every node was counted; otherwise a lower bound that names the nodes left
    out, since they can hold all of the compute (an INT8 model whose shapes inference could not follow)."""
    if flops["total"] is None:
        return f"unknown: {flops['error']}"
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in flops["shapes"].items())
    uncounted = flops.get("uncounted") or {}
    if not uncounted:
        return f"{_human(flops['total'])} at {shapes} ({flops['counted_nodes']}/{node_count} nodes counted)"
    missing = sum(uncounted.values())
    ops = ", ".join(f"{op} ({n})" if n > 1 else op for op, n in list(uncounted.items())[:6])
    more = f", and {len(uncounted) - 6} more op types" if len(uncounted) > 6 else ""
    why = "an op ortpilot has no count for, or shapes it could not infer"
    if not flops["total"]:
        rest = "; the rest move data and count 0" if flops["counted_nodes"] else ""
        return f"unknown at {shapes}: {missing} of {node_count} nodes ({ops}{more}) not counted ({why}){rest}"
    return (
        f"at least {_human(flops['total'])} at {shapes}; {missing} of {node_count} nodes ({ops}{more}) not "
        f"counted ({why}): their compute is not in this figure"
    )


def render(doc: dict) -> None:
    head = Table(title=escape(f"Model {doc['path']}"), show_header=False, title_justify="left")
    head.add_row("IR version", str(doc["ir_version"]))
    head.add_row("opsets", escape(", ".join(f"{d} {v}" for d, v in doc["opsets"].items())))
    head.add_row("producer", escape(f"{doc['producer']['name']} {doc['producer']['version']}".strip()) or "-")
    head.add_row(
        "nodes",
        f"{doc['node_count']}"
        + (f" (+{doc['subgraph_node_count']} in subgraphs)" if doc["subgraph_node_count"] else ""),
    )
    params = doc["parameters"]
    head.add_row(
        "parameters", f"{_human(params['count'])} ({params['bytes'] / 2**20:.2f} MiB in {params['tensors']} tensors)"
    )
    flops = doc["flops"]
    head.add_row("FLOPs (estimate)", escape(flops_text(flops, doc["node_count"])))
    for ext in doc["external_data"]:
        state = "present" if ext["present"] else "[red]MISSING[/]"
        head.add_row("external data", f"{escape(ext['location'])} ({ext['tensors']} tensors, {state})")
    folder = doc.get("folder")
    if folder:
        head.add_row("folder", escape(f"{folder['root']} ({folder['layout']} layout, task {folder['task'] or '-'})"))
        for key, item in folder["values"].items():
            head.add_row(f"  {escape(key)}", escape(f"{item['value']}  ({item['source']})"))
    stdout.print(head)

    io = Table(title="Inputs and outputs", title_justify="left")
    for col in ("kind", "name", "dtype", "dims"):
        io.add_column(col)
    for kind in ("inputs", "outputs"):
        for t in doc[kind]:
            io.add_row(kind[:-1], escape(t["name"]), t["dtype"], _dims(t["dims"]))
    stdout.print(io)

    ops = Table(title="Op histogram", title_justify="left")
    for col in ("op", "nodes", "est. FLOPs"):
        ops.add_column(col)
    uncounted = flops.get("uncounted") or {}
    for op, count in doc["op_histogram"].items():
        op_type = op.rsplit(".", 1)[-1]
        value = flops["by_op_type"].get(op_type)
        missing = uncounted.get(op_type, 0)
        if missing and value is None:
            cell = "not counted"
        elif missing:
            cell = f"at least {_human(value)}"
        else:
            cell = _human(value) if value else "-"
        ops.add_row(escape(op), str(count), cell)
    stdout.print(ops)

    if doc["unsupported_ops"]:
        gaps = Table(title="Ops the providers will not run", title_justify="left")
        for col in ("provider", "unsupported ops", "source / note"):
            gaps.add_column(col, overflow="fold")
        for entry in doc["unsupported_ops"]:
            listed = escape(", ".join(f"{o['op']} ({o['nodes']})" for o in entry["unsupported"]))
            text = listed or ("none" if entry["checked"] else "[dim]not checked[/]")
            gaps.add_row(
                escape(entry["provider"]), text, escape("; ".join(filter(None, [entry["source"], entry["note"]])))
            )
        stdout.print(gaps)
