"""``ortpilot.cli.common``'s consoles: piped output (CI logs) is laid out wide, not cut at rich's 80 columns."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.table import Table

from ortpilot.cli.common import PIPED_WIDTH, WideWhenPiped

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def _inspect(env_columns: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if env_columns:
        env["COLUMNS"] = env_columns
    proc = subprocess.run(
        [*CLI, "inspect", "demo:encoder", "--no-check"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_piped_tables_keep_their_rows_whole():
    """The encoder's FLOPs row is about 100 characters: piped, it stays on one line (at 80 it wrapped, and
    narrower cells were cut: 'int8-dynam…')."""
    row = next(line for line in _inspect(None).splitlines() if "FLOPs (estimate)" in line)
    assert "nodes counted)" in row and len(row) > 80, row


def test_columns_still_sets_the_width():
    out = _inspect("80")
    assert max(len(line) for line in out.splitlines()) <= 80
    row = next(line for line in out.splitlines() if "FLOPs (estimate)" in line)
    assert "nodes counted)" not in row


def test_a_console_writing_to_a_file_is_wide_and_cuts_no_cell(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # the user's own width wins: this checks the default
    buffer = io.StringIO()
    console = WideWhenPiped(file=buffer)
    assert console.width == PIPED_WIDTH
    table = Table()
    names = [f"int8-dynamic-per-channel-{i}" for i in range(6)]
    for name in names:
        table.add_column(name)
    table.add_row(*names)
    console.print(table)
    assert "…" not in buffer.getvalue() and all(name in buffer.getvalue() for name in names)
    # rich's own default, for comparison: the same table cut at 80 columns
    narrow = io.StringIO()
    WideWhenPiped(file=narrow, width=80).print(table)
    assert "…" in narrow.getvalue()
