"""SkipLayerNormalization or its two ops: a tuned transformer's passes built both ways, timed in separate processes.

ORT's transformer fusion joins each residual Add and its LayerNormalization into SkipLayerNormalization; the
tune's ``fusion(..., no SkipLayerNorm)`` knob leaves them apart. This builds a profile's pass pipeline (its
first step a fusion) with the option on and off (``Step.with_options``, the same INT8 step after it), then
times each model in a fresh process of its own, the order alternating per round (two sessions' intra-op pools
in one process would take turns on the same CPUs): real sentences one per call at their own length, and 32
per call sorted by length and padded to the longest (``_prep.length_batches``); medians per process, the
same-round ratio fused / apart (over 1: the two ops are faster).

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/bench_skip_layer_norm.py TUNE_OUT SENTENCES \\
        [--rounds 4] [--spin 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"


def build(profile: dict[str, Any], source: Path, out: Path) -> dict[str, Path]:
    """The profile's pipeline with SkipLayerNormalization fused and apart: label -> model file."""
    from ortpilot.passes.base import Pipeline
    from ortpilot.passes.registry import Step

    steps = [Step.of(s) for s in profile["candidate"]["passes"]]
    if not steps or steps[0].name != "fusion":
        raise SystemExit(f"the profile's passes start with {steps[0].name if steps else 'nothing'}, not a fusion")
    models = {}
    for label, on in (("fused", True), ("apart", False)):
        pipeline = [steps[0].with_options(skip_layer_norm=None if on else False), *steps[1:]]
        result = Pipeline([s.build() for s in pipeline]).run(str(source))
        models[label] = result.save(out / f"{label}.onnx")
    return models


def child(model: str, sentences: str, spin: str) -> dict[str, float]:
    """Medians (ms) of one call per sentence and of one call per 32 length-sorted sentences, in this process."""
    import onnxruntime as ort
    from _prep import length_batches, sentence_feeds

    lines = [s for s in Path(sentences).read_text(encoding="utf-8").splitlines() if s.strip()][:640]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feeds = [{n: f[n] for n in names} for f in sentence_feeds(MINILM / "tokenizer.json", lines, limit=None)]
    out = {}
    for label, calls in (("batch1", feeds), ("batch32", length_batches(feeds, 32))):
        for f in calls[:20]:
            session.run(None, f)
        times = []
        for f in calls:
            started = time.perf_counter()
            session.run(None, f)
            times.append(time.perf_counter() - started)
        out[label] = float(np.median(times) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tune_out", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--spin", default="1", choices=["0", "1"], help="ORT's intra-op spinning (the tuned default: 1)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.spin)))
        return
    import onnxruntime

    from ortpilot.providers.machineclass import this_class

    profile = json.loads((args.tune_out / "profile.json").read_text())
    source = Path(profile["source_model"]["path"])
    folder = Path(tempfile.mkdtemp(prefix="skipln-"))
    models = build(profile, source, folder)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in models}
    for r in range(args.rounds):
        for label in models if r % 2 == 0 else list(models)[::-1]:
            cmd = [sys.executable, __file__, str(args.tune_out), str(args.sentences), "--spin", args.spin]
            done = subprocess.run(
                [*cmd, "--child", str(models[label]), str(args.sentences)], capture_output=True, text=True, check=True
            )
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r} {label}: {runs[label][-1]}", flush=True)
    summary = {
        size: {
            **{f"{label}_ms": float(np.median([x[size] for x in runs[label]])) for label in models},
            "ratio_per_round": [a[size] / b[size] for a, b in zip(runs["fused"], runs["apart"])],
        }
        for size in ("batch1", "batch32")
    }
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu_class": this_class().name,
        "ort": onnxruntime.__version__,
        "passes": profile["candidate"]["label"],
        "spin": args.spin,
        "runs": runs,
        "summary": summary,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
