"""The Open Inference Protocol (KServe v2 REST) routes, so Triton and KServe clients work unchanged.

Health, server and model metadata, model readiness, infer (JSON tensors and the binary-tensor
extension), and ``/metrics``. Model metadata adds what a Triton server cannot say: each live
replica's providers, placement share, threads and how it was verified.
"""

from __future__ import annotations

import re
from typing import Any

from ortpilot.errors import InputError
from ortpilot.serve.http import Reply, error_reply, json_reply, route
from ortpilot.serve.tensors import BINARY_TYPE, HEADER_LENGTH, decode_request, encode_response

EXTENSIONS = ["binary_tensor_data"]
_BYTE_COUNT = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() takes "²", which int() refuses


def routes(ingress: Any) -> list:
    """The protocol's route table, bound to ``ingress`` (its model handles, metadata and metrics)."""

    def unknown(name: str) -> Reply:
        return error_reply(
            404, f"Unknown model '{name}'. This server serves: {', '.join(sorted(ingress.handles))}.", model=name
        )

    def ready(name: str) -> bool:
        return bool(ingress.metrics.replicas(name))

    async def live(request: Any) -> Reply:
        return json_reply(200, {"live": True})

    async def server_ready(request: Any) -> Reply:
        states = {name: ready(name) for name in ingress.handles}
        return json_reply(200 if all(states.values()) else 503, {"ready": all(states.values()), "models": states})

    async def server_metadata(request: Any) -> Reply:
        from ortpilot.version import __version__

        return json_reply(200, {"name": "ortpilot", "version": __version__, "extensions": EXTENSIONS})

    async def model_metadata(request: Any, name: str, version: str = "1") -> Reply:
        if name not in ingress.handles:
            return unknown(name)
        meta = ingress.metadata[name]
        replicas = [r.info for r in ingress.metrics.replicas(name)]
        return json_reply(
            200,
            {
                "name": name,
                "versions": ["1"],
                "platform": "onnxruntime_onnx",
                "inputs": meta["inputs"],
                "outputs": meta["outputs"],
                "ortpilot": {**meta["facts"], "ready": bool(replicas), "replicas": replicas},
            },
        )

    async def model_ready(request: Any, name: str, version: str = "1") -> Reply:
        if name not in ingress.handles:
            return unknown(name)
        count = len(ingress.metrics.replicas(name))
        return json_reply(200 if count else 503, {"name": name, "ready": bool(count), "verified_replicas": count})

    async def infer(request: Any, name: str, version: str = "1") -> Reply:
        if name not in ingress.handles:
            return unknown(name)
        body = await ingress.read_body(request)
        if isinstance(body, Reply):
            body.model = name
            return body
        header = request.headers.get(HEADER_LENGTH)
        try:
            if header is not None and not _BYTE_COUNT.fullmatch(header.strip()):
                raise InputError(f"Inference-Header-Content-Length {header[:40]!r} is not a byte count.")
            decoded = decode_request(body, int(header) if header is not None else None)
        except InputError as exc:
            return error_reply(400, str(exc), model=name)
        try:
            result = await ingress.handles[name].infer.remote(decoded.feeds, decoded.outputs)
        except Exception as exc:  # the replica died or Ray could not reach it
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return error_reply(
                503,
                f"The replica serving '{name}' failed during the request ({type(exc).__name__}: "
                f"{first}). Ray restarts it; it verifies again before it takes traffic. Retry.",
                model=name,
            )
        report = result.get("report") or {}
        if report:
            ingress.metrics.report(name, report["replica"], None, report["batches"])
        if "error" in result:
            return error_reply(int(result.get("code", 500)), result["error"], model=name)
        binary = decoded.binary_outputs if decoded.outputs is not None else decoded.binary_default
        payload, head = encode_response(name, result["outputs"], binary, decoded.id)
        if head is None:
            return Reply(200, payload, model=name)
        return Reply(200, payload, BINARY_TYPE, {"Inference-Header-Content-Length": str(head)}, model=name)

    async def metrics(request: Any) -> Reply:
        body, content_type = ingress.metrics.render()
        return Reply(200, body, content_type)

    return [
        route("GET", "/v2/health/live", live),
        route("GET", "/v2/health/ready", server_ready),
        route("GET", "/v2", server_metadata),
        route("GET", "/v2/models/{name}", model_metadata),
        route("GET", "/v2/models/{name}/versions/{version}", model_metadata),
        route("GET", "/v2/models/{name}/ready", model_ready),
        route("GET", "/v2/models/{name}/versions/{version}/ready", model_ready),
        route("POST", "/v2/models/{name}/infer", infer),
        route("POST", "/v2/models/{name}/versions/{version}/infer", infer),
        route("GET", "/metrics", metrics),
    ]


__all__ = ["EXTENSIONS", "routes"]
