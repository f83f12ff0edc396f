"""serve.oip.replica without Ray: a model replica built from the records the driver sends, answering REST
and gRPC requests called directly, on real ORT sessions of the demo MLP (and the encoder's limits)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import onnxruntime as ort
import pytest
from unit_requests import GrpcContext, body, request

from ortpilot.serve.access import access_options
from ortpilot.serve.oip.app import replica_config
from ortpilot.serve.oip.grpc_codec import messages
from ortpilot.serve.oip.grpc_service import MalformedRequest
from ortpilot.serve.oip.replica import ModelReplica
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions

KEY = "unit-test-key"


def _replica(path, *, server: ServerOptions | None = None, **options) -> ModelReplica:
    spec = ModelSpec("m", "model", str(path), "demo:mlp")
    options = {"access_log": False, **options}
    config = replica_config(spec, ServeOptions(**options), server or ServerOptions(), 1.0, None)
    return ModelReplica(spec, config)


@pytest.fixture(scope="module")
def mlp(demo_paths) -> ModelReplica:
    return _replica(demo_paths["mlp"])


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def expected(demo_paths, x) -> np.ndarray:
    return ort.InferenceSession(str(demo_paths["mlp"]), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _infer_body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def test_rest_infer_answers_what_ort_computes(mlp, x, expected):
    response = asyncio.run(mlp(request("POST", "/v2/models/m/infer", _infer_body(x))))
    doc = body(response)
    assert response.status_code == 200, doc
    (out,) = doc["outputs"]
    assert out["name"] == "y" and out["shape"] == [2, 10]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 10), expected, rtol=1e-6)


def test_metadata_comes_from_the_config_and_hides_process_details(mlp):
    doc = body(asyncio.run(mlp(request("GET", "/v2/models/m"))))
    assert doc["name"] == "m" and doc["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    (info,) = doc["ortpilot"]["replicas"]
    assert info["verified"] and info["providers"][0] == "CPUExecutionProvider"
    assert "pid" not in info and "host" not in info  # --debug-info only


@pytest.mark.parametrize(
    "method, path, doc, status, words",
    [
        ("POST", "/v2/models/m/infer", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP99"}]}, 400, "FP99"),
        ("POST", "/v2/models/m/versions/7/infer", {"inputs": []}, 404, "no version '7'"),
        ("POST", "/v2/models/m", None, 405, "use GET"),
        ("GET", "/v2/models/m/nowhere", None, 404, "no route"),
        ("POST", "/v2/models/m/infer", {"inputs": [{"name": "y", "shape": [1, 64], "datatype": "FP32"}]}, 400, ""),
    ],
)
def test_bad_requests_get_the_protocols_error_shape(mlp, method, path, doc, status, words):
    response = asyncio.run(mlp(request(method, path, doc)))
    answer = body(response)
    assert response.status_code == status and isinstance(answer["error"], str) and words in answer["error"], answer
    if status == 405:  # the methods the path takes, as a header too
        assert response.headers["allow"] == "GET"


def test_a_body_over_the_limit_is_413_before_it_is_read(demo_paths, x):
    small = _replica(demo_paths["mlp"], max_request_mb=0.001)
    response = asyncio.run(small(request("POST", "/v2/models/m/infer", _infer_body(x))))
    assert response.status_code == 413 and "--max-request-mb" in body(response)["error"]


def test_keys_cors_and_counts_go_through_the_pipeline(demo_paths, x):
    access = access_options([KEY], cors_origins=["https://app.example"])
    keyed = _replica(demo_paths["mlp"], server=ServerOptions(access=access))
    refused = asyncio.run(keyed(request("POST", "/v2/models/m/infer", _infer_body(x))))
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    origin = {"origin": "https://app.example", "authorization": f"Bearer {KEY}"}
    ok = asyncio.run(keyed(request("POST", "/v2/models/m/infer", _infer_body(x), origin)))
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST"}
    assert asyncio.run(keyed(request("OPTIONS", "/v2/models/m/infer", None, preflight))).status_code == 204
    assert keyed.requests.snapshot().codes == {"401": 1, "200": 1, "204": 1}


def _grpc_request(x: np.ndarray, name: str = "m") -> object:
    pb = messages()
    req = pb.ModelInferRequest(model_name=name, id="r1")
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


def test_grpc_infer_and_its_guard(demo_paths, x, expected):
    import grpc

    keyed = _replica(demo_paths["mlp"], server=ServerOptions(access=access_options([KEY])))
    context = GrpcContext({"authorization": f"Bearer {KEY}"})
    answer = asyncio.run(keyed.ModelInfer(_grpc_request(x), context))
    assert context.code is None and answer.id == "r1" and list(answer.outputs[0].shape) == [2, 10]
    np.testing.assert_allclose(np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(2, 10), expected)
    for req, ctx, code in (
        (_grpc_request(x), GrpcContext(), grpc.StatusCode.UNAUTHENTICATED),
        (MalformedRequest("ModelInfer", "bad"), GrpcContext({"authorization": f"Bearer {KEY}"}), "INVALID_ARGUMENT"),
        (_grpc_request(x, "other"), GrpcContext({"authorization": f"Bearer {KEY}"}), grpc.StatusCode.NOT_FOUND),
    ):
        asyncio.run(keyed.ModelInfer(req, ctx))
        assert ctx.code == (getattr(grpc.StatusCode, code) if isinstance(code, str) else code), ctx.details
    live = GrpcContext()
    assert asyncio.run(keyed.ServerLive(messages().ServerLiveRequest(), live)).live and live.code is None
    # Every gRPC call goes through the pipeline and counts, as every REST request does (ServerLive too).
    assert keyed.requests.snapshot().codes == {"200": 2, "401": 1, "400": 1, "404": 1}


def test_grpc_calls_get_an_access_log_line(demo_paths, x, capfd):
    logged = _replica(demo_paths["mlp"], access_log=True)
    asyncio.run(logged.ModelInfer(_grpc_request(x), GrpcContext()))
    asyncio.run(logged.ModelMetadata(messages().ModelMetadataRequest(name="m", version="7"), GrpcContext()))
    lines = [ln for ln in capfd.readouterr().err.splitlines() if '"gRPC ' in ln]
    assert len(lines) == 2 and '"gRPC ModelInfer" 200 - ' in lines[0] and '"gRPC ModelMetadata" 404 - ' in lines[1]
    assert logged.requests.snapshot().codes == {"200": 1, "404": 1}


def test_unserved_rpcs_are_unimplemented_not_unknown(mlp):
    import grpc

    context = GrpcContext()
    before = mlp.requests.snapshot().codes.get("501", 0)
    asyncio.run(mlp.ModelConfig(messages().ModelConfigRequest(), context))
    assert context.code == grpc.StatusCode.UNIMPLEMENTED and "ModelInfer" in context.details
    assert mlp.requests.snapshot().codes["501"] == before + 1  # through the pipeline: counted


def test_concurrent_requests_share_a_batch_and_each_gets_its_rows(demo_paths, x, expected):
    batched = _replica(demo_paths["mlp"], max_batch=4, batch_wait_ms=20)
    assert batched.batching

    async def main():
        return await asyncio.gather(*(batched.infer({"x": x[i : i + 1]}) for i in (0, 1, 0, 1)))

    results = asyncio.run(main())
    for i, result in zip((0, 1, 0, 1), results):
        np.testing.assert_allclose(result.outputs["y"], expected[i : i + 1], rtol=1e-6)
    assert batched.runner.counts.snapshot().sum == 4 and batched.runner.counts.snapshot().count < 4


def test_the_iobinding_path_gives_the_same_outputs(demo_paths, x, expected):
    bound = _replica(demo_paths["mlp"])
    bound.runner.iobinding = True  # what a profile tuned with IOBinding turns on
    result = asyncio.run(bound.infer({"x": x}))
    np.testing.assert_allclose(result.outputs["y"], expected, rtol=1e-6)


def test_encoder_limits_refuse_ids_past_the_table_before_ort_runs(demo_paths):
    spec = ModelSpec("enc", "model", str(demo_paths["encoder"]), "demo:encoder")
    config = replica_config(spec, ServeOptions(access_log=False), ServerOptions(), 1.0, None)
    enc = ModelReplica(spec, config)
    ids = np.full((1, 8), 5000, np.int64)
    result = asyncio.run(enc.infer({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}))
    assert result.status == 400 and "1000 rows" in result.error, result


BUILD_OUTSIDE_RAY = """
import sys, time
from ortpilot.serve.oip.app import replica_config
from ortpilot.serve.oip.replica import ModelReplica
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions

spec = ModelSpec("m", "model", sys.argv[1], "demo:mlp")
start = time.monotonic()
replica = ModelReplica(spec, replica_config(spec, ServeOptions(access_log=False), ServerOptions(), 1.0, None))
print(repr(replica.info.node), round(time.monotonic() - start, 1))
"""


def test_a_replica_built_outside_ray_never_joins_a_cluster(demo_paths):
    """Outside Ray a replica's node is "", not a question to Ray: Ray would initialize itself and join
    RAY_ADDRESS (or the cluster this machine started last), waiting without end for a GCS that is gone."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed
    env = {**os.environ, "RAY_ADDRESS": dead}
    out = subprocess.run(
        [sys.executable, "-c", BUILD_OUTSIDE_RAY, str(demo_paths["mlp"])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "''", out.stdout
