"""What a model replica verified and runs with (``ReplicaInfo``): built by the replica once its gate
passed, carried in every heartbeat to the server-wide application, and listed by model metadata for
each live replica. A typed record, so what crosses Ray is read back by field, never by key; a client
sees ``public_dict`` of it unless the server runs with --debug-info (no paths, PIDs, hosts or nodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ortpilot.serve.oip.config import Batching

PRIVATE_INFO = ("node", "host", "pid")  # what a client sees only with --debug-info


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica: who it is, how it was verified, where its model's nodes run, its threads and load time."""

    replica: str
    model: str
    verified: bool = False
    verification: str = ""  # the verification mode ("not checked" for a plain model)
    why: str = ""
    providers: tuple[str, ...] = ()
    placement_share: Mapping[str, float] = field(default_factory=dict)  # provider -> share of the model's nodes
    intra_op_threads: int = 0
    cpus: float = 0.0
    profile_intra_op_threads: int = 0
    threads_note: str = ""
    batching: Batching | None = None
    node: str = ""
    host: str = ""
    pid: int = 0
    load_s: float = 0.0
    session_create_s: float = 0.0
    optimized_model: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", tuple(self.providers))
        if isinstance(self.batching, Mapping):
            object.__setattr__(self, "batching", Batching.from_dict(self.batching))

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "providers": list(self.providers),
            "placement_share": dict(self.placement_share),
            "batching": self.batching.to_dict() if self.batching else None,
        }

    def public_dict(self) -> dict[str, Any]:
        """``to_dict`` without what only --debug-info shows."""
        return {k: v for k, v in self.to_dict().items() if k not in PRIVATE_INFO}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ReplicaInfo:
        return cls(**dict(doc))


__all__ = ["PRIVATE_INFO", "ReplicaInfo"]
