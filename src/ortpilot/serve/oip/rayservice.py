"""``--emit-rayservice FILE``: the same ``serve`` arguments as a KubeRay ``RayService`` manifest.

A RayService (``apiVersion: ray.io/v1``) holds a ``rayClusterConfig`` (a head group and worker
groups of pods) and a ``serveConfigV2``: a Ray Serve config document (as a YAML string) with the
applications ``serve`` runs, one per model (``ortpilot.serve.oip.app:build`` at ``/v2/models/NAME``)
and the server-wide one (``ortpilot.serve.oip.app:build_server`` at ``/``), built from the same
arguments ``serve`` parses. The head's environment turns on the same fast path (HAProxy, direct
ingress, throughput-optimized; ``serve``'s ready line names the path it took).
The manifest is written as YAML, read back, and checked: the RayService fields KubeRay's API
reference names, and the Serve config through Ray Serve's own schema (``ServeDeploySchema``).
The profiles must be at the same paths inside the image (or a mounted volume); nothing here can
run it, because there is no Kubernetes cluster on this machine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError, VerificationError
from ortpilot.serve.haproxy import RETRY_ON
from ortpilot.serve.options import ModelSpec, ServeOptions

API_VERSION = "ray.io/v1"
KIND = "RayService"
BUILDER = "ortpilot.serve.oip.app:build"
SERVER_BUILDER = "ortpilot.serve.oip.app:build_server"
# What the head's Serve controller reads to take the fast path (ortpilot serve sets the same).
FAST_PATH_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON,
}
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def options_args(options: ServeOptions, host: str) -> dict[str, Any]:
    """The ServeOptions fields and the ``host`` Serve listens on, as every builder's ``args`` carry them, so
    the model applications and the server-wide one take the same request settings."""
    args: dict[str, Any] = {"host": host}
    for key, value in options.to_dict().items():
        if key == "autoscale":
            value = f"{value[0]}:{value[1]}" if value else None
        if value is not None:
            args[key] = value
    return args


def builder_args(spec: ModelSpec, options: ServeOptions, host: str = "0.0.0.0") -> dict[str, Any]:
    """The ``args`` of one model's application: what ``app.build`` turns back into the same application."""
    return {"profile": spec.folder or spec.path, "name": spec.name, **options_args(options, host)}  # a text folder


def applications(specs: Sequence[ModelSpec], options: ServeOptions, host: str = "0.0.0.0") -> list[dict[str, Any]]:
    """The Serve config's applications: one per model, and the server-wide one, with the same settings."""
    from ortpilot.serve.oip.server import SERVER_APP

    models = [
        {
            "name": s.name,
            "route_prefix": f"/v2/models/{s.name}",
            "import_path": BUILDER,
            "args": builder_args(s, options, host),
        }
        for s in specs
    ]
    server = {
        "name": SERVER_APP,
        "route_prefix": "/",
        "import_path": SERVER_BUILDER,
        "args": {
            "profiles": [s.folder or s.path for s in specs],
            "names": [s.name for s in specs],
            **options_args(options, host),
        },
    }
    return [*models, server]


def manifest(
    specs: Sequence[ModelSpec],
    options: ServeOptions,
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    image: str | None = None,
    ray_version: str | None = None,
) -> dict[str, Any]:
    """The RayService as a dict: a CPU-less head (it schedules, the proxy runs there) and one worker pod
    per replica with the replica's CPUs, scaling between the autoscale bounds."""
    import ray

    version = ray_version or ray.__version__
    image = image or f"rayproject/ray:{version}"
    cpus = options.cpus_per_replica or 1.0
    pod_cpus = str(max(1, math.ceil(cpus)))
    workers = len(specs) * options.initial_replicas
    serve_config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": applications(specs, options, host),
    }
    import yaml

    container = {
        "image": image,
        "env": [{"name": k, "value": v} for k, v in FAST_PATH_ENV.items()],
        "resources": {"limits": {"cpu": pod_cpus, "memory": "4Gi"}, "requests": {"cpu": pod_cpus, "memory": "4Gi"}},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": _name(specs), "annotations": {"ortpilot.dev/models": ",".join(s.name for s in specs)}},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config, sort_keys=False),
            "rayClusterConfig": {
                "rayVersion": version,
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-head",
                                    **container,
                                    "ports": [
                                        {"containerPort": 6379, "name": "gcs-server"},
                                        {"containerPort": 8265, "name": "dashboard"},
                                        {"containerPort": 10001, "name": "client"},
                                        {"containerPort": port, "name": "serve"},
                                    ],
                                }
                            ]
                        }
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "cpu",
                        "replicas": workers,
                        "minReplicas": len(specs) * (options.autoscale[0] if options.autoscale else options.replicas),
                        "maxReplicas": len(specs) * options.max_replicas,
                        "rayStartParams": {"num-cpus": pod_cpus},
                        "template": {"spec": {"containers": [{"name": "ray-worker", **container}]}},
                    }
                ],
            },
        },
    }


