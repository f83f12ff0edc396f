"""ortpilot tune vs ORT's default session on the corpus models, measured interleaved in one process.

For each model: run ``ortpilot.tune`` with a budget, then load the written profile
(``ortpilot.load_profile``) and benchmark it against ORT's default session A B A B ...
(``measure.bench_interleaved``). Prints a markdown table: default p50, tuned p50, speedup with
its paired CI, chosen configuration, accuracy, tuner wall time.

    .venv/bin/python benchmarks/bench_tune.py [--budget 120] [--duration 20] [--only minilm,encoder]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

import ortpilot
from ortpilot.measure.bench import bench_interleaved
from ortpilot.measure.interleave import BenchConfig

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
CORPUS = {  # name -> (model, shapes)
    "encoder": ("demo:encoder", ["batch=1", "sequence=128"]),
    "minilm": (str(ROOT / "benchmarks/models/minilm/model.onnx"), ["batch=1", "sequence=128"]),
    "nudenet": (str(SITE / "nudenet/320n.onnx"), []),
    "ocr-det": (str(SITE / "rapidocr/models/PP-OCRv6_det_small.onnx"), ["x=1x3x640x640"]),
    "silero-vad": (str(SITE / "silero_vad/data/silero_vad.onnx"), []),
}


def run_one(name: str, model: str, shapes: list[str], budget: float, duration: float, out_root: Path) -> dict:
    out = out_root / name
    start = time.monotonic()
    result = ortpilot.tune(model, out_dir=str(out), budget_s=budget, shapes=shapes or None)
    wall = time.monotonic() - start
    tuned = ortpilot.load_profile(str(out / "profile.json"))
    plan_shapes = {k: tuple(v) for k, v in result.shapes.items()}
    configs = [BenchConfig("ORT default", model=tuned.profile["source_model"]["path"],
                           shapes=plan_shapes),
               BenchConfig("ortpilot tuned", model=tuned, shapes=plan_shapes, iobinding=tuned.profile["iobinding"])]
    comp = bench_interleaved(configs, duration_s=duration, warmup=20)
    ratio = comp.ratios[-1]
    acc = result.winner.accuracy or {}
    return {"model": name, "default_p50_ms": comp.results[0].stats.p50 * 1e3,
            "tuned_p50_ms": comp.results[1].stats.p50 * 1e3, "speedup": 1.0 / ratio.ratio,
            "speedup_ci": [1.0 / ratio.ci_high, 1.0 / ratio.ci_low],
            "paired_speedup_ci": [1.0 / ratio.paired_high, 1.0 / ratio.paired_low], "verdict": ratio.verdict,
            "config": result.winner.candidate.label, "default_best": result.default_best,
            "accuracy": {o["name"]: f"{o['metric']} {o['error']:.2e}" for o in acc.get("outputs", [])},
            "tune_wall_s": wall, "candidates": len(result.entries)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    names = [n for n in CORPUS if not args.only or n in args.only.split(",")]
    out_root = Path(args.out or tempfile.mkdtemp(prefix="bench-tune-"))
    rows = []
    for name in names:
        model, shapes = CORPUS[name]
        if not model.startswith("demo:") and not Path(model).is_file():
            print(f"skip {name}: {model} missing", file=sys.stderr)
            continue
        rows.append(run_one(name, model, shapes, args.budget, args.duration, out_root))
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(f"ORT {ort.__version__}, {datetime.datetime.now().isoformat(timespec='minutes')}, budget {args.budget:.0f} s, "
          f"interleaved {args.duration:.0f} s\n")
    print("| model | ORT default p50 ms | tuned p50 ms | speedup (paired 95% CI) | chosen | accuracy | tune wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['default_p50_ms']:.3f} | {r['tuned_p50_ms']:.3f} | {r['speedup']:.2f}x "
              f"({r['speedup_ci'][0]:.2f}-{r['speedup_ci'][1]:.2f}) | {r['config']} | "
              f"{'; '.join(f'{k}: {v}' for k, v in r['accuracy'].items())} | {r['tune_wall_s']:.0f} |")


if __name__ == "__main__":
    main()
