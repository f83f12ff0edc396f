"""The Ray Serve application: one deployment of verified replicas per model, behind one ingress.

This is the only module (with ``runner``) that imports Ray at the top: the rest of ortpilot, and
the rest of this package's plain-data modules, work without the ``serve`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.serve.ingress import INGRESS_NAME
from ortpilot.serve.metrics import HEARTBEAT_S
from ortpilot.serve.options import ModelSpec, ServeOptions, resolve_models
from ortpilot.serve.tensors import tensor_metadata

INSTALL_HINT = "pip install 'ortpilot[serve]' (Ray Serve and prometheus_client)"
INGRESS_MAX_ONGOING = 4096
# Requests a model replica holds at once. Queueing inside the replica is cheap and FIFO (one run
# thread); beyond this Ray's router holds requests back and polls with growing back-off, which at
# 32 closed-loop clients on one replica cost 3x the throughput and seconds of p99 (bench_serve.py).
MODEL_MAX_ONGOING = 64


def require_ray() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise UsageError(f"Serving needs Ray Serve: {INSTALL_HINT}.") from None
    return serve


def model_file(spec: ModelSpec) -> Path:
    """The ONNX file a replica of ``spec`` will load, after the checks that need no session: a profile
    must parse, its model must be unchanged and its ORT build and providers present (it exits 1/2
    naming the profile otherwise, before anything starts)."""
    if spec.kind != "profile":
        return Path(spec.path)
    from ortpilot.artifacts.profile import read_profile, verify_environment

    return verify_environment(read_profile(spec.path), spec.path)


def model_metadata(spec: ModelSpec, options: ServeOptions, cpus: float) -> dict[str, Any]:
    """What the ingress knows about a model before any replica is up: tensors, batching, the settings."""
    from ortpilot.modelio import load_model

    inputs, outputs, batch_dim = tensor_metadata(load_model(model_file(spec), load_external_data=False))
    batching = batch_dim and options.max_batch > 1
    return {
        "inputs": inputs,
        "outputs": outputs,
        "batch_dim": batch_dim,
        "facts": {
            "source": spec.source,
            "kind": spec.kind,
            "path": spec.path,
            "cpus_per_replica": cpus,
            "replicas": options.initial_replicas,
            "autoscale": list(options.autoscale or []) or None,
            "batching": ({"max_batch": options.max_batch, "wait_ms": options.batch_wait_ms} if batching else None),
        },
    }


def deployment(
    profiles: str | Sequence[str] | Sequence[ModelSpec],
    names: Sequence[str] = (),
    *,
    options: ServeOptions | None = None,
    cpu_budget: int | None = None,
    **settings: Any,
) -> Any:
    """``ortpilot.serve.deployment``: the Ray Serve application serving ``profiles`` (not yet running).

    ``profiles``: profile.json files or tune output folders, model files or ``demo:NAME`` (one or
    more); ``names`` their URL names. ``options`` (or its fields as keywords: ``replicas=2``,
    ``max_batch=8`` ...) set replicas, CPUs and batching. Run it with ``serve.run(app, name=...,
    route_prefix="/")`` or compose it into your own application.
    """
    serve = require_ray()
    options = options or ServeOptions(**settings)
    if isinstance(profiles, str):
        profiles = [profiles]
    specs = [p if isinstance(p, ModelSpec) else None for p in profiles]
    if any(s is None for s in specs):
        specs = resolve_models([str(p) for p in profiles], list(names))
    if cpu_budget is None:
        from ortpilot.providers.cpubudget import this_budget

        cpu_budget = this_budget().cpus
    cpus = options.replica_cpus(len(specs), cpu_budget)
    from ortpilot.serve.ingress import Ingress
    from ortpilot.serve.replica import ModelReplica

    handles, metadata = {}, {}
    for spec in specs:
        meta = model_metadata(spec, options, cpus)
        metadata[spec.name] = meta
        scaling: dict[str, Any] = (
            {
                "autoscaling_config": {
                    "min_replicas": options.autoscale[0],
                    "max_replicas": options.autoscale[1],
                    "target_ongoing_requests": max(2, options.max_batch),
                }
            }
            if options.autoscale
            else {"num_replicas": options.replicas}
        )
        model = serve.deployment(
            ModelReplica,
            name=f"model-{spec.name}",
            ray_actor_options={"num_cpus": cpus},
            max_ongoing_requests=max(MODEL_MAX_ONGOING, 2 * options.max_batch),
            health_check_period_s=HEARTBEAT_S,
            health_check_timeout_s=30.0,
            graceful_shutdown_timeout_s=20.0,
            **scaling,
        )
        handles[spec.name] = model.bind(
            spec.to_dict(),
            {
                "cpus": cpus,
                "max_batch": options.max_batch,
                "batch_wait_ms": options.batch_wait_ms,
                "batch_dim": meta["batch_dim"],
                "accept_machine": options.accept_machine,
                "ingress": INGRESS_NAME,
            },
        )
    ingress = serve.deployment(
        Ingress,
        name=INGRESS_NAME,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        graceful_shutdown_timeout_s=20.0,
    )
    return ingress.bind(handles, metadata, {"max_request_mb": options.max_request_mb, "access_log": options.access_log})


def build(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder (``import_path: ortpilot.serve.app:build`` in a Serve config, as the
    RayService manifest writes it): ``args`` holds ``profiles``, ``names`` and ServeOptions fields."""
    from ortpilot.serve.options import parse_autoscale

    args = dict(args)
    profiles = args.pop("profiles")
    names = args.pop("names", ())
    if isinstance(args.get("autoscale"), str):
        args["autoscale"] = parse_autoscale(args["autoscale"])
    return deployment(profiles, names, options=ServeOptions(**args))


__all__ = ["build", "deployment", "model_file", "model_metadata", "require_ray"]
