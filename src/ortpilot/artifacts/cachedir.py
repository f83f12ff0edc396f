"""Where the model cache lives, as configured. The cache creates that folder and the OS-error messages
name it without creating it; both read the rule here, so it is written once."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ORTPILOT_CACHE_DIR"


def configured_cache_root() -> tuple[Path, bool]:
    """(the cache folder, whether ``$ORTPILOT_CACHE_DIR`` chose it): that variable, else
    ``$XDG_CACHE_HOME/ortpilot``, else ``~/.cache/ortpilot``. Nothing is created or checked."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env), True
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ortpilot", False


__all__ = ["CACHE_ENV", "configured_cache_root"]
