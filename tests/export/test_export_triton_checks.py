"""The checks behind the export: what protobuf parsing and the backend's key lists catch."""

from __future__ import annotations

import pytest

from ortpilot.errors import VerificationError
from ortpilot.export import export_triton
from ortpilot.export.triton_config import check_config, parse_config
from ortpilot.export.triton_session import read_config


@pytest.fixture
def exported(encoder_profile, tmp_path):
    return export_triton(encoder_profile, tmp_path / "repo", name="encoder").model_dir


def test_written_config_passes_the_checks(exported):
    assert check_config(read_config(exported), exported) == []


def test_a_parse_failure_is_a_verification_error_exit_1(tmp_path):
    with pytest.raises(VerificationError) as err:
        parse_config('name: "x"\ninput { nme: "a" }\n', tmp_path / "config.pbtxt")
    assert err.value.exit_code == 1 and "bug in ortpilot" in str(err.value)


def test_keys_values_and_accelerators_the_backend_would_ignore_or_refuse_are_found(exported):
    text = (exported / "config.pbtxt").read_text()
    text = text.replace('key: "intra_op_thread_count"', 'key: "intra_op_threads"')  # a typo: silently ignored
    text = text.replace('string_value: "0"', 'string_value: "maybe"', 1)  # enable_mem_arena is a bool
    text += (
        'optimization { graph { level: 3 } execution_accelerators { cpu_execution_accelerator { name: "dnnl" }'
        ' gpu_execution_accelerator { name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } '
        'parameters { key: "trt_fp16_enable" value: "1" } } } }\n'
    )
    problems = check_config(parse_config(text), exported)
    said = " | ".join(problems)
    for fragment in (
        "'intra_op_threads' is not one the backend reads",
        "'enable_mem_arena' = 'maybe'",
        "graph.level 3",
        "'dnnl' is not one the backend knows",
        "precision_mode 'FP8'",
        "'trt_fp16_enable' is unknown",
        "not KIND_GPU",
    ):
        assert fragment in said, (fragment, problems)


def test_a_missing_or_short_warmup_file_is_found(exported):
    (exported / "warmup" / "input_ids").write_bytes(b"\0" * 8)
    (exported / "warmup" / "attention_mask").unlink()
    said = " | ".join(check_config(read_config(exported), exported))
    assert "warmup/input_ids holds 8 bytes, not 1024" in said and "warmup/attention_mask of input" in said


def test_warmup_dims_that_do_not_fit_the_declared_input_are_found(exported):
    text = (exported / "config.pbtxt").read_text()
    text = text.replace(
        'dims: 128\n      input_data_file: "input_ids"', 'dims: 64\n      dims: 2\n      input_data_file: "input_ids"'
    )
    said = " | ".join(check_config(parse_config(text), exported))
    assert "warmup input 'input_ids' has dims [64, 2], the config declares [-1]" in said
