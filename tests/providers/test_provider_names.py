"""Provider resolution and the EP gotcha defaults (option mapping is testable without the EPs)."""

from __future__ import annotations

import pytest

from ortpilot.errors import ProviderError
from ortpilot.providers import ProviderSpec, parse_provider_arg, resolve_providers
from ortpilot.providers.defaults import session_overrides
from ortpilot.session import SessionSettings
from ortpilot.session.verified import effective_settings


@pytest.mark.parametrize(
    "text,full",
    [
        ("cpu", "CPUExecutionProvider"),
        ("CUDA", "CUDAExecutionProvider"),
        ("TensorRT", "TensorrtExecutionProvider"),
        ("openvino", "OpenVINOExecutionProvider"),
        ("coreml", "CoreMLExecutionProvider"),
        ("DML", "DmlExecutionProvider"),
        ("webgpu", "WebGpuExecutionProvider"),
        ("qnn", "QNNExecutionProvider"),
        ("CUDAExecutionProvider", "CUDAExecutionProvider"),
        ("cudaexecutionprovider", "CUDAExecutionProvider"),
    ],
)
def test_short_and_full_names(text, full):
    assert parse_provider_arg(text).name == full


def test_cli_options_parse():
    spec = parse_provider_arg("cuda:device_id=1,cudnn_conv_algo_search=EXHAUSTIVE")
    assert spec.options == {"device_id": "1", "cudnn_conv_algo_search": "EXHAUSTIVE"}
    assert str(spec).startswith("cuda:")


@pytest.mark.parametrize("bad", ["cuda:device_id", "cuda:=1", "", "nosuch", "cuda:device_id=1,"])
def test_malformed_or_unknown_is_exit_2_with_valid_names(bad):
    with pytest.raises(ProviderError) as info:
        parse_provider_arg(bad)
    assert info.value.exit_code == 2
    text = str(info.value)
    assert ("cpu, cuda, tensorrt" in text) or ("KEY=VALUE" in text)


def test_python_forms_and_user_options_win():
    specs = resolve_providers([("cuda", {"device_id": 3}), {"name": "cpu", "options": {}}])
    assert specs[0] == ProviderSpec("CUDAExecutionProvider", {"device_id": "3", "cudnn_conv_algo_search": "HEURISTIC"})
    assert specs[1].name == "CPUExecutionProvider"


def test_a_tuple_is_a_chain_unless_it_is_one_name_options_pair():
    # click's multiple=True and frozen records hold chains as tuples; only (str, mapping) is one provider
    assert [s.name for s in resolve_providers(("cpu",))] == ["CPUExecutionProvider"]
    assert [s.name for s in resolve_providers(("cuda", "cpu"))] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert resolve_providers(("cuda", {"device_id": 1}))[0].options["device_id"] == "1"


def test_empty_chain_is_cpu_and_duplicates_drop():
    assert [s.name for s in resolve_providers(None)] == ["CPUExecutionProvider"]
    assert [s.name for s in resolve_providers(["cpu", "CPU"])] == ["CPUExecutionProvider"]


def test_tensorrt_gets_engine_cache_and_cuda_after_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTPILOT_CACHE_DIR", str(tmp_path))
    specs = resolve_providers(["tensorrt", "cpu"])
    assert [s.name for s in specs] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt = specs[0].options
    assert trt["trt_engine_cache_enable"] == "1"
    assert trt["trt_engine_cache_path"].startswith(str(tmp_path))
    assert specs[1].options["device_id"] == "0"
    # graph optimization is lowered for TensorRT, and only lowered
    assert effective_settings(SessionSettings(level="all"), specs).level == "basic"
    assert effective_settings(SessionSettings(level="disable"), specs).level == "disable"


def test_openvino_coreml_qnn_dml_defaults():
    ov, coreml, qnn, dml = resolve_providers(["openvino", "coreml", "qnn", "dml"])
    assert ov.options["device_type"] == "CPU" and ov.options["cache_dir"]
    assert coreml.options["ModelFormat"] == "MLProgram"
    assert qnn.options["backend_type"] == "htp"
    settings = effective_settings(SessionSettings(), [dml])
    assert settings.enable_mem_pattern is False and settings.execution_mode == "sequential"
    assert {o.setting for o in session_overrides([dml])} == {"enable_mem_pattern", "execution_mode"}


def test_ep_library_option_is_not_passed_to_ort():
    spec = parse_provider_arg("webgpu:ep_library=/x/lib.so,foo=1")
    assert spec.as_ort() == ("WebGpuExecutionProvider", {"foo": "1"})


def test_cpu_ep_options_are_refused_because_ort_drops_them_without_a_word(tmp_path):
    """ORT's CPU EP reads no provider options: a real session reports none back, so ortpilot refuses them."""
    import onnxruntime as ort

    from ortpilot.models import write_demo_models

    model = write_demo_models(tmp_path)["mlp"]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"], provider_options=[{"foo": "bar"}])
    assert session.get_provider_options()["CPUExecutionProvider"] == {}  # what ORT did with it: nothing
    for given in ("cpu:foo=bar", ("cpu", {"intra_op_num_threads": 1}), {"name": "cpu", "options": {"use_arena": 0}}):
        with pytest.raises(ProviderError, match="The CPU EP takes no provider options"):
            resolve_providers([given])
    assert resolve_providers(["cpu"]) == [ProviderSpec("CPUExecutionProvider", {})]
