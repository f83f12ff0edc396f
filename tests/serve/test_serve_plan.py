"""serve.plan: what one server serves (OIP models or OpenAI decoders), decided and checked before Ray."""

from __future__ import annotations

import pytest

from ortpilot.errors import UsageError
from ortpilot.serve.options import DecoderOptions, ServeOptions
from ortpilot.serve.plan import OIP, OPENAI, plan


def test_plain_models_are_served_over_the_open_inference_protocol():
    served = plan(["demo:mlp", "demo:cnn"], ["a", "b"])
    assert served.protocol == OIP and [m.name for m in served.models] == ["a", "b"]


def test_a_decoder_is_served_behind_the_openai_api_with_its_own_tokenizer():
    served = plan(["demo:decoder"], (), ServeOptions(replicas=2), DecoderOptions(max_streams=4))
    (spec,) = served.models
    assert served.protocol == OPENAI and spec.name == "decoder" and spec.tokenizer.endswith("tokenizer.json")
    assert spec.options.max_streams == 4 and served.options.replicas == 2


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"options": ServeOptions(max_batch=4)}, "--max-batch do(es) not apply to decoders"),
        ({"options": ServeOptions(autoscale=(1, 2))}, "--autoscale do(es) not apply"),
        ({"manifest": True}, "--emit-rayservice do(es) not apply"),
    ],
)
def test_settings_a_decoder_has_no_use_for_are_refused_by_their_flags(kwargs, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan(["demo:decoder"], **kwargs)


def test_decoder_options_are_checked_where_they_are_made():
    with pytest.raises(UsageError, match="--chat-template"):
        DecoderOptions(chat_template="jinja")
    with pytest.raises(UsageError, match="--max-streams must be at least 1"):
        DecoderOptions(max_streams=0)
