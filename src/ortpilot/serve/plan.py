"""What one ``ortpilot serve`` runs: verified models over the Open Inference Protocol, or decoders
behind the OpenAI API, decided from the targets and checked before Ray starts.

``plan`` is the decoder-vs-profile dispatch and its refusals (a server speaks one of the two
protocols; settings that do not apply to decoders are refused by name); ``run`` serves a plan
until a signal and hands its ready models to one callback. Plain data and checks, no Ray: the
CLI only parses flags into the option records and renders what ``run`` reports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ortpilot.errors import UsageError
from ortpilot.serve.errorbody import OIP, OPENAI
from ortpilot.serve.options import DecoderOptions, ServeOptions, ServerOptions, resolve_models
from ortpilot.serve.ready import Served


@dataclass(frozen=True)
class ServePlan:
    """The models one server serves and the options they are served with."""

    protocol: str  # OIP (profiles and plain models) | OPENAI (decoders, at /v1)
    models: tuple[Any, ...]  # ModelSpec for OIP, DecoderSpec for OPENAI
    options: ServeOptions
    decoder: DecoderOptions


def _decoder_refusals(options: ServeOptions) -> list[str]:
    """The ServeOptions settings a decoder replica has no use for, by their flags."""
    return [
        flag
        for flag, on in (
            ("--autoscale", options.autoscale is not None),
            ("--max-batch", options.max_batch != ServeOptions.max_batch),
            ("--accept-machine", options.accept_machine),
        )
        if on
    ] + options.text.flags()


def plan(
    targets: Sequence[str],
    names: Sequence[str] = (),
    options: ServeOptions | None = None,
    decoder: DecoderOptions | None = None,
    *,
    manifest: bool = False,
) -> ServePlan:
    """Decide what ``targets`` are served as and check it: every target a decoder (OpenAI API) or none
    (Open Inference Protocol), one name per target, no setting that does not apply (``manifest``: the
    plan is for a KubeRay manifest, which describes Open Inference Protocol models only)."""
    from ortpilot.serve.openai.spec import is_decoder_target

    options = options or ServeOptions()
    decoder = decoder or DecoderOptions()
    decoders = [t for t in targets if is_decoder_target(t, decoder.tokenizer)]
    if not decoders:
        return ServePlan(OIP, tuple(resolve_models(list(targets), list(names))), options, decoder)
    if len(decoders) != len(targets):
        others = [t for t in targets if t not in decoders]
        raise UsageError(
            f"{', '.join(decoders)} {'is a decoder' if len(decoders) == 1 else 'are decoders'} "
            "(served behind the OpenAI API under /v1) and "
            f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not: serve them from two "
            "`ortpilot serve` processes on two ports."
        )
    refused = _decoder_refusals(options) + (["--emit-rayservice"] if manifest else [])
    if refused:
        raise UsageError(
            f"{', '.join(refused)} do(es) not apply to decoders: a decoder replica batches "
            "continuously (--max-streams, --max-queue) and serves a model file, not a profile."
        )
    return ServePlan(OPENAI, tuple(_decoder_specs(targets, names, decoder)), options, decoder)


def _decoder_specs(targets: Sequence[str], names: Sequence[str], decoder: DecoderOptions) -> list[Any]:
    from ortpilot.serve.openai.spec import prepare_decoder

    if names and len(names) != len(targets):
        raise UsageError(f"--name is given {len(names)} time(s) for {len(targets)} model(s): one per model, or none.")
    if decoder.tokenizer and len(targets) > 1:
        raise UsageError("--tokenizer names one tokenizer; serve one decoder with it, or folders with their own.")
    specs = [prepare_decoder(t, names[i] if names else None, decoder) for i, t in enumerate(targets)]
    if len({s.name for s in specs}) != len(specs):
        raise UsageError("Two decoders would be served under one name; give each its own --name.")
    return specs


def run(
    serve_plan: ServePlan,
    server: ServerOptions | None = None,
    *,
    started: float | None = None,
    on_ready: Callable[[Served], None] | None = None,
    stop: threading.Event | None = None,
) -> Served:
    """Serve ``serve_plan`` until SIGINT/SIGTERM (or ``stop``); ``on_ready`` gets the ready models."""
    server = server or ServerOptions()
    if serve_plan.protocol == OPENAI:
        from ortpilot.serve.openai.server import run_openai_server

        return run_openai_server(
            list(serve_plan.models), serve_plan.options, server, started=started, on_ready=on_ready, stop=stop
        )
    from ortpilot.serve.oip.readiness import run_server

    return run_server(
        list(serve_plan.models), serve_plan.options, server, started=started, on_ready=on_ready, stop=stop
    )


__all__ = ["OIP", "OPENAI", "ServePlan", "plan", "run"]
