"""A cluster in this process, for the fleet driver (``fleet.run.tune_cluster``): what ``fleet.cluster.Cluster``
asks, with no Ray.

Its nodes are records of this machine's classes with the CPUs each is given (``fleet.nodes.node_report``
computes each class as a node's report would, ``fleet.nodes.group_hosts`` groups them by host), so the
profile a search writes (its ``machine_class`` computed in the child pinned to the node's CPUs) is filed
under the class the driver tuned it for. Starting a search runs ``fleet.remote.search`` for real in a
thread: the local tune in a child process (``fleet.child``). What crosses goes through pickle, as it
would through Ray's object store.

``die(node, after=KIND, how=...)`` stops the next search on ``node`` (or on any node, for None) once it
has streamed a message of KIND: its generator is closed (which kills the child's process group) and the stream ends with the error
Ray would raise, named as Ray names it (the driver reads the type's name): ``NodeDiedError`` (the node is
then no longer alive) or ``WorkerCrashedError`` (the node stays).
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortpilot.fleet.cluster import Fleet, FleetNode
from ortpilot.fleet.nodes import RayNode, group_hosts, node_report
from ortpilot.fleet.remote import SearchJob, search
from ortpilot.providers.machineclass import check_class

WAIT_STEP_S = 0.02


class NodeDiedError(RuntimeError):
    """What Ray raises for a task whose node died."""


class WorkerCrashedError(RuntimeError):
    """What Ray raises for a task whose worker process died."""


_END = object()


@dataclass(frozen=True)
class Death:
    after: str  # the message kind after which the search stops
    how: str  # "node" or "worker"


@dataclass(eq=False)
class Stream:
    """One search on one node: its messages as they come, then an end or the error that ended it."""

    node: str
    job: SearchJob
    journal: bytes | None  # what the search was started from (a resume's journal)
    death: Death | None
    messages: queue.Queue = field(default_factory=queue.Queue)
    received: list[dict[str, Any]] = field(default_factory=list)  # what the driver took, in order
    cancelled: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class InProcessCluster:
    """``fleet.cluster.Cluster`` on fake nodes whose searches are real local tunes."""

    def __init__(self, nodes: Sequence[tuple[str, int]], address: str = "in-process") -> None:
        """``nodes``: ``(id, cpus)`` per node, all on this host (one IP, one booted kernel)."""
        self.address = address
        self.nodes = [RayNode(node_id, "127.0.0.1", "localhost", cpus) for node_id, cpus in nodes]
        self.dead: set[str] = set()
        self.streams: list[Stream] = []
        self.deaths: dict[str | None, Death] = {}  # node (None: any node) -> how its next search ends
        self.cancels = 0

    # -------------------------------------------------------------- the test's controls

    def die(self, node: str | None = None, *, after: str = "journal", how: str = "node") -> None:
        """Stop the next search on ``node`` after its first message of kind ``after`` (module docstring)."""
        self.deaths[node] = Death(after, how)

    def add(self, node_id: str, cpus: int) -> None:
        """A node that joins (seen by the next ``discover``)."""
        self.nodes.append(RayNode(node_id, "127.0.0.1", "localhost", cpus))

    def on(self, node: str) -> list[Stream]:
        return [s for s in self.streams if s.node == node]

    # -------------------------------------------------------------- fleet.cluster.Cluster

    @contextlib.contextmanager
    def connect(self) -> Iterator[None]:
        try:
            yield
        finally:  # every search has ended by now; wait for their threads to clean up their scratch
            for stream in self.streams:
                stream.cancelled.set()
                if stream.thread is not None:
                    stream.thread.join(timeout=120)

    def discover(self) -> Fleet:
        nodes = [n for n in self.nodes if n.id not in self.dead]
        reports = {n.id: node_report(n.cpus) for n in nodes}
        hosts = group_hosts(nodes, reports)
        usable = [
            FleetNode(n, check_class(reports[n.id]["class"], f"node {n.short}'s class"), hosts.of[n.id]) for n in nodes
        ]
        return Fleet(self.address, usable, hosts, [])

    def alive(self) -> set[str]:
        return {n.id for n in self.nodes if n.id not in self.dead}

    def put(self, value: Any) -> Any:
        return pickle.dumps(value)

    def start(self, node: FleetNode, job: SearchJob, model: Any, calibration: Any, journal: bytes | None) -> Stream:
        job = pickle.loads(pickle.dumps(job))
        death = self.deaths.pop(node.node.id, None) or self.deaths.pop(None, None)
        stream = Stream(node.node.id, job, journal, death)
        if node.node.id in self.dead:
            stream.messages.put(NodeDiedError(f"node {node.node.id} is dead"))
        else:
            args = (job, pickle.loads(model), pickle.loads(calibration), journal)
            stream.thread = threading.Thread(target=self._run, args=(stream, args), daemon=True)
            stream.thread.start()
        self.streams.append(stream)
        return stream

    def ready(self, streams: Sequence[Stream], timeout_s: float) -> list[Stream]:
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = [s for s in streams if not s.messages.empty()]
            if waiting or time.monotonic() >= deadline:
                return waiting[:1]
            time.sleep(WAIT_STEP_S)

    def receive(self, stream: Stream) -> dict[str, Any]:
        item = stream.messages.get(timeout=60)
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        stream.received.append(item)
        return item

    def cancel(self, stream: Stream) -> None:
        self.cancels += 1
        stream.cancelled.set()

    # -------------------------------------------------------------- a search's thread

    def _run(self, stream: Stream, args: tuple) -> None:
        gen = search(*args)
        try:
            for message in gen:
                stream.messages.put(pickle.loads(pickle.dumps(message)))
                death = stream.death
                if death is not None and message["kind"] == death.after:
                    gen.close()  # the child's process group is killed, its scratch folder removed
                    if death.how == "node":
                        self.dead.add(stream.node)
                        stream.messages.put(NodeDiedError(f"node {stream.node} died"))
                    else:
                        stream.messages.put(WorkerCrashedError(f"the worker on node {stream.node} died"))
                    return
                if stream.cancelled.is_set():
                    gen.close()
                    stream.messages.put(_END)
                    return
        except Exception as exc:  # what the task raised: Ray hands it to whoever reads the stream
            stream.messages.put(exc)
            return
        stream.messages.put(_END)


__all__ = ["InProcessCluster", "NodeDiedError", "Stream", "WorkerCrashedError"]
