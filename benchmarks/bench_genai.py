"""ortpilot vs onnxruntime-genai on SmolLM2-135M-Instruct: decode ms/token at equal weight precision.

One process. genai's own fp32 and int4 builds (``benchmarks/prep_genai.py``) run through genai's
``Generator``; ortpilot's export (``benchmarks/prep_smollm2.py``) is fused into
GroupQueryAttention (constant rotary tables, packed q/k/v and gate/up) and, for 4 bits,
weight-only quantized by ``ortpilot.passes.weight_only`` (MatMulNBits block 32, symmetric,
accuracy_level 4, GatherBlockQuantized embedding) after the generation gate accepted it
(auto-excluding layers if it had not), and runs through ortpilot's shared-buffer loop.

Timing is head to head: each ortpilot configuration is paired with genai at its precision and
the two alone take turns of ``--turn`` decode steps (rotating who starts), for ``--rounds``
rounds per context, each round on a fresh random prompt of C - N token ids followed by N greedy
tokens. Pairs, not one many-way interleaving: with seven to nine sessions spinning in one
process, whichever configuration followed a busy one paid for it, and ortpilot's int4 ratio to
genai moved 0.75x-1.13x from one run to the next (BENCHMARKS.md, runs 5-7). Reported per
configuration and context: the median over rounds of each round's p50 ms/token, the median of the per-round ratios (genai's
p50 / ortpilot's p50, > 1 = ortpilot faster), their range, the rounds ortpilot won, whether the
greedy tokens agree with genai's, and each configuration's answer to "What is the capital of France?".

Run in ``.venv-genai`` (made by prep_genai.py; it sees ortpilot and torch-free onnxscript):

    .venv-genai/bin/python benchmarks/bench_genai.py --json benchmarks/out/genai.json

``--skip NAME`` (repeatable) leaves one ortpilot configuration out. ``--skip ortpilot/int4-gated``
also skips the generation gate's auto-exclude search, the slowest part of a run without
``--int8-groups`` (BENCHMARKS.md run 1: 31 sensitivity runs + 11 attempts, 712 s); genai's two
configurations are the references of every pair and cannot be skipped.
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
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_genai as og
from _interleave import interleave_steps
from _prep import write_json

from ortpilot.decode.gate import HELD_OUT_TEXTS as HELD_OUT
from ortpilot.decode.gate import auto_exclude, candidate_logits, reference_run
from ortpilot.decode.loops import make_loop
from ortpilot.decode.signature import detect_signature
from ortpilot.gate.generation import GenerationGate, score
from ortpilot.modelio import load_model
from ortpilot.passes.base import SourceModel
from ortpilot.passes.decoder_fusion import DecoderFusionPass, fuse_decoder
from ortpilot.passes.weight_only import WeightOnlyPass, layer_groups, weight_bytes
from ortpilot.session import SessionSettings, load

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "models"
QUESTION = "What is the capital of France?"
# ortpilot configurations by name (as the tables print them); --skip takes these.
SKIPPABLE = (
    "ortpilot/fp32",
    "ortpilot/int4",
    "ortpilot/int4-gated",
    "ortpilot/int4-asym",
    "ortpilot/fp32-unpacked",
    "ortpilot/int4-unpacked",
    "ortpilot-loop/genai-fp32-graph",
    "ortpilot-loop/genai-int4-graph",
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Config:
    """One model behind one loop: genai's generator or ortpilot's shared-buffer loop."""

    name: str
    precision: str
    kind: str  # genai | ortpilot
    handle: Any  # og.Model, or (VerifiedSession, DecoderSignature)
    steps_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    state: Any = None

    def prefill(self, prompt: np.ndarray, context: int) -> None:
        self.steps_ms, self.tokens = [], []
        if self.kind == "genai":
            params = og.GeneratorParams(self.handle)
            params.set_search_options(max_length=context, do_sample=False)
            self.state = og.Generator(self.handle, params)
            self.state.append_tokens(prompt.astype(np.int32))
            self.state.generate_next_token()  # picks the token from the prefill's logits (no model run)
            self.tokens.append(int(self.state.get_next_tokens()[0]))
        else:
            vsession, sig = self.handle
            self.state = make_loop("shared", vsession.session, sig, context)
            ids = prompt[None, :].astype(np.int64)
            self.tokens.append(int(self.state.prefill(ids, np.ones_like(ids))[0].argmax()))

    def step(self) -> None:
        t0 = time.perf_counter()
        if self.kind == "genai":
            self.state.generate_next_token()
            token = int(self.state.get_next_tokens()[0])
        else:
            token = int(self.state.step(np.array([[self.tokens[-1]]], dtype=np.int64))[0].argmax())
        self.steps_ms.append((time.perf_counter() - t0) * 1e3)
        self.tokens.append(token)

    def answer(self, ids: list[int], max_new: int, eos: set[int]) -> list[int]:
        out: list[int] = []
        self.prefill(np.asarray(ids), len(ids) + max_new)
        out.append(self.tokens[-1])
        while len(out) < max_new and out[-1] not in eos:
            self.step()
            out.append(self.tokens[-1])
        return [t for t in out if t not in eos]


def genai_model(path: Path, threads: int) -> og.Model:
    config = og.Config(str(path))
    config.overlay(
        json.dumps(
            {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}
        )
    )
    return og.Model(config)


def ortpilot_models(
    export: Path,
    tokenizer: og.Tokenizer,
    block_size: int,
    min_top1: float,
    new_tokens: int,
    doc: dict,
    genai_int4: og.Model,
    int8_groups: list[str] | None,
    unpacked: bool = False,
    asymmetric: bool = False,
    skip: frozenset[str] = frozenset(),
) -> dict[str, onnx.ModelProto]:
    source = load_model(export)
    if any(n.op_type == "GroupQueryAttention" for n in source.graph.node):
        fused_model = source  # already fused (e.g. genai's own fp32 graph given as --export)
    else:
        fused = fuse_decoder(source, use_cache=True)
        log(f"fusion: {fused.record.fused}")
        fused_model = fused.model
    prompts = [tokenizer.encode(p).tolist() for p in HELD_OUT]
    settings = SessionSettings(intra_op_threads=2)
    gate = GenerationGate(min_top1=min_top1)
    t0 = time.perf_counter()
    reference = reference_run(fused_model, prompts, new_tokens, settings=settings)
    plain = WeightOnlyPass("int4", block_size=block_size).transform(SourceModel(fused_model, None, "")).model
    plain_cmp = score(reference, candidate_logits(plain, reference, settings=settings), gate)
    gated_model: onnx.ModelProto | None
    gated: dict[str, Any]
    if "ortpilot/int4-gated" in skip:  # no search, no gated model
        gated_model, gated = None, {}
    elif int8_groups is None:  # the auto-exclude search
        found = auto_exclude(
            fused_model,
            prompts,
            mode="int4",
            block_size=block_size,
            symmetric=True,
            accuracy_level=4,
            gate=gate,
            new_tokens=new_tokens,
            settings=settings,
            raise_on_failure=False,
        )
        gated_model, gated = found.model, {**found.to_dict(), "searched": True}
    else:  # groups chosen by an earlier run's search, re-checked here
        groups = layer_groups(fused_model)
        nodes = [n for g in int8_groups for n in groups[g]]
        gated_model = (
            WeightOnlyPass("int4", block_size=block_size, nodes_in_int8=nodes)
            .transform(SourceModel(fused_model, None, ""))
            .model
        )
        cmp = score(reference, candidate_logits(gated_model, reference, settings=settings), gate)
        gated = {
            "passed": cmp.passed,
            "fallback": "int8",
            "excluded_groups": int8_groups,
            "sensitivity": {},
            "attempts": [],
            "comparison": cmp.to_dict(),
            "searched": False,
        }
    genai_logits = [genai_teacher_forced(genai_int4, p, t) for p, t in zip(reference.prompts, reference.tokens)]
    doc["gate"] = {
        **gated,
        "seconds": time.perf_counter() - t0,
        "plain": plain_cmp.to_dict(),
        "weight_bytes_fp32": weight_bytes(fused_model),
        "weight_bytes_int4": weight_bytes(plain),
        "genai_int4": score(reference, genai_logits, gate).to_dict(),
    }
    models = {"fp32": fused_model, "int4": plain}
    if gated_model is not None:
        doc["gate"]["weight_bytes_int4_gated"] = weight_bytes(gated_model)
        models["int4-gated"] = gated_model
        log(
            f"gate: {gated['comparison']['top1_agreement']:.3f} top-1 with {gated['excluded_groups'] or 'nothing'} "
            f"in int8; all-4-bit: {plain_cmp.summary()}"
        )
    else:
        log(f"gate: ortpilot/int4-gated skipped; all-4-bit: {plain_cmp.summary()}")
    if asymmetric:
        asym = (
            WeightOnlyPass("int4", block_size=block_size, symmetric=False)
            .transform(SourceModel(fused_model, None, ""))
            .model
        )
        doc["gate"]["asymmetric"] = score(
            reference, candidate_logits(asym, reference, settings=settings), gate
        ).to_dict()
        models["int4-asym"] = asym
    if unpacked and fused_model is not source:
        loose = DecoderFusionPass(pack=False).run(source).model
        models["fp32-unpacked"] = loose
        models["int4-unpacked"] = (
            WeightOnlyPass("int4", block_size=block_size, pack=False).transform(SourceModel(loose, None, "")).model
        )
    return {name: model for name, model in models.items() if f"ortpilot/{name}" not in skip}


def genai_teacher_forced(model: og.Model, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """genai's next-token logits [len(tokens), vocab] with the reference's tokens fed in (for the gate)."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + len(tokens) + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    out = [_last_logits(generator)]
    for token in tokens[:-1]:
        generator.append_tokens(np.array([token], dtype=np.int32))
        out.append(_last_logits(generator))
    return np.stack(out)


