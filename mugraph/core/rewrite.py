"""Rewriting μGraphs: the one way the stages derive a graph from another.

A rewrite *replays* a graph, op by op and level by level, into a new graph
through the builder, with edits at named sites — so every rule of the IR is
checked again on the result (a rewrite that breaks one raises a
:class:`~mugraph.core.errors.MugraphError`, never returns an invalid graph), and no
stage edits a serialized form and parses it back.

A *site* names one op: ``(kernel op id, None)`` for an op of the kernel graph,
``(kernel op id, block op id)`` for an op inside a graph-defined kernel's block
graph. The edits:

* ``replace[site]`` — a function ``(rb, op) -> output tensors`` that builds the
  op's replacement in ``rb.graph`` (the new kernel or block graph) from the new
  tensors ``rb.get(t)`` / ``rb.inputs(op)``; later readers of the op's outputs
  read what it returns;
* ``drop`` — sites skipped (nothing may read their outputs afterwards);
* ``reads[t] = u`` — every later read of tensor ``t`` (op inputs, iterator
  sources, savers, kernel outputs) reads ``u`` instead;
* ``savers[(kernel op id, saver index)]`` — a new omap for that output saver, or
  :data:`DROP` to remove it (the kernel then has one output fewer).

Users: dead-code elimination (:func:`live_graph`), kernel fusion and split-loop
(:mod:`search.rewrite`), splicing piece graphs into a whole program
(:mod:`search.compose`) and the verifier's fuzz mutations (:mod:`verify.fuzz`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from .ir import BlockGraph, Graph, KernelGraph, Op, Tensor

GD = "graph_defined"

#: an op: (kernel op id, None) at the kernel level, (kernel op id, block op id) inside a block graph
Site = tuple[int, Optional[int]]
#: builds an op's replacement: (the rebuild, the old op) -> the new tensors for the op's outputs
OpBuilder = Callable[["Rebuild", Op], list]


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


#: a saver edit that removes the saver
DROP = _Drop()


class Rebuild:
    """The state of one replay: old tensor → new tensor (both levels), the edits,
    and the graph ops are being added to (``graph``: the new kernel graph, or the
    new block graph while a graph-defined kernel is replayed)."""

    def __init__(self, graph: KernelGraph, m: dict[Tensor, Tensor], replace: dict[Site, OpBuilder],
                 drop: Iterable[Site], reads: dict[Tensor, Tensor], savers: dict[tuple[int, int], object]) -> None:
        self.graph: Graph = graph
        self.m = m
        self.replace = replace
        self.drop = frozenset(drop)
        self.reads = reads
        self.savers = savers
        #: the old block graph being replayed (None at the kernel level)
        self.block: BlockGraph | None = None

    def get(self, t: Tensor) -> Tensor:
        """The new tensor an old tensor's reader reads (after ``reads`` redirections)."""
        return self.m[self.reads.get(t, t)]

    def inputs(self, op: Op) -> list[Tensor]:
        return [self.get(t) for t in op.inputs]

    def add(self, op: Op, inputs: list[Tensor], kind: str | None = None, attrs: dict | None = None) -> Tensor:
        """``op`` (a catalog op) again in :attr:`graph` on ``inputs``, optionally as
        another kind or with other attributes. An op without inputs (``const``)
        keeps its dtype."""
        attrs = dict(op.attrs if attrs is None else attrs)
        if not inputs:
            attrs.setdefault("dtype", op.outputs[0].dtype)
        return self.graph.add_op(kind or op.kind, inputs, attrs)

    def op(self, site: Site, op: Op) -> list:
        """The new tensors for ``op``'s outputs: its replacement, or the op replayed."""
        if site in self.replace:
            return list(self.replace[site](self, op))
        if op.kind == GD:
            return self.kernel(op)
        if op.kind == "iterator":
            source = self.block.sources[op.attrs["source"]]  # type: ignore[union-attr]
            return [self.graph.input(self.get(source), op.attrs["imap"], op.attrs["fmap"])]  # type: ignore[attr-defined]
        if op.kind == "accum":
            return [self.graph.accum_like(op, [self.get(t) for t in op.inputs])]  # type: ignore[attr-defined]
        return [self.add(op, self.inputs(op))]

    def kernel(self, op: Op, block: BlockGraph | None = None) -> list:
        """Graph-defined kernel ``op`` replayed with the edits at its block's sites;
        one new tensor per old output (None for a dropped saver's)."""
        bg: BlockGraph = block or op.attrs["block"]
        nb = BlockGraph(bg.grid, bg.forloop)
        outer, self.graph, self.block = self.graph, nb, bg
        try:
            for bop in bg.ops:
                site = (op.id, bop.id)
                if site in self.drop:
                    continue
                self._map(bop, self.op(site, bop))
            kept = []
            for k, sv in enumerate(bg.savers):
                omap = self.savers.get((op.id, k), sv.omap)
                if omap is DROP:
                    continue
                nb.output(self.get(sv.tensor), omap)
                kept.append(k)
        finally:
            self.graph, self.block = outer, None
        outs = iter(outer.kernel(nb))  # type: ignore[attr-defined]
        return [next(outs) if k in kept else None for k in range(len(bg.savers))]

    def _map(self, op: Op, new: list) -> None:
        for old, t in zip(op.outputs, new):
            if t is not None:
                self.m[old] = t


