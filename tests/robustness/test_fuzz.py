"""Property: whatever bytes arrive as a model, profile or journal, ortpilot answers 0, 1 or 2 and the caller survives.

Hypothesis mutates the demo models (bit flips, byte overwrites, truncations, splices of two
models). Protobuf writes nodes first and inputs/outputs/opsets last, so most positions are
drawn from a model's head and tail, where a flip changes structure rather than a weight.
``inspect`` runs as a CLI subprocess (its exit code must be 0, 1 or 2, with no traceback);
``load(isolate=True)`` runs in this process, which must only ever see success or an
OrtpilotError (a crash in ORT would kill pytest itself). ``profile.json`` and ``journal.jsonl``
are edited field by field (any JSON value at any path, strings that name a victim file or climb
out with '..') and byte by byte: loading answers with an OrtpilotError at worst, ``tune --resume``
exits 0, 1 or 2 without a traceback, and nothing outside OUTDIR (the cache and $TMPDIR aside) is
written, the victim file least of all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from corpus import CLI, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ortpilot
from ortpilot.errors import OrtpilotError
from ortpilot.session.isolate import TIMEOUT_ENV

SOURCES = ("tiny", "mlp", "cnn", "decoder")
EDGE = 4096  # bytes at each end where the graph structure lives
SHORT = settings(
    max_examples=20,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
LONG = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def originals(demo_paths: dict[str, Path]) -> dict[str, bytes]:
    data = {name: demo_paths[name].read_bytes() for name in SOURCES if name in demo_paths}
    data["tiny"] = tiny_model().SerializeToString()
    return data


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, list[tuple]]:
    """A source model name and a list of edits, applied by :func:`apply`."""
    source = draw(st.sampled_from(SOURCES))
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "flip", "overwrite", "truncate", "splice"]))
        where = draw(st.sampled_from(["head", "tail", "any"]))
        offset = draw(st.integers(0, 2**31))
        if kind == "flip":
            edits.append((kind, where, offset, draw(st.integers(0, 7))))
        elif kind == "overwrite":
            edits.append((kind, where, offset, draw(st.binary(min_size=1, max_size=16))))
        elif kind == "truncate":
            edits.append((kind, where, offset, None))
        else:
            edits.append(
                (
                    kind,
                    where,
                    offset,
                    (draw(st.sampled_from(SOURCES)), draw(st.integers(0, 2**31)), draw(st.integers(1, 512))),
                )
            )
    return source, edits


def apply(originals: dict[str, bytes], source: str, edits: list[tuple]) -> bytes:
    data = bytearray(originals[source])
    for kind, where, offset, arg in edits:
        if not data:
            break
        pos = _position(len(data), where, offset)
        if kind == "flip":
            data[pos] ^= 1 << arg
        elif kind == "overwrite":
            data[pos : pos + len(arg)] = arg
        elif kind == "truncate":
            del data[pos:]
        else:
            other_name, other_offset, length = arg
            other = originals[other_name]
            start = other_offset % len(other)
            data[pos:pos] = other[start : start + length]
    return bytes(data)


def _position(size: int, where: str, offset: int) -> int:
    if where == "head":
        return offset % min(size, EDGE)
    if where == "tail":
        return size - 1 - offset % min(size, EDGE)
    return offset % size


def check_inspect(path: Path, tmp: Path) -> None:
    env = dict(os.environ, ORTPILOT_CACHE_DIR=str(tmp / "cache"), TMPDIR=str(tmp))
    proc = subprocess.run(
        [*CLI, "inspect", str(path)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1, 2), f"inspect exited {proc.returncode} on {path}:\n{out[-2000:]}"
    assert "Traceback" not in out, out[-3000:]


def check_load_isolated(path: Path, tmp: Path) -> None:
    try:
        ortpilot.load(str(path), isolate=True, placement=False)
    except OrtpilotError as exc:
        assert exc.exit_code in (1, 2)


def _fuzz(
    originals: dict[str, bytes], tmp: Path, source: str, edits: list[tuple], check: Callable[[Path, Path], None]
) -> None:
    path = tmp / "fuzzed.onnx"
    path.write_bytes(apply(originals, source, edits))
    check(path, tmp)


@pytest.fixture
def isolate_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "60")


@given(case=mutations())
@SHORT
def test_fuzz_inspect(originals: dict[str, bytes], tmp_path: Path, case: tuple[str, list[tuple]]) -> None:
    _fuzz(originals, tmp_path, *case, check_inspect)


@given(case=mutations())
@SHORT
def test_fuzz_load_isolated(
    originals: dict[str, bytes], tmp_path: Path, isolate_timeout: None, case: tuple[str, list[tuple]]
) -> None:
    _fuzz(originals, tmp_path, *case, check_load_isolated)


@pytest.mark.slow
@given(case=mutations())
@LONG
def test_fuzz_inspect_long(originals: dict[str, bytes], tmp_path: Path, case: tuple[str, list[tuple]]) -> None:
    _fuzz(originals, tmp_path, *case, check_inspect)


@pytest.mark.slow
@given(case=mutations())
@LONG
def test_fuzz_load_isolated_long(
    originals: dict[str, bytes], tmp_path: Path, isolate_timeout: None, case: tuple[str, list[tuple]]
) -> None:
    _fuzz(originals, tmp_path, *case, check_load_isolated)


def test_mutations_really_change_the_bytes(originals: dict[str, bytes]) -> None:
    mutated = apply(originals, "tiny", [("flip", "head", 3, 0), ("truncate", "tail", 10, None)])
    assert mutated != originals["tiny"] and len(mutated) < len(originals["tiny"])


# --------------------------------------------------------------------------- files read back: profile.json, journal.jsonl

VICTIM = b"no profile or journal may change this file\n"


def json_values(victim_path: str) -> st.SearchStrategy:
    """Any JSON value, with the strings a hostile file would use: paths to a victim, '..', links, markup."""
    strings = st.one_of(
        st.text(max_size=20),
        st.sampled_from([victim_path, "../" * 8 + "etc/passwd", "/dev/zero", "[bold]x[/]", "model.onnx", "", "\0"]),
    )
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True), strings)
    return st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(strings, inner, max_size=4)),
        max_leaves=8,
    )


def _paths(doc, prefix=()) -> list[tuple]:
    """Every key path into a JSON document (so an edit can hit any field, nested ones included)."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += _paths(value, (*prefix, i))
    return found


