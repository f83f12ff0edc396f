"""The Ray Serve applications of a server: one per model, whose verified replicas answer its routes
themselves, and one server-wide application at ``/``.

A model's application mounts at ``/v2/models/NAME``: HAProxy (or Ray's proxy) hands each request
for the model straight to one of its replicas, so an infer request is one hop. The server-wide
application (``server.ServerApp``) answers health, server metadata, ``/metrics`` and every path
no model claims. Each replica is bound with records (``ModelSpec``, ``config.ReplicaConfig``),
never dicts. This module imports Ray at call time only: the rest of ortpilot, and the plain-data
modules, work without the ``serve`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.serve.counts import HEARTBEAT_S
from ortpilot.serve.defaults import SHUTDOWN_POLL_S, start_tries_option
from ortpilot.serve.fastpath import SERVER_WIDE_ENV
from ortpilot.serve.oip.codec import tensor_metadata
from ortpilot.serve.oip.config import Batching, ModelFacts, ReplicaConfig
from ortpilot.serve.oip.limits import InputLimits
from ortpilot.serve.oip.server import SERVER_APP, SERVER_DEPLOYMENT
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions, resolve_models
from ortpilot.serve.runner import require_ray

# Requests a model replica holds at once. Queueing inside the replica is cheap and FIFO (one run
# thread); beyond this Ray's router holds requests back and polls with growing back-off, which at
# 32 closed-loop clients on one replica cost 3x the throughput and seconds of p99 (bench_serve.py).
MODEL_MAX_ONGOING = 64
SERVER_MAX_ONGOING = 4096


def model_file(spec: ModelSpec) -> Path:
    """The ONNX file a replica of ``spec`` will load, after the checks that need no session: a profile
    must parse, its model must be unchanged and its ORT build and providers present (it exits 1/2
    naming the profile otherwise, before anything starts)."""
    if spec.kind != "profile":
        return Path(spec.path)
    from ortpilot.artifacts.profile import read_profile, verify_environment
    from ortpilot.providers.plugins import compute_providers

    return verify_environment(read_profile(spec.path), spec.path, compute_providers())


def model_metadata(spec: ModelSpec, options: ServeOptions, cpus: float, debug_info: bool = False) -> dict[str, Any]:
    """What a model's metadata says before any replica is up: tensors, batching, the settings."""
    from ortpilot.modelio import load_model
    from ortpilot.serve.oip.limits import input_limits
    from ortpilot.serve.textfacts import text_facts

    model = load_model(model_file(spec), load_external_data=False)
    inputs, outputs, batch_dim = tensor_metadata(model)
    batching = batch_dim and options.max_batch > 1
    facts = ModelFacts(
        kind=spec.kind,
        cpus_per_replica=cpus,
        replicas=options.initial_replicas,
        autoscale=tuple(options.autoscale) if options.autoscale else None,
        batching=Batching(options.max_batch, options.batch_wait_ms) if batching else None,
        source=spec.source if debug_info else None,
        path=spec.path if debug_info else None,
    )
    return {
        "tensors": {"inputs": inputs, "outputs": outputs},
        "batch_dim": batch_dim,
        "facts": facts,
        "limits": input_limits(model).to_dict(),
        "text": text_facts(spec, model),
    }


def _specs(profiles: Any, names: str | Sequence[str]) -> list[ModelSpec]:
    if isinstance(profiles, (str, os.PathLike)):
        profiles = [profiles]
    if isinstance(names, str):  # one model's name, not one name per character
        names = [names]
    if all(isinstance(p, ModelSpec) for p in profiles):
        specs = list(profiles)
    else:
        specs = resolve_models([str(p) for p in profiles], list(names))
    taken = [s.name for s in specs if s.name == SERVER_APP]
    if taken:
        raise UsageError(f"'{SERVER_APP}' names the server-wide application; serve the model under another --name.")
    return specs


def model_application(
    spec: ModelSpec,
    options: ServeOptions,
    server: ServerOptions,
    cpus: float,
    server_app: str | None = SERVER_APP,
) -> Any:
    """One model's application (not yet running): its verified replicas, which answer its routes."""
    from ortpilot.serve.oip.replica import ModelReplica

    serve = require_ray()
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
        graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
        **start_tries_option(serve, options.initial_replicas),
        **scaling,
    )
    return model.bind(spec, replica_config(spec, options, server, cpus, server_app))


def replica_config(
    spec: ModelSpec, options: ServeOptions, server: ServerOptions, cpus: float, server_app: str | None
) -> ReplicaConfig:
    """What each replica of ``spec`` is told: the settings, and what the driver read from the graph."""
    meta = model_metadata(spec, options, cpus, server.debug_info)
    return ReplicaConfig(
        cpus=cpus,
        requests=server.requests(options),
        max_batch=options.max_batch,
        batch_wait_ms=options.batch_wait_ms,
        batch_dim=meta["batch_dim"],
        accept_machine=options.accept_machine,
        server_app=server_app,
        inputs=meta["tensors"]["inputs"],
        outputs=meta["tensors"]["outputs"],
        facts=meta["facts"],
        limits=InputLimits.from_dict(meta["limits"]),
        text=meta["text"],
        text_options=options.text,
    )


