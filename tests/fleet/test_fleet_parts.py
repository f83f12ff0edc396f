"""Parts of a fleet tune that need no cluster: which nodes share a host, payloads through the object store,
and the bad input a fleet tune refuses before (or instead of) touching a cluster."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ortpilot.errors import UsageError
from ortpilot.fleet.nodes import RayNode, group_hosts
from ortpilot.fleet.payload import folder_files, model_payload, pack, unpack

CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def test_nodes_share_a_host_by_ip_or_by_booted_kernel():
    nodes = [RayNode("a", "10.0.0.1", "h", 2), RayNode("b", "10.0.0.1", "h", 1), RayNode("c", "10.0.0.2", "x", 2)]
    hosts = group_hosts(nodes, {"a": {"boot_id": "k1"}, "b": {"boot_id": "k1"}, "c": {"boot_id": "k2"}})
    assert hosts.of == {"a": "10.0.0.1", "b": "10.0.0.1", "c": "10.0.0.2"}
    assert "one node IP" in hosts.why["10.0.0.1"]
    # two containers with their own IPs on one machine: one kernel, one host
    pods = [RayNode("p", "10.1.0.5", "p", 2), RayNode("q", "10.1.0.6", "q", 2)]
    shared = group_hosts(pods, {"p": {"boot_id": "same"}, "q": {"boot_id": "same"}})
    assert shared.of["p"] == shared.of["q"] and shared.why[shared.of["p"]] == "one booted kernel"
    apart = group_hosts(pods, {"p": {"boot_id": "k1"}, "q": {"boot_id": "k2"}})
    assert apart.of["p"] != apart.of["q"] and not apart.why


def test_a_model_folder_travels_with_its_config_and_external_data(tmp_path, demo_paths):
    import onnx

    from ortpilot.modelio import load_model

    folder = tmp_path / "st"
    (folder / "onnx").mkdir(parents=True)
    model = load_model(demo_paths["mlp"])
    onnx.save_model(
        model, folder / "onnx" / "model.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "tokenizer.json").write_text("{}")
    (folder / "big.bin").write_bytes(b"0" * 10)
    data, name = model_payload(folder / "onnx" / "model.onnx")
    assert name == "onnx/model.onnx"
    got = sorted(unpack(data, tmp_path / "there"))
    assert got == ["config.json", "onnx/model.onnx", "onnx/weights.bin", "tokenizer.json"]
    assert load_model(tmp_path / "there" / "onnx" / "model.onnx").graph.node  # external data found beside it
    alone, alone_name = model_payload(demo_paths["mlp"])
    assert alone_name == demo_paths["mlp"].name and unpack(alone, tmp_path / "alone") == [alone_name]


def _tar(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        tar.addfile(info, io.BytesIO(b""))
    return buffer.getvalue()


@pytest.mark.parametrize(
    "bad",
    [
        _tar("../escape"),
        _tar("/abs"),
        _tar("a/../../b"),
        _tar("link", tarfile.SYMTYPE, "/etc/passwd"),
        _tar("dev", tarfile.CHRTYPE),
    ],
)
def test_a_payload_with_a_link_a_device_or_a_path_out_is_refused(tmp_path, bad):
    with pytest.raises(UsageError, match="not a plain file inside its folder"):
        unpack(bad, tmp_path / "dest")
    assert not (tmp_path / "escape").exists() and not list((tmp_path / "dest").rglob("*"))


def test_pack_and_unpack_keep_nested_files(tmp_path):
    (tmp_path / "src" / ".state").mkdir(parents=True)
    (tmp_path / "src" / ".state" / "x.npz").write_bytes(b"abc")
    (tmp_path / "src" / "journal.jsonl").write_text("{}\n")
    unpack(pack(folder_files(tmp_path / "src")), tmp_path / "dst")
    assert (tmp_path / "dst" / ".state" / "x.npz").read_bytes() == b"abc"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=240, cwd=cwd)


def test_an_address_where_no_cluster_answers_is_exit_2_at_once_and_writes_nothing(tmp_path):
    pytest.importorskip("ray")
    port = _free_port()
    done = _cli("tune", "demo:mlp", "--ray", f"127.0.0.1:{port}", "-o", "out", "--budget", "10", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"No Ray cluster answers at '127.0.0.1:{port}'" in done.stderr and "ray start --head" in done.stderr
    assert not (tmp_path / "out").exists()
    bad = _cli("tune", "demo:mlp", "--ray", "nowhere", "-o", "out", cwd=tmp_path)
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo:mlp", "demo:cnn"], "Several MODELs are tuned on a Ray cluster"),
        (["demo:mlp", "demo:mlp", "--ray", "127.0.0.1:1"], "share the bundle folder 'mlp'"),
        (["demo:mlp", "--ray", "127.0.0.1:1", "--budget", "0"], "--budget must be a positive number"),
        (["demo:mlp", "--ray", "127.0.0.1:1", "--metric", "nosuch=cosine"], "nosuch"),
    ],
)
def test_bad_fleet_requests_are_exit_2_before_any_cluster_is_asked(tmp_path, args, message):
    done = _cli("tune", *args, "-o", "out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "No Ray cluster" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_bundle_goes_into_a_folder_of_its_own(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "profile.json").write_text("{}")
    done = _cli("tune", "demo:mlp", "--ray", "127.0.0.1:1", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2 and "holds a local tune's profile.json" in done.stderr


def test_a_plain_tune_and_the_fleet_modules_do_not_import_ray(tmp_path):
    code = (
        "import sys, ortpilot, ortpilot.fleet, ortpilot.fleet.run, ortpilot.fleet.schedule, ortpilot.fleet.nodes, "
        "ortpilot.fleet.remote, ortpilot.fleet.child, ortpilot.session.bundle, ortpilot.artifacts.bundle; "
        f"ortpilot.tune('demo:mlp', {str(tmp_path / 'out')!r}, 15); "
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
    assert (tmp_path / "out" / "profile.json").is_file()
