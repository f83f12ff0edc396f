"""Run every corpus case through the CLI (or the Python API) and check what the user gets and what is left.

A case passes when the exit code is the one docs/concepts/failure-modes.md prescribes, the message holds its key
words in one paragraph without a traceback, and the output folder, the cwd, $TMPDIR and the
cache hold nothing but what a successful command wrote (no partial, temp or orphaned files).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from corpus import CASES, Case, Workspace, run_cli
from leftovers import assert_cache_sound, cache_entries, files_under, stray_entries

import ortpilot
from ortpilot.errors import OrtpilotError

API = {
    "load": lambda path: ortpilot.load(path, isolate=True),
    "load_profile": lambda path: ortpilot.load_profile(path),
}


def _params() -> list:
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else []) for c in CASES
    ]


def test_corpus_is_large_and_covers_every_entry_point() -> None:
    assert sum(1 for c in CASES if c.exit_code in (1, 2)) >= 100  # bad input: exit 1 or 2 with a message
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {c.command for c in CASES}
    assert commands >= {
        "load",
        "run",
        "inspect",
        "optimize",
        "quantize",
        "compare",
        "bench",
        "tune",
        "generate",
        "load_profile",
    }


@pytest.mark.parametrize("case", _params())
def test_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = Workspace.create(tmp_path)
    args = case.build(ws)
    before = cache_entries(ws.cache)
    if case.command in API:
        code, text = _run_api(case, args, ws, monkeypatch)
    else:
        proc = run_cli(ws, case.command, args, case.env, case.timeout_s)
        code, text = proc.returncode, proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert code == case.exit_code, text
    lowered = text.lower()
    missing = [w for w in case.words if w.lower() not in lowered]
    assert not missing, f"message lacks {missing}:\n{text}"
    if code:
        _assert_one_paragraph(text)
    assert sorted(str(p.relative_to(ws.out)) for p in files_under(ws.out)) == sorted(case.outputs)
    assert not files_under(ws.cwd), "files written into the cwd"
    assert not stray_entries(ws.tmp), f"left in $TMPDIR: {stray_entries(ws.tmp)}"
    assert_cache_sound(ws.cache)
    if code:
        assert cache_entries(ws.cache) == before, "a failed command added a cache entry"


def _run_api(case: Case, args: list[str], ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.chdir(ws.cwd)
    monkeypatch.setenv("ORTPILOT_CACHE_DIR", str(ws.cache))
    monkeypatch.setenv("TMPDIR", str(ws.tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(ws.tmp))
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    try:
        API[case.command](*args)
    except OrtpilotError as exc:
        return exc.exit_code, f"error: {exc}"
    return 0, ""


def _assert_one_paragraph(text: str) -> None:
    assert "error:" in text, text
    message = text[text.rindex("error:") :].strip()
    assert "\n\n" not in message and len(message) < 2000, message
