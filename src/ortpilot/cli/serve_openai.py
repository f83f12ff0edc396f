"""``ortpilot serve``'s OpenAI side: the decoder options and the call that serves decoders at /v1.

Kept apart from the command so the options can decorate any ``serve`` command: ``openai_options``
adds them, ``serve_decoders`` checks the decoders (fusing them when needed) before Ray starts and
runs the OpenAI application until a signal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from ortpilot.cli.common import emit_json, stderr, stdout

DECODER_OPTIONS = (
    click.option(
        "--tokenizer",
        default=None,
        type=click.Path(dir_okay=True),
        help="tokenizer.json for a decoder (default: the one in the model's folder; demo:decoder has its own).",
    ),
    click.option(
        "--chat-template",
        type=click.Choice(["auto", "chatml"]),
        default="auto",
        show_default=True,
        help="auto: the tokenizer's own template (tokenizer_config.json), else ChatML if it knows "
        "<|im_start|>; chatml: always ChatML.",
    ),
    click.option(
        "--max-streams",
        type=click.IntRange(min=1),
        default=8,
        show_default=True,
        help="Sequences one replica decodes together (slots of its KV buffer).",
    ),
    click.option(
        "--max-queue",
        type=click.IntRange(min=0),
        default=64,
        show_default=True,
        help="Requests a replica queues beyond its streams; more get 429 with Retry-After.",
    ),
    click.option(
        "--max-length",
        type=click.IntRange(min=2),
        default=None,
        help="Tokens per stream, prompt included (default: the model's positions, at most 1024).",
    ),
    click.option(
        "--prefill-chunk",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Prefill long prompts this many tokens at a time between decode steps (0: whole prompts).",
    ),
)


def openai_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(DECODER_OPTIONS):
        command = option(command)
    return command


def serve_decoders(
    models: Sequence[str],
    names: Sequence[str],
    *,
    tokenizer: str | None,
    chat_template: str,
    max_streams: int,
    max_queue: int,
    max_length: int | None,
    prefill_chunk: int,
    host: str,
    port: int,
    replicas: int,
    cpus_per_replica: float | None,
    address: str | None,
    ready_timeout: float,
    access_log: bool,
    as_json: bool,
    started: float,
) -> None:
    from ortpilot.errors import UsageError
    from ortpilot.serve.decoder import prepare_decoder
    from ortpilot.serve.openai_app import ROUTE_PREFIX, run_openai_server

    if names and len(names) != len(models):
        raise UsageError(f"--name is given {len(names)} time(s) for {len(models)} model(s): one per model, or none.")
    if tokenizer and len(models) > 1:
        raise UsageError("--tokenizer names one tokenizer; serve one decoder with it, or folders with their own.")
    specs = [
        prepare_decoder(
            m,
            names[i] if names else None,
            tokenizer=tokenizer,
            chat_template=chat_template,
            max_streams=max_streams,
            max_queue=max_queue,
            max_length=max_length,
            prefill_chunk=prefill_chunk,
        )
        for i, m in enumerate(models)
    ]
    if len({s.name for s in specs}) != len(specs):
        raise UsageError("Two decoders would be served under one name; give each its own --name.")
    for spec in specs:
        for note in spec.notes:
            stderr.print(f"[dim]{spec.name}: {note}[/]", highlight=False)

    def ready(docs: list[dict]) -> None:
        url = f"http://{host}:{port}{ROUTE_PREFIX}"
        if as_json:
            emit_json({"url": url, "models": docs})
        else:
            for doc in docs:
                info = doc["ortpilot"]
                stdout.print(
                    f"{doc['id']}: {replicas} replica{'s' if replicas != 1 else ''} ready on "
                    f"CPUExecutionProvider, {url} (OpenAI API; {info['max_streams']} streams of "
                    f"{info['max_length']} tokens, queue {info['max_queue']}; cold start "
                    f"{time.perf_counter() - started:.1f} s)",
                    highlight=False,
                    soft_wrap=True,
                )
        sys.stdout.flush()
        stderr.print("serving; SIGINT or SIGTERM stops", highlight=False)

    run_openai_server(
        specs,
        host=host,
        port=port,
        replicas=replicas,
        cpus_per_replica=cpus_per_replica,
        address=address,
        ready_timeout=ready_timeout,
        access_log=access_log,
        on_ready=ready,
    )
    stderr.print("stopped", highlight=False)
