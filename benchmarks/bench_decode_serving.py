"""Many streams at once on SmolLM2-135M: continuous batching vs one stream at a time vs genai's static batch.

Three ways to serve the same N requests (N = ``--streams``, each a distinct random prompt of
``--prompt-tokens`` ids and ``--new-tokens`` greedy tokens, no stop id), at fp32 and int4:

- ``continuous``: ortpilot's ``Scheduler`` (one batched shared-buffer loop, N slots): requests
  join the running batch between steps, driven in real time on this thread.
- ``sequential``: ortpilot's single-stream shared-buffer loop (``Generator.generate``), one request
  after another in arrival order (a server without batching).
- ``genai-static``: onnxruntime-genai's batched ``Generator`` on all N prompts as one static batch
  (``batch_size`` N), started when the last request has arrived.

Two arrival patterns: ``together`` (all at t = 0) and ``staggered`` (request i at i x
``--interval-ms``). Reported per configuration: aggregate tokens/s (all new tokens over the time
from the first arrival to the last token), the per-stream ms/token as inter-token latency
(ITL: every interval between two tokens of a stream, pooled over the N streams, p50 and p99; the
p99 shows a stream waiting while others prefill) and as time per output token (TPOT: a stream's
mean interval, p50 over streams), and time to first token p50/p99 from each request's arrival.
``sequential`` and ``genai-static`` run each request or
batch for real and place it on the arrival timeline (a request starts when it has arrived and the
one before it is done; the static batch when the last request has arrived); ``continuous`` runs
on the real clock. The three run back to back for every (precision, N, pattern), in an order
rotated every round, ``--rounds`` rounds; the tables give medians over rounds. Every round checks
that every continuous stream's greedy tokens equal the same prompt's single-stream tokens.

A precision label ``A+B`` (e.g. ``int4+base``) runs the continuous system with several weight
formats of the fp32 model (``EngineOptions.formats`` = A, B; each step on the format measured
fastest for its row count, gated with ``--format-min-top1``), against the single-stream loop and
genai at precision A; ``changed`` counts its answers that differ from the single-format
single-stream ones.

``--workload`` picks what is measured (every workload runs one cell at a time with ``--precisions``,
``--streams``, ``--patterns``):

- ``serving`` (default): the matrix above.
- ``shared-prefix``: N streams whose prompts share a ``--prefix-tokens`` system prompt (random ids)
  followed by ``--prompt-tokens`` of their own; the continuous system with the prefix cache (warm:
  one request with the system prompt ran before) against the same without it (``prefix_cache_bytes``
  0); TTFT p50/p99 and tokens/s; answers that differ between the two are counted.
- ``speculation``: single-stream greedy answers (``--new-tokens``) to chat prompts with SmolLM2's
  tokenizer: ``grounded`` ones (summaries, code edits: answers that copy from the prompt) and
  ``open`` ones; the shared loop plain (``speculation off``) against ``auto`` and ``on``, taking
  turns per prompt; tokens/s, verify runs, accepted drafted tokens, answers changed against plain.

Run in ``.venv-genai`` (``benchmarks/prep_genai.py``), under the exclusive CPU lock:

    flock -x /tmp/ortpilot-cpu.lock .venv-genai/bin/python benchmarks/bench_decode_serving.py \\
        --json benchmarks/out/decode_serving.json
    flock -x /tmp/ortpilot-cpu.lock .venv-genai/bin/python benchmarks/bench_decode_serving.py \\
        --precisions int4+base --streams 8 --new-tokens 128 --format-min-top1 0.6
    flock -x /tmp/ortpilot-cpu.lock .venv-genai/bin/python benchmarks/bench_decode_serving.py \\
        --workload shared-prefix --streams 8 --prefix-tokens 512 --prompt-tokens 32
    flock -x /tmp/ortpilot-cpu.lock .venv-genai/bin/python benchmarks/bench_decode_serving.py \\
        --workload speculation --precisions fp32,int4 --new-tokens 128

``shared-prefix`` and ``speculation`` do not need onnxruntime-genai (any venv with ortpilot's
``generate`` extra runs them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from _prep import write_json

from ortpilot.decode import EngineOptions, Generator, Scheduler
from ortpilot.decode.gate import text_prompts
from ortpilot.modelio import load_model
from ortpilot.passes.base import SourceModel
from ortpilot.passes.decoder_fusion import fuse_decoder
from ortpilot.passes.weight_only import WeightOnlyPass
from ortpilot.session import SessionSettings, load

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "models"
SYSTEMS = ("continuous", "sequential", "genai-static")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def summarize(
    arrivals: list[float], firsts: list[float], ends: list[float], gaps_ms: list[list[float]], tokens: list[int]
) -> dict[str, float]:
    """Aggregate tokens/s, inter-token latency, time per output token and TTFT of one configuration.

    ``gaps_ms[i]``: request i's intervals between consecutive tokens. ITL p50/p99 pool every
    interval of every request (p99 shows the stalls: a stream waiting while others prefill); TPOT
    is a request's mean interval, its p50 over requests.
    """
    pooled = [g for request in gaps_ms for g in request]
    tpot = [float(np.mean(g)) for g in gaps_ms if g]
    ttft = [(f - a) * 1e3 for f, a in zip(firsts, arrivals)]
    span = max(ends) - min(arrivals)
    return {
        "tokens_per_s": sum(tokens) / span,
        "itl_p50_ms": float(np.percentile(pooled, 50)),
        "itl_p99_ms": float(np.percentile(pooled, 99)),
        "tpot_p50_ms": float(np.percentile(tpot, 50)),
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "span_s": span,
    }


def run_continuous(
    gen: Generator | Scheduler,
    prompts: list[list[int]],
    arrivals: list[float],
    new: int,
    max_length: int,
    prefill_chunk: int,
    options: EngineOptions | None = None,
) -> tuple[dict[str, float], list[list[int]], dict[str, Any]]:
    """``gen``: a generator (a fresh scheduler is made for the run) or a scheduler kept across runs."""
    scheduler = (
        gen
        if isinstance(gen, Scheduler)
        else Scheduler(
            gen,
            max_streams=len(prompts),
            max_queue=len(prompts),
            max_length=max_length,
            prefill_chunk=prefill_chunk,
            options=options,
        )
    )
    start = time.perf_counter()
    streams: list[Any] = []
    while len(streams) < len(prompts) or scheduler.pending:
        now = time.perf_counter() - start
        while len(streams) < len(prompts) and arrivals[len(streams)] <= now:
            streams.append(scheduler.submit(prompts[len(streams)], new))
        if scheduler.pending:
            scheduler.step()
        elif len(streams) < len(prompts):
            time.sleep(max(0.0, arrivals[len(streams)] - (time.perf_counter() - start)))
    firsts = [s.token_times[0] - start for s in streams]
    ends = [s.token_times[-1] - start for s in streams]
    gaps = [(np.diff(s.token_times) * 1e3).tolist() for s in streams]
    stats = scheduler.stats()
    counters = scheduler.counters()
    return (
        summarize(arrivals, firsts, ends, gaps, [len(s.tokens) for s in streams]),
        [s.tokens for s in streams],
        {
            "mean_rows_per_step": stats["mean_rows_per_step"],
            "formats": counters["formats"],
            "prefix_cache": counters["prefix_cache"],
            "speculation": counters["speculation"],
        },
    )


def run_sequential(
    gen: Generator, prompts: list[list[int]], arrivals: list[float], new: int
) -> tuple[dict[str, float], list[list[int]]]:
    clock, firsts, ends, gaps, out = 0.0, [], [], [], []
    for prompt, arrival in zip(prompts, arrivals):
        begin = max(clock, arrival)
        t0 = time.perf_counter()
        result = gen.generate(prompt, new, "shared", speculation="off")
        took = time.perf_counter() - t0
        firsts.append(begin + result.prefill_s)
        ends.append(begin + took)
        gaps.append(list(result.step_ms))
        out.append(result.tokens[0])
        clock = begin + took
    return summarize(arrivals, firsts, ends, gaps, [len(t) for t in out]), out


def run_genai(
    model: Any, prompts: list[list[int]], arrivals: list[float], new: int
) -> tuple[dict[str, float], list[list[int]]]:
    import onnxruntime_genai as og

    length = len(prompts[0]) + new
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=len(prompts), max_length=length, min_length=length, do_sample=False)
    begin = max(arrivals)  # a static batch starts when its last request is in
    t0 = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompts, dtype=np.int32))
    tokens: list[list[int]] = [[] for _ in prompts]
    times: list[float] = []
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in enumerate(generator.get_next_tokens().tolist()):
            tokens[row].append(int(token))
        times.append(time.perf_counter() - t0)
    n, gaps = len(prompts), (np.diff(times) * 1e3).tolist()
    summary = summarize(arrivals, [begin + times[0]] * n, [begin + times[-1]] * n, [gaps] * n, [len(t) for t in tokens])
    return summary, tokens


def genai_model(path: Path, threads: int) -> Any:
    import onnxruntime_genai as og

    config = og.Config(str(path))
    config.overlay(
        json.dumps(
            {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}
        )
    )
    return og.Model(config)


def ortpilot_models(export: Path, precisions: list[str]) -> dict[str, Any]:
    """The fused fp32 model and, if a label asks for it, its int4 build (what bench_genai.py builds)."""
    fused = fuse_decoder(load_model(export), use_cache=True).model
    models: dict[str, Any] = {"fp32": fused}
    if any(p.split("+")[0] == "int4" for p in precisions):  # MatMulNBits block 32, symmetric, accuracy_level 4
        models["int4"] = WeightOnlyPass("int4", block_size=32).transform(SourceModel(fused, None, "")).model
    return models


def ortpilot_generators(export: Path, threads: int, precisions: list[str]) -> dict[str, Generator]:
    """One generator per single-format precision (a label A+B adds A's, and fp32's for its formats)."""
    models = ortpilot_models(export, precisions)
    settings = SessionSettings(intra_op_threads=threads, inter_op_threads=1)
    wanted = {p.split("+")[0] for p in precisions} | ({"fp32"} if any("+" in p for p in precisions) else set())
    return {p: Generator(load(models[p], settings=settings, placement=False)) for p in sorted(wanted)}


def engine_options(args: argparse.Namespace, precision: str, **overrides: Any) -> EngineOptions:
    """The continuous system's engine settings: formats of a label A+B, the cache and speculation flags."""
    fields: dict[str, Any] = {
        "prefix_cache_bytes": int(args.prefix_cache_mb * 2**20),
        "speculation": args.speculation,
        "draft_tokens": args.draft_tokens,
        "format_min_top1": args.format_min_top1,
    }
    if "+" in precision:
        fields["formats"] = tuple("base" if f == "fp32" else f for f in precision.split("+"))
    fields.update(overrides)
    return EngineOptions(**fields)


