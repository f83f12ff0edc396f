"""``ortpilot serve``: decoders behind OpenAI-compatible endpoints on Ray Serve (continuous batching)."""

from __future__ import annotations

import time

import click

from ortpilot.cli.common import handle_errors
from ortpilot.cli.serve_openai import openai_options, serve_decoders

_STARTED = time.perf_counter()  # cold start counts from the command's start, imports included


@click.command("serve")
@click.argument("models", nargs=-1, required=True)
@click.option("--name", "names", multiple=True, help="The model's name in requests, one per MODEL in order "
              "(default: the folder's name or the model file's stem; demo:decoder is 'decoder').")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the HTTP proxy listens on.")
@click.option("--port", type=int, default=8000, show_default=True, help="HTTP port (the OpenAI API under /v1).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Replicas per model, each with its own batched loop.")
@click.option("--cpus-per-replica", type=float, default=None,
              help="Ray CPUs per replica; ORT's intra-op threads are set to it (default: the CPU budget shared).")
@openai_options
@click.option("--address", default=None, help="Join this Ray cluster (default: start a local Ray instance).")
@click.option("--ready-timeout", type=float, default=300.0, show_default=True,
              help="Seconds to wait for a replica of each model before exiting 1.")
@click.option("--no-access-log", "access_log", flag_value=False, default=True,
              help="No access-log line per request on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the ready models as one JSON document.")
@handle_errors
def command(models: tuple[str, ...], names: tuple[str, ...], host: str, port: int, replicas: int,
            cpus_per_replica: float | None, tokenizer: str | None, chat_template: str, max_streams: int,
            max_queue: int, max_length: int | None, prefill_chunk: int, address: str | None, ready_timeout: float,
            access_log: bool, as_json: bool) -> None:
    """Serve each decoder MODEL (a model file, a folder with the model and its tokenizer.json, or
    demo:decoder) behind OpenAI-compatible endpoints: GET /v1/models, POST /v1/completions,
    POST /v1/chat/completions, streamed or not.

    Every replica owns one continuous-batching loop: up to --max-streams sequences decode together
    on one shared KV buffer, requests join and leave between steps. A decoder without
    GroupQueryAttention is fused first (cached). Exit 0 after SIGINT/SIGTERM, 1 when a model has no
    replica within --ready-timeout, 2 bad usage (a taken port, a model that cannot be batched, no
    tokenizer).
    """
    serve_decoders(models, names, tokenizer=tokenizer, chat_template=chat_template, max_streams=max_streams,
                   max_queue=max_queue, max_length=max_length, prefill_chunk=prefill_chunk, host=host, port=port,
                   replicas=replicas, cpus_per_replica=cpus_per_replica, address=address,
                   ready_timeout=ready_timeout, access_log=access_log, as_json=as_json, started=_STARTED)
