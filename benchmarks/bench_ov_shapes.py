"""Is a dynamic OpenVINO session as fast on traffic's many lengths as on the few a tune replays? (issue 46)

A tuned model (``--model``, e.g. ``bench_workload.py``'s ``OUT/tuned/model.onnx`` when OpenVINO won without
buckets) on the OpenVINO EP (2 threads) beside ORT's default CPU session of the float MiniLM, one sentence per
call at its own length (``--batch N``: each slice sorted by length and cut into calls of N, each padded to its
longest): the 2,000 sentences in three slices of 600, three passes (sentences/s of each slice, in
order), then 50 sentences of one length (17 tokens) repeated 12 times. ``--warm`` first runs the OpenVINO
session once at every length 1-128, at batch 1 and at ``--batch`` (``session.warmup.warm_at_sizes``, what ``load_profile`` does where the
profile asks for it; its seconds are printed). Run it with and without ``--warm`` in processes of their own: two
OpenVINO sessions of one model in one process share what the first one prepared. Needs onnxruntime-openvino
(``.venv-ovbench``).

    .venv-ovbench/bin/python benchmarks/bench_ov_shapes.py --model /tmp/bw6/tuned/model.onnx \\
        --sentences /tmp/bw6/corpus/part1.txt [--warm] [--batch 32] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _prep import length_batches, sentence_feeds

from ortpilot.session.warmup import WarmupPlan, warm_at_sizes

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--sentences", required=True, type=Path)
    ap.add_argument("--json", default="")
    ap.add_argument("--warm", action="store_true", help="run the OpenVINO session at every length 1-128 first")
    ap.add_argument("--batch", type=int, default=1, help="sentences per call: each slice sorted by length, padded")
    args = ap.parse_args()
    texts = [s.strip() for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    feeds = sentence_feeds(MINILM / "tokenizer.json", texts)

    def openvino() -> ort.InferenceSession:
        return ort.InferenceSession(
            str(args.model),
            providers=["OpenVINOExecutionProvider"],
            provider_options=[{"device_type": "CPU", "num_of_threads": "2"}],
        )

    sessions = {
        "openvino": openvino(),
        "ORT default": ort.InferenceSession(str(MINILM / "model.onnx"), providers=["CPUExecutionProvider"]),
    }
    for sess in sessions.values():
        for f in feeds[:50]:
            sess.run(None, f)
    warmed = None
    if args.warm:
        axes = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))
        longest = max(feeds, key=lambda f: f["input_ids"].shape[1])
        plan = WarmupPlan("sequence", axes, tuple(range(1, 129)), 0.0, 0.0, batches=(1, args.batch))
        warmed = warm_at_sizes(sessions["openvino"], longest, plan, budget_s=600).to_dict()

    def rate(sess: ort.InferenceSession, chunk: list[dict[str, np.ndarray]]) -> float:
        start = time.perf_counter()
        for f in chunk:
            sess.run(None, f)
        return sum(f["input_ids"].shape[0] for f in chunk) / (time.perf_counter() - start)

    def batched(chunk: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """``chunk`` sorted by length in calls of ``--batch``, each padded to its longest (mask 0)."""
        return chunk if args.batch == 1 else length_batches(chunk, args.batch)

    slices = [batched(feeds[i : i + 600]) for i in range(0, min(len(feeds), 1800), 600)]
    passes: dict[str, list[list[float]]] = {name: [] for name in sessions}
    for _ in range(3):
        for name, sess in sessions.items():
            passes[name].append([round(rate(sess, chunk)) for chunk in slices])
    one_length = [f for f in feeds if f["input_ids"].shape[1] == 17][:50] * 12
    doc = {
        "date": datetime.date.today().isoformat(),
        "onnxruntime": ort.__version__,
        "load_avg": os.getloadavg()[0],
        "batch": args.batch,
        "passes_per_s": passes,
        "one_length_per_s": {name: round(rate(sess, one_length)) for name, sess in sessions.items()},
        "warm_up": warmed,
    }
    print(json.dumps(doc, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
