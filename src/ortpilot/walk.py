"""Every graph and node of a model, subgraphs included: the one walker over If/Loop/Scan bodies.

ONNX nests graphs in node attributes (``g`` for one body, ``graphs`` for several). Whoever
checks, counts, quantizes, prunes or reads external data must see those bodies too; they all
walk them with these three functions.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """(attribute name, body) of each graph ``node`` holds."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.name, attr.g
        for sub in attr.graphs:
            yield attr.name, sub


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every body nested in it, at any depth (depth-first, ``graph`` first)."""
    yield graph
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from graphs(sub)


def nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the bodies nested in it, each node before its own bodies' nodes."""
    for node in graph.node:
        yield node
        for _, sub in subgraphs(node):
            yield from nodes(sub)


__all__ = ["graphs", "nodes", "subgraphs"]