def cpu_facts() -> dict[str, Any]:
    """The CPU as ``ortpilot doctor --json`` names it: model and ISA flags."""
    from ortpilot.providers.cpuisa import this_cpu

    isa = this_cpu()
    return {"model": isa.model, "flags": {k: v for k, v in isa.flags.items() if v}}


GROUNDED = (
    "Summarize the following paragraph in two sentences, reusing its wording.\n\n"
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual reefs "
    "and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 square "
    "kilometres. The reef is located in the Coral Sea, off the coast of Queensland, Australia. It can be seen "
    "from outer space and is the world's biggest single structure made by living organisms.",
    "Rename the variable `total` to `running_sum` in this function and return the whole function.\n\n"
    "def add_all(values):\n    total = 0\n    for value in values:\n        total = total + value\n"
    "    return total\n",
    "Copy this shopping list, and add the word 'fresh' before every item:\n"
    "- apples\n- bread\n- milk\n- eggs\n- tomatoes\n- cheese\n- carrots\n",
    "Add a docstring to this Python function and return the complete function.\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative size')\n"
    "    return width * height\n",
)
OPEN = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are some good habits for staying healthy?",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me ideas for a weekend trip in the mountains.",
)


def run_shared_prefix(args: argparse.Namespace, gens: dict[str, Generator], doc: dict[str, Any]) -> int:
    """N streams behind one system prompt: continuous batching with a warm prefix cache and without one."""
    vocab = next(iter(gens.values())).signature.vocab_size or 49152
    max_length = args.prefix_tokens + args.prompt_tokens + args.new_tokens
    changed_total = 0
    for precision in args.precisions.split(","):
        gen = gens[precision]
        for n in [int(x) for x in args.streams.split(",")]:
            for pattern in args.patterns.split(","):
                key = f"{precision}/{n}/{pattern}"
                arrivals = [0.0] * n if pattern == "together" else [i * args.interval_ms / 1e3 for i in range(n)]
                rows: dict[str, list[dict[str, float]]] = {"cache": [], "no-cache": []}
                changed, hits = [], []
                for r in range(args.rounds):
                    rng = np.random.default_rng(7000 + r)
                    system = rng.integers(1, vocab, size=args.prefix_tokens).tolist()
                    prompts = [system + rng.integers(1, vocab, size=args.prompt_tokens).tolist() for _ in range(n)]
                    tokens = {}
                    for system_name in ("cache", "no-cache") if r % 2 == 0 else ("no-cache", "cache"):
                        cap = 0 if system_name == "no-cache" else int(max(args.prefix_cache_mb, 1) * 2**20)
                        options = engine_options(args, precision, prefix_cache_bytes=cap)
                        scheduler = Scheduler(gen, max_streams=n, max_queue=n, max_length=max_length, options=options)
                        scheduler.submit(system + [1, 2], 1)  # an earlier request with the same system prompt
                        scheduler.run_until_idle()
                        row, tokens[system_name], info = run_continuous(
                            scheduler, prompts, arrivals, args.new_tokens, max_length, 0
                        )
                        rows[system_name].append(row)
                        if system_name == "cache":
                            hits.append(info["prefix_cache"]["hits"])
                    changed.append(sum(a != b for a, b in zip(tokens["cache"], tokens["no-cache"])))
                med = {k: {m: float(np.median([x[m] for x in v])) for m in v[0]} for k, v in rows.items()}
                doc["results"][key] = {"median": med, "rounds": rows, "changed": changed, "cache_hits": hits}
                changed_total += sum(changed)
                c, u = med["cache"], med["no-cache"]
                log(
                    f"{key}: TTFT p50 {c['ttft_p50_ms']:.0f} ms with the cache, {u['ttft_p50_ms']:.0f} without "
                    f"({u['ttft_p50_ms'] / c['ttft_p50_ms']:.2f}x); tok/s {c['tokens_per_s']:.1f} vs "
                    f"{u['tokens_per_s']:.1f}; changed {changed}; load {os.getloadavg()[0]:.1f}"
                )
    print(
        f"\n{args.prefix_tokens}-token shared system prompt + {args.prompt_tokens} own tokens, "
        f"{args.new_tokens} new tokens; medians of {args.rounds} rounds\n"
    )
    print(
        "| precision | streams | arrivals | prefix cache | TTFT p50 / p99 ms | x no-cache (p50) | tokens/s | changed |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for key, res in doc["results"].items():
        precision, n, pattern = key.split("/")
        for name in ("cache", "no-cache"):
            row = res["median"][name]
            ratio = res["median"]["no-cache"]["ttft_p50_ms"] / row["ttft_p50_ms"]
            print(
                f"| {precision} | {n} | {pattern} | {name} | {row['ttft_p50_ms']:.0f} / {row['ttft_p99_ms']:.0f} | "
                f"{ratio:.2f}x | {row['tokens_per_s']:.1f} | {sum(res['changed']) if name == 'cache' else ''} |"
            )
    return 0 if changed_total == 0 else 1


def run_speculation(args: argparse.Namespace, gens: dict[str, Generator], doc: dict[str, Any]) -> int:
    """Single-stream greedy answers to grounded and open-ended chat prompts, plain against speculation."""
    from ortpilot.decode import text as textmod

    tok = textmod.load_tokenizer(Path(args.export).parent / "tokenizer.json")
    stops = textmod.stop_ids(tok)
    modes = ("off", *args.modes.split(","))
    for precision in args.precisions.split(","):
        gen = gens[precision]
        for kind, texts in (("grounded", GROUNDED), ("open", OPEN)):
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            for r in range(args.rounds):
                for i, text in enumerate(texts):
                    ids = textmod.encode(tok, textmod.chat_prompt(tok, text))
                    order = modes if (r + i) % 2 == 0 else modes[::-1]
                    answers = {}
                    for mode in order:
                        t0 = time.perf_counter()
                        res = gen.generate(
                            ids,
                            args.new_tokens,
                            "shared",
                            stop_tokens=stops,
                            speculation=mode,
                            draft_tokens=args.draft_tokens,
                        )
                        took = time.perf_counter() - t0
                        answers[mode] = res.tokens[0]
                        runs[mode].append(
                            {
                                "prompt": i,
                                "tokens": len(res.tokens[0]),
                                "seconds": took,
                                "decode_tokens_per_s": res.decode_tokens_per_s,
                                "speculation": res.speculation,
                                "changed": False,  # set below, once the plain answer is in
                            }
                        )
                    for mode in modes:  # the plain answer may have come last
                        runs[mode][-1]["changed"] = answers[mode] != answers["off"]
            summary = {}
            for mode, rows in runs.items():
                tokens = sum(x["tokens"] for x in rows)
                seconds = sum(x["seconds"] for x in rows)
                spec = [x["speculation"] for x in rows if x["speculation"]]
                summary[mode] = {
                    "tokens_per_s": tokens / seconds,
                    "verify_runs": sum(x.get("runs", 0) for x in spec),
                    "drafted": sum(x.get("drafted", 0) for x in spec),
                    "accepted": sum(x.get("accepted", 0) for x in spec),
                    "changed": sum(x["changed"] for x in rows),
                    "answers": len(rows),
                }
            key = f"{precision}/{kind}"
            doc["results"][key] = {"summary": summary, "runs": runs}
            base = summary["off"]["tokens_per_s"]
            log(
                f"{key}: "
                + "; ".join(
                    f"{m} {v['tokens_per_s']:.1f} tok/s ({v['tokens_per_s'] / base:.2f}x, {v['accepted']}/{v['drafted']} "
                    f"accepted in {v['verify_runs']} runs, changed {v['changed']}/{v['answers']})"
                    for m, v in summary.items()
                )
                + f"; load {os.getloadavg()[0]:.1f}"
            )
    print(
        f"\nsingle stream, greedy, up to {args.new_tokens} new tokens, draft {args.draft_tokens}, {args.rounds} rounds\n"
    )
    print(
        "| precision | prompts | speculation | tokens/s (incl. prefill) | x off | accepted / drafted | verify runs | changed |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for key, res in doc["results"].items():
        precision, kind = key.split("/")
        for mode, v in res["summary"].items():
            print(
                f"| {precision} | {kind} | {mode} | {v['tokens_per_s']:.1f} | "
                f"{v['tokens_per_s'] / res['summary']['off']['tokens_per_s']:.2f}x | {v['accepted']} / {v['drafted']} | "
                f"{v['verify_runs']} | {v['changed']}/{v['answers']} |"
            )
    return 0


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "-"


def run_serving(args: argparse.Namespace, gens: dict[str, Generator], doc: dict[str, Any]) -> int:
    """The matrix: continuous batching against one stream at a time and genai's static batch."""
    precisions = args.precisions.split(",")
    streams = [int(s) for s in args.streams.split(",")]
    patterns = args.patterns.split(",")
    systems = tuple(x for x in SYSTEMS if x in args.systems.split(","))
    genai = (
        {p: genai_model(Path(args.genai) / f"genai-{p.split('+')[0]}", args.threads) for p in precisions}
        if "genai-static" in systems
        else {}
    )
    vocab = next(iter(gens.values())).signature.vocab_size or 49152
    max_length = args.prompt_tokens + args.new_tokens
    identical, checked = 0, 0
    for precision in precisions:
        single = precision.split("+")[0]
        for n in streams:
            options = engine_options(args, precision)
            engine: Generator | Scheduler = gens[single]
            if "+" in precision:  # several formats: measured and gated once, kept for every round
                log(f"{precision}: building, gating and measuring the formats for {n} streams ...")
                engine = Scheduler(
                    gens["fp32"],
                    max_streams=n,
                    max_queue=n,
                    max_length=max_length,
                    options=options,
                    gate_prompts=text_prompts(Path(args.export).parent / "tokenizer.json"),  # held-out text
                )
                doc.setdefault("format_plans", {})[f"{precision}/{n}"] = {
                    "plan": engine.formats.plan.to_dict(),
                    "gate": {
                        k: {m: v[m] for m in ("top1_agreement", "kl_mean", "passed")}
                        for k, v in engine.formats.gate.items()
                    },
                }
            for pattern in patterns:
                key = f"{precision}/{n}/{pattern}"
                arrivals = [0.0] * n if pattern == "together" else [i * args.interval_ms / 1e3 for i in range(n)]
                rounds: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
                extra: dict[str, Any] = {
                    "genai_tokens_equal": [],
                    "mean_rows_per_step": [],
                    "identical": [],
                    "changed": [],
                }
                for r in range(args.rounds):
                    rng = np.random.default_rng(1000 * n + r)
                    prompts = [rng.integers(1, vocab, size=args.prompt_tokens).tolist() for _ in range(n)]
                    order = systems[r % len(systems) :] + systems[: r % len(systems)]
                    tokens: dict[str, list[list[int]]] = {}
                    for system in order:
                        if system == "continuous":
                            row, tokens[system], info = run_continuous(
                                engine, prompts, arrivals, args.new_tokens, max_length, args.prefill_chunk, options
                            )
                            extra["mean_rows_per_step"].append(info["mean_rows_per_step"])
                            extra.setdefault("engine", []).append(info)
                        elif system == "sequential":
                            row, tokens[system] = run_sequential(gens[single], prompts, arrivals, args.new_tokens)
                        else:
                            row, tokens[system] = run_genai(genai[precision], prompts, arrivals, args.new_tokens)
                        rounds[system].append(row)
                    reference = tokens.get("sequential", tokens.get("continuous", []))
                    changed = sum(a != b for a, b in zip(tokens.get("continuous", reference), reference))
                    extra["changed"].append(changed)
                    extra["identical"].append(changed == 0)
                    if "+" not in precision:
                        identical += changed == 0
                        checked += 1
                    if "genai-static" in tokens:
                        extra["genai_tokens_equal"].append(
                            sum(a == b for a, b in zip(tokens["genai-static"], tokens["sequential"]))
                        )
                    if changed:
                        log(f"{key} round {r}: {changed} of {n} continuous answers differ from single-stream")
                med = {
                    s: {k: float(np.median([row[k] for row in rows])) for k in rows[0]} for s, rows in rounds.items()
                }
                doc["results"][key] = {"median": med, "rounds": rounds, **extra}
                log(
                    f"{key}: "
                    + "; ".join(
                        f"{name} {m['tokens_per_s']:.1f} tok/s (itl p50 {m['itl_p50_ms']:.1f}, ttft p99 {m['ttft_p99_ms']:.0f})"
                        for name, m in med.items()
                    )
                    + f"; changed {extra['changed']}; load {os.getloadavg()[0]:.1f}"
                )
    doc["greedy_identical_rounds"] = f"{identical}/{checked}"
    print(
        f"SmolLM2-135M-Instruct, ORT {ort.__version__}, onnxruntime-genai {doc['genai']}, {args.threads} threads, "
        f"{doc['date']}; {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, staggered every "
        f"{args.interval_ms:g} ms; medians of {args.rounds} rounds; load average {doc['load_average_start']}\n"
    )
    print(
        "| precision | streams | arrivals | system | tokens/s | x sequential | x genai | ITL p50 / p99 ms "
        "| TPOT p50 ms | TTFT p50 / p99 ms | changed |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, res in doc["results"].items():
        precision, n, pattern = key.split("/")
        med = res["median"]
        for system in systems:
            row = med[system]
            seq = med.get("sequential", {}).get("tokens_per_s")
            gen = med.get("genai-static", {}).get("tokens_per_s")
            print(
                f"| {precision} | {n} | {pattern} | {system} | {row['tokens_per_s']:.1f} | "
                f"{_ratio(row['tokens_per_s'], seq)} | {_ratio(row['tokens_per_s'], gen)} | "
                f"{row['itl_p50_ms']:.1f} / {row['itl_p99_ms']:.1f} | {row['tpot_p50_ms']:.1f} | "
                f"{row['ttft_p50_ms']:.0f} / {row['ttft_p99_ms']:.0f} | "
                f"{sum(res['changed']) if system == 'continuous' else ''} |"
            )
    print(
        f"\ngreedy tokens of every single-format continuous stream = its single-stream tokens: "
        f"{doc['greedy_identical_rounds']} rounds"
    )
    return 0 if identical == checked else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("serving", "shared-prefix", "speculation"), default="serving")
    parser.add_argument("--export", default=str(MODELS / "smollm2" / "model.onnx"), help="ortpilot's ONNX export")
    parser.add_argument("--genai", default=str(MODELS), help="folder with genai-fp32/ and genai-int4/")
    parser.add_argument("--precisions", default="fp32,int4", help="fp32, int4, or formats A+B (e.g. int4+base)")
    parser.add_argument("--streams", default="1,4,8,16")
    parser.add_argument("--patterns", default="together,staggered")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--prefix-tokens", type=int, default=512, help="shared-prefix: the system prompt's tokens")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--interval-ms", type=float, default=100.0, help="staggered: one request every T ms")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefill-chunk", type=int, default=0, help="the scheduler's prefill_chunk (0: whole prompts)")
    parser.add_argument("--prefix-cache-mb", type=float, default=256.0, help="the continuous system's prefix cache")
    parser.add_argument("--speculation", default="auto", choices=("auto", "on", "off"), help="the continuous system's")
    parser.add_argument("--modes", default="auto,on", help="speculation workload: the modes run against off")
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--format-min-top1", type=float, default=0.9, help="the gate of formats A+B (int4: 0.6)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="serving: which of them to run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    try:
        import onnxruntime_genai as og

        genai_version = og.__version__
    except ImportError:
        if args.workload == "serving" and "genai-static" in args.systems:
            raise SystemExit("the serving workload compares with onnxruntime-genai: run it in .venv-genai") from None
        genai_version = None
    doc: dict[str, Any] = {
        "workload": args.workload,
        "ort": ort.__version__,
        "genai": genai_version,
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": os.getloadavg(),
        "cpu": cpu_facts(),
        "args": vars(args),
        "results": {},
    }
    log("fusing / quantizing ...")
    gens = ortpilot_generators(Path(args.export), args.threads, args.precisions.split(","))
    code = {"serving": run_serving, "shared-prefix": run_shared_prefix, "speculation": run_speculation}[args.workload](
        args, gens, doc
    )
    doc["load_average_end"] = os.getloadavg()
    print(f"\nload average at the start {doc['load_average_start']}, at the end {doc['load_average_end']}")
    write_json(args.json_out, doc)
    return code


if __name__ == "__main__":
    sys.exit(main())
