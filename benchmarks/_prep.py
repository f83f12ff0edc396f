"""What the prep and bench scripts share: user-facing errors, timed steps, package lookup, atomic
publish, the command line of the tune benchmarks (bench_tune, bench_olive), and sentences batched as
sentence-transformers batches them (the workload benchmarks)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any


class PrepError(RuntimeError):
    """A failure with a message meant for the user (no traceback needed)."""


def step_printer(tag: str) -> Callable[[str], AbstractContextManager[None]]:
    """``step(name)`` context managers that print the wall time of each step under ``[tag]``."""

    @contextmanager
    def step(name: str) -> Iterator[None]:
        start = time.perf_counter()
        print(f"[{tag}] {name} ...", flush=True)
        yield
        print(f"[{tag}] {name}: {time.perf_counter() - start:.1f} s", flush=True)

    return step


def package_dir(package: str, pip_name: str, install: str = "pip install") -> Path:
    """The installed package's folder, found without importing it (imports may need torch or llama-cpp)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PrepError(f"package {pip_name!r} is not installed; run: {install} {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(package: str, relative: str) -> Path | None:
    """A data file inside an installed package (a model shipped in a wheel), or None when either is missing."""
    try:
        path = package_dir(package, package) / relative
    except PrepError:
        return None
    return path if path.exists() else None


def tune_bench_parser(description: str) -> argparse.ArgumentParser:
    """The options bench_tune and bench_olive share; each script may add its own before parsing."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--budget", type=float, default=120, help="ortpilot tune budget per model, seconds")
    ap.add_argument("--duration", type=float, default=20, help="interleaved measurement per model, seconds")
    ap.add_argument("--only", default="", help="comma-separated corpus names (default: every model present)")
    ap.add_argument("--out", default="", help="folder for the tuners' outputs (default: a new temp folder)")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    ap.add_argument(
        "--turn", type=float, default=0.0, help="seconds per interleaving turn (0: measure's auto block of about 20 ms)"
    )
    return ap


def publish(tmp: Path, out: Path) -> None:
    """Swap the finished temp folder into place, so readers never see a half-written model."""
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    old = None
    if out.exists():
        old = out.with_name(out.name + f".old-{os.getpid()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_json(path: str | os.PathLike | None, doc: object) -> None:
    """A benchmark's JSON result (nothing when no path was given), its folder made on the way."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=1, default=str))


def sentence_feeds(
    tokenizer: str | os.PathLike, sentences: Sequence[str], limit: int | None = 128
) -> list[dict[str, Any]]:
    """One request per sentence at its own length, as a user's ``tokenizer(text)`` sends it: ``input_ids``,
    ``attention_mask`` and ``token_type_ids`` as ``[1, length]`` int64 arrays, from a ``tokenizer.json`` without
    padding, cut at ``limit`` tokens (None: the tokenizer's own truncation)."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_padding()
    if limit is not None:
        tok.enable_truncation(limit)
    return [
        {
            "input_ids": np.asarray([e.ids], np.int64),
            "attention_mask": np.asarray([e.attention_mask], np.int64),
            "token_type_ids": np.asarray([e.type_ids], np.int64),
        }
        for e in tok.encode_batch(list(sentences))
    ]


def length_batches(feeds: Sequence[Mapping[str, Any]], size: int) -> list[dict[str, Any]]:
    """Requests of one sentence each (``[1, length]`` arrays) as sentence-transformers batches them: sorted by
    length (ties in their order), cut into calls of ``size``, each input padded at its end to the call's longest
    with 0 (a mask 0 there), stacked on axis 0."""
    import numpy as np

    order = sorted(range(len(feeds)), key=lambda i: feeds[i]["input_ids"].shape[1])
    calls = []
    for start in range(0, len(order), size):
        group = [feeds[i] for i in order[start : start + size]]
        longest = max(f["input_ids"].shape[1] for f in group)
        calls.append(
            {
                name: np.concatenate([np.pad(f[name], ((0, 0), (0, longest - f[name].shape[1]))) for f in group])
                for name in group[0]
            }
        )
    return calls
