"""The serve package's plain parts, without a running server: the protocol codec, options, the
KubeRay manifest, and that only the serve modules import Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from ortpilot.errors import InputError, UsageError, VerificationError
from ortpilot.serve.oip.codec import decode_request, encode_response, tensor_metadata
from ortpilot.serve.options import ServeOptions, parse_autoscale, resolve_models


def test_binary_and_json_tensors_decode_to_the_same_arrays_and_encode_back():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([[1, 2]], dtype=np.int64)
    head = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
                {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    req = decode_request(head + x.tobytes(), len(head))
    assert req.feeds["x"].tobytes() == x.tobytes() and req.feeds["ids"].tobytes() == ids.tobytes()
    assert req.outputs == ["y"] and req.binary_outputs == {"y"}
    body, length = encode_response("m", {"y": x, "z": ids}, {"y"})
    doc = json.loads(body[:length])
    assert body[length:] == x.tobytes()
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == x.nbytes and doc["outputs"][1]["data"] == [1, 2]


@pytest.mark.parametrize(
    "body, header, message",
    [
        (b"\xff\xfe", None, "not valid JSON"),
        (b'{"inputs": "caf\xe9"}', None, r"not valid JSON \(it is not UTF-8: byte 15 \(0xe9\)"),
        (b'{"inputs": 3}', None, 'no "inputs" list'),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP99", "data": [1, 2]}]}', None, "FP99"),
        (b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}', None, "non-negative"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "INT64", "data": ["a", "b"]}]}', None, "cannot be read"),
        (
            b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}',
            None,
            "binary_data_size",
        ),
        (b'{"inputs": []}', 99, "Inference-Header-Content-Length is 99"),
        (
            b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [0.5, 1e39]}]}',
            None,
            r"element 1 \(1e\+39\) is outside FP32's range",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [2], "datatype": "BYTES", "data": [1, 2]}]}',
            None,
            r"element 0 is a number: BYTES elements are strings\. If the input takes numbers, declare its datatype",
        ),
    ],
)
def test_undecodable_requests_are_input_errors_naming_the_problem(body, header, message):
    with pytest.raises(InputError, match=message):
        decode_request(body, header)


def test_metadata_uses_the_exports_datatypes_and_the_batch_rule(demo_paths):
    from ortpilot.modelio import load_model

    inputs, outputs, batch = tensor_metadata(load_model(demo_paths["encoder"]))
    assert {i["datatype"] for i in inputs} == {"INT64"} and outputs[0]["datatype"] == "FP32"
    assert all(i["shape"][0] == -1 for i in inputs) and batch


def test_options_and_model_names(tmp_path, demo_paths):
    assert parse_autoscale("1:4") == (1, 4)
    with pytest.raises(UsageError, match="MIN:MAX"):
        parse_autoscale("4")
    with pytest.raises(UsageError, match="1 <= MIN <= MAX"):
        ServeOptions(autoscale=(3, 1))
    with pytest.raises(UsageError, match="one per"):
        resolve_models(["demo:mlp", "demo:cnn"], ["a"])
    with pytest.raises(UsageError, match="served as 'mlp'"):
        resolve_models(["demo:mlp", str(demo_paths["mlp"])], ["mlp", "mlp"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="without profile.json"):
        resolve_models([str(tmp_path / "empty")])
    assert ServeOptions().replica_cpus(models=1, budget=2) == 2.0
    assert ServeOptions(replicas=2).replica_cpus(models=1, budget=2) == 1.0


def test_rayservice_manifest_round_trips_and_checks_kuberays_fields(tmp_path, demo_paths):
    from ortpilot.serve.oip.rayservice import BUILDER, check_manifest, write_rayservice

    specs = resolve_models(["demo:encoder", "demo:mlp"], ["enc", "mlp"])
    options = ServeOptions(autoscale=(1, 3), cpus_per_replica=1, max_batch=8)
    path = write_rayservice(tmp_path / "rayservice.yaml", specs, options, port=8000)
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    apps = {a["name"]: a for a in serve_config["applications"]}
    assert set(apps) == {"enc", "mlp", "ortpilot"}
    assert apps["enc"]["import_path"] == BUILDER and apps["enc"]["route_prefix"] == "/v2/models/enc"
    assert apps["enc"]["args"]["name"] == "enc" and apps["enc"]["args"]["autoscale"] == "1:3"
    assert apps["ortpilot"]["route_prefix"] == "/" and apps["ortpilot"]["args"]["names"] == ["enc", "mlp"]
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "RAY_SERVE_ENABLE_HA_PROXY", "value": "1"} in head["env"]
    from ortpilot.serve.oip.app import build, build_server

    for app in apps.values():  # each application builds from its own args, as Serve would build it
        (build_server if app["name"] == "ortpilot" else build)(app["args"])
    workers = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (workers["minReplicas"], workers["replicas"], workers["maxReplicas"]) == (2, 2, 6)
    assert workers["rayStartParams"] == {"num-cpus": "1"}
    doc["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    broken = yaml.safe_load(doc["spec"]["serveConfigV2"])
    del broken["applications"][0]["import_path"]
    doc["spec"]["serveConfigV2"] = yaml.safe_dump(broken)
    with pytest.raises(VerificationError, match="map\\[string\\]string.*not a valid Serve config"):
        check_manifest(yaml.safe_dump(doc))


def test_the_builders_and_the_library_give_ray_serve_applications(demo_paths):
    from ray.serve import Application, RunTarget

    import ortpilot.serve
    from ortpilot.serve.oip.app import build, build_server

    assert isinstance(ortpilot.serve.deployment("demo:mlp", replicas=2), Application)
    with pytest.raises(UsageError, match="one model's application"):
        ortpilot.serve.deployment(["demo:mlp", "demo:cnn"])
    targets = ortpilot.serve.applications(["demo:mlp", "demo:cnn"])
    assert all(isinstance(t, RunTarget) for t in targets)
    # one name as a string names the model (not one model per character)
    named = ortpilot.serve.applications(Path(demo_paths["mlp"]), "mymodel")
    assert [(t.name, t.route_prefix) for t in named] == [("mymodel", "/v2/models/mymodel"), ("ortpilot", "/")]
    assert [(t.name, t.route_prefix) for t in targets] == [
        ("mlp", "/v2/models/mlp"),
        ("cnn", "/v2/models/cnn"),
        ("ortpilot", "/"),
    ]
    assert isinstance(build({"profile": str(demo_paths["mlp"]), "name": "m", "autoscale": "1:2"}), Application)
    assert isinstance(build_server({"profiles": [str(demo_paths["mlp"])], "names": ["m"]}), Application)
    with pytest.raises(UsageError, match="server-wide application"):
        ortpilot.serve.applications(["demo:mlp"], ["ortpilot"])


def test_only_the_serve_modules_import_ray():
    code = (
        "import sys, ortpilot, ortpilot.serve, ortpilot.serve.options, ortpilot.tuning, ortpilot.cli.main, "
        "ortpilot.fleet, ortpilot.fleet.run, ortpilot.fleet.cluster, ortpilot.fleet.nodes, ortpilot.fleet.remote; "
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_a_response_cancelled_under_a_live_call_counts_as_its_replica_gone_but_the_calls_own_cancel_does_not():
    """How a relayed call in flight on a killed replica can end: the awaited response is cancelled while the
    relaying task is not (retried elsewhere); a task cancelled itself (its client left) must stop."""
    import asyncio

    from ortpilot.serve.http import replica_gone

    async def awaiting(cancel_the_response: bool) -> bool | str:
        response = asyncio.get_running_loop().create_future()
        if cancel_the_response:
            asyncio.get_running_loop().call_later(0.01, response.cancel)
        try:
            await response
        except asyncio.CancelledError as exc:
            return replica_gone(exc)
        return "answered"

    async def main() -> tuple[bool | str, bool | str]:
        under = await asyncio.create_task(awaiting(True))
        own = asyncio.create_task(awaiting(False))
        await asyncio.sleep(0.01)
        own.cancel()
        return under, await own

    assert asyncio.run(main()) == (True, False)
    assert replica_gone(ValueError("a bad request")) is False


def test_an_unknown_method_is_answered_by_haproxy_in_the_protocols_shape(tmp_path):
    from ortpilot.serve.haproxy import METHODS, write_wrapper
    from ortpilot.serve.records import Timeouts

    for protocol in ("oip", "openai"):
        folder = tmp_path / protocol
        folder.mkdir()
        write_wrapper(folder, "/bin/true", Timeouts(), protocol=protocol)
        script = (folder / "rewrite.sed").read_text()
        assert f"http-request return status 501 content-type application/json file {folder / 'e501.json'} " in script
        assert f"unless {{ method {' '.join(METHODS)} }}" in script
        body = json.loads((folder / "e501.json").read_bytes())
        message = body["error"] if protocol == "oip" else body["error"]["message"]
        assert "GET, HEAD, POST" in message, body


def test_a_grpc_message_that_does_not_parse_reaches_the_servicer_as_malformed():
    import grpc
    from tritonclient.grpc import service_pb2

    from ortpilot.serve.oip.grpc_service import MalformedRequest, _lenient

    handler = grpc.unary_unary_rpc_method_handler(
        lambda request, context: None, request_deserializer=service_pb2.ModelInferRequest.FromString
    )
    lenient = _lenient("ModelInfer", handler)
    good = service_pb2.ModelInferRequest(model_name="m")
    assert lenient.request_deserializer(good.SerializeToString()) == good
    bad = lenient.request_deserializer(b"\x0a\xff\xff")
    assert isinstance(bad, MalformedRequest) and bad.rpc == "ModelInfer" and "ModelInferRequest" in bad.error


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_penalties_other_than_zero_are_refused_not_ignored(name):
    from ortpilot.serve.openai.wire import ApiError, parse_request

    for value in (None, 0, 0.0):
        parse_request("completion", json.dumps({"model": "m", "prompt": "x", name: value}).encode())
    for value in (1e308, -2, 0.5, "1"):
        with pytest.raises(ApiError) as info:
            parse_request("completion", json.dumps({"model": "m", "prompt": "x", name: value}).encode())
        assert info.value.status == 400 and info.value.param == name and info.value.code == "unsupported"


def test_emit_rayservice_carries_its_flags_or_refuses_them(tmp_path):
    from click.testing import CliRunner

    from ortpilot.cli.main import cli

    out = tmp_path / "m.yaml"
    runner = CliRunner()
    for flags, named in (
        (
            ["--grpc-port", "9123", "--request-timeout", "77", "--max-header-kb", "9"],
            ["--grpc-port", "--max-header-kb"],
        ),
        (
            ["--host", "10.0.0.5", "--ingress", "proxy", "--idle-timeout", "5"],
            ["--host", "--ingress", "--idle-timeout"],
        ),
        (["--max-streams", "2", "--address", "127.0.0.1:1", "--debug-info"], ["--max-streams", "--address"]),
    ):
        refused = runner.invoke(cli, ["serve", "demo:encoder", "--emit-rayservice", str(out), *flags])
        assert refused.exit_code == 2 and not out.exists(), refused.output
        text = " ".join(refused.output.split())
        assert "does not carry" in text and all(flag in text for flag in named) and "Traceback" not in text, text
    env = runner.invoke(cli, ["serve", "demo:encoder", "--emit-rayservice", str(out)], env={"ORTPILOT_API_KEY": "k"})
    assert env.exit_code == 2 and "--api-key" in env.output and not out.exists()
    carried = ["--replicas", "2", "--max-request-mb", "3", "--no-access-log", "--max-batch", "4", "--host", "0.0.0.0"]
    carried += ["--text-batch", "8", "--no-truncate"]
    written = runner.invoke(cli, ["serve", "demo:encoder", "--name", "enc", "--emit-rayservice", str(out), *carried])
    assert written.exit_code == 0, written.output
    apps = {
        a["name"]: a for a in yaml.safe_load(yaml.safe_load(out.read_text())["spec"]["serveConfigV2"])["applications"]
    }
    args = apps["enc"]["args"]
    assert (args["replicas"], args["max_request_mb"], args["access_log"], args["max_batch"]) == (2, 3.0, False, 4)
    assert args["text"]["batch"] == 8 and args["text"]["truncate"] is False  # the text flags travel too


def test_a_rayservice_of_a_text_folder_builds_its_text_model_from_the_folder(tmp_path):
    from ortpilot.models import text_folder
    from ortpilot.serve.oip.app import build, build_server
    from ortpilot.serve.oip.rayservice import write_rayservice
    from ortpilot.serve.options import TextOptions

    folder = text_folder(tmp_path / "embed", "embed")
    specs = resolve_models([str(folder)], ["e"])
    options = ServeOptions(text=TextOptions(batch=8, max_texts=16))
    path = write_rayservice(tmp_path / "rayservice.yaml", specs, options, port=8000)
    apps = {
        a["name"]: a for a in yaml.safe_load(yaml.safe_load(path.read_text())["spec"]["serveConfigV2"])["applications"]
    }
    assert apps["e"]["args"]["profile"] == str(folder.resolve())
    config = build(apps["e"]["args"])._bound_deployment.init_args[1]
    assert config.text.kind == "embed" and config.text_options == options.text
    facts = build_server(apps["ortpilot"]["args"])._bound_deployment.init_args[2]
    assert facts["e"].kind == "embed"


def test_a_rayservices_applications_share_the_request_settings_of_the_serve_flags(tmp_path, demo_paths):
    """The server-wide application is built with the models' settings (it used to get only access_log), and
    every application answers the Host names a Serve listening on 0.0.0.0 does (any, without --allowed-host)."""
    from ortpilot.serve.oip.app import build, build_server
    from ortpilot.serve.oip.rayservice import write_rayservice

    specs = resolve_models([str(demo_paths["mlp"])], ["m"])
    options = ServeOptions(max_request_mb=3.0, access_log=False, max_batch=2)
    path = write_rayservice(tmp_path / "rayservice.yaml", specs, options, port=8000)
    apps = {
        a["name"]: a for a in yaml.safe_load(yaml.safe_load(path.read_text())["spec"]["serveConfigV2"])["applications"]
    }
    server_settings = build_server(apps["ortpilot"]["args"])._bound_deployment.init_args[1]
    replica_config = build(apps["m"]["args"])._bound_deployment.init_args[1]
    assert server_settings == replica_config.requests
    assert server_settings.max_request_mb == 3.0 and not server_settings.access_log
    assert server_settings.access.hosts is None  # a loopback-only Host check would refuse the cluster's clients
    local = build_server({"profiles": [str(demo_paths["mlp"])], "names": ["m"]})._bound_deployment.init_args[1]
    assert local.access.hosts  # args without a host: the library's loopback default, as before


def test_serve_address_where_no_cluster_answers_is_exit_2_at_once_without_a_traceback(tmp_path):
    """A closed port, or an address that is not HOST:PORT: Ray alone would retry for a minute and then raise."""
    from serve_procs import CLI, free_port

    port = free_port()
    cli = [*CLI, "serve", "demo:mlp", "--address"]
    done = subprocess.run([*cli, f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"No Ray cluster answers at '127.0.0.1:{port}'" in done.stderr and "Traceback" not in done.stderr
    bad = subprocess.run([*cli, "nowhere"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "--address 'nowhere' is not HOST:PORT" in bad.stderr, bad.stderr