def _name(specs: Sequence[ModelSpec]) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", "ortpilot-" + "-".join(s.name for s in specs).lower()).strip("-")
    return name[:63].rstrip("-")


def check_manifest(text: str, path: str | Path = "RayService") -> dict[str, Any]:
    """Load the YAML back and check it: KubeRay's RayService fields, and the Serve config by Ray's schema."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise VerificationError(f"'{path}' is not valid YAML ({exc}); ortpilot wrote it, so this is a bug.") from None
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise VerificationError(f"'{path}' does not hold a mapping; ortpilot wrote it, so this is a bug.")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        problems.append(f"apiVersion/kind are not {API_VERSION} / {KIND}")
    if not _DNS_LABEL.match(str((doc.get("metadata") or {}).get("name", ""))):
        problems.append("metadata.name is not a DNS-1123 label")
    spec = doc.get("spec") or {}
    cluster = spec.get("rayClusterConfig") or {}
    if not isinstance(cluster.get("rayVersion"), str):
        problems.append("spec.rayClusterConfig.rayVersion is not a string")
    head = cluster.get("headGroupSpec") or {}
    groups = [("headGroupSpec", head)] + [
        (f"workerGroupSpecs[{i}]", g) for i, g in enumerate(cluster.get("workerGroupSpecs") or [])
    ]
    if len(groups) < 2:
        problems.append("spec.rayClusterConfig.workerGroupSpecs is empty")
    for where, group in groups:
        params = group.get("rayStartParams") or {}
        if not all(isinstance(v, str) for v in params.values()):
            problems.append(f"{where}.rayStartParams values must be strings (KubeRay's map[string]string)")
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers or not all(c.get("name") and c.get("image") for c in containers):
            problems.append(f"{where}.template.spec.containers needs a name and an image")
        if where != "headGroupSpec":
            counts = [group.get(k) for k in ("replicas", "minReplicas", "maxReplicas")]
            if (
                not group.get("groupName")
                or not all(isinstance(c, int) for c in counts)
                or not counts[1] <= counts[0] <= counts[2]
            ):
                problems.append(f"{where} needs groupName and minReplicas <= replicas <= maxReplicas")
    serve_text = spec.get("serveConfigV2")
    if not isinstance(serve_text, str):
        problems.append("spec.serveConfigV2 is not a string (a Serve config as YAML)")
    else:
        try:
            from ray.serve.schema import ServeDeploySchema

            ServeDeploySchema.parse_obj(yaml.safe_load(serve_text))
        except Exception as exc:
            problems.append(f"spec.serveConfigV2 is not a valid Serve config ({str(exc).splitlines()[0]})")
    if problems:
        raise VerificationError(
            f"'{path}' is not a valid RayService: {'; '.join(problems)}. ortpilot wrote it, so "
            "this is a bug in ortpilot."
        )
    return doc


def write_rayservice(
    dest: str | Path,
    specs: Sequence[ModelSpec],
    options: ServeOptions,
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    image: str | None = None,
) -> Path:
    """Write the manifest atomically after checking it; the file says how it is meant to be used."""
    try:
        import yaml
    except ImportError:
        raise UsageError("--emit-rayservice needs PyYAML: pip install 'ortpilot[serve]'.") from None
    from ortpilot.artifacts.atomic import atomic_write_text, check_output_path

    path = Path(dest)
    check_output_path(path)
    header = (
        "# Written by ortpilot serve --emit-rayservice. kubectl apply -f this file on a cluster with the KubeRay\n"
        "# operator. The image must have ortpilot[serve] and the profiles at the paths in serveConfigV2's args.\n"
    )
    text = header + yaml.safe_dump(manifest(specs, options, host=host, port=port, image=image), sort_keys=False)
    check_manifest(text, path)
    atomic_write_text(path, text)
    return path


__all__ = [
    "API_VERSION",
    "BUILDER",
    "FAST_PATH_ENV",
    "KIND",
    "SERVER_BUILDER",
    "applications",
    "builder_args",
    "check_manifest",
    "manifest",
    "options_args",
    "write_rayservice",
]
