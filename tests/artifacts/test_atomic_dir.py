"""``atomic_dir``: a folder appears whole or not at all, and replaces an old one only when asked."""

from __future__ import annotations

import pytest

from ortpilot.artifacts.atomic import atomic_dir
from ortpilot.errors import UsageError


def test_a_failed_build_leaves_nothing_and_the_old_folder_intact(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "old").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(dest, replace=True) as tmp:
        (tmp / "new").write_text("new")
        raise RuntimeError("killed half way")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in dest.iterdir()] == ["old"]


def test_replace_swaps_the_new_folder_in_and_removes_the_old(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "old").write_text("old")
    with pytest.raises(UsageError), atomic_dir(dest):
        pass
    with atomic_dir(dest, replace=True) as tmp:
        (tmp / "new").write_text("new")
        assert not (dest / "new").exists()  # readers see the old folder until the end
    assert [p.name for p in dest.iterdir()] == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_file_in_the_way_is_a_usage_error(tmp_path):
    (tmp_path / "model").write_text("x")
    with pytest.raises(UsageError, match="is a file"), atomic_dir(tmp_path / "model", replace=True):
        pass
