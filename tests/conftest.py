"""Shared fixtures: an isolated cache dir, demo model paths, the demo encoder's profile, real models from PyPI
packages."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """A shell starts a background job (``cmd &`` in a script) with SIGINT ignored, and the commands the tests
    start inherit that: the Ctrl-C tests then send a SIGINT nothing sees. The tests run as if from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test session gets its own cache root, so tests never see a user's cache."""
    root = tmp_path_factory.mktemp("ortpilot-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("ORTPILOT_CACHE_DIR", str(root))
    yield root
    mp.undo()


def package_file(package: str, relative: str) -> Path | None:
    """A data file inside an installed package, found without importing it (silero_vad imports torch)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.exists() else None


def real_model(package: str, relative: str) -> Path:
    path = package_file(package, relative)
    if path is None:
        pytest.skip(f"{package} is not installed (pip install --no-deps {package.replace('_', '-')})")
    return path


@pytest.fixture
def magika_path() -> Path:
    return real_model("magika", "models/standard_v3_3/model.onnx")


@pytest.fixture
def silero_vad_path() -> Path:
    return real_model("silero_vad", "data/silero_vad.onnx")


@pytest.fixture
def nudenet_path() -> Path:
    return real_model("nudenet", "320n.onnx")


@pytest.fixture
def ocr_det_path() -> Path:
    return real_model("rapidocr", "models/PP-OCRv6_det_small.onnx")


@pytest.fixture
def ocr_rec_path() -> Path:
    return real_model("rapidocr", "models/PP-OCRv6_rec_small.onnx")


@pytest.fixture(scope="session")
def demo_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every built-in demo model written once per test session."""
    from ortpilot.models import write_demo_models

    return write_demo_models(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def encoder_profile(tmp_path_factory: pytest.TempPathFactory, demo_paths: dict[str, Path]) -> Path:
    """The demo encoder's CPU profile, written once per session (tests/export, tests/cli/test_cmd_export.py)."""
    from export_profiles import write_cpu_profile

    return write_cpu_profile(tmp_path_factory.mktemp("encoder-profile"), demo_paths["encoder"])


@pytest.fixture(scope="session")
def tuned_mlp(tmp_path_factory: pytest.TempPathFactory, demo_paths: dict[str, Path]) -> Path:
    """A real tune of the demo MLP (default options), made once per session: modules that edit or serve a
    tune copy it into a folder of their own (tests/cli/test_cmd_verify.py, test_pytest_plugin.py, tests/fleet)."""
    from ortpilot.tuning import tune

    out = tmp_path_factory.mktemp("tuned-mlp") / "out"
    tune(str(demo_paths["mlp"]), out, budget_s=12)
    return out
