"""One model replica: a verified session that reports ready only after it reproduced its profile.

The constructor is the gate: it loads the profile strictly with intra-op threads set to the
replica's CPUs (Ray sets ``OMP_NUM_THREADS``, which ORT ignores), reproduces the reference
outputs (``tune.verify.verify_profile``) and raises when they differ, so Ray never routes a
request to a replica that did not verify; a restarted replica goes through the same gate. Runs
go to one worker thread (the event loop stays free to collect the next batch); models with a
batch dim stack requests of the same non-batch shapes with ``serve.batch``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ortpilot.errors import InputError, OrtpilotError
from ortpilot.serve.metrics import BatchCounts
from ortpilot.serve.options import ModelSpec, ort_threads


def load_verified(spec: ModelSpec, threads: int, accept_machine: bool = False) -> tuple[Any, dict[str, Any]]:
    """(session, verification facts) for ``spec``; raises the verification's own error when it fails."""
    if spec.kind == "profile":
        from ortpilot.tuning.verify import verify_profile

        result = verify_profile(spec.path, accept_machine=accept_machine, intra_op_threads=threads, optimized=True)
        failure = result.failure()
        if failure is not None:
            raise failure
        profile_threads = int((result.session.profile.get("session_settings") or {}).get("intra_op_threads") or 0)
        return result.session, {
            "mode": result.mode,
            "why": result.why,
            "profile_threads": profile_threads,
            "optimized_model": result.session.settings.level == "disable"
            and bool(result.session.profile.get("optimized_model")),
        }
    from ortpilot.session import SessionSettings, load

    session = load(spec.path, ["cpu"], "strict", settings=SessionSettings(intra_op_threads=threads))
    return session, {
        "mode": "not checked",
        "profile_threads": 0,
        "optimized_model": False,
        "why": "a plain model has no reference outputs: the strict CPU session was verified",
    }


def thread_note(threads: int, profile_threads: int) -> str:
    """What a replica says when its threads differ from the profile's (its latency may then differ)."""
    if not profile_threads or threads == profile_threads:
        return ""
    return (
        f"intra-op threads {threads} (the replica's CPUs), the profile was tuned with {profile_threads}: "
        "its latency figures may not hold"
    )


def signature(feeds: Mapping[str, np.ndarray]) -> tuple:
    """Requests that may share a batch: the same inputs with the same non-batch dims and dtypes."""
    return tuple((name, value.shape[1:], value.dtype.str) for name, value in sorted(feeds.items()))


class ModelReplica:
    """The model deployment's class (Ray Serve wraps it; nothing here needs Ray but the batcher)."""

    def __init__(self, spec: Mapping[str, Any], replica: Mapping[str, Any]) -> None:
        started = time.perf_counter()
        self.spec = ModelSpec(**spec)
        self.cpus = float(replica["cpus"])
        self.threads = ort_threads(self.cpus)
        self.session, verification = load_verified(self.spec, self.threads, bool(replica.get("accept_machine")))
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.batching = bool(replica.get("batch_dim")) and int(replica.get("max_batch", 1)) > 1
        self.counts = BatchCounts()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortpilot-run")
        self.iobinding = bool((getattr(self.session, "profile", None) or {}).get("iobinding"))
        self.replica_id = _replica_id()
        placement = self.session.placement
        self.info: dict[str, Any] = {
            "replica": self.replica_id,
            "model": self.spec.name,
            "verified": True,
            "verification": verification["mode"],
            "why": verification["why"],
            "providers": self.session.providers,
            "placement_share": ({p: round(placement.share(p), 6) for p in placement.counts} if placement else {}),
            "intra_op_threads": self.threads,
            "cpus": self.cpus,
            "profile_intra_op_threads": verification["profile_threads"],
            "threads_note": thread_note(self.threads, verification["profile_threads"]),
            "batching": (
                {"max_batch": int(replica["max_batch"]), "wait_ms": float(replica["batch_wait_ms"])}
                if self.batching
                else None
            ),
            "node": _node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "load_s": round(time.perf_counter() - started, 3),
            "session_create_s": round(getattr(self.session, "create_s", 0.0), 4),
            "optimized_model": verification["optimized_model"],
        }
        self._ingress = None
        self._ingress_name = replica.get("ingress")
        if self.batching:
            from ray import serve

            self._batched = serve.batch(
                max_batch_size=int(replica["max_batch"]), batch_wait_timeout_s=float(replica["batch_wait_ms"]) / 1000.0
            )(self._run_batch)

    # -- requests -----------------------------------------------------------------------------------
    async def infer(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, Any]:
        """Check the feeds as the library does (400 on failure), run them, return outputs and the report."""
        try:
            checked = self.session.check_feeds(feeds)
            wanted = self._wanted(outputs)
            if self.batching:
                values = await self._batched(checked)
                if isinstance(values, Exception):
                    raise values
            else:
                values = await asyncio.get_running_loop().run_in_executor(self.executor, self._run_one, checked)
        except InputError as exc:
            return {"error": str(exc), "code": 400, "report": self._report()}
        except OrtpilotError as exc:
            return {"error": str(exc), "code": 500, "report": self._report()}
        return {"outputs": {n: values[n] for n in wanted}, "report": self._report()}

    def describe(self) -> dict[str, Any]:
        return dict(self.info)

    def check_health(self) -> None:
        """Ray's health check, every few seconds: also the heartbeat that tells the ingress this replica
        is alive and verified (it only exists once the constructor's verification passed)."""
        self._heartbeat()

    # -- running ------------------------------------------------------------------------------------
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

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.iobinding:
            return dict(zip(self.output_names, self.session.run(None, feeds)))
        binding = self.session.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in self.output_names:
            binding.bind_output(name)
        self.session.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu()))

    async def _run_batch(self, requests: list[dict[str, np.ndarray]]) -> list[Any]:
        """``serve.batch``'s handler: stack requests of one signature, run once, split rows back."""
        loop = asyncio.get_running_loop()
        results: list[Any] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, feeds in enumerate(requests):
            groups.setdefault(signature(feeds), []).append(i)
        for members in groups.values():
            outcome = await loop.run_in_executor(self.executor, self._run_group, [requests[i] for i in members])
            for i, value in zip(members, outcome):
                results[i] = value
        return results

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
            except InputError as exc:
                out.append(exc)
        return out

    # -- reporting ----------------------------------------------------------------------------------
    def _report(self) -> dict[str, Any]:
        return {"replica": self.replica_id, "batches": self.counts.snapshot()}

    def _heartbeat(self) -> None:
        if not self._ingress_name:
            return
        try:
            if self._ingress is None:
                from ray import serve

                context = serve.get_replica_context()
                self._ingress = serve.get_deployment_handle(self._ingress_name, app_name=context.app_name)
            self._ingress.report.remote(self.spec.name, self.replica_id, self.info, self.counts.snapshot())
        except Exception:  # the ingress may not be up yet; the next heartbeat tries again
            self._ingress = None


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return f"pid-{os.getpid()}"


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""


__all__ = ["ModelReplica", "load_verified", "signature", "thread_note"]
