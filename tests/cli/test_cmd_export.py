"""``ortpilot export triton``: the command, its bad input (exit 2 / 1), --force, decoders, KServe."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner
from export_profiles import rows_model, with_providers, write_cpu_profile

from ortpilot.cli.main import cli


def _run(*args: str):
    return CliRunner().invoke(cli, ["export", "triton", *args])


def _said(result) -> str:
    return " ".join(result.output.split())  # rich wraps long lines


def test_cli_writes_the_repository_and_one_json_document(encoder_profile, tmp_path):
    repo = tmp_path / "repo"
    result = _run(str(encoder_profile), "-o", str(repo), "--name", "enc", "--instances", "2", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["name"] == "enc" and doc["kind"] == "KIND_CPU" and doc["providers"] == ["cpu"]
    files = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file())
    assert files == [
        "enc/1/model.onnx",
        "enc/ORTPILOT.md",
        "enc/config.pbtxt",
        "enc/warmup/attention_mask",
        "enc/warmup/input_ids",
        "enc/warmup/token_type_ids",
    ]
    assert "count: 2" in (repo / "enc" / "config.pbtxt").read_text()
    assert "instance_group.count" in {loss["setting"] for loss in doc["losses"]}  # 2 sessions share the cores


@pytest.mark.parametrize("provider", ["CoreMLExecutionProvider", "WebGpuExecutionProvider", "QNNExecutionProvider"])
def test_a_provider_the_backend_cannot_use_is_exit_2_naming_it_and_the_supported_ones(
    provider, encoder_profile, tmp_path
):
    profile = with_providers(encoder_profile, [{"name": provider, "options": {}}], f"profile-{provider}.json")
    result = _run(str(profile), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 2, result.output
    said = _said(result)
    short = {"CoreMLExecutionProvider": "coreml", "WebGpuExecutionProvider": "webgpu", "QNNExecutionProvider": "qnn"}
    assert short[provider] in said and "cpu, cuda, tensorrt, openvino" in said
    assert "Traceback" not in result.output and not (tmp_path / "repo").exists()


def test_existing_folder_is_exit_2_unless_force_which_replaces_it_whole(encoder_profile, tmp_path):
    repo = tmp_path / "repo"
    (repo / "enc" / "2").mkdir(parents=True)
    (repo / "enc" / "2" / "old.onnx").write_bytes(b"old")
    result = _run(str(encoder_profile), "-o", str(repo), "--name", "enc")
    assert result.exit_code == 2 and "--force" in _said(result)
    assert (repo / "enc" / "2" / "old.onnx").read_bytes() == b"old"  # untouched
    result = _run(str(encoder_profile), "-o", str(repo), "--name", "enc", "--force")
    assert result.exit_code == 0, result.output
    assert not (repo / "enc" / "2").exists() and (repo / "enc" / "config.pbtxt").is_file()
    assert [p.name for p in repo.iterdir()] == ["enc"]  # no scratch or old folder left beside it


def test_an_empty_existing_folder_needs_no_force(encoder_profile, tmp_path):
    (tmp_path / "repo" / "enc").mkdir(parents=True)
    assert _run(str(encoder_profile), "-o", str(tmp_path / "repo"), "--name", "enc").exit_code == 0


def test_decoder_profile_exports_and_says_there_is_no_kv_cache_loop(demo_paths, tmp_path):
    profile = write_cpu_profile(tmp_path / "dec", demo_paths["decoder"], settings={})
    result = _run(str(profile), "-o", str(tmp_path / "repo"), "--name", "dec")
    assert result.exit_code == 0, result.output
    notes = (tmp_path / "repo" / "dec" / "ORTPILOT.md").read_text()
    assert "no KV-cache loop" in notes
    config = (tmp_path / "repo" / "dec" / "config.pbtxt").read_text()
    assert 'name: "past_key_values.0.key"' in config and 'name: "present.1.value"' in config


def test_not_a_profile_is_exit_2(tmp_path):
    bad = tmp_path / "profile.json"
    bad.write_text('{"hello": 1}')
    result = _run(str(bad), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 2 and "is not an ortpilot profile" in _said(result)
    result = _run(str(tmp_path / "missing.json"), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 2 and "does not exist" in _said(result)


def test_a_tune_output_folder_is_exported_as_its_profile_json(encoder_profile, tmp_path):
    """'export triton OUT' said "Profile 'OUT' does not exist" for the folder verify and serve accept."""
    by_file = _run(str(encoder_profile), "-o", str(tmp_path / "a"), "--json")
    by_folder = _run(str(encoder_profile.parent), "-o", str(tmp_path / "b"), "--json")
    assert by_folder.exit_code == 0, by_folder.output
    name = json.loads(by_folder.stdout)["name"]
    assert name == json.loads(by_file.stdout)["name"] == encoder_profile.parent.name
    assert (tmp_path / "b" / name / "config.pbtxt").read_text() == (tmp_path / "a" / name / "config.pbtxt").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _run(str(empty), "-o", str(tmp_path / "c"))
    assert result.exit_code == 2 and "is a folder without profile.json" in _said(result), result.output


def test_missing_or_changed_model_is_exit_1(encoder_profile, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(encoder_profile.parent, folder)
    model = folder / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\0")
    result = _run(str(folder / "profile.json"), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 1 and "changed since it was tuned" in _said(result)
    model.unlink()
    result = _run(str(folder / "profile.json"), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 1 and "is missing" in _said(result)
    assert not (tmp_path / "repo").exists()


def test_max_batch_on_a_model_without_a_batch_dim_is_exit_2(tmp_path):
    """Dim 0 is dynamic but its rows interact (each row minus the mean of all rows): no batch dim."""
    model = rows_model(tmp_path / "rows.onnx")
    profile = write_cpu_profile(tmp_path / "rows", model, shapes={"x": [4, 3]})
    result = _run(str(profile), "-o", str(tmp_path / "repo"), "--max-batch", "8")
    assert result.exit_code == 2 and "no batch dim" in _said(result)
    assert "rows are not independent" in _said(result) and "Traceback" not in result.output
    result = _run(str(profile), "-o", str(tmp_path / "repo"), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["max_batch_size"] == 0
    assert _run(str(profile), "-o", str(tmp_path / "repo"), "--max-batch", "0", "--force").exit_code == 0


def test_cli_says_why_dim_0_is_batched_and_where_the_warmup_comes_from(encoder_profile, tmp_path):
    result = _run(str(encoder_profile), "-o", str(tmp_path / "repo"), "--name", "enc")
    assert result.exit_code == 0, result.output
    said = _said(result)
    assert "max_batch_size 4" in said and "named like batch" in said
    assert "warmup: reference" in said
    notes = (tmp_path / "repo" / "enc" / "ORTPILOT.md").read_text()
    assert "- Batching: max_batch_size 4: every input's first dim is dynamic and named like batch" in notes


def test_kind_against_the_profile_is_exported_as_a_loss(encoder_profile, tmp_path):
    result = _run(str(encoder_profile), "-o", str(tmp_path / "repo"), "--kind", "GPU", "--json")
    assert result.exit_code == 0, result.output
    losses = {loss["setting"]: loss["consequence"] for loss in json.loads(result.stdout)["losses"]}
    assert "runs on CUDA" in losses["instance_group.kind"]


def test_inferenceservice_manifest_is_kserve_triton_v2(encoder_profile, tmp_path):
    manifest = tmp_path / "isvc.yaml"
    result = _run(
        str(encoder_profile),
        "-o",
        str(tmp_path / "models"),
        "--name",
        "My_Encoder.v1",
        "--emit-inferenceservice",
        str(manifest),
    )
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(manifest.read_text())
    assert doc["apiVersion"] == "serving.kserve.io/v1beta1" and doc["kind"] == "InferenceService"
    assert doc["metadata"]["name"] == "my-encoder-v1"  # a DNS-1123 label
    model = doc["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["protocolVersion"] == "v2"
    assert model["storageUri"] == "s3://CHANGE-ME/models" and "resources" not in model  # a CPU model: no GPU
    cuda = with_providers(encoder_profile, [{"name": "CUDAExecutionProvider", "options": {}}], "profile-cuda.json")
    result = _run(
        str(cuda),
        "-o",
        str(tmp_path / "gpu"),
        "--emit-inferenceservice",
        str(manifest),
        "--storage-uri",
        "gs://bucket/gpu",
    )
    assert result.exit_code == 0, result.output
    model = yaml.safe_load(manifest.read_text())["spec"]["predictor"]["model"]
    assert model["resources"]["limits"]["nvidia.com/gpu"] == 1 and model["storageUri"] == "gs://bucket/gpu"
