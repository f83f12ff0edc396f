"""Fleet tune target (docs/concepts/fleets.md): the local two-node cluster against two local tunes.

``local``: starts a real Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head with all of
this machine's CPUs and a worker node with one, two machine classes), then, ``--repeat`` times in
turn, (a) two local tunes of MODEL with ``--budget`` each, one with this process's CPUs and one in a
process pinned to one CPU (the two classes), one after the other, and (b) ``ortpilot tune MODEL --ray
ADDRESS`` with the same budget (its classes are tuned one after the other: one host). Each is the real
command, timed from start to exit; the fleet tune's bundle is verified for both classes. Target:
fleet wall <= 1.2 x the two local tunes' sum. Odd repeats run the fleet tune before the two local
ones; each run also splits the fleet tune's wall into the searches' own and the fixed costs around them.

The other fleet target, the scheduler's plan for 5 models x 3 classes on 6 nodes of 3 hosts against
the lower bound, is a test that prints its plan: ``pytest -q -s tests/fleet/test_schedule.py -k catalogue``.

    .venv/bin/python benchmarks/bench_fleet.py local [--model demo:encoder] [--shape SPEC] [--budget 60] [--repeat 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _prep import write_json

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}  # the CLI turns on single-machine mode itself
CLI = [sys.executable, "-m", "ortpilot.cli.main"]


def _one_cpu() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _timed(args: list[str], *, one_cpu: bool = False) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **RAY_ENV},
        preexec_fn=_one_cpu if one_cpu else None,
        timeout=3600,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return wall, done


def fixed_costs(doc: dict, fleet_s: float) -> dict[str, float]:
    """Where a fleet tune's time went, from its ``--json`` (times since the driver started): the searches'
    own wall, before the first search (imports, the model checks, joining Ray, the nodes' reports),
    around the searches (a search's span on its node beyond its own wall: its process's start, the model
    and profile through the object store; and the gaps between searches), after the last (bundle, exit)."""
    classes = [c for m in doc["models"] for c in m["classes"] if c["done"]]
    searches = sum(c["wall_s"] for c in classes)
    first, last = min(c["start_s"] for c in classes), max(c["end_s"] for c in classes)
    return {
        "searches_s": searches,
        "before_s": first + (fleet_s - doc["wall_s"]),  # the driver's start is after the CLI's imports
        "around_s": (last - first) - searches,
        "after_s": doc["wall_s"] - last,
    }


def local(args: argparse.Namespace) -> dict:
    from ray.cluster_utils import Cluster

    from ortpilot.providers.machineclass import this_class

    os.environ.update(RAY_ENV)
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        sys.exit("two classes need two CPUs (a tune pinned to one of them)")
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": cpus, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
    )
    runs = []
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        budget = str(args.budget)
        shape = ["--shape", args.shape] if args.shape else []
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
                fleet_args = [
                    "tune",
                    args.model,
                    *shape,
                    "--ray",
                    cluster.address,
                    "-o",
                    f"{tmp}/b",
                    "--budget",
                    budget,
                ]
                if i % 2:  # odd repeats run the fleet tune first: neither side always follows the other
                    fleet, done = _timed([*fleet_args, "--json"])
                here, _ = _timed(["tune", args.model, *shape, "-o", f"{tmp}/here", "--budget", budget])
                one, _ = _timed(["tune", args.model, *shape, "-o", f"{tmp}/one", "--budget", budget], one_cpu=True)
                if not i % 2:
                    fleet, done = _timed([*fleet_args, "--json"])
                doc = json.loads(done.stdout)
                for one_cpu in (False, True):
                    _timed(["verify", f"{tmp}/b"], one_cpu=one_cpu)
            run = {
                "local_here_s": here,
                "local_one_cpu_s": one,
                "local_sum_s": here + one,
                "fleet_s": fleet,
                "ratio": fleet / (here + one),
                "fleet_first": bool(i % 2),
                "tuned": doc["tuned"],
                "classes": {c["class"]: c["speedup"] for c in doc["models"][0]["classes"]},
                "fixed_s": fixed_costs(doc, fleet),
            }
            runs.append(run)
            cost = run["fixed_s"]
            print(
                f"run {i + 1}: local {here:.1f} s + {one:.1f} s (1 CPU) = {here + one:.1f} s; fleet tune {fleet:.1f} s "
                f"({run['ratio']:.2f}x, target <= 1.20x; {doc['tuned']}{'; fleet first' if i % 2 else ''}); "
                f"searches {cost['searches_s']:.1f} s, before the first {cost['before_s']:.1f} s, around each search "
                f"{cost['around_s']:.1f} s, after the last {cost['after_s']:.1f} s",
                flush=True,
            )
    finally:
        cluster.shutdown()
    print(
        f"\n| run | local ({this_class().name}) s | local ({this_class(1).name}) s | sum s | fleet tune s | fleet / sum |"
    )
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(runs, 1):
        print(
            f"| {i} | {r['local_here_s']:.1f} | {r['local_one_cpu_s']:.1f} | {r['local_sum_s']:.1f} | "
            f"{r['fleet_s']:.1f} | {r['ratio']:.2f}x |"
        )
    print(f"median fleet / sum {statistics.median([r['ratio'] for r in runs]):.2f}x")
    return {"model": args.model, "budget_s": args.budget, "load_avg": os.getloadavg()[0], "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("local", help="the two-node cluster on this machine vs two local tunes")
    run.add_argument("--model", default="demo:encoder")
    run.add_argument("--shape", default=None, help="tune's --shape, for a model with symbolic dims")
    run.add_argument("--budget", type=float, default=60.0)
    run.add_argument("--repeat", type=int, default=2)
    run.add_argument("--json", default=None)
    args = parser.parse_args()
    doc = local(args)
    write_json(args.json, {"script": "bench_fleet.py", "mode": args.mode, **doc, "when": time.strftime("%F %T")})


if __name__ == "__main__":
    main()
