"""What only a replica knows (what it verified, its request and batch counts) goes to the server-wide
application, which sums every replica for ``/metrics`` and lists the live ones in model metadata: a
heartbeat from Ray's health check, and after requests at most every ``REPORT_S``. A replica served
without a server-wide application (``deployment()`` alone) reports nothing.
"""

from __future__ import annotations

import time
from typing import Any

from ortpilot.serve.counts import REPORT_S, RequestCounts
from ortpilot.serve.oip.metrics import BatchCounts, Heartbeat, TextCounts, TextSnapshot
from ortpilot.serve.oip.replicainfo import ReplicaInfo


class Reporter:
    """One replica's line to the server-wide application (its Serve handle, found lazily)."""

    def __init__(self, model: str, replica: str, server_app: str | None) -> None:
        self.model, self.replica, self.server_app = model, replica, server_app
        self._server: Any = None
        self._reported = 0.0

    def handle(self) -> Any:
        """The server-wide deployment's handle, or None (not served with one, or not up yet)."""
        if not self.server_app:
            return None
        if self._server is None:
            try:
                from ray import serve

                from ortpilot.serve.oip.server import SERVER_DEPLOYMENT

                self._server = serve.get_deployment_handle(SERVER_DEPLOYMENT, app_name=self.server_app)
            except Exception:  # the server-wide application may not be up yet; the next report tries again
                return None
        return self._server

    def report(
        self,
        info: ReplicaInfo,
        batches: BatchCounts,
        requests: RequestCounts,
        text: TextCounts | None = None,
        *,
        soon: bool = False,
    ) -> None:
        """Send the replica's state now (``soon``: only if the last report is ``REPORT_S`` old); ``text``: a text
        model's batching counts."""
        if soon and time.monotonic() - self._reported < REPORT_S:
            return
        server = self.handle()
        if server is None:
            return
        self._reported = time.monotonic()
        try:
            snapshot = text.snapshot() if text is not None else TextSnapshot()
            beat = Heartbeat(self.model, self.replica, info, batches.snapshot(), requests.snapshot(), snapshot)
            server.report.remote(beat)
        except Exception:
            self._server = None

    async def replica_infos(self) -> list[ReplicaInfo] | None:
        """Every live replica's info as the server-wide application holds it (None when it cannot say)."""
        server = self.handle()
        if server is None:
            return None
        try:
            return await server.replica_infos.remote(self.model)
        except Exception:
            return None


__all__ = ["Reporter"]
