"""Stamps refuse models built for another EP or ORT; the cache verifies, rebuilds and shares safely."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from ortpilot.artifacts.atomic import save_model
from ortpilot.artifacts.stamp import check_stamp, make_stamp, read_stamp, stamp_problems, write_stamp
from ortpilot.artifacts.store import ModelStore, cache_key
from ortpilot.errors import StampMismatchError
from ortpilot.modelio import file_sha256
from ortpilot.providers.names import resolve_providers


def _stamped(
    model: onnx.ModelProto,
    provider: str,
    *,
    level: str = "all",
    source_path: str | None = None,
    ort_version: str | None = None,
) -> onnx.ModelProto:
    stamp = make_stamp(
        source_sha256="0" * 64,
        providers=resolve_providers([provider]),
        level=level,
        source_path=source_path,
        pass_name="optimize",
        ort_version=ort_version,
    )
    return write_stamp(model, stamp)


def test_stamp_roundtrip_and_fields(demo_paths):
    model = _stamped(onnx.load(demo_paths["mlp"]), "cpu")
    stamp = read_stamp(model)
    assert stamp["providers"][0]["name"] == "CPUExecutionProvider"
    for key in ("ort_version", "ort_distribution", "level", "source_sha256", "cpu", "gpu", "ortpilot_version"):
        assert key in stamp
    assert stamp["ep_specific"] is True
    check_stamp(model, resolve_providers(["cpu"]))  # same EP, same ORT: fine


def test_stamp_mismatch_names_what_it_was_built_for(demo_paths):
    model = _stamped(onnx.load(demo_paths["mlp"]), "openvino")
    with pytest.raises(StampMismatchError) as err:
        check_stamp(model, resolve_providers(["cpu"]))
    text = str(err.value)
    assert "OpenVINOExecutionProvider" in text and "CPUExecutionProvider" in text and "ortpilot optimize" in text
    assert err.value.exit_code == 1
    old = _stamped(onnx.load(demo_paths["mlp"]), "cpu", ort_version="1.0.0")
    assert any("ORT 1.0.0" in p for p in stamp_problems(read_stamp(old), resolve_providers(["cpu"])))
    basic = _stamped(onnx.load(demo_paths["mlp"]), "openvino", level="basic")
    check_stamp(basic, resolve_providers(["cpu"]))  # basic-level graphs are provider-independent


def test_loading_a_model_stamped_for_another_ep_is_refused(demo_paths, tmp_path):
    """The done-when: offline-optimized for one EP, loaded on another -> exit 1 with the reason."""
    from ortpilot.cli.main import cli
    from ortpilot.passes.optimize import OptimizePass

    result = OptimizePass("all", "cpu").run(demo_paths["cnn"])
    stamp = dict(
        result.record.stamp,
        providers=[{"name": "OpenVINOExecutionProvider", "short": "openvino", "options": {}}],
        source_path=None,
    )
    path = save_model(write_stamp(result.model, stamp), tmp_path / "cnn.ov.onnx")
    res = CliRunner().invoke(cli, ["run", str(path), "-p", "cpu"])
    assert res.exit_code == 1
    assert "optimized for OpenVINOExecutionProvider" in res.output and "CPUExecutionProvider" in res.output


def test_stamped_model_with_known_source_is_rebuilt(demo_paths, tmp_path, caplog):
    import ortpilot
    from ortpilot.passes.optimize import OptimizePass

    result = OptimizePass("all", "cpu").run(demo_paths["cnn"])
    stamp = dict(
        result.record.stamp, providers=[{"name": "OpenVINOExecutionProvider", "short": "openvino", "options": {}}]
    )
    assert stamp["source_path"] == str(Path(demo_paths["cnn"]).resolve())
    path = save_model(write_stamp(result.model, stamp), tmp_path / "cnn.ov.onnx")
    sess = ortpilot.load(str(path), ["cpu"])
    assert sess.model_path != path  # the rebuilt model, not the OpenVINO one
    assert read_stamp(sess.model)["providers"][0]["name"] == "CPUExecutionProvider"


def test_a_rebuilt_fusion_keeps_its_options(demo_paths, tmp_path):
    """A fusion stamped for another EP is rebuilt from its source with the options it was built with: the
    residual Adds and LayerNormalizations stay apart where the tune chose them apart."""
    import ortpilot
    from ortpilot.passes.fusion import FusionPass

    result = FusionPass("bert", skip_layer_norm=False).run(demo_paths["encoder"])
    stamp = dict(
        result.record.stamp, providers=[{"name": "OpenVINOExecutionProvider", "short": "openvino", "options": {}}]
    )
    path = save_model(write_stamp(result.model, stamp), tmp_path / "enc.ov.onnx")
    sess = ortpilot.load(str(path), ["cpu"])
    assert sess.model_path != path
    ops = {n.op_type for n in onnx.load(sess.model_path).graph.node}
    assert "Attention" in ops and "LayerNormalization" in ops and "SkipLayerNormalization" not in ops


def test_store_builds_once_and_verifies_content(tmp_path, caplog):
    store = ModelStore(tmp_path / "models")
    key = cache_key(model_sha256="a" * 64, ort_version="x", providers=["cpu"], level="all")
    calls = []

    def build(dest: Path) -> None:
        calls.append(1)
        dest.write_bytes(b"model-bytes")

    path, hit = store.get_or_create(key, build)
    assert not hit and path.read_bytes() == b"model-bytes"
    path2, hit2 = store.get_or_create(key, build)
    assert hit2 and path2 == path and len(calls) == 1
    path.write_bytes(b"corrupted")
    with caplog.at_level("WARNING", logger="ortpilot"):
        path3, hit3 = store.get_or_create(key, build)
    assert not hit3 and path3.read_bytes() == b"model-bytes" and len(calls) == 2
    assert "corrupt" in caplog.text


def test_cache_key_depends_on_every_input():
    base = dict(
        model_sha256="a",
        ort_version="1",
        providers=["cpu"],
        level="all",
        free_dimension_overrides={},
        cpu={"isa": "avx2"},
    )
    keys = {cache_key(**base)}
    for change in (
        {"model_sha256": "b"},
        {"ort_version": "2"},
        {"providers": ["cuda"]},
        {"level": "basic"},
        {"free_dimension_overrides": {"batch": 1}},
        {"cpu": {"isa": "avx512"}},
    ):
        keys.add(cache_key(**{**base, **change}))
    assert len(keys) == 7


def test_interrupted_build_leaves_cache_clean(tmp_path):
    store = ModelStore(tmp_path / "models")

    def build(dest: Path) -> None:
        dest.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.get_or_create("k" * 64, build)
    assert store.entries() == [] and store.leftovers() == []


def _build_in_child(root: str, log: str) -> str:
    store = ModelStore(root)

    def build(dest: Path) -> None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        import time

        time.sleep(0.3)
        dest.write_bytes(b"shared")

    path, _ = store.get_or_create("s" * 64, build)
    return Path(path).read_text()


def test_two_processes_share_an_entry(tmp_path):
    root, log = str(tmp_path / "models"), str(tmp_path / "builds.log")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.starmap(_build_in_child, [(root, log), (root, log)])
    assert results == ["shared", "shared"]
    assert len(Path(log).read_text().split()) == 1  # built once, under the lock
    store = ModelStore(root)
    meta = store.read_entry("s" * 64)
    assert meta["sha256"] == file_sha256(store.entry_dir("s" * 64) / "model.onnx")
    json.dumps(meta)


def test_what_a_build_returns_is_in_the_entry_before_it_appears(tmp_path):
    store = ModelStore(tmp_path / "cache")
    key = "m" * 64

    def build(dest):
        dest.write_bytes(b"model")
        assert not store.entry_dir(key).exists()  # the entry appears only after its entry.json is complete
        return {"record": {"name": "p"}}

    store.get_or_create(key, build, meta={"steps": [1]})
    assert store.read_entry(key)["meta"] == {"steps": [1], "record": {"name": "p"}}
    store.get_or_create("n" * 64, lambda dest: dest.write_bytes(b"x"))  # a non-mapping return adds nothing
    assert store.read_entry("n" * 64)["meta"] == {}
