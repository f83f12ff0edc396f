"""``ortpilot serve --address`` on a real two-node Ray cluster started on this machine (Ray's own
``cluster_utils.Cluster``: a head with two CPUs and a second node with one, each its own raylet), with one
replica of one CPU on each node, on the cluster the fleet's two-node tests use (``two_nodes``,
tests/serve/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")

from serve_procs import Server, free_port

import ortpilot
from ortpilot.graph.feeds import make_feeds

# A full-run variant (-m "raycluster and slow"): the fleet's two-node test (tests/serve/test_fleet_two_nodes.py)
# serves a bundle the same way in .ci/run's Ray step (two replicas of one CPU, one on each node, each verified on
# its own node, answers compared with load_profile's); this one serves a plain profile.
pytestmark = [pytest.mark.raycluster, pytest.mark.slow]


def test_two_replicas_land_on_both_nodes_and_answer_like_load_profile(two_nodes, encoder_profile, tmp_path):
    """A written CPU profile of the demo encoder (no tune)."""
    server = Server(
        [
            str(encoder_profile),
            "--name",
            "m",
            "--address",
            two_nodes["cluster"].address,
            "--replicas",
            "2",
            "--cpus-per-replica",
            "1",
            "--debug-info",
        ],
        free_port(),
        tmp_path / "serve.err",
    )
    try:
        assert server.ready and server.ready[0].startswith("m: 2 replicas ready"), server.stderr[-3000:]
        client = th.InferenceServerClient(server.url)
        replicas = client.get_model_metadata("m")["ortpilot"]["replicas"]
        assert len({r["node"] for r in replicas}) == 2
        assert all(r["verified"] and r["intra_op_threads"] == 1 for r in replicas)
        sess = ortpilot.load_profile(encoder_profile, intra_op_threads=1)
        for seed in range(4):
            feeds = make_feeds(sess.model, seed=seed)
            items = []
            for name, value in feeds.items():
                item = th.InferInput(name, list(value.shape), "INT64")
                item.set_data_from_numpy(value)
                items.append(item)
            got = client.infer("m", items).as_numpy(sess.get_outputs()[0].name)
            assert got.tobytes() == np.asarray(sess.run(None, feeds)[0]).tobytes()
    finally:
        assert server.stop() == 0, server.stderr[-3000:]
