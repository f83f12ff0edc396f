"""Decode ms/token of ortpilot's generation loops at several context lengths, interleaved.

For each context C the prompt is C - N tokens and N tokens are generated, so every timed step
runs with a past of C - N .. C - 1 tokens. Each configuration (loop x model) is prefilled once;
then the configurations take turns of ``--turn`` decode steps each, in rotating order
(``_interleave.py``), so a noisy moment on the machine hits them all alike. Reported: median and p90
ms/token, ratio to the plain loop on the source model, bytes crossing numpy <-> ORT per token
(KV cache separately) and whether all greedy tokens are identical.

    .venv/bin/python benchmarks/bench_decode.py                        # demo decoder
    .venv/bin/python benchmarks/bench_decode.py --model benchmarks/models/smollm2/model.onnx --int8
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from _interleave import interleave_steps

from ortpilot.decode.loops import DecodeLoop, make_loop
from ortpilot.decode.signature import DecoderSignature, detect_signature
from ortpilot.passes.decoder_fusion import fuse_decoder, summary
from ortpilot.session import SessionSettings, VerifiedSession, load


@dataclass
class Config:
    name: str
    model: str  # which model variant
    loop: str
    vsession: VerifiedSession
    signature: DecoderSignature
    runner: DecodeLoop | None = None
    steps_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prefill_s: float = 0.0


def build_models(path: str | None, int8: bool, log) -> dict[str, onnx.ModelProto]:
    if path is None:
        from ortpilot.models import make_decoder

        source = make_decoder()
    else:
        from ortpilot.modelio import load_model

        source = load_model(path)
    models = {"source": source}
    fused = fuse_decoder(source)
    log(summary(fused))
    models["fused"] = fused.model
    if int8:
        models["fused-int8"] = quantize_int8(fused.model)
    return models


def quantize_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """ORT's dynamic INT8 (weights int8, activations quantized at run time) of the fused model."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, src, save_as_external_data=model.ByteSize() > 1_800_000_000)
        quantize_dynamic(
            src,
            dst,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            extra_options={"MatMulConstBOnly": True},
        )
        return onnx.load(dst)


def make_configs(models: dict[str, onnx.ModelProto], threads: int, spin: bool) -> list[Config]:
    # Without spinning, idle ORT threads sleep instead of burning a core: fairer on a shared machine.
    settings = SessionSettings(
        intra_op_threads=threads, config_entries={} if spin else {"session.intra_op.allow_spinning": "0"}
    )
    wanted = [
        ("source", "plain"),
        ("source", "bound"),
        ("fused", "plain"),
        ("fused", "bound"),
        ("fused", "shared"),
        ("fused-int8", "shared"),
    ]
    sessions: dict[str, tuple[VerifiedSession, DecoderSignature]] = {}
    configs = []
    for variant, loop in wanted:
        if variant not in models:
            continue
        if variant not in sessions:
            sessions[variant] = (
                load(models[variant], settings=settings, placement=False),
                detect_signature(models[variant]),
            )
        sess, sig = sessions[variant]
        configs.append(Config(f"{variant}/{loop}", variant, loop, sess, sig))
    return configs


