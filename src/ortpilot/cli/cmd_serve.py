"""``ortpilot serve``: verified profiles as a service on Ray Serve (Open Inference Protocol, /metrics);
decoders behind an OpenAI-compatible API with continuous batching."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.markup import escape

from ortpilot.cli.common import emit_json, handle_errors, json_option, stderr, stdout
from ortpilot.cli.groups import arg_group
from ortpilot.cli.serve_openai import decoder_options, openai_options
from ortpilot.cli.serve_text import TEXT_OPTIONS, text_options, text_params
from ortpilot.errors import UsageError
from ortpilot.serve.defaults import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_HEADER_KB,
    DEFAULT_MAX_REQUEST_MB,
    DEFAULT_PORT,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
)
from ortpilot.serve.fastpath import INGRESS_CHOICES
from ortpilot.serve.haproxy import HAPROXY_BUFSIZE
from ortpilot.serve.options import ServeOptions, ServerOptions, TextOptions

_STARTED = time.perf_counter()  # cold start counts from the command's start, imports included
KEY_ENV = "ORTPILOT_API_KEY"
# What --emit-rayservice writes into the manifest (with the manifest's own flags); every other flag shapes
# only the server this machine would run, and is refused with it rather than dropped.
MANIFEST_PARAMS = frozenset(
    {
        "profiles",
        "names",
        "port",
        "replicas",
        "autoscale",
        "cpus_per_replica",
        "max_batch",
        "batch_wait_ms",
        "max_request_mb",
        "accept_machine",
        "access_log",
        "rayservice",
        "image",
        "as_json",
    }
    | text_params()
)


def not_carried(ctx: click.Context, host: str) -> list[str]:
    """The flags given (on the command line or in the environment) that a RayService manifest cannot carry;
    ``--host 0.0.0.0`` is what the manifest's Serve listens on anyway."""
    from click.core import ParameterSource

    flags = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in MANIFEST_PARAMS or param.name is None:
            continue
        if param.name == "host" and host == "0.0.0.0":
            continue
        if ctx.get_parameter_source(param.name) not in (None, ParameterSource.DEFAULT):
            flags.append(param.opts[0])
    return flags


def serve_options(
    *,
    replicas: int,
    autoscale: str | None,
    cpus_per_replica: float | None,
    max_batch: int,
    batch_wait_ms: float,
    max_request_mb: float,
    accept_machine: bool,
    access_log: bool,
) -> ServeOptions:
    """The SERVE_FLAGS group: the replica and batching record (the text group's record is added by the command)."""
    from ortpilot.serve.options import parse_autoscale

    return ServeOptions(
        replicas=replicas,
        autoscale=parse_autoscale(autoscale),
        cpus_per_replica=cpus_per_replica,
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        max_request_mb=max_request_mb,
        access_log=access_log,
        accept_machine=accept_machine,
    )


def server_options(
    *,
    host: str,
    port: int,
    grpc_port: int | None,
    ingress: str,
    throughput_optimized: bool,
    header_timeout: int,
    request_timeout: int,
    idle_timeout: int,
    max_header_kb: int,
    api_keys: tuple[str, ...],
    api_key_file: str | None,
    auth_health: bool,
    cors_origins: tuple[str, ...],
    allowed_hosts: tuple[str, ...],
    debug_info: bool,
    address: str | None,
    ready_timeout: float,
) -> ServerOptions:
    """The SERVER_FLAGS group: the listening, ingress, timeout and access record."""
    from ortpilot.serve.access import access_options
    from ortpilot.serve.records import Timeouts

    return ServerOptions(
        host,
        port,
        address,
        ready_timeout,
        grpc_port=grpc_port,
        ingress=ingress,
        throughput_optimized=throughput_optimized,
        timeouts=Timeouts(header_timeout, request_timeout, idle_timeout),
        debug_info=debug_info,
        access=access_options(
            api_keys, api_key_file, auth_health=auth_health, cors_origins=cors_origins, allowed_hosts=allowed_hosts
        ),
        max_header_kb=max_header_kb,
    )


