"""Does a tune on real sentences hold on other real sentences, at their own length and in server batches?

Issue 46's protocol on the MiniLM folder (benchmarks/models/minilm, ``prep_minilm.py``):

1. real sentences from the standard library's docstrings (``corpus.py``): 200 to tune on (``--tune-sentences``;
   1,196 or more let the gate hold out its most, 299), 2,000 others to check on;
2. ``ortpilot tune benchmarks/models/minilm --calibration-text 200.txt --batch 1,32 --budget B`` as a user
   runs it (the CLI, no ``--shape``; ``--batch 32,1`` tunes for a server's batches of 32 instead);
3. in a fresh process, the profile (``ortpilot.load_profile``) beside a plain
   ``onnxruntime.InferenceSession`` of the source model, on the 2,000 sentences tokenized at their own length:
   one sentence per call, and 32 per call sorted by length and padded to the longest (as
   sentence-transformers batches); ``--rounds`` rounds alternating which goes first, each round a fresh
   slice of sentences; sentences/s per round, the ratio of the two per round, its median; and every
   sentence's ``sentence_embedding`` cosine against the plain session's (the worst one).

    .venv-test/bin/python benchmarks/bench_workload.py [--budget 120] [--rounds 6] [--out DIR] [--json OUT.json]
    .venv-test/bin/python benchmarks/bench_workload.py --check-only OUTDIR   # step 3 on an existing tune
    .venv-ovbench/bin/python benchmarks/bench_workload.py -p openvino ...    # OpenVINO's candidates only
    .venv-test/bin/python benchmarks/bench_workload.py --batch 32,1 ...       # tuned for batches of 32
    .venv-test/bin/python benchmarks/bench_workload.py --check-only OUTDIR --prewarm   # no shape's first run timed
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"
PY = sys.executable


def make_corpus(out: Path, tune_sentences: int = 200) -> tuple[Path, Path]:
    sizes = f"{tune_sentences},2000"
    subprocess.run([PY, str(ROOT / "benchmarks/corpus.py"), "--out", str(out), "--sizes", sizes], check=True, cwd=ROOT)
    return out / "part0.txt", out / "part1.txt"


def tune(calibration: Path, out: Path, budget: float, providers: list[str], batch: str = "1,32") -> dict[str, Any]:
    cmd = [PY, "-m", "ortpilot.cli.main", "tune", str(MINILM), "--calibration-text", str(calibration)]
    cmd += ["-o", str(out), "--budget", str(budget), "--batch", batch, "--json"]
    for name in providers:
        cmd += ["-p", name]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"tune failed ({done.returncode}):\n{done.stderr[-3000:]}")
    doc = json.loads(done.stdout)
    doc["_wall_s"] = time.monotonic() - started
    doc["_stderr_tail"] = done.stderr[-4000:]
    return doc


def check(profile: Path, sentences: Path, rounds: int, settle_s: float = 0.0, prewarm: bool = False) -> dict[str, Any]:
    """Step 3, in this (fresh) process. Where the profile asks for a warm-up at load (``warmup``: OpenVINO
    prepares each new length on its first run), a second profile session loaded with ``warm=False`` is timed
    beside the two (``profile_cold``), so the warm-up's effect on a fresh process reads in the same rounds.
    ``prewarm``: every call the rounds will make is run once on each session first, so no session meets a
    shape for the first time while timed (a long-running process's state; the default is a fresh one's)."""
    import onnxruntime as ort
    from _prep import length_batches, sentence_feeds

    import ortpilot

    lines = [s for s in sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    feeds = sentence_feeds(MINILM / "tokenizer.json", lines)
    lengths = np.array([f["input_ids"].shape[1] for f in feeds])
    tuned = ortpilot.load_profile(str(profile))
    plain = ort.InferenceSession(str(MINILM / "model.onnx"), providers=["CPUExecutionProvider"])
    sessions = {"profile": tuned, "plain": plain}
    if tuned.warmed is not None:
        sessions["profile_cold"] = ortpilot.load_profile(str(profile), warm=False)
    for s in sessions.values():  # warm both, every bucket
        for f in feeds[:: max(1, len(feeds) // 20)]:
            s.run(None, f)

    def batches_of(items: list[int], size: int) -> list[dict[str, np.ndarray]]:
        return length_batches([feeds[i] for i in items], size)

    per_round = len(feeds) // rounds
    result: dict[str, Any] = {
        "sentences": len(feeds),
        "tokens_p50": float(np.median(lengths)),
        "settle_s": settle_s,
        "prewarm": prewarm,
    }
    if prewarm:
        for size in (1, 32):
            for r in range(rounds):
                items = list(range(r * per_round, (r + 1) * per_round))
                for f in [feeds[i] for i in items] if size == 1 else batches_of(items, size):
                    for s in sessions.values():
                        s.run(None, f)
    if tuned.warmed is not None:
        result["warmed"] = tuned.warmed.to_dict()
    for label, size in (("batch1", 1), ("batch32", 32)):
        speeds: dict[str, list[float]] = {name: [] for name in sessions}
        for r in range(rounds):
            items = list(range(r * per_round, (r + 1) * per_round))
            runs = [feeds[i] for i in items] if size == 1 else batches_of(items, size)
            order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
            for name in order:
                time.sleep(settle_s)  # the session before it has stopped spinning its threads, as one alone would
                start = time.perf_counter()
                for f in runs:
                    sessions[name].run(None, f)
                speeds[name].append(len(items) / (time.perf_counter() - start))
        ratios = [p / q for p, q in zip(speeds["profile"], speeds["plain"])]
        result[label] = {
            "profile_per_s": float(np.median(speeds["profile"])),
            "plain_per_s": float(np.median(speeds["plain"])),
            "ratio_median": float(np.median(ratios)),
            "ratio_range": [float(min(ratios)), float(max(ratios))],
            "ratio_per_round": [round(r, 3) for r in ratios],
        }
        if "profile_cold" in speeds:
            cold = [p / q for p, q in zip(speeds["profile_cold"], speeds["plain"])]
            result[label]["cold_ratio_median"] = float(np.median(cold))
            result[label]["cold_ratio_per_round"] = [round(r, 3) for r in cold]

    def worst_cosine(size: int) -> float:
        items = list(range(len(feeds)))
        if size == 1:
            got = [tuned.run(None, f)[1][0] for f in feeds]
            want = [plain.run(None, f)[1][0] for f in feeds]
        else:
            order = sorted(items, key=lambda i: lengths[i])
            got, want = [None] * len(feeds), [None] * len(feeds)
            for start, batch in zip(range(0, len(order), size), batches_of(items, size)):
                a, b = tuned.run(None, batch)[1], plain.run(None, batch)[1]
                for k, i in enumerate(order[start : start + size]):
                    got[i], want[i] = a[k], b[k]
        cos = [float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(got, want)]
        return min(cos)

    result["worst_cosine"] = {"batch1": worst_cosine(1), "batch32": worst_cosine(32)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=120)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--tune-sentences", type=int, default=200, help="sentences given to the tune (a quarter held out, up to 299)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out/workload"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--check-only", default=None, metavar="OUTDIR")
    parser.add_argument("-p", "--provider", action="append", default=[], help="tune's -p (repeatable)")
    parser.add_argument("--batch", default="1,32", help="tune's --batch: the first is tuned for (32,1 for a server)")
    parser.add_argument(
        "--settle", type=float, default=0.0, help="seconds idle before each session's turn in the check (0: none)"
    )
    parser.add_argument(
        "--prewarm",
        action="store_true",
        help="run every call of the check once on each session before timing (no first run at a new shape timed)",
    )
    parser.add_argument("--child", nargs=2, metavar=("PROFILE", "SENTENCES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(check(Path(args.child[0]), Path(args.child[1]), args.rounds, args.settle, args.prewarm)))
        return
    out = Path(args.out)
    calibration, held_out = make_corpus(out / "corpus", args.tune_sentences)
    row: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "cpu": platform.processor() or platform.machine(),
        "load_avg_start": os.getloadavg()[0],
    }
    tuned = Path(args.check_only) if args.check_only else out / "tuned"
    if not args.check_only:
        doc = tune(calibration, tuned, args.budget, args.provider, args.batch)
        row["tune"] = {
            "winner": doc["winner"]["label"],
            "headline": doc["speedup"],
            "default_best": doc["default_best"],
            "workload": (doc.get("workload") or {}).get("summary"),
            "wall_s": doc["_wall_s"],
        }
        print(doc["_stderr_tail"], file=sys.stderr)
    child = subprocess.run(
        [PY, __file__, "--child", str(tuned / "profile.json"), str(held_out), "--rounds", str(args.rounds)]
        + ["--settle", str(args.settle)]
        + (["--prewarm"] if args.prewarm else []),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if child.returncode != 0:
        raise SystemExit(f"check failed:\n{child.stderr[-3000:]}")
    row["check"] = json.loads(child.stdout.strip().splitlines()[-1])
    row["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(row, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
