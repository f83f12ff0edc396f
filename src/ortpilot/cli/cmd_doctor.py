"""``ortpilot doctor``: what this environment can run, proven, with a fix for each problem."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ortpilot.cli.common import emit_json, handle_errors, json_option, stdout

_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "error": "bold red"}


@click.command("doctor")
@json_option(help="Print one JSON document (fields: docs/commands/doctor.md).")
@click.option("--no-probe", is_flag=True, help="Skip building a test session per provider (faster, less proof).")
@handle_errors
def command(as_json: bool, no_probe: bool) -> None:
    """Check ORT distributions, providers, plugin EPs, CPU ISA and GPU libraries.

    Exits 1 when an error is found (clashing ORT distributions, ORT not importable, the CPU
    probe failing), else 0; warnings do not change the exit code.
    """
    from ortpilot.session.probe import run_doctor

    report = run_doctor(probe=not no_probe)
    if as_json:
        emit_json(report.to_dict())
    else:
        render(report)
    ctx = click.get_current_context()
    ctx.exit(report.exit_code)


def render(report) -> None:
    """Rich tables for humans: environment, providers, then findings with fixes."""
    doc = report.to_dict()
    stdout.print(_environment(doc))
    stdout.print(_providers(doc))
    if doc["ep_devices"]:
        stdout.print(_ep_devices(doc["ep_devices"]))
    stdout.print(_findings(doc["findings"]))


def _environment(doc: dict[str, Any]) -> Table:
    """Python, ORT and its distributions, the CPU, its budget and class, the GPU driver and libraries."""
    ort_doc = doc["onnxruntime"]
    env = Table(title="Environment", show_header=False, title_justify="left")
    env.add_row("python", escape(f"{doc['python']['version']} ({doc['python']['executable']})"))
    if ort_doc["import_error"]:
        env.add_row("onnxruntime", f"[red]import failed: {escape(ort_doc['import_error'])}[/]")
    else:
        env.add_row("onnxruntime", escape(f"{ort_doc['version']} ({ort_doc['package_name'] or '?'}) {ort_doc['path']}"))
    for dist in doc["distributions"]["distributions"]:
        won = "wins" if dist["name"] == doc["distributions"]["winner"] else "overwritten"
        env.add_row(
            "distribution",
            escape(f"{dist['name']} {dist['version']} at {dist['location']}")
            + (f" [yellow]({won})[/]" if doc["distributions"]["conflict"] else ""),
        )
    _cpu_rows(env, doc)
    gpu = doc["gpu"]
    env.add_row("nvidia driver", escape(gpu["driver_version"] or "not found"))
    libs = escape(", ".join(f"{fam} {info['majors']}" for fam, info in gpu["libraries"].items() if info["majors"]))
    env.add_row("gpu libraries", libs or "none found")
    expected = {k: v for k, v in gpu["expected_by_ort"].items() if k != "package_name"}
    if expected:
        env.add_row("ORT expects", escape(", ".join(f"{k} {v}" for k, v in expected.items())))
    return env


def _cpu_rows(env: Table, doc: dict[str, Any]) -> None:
    """The CPU's rows: model and flags, INT8 kernel rule, CPU budget, machine class."""
    cpu = doc["cpu"]
    flags = ", ".join(k for k, v in cpu["flags"].items() if v) or "flags unknown"
    env.add_row("cpu", escape(f"{cpu['model']}: {flags}"))
    if cpu.get("int8_rule"):
        env.add_row("int8 kernels", escape(f"{cpu['int8_rule']['name']}: {cpu['int8_rule']['reason']}"))
    budget = doc.get("cpu_budget")
    if budget:
        threads = budget.get("ort_default_threads")
        env.add_row(
            "cpu budget",
            escape(
                f"{budget['cpus']} ({budget['source']}; limits "
                + ", ".join(f"{k} {v:g}" for k, v in budget["limits"].items())
                + ")"
                + (f"; ORT's default starts {threads} threads" if threads else "")
            ),
        )
    machine_class = doc.get("machine_class")
    if machine_class:
        env.add_row(
            "machine class",
            escape(f"{machine_class['name']} (id {machine_class['id']}): what a fleet tune files this machine under"),
        )


def _providers(doc: dict[str, Any]) -> Table:
    """One row per probed provider (status, share of nodes placed on it), else the build's providers unprobed."""
    providers = Table(title="Providers", title_justify="left")
    for col in ("provider", "kind", "probe", "nodes on it", "reason"):
        providers.add_column(col)
    for probe in doc["probes"]:
        share = f"{probe['placement_share']:.0%}" if probe["placement_share"] is not None else "-"
        style = {"ok": "green", "failed": "red", "skipped": "dim"}[probe["status"]]
        providers.add_row(
            escape(probe["provider"]),
            escape(probe["kind"]),
            f"[{style}]{probe['status']}[/]",
            share,
            escape(probe["reason"]),
        )
    if not doc["probes"]:
        for name in doc["onnxruntime"]["available_providers"]:
            providers.add_row(name, "built-in", "[dim]not probed[/]", "-", "")
    return providers


def _ep_devices(ep_devices: list[dict[str, Any]]) -> Table:
    """ORT's ``get_ep_devices``: which EP runs on which device."""
    devices = Table(title="EP devices (get_ep_devices)", title_justify="left")
    for col in ("ep", "vendor", "device", "device vendor"):
        devices.add_column(col)
    for dev in ep_devices:
        devices.add_row(*(escape(str(dev[k])) for k in ("ep_name", "ep_vendor", "device_type", "device_vendor")))
    return devices


def _findings(items: list[dict[str, Any]]) -> Table:
    """Each finding with its severity and its fix."""
    findings = Table(title="Findings", title_justify="left")
    for col in ("severity", "topic", "finding", "fix"):
        findings.add_column(col, overflow="fold")
    for item in items:
        sev = item["severity"]
        findings.add_row(
            f"[{_STYLE[sev]}]{sev}[/]", escape(item["topic"]), escape(item["message"]), escape(item["fix"])
        )
    return findings