# Where the server listens, its ingress path, timeouts and access: the ServerOptions group.
SERVER_FLAGS = (
    click.option("--host", default=ServerOptions.host, show_default=True, help="Address the HTTP proxy listens on."),
    click.option(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        show_default=True,
        help="HTTP port (Open Inference Protocol and /metrics).",
    ),
    click.option(
        "--grpc-port",
        type=int,
        default=None,
        help="Also serve KServe v2 over gRPC (inference.GRPCInferenceService, tritonclient.grpc) on this port.",
    ),
    click.option(
        "--ingress",
        type=click.Choice(INGRESS_CHOICES),
        default=ServerOptions.ingress,
        show_default=True,
        help="auto: HAProxy hands requests straight to replicas where it can run (Ray Serve's fast path); "
        "proxy: Ray Serve's classic proxy (one more hop).",
    ),
    click.option(
        "--no-throughput-optimized",
        "throughput_optimized",
        flag_value=False,
        default=True,
        help="Leave RAY_SERVE_THROUGHPUT_OPTIMIZED off (user code in its own thread, pickled handles).",
    ),
    click.option(
        "--header-timeout",
        type=click.IntRange(min=1),
        default=DEFAULT_HEADER_TIMEOUT_S,
        show_default=True,
        help="Seconds a client has to send its request line and headers.",
    ),
    click.option(
        "--request-timeout",
        type=click.IntRange(min=1),
        default=DEFAULT_REQUEST_TIMEOUT_S,
        show_default=True,
        help="Seconds a request may take, body included (a slow body gets 408, a late answer 504; a client may ask "
        "for less with X-Request-Timeout).",
    ),
    click.option(
        "--idle-timeout",
        type=click.IntRange(min=1),
        default=DEFAULT_IDLE_TIMEOUT_S,
        show_default=True,
        help="Seconds a kept-alive connection may sit idle.",
    ),
    click.option(
        "--max-header-kb",
        type=click.IntRange(min=1, max=HAPROXY_BUFSIZE // 2048),
        default=DEFAULT_MAX_HEADER_KB,
        show_default=True,
        help="Request line and headers together, in KiB (HAProxy answers 431 beyond).",
    ),
    click.option(
        "--api-key",
        "api_keys",
        multiple=True,
        envvar="ORTPILOT_API_KEY",
        metavar="KEY",
        help="Require 'Authorization: Bearer KEY' on every route but /v2/health/* (repeatable; or ORTPILOT_API_KEY, "
        "keys separated by spaces, which keeps them out of ps).",
    ),
    click.option(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="Keys one per line ('#' comments); every replica reads the file again when it changes (rotation).",
    ),
    click.option(
        "--auth-health", is_flag=True, help="Health probes (/v2/health/*, gRPC ServerLive/Ready) need a key too."
    ),
    click.option(
        "--cors-origin",
        "cors_origins",
        multiple=True,
        metavar="ORIGIN",
        help="A browser origin (scheme://host[:port], or '*') whose pages may call the server (repeatable); "
        "requests from other origins get 403.",
    ),
    click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        metavar="NAME",
        help="A Host name the server answers to besides 127.0.0.1/localhost/::1 (repeatable; against DNS rebinding).",
    ),
    click.option(
        "--debug-info",
        is_flag=True,
        help="Metadata shows each replica's PID, host, node id and profile path, and a decoder's recent requests.",
    ),
    click.option("--address", default=None, help="Join this Ray cluster (default: start a local Ray instance)."),
    click.option(
        "--ready-timeout",
        type=float,
        default=DEFAULT_READY_TIMEOUT_S,
        show_default=True,
        help="Seconds to wait for a verified replica of each model before exiting 1.",
    ),
)


# Replicas, batching and request limits of every model: the ServeOptions group.
SERVE_FLAGS = (
    click.option("--replicas", type=int, default=ServeOptions.replicas, show_default=True, help="Replicas per model."),
    click.option(
        "--autoscale",
        default=None,
        metavar="MIN:MAX",
        help="Ray Serve autoscaling on ongoing requests between MIN and MAX replicas (instead of --replicas).",
    ),
    click.option(
        "--cpus-per-replica",
        type=float,
        default=None,
        help="Ray CPUs per replica; ORT's intra-op threads are set to it (default: the CPU budget shared by all replicas, "
        "a fraction of a CPU each when they outnumber the CPUs).",
    ),
    click.option(
        "--max-batch",
        type=int,
        default=ServeOptions.max_batch,
        show_default=True,
        help="Dynamic batching: stack up to B requests of the same shape (models with a batch dim; 1: off).",
    ),
    click.option(
        "--batch-wait-ms",
        type=float,
        default=ServeOptions.batch_wait_ms,
        show_default=True,
        help="Hold a short batch this long for more requests (0: a batch is what waited while the last run was busy).",
    ),
    click.option(
        "--max-request-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_MB,
        show_default=True,
        help="Larger request bodies get 413 (Open Inference Protocol, gRPC and /v1).",
    ),
    click.option(
        "--accept-machine",
        is_flag=True,
        help="Serve profiles tuned on a machine whose differences can change the winner (INT8 kernels, CPUs).",
    ),
    click.option(
        "--no-access-log",
        "access_log",
        flag_value=False,
        default=True,
        help="No access-log line per request on stderr.",
    ),
)


