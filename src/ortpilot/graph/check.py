"""Is a model's graph well formed? Dangling edges, cycles, malformed Einsum equations, onnx's checker.

ORT parses more than it checks, and onnx's checker reports a dangling edge and a cycle with
the same words ("not topologically sorted"), while ORT itself accepts nodes in any order.
``check_graph`` tells the cases apart and names the node and the edge, then runs
``onnx.checker.check_model`` on a topologically sorted copy for everything else. It also
refuses ``Einsum`` equations that break the ONNX grammar *before* any shape inference runs:
onnx 1.23's inference loops forever on ``......->`` (and so does ORT's session creation).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx

from ortpilot.errors import ModelLoadError
from ortpilot.walk import subgraphs

# One Einsum term: letters with at most one "..." (ONNX Einsum grammar, spaces removed first).
_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")
# Checker complaints about things ORT does not need (it loads such models): reported as warnings.
_HARMLESS = ("Field 'shape' of 'type' is required but missing",)
_MAX_LISTED = 5


@dataclass
class GraphCheck:
    """The outcome of a check that passed: what was checked and the warnings worth printing."""

    checker: bool = True  # onnx.checker ran
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"checker": self.checker, "warnings": list(self.warnings)}


def einsum_problem(equation: str, n_inputs: int) -> str | None:
    """Why an Einsum ``equation`` breaks the ONNX grammar for ``n_inputs`` operands (None: it does not)."""
    text = equation.replace(" ", "")
    if not text:
        return "the equation is empty"
    if text.count("->") > 1:
        return "it has more than one '->'"
    left, arrow, right = text.partition("->")
    terms = left.split(",")
    if len(terms) != n_inputs:
        return f"it names {len(terms)} operand(s) and the node has {n_inputs} input(s)"
    for term in terms + ([right] if arrow else []):
        if not _TERM.fullmatch(term):
            return (
                f"term '{term}' is not letters with at most one '...'"
                if term.count("...") <= 1
                else f"term '{term}' has more than one '...'"
            )
    if arrow:
        letters = set("".join(terms))
        out = right.replace("...", "")
        if len(set(out)) != len(out):
            return f"output term '{right}' repeats a letter"
        if set(out) - letters:
            return f"output letter(s) {''.join(sorted(set(out) - letters))} appear in no input"
    return None


def malformed_einsums(model: onnx.ModelProto) -> list[str]:
    """``node 'X' (equation '......->'): why`` for every malformed Einsum, subgraphs and functions included."""
    found = []
    for node in _all_nodes(model):
        if node.op_type != "Einsum" or node.domain not in ("", "ai.onnx"):
            continue
        equation = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "equation"), "")
        problem = einsum_problem(equation, len(node.input))
        if problem:
            found.append(f"node {_describe(node)} (equation '{equation}'): {problem}")
    return found


def refuse_malformed_einsums(model: onnx.ModelProto) -> None:
    """Raise ``ModelLoadError`` (exit 2) for an Einsum equation that would hang shape inference.

    ORT's session creation runs onnx's shape inference, which loops forever on some malformed
    equations (``......->``); a linear scan of the nodes first turns that hang into an error.
    """
    bad = malformed_einsums(model)
    if bad:
        raise ModelLoadError(
            f"The model has a malformed Einsum equation: {'; '.join(bad[:_MAX_LISTED])}. "
            "ONNX Einsum equations are comma-separated terms of letters, each with at most one "
            "'...', then optionally '->' and the output term; shape inference (and ORT) can loop "
            "forever on anything else. Fix the equation in the exporter or re-export the model."
        )


def check_graph(model: onnx.ModelProto, *, checker: bool = True) -> GraphCheck:
    """Raise ``ModelLoadError`` (exit 2) naming the node and edge when the graph cannot run.

    Checks, in order: malformed Einsum equations (before anything runs shape inference),
    values used but never produced (dangling edges), values produced twice, cycles, and then
    ``onnx.checker.check_model`` on a topologically sorted copy (ORT accepts any node order).
    """
    refuse_malformed_einsums(model)
    order = _check_edges(model.graph, set(), "the main graph")[0]
    result = GraphCheck(checker=checker)
    if checker:
        _run_checker(_checkable(model, order), result)
    return result


def _check_edges(graph: onnx.GraphProto, outer: set[str], where: str) -> tuple[list[int], set[str]]:
    """(a topological order of ``graph.node``, names it takes from enclosing graphs); raises on bad edges."""
    local = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    local |= {t.values.name for t in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in producer:  # other clashes (an output named like an input) are the checker's
                raise ModelLoadError(
                    f"Value '{name}' in {where} is produced by node {_describe(node)} and also by "
                    f"node {_describe(graph.node[producer[name]])}; an ONNX graph assigns each "
                    "value once. The model is corrupt: re-export it."
                )
            producer[name] = index
    visible = outer | local | set(producer)
    taken: set[str] = set()
    deps: list[set[int]] = []
    for node in graph.node:
        needed = [name for name in node.input if name]
        for attr_name, sub in subgraphs(node):
            _, free = _check_edges(sub, visible, f"{where} > node {_describe(node)} attribute '{attr_name}'")
            needed.extend(sorted(free))
        mine: set[int] = set()
        for name in needed:
            if name in producer:
                mine.add(producer[name])
            elif name in local:
                continue
            elif name in outer:
                taken.add(name)
            else:
                raise ModelLoadError(
                    f"Node {_describe(node)} in {where} reads '{name}', which no node produces and which is neither "
                    "a graph input nor an initializer (a dangling edge). The model is corrupt or was cut badly: "
                    "re-export it, or fix the edge with onnx.helper / onnx-graphsurgeon."
                )
        deps.append(mine)
    return _topological_order(graph, deps, where), taken


def _topological_order(graph: onnx.GraphProto, deps: list[set[int]], where: str) -> list[int]:
    """Kahn's algorithm, keeping the file's order where it is already valid; raises on a cycle."""
    waiting = [len(d) for d in deps]  # a node reading its own output never gets ready: a cycle
    users: list[list[int]] = [[] for _ in deps]
    for index, needed in enumerate(deps):
        for dep in needed:
            users[dep].append(index)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(deps):
        stuck = [i for i in range(len(deps)) if waiting[i] > 0]
        listed = ", ".join(_describe(graph.node[i]) for i in stuck[:_MAX_LISTED])
        more = f" and {len(stuck) - _MAX_LISTED} more" if len(stuck) > _MAX_LISTED else ""
        raise ModelLoadError(
            f"There is a cycle in {where}: nodes {listed}{more} depend on each other's outputs, "
            "so no order can run them. ONNX graphs must be acyclic (loops belong in a Loop or Scan "
            "node); re-export the model."
        )
    return order


def _checkable(model: onnx.ModelProto, order: list[int]) -> onnx.ModelProto:
    """The model as onnx's checker should see it: nodes sorted, external weights as graph inputs.

    The checker resolves external data relative to the current directory for in-memory
    models; whether those files exist is reported elsewhere (``load_model``, the summary).
    Copies only when something has to change.
    """
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if order == sorted(order) and not external:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if order != sorted(order):
        nodes = [copy.graph.node[i] for i in order]
        sorted_nodes = [onnx.NodeProto() for _ in nodes]
        for target, node in zip(sorted_nodes, nodes):
            target.CopyFrom(node)
        del copy.graph.node[:]
        copy.graph.node.extend(sorted_nodes)
    if external:
        names = {t.name for t in external}
        inputs = {vi.name for vi in copy.graph.input}
        kept = [t for t in copy.graph.initializer if t.name not in names]
        del copy.graph.initializer[:]
        copy.graph.initializer.extend(kept)
        for tensor in external:
            if tensor.name not in inputs:
                copy.graph.input.append(
                    onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
                )
    return copy


def _run_checker(model: onnx.ModelProto, result: GraphCheck) -> None:
    if model.ByteSize() >= 2**31 - 1:  # the checker cannot serialize it; ORT's load still checks
        result.checker = False
        result.warnings.append("onnx.checker was skipped: the model's graph is over 2 GB.")
        return
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        text = " ".join(str(exc).split())
        if any(marker in text for marker in _HARMLESS):
            result.warnings.append(f"onnx.checker: {text[:500]} (ORT loads such models; other tools may not).")
            return
        raise ModelLoadError(
            f"The model is not a valid ONNX graph: onnx.checker.check_model says: {text[:600]}. "
            "Re-export the model, or fix what it names with onnx.helper."
        ) from None


def _all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    def walk(nodes) -> Iterator[onnx.NodeProto]:
        for node in nodes:
            yield node
            for _, sub in subgraphs(node):
                yield from walk(sub.node)

    yield from walk(model.graph.node)
    for function in model.functions:
        yield from walk(function.node)


def _describe(node: onnx.NodeProto) -> str:
    name = node.name or (node.output[0] if node.output else "")
    return f"'{name}' ({node.op_type})"


__all__ = ["GraphCheck", "check_graph", "einsum_problem", "malformed_einsums", "refuse_malformed_einsums"]