def run_context(configs: list[Config], context: int, new_tokens: int, vocab: int, seed: int, turn: int) -> None:
    prompt = np.random.default_rng(seed).integers(1, vocab, size=(1, context - new_tokens))
    mask = np.ones_like(prompt)
    tokens = {}
    for cfg in configs:
        cfg.runner = make_loop(cfg.loop, cfg.vsession.session, cfg.signature, context)
        cfg.steps_ms, cfg.tokens = [], []
        t0 = time.perf_counter()
        logits = cfg.runner.prefill(prompt, mask)
        cfg.prefill_s = time.perf_counter() - t0
        tokens[cfg.name] = int(logits[0].argmax())
        cfg.tokens.append(tokens[cfg.name])
    # Traffic counters start after prefill: per-token figures are decode only.
    base = {cfg.name: cfg.runner.traffic.snapshot() for cfg in configs}

    def step(cfg: Config) -> None:
        ids = np.array([[cfg.tokens[-1]]])
        t0 = time.perf_counter()
        logits = cfg.runner.step(ids)
        nxt = int(logits[0].argmax())
        cfg.steps_ms.append((time.perf_counter() - t0) * 1e3)
        cfg.tokens.append(nxt)

    interleave_steps(configs, new_tokens - 1, turn, step)
    for cfg in configs:
        cfg.traffic = cfg.runner.traffic.since(base[cfg.name])  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="ONNX decoder (default: the built-in demo decoder)")
    parser.add_argument("--contexts", default="128,1024,2048")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-spin", action="store_true", help="ORT threads sleep instead of spin-waiting")
    parser.add_argument(
        "--turn",
        type=int,
        default=8,
        help="decode steps a configuration runs before the next one takes over (default 8)",
    )
    parser.add_argument("--int8", action="store_true", help="also the dynamic INT8 of the fused model")
    parser.add_argument("--json", dest="json_out", help="write all samples here")
    parser.add_argument("--tokenizer", help="tokenizer.json: also answer --question with every model variant")
    parser.add_argument("--question", default="What is the capital of France?")
    args = parser.parse_args()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    models = build_models(args.model, args.int8, log)
    configs = make_configs(models, args.threads, not args.no_spin)
    sig = configs[0].signature
    vocab = sig.vocab_size or 1000
    doc = {
        "model": args.model or "demo:decoder",
        "ort": ort.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "spinning": not args.no_spin,
        "turn": args.turn,
        "new_tokens": args.new_tokens,
        "contexts": {},
    }
    print(
        f"model {doc['model']}, ORT {ort.__version__}, {args.threads} threads"
        f"{'' if not args.no_spin else ' (no spinning)'}, {doc['date']}, "
        f"{args.new_tokens} tokens per context, medians over decode steps"
    )
    print()
    print(
        "| context | config | ms/token p50 | p90 | vs source/plain | prefill s | host B/token | KV B/token "
        "| same tokens |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|:-:|")
    for i, context in enumerate(int(c) for c in args.contexts.split(",")):
        log(f"context {context} ...")
        run_context(configs, context, args.new_tokens, vocab, seed=i, turn=args.turn)
        ref = configs[0]
        ref_p50 = float(np.median(ref.steps_ms))
        rows = {}
        for cfg in configs:
            p50, p90 = float(np.median(cfg.steps_ms)), float(np.percentile(cfg.steps_ms, 90))
            same = cfg.tokens == ref.tokens
            rows[cfg.name] = {
                "p50_ms": p50,
                "p90_ms": p90,
                "ratio": ref_p50 / p50,
                "prefill_s": cfg.prefill_s,
                "host_bytes_per_token": cfg.traffic.host_bytes / len(cfg.steps_ms),
                "kv_bytes_per_token": cfg.traffic.kv_host_bytes / len(cfg.steps_ms),
                "same_tokens": same,
                "tokens": cfg.tokens,
                "steps_ms": cfg.steps_ms,
            }
            mark = "yes" if same else f"no ({_agree(cfg.tokens, ref.tokens)})"
            print(
                f"| {context} | {cfg.name} | {p50:.2f} | {p90:.2f} | {ref_p50 / p50:.2f}x | {cfg.prefill_s:.2f} "
                f"| {rows[cfg.name]['host_bytes_per_token']:.0f} | {rows[cfg.name]['kv_bytes_per_token']:.0f} "
                f"| {mark} |",
                flush=True,
            )
        doc["contexts"][str(context)] = rows
    if args.tokenizer:
        doc["answers"] = answers(configs, args.tokenizer, args.question)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=1))
    return 0


def answers(configs: list[Config], tokenizer_path: str, question: str) -> dict[str, str]:
    """Greedy chat answer of each model variant, through generate's auto loop."""
    from ortpilot.decode import Generator, text

    tok = text.load_tokenizer(tokenizer_path)
    ids = text.encode(tok, text.chat_prompt(tok, question))
    out = {}
    print()
    for cfg in configs:
        if cfg.model in out:
            continue
        result = Generator(cfg.vsession).generate(ids, 40, cfg.loop, stop_tokens=text.stop_ids(tok))
        out[cfg.model] = tok.decode([t for t in result.tokens[0] if t not in text.stop_ids(tok)])
        print(f"- {cfg.model} ({cfg.loop} loop): {question!r} -> {out[cfg.model]!r}")
    return out


def _agree(a: list[int], b: list[int]) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return f"first {n} equal"


if __name__ == "__main__":
    sys.exit(main())