@click.command("serve")
@click.argument("profiles", nargs=-1, required=True)
@click.option(
    "--name",
    "names",
    multiple=True,
    help="The model's name in URLs, one per PROFILE in order "
    "(default: the profile folder's name or the model file's stem).",
)
@click.option(
    "--emit-rayservice",
    "rayservice",
    default=None,
    metavar="FILE",
    help="Write a KubeRay RayService manifest for these arguments to FILE and exit (serves nothing).",
)
@click.option("--image", default=None, help="Container image for --emit-rayservice (default: rayproject/ray).")
@json_option("Print the ready models as one JSON document.")
@openai_options
@handle_errors
@arg_group("text", text_options, *TEXT_OPTIONS)
@arg_group("options", serve_options, *SERVE_FLAGS)
@arg_group("server", server_options, *SERVER_FLAGS)
def command(
    profiles: tuple[str, ...],
    names: tuple[str, ...],
    rayservice: str | None,
    image: str | None,
    as_json: bool,
    text: TextOptions,
    options: ServeOptions,
    server: ServerOptions,
    **decoder: Any,
) -> None:
    """Serve each PROFILE (a tune output folder or profile.json, a model file, or demo:NAME) over the
    Open Inference Protocol (KServe v2 REST, and gRPC with --grpc-port) with verified replicas on
    Ray Serve. Each model's replicas answer its requests themselves: HAProxy hands each request
    straight to one (Ray Serve's fast path; the last ready line says which path was taken).

    Every replica loads its profile strictly, with ORT's intra-op threads set to its CPUs, and
    reproduces the profile's reference outputs before it takes traffic. One line per model says
    when it is ready; SIGINT/SIGTERM drains and stops what serve started. Exit 0 after a signal,
    1 when a model has no verified replica within --ready-timeout, 2 bad usage (a taken port,
    an unreadable profile).

    A text-model folder (a sentence encoder, cross-encoder or sequence classifier with its tokenizer.json),
    or a profile of one, also takes text: POST /v1/embeddings, /v1/rerank or /v1/classify (OpenAI-style),
    and KServe v2 BYTES inputs; requests of different lengths share runs (--text-batch).

    A decoder (demo:decoder, a decoder model file, or a folder with one and its tokenizer.json) is
    served behind OpenAI-compatible endpoints under /v1 instead (GET /v1/models, POST
    /v1/completions and /v1/chat/completions, streamed or not): each replica decodes up to
    --max-streams requests together on one shared KV buffer (continuous batching).
    """
    import os

    # Click has read the keys: no Ray process this command starts (GCS, raylet, workers, HAProxy inherit its
    # environment) gets them; replicas get digests (docs/commands/serve.md, Security).
    os.environ.pop(KEY_ENV, None)
    if rayservice and (dropped := not_carried(click.get_current_context(), server.host)):
        raise UsageError(
            f"--emit-rayservice does not carry {', '.join(dropped)} into the manifest: it carries the models, "
            "--name, --port (on 0.0.0.0), --replicas or --autoscale, --cpus-per-replica, --max-batch, --batch-wait-ms, "
            "--max-request-mb, the text-model flags, --accept-machine, --no-access-log and --image. Leave the others "
            "out; keys, origins, "
            "Host names, timeouts and header limits belong in front of the RayService (an Ingress or a gateway)."
        )
    from ortpilot.serve import plan as serving

    options = dataclasses.replace(options, text=text)
    served = serving.plan(list(profiles), list(names), options, decoder_options(decoder), manifest=bool(rayservice))
    for spec in served.models:
        for note in getattr(spec, "notes", ()):
            stderr.print(f"[dim]{escape(spec.name)}: {escape(note)}[/]", highlight=False)
    if rayservice:
        emit_manifest(rayservice, list(served.models), options, server.port, image)
        return
    for warning in server.access.warnings(server.host):
        stderr.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    result = serving.run(served, server, started=_STARTED, on_ready=ready_printer(as_json))
    stderr.print("stopped", highlight=False)
    if getattr(result, "ray_left_behind", False):
        # Ray's processes ended under this one: its exit handlers would wait seconds on them, and its core worker
        # ends the process with 1 once it sees its raylet gone. Nothing is left to clean up: exit 0 now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def emit_manifest(target: str, specs: list[Any], options: ServeOptions, port: int, image: str | None) -> None:
    """``--emit-rayservice``: write the KubeRay manifest (its Serve listens on 0.0.0.0) and say where."""
    from ortpilot.serve.oip.rayservice import write_rayservice

    path = write_rayservice(target, specs, options, host="0.0.0.0", port=port, image=image)
    stderr.print(
        f"Wrote the RayService manifest {path} (kubectl apply -f {path}, with KubeRay installed)", highlight=False
    )


def ready_printer(as_json: bool) -> Callable[[Any], None]:
    """What runs once every model is ready: its ready lines (or one JSON document) on stdout."""

    def ready(models: Any) -> None:
        if as_json:
            emit_json(models.to_dict())
        else:
            for line in models.lines():
                stdout.print(line, highlight=False, soft_wrap=True)
        sys.stdout.flush()
        stderr.print("serving; SIGINT or SIGTERM stops", highlight=False)

    return ready