def server_application(specs: Sequence[ModelSpec], options: ServeOptions, server: ServerOptions | None = None) -> Any:
    """The server-wide application (not yet running): health, metadata, /metrics, unclaimed paths, and the
    text models' OpenAI-style routes (``/v1/...``), relayed to the model a request names."""
    from ortpilot.serve.oip.server import ServerApp
    from ortpilot.serve.textfacts import text_facts

    serve = require_ray()
    app = serve.deployment(
        ServerApp,
        name=SERVER_DEPLOYMENT,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": SERVER_WIDE_ENV}},
        max_ongoing_requests=SERVER_MAX_ONGOING,
        graceful_shutdown_timeout_s=20.0,
        graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
    )
    server = server or ServerOptions()
    return app.bind({s.name: s.name for s in specs}, server.requests(options), {s.name: text_facts(s) for s in specs})


def applications(
    profiles: str | os.PathLike | Sequence[str] | Sequence[ModelSpec],
    names: str | Sequence[str] = (),
    *,
    options: ServeOptions | None = None,
    server: ServerOptions | None = None,
    cpu_budget: int | None = None,
) -> list[Any]:
    """``ortpilot.serve.applications``: every application of a server for ``profiles``, as Ray Serve
    ``RunTarget`` records (run them with ``serve.run_many``): one per model at ``/v2/models/NAME``,
    named like the model, and the server-wide one at ``/``."""
    serve = require_ray()
    options, server = options or ServeOptions(), server or ServerOptions()
    specs = _specs(profiles, names)
    if cpu_budget is None:
        from ortpilot.providers.cpubudget import this_budget

        cpu_budget = this_budget().cpus
    cpus = options.replica_cpus(len(specs), cpu_budget)
    targets = [
        serve.RunTarget(
            model_application(spec, options, server, cpus), name=spec.name, route_prefix=f"/v2/models/{spec.name}"
        )
        for spec in specs
    ]
    return [*targets, serve.RunTarget(server_application(specs, options, server), name=SERVER_APP, route_prefix="/")]


def deployment(
    profiles: str | os.PathLike | Sequence[str] | Sequence[ModelSpec],
    names: str | Sequence[str] = (),
    *,
    options: ServeOptions | None = None,
    cpu_budget: int | None = None,
    **settings: Any,
) -> Any:
    """``ortpilot.serve.deployment``: ONE model's application of verified replicas (not yet running).

    ``profiles``: a profile.json or tune output folder, a model file or ``demo:NAME`` (one);
    ``names`` its URL name (a string, or a list of one). ``options`` (or its fields as keywords: ``replicas=2``, ``max_batch=8``
    ...) set replicas, CPUs and batching. Its replicas answer ``/v2/models/NAME/...`` themselves:
    run it with ``serve.run(app, name=NAME, route_prefix=f"/v2/models/{NAME}")``, or compose it.
    For a whole server (several models, health, /metrics) use ``applications``.
    """
    options = options or ServeOptions(**settings)
    specs = _specs(profiles, names)
    if len(specs) != 1:
        raise UsageError(
            f"deployment() builds one model's application and got {len(specs)}; use "
            "ortpilot.serve.applications(...) for several (one application per model and a server-wide one)."
        )
    if cpu_budget is None:
        from ortpilot.providers.cpubudget import this_budget

        cpu_budget = this_budget().cpus
    return model_application(specs[0], options, ServerOptions(), options.replica_cpus(1, cpu_budget), None)


def build(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder for one model (``import_path: ortpilot.serve.oip.app:build`` in a Serve
    config, as the RayService manifest writes it): ``args`` holds ``profile``, ``name``, ``server_app``,
    ``host`` (where Serve listens: it decides the Host names answered) and ServeOptions fields."""
    args = dict(args)
    spec = _specs([args.pop("profile")], [args.pop("name")])[0]
    server_app = args.pop("server_app", SERVER_APP)
    cpus = args.pop("cpus", None)
    options, server = _options(args)
    return model_application(spec, options, server, float(cpus or options.cpus_per_replica or 1), server_app)


def build_server(args: dict[str, Any]) -> Any:
    """The builder of the server-wide application (``ortpilot.serve.oip.app:build_server``): ``args`` holds
    ``profiles`` and ``names`` of every served model, and the same ``host`` and ServeOptions fields as each
    model's ``build`` (so its request settings are the models' ones)."""
    args = dict(args)
    specs = _specs(list(args.pop("profiles")), list(args.pop("names", ())))
    options, server = _options(args)
    return server_application(specs, options, server)


def _options(args: dict[str, Any]) -> tuple[ServeOptions, ServerOptions]:
    """The ServeOptions and ServerOptions of a builder's remaining ``args`` (``autoscale`` as MIN:MAX text)."""
    from ortpilot.serve.options import parse_autoscale

    server = ServerOptions(host=str(args.pop("host"))) if "host" in args else ServerOptions()
    if isinstance(args.get("autoscale"), str):
        args["autoscale"] = parse_autoscale(args["autoscale"])
    return ServeOptions(**args), server


__all__ = [
    "applications",
    "build",
    "build_server",
    "deployment",
    "model_application",
    "model_file",
    "model_metadata",
    "replica_config",
    "server_application",
]
