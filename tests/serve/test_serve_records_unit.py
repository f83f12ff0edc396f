"""The records that cross a Ray boundary: each survives to_dict/from_dict and pickling (what Ray does to a
deployment's arguments) unchanged, and each default is the one defaults.py defines."""

from __future__ import annotations

import pickle

import pytest

from ortpilot.serve import defaults
from ortpilot.serve.access import access_options
from ortpilot.serve.counts import RequestSnapshot
from ortpilot.serve.oip.app import replica_config
from ortpilot.serve.oip.config import Batching, ReplicaConfig
from ortpilot.serve.oip.metrics import BatchCounts, Heartbeat
from ortpilot.serve.oip.replicainfo import ReplicaInfo
from ortpilot.serve.openai.info import DecoderInfo, EngineSummary, StreamRecord
from ortpilot.serve.openai.metrics import EngineCounters, EngineHeartbeat, HistogramParts
from ortpilot.serve.openai.spec import DecoderSpec
from ortpilot.serve.openai.wire import ApiError, DecodeEvent, GenerationRequest
from ortpilot.serve.options import DecoderOptions, ModelSpec, ServeOptions, ServerOptions
from ortpilot.serve.records import AccessPolicy, RequestSettings, Timeouts


def _records(demo_paths) -> list:
    spec = ModelSpec("m", "model", str(demo_paths["encoder"]), "demo:encoder")
    server = ServerOptions(access=access_options(["k"], cors_origins=["https://a.example"]), debug_info=True)
    options = ServeOptions(replicas=2, autoscale=(1, 3), max_batch=4, batch_wait_ms=2.0, max_request_mb=3.0)
    return [
        spec,
        options,
        DecoderOptions(max_streams=2, formats=("base", "int4")),
        server.access.policy("127.0.0.1"),
        AccessPolicy(),
        server.requests(options),
        Timeouts(5, 77, 9),
        replica_config(spec, options, server, 2.0, "ortpilot"),
        DecoderSpec("d", "/m.onnx", "/t.json", "demo:decoder", DecoderOptions(max_queue=3), ("a note",)),
        GenerationRequest("chat", "d", messages=[{"role": "user", "content": "hi"}], stop=["x"], seed=3),
        DecodeEvent("end", finish_reason="stop", prompt_tokens=3, completion_tokens=2),
        Heartbeat(
            "m",
            "r",
            ReplicaInfo("r", "m", True, providers=("CPUExecutionProvider",), batching=Batching(4, 2.0)),
            BatchCounts().snapshot(),
            RequestSnapshot({"200": 1}, (1, 0), 0.01, 1),
        ),
        EngineHeartbeat(
            "d", "r", EngineCounters(decode_steps=3, rows_per_step=HistogramParts((("1", 2.0), ("+Inf", 3.0)), 4.0))
        ),
        DecoderInfo(
            "d",
            "demo:decoder",
            7,
            2,
            1.5,
            64,
            "tokenizer",
            ("a note",),
            EngineSummary(2, 3, 64, 16, 5, 9, 1.8, 4096, 0, ("base",), 0, "auto"),
            (StreamRecord(1, 3, 4, 0.0, 0.01, 0.03, 10.0, 0.05, "max_new_tokens"),),
        ),
        ApiError(429, "busy", kind="rate_limit_error", code="rate_limit_exceeded", retry_after_s=1).to_event(),
    ]


def test_every_record_round_trips_through_plain_data_and_pickle(demo_paths):
    for record in _records(demo_paths):
        again = type(record).from_dict(record.to_dict())
        assert again == record, type(record).__name__
        assert pickle.loads(pickle.dumps(record)) == record


def test_an_error_event_carries_the_whole_api_error():
    error = ApiError(429, "busy", kind="rate_limit_error", code="rate_limit_exceeded", retry_after_s=1)
    again = ApiError.from_event(pickle.loads(pickle.dumps(error.to_event())))
    assert (again.status, again.body(), again.headers()) == (429, error.body(), {"Retry-After": "1"})


def test_the_replica_config_carries_what_the_replica_reads(demo_paths):
    config = next(r for r in _records(demo_paths) if isinstance(r, ReplicaConfig))
    assert config.batching and config.requests.max_request_bytes == 3 * 2**20
    assert config.requests.access.auth and config.requests.access.digests and config.requests.debug_info
    assert [t.name for t in config.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert config.limits.rows  # the token table's rows, read from the graph by the driver
    assert config.facts.batching == Batching(4, 2.0) and config.facts.autoscale == (1, 3)
    assert config.facts.to_dict()["path"] == config.facts.path  # --debug-info: the facts name the file


def test_each_default_is_defined_once():
    assert ServeOptions().max_request_mb == RequestSettings().max_request_mb == defaults.DEFAULT_MAX_REQUEST_MB
    assert Timeouts().request_s == RequestSettings().request_timeout_s == defaults.DEFAULT_REQUEST_TIMEOUT_S
    assert (
        ServerOptions().port == defaults.DEFAULT_PORT
        and ServerOptions().max_header_kb == defaults.DEFAULT_MAX_HEADER_KB
    )
    assert [defaults.retry_delay_s(n) for n in range(defaults.REPLICA_RETRIES)] == [0.2, 0.4]


def test_the_cli_takes_its_defaults_from_the_records():
    from ortpilot.cli.cmd_serve import command

    given = {p.name: p.default for p in command.params}
    assert given["max_request_mb"] == defaults.DEFAULT_MAX_REQUEST_MB
    assert given["request_timeout"] == defaults.DEFAULT_REQUEST_TIMEOUT_S
    assert given["ingress"] == ServerOptions.ingress and given["max_streams"] == DecoderOptions.max_streams
    assert given["formats"] == "base" and given["chat_template"] == DecoderOptions.chat_template


@pytest.mark.parametrize("bad", [{"auth": True, "nope": 1}])
def test_an_unknown_field_is_refused_not_dropped(bad):
    with pytest.raises(TypeError):
        AccessPolicy.from_dict(bad)
