"""``ortpilot serve --address`` on a real two-node Ray cluster started on this machine (Ray's own
``cluster_utils.Cluster``: a head and a second node, each its own raylet with one CPU), with one
replica on each node. Marked ``raycluster``: ``.ci/run`` runs it as its own step."""

from __future__ import annotations

import os

import numpy as np
import pytest

th = pytest.importorskip("tritonclient.http")

from serve_procs import RAY_ENV, Server, free_port

import ortpilot
from ortpilot.graph.feeds import make_feeds

pytestmark = pytest.mark.raycluster


@pytest.fixture
def two_nodes():
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
    )
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def test_two_replicas_land_on_both_nodes_and_answer_like_load_profile(two_nodes, encoder_profile, tmp_path):
    """A written CPU profile of the demo encoder (no tune: this step of .ci/run runs alone, after the main run)."""
    server = Server(
        [
            str(encoder_profile),
            "--name",
            "m",
            "--address",
            two_nodes.address,
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
