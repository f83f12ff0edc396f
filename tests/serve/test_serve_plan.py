"""serve.plan: what one server serves (OIP models or OpenAI decoders), decided and checked before Ray."""

from __future__ import annotations

import pytest

from ortpilot.errors import UsageError
from ortpilot.serve.options import DecoderOptions, ServeOptions
from ortpilot.serve.plan import OIP, OPENAI, plan


def test_plain_models_are_served_over_the_open_inference_protocol():
    served = plan(["demo:mlp", "demo:cnn"], ["a", "b"])
    assert served.protocol == OIP and [m.name for m in served.models] == ["a", "b"]


def test_a_text_folder_is_served_over_the_open_inference_protocol_with_its_folder(tmp_path):
    from ortpilot.models import text_folder

    folder = text_folder(tmp_path / "embed", "embed")
    served = plan([str(folder), "demo:mlp"])
    assert served.protocol == OIP and served.models[0].folder == str(folder.resolve())
    assert served.models[1].folder == ""


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
        ({"options": ServeOptions(text={"batch": 8, "truncate": False})}, "--text-batch, --no-truncate do(es) not"),
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


@pytest.mark.parametrize(
    ("host", "base_url", "grpc", "loopback"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000", "127.0.0.1:8001", True),
        ("::1", "http://[::1]:8000", "[::1]:8001", True),
        ("0.0.0.0", "http://0.0.0.0:8000", "0.0.0.0:8001", False),
        ("fd00::5", "http://[fd00::5]:8000", "[fd00::5]:8001", False),
    ],
)
def test_a_server_names_its_addresses_as_clients_dial_them(host, base_url, grpc, loopback):
    """The URL and the gRPC address a server prints: an IPv6 host in brackets (a gRPC client reads
    ``::1:8001`` as a host with no port); loopback is the one rule Ray clients and access checks use."""
    from ortpilot.rayenv import is_loopback_host
    from ortpilot.serve.access import AccessOptions
    from ortpilot.serve.options import ServerOptions

    server = ServerOptions(host=host, port=8000, grpc_port=8001)
    assert (server.base_url, server.netloc(8001), server.loopback) == (base_url, grpc, loopback)
    assert is_loopback_host(host) is loopback
    assert bool(AccessOptions().warnings(host)) is not loopback