def edit_json(doc, draw: st.DrawFn, victim_path: str, edits: int):
    """Replace, delete or add fields at random paths of ``doc`` (a deep copy is edited)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(edits):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if not path:
            if action == "replace":
                doc = draw(json_values(victim_path))
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if not isinstance(parent, (dict, list)):
            continue
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(json_values(victim_path))
        else:
            parent[path[-1]] = draw(json_values(victim_path))
    return doc


def snapshot(*folders: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fuzz_profile_source(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from corpus import Workspace, tuned_profile

    ws = Workspace.create(tmp_path_factory.mktemp("profile-source"))
    return json.loads(tuned_profile(ws).read_text())


@st.composite
def profile_texts(draw: st.DrawFn, source: dict, victim_path: str) -> bytes:
    if draw(st.integers(0, 4)) == 0:  # raw damage: bytes flipped, cut, spliced
        data = bytearray(json.dumps(source).encode())
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos : pos + 1] = draw(st.binary(min_size=0, max_size=3))
        return bytes(data)
    return json.dumps(edit_json(source, draw, victim_path, draw(st.integers(1, 3))), allow_nan=True).encode()


def check_profile_doc(data: bytes, tmp: Path) -> None:
    """load_profile on hostile bytes: success or an OrtpilotError, and nothing written anywhere it may not."""
    from corpus import save, tiny_model

    folder = tmp / "deploy"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    save(tiny_model(), folder / "tuned.onnx")
    victim = tmp / "victim.txt"
    victim.write_bytes(VICTIM)
    (folder / "profile.json").write_bytes(data)
    before = snapshot(folder)
    try:
        ortpilot.load_profile(str(folder / "profile.json"))
    except OrtpilotError as exc:
        assert exc.exit_code in (1, 2)
    assert victim.read_bytes() == VICTIM
    assert snapshot(folder) == before, "loading a profile wrote into its folder"


def _profile_fuzz(fuzz_profile_source: dict, tmp_path: Path, data: st.DataObject, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    victim_path = str(tmp_path / "victim.txt")
    check_profile_doc(data.draw(profile_texts(fuzz_profile_source, victim_path)), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy", "victim.txt"], "a write outside the folder"


@given(data=st.data())
@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_fuzz_profile(fuzz_profile_source: dict, tmp_path: Path, data: st.DataObject, monkeypatch) -> None:
    _profile_fuzz(fuzz_profile_source, tmp_path, data, monkeypatch)


@pytest.mark.slow
@given(data=st.data())
@LONG
def test_fuzz_profile_long(fuzz_profile_source: dict, tmp_path: Path, data: st.DataObject, monkeypatch) -> None:
    _profile_fuzz(fuzz_profile_source, tmp_path, data, monkeypatch)


@pytest.fixture(scope="module")
def tuned_journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A real, finished tune of the tiny model: its journal is what the fuzzer edits."""
    from corpus import Workspace, run_cli, tiny_file

    ws = Workspace.create(tmp_path_factory.mktemp("journal-source"))
    model = tiny_file(ws)
    proc = run_cli(ws, "tune", [str(model), "-o", str(ws.out), "--budget", "10", "--no-quantize"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (ws.out / "journal.jsonl").read_text().splitlines()
    return ws.out.parent, [json.loads(line) for line in lines]


@st.composite
def journal_texts(draw: st.DrawFn, records: list[dict], victim_path: str) -> bytes:
    lines = [json.dumps(r) for r in records]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["edit", "edit", "edit", "delete", "duplicate", "bytes"]))
        if action == "edit":
            try:
                record = json.loads(lines[i])
            except ValueError:  # a line an earlier "bytes" action broke: it stays broken
                continue
            lines[i] = json.dumps(edit_json(record, draw, victim_path, 1), allow_nan=True)
        elif action == "delete" and len(lines) > 1:
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        else:
            raw = bytearray(lines[i].encode())
            pos = draw(st.integers(0, len(raw) - 1))
            raw[pos : pos + 1] = draw(st.binary(max_size=2))
            lines[i] = raw.decode("utf-8", "replace")
    return ("\n".join(lines) + "\n").encode()


