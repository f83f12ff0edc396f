"""What a model replica is told across the Ray boundary (``ReplicaConfig``): its CPUs and batching, the
model's protocol metadata, facts (``ModelFacts``) and input limits the driver read from the graph, what
it does with text (``serve.textfacts.TextFacts``) and the text limits, and the request settings every
entry point shares. Built once by the application builder, read by the replica as typed fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortpilot.serve.oip.limits import InputLimits
from ortpilot.serve.options import TextOptions
from ortpilot.serve.records import RequestSettings
from ortpilot.serve.textfacts import TextFacts


@dataclass(frozen=True)
class TensorSpec:
    """One input or output in the model metadata: its name, the protocol's datatype, dims (-1: dynamic)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TensorSpec:
        return cls(str(doc["name"]), str(doc["datatype"]), tuple(int(d) for d in doc["shape"]))


def tensor_specs(docs: Sequence[Mapping[str, Any] | TensorSpec]) -> tuple[TensorSpec, ...]:
    return tuple(d if isinstance(d, TensorSpec) else TensorSpec.from_dict(d) for d in docs)


@dataclass(frozen=True)
class Batching:
    """Dynamic batching as model metadata states it: at most ``max_batch`` requests, ``wait_ms`` to fill."""

    max_batch: int
    wait_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"max_batch": self.max_batch, "wait_ms": self.wait_ms}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Batching:
        return cls(int(doc["max_batch"]), float(doc["wait_ms"]))


@dataclass(frozen=True)
class ModelFacts:
    """What model metadata says of the deployment (``ortpilot`` in ``GET /v2/models/NAME``), read by the
    driver before any replica is up; ``source`` and ``path`` only with --debug-info."""

    kind: str = "model"
    cpus_per_replica: float = 1.0
    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    batching: Batching | None = None
    source: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if self.autoscale is not None:
            object.__setattr__(self, "autoscale", tuple(int(n) for n in self.autoscale))
        if isinstance(self.batching, Mapping):
            object.__setattr__(self, "batching", Batching.from_dict(self.batching))

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "kind": self.kind,
            "cpus_per_replica": self.cpus_per_replica,
            "replicas": self.replicas,
            "autoscale": list(self.autoscale) if self.autoscale else None,
            "batching": self.batching.to_dict() if self.batching else None,
        }
        debug = {"source": self.source, "path": self.path} if self.source is not None or self.path is not None else {}
        return {**doc, **debug}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelFacts:
        return cls(**dict(doc))


@dataclass(frozen=True)
class ReplicaConfig:
    """One model replica's settings (``ModelReplica``'s second argument)."""

    cpus: float
    requests: RequestSettings = field(default_factory=RequestSettings)
    max_batch: int = 1
    batch_wait_ms: float = 0.0
    batch_dim: bool = False  # the model stacks requests on its first dim
    accept_machine: bool = False
    server_app: str | None = None  # the server-wide application replicas report to (None: standalone)
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    facts: ModelFacts = field(default_factory=ModelFacts)
    limits: InputLimits = field(default_factory=InputLimits)
    text: TextFacts = field(default_factory=TextFacts)  # what the model does with text (or what it lacks)
    text_options: TextOptions = field(default_factory=TextOptions)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tensor_specs(self.inputs))
        object.__setattr__(self, "outputs", tensor_specs(self.outputs))
        if isinstance(self.requests, Mapping):
            object.__setattr__(self, "requests", RequestSettings.from_dict(self.requests))
        if isinstance(self.facts, Mapping):
            object.__setattr__(self, "facts", ModelFacts.from_dict(self.facts))
        if isinstance(self.limits, Mapping):
            object.__setattr__(self, "limits", InputLimits.from_dict(self.limits))
        if isinstance(self.text, Mapping):
            object.__setattr__(self, "text", TextFacts.from_dict(self.text))
        if isinstance(self.text_options, Mapping):
            object.__setattr__(self, "text_options", TextOptions.from_dict(self.text_options))

    @property
    def batching(self) -> bool:
        return self.batch_dim and self.max_batch > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "requests": self.requests.to_dict(),
            "max_batch": self.max_batch,
            "batch_wait_ms": self.batch_wait_ms,
            "batch_dim": self.batch_dim,
            "accept_machine": self.accept_machine,
            "server_app": self.server_app,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "facts": self.facts.to_dict(),
            "limits": self.limits.to_dict(),
            "text": self.text.to_dict(),
            "text_options": self.text_options.to_dict(),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ReplicaConfig:
        return cls(**dict(doc))


__all__ = ["Batching", "ModelFacts", "ReplicaConfig", "TensorSpec", "tensor_specs"]
