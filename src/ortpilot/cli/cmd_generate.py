"""``ortpilot generate``: tokens from an ONNX decoder through the fastest loop it supports."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from ortpilot.cli.common import (
    ISOLATE_OPTION,
    JSON_OPTION,
    MODEL_FILE_OPTION,
    POLICY_OPTION,
    emit_json,
    handle_errors,
    parse_kv_list,
    preflight_isolated,
    resolve_model_arg,
    stderr,
)
from ortpilot.cli.flags import PROVIDER_OPTION, choice_option, fusion_flags
from ortpilot.cli.groups import arg_group
from ortpilot.decode.options import (
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_LOOP,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_SPECULATION,
    LOOP_CHOICES,
    SPECULATION_MODES,
    GenerateOptions,
)
from ortpilot.decode.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, SamplingConfig
from ortpilot.errors import UsageError
from ortpilot.passes.options import DecoderFusionOptions

if TYPE_CHECKING:
    from ortpilot.decode import GenerationResult, Generator
    from ortpilot.session import SessionSettings

log = logging.getLogger("ortpilot")


def _prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise UsageError(f"--prompt-ids '{text}' is not a comma-separated list of integers, e.g. 1,2,3.") from None
    if not ids:
        raise UsageError("--prompt-ids is empty; give at least one token id.")
    return ids


def build_options(
    max_new_tokens: int,
    max_length: int | None,
    loop: str,
    speculation: str,
    draft_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop_id: tuple[int, ...],
) -> GenerateOptions:
    """The request flags as a ``GenerateOptions`` (the tokenizer's end-of-turn ids join ``stop_tokens`` later)."""
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {max_new_tokens}.")
    return GenerateOptions(
        max_new_tokens=max_new_tokens,
        loop=loop,
        sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        stop_tokens=stop_id,
        max_length=max_length,
        speculation=speculation,
        draft_tokens=draft_tokens,
    )


def build_fusion(fuse_attention: bool, max_positions: int | None) -> DecoderFusionOptions | None:
    """``--fuse`` as the decoder fusion to run before loading (None without it)."""
    if max_positions is not None and not fuse_attention:
        raise UsageError(
            "--max-positions sets the length of the rotary tables --fuse stores; it does nothing "
            "without --fuse (a model fused earlier keeps the limit it was fused with)."
        )
    return DecoderFusionOptions(max_positions=max_positions) if fuse_attention else None


GENERATE_OPTIONS = arg_group(
    "options",
    build_options,
    click.option(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        show_default=True,
        help="Tokens to generate at most.",
    ),
    click.option(
        "--max-length",
        type=int,
        default=None,
        help="Cap on prompt + new tokens; also the size of the shared KV buffer.",
    ),
    choice_option("--loop", LOOP_CHOICES, DEFAULT_LOOP, "auto picks the fastest the model supports."),
    choice_option(
        "--speculation",
        SPECULATION_MODES,
        DEFAULT_SPECULATION,
        "Prompt-lookup speculative decoding for a greedy request on the shared loop: auto (where its drafts "
        "pay), on, off.",
    ),
    click.option(
        "--draft-tokens",
        type=int,
        default=DEFAULT_DRAFT_TOKENS,
        show_default=True,
        help="Tokens a speculative draft proposes per verify run (at least 1).",
    ),
    click.option("--temperature", type=float, default=DEFAULT_TEMPERATURE, show_default=True, help="0 = greedy."),
    click.option("--top-k", type=int, default=DEFAULT_TOP_K, show_default=True, help="0 = no cut."),
    click.option("--top-p", type=float, default=DEFAULT_TOP_P, show_default=True, help="1.0 = no cut."),
    click.option("--seed", type=int, default=None, help="Seed for sampling."),
    click.option(
        "--stop-id",
        "stop_id",
        multiple=True,
        type=int,
        help="Stop token id (repeatable; with --tokenizer its end-of-turn ids are added).",
    ),
)
DECODER_FUSION = arg_group(
    "fusion",
    build_fusion,
    fusion_flags(
        "Fuse attention into GroupQueryAttention first (onnxscript), so the shared-buffer loop applies.",
        "With --fuse: positions the constant rotary tables cover, the fused model's length limit "
        "(default: the export's recorded context length, else 8192; 0 keeps the tables computed per step).",
        dest="fuse_attention",
    ),
)


@click.command("generate")
@MODEL_FILE_OPTION
@click.argument("model")
@click.option("--prompt-ids", help="Prompt as comma-separated token ids, e.g. 1,2,3.")
@click.option("--prompt", help="Prompt text (needs --tokenizer).")
@click.option(
    "--tokenizer",
    type=click.Path(dir_okay=True),
    help="Hugging Face tokenizer.json (or its folder); demo:decoder brings its own byte-level one.",
)
@click.option("--chat", is_flag=True, help="Wrap --prompt in the ChatML chat template (SmolLM2, Qwen).")
@click.option("--system", help="System message for --chat.")
@click.option(
    "--map",
    "mapping",
    multiple=True,
    help="ROLE=NAME (input_ids, attention_mask, position_ids, logits, ...) or PAST_INPUT=PRESENT_OUTPUT.",
)
@PROVIDER_OPTION
@POLICY_OPTION
@click.option("--threads", type=int, default=0, show_default=True, help="ORT intra-op threads (0 = ORT's default).")
@ISOLATE_OPTION
@JSON_OPTION
@handle_errors
@GENERATE_OPTIONS
@DECODER_FUSION
def command(
    model: str,
    prompt_ids: str | None,
    prompt: str | None,
    tokenizer: str | None,
    chat: bool,
    system: str | None,
    mapping: tuple[str, ...],
    providers: tuple[str, ...],
    policy: str,
    threads: int,
    isolate: bool,
    as_json: bool,
    options: GenerateOptions,
    fusion: DecoderFusionOptions | None,
) -> None:
    """Generate tokens after a prompt, streaming them to stdout (or one JSON document)."""
    from ortpilot.decode import Generator
    from ortpilot.decode.prepare import stop_ids
    from ortpilot.session import SessionSettings

    tok, ids = _read_prompt(model, prompt_ids, prompt, tokenizer, chat, system)
    settings = SessionSettings(intra_op_threads=threads)
    source, notes = _prepare_source(model, providers, settings, isolate, fusion)
    gen = Generator(
        source, providers=list(providers) or None, policy=policy, settings=settings, mapping=parse_kv_list(mapping)
    )
    # --stop-id is held to the vocabulary (Generator.generate); the tokenizer's own end-of-turn ids are added where
    # the model can produce them
    own = [t for t in stop_ids(tok) if t not in options.stop_tokens]
    beyond = gen.signature.outside_vocabulary(own)
    if beyond:
        log.warning(
            "The tokenizer's end-of-turn id(s) %s lie outside the model's vocabulary (0 .. %s): left out of the stops.",
            beyond,
            gen.signature.vocab_size - 1 if gen.signature.vocab_size else "n",
        )
    options = replace(options, stop_tokens=(*options.stop_tokens, *(t for t in own if t not in beyond)))
    result = gen.generate(ids, options=options, stream=None if as_json else _streamer(tok))
    if as_json:
        emit_json(_document(model, gen, result, notes, tok, list(options.stop_tokens)))
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    _summary(result)


def _read_prompt(
    model: str, prompt_ids: str | None, prompt: str | None, tokenizer: str | None, chat: bool, system: str | None
) -> tuple[Any, list[int]]:
    """The tokenizer (None without one) and the prompt's token ids, from exactly one of the two prompt flags."""
    from ortpilot.decode import text as textmod
    from ortpilot.decode.prepare import find_tokenizer

    if (prompt_ids is None) == (prompt is None):
        raise UsageError("Give exactly one of --prompt-ids 1,2,3 or --prompt TEXT (with --tokenizer).")
    tokenizer_path = find_tokenizer(model, tokenizer, demo_own=prompt is not None)
    tok = textmod.load_tokenizer(tokenizer_path) if tokenizer_path else None
    if prompt is None:
        return tok, _prompt_ids(prompt_ids or "")
    if tok is None:
        raise UsageError("--prompt needs --tokenizer PATH/tokenizer.json (or use --prompt-ids).")
    return tok, textmod.encode(tok, textmod.chat_prompt(tok, prompt, system) if chat else prompt)


def _prepare_source(
    model: str,
    providers: tuple[str, ...],
    settings: SessionSettings,
    isolate: bool,
    fusion: DecoderFusionOptions | None,
) -> tuple[Any, list[str]]:
    """The model to load (fused first with ``--fuse``, preflighted in a child with ``--isolate``) and the
    notes that say what was done to it."""
    from ortpilot.decode.prepare import fuse

    source: Any = resolve_model_arg(model)
    if isolate:
        preflight_isolated([source], list(providers) or None, settings)
    notes = []
    if fusion is not None:
        source, note, _ = fuse(source, fusion.max_positions)
        notes.append(note)
        stderr.print(f"[dim]{escape(note)}[/]", highlight=False)
    return source, notes


def _document(
    model: str, gen: Generator, result: GenerationResult, notes: list[str], tok: Any, stops: list[int]
) -> dict[str, Any]:
    """The ``--json`` document: the result, the decoder's signature, notes, and the text when a tokenizer decodes it."""
    doc = {"model": model, **result.to_dict(), "signature": gen.signature.to_dict()}
    doc["notes"] = notes + doc["notes"]
    if tok is not None:
        doc["text"] = tok.decode([t for t in result.tokens[0] if t not in stops])
    return doc


def _streamer(tok: Any):
    """Print each new token as it comes: text through the tokenizer, else ids."""
    seen: list[int] = []
    printed = [""]

    def on_token(tokens: Any) -> None:
        seen.append(int(tokens[0]))
        if tok is None:
            sys.stdout.write(f"{seen[-1]} ")
        else:
            text = tok.decode(seen)
            if not text.endswith("\ufffd"):  # wait for a whole UTF-8 character
                sys.stdout.write(text[len(printed[0]) :])
                printed[0] = text
        sys.stdout.flush()

    return on_token


def _summary(r: Any) -> None:
    stderr.print(
        "[dim]"
        + escape(
            f"loop {r.loop} ({r.loop_reason}); {len(r.tokens[0])} tokens, stop: {r.stop_reason}; "
            f"prefill {r.prompt_length} tokens at {r.prefill_tokens_per_s:.1f} tok/s; decode "
            f"{r.decode_tokens_per_s:.1f} tok/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms; "
            f"host bytes/token {r.host_bytes_per_token:.0f} (KV cache {r.kv_host_bytes_per_token:.0f}); "
            f"peak RSS {r.peak_rss_bytes / 2**20:.0f} MiB"
        )
        + "[/]",
        highlight=False,
    )
    spec = r.speculation
    if spec.get("runs"):
        stderr.print(
            f"[dim]speculation: {spec['runs']} verify runs, {spec['accepted']} of {spec['drafted']} drafted tokens "
            f"accepted, {spec['emitted']} tokens from them[/]",
            highlight=False,
        )
    for note in r.notes:
        stderr.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
