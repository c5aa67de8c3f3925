"""Static facts about a graph that the verifier needs before evaluating it:
its input/output signature, which ops it uses, which inputs' q-parts can
ever reach an exponent, and its live part (:func:`mugraph.core.rewrite.live_graph`:
a division by zero in dead code must not fail a field draw)."""

from __future__ import annotations

from fractions import Fraction

from mugraph.core.errors import InputError
from mugraph.core.ir import RESCALED, BlockGraph, KernelGraph, Op, accum_monoid, graph_ops, propagate
from mugraph.core.ops import CATALOG, exp_like
from mugraph.core.rewrite import live_graph

__all__ = ["input_signature", "check_compatible", "constants", "dim_sizes", "op_kinds", "inputs_needing_q",
           "live_graph"]


def input_signature(graph: KernelGraph) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.shape) for t in graph.inputs}


def check_compatible(a: KernelGraph, b: KernelGraph) -> None:
    """Raise a one-line :class:`~mugraph.core.errors.InputError` unless ``a`` and ``b``
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
    # a filled input (mugraph.core.fills) is proven for every value, and each side's kernels
    # make their own fill's: the proof speaks of the compiled code only when the fills agree
    fa, fb = ({t.name: t.fill for t in g.inputs} for g in (a, b))
    for n in sorted(sa):
        if fa[n] != fb[n]:
            raise InputError(f"{a.name} vs {b.name}: input {n!r} is filled with {fa[n]} in the reference "
                             f"but {fb[n]} in the candidate")
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

    def accum(op: Op, ins: list[frozenset[str]], block: BlockGraph) -> frozenset[str]:
        if accum_monoid(op) == RESCALED:  # exp(m_i − M): the shift's q-parts are read
            need.update(ins[1])
        return ins[0]

    propagate(graph, lambda op: frozenset([op.attrs["name"]]), lambda op, ins, kernel: step(op.kind, ins), accum)
    return need
