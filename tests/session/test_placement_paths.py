"""Placement through ORT's assignment API and through the profiler agree on real sessions."""

from __future__ import annotations

import pytest

import ortpilot
from ortpilot.graph.feeds import make_feeds
from ortpilot.session.options import SessionSettings
from ortpilot.session.placement import assignment_api_available, profile_placement


@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder"])
def test_profiler_and_assignment_api_agree(demo_paths, name):
    """Unoptimized, both paths see the same nodes; optimized, the assignment API records the graph at
    partitioning time and the profiler the final one (after FusedGemm etc.), so only shares agree."""
    if not assignment_api_available():
        pytest.skip("this ORT has no get_provider_graph_assignment_info")
    for level in ("disable", "all"):
        settings = SessionSettings(level=level)
        api = ortpilot.load(demo_paths[name], ["cpu"], policy="strict", settings=settings).placement
        assert api.source == "assignment_api"
        feeds = make_feeds(ortpilot.load(demo_paths[name]).model)
        prof = profile_placement(str(demo_paths[name]), ["CPUExecutionProvider"], settings.build(), feeds)
        assert prof.source == "profiler"
        assert prof.providers() == api.providers() == ["CPUExecutionProvider"]
        if level == "disable":
            assert prof.counts == api.counts
            assert {n.name for n in prof.nodes} == {n.name for n in api.nodes}


def test_placement_dict_lists_nodes_per_provider(demo_paths):
    sess = ortpilot.load(demo_paths["cnn"], ["cpu"], policy="strict")
    doc = sess.placement.to_dict()
    cpu = doc["providers"]["CPUExecutionProvider"]
    assert cpu["nodes"] == doc["total_nodes"] == len(cpu["node_list"])
    assert cpu["share"] == 1.0
    assert {"name", "op_type"} <= set(cpu["node_list"][0])


def test_optimization_level_changes_placed_node_count(demo_paths):
    # Conv+BatchNorm fusion at basic level removes nodes: placement reflects the optimized graph.
    raw = ortpilot.load(demo_paths["cnn"], ["cpu"], settings=SessionSettings(level="disable"))
    opt = ortpilot.load(demo_paths["cnn"], ["cpu"], settings=SessionSettings(level="basic"))
    assert opt.placement.total < raw.placement.total
