"""NNCF's INT8 for OpenVINO on MiniLM with layers left in float: traffic's worst sentence and batch-32 speed.

Issue 46: NNCF's INT8 passed a tune's gate on its held-out sentences and left sentences of other traffic under
cosine 0.99. This runs ``OpenVINOInt8Pass`` (``passes/openvino_int8``, NNCF's transformer preset) calibrated on
the first 150 tune sentences, with no layer in float (``x0``), with the six layers a CPU tune's follow-up left in
float (``x6``, ``--exclude``: its noise ranking) and with all twelve feed-forward MatMuls (``ffn12``), each on the
OpenVINO EP (2 threads) beside ORT's default CPU session of the float model: every sentence's
``sentence_embedding`` cosine error, one per call at its own length (the worst of all, the worst of the first
50: what a gate on 50 held-out sentences sees), and sentences/s at 32 per call sorted by length and padded to the
longest (5 interleaved rounds, median). Needs an environment where OpenVINO computes and NNCF is installed
(``.venv-ovbench``: onnxruntime-openvino + nncf, any x86 CPU).

    .venv-ovbench/bin/python benchmarks/bench_nncf_exclusions.py --tune-sentences /tmp/bw5/corpus/part0.txt \\
        --sentences /tmp/bw5/corpus/part1.txt [--count 1000] [--json OUT.json]

``--recipes`` measures NNCF's recipes instead, every layer INT8: its own (``own``), SmoothQuant's alpha at
0.5-0.9 (``sq0.8``: ``OpenVINOInt8Options.smooth_quant``), min-max activation ranges (``minmax``) and both
(``sq0.8-minmax``: the tune's second recipe), with ``--calibration-count`` calibration sentences (150).
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
from _prep import length_batches
from tokenizers import Tokenizer

from ortpilot.passes.base import SourceModel
from ortpilot.passes.openvino_int8 import OpenVINOInt8Pass

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"
X6 = [
    "/bert/encoder/layer.0/intermediate/dense/MatMul",
    "/bert/encoder/layer.0/output/dense/MatMul",
    "/bert/encoder/layer.1/output/dense/MatMul",
    "/bert/encoder/layer.2/output/dense/MatMul",
    "/bert/encoder/layer.3/intermediate/dense/MatMul",
    "/bert/encoder/layer.4/intermediate/dense/MatMul",
]
RECIPES: dict[str, dict] = {
    "own": {},
    **{f"sq{alpha:g}": {"smooth_quant": alpha} for alpha in (0.5, 0.7, 0.8, 0.9)},
    "minmax": {"activation_ranges": "minmax"},
    "sq0.8-minmax": {"smooth_quant": 0.8, "activation_ranges": "minmax"},
}
FFN12 = [f"/bert/encoder/layer.{i}/{part}/dense/MatMul" for i in range(6) for part in ("intermediate", "output")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tune-sentences", required=True, type=Path)
    ap.add_argument("--sentences", required=True, type=Path)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--exclude", default=",".join(X6), help="the x6 variant's layers, comma-separated")
    ap.add_argument("--recipes", action="store_true", help="NNCF's recipes, every layer INT8 (module docstring)")
    ap.add_argument("--calibration-count", type=int, default=150)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    tok = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(128)

    def feed(text: str) -> dict[str, np.ndarray]:
        ids = np.asarray([tok.encode(text).ids], np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

    def lines(path: Path) -> list[str]:
        return [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]

    calibration = [feed(t) for t in lines(args.tune_sentences)[: args.calibration_count]]
    texts = lines(args.sentences)[: args.count]
    feeds = [feed(t) for t in texts]
    batches = length_batches(feeds, 32)
    plain = ort.InferenceSession(str(MINILM / "model.onnx"), providers=["CPUExecutionProvider"])
    want = [plain.run(["sentence_embedding"], f)[0][0] for f in feeds]
    source = SourceModel.of(MINILM / "model.onnx")
    variants: dict[str, dict] = (
        RECIPES
        if args.recipes
        else {
            "x0": {},
            "x6": {"nodes_to_exclude": [n for n in args.exclude.split(",") if n]},
            "ffn12": {"nodes_to_exclude": FFN12},
        }
    )
    sessions = {"ORT default": plain}
    rows: dict[str, dict] = {}
    for name, settings in variants.items():
        built = OpenVINOInt8Pass(calibration=calibration, **settings).transform(source)
        exclude = settings.get("nodes_to_exclude", [])
        sess = ort.InferenceSession(
            built.model.SerializeToString(),
            providers=["OpenVINOExecutionProvider"],
            provider_options=[{"device_type": "CPU", "num_of_threads": "2"}],
        )
        errors = np.array(
            [
                1 - float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
                for a, b in zip(want, (sess.run(["sentence_embedding"], f)[0][0] for f in feeds))
            ]
        )
        rows[name] = {
            "float_layers": len(exclude),
            "worst_error": float(errors.max()),
            "worst_of_first_50": float(errors[:50].max()),
            "p99_error": float(np.quantile(errors, 0.99)),
            "median_error": float(np.median(errors)),
        }
        sessions[name] = sess
    seconds: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(5):
        for name, sess in sessions.items():
            start = time.perf_counter()
            for batch in batches:
                sess.run(["sentence_embedding"], batch)
            seconds[name].append(time.perf_counter() - start)
    base = float(np.median(seconds["ORT default"]))
    for name in sessions:
        row = rows.setdefault(name, {})
        row["batch32_per_s"] = len(feeds) / float(np.median(seconds[name]))
        row["batch32_vs_default"] = base / float(np.median(seconds[name]))
    doc = {
        "date": datetime.date.today().isoformat(),
        "onnxruntime": ort.__version__,
        "sentences": len(feeds),
        "calibration_sentences": len(calibration),
        "load_avg": os.getloadavg()[0],
        "variants": rows,
    }
    print(json.dumps(doc, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
