"""EngineOptions and GenerateOptions: the defaults, and every bad value refused with a message that names its setting."""

from __future__ import annotations

import pytest

from ortpilot.decode.options import (
    BASE,
    DEFAULT_LOOP,
    DEFAULT_MAX_NEW_TOKENS,
    EngineOptions,
    GenerateOptions,
    format_name,
)
from ortpilot.decode.sampling import SamplingConfig
from ortpilot.errors import UsageError


def test_defaults_are_one_format_a_cache_and_auto_speculation() -> None:
    options = EngineOptions()
    assert options.formats == (BASE,) and options.names == (BASE,)
    assert options.prefix_cache_bytes > 0 and options.speculation == "auto" and options.draft_tokens >= 1
    assert EngineOptions(formats=["int4", "x=/m.onnx"]).names == ("int4", "x")  # a list becomes a tuple
    assert format_name("fast=/tmp/m.onnx") == "fast" and format_name("int4") == "int4"
    assert options.to_dict()["formats"] == (BASE,)


def test_server_and_cli_defaults_are_the_engines() -> None:
    """`serve`'s decoder options and `generate`'s flags start from the engine's and the sampler's defaults."""
    import inspect

    from click.testing import CliRunner

    from ortpilot.cli.cmd_generate import command
    from ortpilot.decode.scheduler import Scheduler
    from ortpilot.gate.generation import GenerationGate
    from ortpilot.serve.options import DecoderOptions

    served = DecoderOptions()
    assert served.engine() == EngineOptions()
    assert EngineOptions().format_min_top1 == GenerationGate().min_top1
    scheduler = inspect.signature(Scheduler).parameters
    for name in ("max_streams", "max_queue", "prefill_chunk"):
        assert getattr(served, name) == scheduler[name].default, name
    help_text = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    for flag, value in (("--max-new-tokens", 32), ("--draft-tokens", 4), ("--top-p", 1.0), ("--speculation", "auto")):
        assert f"[default: {value}]" in help_text.split(flag, 1)[1].split("--", 1)[0], flag


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"formats": ()}, "formats is empty"),
        ({"formats": ("int4", "int4=/a.onnx")}, "formats names a weight format twice"),
        ({"format_min_top1": 1.5}, "format_min_top1 must be between 0 and 1"),
        ({"measure_rounds": 0}, "measure_rounds must be at least 1"),
        ({"prefix_cache_bytes": -1}, "prefix_cache_bytes must be 0 (off) or more"),
        ({"prefix_block": 1}, "prefix_block must be at least 2"),
        ({"speculation": "sometimes"}, "speculation must be one of auto, on, off"),
        ({"draft_tokens": 0}, "draft_tokens (the speculation length) must be at least 1"),
    ],
)
def test_bad_values_name_their_setting(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError) as err:
        EngineOptions(**kwargs)
    assert message in str(err.value)


def test_a_draft_longer_than_the_context_is_refused_unless_speculation_is_off() -> None:
    EngineOptions(draft_tokens=6).check_context(8)  # 1 prompt token + 6 drafted + 1 = 8
    with pytest.raises(UsageError, match=r"draft_tokens 7 \(the speculation length\) does not fit .* of 8 tokens"):
        EngineOptions(draft_tokens=7).check_context(8)
    EngineOptions(draft_tokens=7, speculation="off").check_context(8)


def test_generate_options_defaults_normalisation_and_json() -> None:
    import json

    options = GenerateOptions()
    assert options.max_new_tokens == DEFAULT_MAX_NEW_TOKENS and options.loop == DEFAULT_LOOP
    assert options.sampling is None and options.stop_tokens == () and options.speculation == "auto"
    sampled = GenerateOptions(sampling=SamplingConfig(temperature=0.7, seed=1), stop_tokens=[2, 3], max_length=64)
    assert sampled.stop_tokens == (2, 3)  # a list becomes a tuple
    assert GenerateOptions.from_dict(json.loads(json.dumps(sampled.to_dict()))) == sampled
    assert GenerateOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
        ({"loop": "fast"}, "Unknown loop 'fast'"),
        ({"speculation": "maybe"}, "speculation must be one of"),
        ({"draft_tokens": 0}, "draft_tokens"),
        ({"sampling": {"temperature": -1.0}}, "temperature must be a finite number >= 0"),
        ({"sampling": {"temperature": float("inf")}}, "temperature must be a finite number >= 0"),  # uniform noise
    ],
)
def test_a_bad_generate_request_is_refused_as_it_is_made(fields, said) -> None:
    with pytest.raises(UsageError, match=said):
        GenerateOptions(**fields)


def test_generate_takes_the_record_or_its_fields() -> None:
    from ortpilot.decode.generate import generate
    from ortpilot.models import make_decoder

    model = make_decoder()
    given = generate(model, [1, 2, 3], options=GenerateOptions(max_new_tokens=4, loop="plain"))
    assert given.tokens == generate(model, [1, 2, 3], 4, "plain").tokens and len(given.tokens[0]) == 4
    with pytest.raises(UsageError, match="not both"):
        generate(model, [1, 2, 3], 4, options=GenerateOptions())
    with pytest.raises(UsageError, match="Unknown arguments: colour"):
        generate(model, [1, 2, 3], colour="red")
