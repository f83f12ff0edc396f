"""How a replica runs its model: the verified session (loaded and checked against the profile's
reference outputs before the replica takes traffic) and the one worker thread that runs it.

Runs go to one thread, so the event loop stays free to read the next request and collect the next
batch; models with a batch dim stack requests of the same non-batch shapes (``batcher``: the
requests that wait while a run is busy share the next one), and a request that fails a shared run
is run again alone, so its failure stays its own. A request carries its ``RequestContext``: one whose
deadline passes while it waits for the run thread (in the batcher or the thread's queue) is never run,
and its answer is a 504. ``infer`` answers a typed ``InferResult``. Plain code, no Ray.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortpilot.errors import InputError, OrtpilotError, OrtRunError
from ortpilot.serve.context import DeadlineExceeded, RequestContext, new_request_id
from ortpilot.serve.errorbody import OIP
from ortpilot.serve.http import internal_error
from ortpilot.serve.oip.batcher import Batcher, Expired
from ortpilot.serve.oip.config import ReplicaConfig
from ortpilot.serve.oip.metrics import BatchCounts
from ortpilot.serve.options import ModelSpec
from ortpilot.serve.ortmessage import clean_ort_message
from ortpilot.session.binding import run_session


def load_verified(spec: ModelSpec, threads: int, accept_machine: bool = False) -> tuple[Any, dict[str, Any]]:
    """(session, verification facts) for ``spec``; raises the verification's own error when it fails.

    A bundle's replica verifies the profile of its own node's class (the node's Ray CPUs in the class:
    ``fleet.nodes``), refused without one unless ``accept_machine``; ``why`` names the class it took."""
    if spec.kind == "profile":
        from ortpilot.tuning.verify import verify_profile

        target, node_cpus = spec.path, None
        if spec.bundle:
            from ortpilot.fleet.nodes import this_node_cpus

            target, node_cpus = spec.bundle, this_node_cpus()
        result = verify_profile(
            target, accept_machine=accept_machine, intra_op_threads=threads, optimized=True, node_cpus=node_cpus
        )
        failure = result.failure()
        if failure is not None:
            raise failure
        profile_threads = int((result.session.profile.get("session_settings") or {}).get("intra_op_threads") or 0)
        choice = result.bundle
        chosen = (
            f"class {choice.chosen.name} ({choice.note or choice.how}) of bundle {choice.bundle.parent.name}: "
            if choice
            else ""
        )
        return result.session, {
            "profile": True,
            "mode": result.mode,
            "why": chosen + result.why,
            "profile_threads": profile_threads,
            "optimized_model": result.session.settings.level == "disable"
            and bool(result.session.profile.get("optimized_model")),
        }
    from ortpilot.session import SessionSettings, load

    session = load(spec.path, ["cpu"], "strict", settings=SessionSettings(intra_op_threads=threads))
    return session, {
        "profile": False,
        "mode": "not checked",
        "profile_threads": 0,
        "optimized_model": False,
        "why": "a plain model has no reference outputs: the strict CPU session was verified",
    }


def thread_note(threads: int, profile_threads: int, *, profile: bool = True) -> str:
    """What a replica says when its threads differ from the profile's (its latency may then differ), and how to
    keep the tuned count: a replica's threads are its Ray CPUs. A plain model (``profile`` False) was never
    tuned: nothing to say."""
    if threads == profile_threads or not profile:
        return ""
    if not profile_threads:  # a kept default: ORT chose its threads (and pinned them) where it was tuned
        return (
            f"intra-op threads {threads} (the replica's CPUs), the profile was tuned with ORT's default pool (0: ORT "
            "chooses as many threads as the machine has CPUs and pins them): a replica shares its node's CPUs, so it "
            "runs its own count, and the profile's latency figures may not hold"
        )
    fewer = ", with fewer replicas where the CPUs do not suffice" if profile_threads > threads else ""
    return (
        f"intra-op threads {threads} (the replica's CPUs), the profile was tuned with {profile_threads}: "
        f"its latency figures may not hold; to keep the tuned count, serve with --cpus-per-replica "
        f"{profile_threads} (Python: ServeOptions(cpus_per_replica={profile_threads})){fewer}"
    )


@dataclass(frozen=True)
class InferResult:
    """What ``ModelRunner.infer`` answers: the outputs asked for, or the status and message that refuse
    the request (400 bad input, 500 a server-side failure with a request id, 504 its deadline passed)."""

    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    status: int = 200
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @classmethod
    def refused(cls, status: int, error: str) -> InferResult:
        return cls({}, status, error)


class ModelRunner:
    """A verified session behind one run thread (and a batcher when the model stacks requests)."""

    def __init__(self, name: str, session: Any, config: ReplicaConfig) -> None:
        self.name = name
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]
        self.limits = config.limits
        self.batching = config.batching
        self.counts = BatchCounts()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortpilot-run")
        self.iobinding = bool((getattr(session, "profile", None) or {}).get("iobinding"))
        self.batcher = (
            Batcher(self._run_group, self.executor, config.max_batch, config.batch_wait_ms / 1000.0)
            if self.batching
            else None
        )

    async def infer(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        context: RequestContext | None = None,
    ) -> InferResult:
        """Check the feeds as the library does (400 on failure), run them before ``context``'s deadline
        (504 past it; not run at all when it passed while the request waited), return the outputs."""
        context = context or RequestContext(new_request_id(), OIP, None, model=self.name)  # no deadline
        try:
            checked = self.session.check_feeds(feeds)
            self.limits.check(checked)  # positions and table rows the graph tells: 400 before ORT runs
            wanted = self._wanted(outputs)
            if self.batcher is not None:
                values = await context.within(self.batcher.submit(checked, context.deadline))
            else:
                loop = asyncio.get_running_loop()
                values = await context.within(
                    loop.run_in_executor(self.executor, self._run_before, checked, context.deadline)
                )
        except (InputError, OrtRunError) as exc:  # OrtRunError: valid dtypes and ranks the model cannot run
            return InferResult.refused(400, clean_ort_message(str(exc)))
        except (DeadlineExceeded, Expired):  # Expired: the run thread saw the deadline pass before it ran
            return InferResult.refused(504, context.expired_message())
        except OrtpilotError as exc:
            return InferResult.refused(500, internal_error(f"infer {self.name}", exc, context.request_id))
        return InferResult({n: values[n] for n in wanted})

    def _wanted(self, outputs: Sequence[str] | None) -> list[str]:
        if outputs is None:
            return list(self.output_names)
        unknown = [n for n in outputs if n not in self.output_names]
        if unknown:
            raise InputError(
                f"Unknown output name(s) {', '.join(map(repr, unknown))}. The model's outputs are: "
                f"{', '.join(self.output_names)}."
            )
        return list(outputs)

    def _run_one(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.counts.observe(1)
        return self._run(feeds)

    def _run_before(self, feeds: Mapping[str, np.ndarray], deadline: float | None) -> dict[str, np.ndarray]:
        """``_run_one`` on the run thread, unless ``deadline`` passed while the request waited for it."""
        if deadline is not None and time.time() >= deadline:
            raise Expired()
        return self._run_one(feeds)

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The path the profile was timed and verified on (IOBinding or not): ``session.binding``."""
        return run_session(self.session, feeds, iobinding=self.iobinding, output_names=self.output_names)

    def _run_group(self, group: list[dict[str, np.ndarray]]) -> list[Any]:
        if len(group) > 1:
            rows = [next(iter(feeds.values())).shape[0] for feeds in group]
            stacked = {name: np.concatenate([feeds[name] for feeds in group]) for name in group[0]}
            try:
                self.counts.observe(len(group))
                merged = self._run(stacked)
                total = sum(rows)
                if all(v.ndim and v.shape[0] == total for v in merged.values()):
                    cuts = np.cumsum(rows)[:-1]
                    parts = {name: np.split(value, cuts) for name, value in merged.items()}
                    return [{name: parts[name][i] for name in merged} for i in range(len(group))]
            except OrtpilotError:
                pass  # one bad request must not fail its batch: run them one by one below
        out: list[Any] = []
        for feeds in group:
            try:
                out.append(self._run_one(feeds))
            except OrtpilotError as exc:  # this request's failure is this request's alone
                out.append(exc)
        return out


__all__ = ["InferResult", "ModelRunner", "load_verified", "thread_note"]
