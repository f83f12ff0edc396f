"""Ray's environment for a client of ortpilot's: single-machine mode exactly for loopback addresses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ortpilot.rayenv import is_loopback

SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        (None, True),
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("10.0.0.5:6379", False),
        ("head.cluster.local:6379", False),
        ("auto", False),
    ],
)
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


def _environment_after(address: str | None, env: dict[str, str], import_ray_first: bool = False) -> dict:
    code = (
        ("import ray; " if import_ray_first else "")
        + "import json, os, sys; from ortpilot.rayenv import ray_environment; "
        + f"ray_environment({address!r}); "
        + "c = sys.modules.get('ray._private.ray_constants'); "
        + f"print(json.dumps({{k: os.environ.get(k) for k in ({SWITCH!r}, 'RAY_USAGE_STATS_ENABLED')}} "
        + "| {'cluster_mode': getattr(c, 'ENABLE_RAY_CLUSTER', None)}))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_single_machine_mode_for_loopback_only_and_the_users_setting_wins():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    assert _environment_after("127.0.0.1:6379", clean) == {
        SWITCH: "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "cluster_mode": None,
    }
    assert _environment_after("10.0.0.5:6379", clean)[SWITCH] is None
    assert _environment_after("127.0.0.1:6379", {**clean, SWITCH: "1"})[SWITCH] == "1"


def test_ray_imported_before_is_told_too():
    pytest.importorskip("ray")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    assert _environment_after("127.0.0.1:6379", clean, import_ray_first=True)["cluster_mode"] is False
    assert _environment_after("10.0.0.5:6379", clean, import_ray_first=True)["cluster_mode"] is True
