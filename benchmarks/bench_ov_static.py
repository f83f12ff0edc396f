"""At a bucket's own shape, does an OpenVINO shape plan run as fast as native OpenVINO compiled for it? (issue 46)

One INT8 model (``--model``: NNCF's QDQ MiniLM, e.g. ``bench_workload.py``'s OpenVINO tune's ``tuned/model.onnx``)
and real sentences (``--sentences``), each bucket's requests being the sentences of lengths within it, padded to it
(mask 0), one per call:

- ``ortpilot``: ``session.shaped.load_shaped`` on the OpenVINO EP (onnxruntime-openvino), a session per bucket
  with the dim fixed by ``free_dimension_overrides``, as a profile's shape plan loads; 2 threads;
- ``native``: OpenVINO's own ``Core.read_model`` of the same file, reshaped to ``[1, L]`` and compiled per bucket
  (``INFERENCE_NUM_THREADS`` 2). OpenVINO's Python package and onnxruntime-openvino cannot share a process (their
  libraries clash), so it runs in a venv of its own with OpenVINO and stock onnxruntime (``--native-python``).

Each engine runs in a child process, timed in turns with ORT's default CPU session of the float MiniLM (the
anchor both children share), bucket by bucket: per bucket, the anchor's p50 over the engine's. The parent runs the
two children alternately ``--repeats`` times and prints, per bucket, ``ortpilot``'s ratio over ``native``'s in
each pair of runs (one after the other) and their median.

    .venv-ovbench/bin/python benchmarks/bench_ov_static.py --model /tmp/bw6/tuned/model.onnx \\
        --sentences /tmp/bw6/corpus/part1.txt --native-python .venv-ovnative/bin/python [--json OUT.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"
NAMES = ("input_ids", "attention_mask", "token_type_ids")


def bucket_feeds(sentences: Path, buckets: list[int], per_bucket: int = 64) -> dict[int, list[dict[str, np.ndarray]]]:
    """Bucket -> up to ``per_bucket`` sentences longer than the bucket below it, padded to it (mask 0)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max(buckets))
    lines = [s.strip() for s in sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    out: dict[int, list[dict[str, np.ndarray]]] = {b: [] for b in buckets}
    for enc in tok.encode_batch(lines):
        n = len(enc.ids)
        low = 0
        for b in buckets:
            if low < n <= b and len(out[b]) < per_bucket:
                ids = np.zeros((1, b), np.int64)
                ids[0, :n] = enc.ids
                mask = np.zeros((1, b), np.int64)
                mask[0, :n] = 1
                out[b].append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
            low = b
    return out


def child(engine: str, model: Path, sentences: Path, buckets: list[int], turns: int, turn_s: float) -> dict[str, Any]:
    """One engine beside ORT's default, bucket by bucket, in this process."""
    import onnxruntime as ort

    feeds = bucket_feeds(sentences, buckets)
    anchor = ort.InferenceSession(str(MINILM / "model.onnx"), providers=["CPUExecutionProvider"])
    if engine == "ortpilot":
        from ortpilot.session.shaped import load_shaped
        from ortpilot.session.shapeplan import ShapePlan

        plan = ShapePlan("sequence", tuple(buckets), tuple((n, 1) for n in NAMES), beyond="refuse")
        shaped = load_shaped(str(model), [("openvino", {"num_of_threads": "2"})], "strict", plan)
        runs = {b: (lambda f, s=shaped: s.run(None, f)) for b in buckets}
        version = ort.__version__
    else:
        import openvino as ov

        core = ov.Core()
        runs = {}
        for b in buckets:
            m = core.read_model(str(model))
            m.reshape({i.get_any_name(): [1, b] for i in m.inputs})
            compiled = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": 2})
            runs[b] = lambda f, c=compiled: c(f)
        version = ov.__version__
    result: dict[str, Any] = {"engine": engine, "version": version, "onnxruntime": ort.__version__, "buckets": {}}
    for b in buckets:
        if not feeds[b]:
            continue
        times: dict[str, list[float]] = {"engine": [], "anchor": []}
        calls = {"engine": runs[b], "anchor": lambda f: anchor.run(None, f)}
        for f in feeds[b][:8]:
            for call in calls.values():
                call(f)
        for turn in range(turns):
            for name in ("engine", "anchor") if turn % 2 == 0 else ("anchor", "engine"):
                stop = time.perf_counter() + turn_s
                i = 0
                while time.perf_counter() < stop:
                    f = feeds[b][i % len(feeds[b])]
                    start = time.perf_counter()
                    calls[name](f)
                    times[name].append(time.perf_counter() - start)
                    i += 1
        engine_ms = statistics.median(times["engine"]) * 1000
        anchor_ms = statistics.median(times["anchor"]) * 1000
        result["buckets"][str(b)] = {
            "requests": len(feeds[b]),
            "engine_p50_ms": round(engine_ms, 4),
            "anchor_p50_ms": round(anchor_ms, 4),
            "ratio": round(anchor_ms / engine_ms, 4),
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--sentences", required=True, type=Path)
    ap.add_argument("--buckets", default="16,24,32,48,64")
    ap.add_argument("--native-python", default=str(ROOT / ".venv-ovnative/bin/python"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--turn-s", type=float, default=0.3)
    ap.add_argument("--json", default="")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    buckets = sorted(int(b) for b in args.buckets.split(","))
    if args.child:
        print(json.dumps(child(args.child, args.model, args.sentences, buckets, args.turns, args.turn_s)))
        return
    pythons = {"ortpilot": sys.executable, "native": args.native_python}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    runs: dict[str, list[dict[str, Any]]] = {"ortpilot": [], "native": []}
    load_start = os.getloadavg()[0]
    for r in range(args.repeats):
        for engine in ("ortpilot", "native") if r % 2 == 0 else ("native", "ortpilot"):
            cmd = [pythons[engine], __file__, "--model", str(args.model), "--sentences", str(args.sentences)]
            cmd += ["--buckets", args.buckets, "--turns", str(args.turns), "--turn-s", str(args.turn_s)]
            done = subprocess.run([*cmd, "--child", engine], capture_output=True, text=True, env=env, cwd=ROOT)
            if done.returncode != 0:
                raise SystemExit(f"{engine} child failed:\n{done.stderr[-3000:]}")
            runs[engine].append(json.loads(done.stdout.strip().splitlines()[-1]))
    per_bucket = {}
    for b in map(str, buckets):
        mine = [run["buckets"][b]["ratio"] for run in runs["ortpilot"] if b in run["buckets"]]
        theirs = [run["buckets"][b]["ratio"] for run in runs["native"] if b in run["buckets"]]
        if mine and theirs:
            per_bucket[b] = {
                "ortpilot_vs_default": statistics.median(mine),
                "native_vs_default": statistics.median(theirs),
                "ortpilot_over_native": [round(m / t, 3) for m, t in zip(mine, theirs)],
                "ortpilot_over_native_median": round(statistics.median(m / t for m, t in zip(mine, theirs)), 3),
            }
    doc = {
        "date": datetime.date.today().isoformat(),
        "load_avg": [load_start, os.getloadavg()[0]],
        "versions": {e: runs[e][0]["version"] for e in runs},
        "per_bucket": per_bucket,
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
