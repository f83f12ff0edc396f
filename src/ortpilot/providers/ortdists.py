"""Which installed distributions provide the ``onnxruntime`` import, and which one's files win.

onnxruntime, onnxruntime-gpu, onnxruntime-openvino (and -directml, -qnn, ort-nightly ...) all
install the same ``onnxruntime/`` package. pip installs the second over the first without a
word: shared files are overwritten by whichever was installed last, and uninstalling either
one deletes files the other needs. This module reads the installed metadata (RECORD files)
without importing ORT, so it works when the mix is too broken to import.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMPORT_NAME = "onnxruntime"
# Files that decide which build you get: the package entry point, the native extension, and
# the module that names the package the build came from.
KEY_FILES = (
    "onnxruntime/__init__.py",
    "onnxruntime/capi/onnxruntime_pybind11_state",
    "onnxruntime/capi/build_and_package_info.py",
)
# Distributions with onnxruntime in their name that do NOT install the onnxruntime package.
_OTHER_PACKAGES = ("onnxruntime-ep-", "onnxruntime-genai", "onnxruntime-extensions", "onnxruntime-tools")


@dataclass
class KeyFile:
    """One key file of the ``onnxruntime`` package: where it is and whose RECORD hash it matches."""

    path: str
    claimed_by: list[str] = field(default_factory=list)
    matches: list[str] = field(default_factory=list)  # distributions whose RECORD hash equals the file on disk

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "claimed_by": self.claimed_by, "matches": self.matches}


@dataclass
class OrtDistribution:
    """An installed distribution that ships the ``onnxruntime`` import package."""

    name: str
    version: str
    location: str
    files_claimed: int
    provides_import: bool  # its files are the ones ``import onnxruntime`` finds
    key_files_won: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "location": self.location,
            "files_claimed": self.files_claimed,
            "provides_import": self.provides_import,
            "key_files_won": self.key_files_won,
        }


@dataclass
class DistributionReport:
    """Every ORT distribution, where ``import onnxruntime`` resolves, and any conflict."""

    import_path: str | None
    distributions: list[OrtDistribution]
    key_files: list[KeyFile]

    @property
    def conflict(self) -> bool:
        return len(self.distributions) > 1

    @property
    def winner(self) -> str | None:
        """The distribution whose files ``import onnxruntime`` loads (most key files matched)."""
        ranked = sorted(self.distributions, key=lambda d: (-len(d.key_files_won), not d.provides_import))
        return ranked[0].name if ranked and (ranked[0].key_files_won or ranked[0].provides_import) else None

    @property
    def mixed(self) -> bool:
        """Key files come from different distributions: a build no one released."""
        matched = [set(k.matches) for k in self.key_files if k.matches]
        return bool(matched) and not set.intersection(*matched)

    def to_dict(self) -> dict[str, Any]:
        return {
            "import_path": self.import_path,
            "distributions": [d.to_dict() for d in self.distributions],
            "conflict": self.conflict,
            "winner": self.winner,
            "mixed_files": self.mixed,
            "key_files": [k.to_dict() for k in self.key_files],
        }


def is_ort_distribution(dist: importlib.metadata.Distribution) -> bool:
    """True when the distribution installs files into the ``onnxruntime/`` package."""
    name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
    if name.startswith(_OTHER_PACKAGES):
        return False
    files = dist.files
    if files is None:  # no RECORD: judge by name
        return name.startswith(("onnxruntime", "ort-nightly"))
    return any(_norm(str(f)).startswith("onnxruntime/") for f in files)


def find_ort_distributions() -> DistributionReport:
    """Scan ``sys.path`` for ORT distributions and match their RECORDs against the files on disk."""
    spec = importlib.util.find_spec(IMPORT_NAME)
    origin = spec.origin if spec is not None else None
    import_dir = os.path.realpath(os.path.dirname(origin)) if origin else None
    seen: set[tuple[str, str]] = set()
    dists: list[tuple[importlib.metadata.Distribution, OrtDistribution]] = []
    for dist in importlib.metadata.distributions():
        if not is_ort_distribution(dist):
            continue
        name = dist.metadata.get("Name") or "?"
        location = str(Path(str(dist.locate_file(""))).resolve())
        if (name.lower(), location) in seen:
            continue
        seen.add((name.lower(), location))
        claimed = [f for f in (dist.files or []) if _norm(str(f)).startswith("onnxruntime/")]
        provides = import_dir is not None and any(
            os.path.realpath(str(dist.locate_file(f))).startswith(import_dir + os.sep) for f in claimed
        )
        dists.append((dist, OrtDistribution(name, dist.version, location, len(claimed), provides)))
    key_files = _match_key_files(dists, import_dir)
    return DistributionReport(origin, [d for _, d in dists], key_files)


def _match_key_files(
    dists: list[tuple[importlib.metadata.Distribution, OrtDistribution]], import_dir: str | None
) -> list[KeyFile]:
    """For each key file under the imported package: which RECORD claims it and whose hash matches."""
    out: dict[str, KeyFile] = {}
    hashes: dict[str, str] = {}
    for dist, info in dists:
        for entry in dist.files or []:
            rel = _norm(str(entry))
            if not any(rel.startswith(k) for k in KEY_FILES):
                continue
            real = os.path.realpath(str(dist.locate_file(entry)))
            if import_dir is not None and not real.startswith(import_dir + os.sep):
                continue  # a shadowed copy elsewhere on sys.path is not what gets imported
            key = out.setdefault(real, KeyFile(real))
            key.claimed_by.append(info.name)
            if entry.hash is None or not os.path.isfile(real):
                continue
            if real not in hashes:
                hashes[real] = _record_hash(real, entry.hash.mode)
            if hashes[real] == entry.hash.value:
                key.matches.append(info.name)
                info.key_files_won.append(rel)
    return sorted(out.values(), key=lambda k: k.path)


def _record_hash(path: str, mode: str) -> str:
    """A file's digest in RECORD format: urlsafe base64 without padding."""
    digest = hashlib.new(mode)
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def _norm(path: str) -> str:
    """RECORD paths relative to site-packages, '/'-separated; '../' entries point outside it."""
    return path.replace("\\", "/")


__all__ = ["DistributionReport", "KeyFile", "OrtDistribution", "find_ort_distributions", "is_ort_distribution"]
