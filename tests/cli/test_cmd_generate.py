"""``ortpilot generate``: streaming, --json, and exit 2 with a clear message on bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ortpilot.cli.main import cli


def _run(*args: str):
    return CliRunner().invoke(cli, ["generate", "demo:decoder", *args])


def test_streams_ids_and_json_agrees() -> None:
    streamed = _run("--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--loop", "plain")
    assert streamed.exit_code == 0, streamed.output
    ids = [int(t) for t in streamed.stdout.split()]
    result = _run("--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--loop", "bound", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["tokens"] == [ids] and doc["loop"] == "bound" and doc["kv_host_bytes_per_token"] == 0
    assert doc["signature"]["logits"] == "logits"


def test_fuse_uses_the_shared_loop_with_the_same_tokens() -> None:
    if importlib.util.find_spec("onnxscript") is None:
        pytest.skip("onnxscript is not installed")
    plain = json.loads(_run("--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--json", "--loop", "plain").stdout)
    fused = _run("--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--json", "--fuse")
    assert fused.exit_code == 0, fused.output
    doc = json.loads(fused.stdout)
    assert doc["loop"] == "shared" and doc["tokens"] == plain["tokens"]
    assert "GroupQueryAttention" in doc["notes"][0]


def test_speculation_flags_keep_the_tokens_and_report_the_runs() -> None:
    if importlib.util.find_spec("onnxscript") is None:
        pytest.skip("onnxscript is not installed")
    args = ["--prompt-ids", "5,6,7,5,6", "--max-new-tokens", "12", "--json", "--fuse"]
    off = json.loads(_run(*args, "--speculation", "off").stdout)
    on = _run(*args, "--speculation", "on", "--draft-tokens", "3")
    assert on.exit_code == 0, on.output
    doc = json.loads(on.stdout)
    assert doc["tokens"] == off["tokens"] and off["speculation"] == {}
    assert doc["speculation"]["mode"] == "on" and doc["speculation"]["draft_tokens"] == 3
    assert "prompt-lookup speculation on" in doc["loop_reason"]


def test_fuse_with_max_positions_limits_the_fused_model() -> None:
    if importlib.util.find_spec("onnxscript") is None:
        pytest.skip("onnxscript is not installed")
    fused = _run("--prompt-ids", "5,6,7", "--max-new-tokens", "30", "--json", "--fuse", "--max-positions", "12")
    assert fused.exit_code == 0, fused.output
    doc = json.loads(fused.stdout)
    assert doc["stop_reason"] == "max_length" and len(doc["tokens"][0]) == 9  # 3 + 9 = the table's 12 rows
    assert "rotary tables for 12 positions" in doc["notes"][0]
    assert doc["signature"]["max_positions"] == 12
    too_long = _run("--prompt-ids", ",".join(["1"] * 12), "--fuse", "--max-positions", "12")
    assert too_long.exit_code == 2 and "fuse again with a larger --max-positions" in " ".join(too_long.output.split())
    for args, message in (
        (["--fuse", "--max-positions", "-1"], "-1 is not in the range"),
        (["--fuse", "--max-positions", "4"], "or at least 8"),  # the fusion's check needs 8
        (["--max-positions", "64"], "does nothing without --fuse"),
    ):
        bad = _run("--prompt-ids", "1", *args)
        assert bad.exit_code == 2 and message in " ".join(bad.output.split()), bad.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt-ids", "1,2,999"], "outside the vocabulary"),
        (["--prompt-ids", "1,x"], "comma-separated list of integers"),
        (["--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--prompt", "hi", "--tokenizer", "/does/not/exist.json"], "does not exist"),
        ([], "exactly one of --prompt-ids"),
        (["--prompt-ids", "1,2,3,4", "--max-length", "4"], "KV buffer holds 4"),
        (["--prompt-ids", ",".join(["1"] * 2048)], "at most 2048 positions"),
        (["--prompt-ids", "1", "--loop", "shared"], "needs GroupQueryAttention"),
        (["--prompt-ids", "1", "--top-p", "0"], "top_p must be in"),
        (["--prompt-ids", "1", "--draft-tokens", "0"], "draft_tokens (the speculation length) must be at least 1"),
        (["--prompt-ids", "1", "--draft-tokens", "2047"], "does not fit the model's positions of 2048"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str) -> None:
    result = _run(*args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_text_prompt_without_a_tokenizer_exits_2() -> None:
    from ortpilot.models import demo_model_path

    # A model file brings no tokenizer (only demo:decoder has one of its own).
    result = CliRunner().invoke(cli, ["generate", str(demo_model_path("decoder")), "--prompt", "hello"])
    assert result.exit_code == 2 and "--prompt needs --tokenizer" in " ".join(result.output.split())


def test_demo_decoder_takes_text_offline() -> None:
    if importlib.util.find_spec("tokenizers") is None:
        pytest.skip("tokenizers is not installed (pip install tokenizers)")
    text = "Grüß dich, 世界"
    by_text = _run("--prompt", text, "--max-new-tokens", "6", "--json")
    assert by_text.exit_code == 0, by_text.output
    ids = ",".join(str(b) for b in text.encode())  # byte-level: the ids are the UTF-8 bytes
    by_ids = json.loads(_run("--prompt-ids", ids, "--max-new-tokens", "6", "--json").stdout)
    doc = json.loads(by_text.stdout)
    assert doc["prompt_length"] == len(text.encode()) and doc["tokens"] == by_ids["tokens"]
    assert doc["text"] == bytes(doc["tokens"][0]).decode("utf-8", errors="replace")


def test_text_prompt_with_a_tokenizer(tmp_path: Path) -> None:
    if importlib.util.find_spec("tokenizers") is None:
        pytest.skip("tokenizers is not installed (pip install tokenizers)")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<|im_end|>": 1, "<|im_start|>": 2, **{f"w{i}": i + 3 for i in range(250)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    result = _run("--prompt", "w1 w2 w3", "--tokenizer", str(path), "--max-new-tokens", "4", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["prompt_length"] == 3 and isinstance(doc["text"], str)
    # A tokenizer without <|im_start|> cannot apply ChatML; one with it wraps the prompt.
    chat = _run("--prompt", "w1", "--tokenizer", str(path), "--chat", "--max-new-tokens", "2", "--json")
    assert chat.exit_code == 0, chat.output
    assert json.loads(chat.stdout)["prompt_length"] > 1