def splice(ng: KernelGraph, g: KernelGraph, m: dict[Tensor, Tensor], *,
           replace: dict[Site, OpBuilder] | None = None, drop: Iterable[Site] = (),
           reads: dict[Tensor, Tensor] | None = None,
           savers: dict[tuple[int, int], object] | None = None,
           input_shape: Callable[[Tensor], tuple[int, ...]] | None = None) -> dict[Tensor, Tensor]:
    """Replay ``g``'s ops into ``ng`` with the edits; ``m`` maps ``g``'s tensors to
    ``ng``'s and is extended (and returned).

    Inputs of ``g`` already in ``m`` are taken from it (splicing into a larger
    graph); the others become inputs of ``ng``, in ``g``'s order, each of the shape
    ``input_shape(t)`` gives (default: its own — another gives the same graph at other
    sizes). ``g``'s outputs are not marked."""
    rb = Rebuild(ng, m, replace or {}, drop, reads or {}, savers or {})
    for op in g.ops:
        site = (op.id, None)
        if site in rb.drop:
            continue
        if op.kind == "input":
            t = op.outputs[0]
            if t not in m:
                m[t] = ng.input(t.name, t.shape if input_shape is None else input_shape(t), t.dtype, fill=t.fill)
            continue
        rb._map(op, rb.op(site, op))
    return m


def rebuild(g: KernelGraph, *, replace: dict[Site, OpBuilder] | None = None, drop: Iterable[Site] = (),
            reads: dict[Tensor, Tensor] | None = None, savers: dict[tuple[int, int], object] | None = None,
            name: str | None = None) -> KernelGraph:
    """A new graph of ``g``'s class (a Program stays a Program): ``g`` replayed with
    the edits, its outputs marked (through ``reads``)."""
    ng = type(g)(g.name if name is None else name)
    reads = reads or {}
    m = splice(ng, g, {}, replace=replace, drop=drop, reads=reads, savers=savers)
    for t in g.outputs:
        ng.output(m[reads.get(t, t)])
    return ng


# ------------------------------------------------------------------ dead code


def live_graph(graph: KernelGraph) -> KernelGraph:
    """``graph`` without the ops no output depends on (the graph itself if none is
    dead): dead kernel ops, dead block ops and iterators, dead savers of live
    kernels. The result computes the same outputs; its ops keep their order.

    Why the stages need it: the verifier's field test evaluates every op, and a
    division by zero in dead code must not fail a draw; mutating dead code proves
    nothing to the fuzz."""
    live: set[Tensor] = set(graph.outputs)
    drop: list[Site] = []
    savers: dict[tuple[int, int], object] = {}
    for op in reversed(graph.ops):
        if op.kind == "input":
            continue
        if op.kind != GD:
            if op.outputs[0] in live:
                live.update(op.inputs)
            else:
                drop.append((op.id, None))
            continue
        block: BlockGraph = op.attrs["block"]
        keep = [t in live for t in op.outputs]
        if not any(keep):
            drop.append((op.id, None))
            continue
        savers.update({(op.id, k): DROP for k, kk in enumerate(keep) if not kk})
        bl = {sv.tensor for sv, k in zip(block.savers, keep) if k}
        for bop in reversed(block.ops):
            if bop.outputs[0] in bl:
                bl.update(bop.inputs)
                if bop.kind == "iterator":
                    live.add(block.sources[bop.attrs["source"]])
            else:
                drop.append((op.id, bop.id))
    if not drop and not savers:
        return graph
    return rebuild(graph, drop=drop, savers=savers)
