"""Property: whatever bytes arrive as a model, ortpilot answers 0, 1 or 2 and the caller survives.

Hypothesis mutates the demo models (bit flips, byte overwrites, truncations, splices of two
models). Protobuf writes nodes first and inputs/outputs/opsets last, so most positions are
drawn from a model's head and tail, where a flip changes structure rather than a weight.
``inspect`` runs as a CLI subprocess (its exit code must be 0, 1 or 2, with no traceback);
``load(isolate=True)`` runs in this process, which must only ever see success or an
OrtpilotError (a crash in ORT would kill pytest itself).
"""

from __future__ import annotations

import os
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
SHORT = settings(max_examples=20, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LONG = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


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
            edits.append((kind, where, offset, (draw(st.sampled_from(SOURCES)), draw(st.integers(0, 2**31)),
                                                draw(st.integers(1, 512)))))
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
            data[pos:pos + len(arg)] = arg
        elif kind == "truncate":
            del data[pos:]
        else:
            other_name, other_offset, length = arg
            other = originals[other_name]
            start = other_offset % len(other)
            data[pos:pos] = other[start:start + length]
    return bytes(data)


def _position(size: int, where: str, offset: int) -> int:
    if where == "head":
        return offset % min(size, EDGE)
    if where == "tail":
        return size - 1 - offset % min(size, EDGE)
    return offset % size


def check_inspect(path: Path, tmp: Path) -> None:
    env = dict(os.environ, ORTPILOT_CACHE_DIR=str(tmp / "cache"), TMPDIR=str(tmp))
    proc = subprocess.run([*CLI, "inspect", str(path)], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1, 2), f"inspect exited {proc.returncode} on {path}:\n{out[-2000:]}"
    assert "Traceback" not in out, out[-3000:]


def check_load_isolated(path: Path, tmp: Path) -> None:
    try:
        ortpilot.load(str(path), isolate=True, placement=False)
    except OrtpilotError as exc:
        assert exc.exit_code in (1, 2)


def _fuzz(originals: dict[str, bytes], tmp: Path, source: str, edits: list[tuple],
          check: Callable[[Path, Path], None]) -> None:
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
def test_fuzz_load_isolated(originals: dict[str, bytes], tmp_path: Path, isolate_timeout: None,
                            case: tuple[str, list[tuple]]) -> None:
    _fuzz(originals, tmp_path, *case, check_load_isolated)


@pytest.mark.slow
@given(case=mutations())
@LONG
def test_fuzz_inspect_long(originals: dict[str, bytes], tmp_path: Path, case: tuple[str, list[tuple]]) -> None:
    _fuzz(originals, tmp_path, *case, check_inspect)


@pytest.mark.slow
@given(case=mutations())
@LONG
def test_fuzz_load_isolated_long(originals: dict[str, bytes], tmp_path: Path, isolate_timeout: None,
                                 case: tuple[str, list[tuple]]) -> None:
    _fuzz(originals, tmp_path, *case, check_load_isolated)


def test_mutations_really_change_the_bytes(originals: dict[str, bytes]) -> None:
    mutated = apply(originals, "tiny", [("flip", "head", 3, 0), ("truncate", "tail", 10, None)])
    assert mutated != originals["tiny"] and len(mutated) < len(originals["tiny"])
