"""A profile's reference sample: the held-out input the tune timed and gated on, and the winner's outputs on it.

``reference.npz`` beside ``profile.json`` holds both (``inputs/NAME``, ``outputs/NAME``): what
``ortpilot verify`` reproduces, bit for bit on the same kernels and within the gate elsewhere.
Profiles written before it existed keep only hashes; :func:`reference_feeds` regenerates their
input sample from the source model and checks it against the recorded hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.errors import UsageError
from ortpilot.graph.feeds import UNREADABLE_ARRAY, make_feeds, plan_feeds
from ortpilot.modelio import load_model

REFERENCE_FILE = "reference.npz"
HELDOUT_SEED = 10_000  # generated held-out inputs never share a seed with calibration inputs (0..)


def array_digest(array: Any) -> str:
    """Content hash of one array (dtype, shape and bytes): how a profile proves exact reproduction."""
    a = np.ascontiguousarray(array)
    return hashlib.sha256(f"{a.dtype}|{a.shape}|".encode() + a.tobytes()).hexdigest()


def feeds_digest(feeds: Mapping[str, Any]) -> str:
    """Content hash of one input sample: proves a check ran on the inputs the tune used."""
    return _digest_join({name: array_digest(feeds[name]) for name in sorted(feeds)})


def _digest_join(parts: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def reference_feeds(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The held-out sample a profile's ``reference_outputs`` were computed on, regenerated from the
    source model (``profile["source_model"]``) exactly as the tune made it.

    Generated from the *source* model, not the tuned one: a fused model hides the embedding
    Gather that bounds token ids, so generating from it would give other inputs.
    """
    source = Path(profile["source_model"]["path"])
    if "heldout_seed" not in profile["reference_outputs"]:
        raise UsageError(
            f"The profile's reference inputs were real held-out samples ({(profile.get('gate_data') or {}).get('path')}), "
            f"not generated ones: they are in its {profile['reference_outputs'].get('file') or REFERENCE_FILE}, "
            "which is missing beside the profile. Copy it there, or re-run 'ortpilot tune'."
        )
    proto = load_model(source, load_external_data=False)
    shapes = {k: tuple(v) for k, v in (profile.get("shapes") or {}).items()}
    feeds = make_feeds(proto, plan=plan_feeds(proto, shapes), seed=int(profile["reference_outputs"]["heldout_seed"]))
    expected = profile["reference_outputs"].get("inputs_sha256")
    if expected and feeds_digest(feeds) != expected:
        raise UsageError(
            f"The reference inputs regenerated from '{source}' differ from those the tune used; "
            "the source model or ortpilot's input generator changed since the profile was made."
        )
    return feeds


def read_reference(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, outputs) of a ``reference.npz``; a damaged file is a UsageError naming it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except UNREADABLE_ARRAY as exc:
        raise UsageError(
            f"The reference file '{path}' cannot be read ({exc}). It was damaged or edited; "
            "re-run 'ortpilot tune' to write it again."
        ) from None
    inputs = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("inputs/")}
    outputs = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("outputs/")}
    if not inputs or not outputs:
        raise UsageError(f"The reference file '{path}' holds no inputs/ and outputs/ arrays; re-run 'ortpilot tune'.")
    return inputs, outputs


__all__ = ["HELDOUT_SEED", "REFERENCE_FILE", "array_digest", "feeds_digest", "read_reference", "reference_feeds"]
