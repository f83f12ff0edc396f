"""ORT's error messages as a client may read them: one line without C++ source paths, signatures,
assertion text or node names (both stacks answer a run ORT refused with it, as a 400)."""

from __future__ import annotations

import re

MAX_MESSAGE = 400
_ORT_PREFIX = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : ")
_NODE = re.compile(r"Non-zero status code returned while running (\w+) node\. Name:'[^']*' Status Message: ")
_NAME = re.compile(r"\s*Name:'[^']*'")
_SOURCE = re.compile(r"(?:[A-Za-z]:\\|/)[^\s:]+\.(?:h|hpp|cc|cpp|c|cu|py|pyx):\d+")
_SIGNATURE = re.compile(r"\s*(?:[\w:<>,*&]+ )?[\w:<>~]+::~?\w+\([^()]*\)(?: const)?")
_ENFORCE = re.compile(r"\s*[^.;:]*? was false\.")
_PATH = re.compile(r"(?:[A-Za-z]:\\|/)(?:[\w.+-]+[/\\])+[\w.+-]*")


def clean_ort_message(message: str) -> str:
    """``message`` (ORT's or one quoting it) as one line without source paths, C++ signatures, assertion
    text or node names: ``... Gather node: indices element out of data bounds, idx=5000 ...``."""
    text = " ".join(message.split())
    text = _ORT_PREFIX.sub("", text)
    text = _NODE.sub(r"\1 node: ", text)
    text = _NAME.sub("", text)
    if _SOURCE.search(text):
        text = _SOURCE.sub("", text)
        text = _SIGNATURE.sub("", text, count=1)
        text = _ENFORCE.sub("", text, count=1)
    text = _PATH.sub("<path>", text)
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


__all__ = ["clean_ort_message"]