def test_journal_strategy_edits_real_records(tuned_journal: tuple[Path, list[dict]]) -> None:
    _, records = tuned_journal
    assert {"start", "kept", "prepared", "bench", "done"} <= {r["kind"] for r in records}


@given(data=st.data())
@settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_fuzz_journal_records(tuned_journal: tuple[Path, list[dict]], tmp_path: Path, data: st.DataObject) -> None:
    """Reading a hostile journal: its records, or a UsageError naming a line; never another exception."""
    from ortpilot.errors import UsageError
    from ortpilot.tuning.journal import Journal

    path = tmp_path / "journal.jsonl"
    path.write_bytes(data.draw(journal_texts(tuned_journal[1], str(tmp_path / "victim.txt"))))
    try:
        Journal(path, resume=True)
    except UsageError as exc:
        assert "line" in str(exc) or "journal" in str(exc)


def _journal_resume(tuned_journal: tuple[Path, list[dict]], tmp_path: Path, data: st.DataObject) -> None:
    """``tune --resume`` on a hostile journal: exit 0, 1 or 2, no traceback, nothing written outside OUTDIR
    (and the cache and $TMPDIR, which are ortpilot's), a victim file named in the journal unchanged."""
    from corpus import Workspace, run_cli, tiny_file

    source_root, records = tuned_journal
    ws = Workspace.create(tmp_path / "ws")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    shutil.copytree(source_root / "out", ws.out, dirs_exist_ok=True)
    (ws.out / "journal.jsonl").write_bytes(data.draw(journal_texts(records, str(victim))))
    model = tiny_file(ws)
    before = snapshot(ws.inputs, ws.cwd)
    proc = run_cli(
        ws, "tune", [str(model), "-o", str(ws.out), "--budget", "10", "--no-quantize", "--resume"], timeout_s=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1, 2), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert victim.read_bytes() == VICTIM
    assert snapshot(ws.inputs, ws.cwd) == before, "a resumed tune wrote outside OUTDIR"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt", "ws"]
    assert (ws.out / "model.onnx").read_bytes() != VICTIM


@given(data=st.data())
@settings(
    max_examples=6,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_fuzz_journal_resume(tuned_journal: tuple[Path, list[dict]], tmp_path: Path, data: st.DataObject) -> None:
    _journal_resume(tuned_journal, tmp_path, data)


@pytest.mark.slow
@given(data=st.data())
@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_fuzz_journal_resume_long(tuned_journal: tuple[Path, list[dict]], tmp_path: Path, data: st.DataObject) -> None:
    _journal_resume(tuned_journal, tmp_path, data)
