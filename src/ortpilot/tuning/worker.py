"""Run candidates in a child process, so a crash of ORT or of an EP costs one candidate, not the tune.

The parent starts ``python -m ortpilot.tuning.worker SCRATCH`` and talks JSON lines over pipes:
``prepare`` builds a candidate's model (through the cache), creates its session in strict mode
and saves its outputs on the held-out inputs; ``bench`` times prepared sessions, interleaved
round by round. A child killed by a signal is reported with the signal number and restarted.
The child keeps a few sessions alive (each wrapped in ``measure.bench.Runner``, the timing loop
``ortpilot bench`` uses), so later rounds need not recreate them; every reply names them (``held``),
and ``load`` recreates the ones a bench is about to time (a session only: its outputs were gated),
so the final measurement's plan is made with the time that is really left. ``rank`` computes the
dynamic-INT8 sensitivity of a model's layers (``passes.sensitivity``), also out of process.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortpilot.childproc import die_with_parent, spawn, stop
from ortpilot.measure import placement
from ortpilot.measure.interleave import settle
from ortpilot.tuning.budget import SETTLE_S

# Test hook: a worker asked to prepare a candidate whose label contains this text kills itself
# with SIGSEGV, the way a crashing EP would; ``hang:TEXT`` makes it sleep instead, like a candidate
# that takes ten minutes (never the baseline). Used by the crash-isolation and signal tests only.
CRASH_ENV = "ORTPILOT_TUNE_CRASH_ON"
MAX_LIVE_SESSIONS = 6
REPLAY_FILE = "replay.npz"  # the requests one timed run replays (data.workload.replay_set)
PROBE_FILE = "probe.npz"  # the workload's smallest and largest requests (data.workload.extremes): ORT's default
# runs each once when it is prepared, so a size the model cannot take is refused before the search


def batch_file(name: str) -> str:
    """The scratch file of replay set ``name`` (``b8``: the workload's requests in batches of 8)."""
    return f"replay-{name}.npz"


# --------------------------------------------------------------------------- child side


class _Child:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        cfg = json.loads((scratch / "worker.json").read_text())
        self.source = Path(cfg["model"])
        self.shapes = {k: tuple(v) for k, v in (cfg.get("shapes") or {}).items()}
        self.heldout = load_samples(scratch / "heldout.npz")
        self.calibration = load_samples(scratch / "calibration.npz")
        replay = scratch / REPLAY_FILE
        self.replay = load_samples(replay) if replay.is_file() else self.heldout[:1]
        self.probe = load_samples(scratch / PROBE_FILE)  # none where the file is absent (nothing varies)
        self.runners: OrderedDict[str, Any] = OrderedDict()  # candidate id -> measure.bench.Runner
        self.replays: dict[str, Any] = {}  # "id/replay" -> a Runner on that candidate's session
        self.structures: dict[str, str] = {}  # a built model's sha256 -> its structure's (graph.structure)
        (scratch / "outputs").mkdir(exist_ok=True)

    def prepare(self, data: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np

        from ortpilot.errors import ModelLoadError
        from ortpilot.graph.feeds import samples_to_arrays
        from ortpilot.measure.bench import Runner, rss_mb
        from ortpilot.session.binding import run_session
        from ortpilot.tuning.candidate import Candidate
        from ortpilot.tuning.reference import array_digest
        from ortpilot.tuning.transform import NothingToDo, build_model

        cand = Candidate.from_dict(dict(data))
        crash_on = os.environ.get(CRASH_ENV)
        if crash_on and crash_on.startswith("hang:"):
            if not cand.baseline and crash_on[5:] in cand.label:
                time.sleep(3600)
        elif crash_on and crash_on in cand.label:
            os.kill(os.getpid(), signal.SIGSEGV)
        start = time.perf_counter()
        try:
            path, records, hit = build_model(self.source, cand.passes, self.calibration)
        except NothingToDo as exc:
            return {"status": "skipped", "reason": str(exc)}
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        before_mb = rss_mb()
        try:
            sess = self._open(cand, path)
        except ModelLoadError as exc:
            if not cand.passes:
                raise  # the user's own model: its message says how to check it
            raise BuiltModelError(cand, exc) from None
        session_s = time.perf_counter() - start
        after_mb = rss_mb()
        outputs = [run_session(sess, feeds, iobinding=cand.iobinding) for feeds in self.heldout]
        if cand.baseline:
            for feeds in self.probe:
                try:
                    run_session(sess, feeds, iobinding=cand.iobinding)
                except Exception as exc:
                    raise WorkloadSizeError(feeds, exc) from None
        out_path = self.scratch / "outputs" / f"{cand.id}.npz"
        np.savez(out_path, **samples_to_arrays(outputs))
        # The timing loop is measure.bench's Runner, on this same session: later rounds reuse it.
        self._keep(cand.id, Runner(sess, name=cand.label, feeds=self.replay, iobinding=cand.iobinding))
        return {
            "status": "ok",
            "held": list(self.runners),
            "model_path": str(path),
            "model_sha256": sess.model_hash,
            "cache_hit": hit,
            "passes": records,
            "build_s": build_s,
            "session_s": session_s,
            "session_mb": None if before_mb is None or after_mb is None else round(after_mb - before_mb, 1),
            "providers": sess.providers,
            "placement": sess.placement.counts if sess.placement else None,
            "outputs": str(out_path),
            "output_names": list(outputs[0]),
            "output_sha256": {name: array_digest(value) for name, value in outputs[0].items()},
            **({"graph_sha256": self._structure(path, sess.model_hash)} if cand.passes else {}),
        }

    def _structure(self, path: Path, model_sha256: str) -> str:
        """The built model's structure hash (``graph.structure``), once per model: which variants differ in their
        values only (``Search._dominated``)."""
        import onnx

        from ortpilot.graph.structure import structure_sha256

        if model_sha256 not in self.structures:
            model = onnx.load(str(path), load_external_data=False)
            self.structures[model_sha256] = structure_sha256(model)
        return self.structures[model_sha256]

    def load(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The sessions of ``data["candidates"]`` alive, each created again if it was let go (its model from the
        cache, no outputs computed: it was gated when it was prepared)."""
        start = time.perf_counter()
        loaded = [c["id"] for c in data["candidates"] if self._session(c)]
        return {"status": "ok", "loaded": loaded, "seconds": time.perf_counter() - start, "held": list(self.runners)}

    def _session(self, data: Mapping[str, Any]) -> bool:
        """Make sure the candidate's session is alive; True when it had to be created again."""
        from ortpilot.measure.bench import Runner
        from ortpilot.tuning.candidate import Candidate
        from ortpilot.tuning.transform import build_model

        cid = data["id"]
        if cid in self.runners:
            self.runners.move_to_end(cid)
            return False
        cand = Candidate.from_dict(dict(data))
        path, _, _ = build_model(self.source, cand.passes, self.calibration)
        sess = self._open(cand, path)
        self._keep(cid, Runner(sess, name=cand.label, feeds=self.replay, iobinding=cand.iobinding))
        return True

    def _open(self, cand: Any, path: Path) -> Any:
        """``cand``'s verified session on its built model ``path``, strict: one per bucket of its shape plan."""
        from ortpilot.session import load

        providers = [(p["name"], p.get("options", {})) for p in cand.providers]
        if cand.shape_plan:  # a session per bucket, each request padded up to its bucket
            from ortpilot.session.shaped import load_shaped
            from ortpilot.session.shapeplan import ShapePlan

            plan = ShapePlan.from_dict(cand.shape_plan)
            return load_shaped(
                str(path),
                providers,
                "strict",
                plan,
                settings=cand.settings,
                shapes=self.shapes or None,
                beyond_at_load=False,  # the workload's requests all fit its largest bucket
            )
        return load(str(path), providers, "strict", settings=cand.settings, shapes=self.shapes or None)

    def bench(self, data: Mapping[str, Any]) -> dict[str, Any]:
        cands = list(data["candidates"])
        runs, warmup, rounds = int(data["runs"]), int(data.get("warmup", 2)), int(data.get("rounds", 1))
        replay = data.get("replay")  # another replay set (a batch size's: ``batch_file``), else the workload's
        runners = {}
        for c in cands:
            self._session(c)
        for c in cands:
            cid = c["id"]
            if cid not in self.runners:  # more candidates than sessions kept: not asked by tune
                raise RuntimeError(f"candidate {cid} could not be kept alive beside the others")
            runners[cid] = self.runners[cid]
            self.runners.move_to_end(cid)
            if replay:
                runners[cid] = self._replayed(cid, str(replay))
        first = {cid: len(r.samples) for cid, r in runners.items()}
        for runner in runners.values():
            runner.warm_up(warmup)
        cap = data.get("settle_max")  # a bench beside the anchor: at most this many untimed runs per turn
        runs_of = dict(data.get("runs_of") or {})  # a candidate timed with other runs than ``runs`` per turn
        settled: list[float] = []
        # This thread on the CPUs ORT's default session pinned no pool thread to (measure.placement): on a CPU
        # with one, the default ran 1.6x slower (the demo encoder) for as long as the OS left the caller there,
        # and every speedup over it read higher than a user whose thread sits elsewhere would see.
        away = placement.away_from_pinned()
        # ``within_s``: the rounds stop once another would end past it (after ``min_rounds``): a final whose sessions
        # run slower than the search timed them (measured: 14 ms against 2.7 ms) ends within its time, on fewer rounds
        within, least = data.get("within_s"), int(data.get("min_rounds") or rounds)
        start = time.monotonic()
        with placement.caller_on(away):
            for block in range(rounds):  # round-robin: a slow stretch of the machine hits every candidate
                began = time.monotonic()
                for cid, runner in runners.items():
                    if rounds > 1:  # untimed, while the pool of the session before spins down
                        settled.append(settle(runner.step_fn(), SETTLE_S, int(cap) if cap else None))
                    runner.measure(runs=int(runs_of.get(cid, runs)), round_id=block)
                now = time.monotonic()
                if within is not None and block + 1 >= least and now - start + (now - began) > float(within):
                    break
        return {
            "status": "ok",
            "held": list(self.runners),
            "rounds_s": time.monotonic() - start,  # the rounds' own wall time, settling included
            "samples_s": {cid: r.samples[first[cid] :] for cid, r in runners.items()},
            "blocks": {cid: r.rounds[first[cid] :] for cid, r in runners.items()},
            "caller_cpus": sorted(away) if away else None,
            "settled_s": min(settled) if settled else None,
        }

    def rank(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """Dynamic-INT8 sensitivity of each weighted node of the model ``passes`` build."""
        from ortpilot.passes.sensitivity import rank_dynamic
        from ortpilot.tuning.transform import build_model

        # The prepared model: the very graph (and node names) the quantize step will see; cached,
        # so the follow-up candidate's build starts from it.
        path, _, _ = build_model(self.source, [*data.get("passes", ()), {"pass": "prepare"}], self.calibration)
        ranking = rank_dynamic(
            path,
            self.calibration,
            op_types=list(data.get("op_types") or ()) or ("MatMul", "Attention"),
            per_channel=bool(data.get("per_channel", True)),
            reduce_range=bool(data.get("reduce_range", False)),
            weight_type=str(data.get("weight_type", "qint8")),
        )
        return {"status": "ok", "ranking": ranking}

    def _replayed(self, cid: str, name: str) -> Any:
        """A runner on candidate ``cid``'s session that replays ``name`` (kept beside its own runner)."""
        from ortpilot.measure.bench import Runner

        key = f"{cid}/{name}"
        if key not in self.replays:
            own = self.runners[cid]
            requests = load_samples(self.scratch / batch_file(name))
            self.replays[key] = Runner(own.vs, name=own.name, feeds=requests, iobinding=own.iobinding)
        return self.replays[key]

    def _keep(self, cid: str, runner: Any) -> None:
        self.runners[cid] = runner
        self.runners.move_to_end(cid)
        while len(self.runners) > MAX_LIVE_SESSIONS:
            gone, _ = self.runners.popitem(last=False)
            for key in [k for k in self.replays if k.startswith(f"{gone}/")]:
                del self.replays[key]


class WorkloadSizeError(RuntimeError):
    """One of the workload's extreme requests does not run on ORT's default session: a size the model cannot
    take (its position limit, a size fixed inside the graph), named with what ORT said."""

    def __init__(self, feeds: Mapping[str, Any], exc: Exception) -> None:
        import numpy as np

        shapes = ", ".join(f"{k} {list(np.shape(v))}" for k, v in feeds.items())
        said = " ".join(str(exc).split())[:400]
        super().__init__(
            f"the workload's request of shapes {shapes} (its smallest or largest) does not run on ORT's default "
            f"session ({said}): the model cannot take that size; leave such requests out of the workload, or cut "
            "them where your deployment cuts them"
        )


class BuiltModelError(RuntimeError):
    """A model one of ortpilot's passes wrote does not load: that pass's failure on this model, not the user's
    model's (which loaded as ORT's default session), so the message names the step, not the user's file."""

    def __init__(self, cand: Any, exc: Exception) -> None:
        said = str(exc).removeprefix("ORT could not load the model: ").split(". Check that the model is valid", 1)[0]
        said = " ".join(said.split())  # one line: the record keeps the first
        steps = " · ".join(step.label() for step in cand.passes)
        super().__init__(
            f"the model ortpilot's {steps} step{'s' * (len(cand.passes) > 1)} wrote from yours does not load in "
            f"ORT ({said.strip()[:400]}): a failure of that step on this model, not a defect of your model, which "
            "loads as it is; this candidate is left out"
        )


def _outputs(sess: Any, feeds: Mapping[str, Any], iobinding: bool) -> list[Any]:
    """The candidate's outputs on one sample, through the same path it is timed with (as a list,
    for ``tuning.outputs``; new code calls ``session.binding.run_session``)."""
    from ortpilot.session.binding import run_session

    return list(run_session(sess, feeds, iobinding=iobinding).values())


def load_samples(path: Path) -> list[dict[str, Any]]:
    """Samples saved as ``{i}/{input}`` arrays in one npz (``graph.feeds.read_samples``)."""
    from ortpilot.graph.feeds import read_samples

    return read_samples(path)


def save_samples(path: Path, samples: list[Mapping[str, Any]]) -> None:
    import numpy as np

    from ortpilot.artifacts.atomic import atomic_open
    from ortpilot.graph.feeds import samples_to_arrays

    with atomic_open(path, "wb") as fh:
        np.savez(fh, **samples_to_arrays(samples))


def main(argv: list[str]) -> int:
    die_with_parent()  # a tune killed outright must not leave a worker finishing a 10-minute candidate
    resp = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes to the log, never into the protocol
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides about Ctrl-C
    child = _Child(Path(argv[0]))
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "exit":
            break
        try:
            result = getattr(child, op)(msg["data"])
        except Exception as exc:  # a candidate that fails cleanly is a recorded failure
            from ortpilot.artifacts.oserrors import is_environmental, storage_error
            from ortpilot.errors import OrtpilotError

            if is_environmental(exc):  # a raw OSError (numpy's writes): the message names path, errno and fix
                exc = storage_error(exc, getattr(exc, "filename", None) or child.scratch)

            kind = type(exc).__name__
            result = {
                "status": "failed",
                "error": f"{kind}: {str(exc).strip().splitlines()[0] if str(exc).strip() else kind}",
                "verification": isinstance(exc, OrtpilotError),
                "errno": _environmental_errno(exc),
            }
        resp.write(json.dumps(result) + "\n")
    return 0


def _environmental_errno(exc: BaseException) -> int | None:
    """The errno of a full disk, a read-only or unwritable folder (the tune stops on it), else None."""
    from ortpilot.artifacts.oserrors import ENVIRONMENTAL

    number = getattr(exc, "errno", None)
    return number if isinstance(number, int) and number in ENVIRONMENTAL else None


# --------------------------------------------------------------------------- parent side


class WorkerCrash(Exception):
    """The child died (signal or exit) or timed out while handling one request."""

    def __init__(self, signal_number: int | None, returncode: int | None, timed_out: bool, log_tail: str) -> None:
        self.signal_number = signal_number
        self.returncode = returncode
        self.timed_out = timed_out
        self.log_tail = log_tail
        if timed_out:
            what = "timed out"
        elif signal_number:
            what = f"killed by signal {signal_number} ({_signame(signal_number)})"
        else:
            what = f"exited with code {returncode}"
        super().__init__(f"candidate process {what}")


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "unknown"


class WorkerClient:
    """The parent's handle on one child; ``request`` restarts it after a crash."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.proc: subprocess.Popen | None = None
        self.log_path = scratch / "worker.log"
        self.busy = False  # a request is in flight: close() then kills instead of asking

    def _start(self) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            # spawn records the child in self.proc before an interrupt that came meanwhile is raised
            return spawn(
                [sys.executable, "-m", "ortpilot.tuning.worker", str(self.scratch)],
                lambda proc: setattr(self, "proc", proc),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )

    def request(self, op: str, data: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        self.busy = True
        result = self._request(op, data, timeout_s)  # an interrupt leaves busy set: close() kills the worker
        self.busy = False
        return result

    def _request(self, op: str, data: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        proc = self.proc if self.proc and self.proc.poll() is None else self._start()
        try:
            proc.stdin.write((json.dumps({"op": op, "data": data}) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        line, eof = self._read_line(proc, timeout_s)
        if line is None:
            timed_out = not eof
            if timed_out:
                stop(proc)
            try:
                proc.wait(timeout=10)  # a closed pipe comes a moment before the exit status
            except subprocess.TimeoutExpired:
                stop(proc)
            self.proc = None
            rc = proc.returncode
            raise WorkerCrash(-rc if rc and rc < 0 and not timed_out else None, rc, timed_out, self._tail())
        return json.loads(line)

    def _read_line(self, proc: subprocess.Popen, timeout_s: float) -> tuple[str | None, bool]:
        """(the reply line, False), or (None, True) when the child closed the pipe (died), or
        (None, False) when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        fd = proc.stdout.fileno()
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, False
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None, True
            buf += chunk
            if buf.endswith(b"\n"):
                return buf.decode(), False

    def _tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Ask an idle worker to exit; one still busy (the tune was interrupted) is killed at once."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if self.busy:
            stop(proc)
            return
        try:
            proc.stdin.write(b'{"op": "exit"}\n')
            proc.stdin.close()
            proc.wait(timeout=5)
        except Exception:  # a broken pipe, or no exit within 5 s
            stop(proc)
        except BaseException:
            stop(proc)
            raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
