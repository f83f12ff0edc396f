"""Real sentences at their natural lengths, from text already on the machine: the Python standard library's
docstrings, read with ``ast`` (nothing is imported or run), split into sentences, deduplicated, shuffled with
a fixed seed and cut into disjoint files (calibration for a tune, held-out for the checks after it).

    python benchmarks/corpus.py --out benchmarks/out/corpus --sizes 200,2000

writes ``benchmarks/out/corpus/part0.txt`` (200 lines), ``part1.txt`` (2000 lines) and prints the word-count
quantiles. The same Python version gives the same files.
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import sysconfig
from pathlib import Path

SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
MIN_WORDS, MAX_WORDS = 3, 80


def sentences(root: Path) -> list[str]:
    """Every docstring sentence of the .py files under ``root`` that reads like prose, once, in file order."""
    seen: dict[str, None] = {}
    for path in sorted(root.rglob("*.py")):
        if {"test", "tests", "idlelib", "site-packages"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for paragraph in doc.split("\n\n"):
                text = " ".join(paragraph.split())
                if not text or text.startswith((">>>", "-", "*", ":", "..")) or "    " in paragraph:
                    continue
                for sentence in SPLIT.split(text):
                    words = sentence.split()
                    if MIN_WORDS <= len(words) <= MAX_WORDS and sentence[0].isalpha():
                        seen.setdefault(sentence, None)
    return list(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/out/corpus")
    parser.add_argument("--sizes", default="200,2000", help="lines per file, comma-separated (disjoint files)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    found = sentences(Path(sysconfig.get_paths()["stdlib"]))
    random.Random(args.seed).shuffle(found)
    sizes = [int(s) for s in args.sizes.split(",")]
    if sum(sizes) > len(found):
        raise SystemExit(f"only {len(found)} sentences found; ask for fewer than {sum(sizes)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, size in enumerate(sizes):
        part = found[start : start + size]
        start += size
        (out / f"part{i}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
        words = sorted(len(s.split()) for s in part)
        q = [words[min(len(words) - 1, int(p * len(words)))] for p in (0.5, 0.9, 0.99)]
        print(f"{out / f'part{i}.txt'}: {size} sentences, words p50 {q[0]}, p90 {q[1]}, p99 {q[2]}, max {words[-1]}")


if __name__ == "__main__":
    main()
