"""Who reads what in a graph (``reads``, ``cone``), and pruning what nobody reads: dead nodes,
unread optional outputs, and the outputs a deployment does not read (``prune_to_outputs``,
``--outputs``).

Fusions leave both behind. onnxscript's SkipSimplifiedLayerNormalization names its optional
mean and inverse-std outputs although nothing reads them (onnxruntime-genai's builder leaves them
empty); unnamed, ORT need not produce them. On SmolLM2's 60 norms the time saved is within
noise (BENCHMARKS.md, bench_step_profile), so this is tidiness, not a speed claim.
"""

from __future__ import annotations

from functools import cache

import onnx

from ortpilot.walk import subgraphs


def reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads, including those its subgraphs (If/Loop/Scan bodies) take from outside."""
    names = {i for i in node.input if i}
    for _, graph in subgraphs(node):
        for inner in graph.node:
            names |= reads(inner)
    return names


def cone(model: onnx.ModelProto, outputs: list[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes that compute ``outputs`` (in graph order) and the graph inputs they read."""
    producer = {o: n for n in model.graph.node for o in n.output}
    # Older exports list initializers among the graph inputs too; those are constants, not inputs.
    graph_inputs = {i.name for i in model.graph.input} - {i.name for i in model.graph.initializer}
    seen: set[int] = set()
    inputs: set[str] = set()
    stack = list(outputs)
    while stack:
        name = stack.pop()
        if name in graph_inputs:
            inputs.add(name)
        node = producer.get(name)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(reads(node))
    return [n for n in model.graph.node if id(n) in seen], inputs


def read_names(model: onnx.ModelProto) -> set[str]:
    """Every name the graph reads: node inputs (subgraphs included) and graph outputs."""
    names = {o.name for o in model.graph.output}
    for node in model.graph.node:
        names |= reads(node)
    return names


def remove_dead_nodes(model: onnx.ModelProto) -> int:
    """Drop nodes whose outputs nobody reads, and the initializers only they read; returns the count."""
    needed = {o.name for o in model.graph.output}
    keep: list[onnx.NodeProto] = []
    for node in reversed(model.graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed |= reads(node)
    removed = len(model.graph.node) - len(keep)
    del model.graph.node[:]
    model.graph.node.extend(reversed(keep))
    declared = {i.name for i in model.graph.input}  # an initializer that is also an input stays with it
    for init in [i for i in model.graph.initializer if i.name not in needed and i.name not in declared]:
        model.graph.initializer.remove(init)
    return removed


@cache
def _optional_outputs(domain: str, op_type: str) -> frozenset[int]:
    """Output positions ORT's schema for the op marks optional (empty when the op is unknown)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    for schema in C.get_all_operator_schema():
        if schema.name == op_type and schema.domain == domain:
            return frozenset(
                k
                for k, out in enumerate(schema.outputs)
                if out.option == C.schemadef.OpSchema.FormalParameterOption.Optional
            )
    return frozenset()


def clear_unread_outputs(model: onnx.ModelProto) -> int:
    """Empty the names of optional outputs nobody reads, so ORT skips them; returns the count."""
    read = read_names(model)
    cleared = 0
    for node in model.graph.node:
        optional = _optional_outputs(node.domain if node.domain != "ai.onnx" else "", node.op_type)
        for k, name in enumerate(node.output):
            if name and k in optional and name not in read:
                node.output[k] = ""
                cleared += 1
    for node in model.graph.node:  # trailing empty outputs are dropped
        while node.output and not node.output[-1]:
            node.output.pop()
    return cleared


def check_outputs(model: onnx.ModelProto, names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` (``--outputs``) checked against the model's outputs, duplicates dropped, order kept.

    A name the graph does not output, or an output that is also a graph input (a pass-through the
    deployment would read back as sent), is a ``UsageError`` (exit 2) naming the real outputs.
    """
    from ortpilot.errors import UsageError

    wanted = list(dict.fromkeys(str(n) for n in names))
    real = [o.name for o in model.graph.output]
    if not wanted:
        raise UsageError(f"--outputs needs at least one output name; the model's outputs are: {', '.join(real)}.")
    inputs = {i.name for i in model.graph.input}
    missing = [n for n in wanted if n not in real]
    if missing:
        fed = [n for n in missing if n in inputs]
        raise UsageError(
            f"--outputs names {', '.join(repr(n) for n in missing)}, which the model does not output"
            f"{' (' + ', '.join(repr(n) for n in fed) + ' is an input)' if fed else ''}; "
            f"its outputs are: {', '.join(real)}. Name one or more of those (repeat --outputs NAME)."
        )
    echoed = [n for n in wanted if n in inputs]
    if echoed:
        raise UsageError(
            f"--outputs names {', '.join(repr(n) for n in echoed)}, which is also a graph input: the model "
            "returns it as it was fed, so there is nothing to compute, time or gate for it. Name outputs "
            f"the model computes ({', '.join(n for n in real if n not in inputs) or 'none'})."
        )
    return wanted


def prune_to_outputs(model: onnx.ModelProto, names: list[str] | tuple[str, ...]) -> onnx.ModelProto:
    """A copy of ``model`` that outputs only ``names`` (checked by :func:`check_outputs`), in that order,
    without the nodes and initializers only the other outputs needed.

    The graph inputs stay as they are, read or not, so the pruned model takes the same requests
    (ORT requires every declared input to be fed).
    """
    wanted = check_outputs(model, names)
    pruned = onnx.ModelProto()
    pruned.CopyFrom(model)
    by_name = {o.name: o for o in model.graph.output}
    del pruned.graph.output[:]
    pruned.graph.output.extend(by_name[n] for n in wanted)
    remove_dead_nodes(pruned)
    live = {o for n in pruned.graph.node for o in n.output} | read_names(pruned)
    kept = [v for v in pruned.graph.value_info if v.name in live]
    del pruned.graph.value_info[:]
    pruned.graph.value_info.extend(kept)
    return pruned
