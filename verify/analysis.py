"""Static facts about a graph that the verifier needs before evaluating it:
its input/output signature, which ops it uses, and which inputs' q-parts can
ever reach an exponent."""

from __future__ import annotations

from fractions import Fraction

from mugraph.errors import InputError
from mugraph.ir import KernelGraph, Tensor, graph_ops, propagate
from mugraph.ops import CATALOG, exp_like


def input_signature(graph: KernelGraph) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.shape) for t in graph.inputs}


def check_compatible(a: KernelGraph, b: KernelGraph) -> None:
    """Raise a one-line :class:`~mugraph.errors.InputError` unless ``a`` and ``b``
    take the same inputs (names and shapes; order free) and give the same number
    of outputs with the same shapes (in order)."""
    for g, role in ((a, "reference"), (b, "candidate")):
        if not isinstance(g, KernelGraph):
            raise InputError(f"verify: the {role} must be a mugraph Program or KernelGraph, got {type(g).__name__}")
    sa, sb = input_signature(a), input_signature(b)
    if set(sa) != set(sb):
        only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
        raise InputError(f"{a.name} vs {b.name}: inputs differ: only in the reference {only_a}, "
                         f"only in the candidate {only_b}")
    for n in sorted(sa):
        if sa[n] != sb[n]:
            raise InputError(f"{a.name} vs {b.name}: input {n!r} has shape {sa[n]} in the reference "
                             f"but {sb[n]} in the candidate")
    if len(a.outputs) != len(b.outputs):
        raise InputError(f"{a.name} vs {b.name}: the reference has {len(a.outputs)} outputs, "
                         f"the candidate {len(b.outputs)}")
    for i, (x, y) in enumerate(zip(a.outputs, b.outputs)):
        if x.shape != y.shape:
            raise InputError(f"{a.name} vs {b.name}: output {i} has shape {x.shape} in the reference "
                             f"but {y.shape} in the candidate")


def constants(graph: KernelGraph) -> list[Fraction]:
    """Every rational constant of the graph (its ops' rational attributes: ``scale``
    factors, ``const`` values), at every level."""
    out = []
    for op, _ in graph_ops(graph):
        d = CATALOG.get(op.kind)
        out += [Fraction(op.attrs[a.name]) for a in (d.attrs if d else ()) if a.type == "rational"]
    return out


def dim_sizes(graph: KernelGraph) -> set[int]:
    """Every dim size of every tensor, at every level (reductions sum that many terms)."""
    out: set[int] = set()
    for op, _ in graph_ops(graph):
        for t in op.outputs:
            out.update(int(s) for s in t.shape)
    return out


def op_kinds(graph: KernelGraph) -> set[str]:
    """Every op kind used at any level."""
    return {op.kind for op, _ in graph_ops(graph)}


def inputs_needing_q(graph: KernelGraph) -> set[str]:
    """Names of the inputs whose mod-q part can reach the argument of an
    ``exp``/``silu`` along a path without an exponentiation before it.

    Only those inputs need a q-part draw: every other q-part is never read (the
    outputs are compared on their p-parts)."""
    need: set[str] = set()

    def step(kind: str, ins: list[frozenset[str]]) -> frozenset[str]:
        s = frozenset().union(*ins) if ins else frozenset()
        if exp_like(kind):
            need.update(s)
            return frozenset()  # the q-part is gone after an exponentiation
        return s

    propagate(graph, lambda op: frozenset([op.attrs["name"]]), lambda op, ins, kernel: step(op.kind, ins))
    return need


def live_graph(graph: KernelGraph) -> KernelGraph:
    """``graph`` without the ops no output depends on (the graph itself if none).

    The field test evaluates every op; a division by zero in dead code must not
    fail a draw (in real arithmetic it only makes a dead ``inf``), or equivalent
    graphs would be rejected. Dead savers of live kernels and dead iterators go
    too. The result computes the same outputs, and is rebuilt (validated) through
    the serializer."""
    from mugraph.serialize import graph_from_json, graph_to_json

    live: set[Tensor] = set(graph.outputs)
    block_live: dict[int, set] = {}
    saver_live: dict[int, list[bool]] = {}
    for op in reversed(graph.ops):
        if op.kind == "input":
            continue
        if op.kind != "graph_defined":
            if op.outputs[0] in live:
                live.update(op.inputs)
            continue
        block = op.attrs["block"]
        keep = [t in live for t in op.outputs]
        saver_live[op.id] = keep
        bl = {sv.tensor for sv, k in zip(block.savers, keep) if k}
        for bop in reversed(block.ops):
            if bop.outputs[0] in bl:
                bl.update(bop.inputs)
                if bop.kind == "iterator":
                    live.add(block.sources[bop.attrs["source"]])
        block_live[op.id] = bl
    dead = [op for op in graph.ops if op.kind not in ("input", "graph_defined") and op.outputs[0] not in live]
    dead_blocks = any(not all(saver_live[i]) or len(block_live[i]) < len(op.attrs["block"].ops)
                      for i, op in ((op.id, op) for op in graph.ops if op.kind == "graph_defined"))
    if not dead and not dead_blocks:
        return graph

    doc = graph_to_json(graph)
    new_ops, remap, n_new = [], {}, 0
    for op, od in zip(graph.ops, doc["ops"]):
        if op.kind == "input":
            keep_op = True
        elif op.kind == "graph_defined":
            keep_op = any(saver_live[op.id])
        else:
            keep_op = op.outputs[0] in live
        if not keep_op:
            continue
        if op.kind == "graph_defined":
            block = op.attrs["block"]
            bl = block_live[op.id]
            bremap, bops = {}, []
            for bop, bod in zip(block.ops, od["block"]["ops"]):
                if bop.outputs[0] not in bl:
                    continue
                if bod["op"] == "iterator":
                    bod["source"] = remap[block.sources[bop.attrs["source"]].id]
                else:
                    bod["inputs"] = [bremap[i] for i in bod["inputs"]]
                bremap[bop.outputs[0].id] = len(bops)
                bops.append(bod)
            savers = [dict(sd, tensor=bremap[sd["tensor"]])
                      for sd, k in zip(od["block"]["savers"], saver_live[op.id]) if k]
            od["block"]["ops"], od["block"]["savers"] = bops, savers
            for t, k in zip(op.outputs, saver_live[op.id]):
                if k:
                    remap[t.id] = n_new
                    n_new += 1
        else:
            if "inputs" in od:
                od["inputs"] = [remap[i] for i in od["inputs"]]
            remap[op.outputs[0].id] = n_new
            n_new += 1
        new_ops.append(od)
    doc["ops"] = new_ops
    doc["outputs"] = [remap[t.id] for t in graph.outputs]
    return graph_from_json(doc)
