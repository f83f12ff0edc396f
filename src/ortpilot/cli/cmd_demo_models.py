"""``ortpilot demo-models OUTDIR``: write the built-in demo models (generated in code, no downloads)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ortpilot.cli.common import JSON_OPTION, emit_json, handle_errors, stdout


@click.command("demo-models")
@click.argument("outdir", type=click.Path(file_okay=False))
@JSON_OPTION
@handle_errors
def command(outdir: str, as_json: bool) -> None:
    """Write the demo MLP, CNN, encoder and decoder models (and the decoder's tokenizer) into OUTDIR."""
    import importlib.util

    from ortpilot.artifacts.atomic import check_output_path
    from ortpilot.models import DEMO_MODELS, DEMO_SPECS, write_demo_models, write_demo_tokenizer

    for name in DEMO_MODELS:  # OUTDIR below a file, or not writable: exit 2 before anything is written
        check_output_path(Path(outdir) / f"{name}.onnx", "Demo model")
    paths = write_demo_models(outdir)
    # The byte-level tokenizer needs the optional 'tokenizers' package; without it the models still come.
    tokenizer = write_demo_tokenizer(outdir) if importlib.util.find_spec("tokenizers") else None
    if as_json:
        doc = {
            name: {"path": str(path), "description": DEMO_SPECS[name].description, "dims": DEMO_SPECS[name].dims}
            for name, path in paths.items()
        }
        doc["decoder"]["tokenizer"] = str(tokenizer) if tokenizer else None
        emit_json(doc)
        return
    for name, path in paths.items():
        stdout.print(
            f"[bold]{name:8}[/] {escape(str(path))}  [dim]{escape(DEMO_SPECS[name].description)}[/]", highlight=False
        )
    if tokenizer:
        stdout.print(
            f"[bold]{'tokenizer':8}[/] {escape(str(tokenizer))}  [dim]the decoder's byte-level tokenizer "
            "(token id = byte value; ChatML chat template in tokenizer_config.json)[/]",
            highlight=False,
        )
    else:
        stdout.print("[dim]no tokenizer.json for the decoder: pip install tokenizers[/]", highlight=False)
