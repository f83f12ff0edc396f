"""``ortpilot verify``: re-verify tune profiles on this machine (environment, machine, reference outputs)."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import emit_json, handle_errors, json_option, stdout


@click.command("verify")
@click.argument("profiles", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option(
    "--accept-machine",
    is_flag=True,
    help="Load profiles tuned on a machine whose differences can change the winner (INT8 kernels, CPUs).",
)
@click.option(
    "--class",
    "machine_class",
    default=None,
    help="For a bundle: verify this class's profile (its name or id) instead of this machine's class.",
)
@click.option(
    "--max-slowdown",
    default=None,
    help="Also time the profile against ORT's default session, interleaved: exit 1 when its speedup is "
    "below the profile's headline by more than PCT percent beyond the noise.",
)
@click.option(
    "--bench",
    is_flag=True,
    help="Also time the profile against ORT's default session here, interleaved in this fresh process, and "
    "print that speedup (the ratio of the two p50s) beside the profile's headline: reproduced at 0.9 of it or "
    "more, never with a CI entirely below 1 (a figure, not a gate: --max-slowdown gates).",
)
@click.option(
    "--duration",
    type=float,
    default=8.0,
    show_default=True,
    help="Seconds of interleaved timing per profile (with --bench or --max-slowdown).",
)
@json_option(help="Print one JSON document.")
@handle_errors
def command(
    profiles: tuple[str, ...],
    accept_machine: bool,
    machine_class: str | None,
    max_slowdown: str | None,
    bench: bool,
    duration: float,
    as_json: bool,
) -> None:
    """Check each PROFILE (profile.json or its folder, or a bundle) here: model hash, ORT build, providers
    and placement (strict), the machine it was tuned on, and its reference outputs (bit for bit on the
    same kernels, within the tune's gate elsewhere). A bundle gives the profile of this machine's class
    (every class's files are checked against bundle.json). Exit 0 all hold, 1 a verification failed, 2 bad
    input."""
    from ortpilot.artifacts.bundle import bundle_path
    from ortpilot.errors import UsageError
    from ortpilot.measure.regression import check_max_slowdown
    from ortpilot.tuning.verify import verify_profile

    pct = check_max_slowdown(max_slowdown) if max_slowdown is not None else None
    bundles = [bundle_path(p) is not None for p in profiles]
    if machine_class is not None and not any(bundles):
        raise UsageError(
            f"--class {machine_class} picks one class's profile in a bundle (what 'ortpilot tune --ray' writes), "
            "and none of the PROFILES given is a bundle: a single profile has one class. Leave --class out."
        )
    results = [
        verify_profile(
            path,
            accept_machine=accept_machine,
            max_slowdown_pct=pct,
            bench=bench,
            duration_s=duration,
            machine_class=machine_class if bundle else None,  # beside bundles, a single profile is its own class
            check_all=True,
        )
        for path, bundle in zip(profiles, bundles)
    ]
    if as_json:
        emit_json({"profiles": [r.to_dict() for r in results], "passed": all(r.passed for r in results)})
    else:
        for result in results:
            render(result)
    failure = next((r.failure() for r in results if not r.passed), None)
    if failure is not None:
        raise failure


def render(result) -> None:
    doc = result.to_dict()
    table = Table(title=f"verify {escape(doc['profile'])}", title_justify="left")
    for col in ("check", "result", "detail"):
        table.add_column(col)
    bundle = doc.get("bundle")
    if bundle:
        table.add_row(
            "bundle",
            "[green]" + escape(bundle["how"]) + "[/]" if bundle["how"] != "nearest" else "[yellow]nearest class[/]",
            escape(
                f"class {bundle['class']['name']} of {', '.join(bundle['classes'])}; every file matches bundle.json"
                + (f"; {bundle['note']}" if bundle["note"] else "")
                + ("" if bundle["complete"] else "; the bundle is incomplete")
            ),
        )
    table.add_row(
        "environment", "[green]ok[/]", escape(f"model hash, ORT build, providers {', '.join(doc['providers'])}")
    )
    machine = doc["machine"] or {}
    notes = "; ".join(f"{d['field']}: {d['why']}" for d in machine.get("differences", []))
    table.add_row(
        "machine",
        "[green]same kernels[/]" if machine.get("same_kernels") else "[yellow]differs[/]",
        escape(f"tuned on {machine.get('recorded')}; here {machine.get('here')}" + (f"; {notes}" if notes else "")),
    )
    if warmed := doc.get("warmed"):
        note = warmed.get("note") or ""
        if note.startswith("skipped"):
            verdict = "[yellow]skipped[/]"
        else:
            verdict = "[green]ok[/]" if warmed["shapes"] == warmed["planned"] else "[yellow]partial[/]"
        table.add_row(
            "warm-up",
            verdict,
            escape(
                f"ran the session at {warmed['shapes']} of the {warmed['planned']} shapes its profile's warm-up plan "
                f"names in {warmed['seconds']:.2f} s (its EP prepares each new input shape on the first run)"
                + (f"; {note}" if note else "")
            ),
        )
    ref = doc["reference"]
    outputs_ok = all(o["passed"] for o in ref["outputs"])
    table.add_row(
        "reference outputs",
        "[green]ok[/]"
        if outputs_ok and ref["mode"] != "not checked"
        else "[yellow]not checked[/]"
        if ref["mode"] == "not checked"
        else "[red]failed[/]",
        escape(f"{ref['mode']}: {ref['why']}"),
    )
    for out in ref["outputs"]:
        table.add_row(
            f"  {escape(out['name'])}", "[green]ok[/]" if out["passed"] else "[red]failed[/]", escape(out["detail"])
        )
    latency = doc.get("latency")
    if latency:
        if latency["max_slowdown_pct"] is not None:  # the gate
            verdict = "[green]ok[/]" if latency["passed"] else "[red]slower[/]"
        else:  # --bench alone: a figure, not a gate
            verdict = "[green]reproduced[/]" if latency["reproduced"] else "[yellow]not reproduced[/]"
        table.add_row("latency", verdict, escape(latency["detail"]))
        table.add_row("  rule", "", escape(latency["rule"]))
    stdout.print(table)
