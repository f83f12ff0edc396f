"""How far below the gate's worst held-out sample does traffic's worst sentence fall? (issue 46)

Dynamic INT8 variants of MiniLM with 3, 5, 6, 8 and 12 of its most sensitive layers left in float (the
ranking a tune journaled: ``bench_workload.py``'s ``OUT/tuned/journal.jsonl``), and with the six FFN output
MatMuls left in float, each run on 2,000 real sentences at their own length, one per call, beside the
float model: every sentence's ``sentence_embedding`` cosine error; the worst of all 2,000 against the worst
of 50 of them (the median over 2,000 random draws of 50: what a gate on 50 held-out sentences sees); and
batch-1 speed against the float model (3 interleaved rounds of 300 sentences).

    .venv-test/bin/python benchmarks/bench_int8_tail.py --tuned /tmp/bw1/tuned --sentences /tmp/bw1/corpus/part1.txt
        [--work DIR] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.transformers.optimizer import optimize_model
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT / "benchmarks/models/minilm"


def ranking(journal: Path) -> list[str]:
    """The fused model's dynamic-INT8 noise ranking a tune journaled (worst first)."""
    ranked: list[str] = []
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "rank" and entry.get("passes"):
            ranked = [r["node"] for r in entry["ranking"]]
    if not ranked:
        raise SystemExit(f"{journal} holds no ranking of the fused model (a tune with INT8 candidates writes one)")
    return ranked


def fused(work: Path) -> Path:
    """MiniLM with ORT's BERT fusions, prepared for quantization (what tune's ``fusion(bert)`` step builds)."""
    out = work / "fused.onnx"
    if not out.is_file():
        model = optimize_model(
            str(MINILM / "model.onnx"), model_type="bert", num_heads=12, hidden_size=384, opt_level=0
        )
        model.save_model_to_file(str(work / "fused0.onnx"))
        quant_pre_process(str(work / "fused0.onnx"), str(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tuned", required=True, type=Path)
    ap.add_argument("--sentences", required=True, type=Path)
    ap.add_argument("--work", default="/tmp/ortpilot-int8-tail", type=Path)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    texts = [t for t in args.sentences.read_text().splitlines() if t.strip()][:2000]
    encodings = tok.encode_batch(texts)

    def feeds(enc) -> dict[str, np.ndarray]:
        ids = np.array([enc.ids[:256]], np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

    def embed(session: ort.InferenceSession) -> np.ndarray:
        out = np.stack([session.run(["sentence_embedding"], feeds(e))[0][0] for e in encodings])
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    base = fused(args.work)
    ranked = ranking(args.tuned / "journal.jsonl")
    graph = onnx.load(str(base), load_external_data=False).graph
    ffn_out = [
        n.name for n in graph.node if n.op_type == "MatMul" and "/output/dense" in n.name and "attention" not in n.name
    ]
    variants = {f"x{k}": ranked[:k] for k in (3, 5, 6, 8, 12)} | {"ffn-out6": ffn_out}
    plain = ort.InferenceSession(str(MINILM / "model.onnx"), providers=["CPUExecutionProvider"])
    reference = embed(plain)
    rng = np.random.default_rng(0)
    head = (
        f"ONNX Runtime {ort.__version__}, {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}, "
        f"{len(texts)} sentences, load average at start {os.getloadavg()[0]:.1f}"
    )
    print(head, flush=True)
    rows = {}
    for name, excluded in variants.items():
        path = args.work / f"int8-{name}.onnx"
        if not path.is_file():
            quantize_dynamic(
                str(base),
                str(path),
                per_channel=True,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Attention"],
                nodes_to_exclude=excluded,
            )
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        error = 1.0 - (embed(session) * reference).sum(1)
        worst_of_50 = float(np.median([rng.choice(error, 50, replace=False).max() for _ in range(2000)]))
        mine, theirs = [], []
        for _ in range(3):
            for run, times in ((session, mine), (plain, theirs)):
                start = time.perf_counter()
                for enc in encodings[:300]:
                    run.run(None, feeds(enc))
                times.append(time.perf_counter() - start)
        rows[name] = {
            "float_layers": len(excluded),
            "worst": float(error.max()),
            "worst_of_50": worst_of_50,
            "tail_ratio": float(error.max()) / worst_of_50,
            "under_0.99": int((error > 0.01).sum()),
            "speedup_batch1": float(np.median(theirs) / np.median(mine)),
        }
        r = rows[name]
        print(
            f"{name}: {r['float_layers']} layers float; worst error {r['worst']:.4f} (cosine {1 - r['worst']:.4f}), "
            f"worst of 50 {r['worst_of_50']:.4f}, ratio {r['tail_ratio']:.2f}; {r['under_0.99']} of {len(texts)} "
            f"under cosine 0.99; {r['speedup_batch1']:.2f}x the float model at batch 1",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"header": head, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
