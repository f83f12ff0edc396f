"""Fixtures for tests/export: the demo encoder's CPU profile, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from export_profiles import write_cpu_profile


@pytest.fixture(scope="session")
def encoder_profile(tmp_path_factory: pytest.TempPathFactory, demo_paths: dict[str, Path]) -> Path:
    return write_cpu_profile(tmp_path_factory.mktemp("encoder-profile"), demo_paths["encoder"])
