"""serve.openai.deployment, .server and .metrics without a running Ray: the application as Ray Serve would
deploy it, the refusals before Ray starts, and the engine counters summed for /metrics."""

from __future__ import annotations

import pytest

from ortpilot.errors import UsageError
from ortpilot.serve.openai.deployment import INGRESS_NAME, openai_deployment
from ortpilot.serve.openai.metrics import DecoderMetrics, EngineCounters, EngineHeartbeat, HistogramParts
from ortpilot.serve.openai.server import run_openai_server
from ortpilot.serve.openai.spec import DecoderSpec
from ortpilot.serve.options import DecoderOptions, ServeOptions, ServerOptions
from ortpilot.serve.records import RequestSettings

pytest.importorskip("ray.serve")


def test_the_application_binds_records_not_dicts():
    spec = DecoderSpec("d", "/m.onnx", "/t.json", options=DecoderOptions(max_streams=3, max_queue=5))
    settings = RequestSettings(max_request_mb=2.0)
    app = openai_deployment([spec], replicas=2, cpu_budget=4, settings=settings)
    ingress = app._bound_deployment
    assert ingress.name == INGRESS_NAME and ingress.init_args[1] == settings
    decoder = ingress.init_args[0]["d"]._bound_deployment
    assert decoder.init_args == (spec, 2) and decoder.num_replicas == 2
    assert decoder.max_ongoing_requests == 3 + 5 + 8
    # one failed start per replica before Ray gives the deployment up (serve.defaults.start_tries)
    assert decoder._deployment_config.max_constructor_retry_count == 2


def test_grpc_port_and_bad_replicas_are_refused_before_ray_starts():
    spec = DecoderSpec("d", "/m.onnx", "/t.json")
    with pytest.raises(UsageError, match="--grpc-port"):
        run_openai_server([spec], ServeOptions(), ServerOptions(grpc_port=9123))
    with pytest.raises(UsageError, match="--replicas"):
        openai_deployment([spec], replicas=0)


def test_engine_counters_are_summed_per_model():
    metrics = DecoderMetrics(["d"])
    ttft = HistogramParts((("0.1", 1.0), ("+Inf", 2.0)), 0.3)
    metrics.report(EngineHeartbeat("d", "r1", EngineCounters(decode_steps=3, ttft_seconds=ttft)))
    metrics.report(
        EngineHeartbeat("d", "r2", EngineCounters(decode_steps=4, ttft_seconds=ttft, format_steps={"int4": 2}))
    )
    metrics.observe("d", 200, 0.01)
    metrics.observe("zzz", 404, 0.01)
    text = metrics.render()[0].decode()
    assert 'ortpilot_requests_total{code="200",model="d"} 1.0' in text
    assert 'model="(unknown)"' in text and 'ortpilot_decode_decode_steps_total{model="d"} 7.0' in text
    assert 'ortpilot_decode_ttft_seconds_bucket{le="+Inf",model="d"} 4.0' in text
    assert 'ortpilot_decode_format_steps_total{format="int4",model="d"} 2.0' in text
    _, reports = metrics.snapshot()
    assert sorted(alive for _, _, alive in reports) == [True, True]


def test_a_kv_buffer_no_machine_holds_is_refused_before_ray_starts():
    from ortpilot.serve.openai.spec import prepare_decoder

    with pytest.raises(UsageError, match=r"KV buffer of 10,000,000 stream\(s\) .* lower max_streams \(--max-streams\)"):
        prepare_decoder("demo:decoder", "d", DecoderOptions(max_streams=10_000_000))
