"""Golden config.pbtxt files for CPU, CUDA, TensorRT and OpenVINO profiles of the demo encoder.

Each GPU/OpenVINO profile is the CPU profile with its providers edited (this machine has none
of them). Every golden file is parsed with Triton's ``model_config_pb2``, and what the backend
would build from it is read back through ``triton_session``. After a deliberate change:
``ORTPILOT_UPDATE_GOLDEN=1 pytest tests/export/test_export_triton_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from export_profiles import CPU, with_providers
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ortpilot.export import export_triton
from ortpilot.export.triton_session import backend_providers, backend_settings

GOLDEN = Path(__file__).parent / "golden"
PROVIDERS = {
    "cpu": [{"name": CPU, "options": {}}],
    "cuda": [{"name": "CUDAExecutionProvider", "options": {}}],
    "tensorrt": [{"name": "TensorrtExecutionProvider", "options": {"trt_fp16_enable": "1"}}],
    "openvino": [{"name": "OpenVINOExecutionProvider", "options": {"device_type": "CPU"}}, {"name": CPU}],
}


def _export(encoder_profile: Path, tmp_path: Path, key: str):
    profile = with_providers(encoder_profile, PROVIDERS[key], f"profile-{key}.json")
    return export_triton(profile, tmp_path / "repo", name="encoder")


@pytest.mark.parametrize("key", list(PROVIDERS))
def test_config_matches_golden_file_and_parses(key, encoder_profile, tmp_path):
    result = _export(encoder_profile, tmp_path, key)
    written = (result.model_dir / "config.pbtxt").read_text()
    golden = GOLDEN / f"{key}.pbtxt"
    if os.environ.get("ORTPILOT_UPDATE_GOLDEN"):
        golden.write_text(written)
    assert written == golden.read_text(), f"{golden.name} differs; rerun with ORTPILOT_UPDATE_GOLDEN=1 if intended"
    config = text_format.Parse(golden.read_text(), model_config_pb2.ModelConfig())
    assert config.name == "encoder" and config.backend == "onnxruntime"
    assert config.max_batch_size == 4  # input_ids [batch, sequence]: the batch dim is Triton's
    assert [list(i.dims) for i in config.input] == [[-1]] * 3
    assert list(config.output[0].dims) == [-1, 128]
    assert config.HasField("dynamic_batching")
    warmup = config.model_warmup[0]
    assert warmup.batch_size == 1 and sorted(warmup.inputs) == ["attention_mask", "input_ids", "token_type_ids"]
    assert all(list(i.dims) == [128] for i in warmup.inputs.values())
    params = {k: v.string_value for k, v in config.parameters.items()}
    # The profile's settings survive: one intra-op thread, the CPU arena off.
    assert params["intra_op_thread_count"] == "1" and params["enable_mem_arena"] == "0"
    assert params["execution_mode"] == "0"


def test_each_provider_maps_to_the_backend_accelerators(encoder_profile, tmp_path):
    configs = {
        key: text_format.Parse((GOLDEN / f"{key}.pbtxt").read_text(), model_config_pb2.ModelConfig())
        for key in PROVIDERS
    }
    kinds = {key: model_config_pb2.ModelInstanceGroup.Kind.Name(c.instance_group[0].kind) for key, c in configs.items()}
    assert kinds == {"cpu": "KIND_CPU", "cuda": "KIND_GPU", "tensorrt": "KIND_GPU", "openvino": "KIND_CPU"}
    accelerators = {
        key: (
            [a.name for a in c.optimization.execution_accelerators.gpu_execution_accelerator],
            [a.name for a in c.optimization.execution_accelerators.cpu_execution_accelerator],
        )
        for key, c in configs.items()
    }
    assert accelerators == {
        "cpu": ([], []),
        "cuda": (["cuda"], []),
        "tensorrt": (["tensorrt", "cuda"], []),
        "openvino": ([], ["openvino"]),
    }
    # TensorRT lowers the level to basic (ortpilot's gotcha default), which Triton spells -1.
    assert configs["tensorrt"].optimization.graph.level == -1
    assert not configs["cpu"].optimization.HasField("graph")  # level all: no graph section
    trt = dict(configs["tensorrt"].optimization.execution_accelerators.gpu_execution_accelerator[0].parameters)
    assert trt["precision_mode"] == "FP16" and trt["trt_engine_cache_enable"] == "1"
    assert trt["trt_engine_cache_path"] == "/tmp/ortpilot-trt-cache/encoder"  # not this machine's cache


def test_the_backend_builds_the_profiles_session_from_each_config():
    """Read back as the backend would: the CUDA EP gets the profile's HEURISTIC conv search even
    though the backend's deprecated model-level keys override the cuda accelerator's own."""
    configs = {
        key: text_format.Parse((GOLDEN / f"{key}.pbtxt").read_text(), model_config_pb2.ModelConfig())
        for key in PROVIDERS
    }
    chains = {key: backend_providers(c) for key, c in configs.items()}
    assert [name for name, _ in chains["cpu"]] == [CPU]
    assert [name for name, _ in chains["openvino"]] == ["OpenVINOExecutionProvider", CPU]
    assert [name for name, _ in chains["tensorrt"]] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", CPU]
    cuda = dict(chains["cuda"])["CUDAExecutionProvider"]
    assert cuda["cudnn_conv_algo_search"] == "HEURISTIC" and cuda["device_id"] == "0"
    assert dict(chains["tensorrt"])["TensorrtExecutionProvider"]["trt_fp16_enable"] == "1"
    settings = backend_settings(configs["cpu"])
    assert (settings.level, settings.intra_op_threads, settings.enable_cpu_mem_arena) == ("all", 1, False)
    assert backend_settings(configs["tensorrt"]).level == "basic"


def test_losses_name_what_triton_cannot_express(encoder_profile, tmp_path):
    losses = {
        key: {loss.setting: loss for loss in _export(encoder_profile, tmp_path / key, key).losses}
        for key in ("cpu", "tensorrt", "openvino")
    }
    spin = "session_settings.config_entries[session.intra_op.allow_spinning]"
    assert spin in losses["cpu"] and "spin" in losses["cpu"][spin].consequence
    assert {"placement", "onnxruntime", "machine", "max_batch_size"} <= set(losses["cpu"])
    assert "providers.TensorRT.trt_engine_cache_path" in losses["tensorrt"]
    assert "providers.OpenVINO.device_type" in losses["openvino"]
    notes = (tmp_path / "cpu" / "repo" / "encoder" / "ORTPILOT.md").read_text()
    assert "## What is lost" in notes and "allow_spinning" in notes and "placement" in notes
