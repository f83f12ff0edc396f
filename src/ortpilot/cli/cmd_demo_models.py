"""``ortpilot demo-models OUTDIR``: write the built-in demo models (generated in code, no downloads)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ortpilot.cli.common import JSON_OPTION, emit_json, handle_errors, stdout

TEXT_DESCRIPTIONS = {
    "text-embed": "sentence encoder folder: WordPiece tokenizer.json, mean pooling, Normalize, max_seq_length 128",
    "text-rerank": "cross-encoder folder: (query, document) pairs -> one logit (BertForSequenceClassification)",
    "text-classify": "sequence classifier folder: id2label negative/neutral/positive",
}


@click.command("demo-models")
@click.argument("outdir", type=click.Path(file_okay=False))
@JSON_OPTION
@handle_errors
def command(outdir: str, as_json: bool) -> None:
    """Write the demo MLP, CNN, encoder and decoder models (and the decoder's tokenizer) into OUTDIR, and
    three text-model folders (a sentence encoder, a cross-encoder, a classifier) as OUTDIR/text-KIND/."""
    import importlib.util

    from ortpilot.artifacts.atomic import check_output_path
    from ortpilot.errors import UsageError
    from ortpilot.models import (
        DEMO_MODELS,
        DEMO_SPECS,
        TEXT_KINDS,
        write_demo_models,
        write_demo_text_folders,
        write_demo_tokenizer,
    )

    if not outdir.strip():  # Path('') is the current folder: an empty argument is a mistake, not a choice
        raise UsageError("demo-models needs a folder path, got an empty one (give OUTDIR, e.g. demo).")
    for name in DEMO_MODELS:  # OUTDIR below a file, or not writable: exit 2 before anything is written
        check_output_path(Path(outdir) / f"{name}.onnx", "Demo model")
    for kind in TEXT_KINDS:
        check_output_path(Path(outdir) / f"text-{kind}" / "model.onnx", "Demo text folder")
    paths = write_demo_models(outdir)
    # The tokenizers need the optional 'tokenizers' package; without it the models still come.
    has_tokenizers = importlib.util.find_spec("tokenizers") is not None
    tokenizer = write_demo_tokenizer(outdir) if has_tokenizers else None
    folders = write_demo_text_folders(outdir) if has_tokenizers else {}
    if as_json:
        doc = {
            name: {"path": str(path), "description": DEMO_SPECS[name].description, "dims": DEMO_SPECS[name].dims}
            for name, path in paths.items()
        }
        doc["decoder"]["tokenizer"] = str(tokenizer) if tokenizer else None
        for name, folder in folders.items():
            doc[name] = {"path": str(folder), "description": TEXT_DESCRIPTIONS[name], "kind": name.split("-", 1)[1]}
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
        stdout.print(
            "[dim]no tokenizer.json for the decoder and no text folders: pip install tokenizers[/]", highlight=False
        )
    for name, folder in folders.items():
        stdout.print(
            f"[bold]{name:8}[/] {escape(str(folder))}/  [dim]{escape(TEXT_DESCRIPTIONS[name])}[/]", highlight=False
        )
