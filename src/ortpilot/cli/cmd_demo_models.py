"""``ortpilot demo-models OUTDIR``: write the built-in demo models (generated in code, no downloads)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ortpilot.cli.common import emit_json, handle_errors, stdout


@click.command("demo-models")
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@handle_errors
def command(outdir: str, as_json: bool) -> None:
    """Write the demo MLP, CNN, encoder and decoder models into OUTDIR."""
    from ortpilot.artifacts.atomic import check_output_path
    from ortpilot.models import DEMO_MODELS, DEMO_SPECS, write_demo_models

    for name in DEMO_MODELS:  # OUTDIR below a file, or not writable: exit 2 before anything is written
        check_output_path(Path(outdir) / f"{name}.onnx", "Demo model")
    paths = write_demo_models(outdir)
    if as_json:
        emit_json({name: {"path": str(path), "description": DEMO_SPECS[name].description,
                          "dims": DEMO_SPECS[name].dims} for name, path in paths.items()})
        return
    for name, path in paths.items():
        stdout.print(f"[bold]{name:8}[/] {escape(str(path))}  [dim]{escape(DEMO_SPECS[name].description)}[/]",
                     highlight=False)
