"""ortpilot tune vs ORT's default session on the corpus models, measured interleaved in one process.

For each model: run ``ortpilot.tune`` with a budget (its wall time is the tuner's cost), load
the written profile (``ortpilot.load_profile``), check its accuracy against ORT's default
session on inputs neither the tuner's calibration nor its gate saw (MiniLM: real sentences
through its tokenizer, padded to 128 tokens; the others: generated inputs with fresh seeds),
then benchmark ORT's default session and the profile A B A B ... (``measure.bench_interleaved``)
on identical inputs. Prints a markdown table: default p50, tuned p50, speedup with its paired
CI, chosen configuration, accuracy, tuner wall time.

    .venv/bin/python benchmarks/bench_tune.py [--budget 120] [--duration 20] [--only minilm,encoder]
        [--real-gate]

``--real-gate``: MiniLM is tuned as the tool advises (``--calibration-text``), on the lines of
``benchmarks/data/sentences.txt`` that are not the 16 accuracy-check sentences (tune splits them into
calibration and held-out gate samples), instead of on generated token ids.

``benchmarks/bench_olive.py`` reuses these functions and adds Olive's pick as a third config.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from _prep import package_file, tune_bench_parser, write_json

import ortpilot
from ortpilot.graph.feeds import make_feeds, plan_feeds
from ortpilot.measure.interleave import BenchConfig, bench_interleaved
from ortpilot.measure.metrics import choose_metrics, folder_near, masks_of, metric_error
from ortpilot.modelio import load_model
from ortpilot.session import load

ROOT = Path(__file__).resolve().parent.parent
MINILM_DIR = ROOT / "benchmarks/models/minilm"


def _packaged(package: str, relative: str) -> str:
    """The model's path in its installed package; a path that does not exist when it is missing."""
    return str(package_file(package, relative) or Path(package) / relative)


CORPUS = {  # name -> (model, shapes)
    "encoder": ("demo:encoder", ["batch=1", "sequence=128"]),
    "minilm": (str(MINILM_DIR / "model.onnx"), ["batch=1", "sequence=128"]),
    "nudenet": (_packaged("nudenet", "320n.onnx"), ["images=1x3x320x320"]),
    "ocr-det": (_packaged("rapidocr", "models/PP-OCRv6_det_small.onnx"), ["x=1x3x640x640"]),
    "silero-vad": (_packaged("silero_vad", "data/silero_vad.onnx"), ["input=1x512", "state=2x1x128"]),
}
CORPUS_SENTENCES = ROOT / "benchmarks/data/sentences.txt"
CHECK_SEED = 20_000  # accuracy inputs: neither calibration (0..) nor the tuner's held-out (10000..)
SENTENCES = [
    "ONNX Runtime runs this model on many execution providers.",
    "The quick brown fox jumps over the lazy dog.",
    "A short one.",
    "Quantization trades a little accuracy for a lot of speed on CPUs with integer dot products.",
    "Where is the nearest train station?",
    "Sentence embeddings map text to vectors whose cosine similarity tracks meaning.",
    "It rained all day, so the match was postponed until next week.",
    "Please send me the report before Friday afternoon.",
    "The patient was given a second dose after the symptoms returned.",
    "Stock markets fell sharply on Monday after the announcement.",
    "How do I reset my password if I no longer have access to my email?",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Graph optimizations fuse attention, layer normalization and GELU into single kernels.",
    "She played the violin at the concert in front of a thousand people.",
    "The committee approved the budget with a narrow majority.",
    "Cats sleep for most of the day and hunt at night.",
]


def model_path(model: str) -> Path:
    if model.startswith("demo:"):
        from ortpilot.models import demo_model_path

        return demo_model_path(model.split(":", 1)[1])
    return Path(model)


def available(name: str) -> bool:
    model, _ = CORPUS[name]
    return model.startswith("demo:") or Path(model).is_file()


def timing_feeds(profile: dict[str, Any], profile_path: str | None = None) -> dict[str, np.ndarray]:
    """The tuner's own held-out sample (regenerated from the source model, or, for a tune on real data,
    read from the ``reference.npz`` beside ``profile_path``): every config runs on it."""
    from ortpilot.tuning.reference import REFERENCE_FILE, read_reference, reference_feeds

    refs = profile["reference_outputs"]
    if "heldout_seed" in refs or profile_path is None:
        return reference_feeds(profile)
    inputs, _ = read_reference(Path(profile_path).parent / (refs.get("file") or REFERENCE_FILE))
    return inputs


