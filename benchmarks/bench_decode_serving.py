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

Run in ``.venv-genai`` (``benchmarks/prep_genai.py``), under the exclusive CPU lock:

    flock -x /tmp/ortpilot-cpu.lock .venv-genai/bin/python benchmarks/bench_decode_serving.py \\
        --json benchmarks/out/decode_serving.json
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
import onnxruntime_genai as og
from _prep import write_json

from ortpilot.decode import Generator, Scheduler
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
    gen: Generator, prompts: list[list[int]], arrivals: list[float], new: int, max_length: int, prefill_chunk: int
) -> tuple[dict[str, float], list[list[int]], dict[str, Any]]:
    scheduler = Scheduler(
        gen, max_streams=len(prompts), max_queue=len(prompts), max_length=max_length, prefill_chunk=prefill_chunk
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
    return (
        summarize(arrivals, firsts, ends, gaps, [len(s.tokens) for s in streams]),
        [s.tokens for s in streams],
        {"mean_rows_per_step": stats["mean_rows_per_step"]},
    )


def run_sequential(
    gen: Generator, prompts: list[list[int]], arrivals: list[float], new: int
) -> tuple[dict[str, float], list[list[int]]]:
    clock, firsts, ends, gaps, out = 0.0, [], [], [], []
    for prompt, arrival in zip(prompts, arrivals):
        begin = max(clock, arrival)
        t0 = time.perf_counter()
        result = gen.generate(prompt, new, "shared")
        took = time.perf_counter() - t0
        firsts.append(begin + result.prefill_s)
        ends.append(begin + took)
        gaps.append(list(result.step_ms))
        out.append(result.tokens[0])
        clock = begin + took
    return summarize(arrivals, firsts, ends, gaps, [len(t) for t in out]), out


def run_genai(
    model: og.Model, prompts: list[list[int]], arrivals: list[float], new: int
) -> tuple[dict[str, float], list[list[int]]]:
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


def genai_model(path: Path, threads: int) -> og.Model:
    config = og.Config(str(path))
    config.overlay(
        json.dumps(
            {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}
        )
    )
    return og.Model(config)


def ortpilot_generators(export: Path, threads: int, precisions: list[str]) -> dict[str, Generator]:
    fused = fuse_decoder(load_model(export), use_cache=True).model
    models = {"fp32": fused}
    if "int4" in precisions:  # as bench_genai.py: MatMulNBits block 32, symmetric, accuracy_level 4
        models["int4"] = WeightOnlyPass("int4", block_size=32).transform(SourceModel(fused, None, "")).model
    settings = SessionSettings(intra_op_threads=threads, inter_op_threads=1)
    return {p: Generator(load(models[p], settings=settings, placement=False)) for p in precisions}


def cpu_facts() -> dict[str, Any]:
    """The CPU as ``ortpilot doctor --json`` names it: model and ISA flags."""
    from ortpilot.providers.cpuisa import this_cpu

    isa = this_cpu()
    return {"model": isa.model, "flags": {k: v for k, v in isa.flags.items() if v}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", default=str(MODELS / "smollm2" / "model.onnx"), help="ortpilot's ONNX export")
    parser.add_argument("--genai", default=str(MODELS), help="folder with genai-fp32/ and genai-int4/")
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--streams", default="1,4,8,16")
    parser.add_argument("--patterns", default="together,staggered")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--interval-ms", type=float, default=100.0, help="staggered: one request every T ms")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefill-chunk", type=int, default=0, help="the scheduler's prefill_chunk (0: whole prompts)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    streams = [int(s) for s in args.streams.split(",")]
    patterns = args.patterns.split(",")

    doc: dict[str, Any] = {
        "ort": ort.__version__,
        "genai": og.__version__,
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": os.getloadavg(),
        "cpu": cpu_facts(),
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "interval_ms": args.interval_ms,
        "rounds": args.rounds,
        "prefill_chunk": args.prefill_chunk,
        "results": {},
    }
    log("fusing / quantizing ...")
    gens = ortpilot_generators(Path(args.export), args.threads, precisions)
    genai = {p: genai_model(Path(args.genai) / f"genai-{p}", args.threads) for p in precisions}
    vocab = gens[precisions[0]].signature.vocab_size or 49152
    max_length = args.prompt_tokens + args.new_tokens
    identical, checked = 0, 0
    for precision in precisions:
        for n in streams:
            for pattern in patterns:
                key = f"{precision}/{n}/{pattern}"
                arrivals = [0.0] * n if pattern == "together" else [i * args.interval_ms / 1e3 for i in range(n)]
                rounds: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
                extra: dict[str, Any] = {"genai_tokens_equal": [], "mean_rows_per_step": [], "identical": []}
                for r in range(args.rounds):
                    rng = np.random.default_rng(1000 * n + r)
                    prompts = [rng.integers(1, vocab, size=args.prompt_tokens).tolist() for _ in range(n)]
                    order = SYSTEMS[r % 3 :] + SYSTEMS[: r % 3]
                    tokens: dict[str, list[list[int]]] = {}
                    for system in order:
                        if system == "continuous":
                            row, tokens[system], info = run_continuous(
                                gens[precision], prompts, arrivals, args.new_tokens, max_length, args.prefill_chunk
                            )
                            extra["mean_rows_per_step"].append(info["mean_rows_per_step"])
                        elif system == "sequential":
                            row, tokens[system] = run_sequential(gens[precision], prompts, arrivals, args.new_tokens)
                        else:
                            row, tokens[system] = run_genai(genai[precision], prompts, arrivals, args.new_tokens)
                        rounds[system].append(row)
                    same = tokens["continuous"] == tokens["sequential"]
                    extra["identical"].append(same)
                    identical += same
                    checked += 1
                    extra["genai_tokens_equal"].append(
                        sum(a == b for a, b in zip(tokens["genai-static"], tokens["sequential"]))
                    )
                    if not same:
                        log(f"{key} round {r}: continuous tokens differ from single-stream!")
                med = {
                    s: {k: float(np.median([row[k] for row in rows])) for k in rows[0]} for s, rows in rounds.items()
                }
                doc["results"][key] = {"median": med, "rounds": rounds, **extra}
                c, q, g = med["continuous"], med["sequential"], med["genai-static"]
                log(
                    f"{key}: continuous {c['tokens_per_s']:.1f} tok/s (itl {c['itl_p50_ms']:.1f}, ttft p99 "
                    f"{c['ttft_p99_ms']:.0f}); sequential {q['tokens_per_s']:.1f} ({q['itl_p50_ms']:.1f}, "
                    f"{q['ttft_p99_ms']:.0f}); genai {g['tokens_per_s']:.1f} ({g['itl_p50_ms']:.1f}, "
                    f"{g['ttft_p99_ms']:.0f}); load {os.getloadavg()[0]:.1f}"
                )
    doc["greedy_identical_rounds"] = f"{identical}/{checked}"
    doc["load_average_end"] = os.getloadavg()
    print(
        f"SmolLM2-135M-Instruct, ORT {ort.__version__}, onnxruntime-genai {og.__version__}, {args.threads} threads, "
        f"{doc['date']}; {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, staggered every "
        f"{args.interval_ms:g} ms; medians of {args.rounds} rounds; load average {doc['load_average_start']}\n"
    )
    print(
        "| precision | streams | arrivals | system | tokens/s | x sequential | x genai | ITL p50 / p99 ms "
        "| TPOT p50 ms | TTFT p50 / p99 ms |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for key, res in doc["results"].items():
        precision, n, pattern = key.split("/")
        med = res["median"]
        for system in SYSTEMS:
            row = med[system]
            print(
                f"| {precision} | {n} | {pattern} | {system} | {row['tokens_per_s']:.1f} | "
                f"{row['tokens_per_s'] / med['sequential']['tokens_per_s']:.2f}x | "
                f"{row['tokens_per_s'] / med['genai-static']['tokens_per_s']:.2f}x | "
                f"{row['itl_p50_ms']:.1f} / {row['itl_p99_ms']:.1f} | {row['tpot_p50_ms']:.1f} | "
                f"{row['ttft_p50_ms']:.0f} / {row['ttft_p99_ms']:.0f} |"
            )
    print(
        f"\ngreedy tokens of every continuous stream = its single-stream tokens: {doc['greedy_identical_rounds']} "
        f"rounds; load average at the end {doc['load_average_end']}"
    )
    write_json(args.json_out, doc)
    return 0 if identical == checked else 1


if __name__ == "__main__":
    sys.exit(main())
