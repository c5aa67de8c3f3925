"""μGraph rewrites: neighbours of found graphs that the enumeration reaches slowly.

Two moves, both generic (they look only at grids, maps and accumulators, never at
op names or shapes of a particular program) and both *re-verified* against the
program by the driver — a rewrite proposes, the verifier decides:

* :func:`fuse` — vertical fusion of two graph-defined kernels: a producer whose
  block graph has no for-loop is inlined into its consumer's loop body. The
  producer's grid axes are re-targeted at the consumer's partition of the
  tensor between them (a grid axis, the for-loop, or nothing = whole), so each
  consumer block recomputes exactly the tile it used to read. This is how a
  program too deep to enumerate in one piece (an RMS norm feeding attention)
  becomes one kernel: its pieces are searched separately
  (:mod:`search.compose`) and fused here.
* :func:`split_loop` — split a kernel's for-loop across ``S`` blocks: the first
  kernel gets a grid axis over ``S`` chunks of the loop and saves its
  accumulators (partial sums, laid side by side along a free dim); a second
  kernel loops over the chunks, accumulates the partials and runs the original
  post-loop ops. For attention this is split-KV (FlashDecoding); for a skinny
  GEMM it is split-K. It gives memory-bound kernels with few blocks more blocks
  in flight.

Both rebuild the graph with :func:`mugraph.rewrite.rebuild`: the rewritten kernel's
replacement is built in place of the old one and every other op is replayed, so
the IR checks the result again (an illegal rewrite gives None).
"""

from __future__ import annotations

import json
from typing import Optional

from mugraph.errors import MugraphError
from mugraph.ir import BlockGraph, KernelGraph, Op, Tensor
from mugraph.rewrite import GD, Rebuild, rebuild
from mugraph.serialize import graph_to_json


def graph_key(g: KernelGraph) -> str:
    """Canonical text of a μGraph (its JSON), to deduplicate proposals."""
    return json.dumps(graph_to_json(g), sort_keys=True)


def _replay_op(nb: BlockGraph, op: Op, m: dict, drop_accum: bool = False) -> None:
    """Block op ``op`` again in ``nb`` on the tiles ``m`` maps its inputs to."""
    if op.kind == "accum":
        x = m[op.inputs[0]]
        m[op.outputs[0]] = x if drop_accum else nb.accum(x)
    else:
        attrs = dict(op.attrs)
        if not op.inputs:
            attrs.setdefault("dtype", op.outputs[0].dtype)
        m[op.outputs[0]] = nb.add_op(op.kind, [m[t] for t in op.inputs], attrs)


# ---------------------------------------------------------------------- fusion

def fusable_pairs(g: KernelGraph) -> list[tuple[int, int]]:
    """(producer, consumer) op ids of graph-defined kernels that :func:`fuse` may merge."""
    cons = g.consumers()
    outs = set(g.outputs)
    pairs = []
    for a in g.ops:
        if a.kind != GD or a.attrs["block"].forloop != 1:
            continue
        users = {op.id for t in a.outputs for op in cons.get(t, [])}
        if len(users) != 1 or any(t in outs for t in a.outputs):
            continue
        b = g.ops[users.pop()]
        if b.kind == GD:
            pairs.append((a.id, b.id))
    return pairs


def fuse(g: KernelGraph, a_id: int, b_id: int) -> Optional[KernelGraph]:
    """Inline loop-free kernel ``a_id`` into its only consumer ``b_id``; None if the maps do not line up."""
    a, b = g.ops[a_id], g.ops[b_id]
    ab: BlockGraph = a.attrs["block"]
    bb: BlockGraph = b.attrs["block"]
    # where each of a's grid axes goes in the fused block: ("axis", k) | ("loop",) | None (whole)
    target: dict[int, tuple] = {}
    for it in bb.ops:
        if it.kind != "iterator":
            continue
        src = bb.sources[it.attrs["source"]]
        if src.op is not a:
            continue
        omap = ab.savers[a.outputs.index(src)].omap
        written = {d: ax for ax, d in enumerate(omap) if d is not None}
        imap, fmap = it.attrs["imap"], it.attrs["fmap"]
        for k, d in enumerate(imap):  # b splits a dim a did not: a's tile would be too big
            if d is not None and d not in written:
                return None
        if fmap is not None and fmap not in written:
            return None
        for d, ax in written.items():
            t = ("axis", imap.index(d)) if d in imap else ("loop",) if fmap == d else None
            if target.setdefault(ax, t) != t:
                return None
    used = [t for t in target.values() if t is not None]
    if len(used) != len(set(used)):
        return None

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        nb = BlockGraph(bb.grid, bb.forloop)
        tm: dict[Tensor, Tensor] = {}
        inlined: dict[Tensor, Tensor] = {}

        def inline_a() -> None:
            am: dict[Tensor, Tensor] = {}
            for op in ab.ops:
                if op.kind == "iterator":
                    imap, fmap = [None, None, None], None
                    for ax, d in enumerate(op.attrs["imap"]):
                        t = target.get(ax)
                        if d is None or t is None:
                            continue
                        if t[0] == "axis":
                            imap[t[1]] = d
                        else:
                            fmap = d
                    am[op.outputs[0]] = nb.input(rb.get(ab.sources[op.attrs["source"]]), tuple(imap), fmap)
                else:
                    _replay_op(nb, op, am, drop_accum=True)  # a has no loop: accum is the identity
            for out, sv in zip(a.outputs, ab.savers):
                inlined[out] = am[sv.tensor]

        for op in bb.ops:
            if op.kind == "iterator":
                src = bb.sources[op.attrs["source"]]
                if src.op is a:
                    if not inlined:
                        inline_a()
                    tm[op.outputs[0]] = inlined[src]
                else:
                    tm[op.outputs[0]] = nb.input(rb.get(src), op.attrs["imap"], op.attrs["fmap"])
            else:
                _replay_op(nb, op, tm)
        for sv in bb.savers:
            nb.output(tm[sv.tensor], sv.omap)
        return rb.graph.kernel(nb)

    try:
        return rebuild(g, replace={(b_id, None): build}, drop=[(a_id, None)])
    except MugraphError:
        return None


