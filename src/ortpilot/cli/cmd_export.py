"""``ortpilot export``: a verified profile in the formats other servers load (Triton, KServe)."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import JSON_OPTION, emit_json, handle_errors, stderr, stdout


@click.group("export")
def command() -> None:
    """Export a tuned profile for another server."""


@command.command("triton")
@click.argument("profile")
@click.option("-o", "--output", "repo", required=True, help="The Triton model repository to write NAME/ into.")
@click.option("--name", default=None, help="The model's name and folder (default: the profile's folder name).")
@click.option(
    "--max-batch",
    type=int,
    default=None,
    help="max_batch_size (default 4 when the model has a batch dim, else 0; 0 keeps the batch dim in dims).",
)
@click.option("--instances", type=int, default=1, show_default=True, help="instance_group count.")
@click.option(
    "--kind",
    type=click.Choice(["CPU", "GPU"], case_sensitive=False),
    default=None,
    help="Instance kind (default: from the profile's first provider).",
)
@click.option("--force", is_flag=True, help="Replace an existing REPO/NAME (built beside it, then swapped in whole).")
@click.option(
    "--emit-inferenceservice",
    "inferenceservice",
    default=None,
    help="Also write a KServe InferenceService manifest (YAML) for the repository to this file.",
)
@click.option("--storage-uri", default=None, help="storageUri for the manifest (default: a placeholder to edit).")
@click.option(
    "--class",
    "machine_class",
    default=None,
    help="PROFILE is a bundle: export this machine class's profile (name or id) as REPO/NAME. Without it, "
    "every class becomes its own model, REPO/NAME-CLASS.",
)
@JSON_OPTION
@handle_errors
def triton(
    profile: str,
    repo: str,
    name: str | None,
    max_batch: int | None,
    instances: int,
    kind: str | None,
    force: bool,
    inferenceservice: str | None,
    storage_uri: str | None,
    machine_class: str | None,
    as_json: bool,
) -> None:
    """Write PROFILE's model as REPO/NAME for Triton's ONNX Runtime backend, saying what is lost.

    The config.pbtxt is parsed back with Triton's protobuf classes and its parameters are checked
    against the backend's; REPO/NAME/ORTPILOT.md lists what the profile verified that Triton
    will not check.
    """
    from ortpilot.artifacts.bundle import bundle_path
    from ortpilot.errors import UsageError
    from ortpilot.export import export_triton, export_triton_bundle

    if not repo.strip():  # Path('') is the current folder: an empty -o is a mistake, not a choice
        raise UsageError("-o/--output needs the Triton model repository's folder, got an empty path.")

    options = {
        "max_batch": max_batch,
        "instances": instances,
        "kind": kind,
        "force": force,
        "inferenceservice": inferenceservice,
        "storage_uri": storage_uri,
    }
    if bundle_path(profile) is not None and machine_class is None:
        results = export_triton_bundle(profile, repo, name=name, **options)
        if as_json:
            emit_json({"models": [r.to_dict() for r in results]})
            return
        for result in results:
            render(result)
        return
    result = export_triton(profile, repo, name=name, machine_class=machine_class, **options)
    if as_json:
        emit_json(result.to_dict())
        return
    render(result)


def render(result) -> None:
    """What one export wrote, and what Triton will not check."""
    console = stdout
    console.print(
        f"Wrote [bold]{result.model_dir}[/] ({result.kind}, {' > '.join(result.providers)}, "
        f"max_batch_size {result.max_batch_size}, warmup: {result.warmup['source']})",
        highlight=False,
    )
    console.print(f"max_batch_size {result.max_batch_size}: {escape(result.batching)}", highlight=False)
    console.print(
        f"warmup: {escape(result.warmup['source'])} ({escape(result.warmup.get('note', ''))})", highlight=False
    )
    if result.losses:
        table = Table(title="What Triton will not check or cannot express (also in ORTPILOT.md)", title_justify="left")
        for column in ("setting", "value", "consequence"):
            table.add_column(column, overflow="fold")
        for loss in result.losses:
            table.add_row(loss.setting, loss.value, loss.consequence)
        console.print(table)
    for key in ("config", "notes", "inferenceservice"):
        if key in result.files:
            stderr.print(f"{key}: {result.files[key]}", highlight=False)
