"""Where the CPU goes while ``ortpilot serve`` answers text clients: per-process CPU over a window of load.

Starts ``ortpilot serve PROFILE_DIR`` (one model, its default fast path), drives ``--clients`` closed-loop
clients sending one real sentence per request to ``/v1/embeddings`` (``bench_serve_text.py``'s client) for
``--seconds``, and in the middle of the load reads every process's CPU time from ``/proc`` twice: each
process's share of one CPU over that window, largest first (the model replica, the ingress replica,
HAProxy, Ray's processes, this script's client threads). ``--spy`` also records the model replica with
``py-spy`` (``/tmp/replica.txt``, raw stacks). ``--no-spin`` serves a copy of the profile whose session
turns off ORT's spin-waiting worker threads (``session.intra_op.allow_spinning`` 0).

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/profile_serve_text.py PROFILE_DIR SENTENCES
        [--clients 32] [--seconds 24] [--no-spin] [--spy]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import bench_serve_text as text

ROOT = Path(__file__).resolve().parent.parent


def cpu_ticks() -> dict[int, tuple[int, str]]:
    """pid -> (user + system clock ticks so far, its command line)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:90]
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (int(fields[11]) + int(fields[12]), cmd or stat.split("(")[1].split(")")[0])
    return out


def without_spinning(profile_dir: Path) -> Path:
    """A copy of the tune's folder whose profile turns off ORT's spin-waiting intra-op threads."""
    copy = Path(tempfile.mkdtemp(prefix="ortpilot-nospin-")) / "tuned"
    shutil.copytree(profile_dir, copy)
    doc = json.loads((copy / "profile.json").read_text())
    doc["session_settings"]["config_entries"] = {
        **doc["session_settings"].get("config_entries", {}),
        "session.intra_op.allow_spinning": "0",
    }
    (copy / "profile.json").write_text(json.dumps(doc, indent=1))
    return copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("sentences", type=Path)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=24)
    ap.add_argument("--no-spin", action="store_true")
    ap.add_argument("--spy", action="store_true")
    args = ap.parse_args()
    served = without_spinning(args.profile) if args.no_spin else args.profile
    sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    port = text.free_port()
    cmd = [sys.executable, "-m", "ortpilot.cli.main", "serve", str(served), "--name", "minilm", "--port", str(port)]
    target = text.Target("ortpilot", cmd, port, "/v1/embeddings", "minilm", dict(os.environ))
    try:
        print(f"ready in {target.wait_ready():.1f} s", flush=True)
        result: dict[str, float] = {}
        load = threading.Thread(
            target=lambda: result.update(text.closed_loop(target, sentences, args.clients, args.seconds))
        )
        load.start()
        time.sleep(args.seconds / 4)
        before, started = cpu_ticks(), time.monotonic()
        spy = None
        replica = [pid for pid, (_, c) in before.items() if "ServeReplica:minilm" in c]
        if args.spy and replica:
            spy_cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(replica[0]), "-d", "10"]
            spy_cmd += ["-r", "50", "--nonblocking", "-f", "raw", "-o", "/tmp/replica.txt"]
            spy = subprocess.Popen(spy_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.seconds / 2)
        after, window = cpu_ticks(), time.monotonic() - started
        load.join()
        if spy is not None:
            spy.wait()
        tick = os.sysconf("SC_CLK_TCK")
        print(f"{args.clients} clients, spinning {'off' if args.no_spin else 'as tuned'}: {result}")
        shares = sorted(((after[p][0] - before[p][0]) / tick / window, after[p][1]) for p in after if p in before)
        for share, name in shares[::-1][:10]:
            print(f"{share * 100:6.1f} % of a CPU  {name.strip()}")
    finally:
        target.stop()


if __name__ == "__main__":
    main()
