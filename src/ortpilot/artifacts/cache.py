"""The on-disk cache root. Entries are content-addressed; see ``ortpilot.artifacts.store``.

Trust: a cached model is run as if the user had built it, so the default root is the user's
own (created 0700; one owned by someone else is refused). ``$ORTPILOT_CACHE_DIR`` may name a
folder shared by a group: when it is group-writable, ortpilot creates its folders and files
there group-writable too, so every member can use and repair what another built.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ortpilot.artifacts.cachedir import configured_cache_root
from ortpilot.artifacts.oserrors import storage_errors
from ortpilot.errors import StorageError, UsageError

PRIVATE_MODE = 0o700


def cache_root() -> Path:
    """``$ORTPILOT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortpilot``, else ``~/.cache/ortpilot``.

    The default folder is created with mode 0700; a cache path that is a file, unwritable, or (the
    default one) owned by another user raises ``UsageError`` naming it and the fix.
    """
    root, env = configured_cache_root()
    if root.exists() and not root.is_dir():
        raise StorageError(
            f"The model cache '{root}' is a file, not a folder. Remove it, or point ORTPILOT_CACHE_DIR at a folder.",
            path=str(root),
        )
    with storage_errors(root, "create the model cache folder", also=(errno.ENOENT,)):
        root.mkdir(parents=True, exist_ok=True, mode=0o777 if env else PRIVATE_MODE)
    if not env:
        _check_private(root)
    return root


def is_shared(folder: str | os.PathLike) -> bool:
    """A group-writable cache folder: shared on purpose, so what ortpilot creates there is group-writable too."""
    try:
        return bool(os.stat(folder).st_mode & stat.S_IWGRP)
    except OSError:
        return False


def make_shared_dir(path: Path, shared: bool) -> None:
    """``mkdir -p`` that gives new folders group write (and setgid, keeping the group) in a shared cache."""
    with storage_errors(path, "create the cache folder", also=(errno.ENOENT,)):
        missing = [p for p in [path, *path.parents] if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        if shared:
            for folder in missing:
                share(folder)


def share(path: Path) -> None:
    """Group read/write on a file or folder of a shared cache (folders also keep their group: setgid)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
            return  # never through a link; another member's file is theirs to share
        extra = stat.S_IRGRP | stat.S_IWGRP
        if stat.S_ISDIR(info.st_mode):
            extra |= stat.S_IXGRP | stat.S_ISGID
        if stat.S_IMODE(info.st_mode) & extra != extra:
            os.chmod(path, stat.S_IMODE(info.st_mode) | extra)
    except OSError:
        pass  # the next writer's own error message says what is wrong


def _check_private(root: Path) -> None:
    info = root.stat()
    if info.st_uid != os.getuid():
        raise UsageError(
            f"The model cache '{root}' belongs to user id {info.st_uid}, not to you (user id "
            f"{os.getuid()}); ortpilot runs cached models as if you had built them, so it uses only a "
            "cache you own. Remove it, or point ORTPILOT_CACHE_DIR at your own (or a deliberately "
            "shared, group-writable) folder."
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        try:
            os.chmod(root, PRIVATE_MODE)  # made by an older ortpilot with the umask's mode
        except OSError:
            pass
