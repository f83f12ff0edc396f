"""Files ortpilot reads back are inputs; files it writes never go through a planted link or over another run.

Everything here is produced for real: a profile that names a file for ORT to overwrite (the file
must stay unchanged, and does change once the caller accepts the setting, which proves the
setting is live), journals edited by hand, symbolic links planted at every name a tune writes,
two ``tune`` processes on one OUTDIR, and cache entries owned by other users (run as other uids
with ``setpriv``, since the tests run as root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from corpus import CLI, Workspace, run_cli, save, tiny_model, tuned_profile
from test_signals import start_tune, wait_for_hanging_worker

import ortpilot
from ortpilot.errors import UsageError

PRECIOUS = b"precious bytes that no profile may overwrite\n"


def victim(folder: Path, name: str = "precious.txt") -> Path:
    path = folder / name
    path.write_bytes(PRECIOUS)
    return path


def edit_profile(profile: Path, change) -> Path:
    doc = json.loads(profile.read_text())
    change(doc)
    profile.write_text(json.dumps(doc))
    return profile


# --------------------------------------------------------------------------- hostile profiles


def test_a_profile_cannot_make_ort_overwrite_a_file(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    target = victim(tmp_path)
    profile = edit_profile(
        tuned_profile(ws), lambda d: d["session_settings"].update(optimized_model_filepath=str(target))
    )
    with pytest.raises(UsageError, match=r"session_settings\.optimized_model_filepath") as err:
        ortpilot.load_profile(str(profile))
    assert err.value.exit_code == 2 and "accept_fields" in str(err.value)
    assert target.read_bytes() == PRECIOUS
    # The setting is live: accepted by name, ORT really writes the optimized model over the file.
    ortpilot.load_profile(str(profile), accept_fields=["session_settings.optimized_model_filepath"])
    assert target.read_bytes() != PRECIOUS


def test_a_profile_config_entry_that_writes_files_is_refused(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    target = victim(tmp_path)
    entries = {"ep.context_enable": "1", "ep.context_file_path": str(target)}
    profile = edit_profile(tuned_profile(ws), lambda d: d["session_settings"].update(config_entries=entries))
    with pytest.raises(
        UsageError,
        match=r"config_entries\.ep\.context_enable, session_settings\.config_entries\."
        r"ep\.context_file_path",
    ):
        ortpilot.load_profile(str(profile))
    assert target.read_bytes() == PRECIOUS


def test_a_profile_provider_library_is_refused(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    library = victim(tmp_path, "libevil.so")
    profile = edit_profile(tuned_profile(ws), lambda d: d["providers"][0].update(options={"ep_library": str(library)}))
    with pytest.raises(UsageError, match=r"providers\[0\]\.options\.ep_library"):
        ortpilot.load_profile(str(profile))


def test_a_profile_model_outside_its_folder_needs_an_opt_in(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    elsewhere = save(tiny_model(), tmp_path / "elsewhere" / "m.onnx")
    profile = tuned_profile(ws)
    from ortpilot.modelio import file_sha256

    edit_profile(profile, lambda d: d["model"].update(file=str(elsewhere), sha256=file_sha256(elsewhere)))
    with pytest.raises(UsageError, match="outside the profile's folder"):
        ortpilot.load_profile(str(profile))
    edit_profile(profile, lambda d: d["model"].update(file="../elsewhere/m.onnx"))
    with pytest.raises(UsageError, match="accept_model_outside=True"):
        ortpilot.load_profile(str(profile))
    link = ws.inputs / "linked.onnx"
    link.symlink_to(elsewhere)
    edit_profile(profile, lambda d: d["model"].update(file="linked.onnx"))
    with pytest.raises(UsageError, match="outside the profile's folder"):
        ortpilot.load_profile(str(profile))
    assert ortpilot.load_profile(str(profile), accept_model_outside=True).providers == ["CPUExecutionProvider"]


# --------------------------------------------------------------------------- planted links, two writers


def test_links_planted_in_outdir_are_replaced_never_written_through(
    demo_paths: dict[str, Path], tmp_path: Path
) -> None:
    ws = Workspace.create(tmp_path)
    targets = tmp_path / "targets"
    targets.mkdir()
    names = ["profile.json", "model.onnx", "report.html", "report.md", "journal.jsonl"]
    for name in names:
        (ws.out / name).symlink_to(victim(targets, name + ".victim"))
    (targets / "state").mkdir()
    (ws.out / ".ortpilot-tune").symlink_to(targets / "state")
    proc = run_cli(
        ws, "tune", [str(demo_paths["mlp"]), "-o", str(ws.out), "--budget", "10", "--no-quantize"], timeout_s=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in names:
        assert not (ws.out / name).is_symlink() and (ws.out / name).is_file(), name
        assert (targets / (name + ".victim")).read_bytes() == PRECIOUS, name
    assert (ws.out / ".ortpilot-tune").is_dir() and not (ws.out / ".ortpilot-tune").is_symlink()
    assert not list((targets / "state").iterdir())
    ortpilot.load_profile(str(ws.out / "profile.json"))


def test_optimize_replaces_a_link_at_its_output(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    target = victim(tmp_path)
    (ws.out / "o.onnx").symlink_to(target)
    proc = run_cli(ws, "optimize", [str(save(tiny_model(), ws.inputs / "m.onnx")), "-o", str(ws.out / "o.onnx")])
    assert proc.returncode == 0, proc.stderr
    assert target.read_bytes() == PRECIOUS and not (ws.out / "o.onnx").is_symlink()


def test_a_link_planted_as_a_cache_entry_is_not_served(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    model = save(tiny_model(), ws.inputs / "m.onnx")
    first = run_cli(ws, "optimize", [str(model), "-o", str(ws.out / "a.onnx"), "--json"])
    assert first.returncode == 0, first.stderr
    key = json.loads(first.stdout)["record"]["extra"]["cache_key"]
    entry = ws.cache / "models" / key
    planted = tmp_path / "planted"
    shutil.copytree(entry, planted)  # a complete, self-consistent entry, reached through a link
    shutil.rmtree(entry)
    entry.symlink_to(planted)
    again = run_cli(ws, "optimize", [str(model), "-o", str(ws.out / "b.onnx"), "--json"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["record"]["extra"]["cache_hit"] is False
    assert entry.is_dir() and not entry.is_symlink() and planted.is_dir()


def test_two_tunes_on_one_outdir_the_second_is_refused_naming_the_first(
    demo_paths: dict[str, Path], tmp_path: Path
) -> None:
    ws = Workspace.create(tmp_path)
    first = start_tune(ws, demo_paths["mlp"])
    try:
        wait_for_hanging_worker(ws, first)
        journal = (ws.out / "journal.jsonl").read_bytes()
        second = run_cli(ws, "tune", [str(demo_paths["mlp"]), "-o", str(ws.out), "--budget", "10", "--no-quantize"])
        assert second.returncode == 2, second.stderr
        assert f"process {first.pid}" in second.stderr and "Traceback" not in second.stderr
        resumed = run_cli(ws, "tune", [str(demo_paths["mlp"]), "-o", str(ws.out), "--resume"])
        assert resumed.returncode == 2 and f"process {first.pid}" in resumed.stderr
        assert (ws.out / "journal.jsonl").read_bytes() == journal
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143


# --------------------------------------------------------------------------- hostile journals


def test_a_journal_cannot_make_tune_copy_another_file_into_outdir(demo_paths: dict[str, Path], tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    args = [str(demo_paths["mlp"]), "-o", str(ws.out), "--budget", "10", "--no-quantize"]
    assert run_cli(ws, "tune", args, timeout_s=300).returncode == 0
    target = victim(tmp_path)
    from ortpilot.modelio import file_sha256

    lines = (ws.out / "journal.jsonl").read_text().splitlines()
    winner = json.loads(lines[-1])["winner"]
    edited = []
    for line in lines:
        record = json.loads(line)
        if record["kind"] == "prepared" and record["id"] == winner:
            record.update(model_path=str(target), model_sha256=file_sha256(target))
        edited.append(json.dumps(record))
    (ws.out / "journal.jsonl").write_text("\n".join(edited) + "\n")
    proc = run_cli(ws, "tune", [*args, "--resume"], timeout_s=300)
    assert proc.returncode in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    assert (ws.out / "model.onnx").read_bytes() != PRECIOUS


def test_a_journal_behind_a_link_is_refused_on_resume_and_replaced_on_a_fresh_tune(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    target = victim(tmp_path)
    (ws.out / "journal.jsonl").symlink_to(target)
    model = save(tiny_model(), ws.inputs / "m.onnx")
    proc = run_cli(ws, "tune", [str(model), "-o", str(ws.out), "--resume", "--budget", "10"])
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
    assert target.read_bytes() == PRECIOUS


# --------------------------------------------------------------------------- the cache's owners


def as_user(uid: int, gid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]


@pytest.fixture
def open_tmp() -> Path:
    """A folder other uids can enter (pytest's tmp_path is 0700 root)."""
    folder = Path(tempfile.mkdtemp(prefix="ortpilot-owners-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


_IMPORTS: dict[tuple[int, int], str] = {}


def _skip_unless_importable_as(uid: int, gid: int) -> None:
    """Skip (with the reason) when user ``uid`` cannot run this checkout's ortpilot: a clone in a folder of
    mode 700, or a virtual environment only its owner can read, is not readable by another user."""
    if (uid, gid) not in _IMPORTS:
        probe = subprocess.run(
            [*as_user(uid, gid), sys.executable, "-c", "import ortpilot.cli.main"],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        lines = (probe.stderr.strip().splitlines() or ["no output"]) if probe.returncode else []
        _IMPORTS[uid, gid] = lines[-1] if lines else ""
    if _IMPORTS[uid, gid]:
        pytest.skip(
            f"user {uid} cannot import ortpilot from this checkout or its Python ({_IMPORTS[uid, gid]}); "
            "put the checkout and its virtual environment where other users can read them to run this test"
        )


def _run_as(uid: int, gid: int, root: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    _skip_unless_importable_as(uid, gid)
    home = root / f"home{uid}"
    home.mkdir(exist_ok=True)
    os.chown(home, uid, gid)
    env = dict(os.environ, ORTPILOT_CACHE_DIR=str(cache), HOME=str(home), TMPDIR=str(home), NO_COLOR="1")
    return subprocess.run(
        [*as_user(uid, gid), *CLI, *args], cwd=home, env=env, capture_output=True, text=True, timeout=120, check=False
    )


needs_root = pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv"), reason="runs commands as other users: needs root and setpriv"
)


@needs_root
def test_a_group_shared_cache_works_for_every_member(open_tmp: Path) -> None:
    cache = open_tmp / "shared-cache"
    cache.mkdir()
    os.chown(cache, 0, 4242)
    cache.chmod(0o2775)
    model = save(tiny_model(), open_tmp / "m.onnx")
    model.chmod(0o644)
    first = _run_as(12345, 4242, open_tmp, cache, "optimize", str(model), "-o", "a.onnx", "--json")
    assert first.returncode == 0, first.stderr
    second = _run_as(12346, 4242, open_tmp, cache, "optimize", str(model), "-o", "b.onnx", "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["record"]["extra"]["cache_hit"] is True
    entry = next((cache / "models").glob("[0-9a-f]*"))
    (entry / "model.onnx").write_bytes(b"damaged")  # the other member repairs what the first built
    third = _run_as(12346, 4242, open_tmp, cache, "optimize", str(model), "-o", "c.onnx", "--json")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["record"]["extra"]["cache_hit"] is False


@needs_root
def test_a_cache_another_user_owns_is_a_message_not_a_traceback(open_tmp: Path) -> None:
    cache = open_tmp / "roots-cache"
    cache.mkdir(mode=0o755)
    model = save(tiny_model(), open_tmp / "m.onnx")
    model.chmod(0o644)
    proc = _run_as(12345, 12345, open_tmp, cache, "optimize", str(model), "-o", "a.onnx")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "EACCES" in proc.stderr and "ORTPILOT_CACHE_DIR" in proc.stderr


@needs_root
def test_an_entry_another_user_wrote_into_a_private_cache_is_refused(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path)
    model = save(tiny_model(), ws.inputs / "m.onnx")
    assert run_cli(ws, "optimize", [str(model), "-o", str(ws.out / "a.onnx")]).returncode == 0
    entry = next((ws.cache / "models").glob("[0-9a-f]*"))
    for path in [entry, *entry.iterdir()]:
        os.chown(path, 12345, 12345)
    proc = run_cli(ws, "optimize", [str(model), "-o", str(ws.out / "b.onnx")])
    assert proc.returncode == 2 and "belongs to user id 12345" in proc.stderr, proc.stderr
    assert not (ws.out / "b.onnx").exists()


def test_the_default_cache_folder_is_private(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ORTPILOT_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    model = save(tiny_model(), tmp_path / "m.onnx")
    proc = subprocess.run(
        [*CLI, "optimize", str(model), "-o", str(tmp_path / "o.onnx")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "xdg" / "ortpilot").stat().st_mode & 0o777 == 0o700
    if os.getuid() == 0:
        os.chown(tmp_path / "xdg" / "ortpilot", 12345, 12345)
        proc = subprocess.run(
            [*CLI, "optimize", str(model), "-o", str(tmp_path / "p.onnx")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 2 and "belongs to user id 12345" in proc.stderr, proc.stderr