def fuse_all(g: KernelGraph) -> list[KernelGraph]:
    """Every graph reachable by repeated fusion (``g`` excluded), most fused last; deduplicated."""
    seen = {graph_key(g)}
    out: list[KernelGraph] = []
    frontier = [g]
    while frontier:
        nxt = []
        for h in frontier:
            for a_id, b_id in fusable_pairs(h):
                f = fuse(h, a_id, b_id)
                if f is None:
                    continue
                k = graph_key(f)
                if k not in seen:
                    seen.add(k)
                    out.append(f)
                    nxt.append(f)
        frontier = nxt
    return out


# ------------------------------------------------------------------ loop split

def split_loop(g: KernelGraph, op_id: int, chunks: int) -> Optional[KernelGraph]:
    """Split kernel ``op_id``'s for-loop over ``chunks`` blocks plus a combining kernel (None if illegal)."""
    op = g.ops[op_id]
    if op.kind != GD:
        return None
    bg: BlockGraph = op.attrs["block"]
    F = bg.forloop
    if F < 2 or chunks < 2 or F % chunks or 1 not in bg.grid:
        return None
    omaps = {sv.omap for sv in bg.savers}
    if len(omaps) != 1:
        return None
    base = next(iter(omaps))
    c = bg.grid.index(1)  # the new grid axis: one block per chunk of the loop
    grid1 = tuple(chunks if k == c else s for k, s in enumerate(bg.grid))
    accs = [o for o in bg.ops if o.kind == "accum"]
    used_dims = {d for d in base if d is not None}
    lay: list[int] = []  # dim of each accumulator's tile along which the chunks' partials lie side by side
    for o in accs:
        free = [d for d in range(len(o.outputs[0].shape)) if d not in used_dims]
        if not free:
            return None
        lay.append(free[-1])

    # tiles of constants only (acc None) that post-loop ops read: the combining kernel
    # computes them again (the first kernel may need them too, in its loop)
    consts: set[Tensor] = set()
    for o in reversed(bg.ops):
        if o.outputs[0].acc == 1 or o.outputs[0] in consts:
            consts.update(t for t in o.inputs if t.acc is None)

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        k1 = BlockGraph(grid1, F // chunks)
        tm: dict[Tensor, Tensor] = {}
        for o in bg.ops:
            if o.kind == "iterator":
                imap = list(o.attrs["imap"])
                if o.attrs["fmap"] is not None:
                    imap[c] = o.attrs["fmap"]
                fmap = o.attrs["fmap"] if F // chunks > 1 else None  # one chunk per block: no loop left
                tm[o.outputs[0]] = k1.input(rb.get(bg.sources[o.attrs["source"]]), tuple(imap), fmap)
            elif o.kind == "accum" or o.outputs[0].acc != 1:
                _replay_op(k1, o, tm)
        for o, d in zip(accs, lay):
            om = list(base)
            om[c] = d
            k1.output(tm[o.outputs[0]], tuple(om))
        partials = rb.graph.kernel(k1)
        k2 = BlockGraph(bg.grid, chunks)
        cm: dict[Tensor, Tensor] = {}
        for o, d, p in zip(accs, lay, partials):
            cm[o.outputs[0]] = k2.accum(k2.input(p, base, d))
        for o in bg.ops:
            if o.kind not in ("iterator", "accum") and (o.outputs[0].acc == 1 or o.outputs[0] in consts):
                _replay_op(k2, o, cm)
        for sv in bg.savers:
            k2.output(cm[sv.tensor], sv.omap)
        return rb.graph.kernel(k2)

    try:
        return rebuild(g, replace={(op_id, None): build}, name=g.name)
    except MugraphError:
        return None


def split_variants(g: KernelGraph, chunk_options: tuple[int, ...] = (2, 4, 8, 16, 32, 64)) -> list[KernelGraph]:
    """Every legal :func:`split_loop` of every graph-defined kernel of ``g``."""
    out = []
    for op in g.ops:
        if op.kind != GD:
            continue
        for s in chunk_options:
            h = split_loop(g, op.id, s)
            if h is not None:
                out.append(h)
    return out
