"""The on-disk cache root. Entries are content-addressed; see ``ortpilot.artifacts.store``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$ORTPILOT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortpilot``, else ``~/.cache/ortpilot``."""
    env = os.environ.get("ORTPILOT_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "ortpilot"
    root.mkdir(parents=True, exist_ok=True)
    return root