def _last_logits(generator: og.Generator) -> np.ndarray:
    logits = np.array(generator.get_logits())
    return logits.reshape(-1, logits.shape[-1])[-1].copy()


def chat_ids(tokenizer: og.Tokenizer) -> list[int]:
    prompt = tokenizer.apply_chat_template(
        json.dumps([{"role": "user", "content": QUESTION}]), add_generation_prompt=True
    )
    return tokenizer.encode(prompt).tolist()


def run_pair(pair: list[Config], context: int, new_tokens: int, vocab: int, seed: int, turn: int) -> None:
    """One round: both configurations prefill the same random prompt, then take turns decoding."""
    prompt = np.random.default_rng(seed).integers(1, vocab, size=context - new_tokens)
    for cfg in pair:
        cfg.prefill(prompt, context)
    interleave_steps(pair if seed % 2 else pair[::-1], new_tokens - 1, turn, Config.step)


def head_to_head(genai: Config, cfg: Config, context: int, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """``args.rounds`` rounds of ``cfg`` against ``genai``; per-round p50s, ratios and token agreement."""
    rounds = []
    for r in range(args.rounds):
        run_pair([genai, cfg], context, args.new_tokens, vocab, seed=1000 * context + r, turn=args.turn)
        ref, mine = float(np.median(genai.steps_ms)), float(np.median(cfg.steps_ms))
        rounds.append(
            {
                "genai_p50_ms": ref,
                "p50_ms": mine,
                "genai_over_this": ref / mine,
                "same_tokens_as_genai": first_diff(cfg.tokens, genai.tokens),
                "tokens": len(cfg.tokens),
                "steps_ms": cfg.steps_ms,
                "genai_steps_ms": genai.steps_ms,
            }
        )
    ratios = [r["genai_over_this"] for r in rounds]
    return {
        "p50_ms": float(np.median([r["p50_ms"] for r in rounds])),
        "genai_p50_ms": float(np.median([r["genai_p50_ms"] for r in rounds])),
        "ratio_median": float(np.median(ratios)),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds_won": sum(x >= 1.0 for x in ratios),
        "rounds": rounds,
        "tokens_equal_rounds": sum(r["same_tokens_as_genai"] == r["tokens"] for r in rounds),
    }


def first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", default=str(MODELS / "smollm2" / "model.onnx"), help="ortpilot's ONNX export")
    parser.add_argument("--genai", default=str(MODELS), help="folder with genai-fp32/ and genai-int4/")
    parser.add_argument("--contexts", default="128,1024,2048")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--turn",
        type=int,
        default=8,
        help="decode steps a configuration runs before the other one takes over (default 8)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="head-to-head rounds per configuration and context, each on a fresh prompt (default 5)",
    )
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--min-top1", type=float, default=0.9)
    parser.add_argument("--gate-tokens", type=int, default=16)
    parser.add_argument(
        "--int8-groups",
        help="comma-separated layer groups to keep in 8 bits (e.g. from an "
        "earlier run's search) instead of running the auto-exclude search",
    )
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="also time fp32 and int4 without packing q/k/v and gate/up (the fusion's pack=False)",
    )
    parser.add_argument(
        "--asymmetric",
        action="store_true",
        help="also time and gate the all-4-bit model with zero points (symmetric=False)",
    )
    parser.add_argument(
        "--genai-graphs",
        action="store_true",
        help="also run ortpilot's shared-buffer loop on genai's own fp32 and int4 graphs",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=SKIPPABLE,
        metavar="NAME",
        help="leave this ortpilot configuration out (repeatable): "
        + ", ".join(SKIPPABLE)
        + "; ortpilot/int4-gated also skips the auto-exclude search, the slowest part of a run",
    )
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    skip = frozenset(args.skip)

    doc: dict[str, Any] = {
        "ort": ort.__version__,
        "genai": og.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "command": " ".join(sys.argv),
        "skipped": sorted(skip),
        "contexts": {},
    }
    genai = {p: genai_model(Path(args.genai) / f"genai-{p}", args.threads) for p in ("fp32", "int4")}
    tokenizer = og.Tokenizer(genai["fp32"])
    models = ortpilot_models(
        Path(args.export),
        tokenizer,
        args.block_size,
        args.min_top1,
        args.gate_tokens,
        doc,
        genai["int4"],
        args.int8_groups.split(",") if args.int8_groups else None,
        args.unpacked,
        args.asymmetric,
        skip,
    )
    settings = SessionSettings(intra_op_threads=args.threads, inter_op_threads=1)
    configs = [Config(f"genai/{p}", p, "genai", genai[p]) for p in ("fp32", "int4")]
    for p, model in models.items():
        session = load(model, settings=settings, placement=False)
        configs.append(Config(f"ortpilot/{p}", p.split("-")[0], "ortpilot", (session, detect_signature(model))))
    if args.genai_graphs:  # ortpilot's loop on genai's own graphs: separates the graph from the loop
        for p in (p for p in ("fp32", "int4") if f"ortpilot-loop/genai-{p}-graph" not in skip):
            graph = load_model(Path(args.genai) / f"genai-{p}" / "model.onnx")
            session = load(graph, settings=settings, placement=False)
            configs.append(Config(f"ortpilot-loop/genai-{p}-graph", p, "ortpilot", (session, detect_signature(graph))))
    if len(configs) == 2:
        parser.error("--skip left no ortpilot configuration to time")
    vocab = configs[-1].handle[1].vocab_size or 49152
    print(
        f"SmolLM2-135M-Instruct, ORT {ort.__version__}, onnxruntime-genai {og.__version__}, {args.threads} threads, "
        f"{doc['date']}; head to head with genai at the same precision, {args.rounds} rounds x "
        f"{args.new_tokens - 1} decode steps per context\n"
    )
    print(
        "| context | config | ms/token p50 | genai p50 | genai / ortpilot (median, range) | rounds won "
        "| greedy tokens = genai's |"
    )
    print("|---:|---|---:|---:|---:|:-:|:-:|")
    genai_of = {c.precision: c for c in configs if c.kind == "genai"}
    for context in (int(c) for c in args.contexts.split(",")):
        log(f"context {context} ...")
        rows = {}
        for cfg in (c for c in configs if c.kind != "genai"):
            row = head_to_head(genai_of[cfg.precision], cfg, context, args, vocab)
            rows[cfg.name] = row
            print(
                f"| {context} | {cfg.name} | {row['p50_ms']:.2f} | {row['genai_p50_ms']:.2f} | "
                f"{row['ratio_median']:.2f}x ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) | "
                f"{row['rounds_won']}/{args.rounds} | {row['tokens_equal_rounds']}/{args.rounds} rounds |",
                flush=True,
            )
        doc["contexts"][str(context)] = rows
    ids, eos = chat_ids(tokenizer), set(tokenizer.eos_token_ids.tolist())
    doc["answers"] = {}
    print()
    for cfg in configs:
        text = tokenizer.decode(np.asarray(cfg.answer(ids, 40, eos), dtype=np.int32))
        doc["answers"][cfg.name] = text
        print(f"- {cfg.name}: {QUESTION!r} -> {text!r} ({'names Paris' if 'Paris' in text else 'NO Paris'})")
    gate = doc["gate"]
    print(
        f"\ngate vs ortpilot fp32 ({len(HELD_OUT)} held-out prompts x {args.gate_tokens} greedy tokens, "
        f"top-1 >= {args.min_top1}); weights fp32 {gate['weight_bytes_fp32'] / 1e6:.0f} MB\n"
    )
    print("| model | top-1 agreement | KL mean | KL max | identical tokens min / mean | passed | weights MB |")
    print("|---|---:|---:|---:|---:|:-:|---:|")
    plain = gate["plain"]
    rows = [("ortpilot int4 (all 4-bit)", plain, gate["weight_bytes_int4"])]
    if "comparison" in gate:  # not with --skip ortpilot/int4-gated
        rows.append(
            (
                f"ortpilot int4-gated ({len(gate['excluded_groups'])} groups in {gate['fallback']})",
                {**gate["comparison"], "passed": gate["passed"]},
                gate["weight_bytes_int4_gated"],
            )
        )
    rows.append(("genai int4", gate["genai_int4"], None))
    for name, cmp, size in rows:
        print(
            f"| {name} | {cmp['top1_agreement']:.3f} | {cmp['kl_mean']:.4f} | {cmp['kl_max']:.3f} | "
            f"{cmp['min_identical_tokens']} / {cmp['mean_identical_tokens']:.1f} | {'yes' if cmp['passed'] else 'no'} | "
            f"{'' if size is None else f'{size / 1e6:.0f}'} |"
        )
    if "comparison" in gate:
        how = (
            f"found by the search: {len(gate['attempts'])} attempts + {len(gate['sensitivity'])} sensitivity runs"
            if gate["searched"]
            else "given with --int8-groups"
        )
        print(
            f"\nkept in {gate['fallback']}: {', '.join(gate['excluded_groups']) or 'nothing'} ({how}); "
            f"gate work {gate['seconds']:.0f} s"
        )
    else:
        print(f"\nortpilot/int4-gated skipped (--skip): no auto-exclude search; gate work {gate['seconds']:.0f} s")
    write_json(args.json_out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