def check_samples(
    name: str, source: Path, shapes: dict[str, tuple[int, ...]]
) -> tuple[list[dict[str, np.ndarray]], str]:
    """Inputs for the accuracy check, and what they are."""
    if name == "minilm" and (MINILM_DIR / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(MINILM_DIR / "tokenizer.json"))
        seq = int(shapes["input_ids"][1])
        tok.enable_padding(length=seq)
        tok.enable_truncation(max_length=seq)
        samples = []
        for enc in tok.encode_batch(SENTENCES):
            samples.append(
                {
                    "input_ids": np.array([enc.ids], np.int64),
                    "attention_mask": np.array([enc.attention_mask], np.int64),
                    "token_type_ids": np.array([enc.type_ids], np.int64),
                }
            )
        return samples, f"{len(samples)} real sentences, padded to {seq} tokens"
    proto = load_model(source, load_external_data=False)
    plan = plan_feeds(proto, shapes)
    return [make_feeds(proto, plan=plan, seed=CHECK_SEED + i) for i in range(8)], "8 generated inputs (fresh seeds)"


def accuracy(reference: Any, test: Any, samples: list[dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Per output: the gate's metric (chosen on evidence, as tune chooses it), its error, and for cosine the
    mean cosine similarity."""
    names = [o.name for o in reference.get_outputs()]
    choices = choose_metrics(reference.model, folder_near(reference.model_path))
    ref = [reference.run(None, s) for s in samples]
    got = [test.run(None, s) for s in samples]
    out = {}
    for j, n in enumerate(names):
        a, b = [r[j] for r in ref], [g[j] for g in got]
        choice = choices[n]
        err = float(metric_error(choice.metric, a, b, masks_of(choice, samples)))
        out[n] = {
            "metric": choice.metric,
            "evidence": choice.evidence,
            "error": err,
            **({"rel_l2": float(metric_error("rel_l2", a, b))} if np.issubdtype(a[0].dtype, np.floating) else {}),
            **({"cosine": 1.0 - err} if choice.metric.endswith("cosine") else {}),
        }
    return out


def real_calibration(name: str, out_root: Path) -> Any:
    """MiniLM's tune data for ``--real-gate``: the corpus sentences the accuracy check does not use."""
    from ortpilot.data import real_data

    if name != "minilm":
        return None
    lines = [x for x in CORPUS_SENTENCES.read_text(encoding="utf-8").splitlines() if x and x not in SENTENCES]
    path = out_root / "calibration-sentences.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return real_data(text=path, folder=MINILM_DIR)


def tune_model(name: str, budget: float, out_root: Path, calibration: Any = None) -> dict[str, Any]:
    model, shapes = CORPUS[name]
    out = out_root / name
    start = time.monotonic()
    result = ortpilot.tune(model, out_dir=str(out), budget_s=budget, shapes=shapes or None, calibration=calibration)
    wall = time.monotonic() - start
    profile = json.loads((out / "profile.json").read_text())
    counts: dict[str, int] = {}
    for e in result.entries:
        counts[e.status] = counts.get(e.status, 0) + 1
    return {
        "name": name,
        "profile_path": str(out / "profile.json"),
        "profile": profile,
        "wall_s": wall,
        "config": result.winner.candidate.label,
        "default_best": result.default_best,
        "tuner_speedup": result.speedup,
        "gate": (result.winner.accuracy or {}).get("outputs"),
        "shapes": {k: list(v) for k, v in result.shapes.items()},
        "candidates": counts,
    }


def configs_for(
    tuned: dict[str, Any], feeds: dict[str, np.ndarray], extra: list[BenchConfig] = ()
) -> list[BenchConfig]:
    source = tuned["profile"]["source_model"]["path"]
    session = ortpilot.load_profile(tuned["profile_path"])
    return [
        BenchConfig("ORT default", model=source, providers=["CPUExecutionProvider"], feeds=feeds),
        *extra,
        BenchConfig("ortpilot", model=session, feeds=feeds, iobinding=bool(tuned["profile"]["iobinding"])),
    ]


def block_for(tuned: dict[str, Any], turn_s: float) -> int | None:
    """Runs per turn so that one turn of ORT's default lasts about ``turn_s`` (None: measure's auto
    block, about 20 ms). Longer turns amortize what a switch costs: on this VM the idle intra-op
    threads of the session that just ran keep spinning and slow the next one down."""
    if turn_s <= 0:
        return None
    p50_ms = tuned["profile"]["latency"]["baseline"].get("p50_ms") or 1.0
    return max(1, min(200, round(turn_s * 1e3 / p50_ms)))


def measure(configs: list[BenchConfig], duration: float, block: int | None = None) -> dict[str, Any]:
    comp = bench_interleaved(configs, duration_s=duration, warmup=10, block=block)
    base = comp.results[0].stats.p50
    rows = {"ORT default": {"p50_ms": base * 1e3}}
    for res, ratio in zip(comp.results[1:], comp.ratios):
        rows[res.name] = {
            "p50_ms": res.stats.p50 * 1e3,
            "speedup": 1.0 / ratio.ratio,
            "speedup_ci": [1.0 / ratio.ci_high, 1.0 / ratio.ci_low],
            "verdict": ratio.verdict,
            "pooled_speedup": 1.0 / ratio.pooled,
        }
    return {
        "rows": rows,
        "rounds": comp.rounds,
        "block": comp.block,
        "drift": comp.drift,
        "runs": {r.name: len(r.samples_s) for r in comp.results},
    }


def check(name: str, tuned: dict[str, Any]) -> dict[str, Any]:
    source = Path(tuned["profile"]["source_model"]["path"])
    shapes = {k: tuple(v) for k, v in tuned["shapes"].items()}
    samples, what = check_samples(name, source, shapes)
    return {
        "inputs": what,
        "outputs": accuracy(load(str(source)), ortpilot.load_profile(tuned["profile_path"]), samples),
    }


def fmt_accuracy(acc: dict[str, Any]) -> str:
    parts = []
    for n, o in acc["outputs"].items():
        if "cosine" in o:
            parts.append(f"{n}: cosine {o['cosine']:.4f} (rel-L2 {o['rel_l2']:.1e})")
        elif "rel_l2" in o:
            parts.append(f"{n}: rel-L2 {o['rel_l2']:.1e}")
        else:
            parts.append(f"{n}: {o['metric']} {o['error']:.2e}")
    return "; ".join(parts)


def timing_cell(stat: dict[str, Any]) -> str:
    """``p50 (speedup x, CI low-high)`` of one measured configuration, as the comparison tables print it."""
    return f"{stat['p50_ms']:.3f} ({stat['speedup']:.2f}x, {stat['speedup_ci'][0]:.2f}-{stat['speedup_ci'][1]:.2f})"


def record(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """Keep a model's row and print it at once (a long run shows its progress on stderr)."""
    rows.append(row)
    print(json.dumps(row, default=str), file=sys.stderr, flush=True)


def save_rows(path: str, head: str, rows: list[dict[str, Any]]) -> None:
    write_json(path, {"header": head, "rows": rows})


def header(args: argparse.Namespace) -> str:
    from ortpilot.providers.machineclass import this_class

    load1 = os.getloadavg()[0]
    turn = f"turns of ~{args.turn:g} s" if args.turn > 0 else "auto turns (~20 ms)"
    return (
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}, "
        f"{os.cpu_count()} cores, machine class {this_class().name}, load average at start {load1:.1f}; "
        f"tune budget {args.budget:.0f} s{', MiniLM gated on real sentences' if getattr(args, 'real_gate', False) else ''}; "
        f"interleaved {args.duration:.0f} s per model, {turn}"
    )


def main() -> None:
    ap = tune_bench_parser(__doc__.splitlines()[0])
    ap.add_argument("--real-gate", action="store_true", help="MiniLM: tune on real sentences (--calibration-text)")
    args = ap.parse_args()
    names = [n for n in CORPUS if not args.only or n in args.only.split(",")]
    out_root = Path(args.out or tempfile.mkdtemp(prefix="bench-tune-"))
    head = header(args)
    rows = []
    for name in names:
        if not available(name):
            print(f"skip {name}: {CORPUS[name][0]} missing", file=sys.stderr)
            continue
        out_root.mkdir(parents=True, exist_ok=True)
        calibration = real_calibration(name, out_root) if args.real_gate else None
        tuned = tune_model(name, args.budget, out_root, calibration)
        feeds = timing_feeds(tuned["profile"], tuned["profile_path"])
        row = {
            "model": name,
            "config": tuned["config"],
            "default_best": tuned["default_best"],
            "tune_wall_s": tuned["wall_s"],
            "candidates": tuned["candidates"],
            "accuracy": check(name, tuned),
            "timing": measure(configs_for(tuned, feeds), args.duration, block_for(tuned, args.turn)),
        }
        record(rows, row)
    save_rows(args.json, head, rows)
    print(head + "\n")
    print(
        "| model | ORT default p50 ms | ortpilot p50 ms | speedup (paired 95% CI) | chosen | accuracy vs default "
        "| tune wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["timing"]["rows"]
        o = t["ortpilot"]
        print(
            f"| {r['model']} | {t['ORT default']['p50_ms']:.3f} | {o['p50_ms']:.3f} | {o['speedup']:.2f}x "
            f"({o['speedup_ci'][0]:.2f}-{o['speedup_ci'][1]:.2f}) | {r['config']} | "
            f"{fmt_accuracy(r['accuracy'])} | {r['tune_wall_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
