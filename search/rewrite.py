"""μGraph rewrites: neighbours of found graphs that the enumeration reaches slowly.

Three moves, all generic (they look only at grids, maps and accumulators, never at
op names or shapes of a particular program) and all *re-verified* against the
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
  in flight, so the chunk counts are chosen from the kernel's grid and loop against
  the GPU's SM count (:func:`split_chunks`), and the combining kernel is re-gridded
  along an output dim when its post-loop ops allow (:func:`combine_dims`).

* :func:`retile` — the same kernel on other tiles: a grid axis with twice or half the
  blocks, a loop with twice or half the steps (:func:`tile_variants`). The lowering
  merges loop steps itself but never cuts one, and never changes a grid; and it cannot
  re-chunk an online softmax's loop at all, so a prompt attention's key and row tiles are
  the graph's own (64 × 64 ran 177 μs where the search's 64 × 128 ran 212, head dim 128,
  H200).
  A loop-free kernel gets a loop from :mod:`search.loops` instead (its contracted dims
  stepped), which no halving or doubling reaches.

All rebuild the graph with :func:`mugraph.core.rewrite.rebuild`: the rewritten kernel's
replacement is built in place of the old one and every other op is replayed, so
the IR checks the result again (an illegal rewrite gives None).
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from mugraph.core.errors import InvalidGraphError, MugraphError
from mugraph.core.ir import DTYPES, RESCALED, RUNNING_MAX, SUM, BlockGraph, KernelGraph, Op, Tensor, accum_monoid
from mugraph.core.ops import CATALOG, is_elementwise
from mugraph.core.rewrite import GD, Rebuild, rebuild
from mugraph.core.serialize import graph_to_json

from .enumerate import GPU_SMS


def graph_key(g: KernelGraph) -> str:
    """Canonical text of a μGraph (its JSON), to deduplicate proposals."""
    return json.dumps(graph_to_json(g), sort_keys=True)


def replay_op(nb: BlockGraph, op: Op, m: dict, drop_accum: bool = False) -> None:
    """Op ``op`` (a block op, or a program op a block applies) again in ``nb`` on the tiles ``m`` maps its inputs to."""
    if op.kind == "accum":
        if drop_accum and accum_monoid(op) != SUM:  # a rescaled sum over one step is not its tile
            raise InvalidGraphError(f"{op.label()}: a {accum_monoid(op)} accumulator cannot be dropped")
        x = m[op.inputs[0]]
        m[op.outputs[0]] = x if drop_accum else nb.accum_like(op, [m[t] for t in op.inputs])
    else:
        attrs = dict(op.attrs)
        if not op.inputs:
            attrs.setdefault("dtype", op.outputs[0].dtype)
        m[op.outputs[0]] = nb.add_op(op.kind, [m[t] for t in op.inputs], attrs)


def _replay_ops(bg: BlockGraph, nb: BlockGraph, load, drop_accum: bool = False) -> dict[Tensor, Tensor]:
    """``bg``'s ops again in ``nb`` — each iterator's tile from ``load(iterator op)``, the rest
    replayed on the tiles they map to (:func:`replay_op`); ``bg``'s tiles -> ``nb``'s."""
    tm: dict[Tensor, Tensor] = {}
    for op in bg.ops:
        if op.kind == "iterator":
            tm[op.outputs[0]] = load(op)
        else:
            replay_op(nb, op, tm, drop_accum)
    return tm


def _replay_block(rb: Rebuild, bg: BlockGraph, nb: BlockGraph, load) -> list[Tensor]:
    """``bg``'s ops again in ``nb`` (:func:`_replay_ops`), its savers with their maps, and
    ``nb`` as a kernel of the graph ``rb`` rebuilds."""
    tm = _replay_ops(bg, nb, load)
    for sv in bg.savers:
        nb.output(tm[sv.tensor], sv.omap)
    return rb.graph.kernel(nb)


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
        inlined: dict[Tensor, Tensor] = {}

        def load_a(op: Op) -> Tensor:
            imap, fmap = [None, None, None], None
            for ax, d in enumerate(op.attrs["imap"]):
                t = target.get(ax)
                if d is None or t is None:
                    continue
                if t[0] == "axis":
                    imap[t[1]] = d
                else:
                    fmap = d
            return nb.input(rb.get(ab.sources[op.attrs["source"]]), tuple(imap), fmap)

        def inline_a() -> None:
            am = _replay_ops(ab, nb, load_a, drop_accum=True)  # a has no loop: accum is the identity
            for out, sv in zip(a.outputs, ab.savers):
                inlined[out] = am[sv.tensor]

        def load(op: Op) -> Tensor:
            src = bb.sources[op.attrs["source"]]
            if src.op is not a:
                return nb.input(rb.get(src), op.attrs["imap"], op.attrs["fmap"])
            if not inlined:
                inline_a()
            return inlined[src]

        return _replay_block(rb, bb, nb, load)

    try:
        return rebuild(g, replace={(b_id, None): build}, drop=[(a_id, None)])
    except MugraphError:
        return None


def _pointwise_tail(bg: BlockGraph) -> bool:
    """Whether ``bg`` is loop-free element-wise work: iterators, its one step's accumulators,
    constants and unary and binary ops only — each output element a function of the inputs'
    elements at the same place (after broadcasting), whatever the tiles."""
    return bg.forloop == 1 and all(op.kind in ("iterator", "accum") or is_elementwise(op.kind) for op in bg.ops)


def stretches_to(shape: tuple, to: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``to`` at the same rank (each dim ``to``'s or one)."""
    return len(shape) == len(to) and all(n in (1, m) for n, m in zip(shape, to))


def broadcast_map(omap: tuple, shape: tuple) -> tuple:
    """The iterator map that reads a tensor of ``shape`` on the tiles ``omap`` writes: each
    grid axis cuts the same dim, except dims of one element (broadcast), read whole."""
    return tuple(d if d is not None and shape[d] != 1 else None for d in omap)


def epilogue_pairs(g: KernelGraph) -> list[tuple[int, int]]:
    """(producer, consumer) op ids that :func:`fuse_epilogue` may merge: a kernel none of
    whose outputs is a graph output, and the one kernel reading them, loop-free and
    element-wise (:func:`_pointwise_tail`). A loop-free producer is paired too: :func:`fuse`
    merges it only where the two kernels' tiles line up, this on the producer's tiles."""
    cons = g.consumers()
    outs = set(g.outputs)
    pairs = []
    for a in g.ops:
        if a.kind != GD or any(t in outs for t in a.outputs):
            continue
        users = {op.id for t in a.outputs for op in cons.get(t, [])}
        if len(users) == 1:
            b = g.ops[users.pop()]
            if b.kind == GD and _pointwise_tail(b.attrs["block"]):
                pairs.append((a.id, b.id))
    return pairs


def fuse_epilogue(g: KernelGraph, a_id: int, b_id: int) -> Optional[KernelGraph]:
    """Element-wise kernel ``b_id`` run after the loop of kernel ``a_id``, on the tiles ``a``
    saved — its only consumer, loop-free (:func:`epilogue_pairs`); None where it cannot be.

    Why: :func:`fuse` inlines a loop-free *producer* into its consumer, so an element-wise
    tail after a contraction (a GeLU written out op by op after a gated projection: ten ops,
    past what one search enumerates, so the composition searches them as pieces of their own)
    stayed a kernel of its own, writing and re-reading the contraction's result. ``b``'s
    tiles need not line up with ``a``'s: element-wise work can run on any tiling, so it runs
    on ``a``'s — ``a``'s post-loop tiles in place of what ``b`` read of ``a``, its other
    inputs read (once, after the loop: loop-invariant) on the same tiles, broadcast dims of
    one element kept whole. Requires ``a``'s outputs and ``b``'s to share one shape and
    ``a`` to save them on one map, and ``b`` to read and write each grid axis's dim as it is
    written (no transposition hidden in its maps). The result is a proposal like any fusion:
    the driver verifies it."""
    a, b = g.ops[a_id], g.ops[b_id]
    ab: BlockGraph = a.attrs["block"]
    bb: BlockGraph = b.attrs["block"]
    shapes = {t.shape for t in a.outputs} | {t.shape for t in b.outputs}
    omaps = {tuple(sv.omap) for sv in ab.savers}
    if len(shapes) != 1 or len(omaps) != 1 or len({tuple(sv.omap) for sv in bb.savers}) != 1:
        return None
    shape, omap, b_omap = shapes.pop(), omaps.pop(), tuple(bb.savers[0].omap)
    for op in bb.ops:  # b's tiles: each grid axis cuts the dim its saver writes, or none (broadcast)
        if op.kind == "iterator":
            if not stretches_to(bb.sources[op.attrs["source"]].shape, shape):
                return None
            if any(bb.grid[k] > 1 and d is not None and d != b_omap[k] for k, d in enumerate(op.attrs["imap"])):
                return None

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        nb = BlockGraph(ab.grid, ab.forloop)
        am = _replay_ops(ab, nb, lambda op: nb.input(rb.get(ab.sources[op.attrs["source"]]), op.attrs["imap"],
                                                      op.attrs["fmap"]))
        saved = {out: am[sv.tensor] for out, sv in zip(a.outputs, ab.savers)}

        def load_b(op: Op) -> Tensor:  # what b read of a: a's post-loop tiles; the rest on a's tiling
            src = bb.sources[op.attrs["source"]]
            return saved[src] if src.op is a else nb.input(rb.get(src), broadcast_map(omap, src.shape), None)

        bm = _replay_ops(bb, nb, load_b, drop_accum=True)  # b has no loop: its accumulators are identities
        for sv in bb.savers:
            nb.output(bm[sv.tensor], omap)
        return rb.graph.kernel(nb)

    try:
        return rebuild(g, replace={(b_id, None): build}, drop=[(a_id, None)])
    except MugraphError:
        return None


def fuse_all(g: KernelGraph) -> list[KernelGraph]:
    """Every graph reachable by repeated fusion — loop-free producers into their consumers
    (:func:`fuse`), element-wise consumers into their producers' epilogues
    (:func:`fuse_epilogue`) — ``g`` excluded, most fused last; deduplicated."""
    seen = {graph_key(g)}
    out: list[KernelGraph] = []
    frontier = [g]
    while frontier:
        nxt = []
        for h in frontier:
            merges = [(fuse, a_id, b_id) for a_id, b_id in fusable_pairs(h)] + \
                     [(fuse_epilogue, a_id, b_id) for a_id, b_id in epilogue_pairs(h)]
            for merge, a_id, b_id in merges:
                f = merge(h, a_id, b_id)
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

#: the combining kernel's tiles along the dim it is re-gridded on stay at least this long
#: (a tile of fewer rows leaves a block next to nothing to do)
MIN_COMBINE_TILE = 16


def split_chunks(blocks: int, forloop: int, sms: int = GPU_SMS) -> list[int]:
    """Chunk counts worth proposing for a kernel of ``blocks`` blocks and a loop of ``forloop``.

    Split-loop exists to put more blocks in flight, so the counts come from the GPU, not
    from a fixed list: ``fill`` is the fewest chunks (a divisor of the loop) that make
    ``blocks × chunks`` reach three quarters of the SMs (the most there are when none
    does); the proposals are ``fill / 4``, ``fill / 2``, ``fill`` and ``2 · fill`` —
    coarser splits keep longer loops per block and smaller partials, the finer one a
    second wave — those that divide the loop and leave at most :data:`MAX_SPLIT_BLOCKS`
    blocks. A kernel with enough blocks already gets only the coarsest split, 2, and only
    while its grid is short of one full wave (96 blocks on 132 SMs), else nothing."""
    divs = [s for s in range(2, forloop + 1) if forloop % s == 0 and blocks * s <= MAX_SPLIT_BLOCKS]
    if not divs:
        return []
    want = 3 * sms / 4
    if blocks >= want:
        return [2] if blocks < sms and 2 in divs else []
    fill = next((s for s in divs if blocks * s >= want), divs[-1])
    return sorted({s for s in (fill // 4, fill // 2, fill, 2 * fill) if s in divs})


#: the most blocks a split-loop variant's first kernel may have
MAX_SPLIT_BLOCKS = 4096


def split_loop(g: KernelGraph, op_id: int, chunks: int, combine_tiles: int = 1,
               lay_first: bool = False, steps: Optional[int] = None) -> Optional[KernelGraph]:
    """Split kernel ``op_id``'s for-loop over ``chunks`` blocks plus a combining kernel (None if illegal).

    The partials of each accumulator lie side by side along a dim no grid axis of the
    output splits: the last such dim, or the first with ``lay_first`` (which leaves the
    last free for the combine to cut). ``combine_tiles`` > 1 re-grids the combining
    kernel: a free grid axis cuts one output dim into that many tiles
    (:func:`combine_dims` says which dims may be cut), so the combine runs on more blocks
    than the original kernel had (its grid is often small: that is why the loop was split).
    ``steps``: the first kernel's loop length (default ``F / chunks``: each step reads the
    tiles the original step did); a larger one cuts each chunk into shorter steps."""
    op = g.ops[op_id]
    if op.kind != GD:
        return None
    bg: BlockGraph = op.attrs["block"]
    F = bg.forloop
    steps = F // chunks if steps is None else steps
    if F < 2 or chunks < 2 or F % chunks or steps < 1 or 1 not in bg.grid:
        return None
    omaps = {sv.omap for sv in bg.savers}
    if len(omaps) != 1:
        return None
    base = next(iter(omaps))
    c = bg.grid.index(1)  # the new grid axis: one block per chunk of the loop
    grid1 = tuple(chunks if k == c else s for k, s in enumerate(bg.grid))
    accs = [o for o in bg.ops if o.kind == "accum"]
    online = any(accum_monoid(o) != SUM for o in accs)
    if online and combine_tiles > 1:
        return None  # a re-gridded combine of running maxima: not offered
    shifts = _shift_tiles(accs)
    lay = _partial_dims(bg, base, lay_first, [s.shape for s in shifts])
    if lay is None:
        return None
    lay, shift_lay = lay[:len(accs)], lay[len(accs):]
    # a post-loop op reading a loop-invariant tile (a residual's iterator, or made of one):
    # the combining kernel has no such tile
    if any(t.acc == 0 for o in bg.ops if o.outputs[0].acc == 1 and o.kind != "accum" for t in o.inputs):
        return None
    imaps2 = [base] * len(accs)
    omap2, grid2 = base, bg.grid
    if combine_tiles > 1:
        cut = _combine_cut(bg, base, lay, c, combine_tiles)
        if cut is None:
            return None
        imaps2, omap2, grid2 = cut

    # tiles of constants only (acc None) that post-loop ops read: the combining kernel
    # computes them again (the first kernel may need them too, in its loop)
    consts: set[Tensor] = set()
    for o in reversed(bg.ops):
        if o.outputs[0].acc == 1 or o.outputs[0] in consts:
            consts.update(t for t in o.inputs if t.acc is None)

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        k1 = BlockGraph(grid1, steps)
        tm: dict[Tensor, Tensor] = {}
        for o in bg.ops:
            if o.kind == "iterator":
                imap = list(o.attrs["imap"])
                if o.attrs["fmap"] is not None:
                    imap[c] = o.attrs["fmap"]
                fmap = o.attrs["fmap"] if steps > 1 else None  # one step per block: no loop left
                tm[o.outputs[0]] = k1.input(rb.get(bg.sources[o.attrs["source"]]), tuple(imap), fmap)
            elif o.kind == "accum" or o.outputs[0].acc != 1:
                replay_op(k1, o, tm)
        # each chunk's partials, and the running max of every shift its rescaled sums used
        saved = [tm[o.outputs[0]] for o in accs] + [k1.accum_max(tm[t]) for t in shifts]
        for t, d in zip(saved, lay + shift_lay):
            om = list(base)
            om[c] = d
            k1.output(t, tuple(om))
        partials = rb.graph.kernel(k1)
        k2 = BlockGraph(grid2, chunks)
        cm: dict[Tensor, Tensor] = {}
        maxima = {t: k2.input(p, base, d) for t, p, d in zip(shifts, partials[len(accs):], shift_lay)}
        for o, d, p, im in zip(accs, lay, partials, imaps2):
            # the combine folds the partials with the accumulator's own monoid: sums add up,
            # running maxima take the max, rescaled sums rescale to the chunks' common max
            tile = k2.input(p, im, d)
            monoid = accum_monoid(o)
            if monoid == RUNNING_MAX:
                cm[o.outputs[0]] = k2.accum_max(tile)
            elif monoid == RESCALED:
                cm[o.outputs[0]] = k2.accum(tile, maxima[o.inputs[1]])
            else:
                cm[o.outputs[0]] = k2.accum(tile)
        for o in bg.ops:
            if o.kind not in ("iterator", "accum") and (o.outputs[0].acc == 1 or o.outputs[0] in consts):
                replay_op(k2, o, cm)
        for sv in bg.savers:
            k2.output(cm[sv.tensor], omap2)
        return rb.graph.kernel(k2)

    try:
        return rebuild(g, replace={(op_id, None): build}, name=g.name)
    except MugraphError:
        return None


def _shift_tiles(accs: list[Op]) -> list[Tensor]:
    """The shift tiles of the rescaled accumulators, in order, once each: a split's chunks
    save each one's running max, which the combine rescales their partial sums by."""
    out: list[Tensor] = []
    for o in accs:
        if accum_monoid(o) == RESCALED and o.inputs[1] not in out:
            out.append(o.inputs[1])
    return out


def _partial_dims(bg: BlockGraph, base: tuple, first: bool = False,
                  extra: Sequence[tuple] = ()) -> Optional[list[int]]:
    """Per accumulator (then per ``extra`` tile shape), the dim along which the chunks'
    partials lie side by side: the last (``first``: the first) dim no grid axis of the
    output splits (None when one has none)."""
    used = {d for d in base if d is not None}
    lay = []
    for shape in [o.outputs[0].shape for o in bg.ops if o.kind == "accum"] + list(extra):
        free = [d for d in range(len(shape)) if d not in used]
        if not free:
            return None
        lay.append(free[0] if first else free[-1])
    return lay


def combine_dims(g: KernelGraph, op_id: int, lay_first: bool = False) -> list[tuple[int, int]]:
    """(output dim, its size in the saved tile) pairs along which :func:`split_loop`'s
    combining kernel of kernel ``op_id`` may be re-gridded.

    The combining kernel accumulates the partials and runs the kernel's post-loop ops, so
    a dim may be cut when every post-loop op is element-wise (the catalog's trait: each
    output element depends on the elements at the same place of its inputs, size-1 dims
    broadcast), no grid axis cuts the dim already, every saved tile has it at the same
    size, and no accumulator lays its chunks along it. Nothing here names an op."""
    op = g.ops[op_id]
    if op.kind != GD:
        return []
    bg: BlockGraph = op.attrs["block"]
    omaps = {sv.omap for sv in bg.savers}
    if len(omaps) != 1:
        return []
    base = next(iter(omaps))
    lay = _partial_dims(bg, base, lay_first)
    return [] if lay is None else _cuttable(bg, base, lay)


def _cuttable(bg: BlockGraph, base: tuple, lay: list[int]) -> list[tuple[int, int]]:
    if not _elementwise_after_loop(bg):
        return []
    used = {d for d in base if d is not None}
    shapes = {tuple(sv.tensor.shape) for sv in bg.savers}
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        return []
    rank = ranks.pop()
    accs = [o.outputs[0] for o in bg.ops if o.kind == "accum"]
    out = []
    for d in range(rank):
        sizes = {s[d] for s in shapes}
        if d in used or len(sizes) != 1:
            continue
        n = sizes.pop()
        if n == 1:
            continue
        ok = True
        for t, ld in zip(accs, lay):
            da = _aligned(t.shape, rank, d)
            size = 1 if da is None else t.shape[da]
            if size not in (1, n) or (size == n and da == ld):
                ok = False
        if ok:
            out.append((d, n))
    return out


def _aligned(shape: tuple, out_rank: int, d: int) -> Optional[int]:
    """The dim of a tile of ``shape`` that broadcasting lines up with dim ``d`` of a result
    of rank ``out_rank`` (None: the tile has no such dim)."""
    k = d - (out_rank - len(shape))
    return k if 0 <= k < len(shape) else None


def _elementwise_after_loop(bg: BlockGraph) -> bool:
    """Every op after the loop (and every constant tile it reads) is element-wise."""
    for o in bg.ops:
        if o.kind in ("iterator", "accum"):
            continue
        if o.outputs[0].acc == 1 or (o.outputs[0].acc is None and not o.inputs):
            d = CATALOG.get(o.kind)
            if d is None or not d.elementwise:
                return False
    return True


def _combine_cut(bg: BlockGraph, base: tuple, lay: list[int], ax: int, tiles: int):
    """(iterator imaps, saver omap, grid) of a combining kernel whose free grid axis ``ax``
    cuts the first dim :func:`combine_dims` allows into ``tiles`` tiles; None if none."""
    shapes = [tuple(sv.tensor.shape) for sv in bg.savers]
    rank = len(shapes[0])
    for d, n in _cuttable(bg, base, lay):
        if n % tiles:
            continue
        imaps = []
        for o in (o for o in bg.ops if o.kind == "accum"):
            da = _aligned(o.outputs[0].shape, rank, d)
            im = list(base)
            if da is not None and o.outputs[0].shape[da] == n:
                im[ax] = da
            imaps.append(tuple(im))
        om = list(base)
        om[ax] = d
        grid = tuple(tiles if k == ax else s for k, s in enumerate(bg.grid))
        return imaps, tuple(om), grid
    return None


#: a split's first kernel keeps the source's loop length (finer steps) only while every
#: loop tile stays at least this long along the looped dim (the tensor cores' minimum)
MIN_STEP_TILE = 16


def fine_steps(bg: BlockGraph, chunks: int) -> bool:
    """Whether a ``chunks``-way split of ``bg``'s loop may keep all ``bg.forloop`` steps per
    chunk, each step's tiles ``chunks`` times shorter along the looped dim: every looped
    iterator's tile divides by ``chunks`` into pieces of at least :data:`MIN_STEP_TILE`."""
    looped = [o for o in bg.ops if o.kind == "iterator" and o.attrs["fmap"] is not None]
    return bool(looped) and all(
        o.outputs[0].shape[o.attrs["fmap"]] % chunks == 0
        and o.outputs[0].shape[o.attrs["fmap"]] // chunks >= MIN_STEP_TILE for o in looped)


def split_variants(g: KernelGraph, sms: int = GPU_SMS) -> list[KernelGraph]:
    """Legal :func:`split_loop` variants of every graph-defined kernel of ``g`` with a loop:
    at the chunk counts :func:`split_chunks` picks for the kernel's grid and loop, each
    with the combining kernel re-gridded where :func:`combine_dims` allows — to the most
    tiles (of at least :data:`MIN_COMBINE_TILE`) that keep it within one wave, the
    partials laid along whichever free dim leaves more to cut — and on the kernel's own grid.

    Each chunk count comes with the source's steps (loop ``F / S``, the step's tiles
    kept) and, where :func:`fine_steps` allows, with the source's loop length (``F``
    steps of tiles ``S`` times shorter). The lowering can merge steps (its ``chunk``
    option) but never cut one, so only the μGraph can offer the shorter step — the
    hand-written split-KV kernels step over 64 keys where a fused norm+attention
    kernel found by composition steps over 256 (qknorm_gqa b=8, its loop tiles
    64 × 256 per block)."""
    out = []
    for op in g.ops:
        if op.kind != GD or op.attrs["block"].forloop < 2:
            continue
        bg: BlockGraph = op.attrs["block"]
        ways = []  # (combine tiles, partials along the first free dim)
        for first in (False, True):
            tiles = 1
            for _, n in combine_dims(g, op.id, first)[:1]:
                while (n % (2 * tiles) == 0 and n // (2 * tiles) >= MIN_COMBINE_TILE
                       and bg.num_blocks * 2 * tiles <= sms):
                    tiles *= 2
            ways.append((tiles, first))
        best = max(ways, key=lambda w: w[0])  # ties: the last free dim (the first entry)
        for s in split_chunks(bg.num_blocks, bg.forloop, sms):
            steps = [bg.forloop // s] + ([bg.forloop] if fine_steps(bg, s) else [])
            for n in steps:
                for t, first in dict.fromkeys((best, (1, False))):
                    h = split_loop(g, op.id, s, t, first, steps=n)
                    if h is not None:
                        out.append(h)
    return out


# ---------------------------------------------------------------------- retiling

#: the fewest elements a retiled block's tile may keep along a dim it cuts
MIN_RETILE = 16
#: the most blocks a retiled kernel may have
MAX_RETILE_BLOCKS = 8192


def retile(g: KernelGraph, op_id: int, grid: tuple, forloop: int) -> Optional[KernelGraph]:
    """Kernel ``op_id`` on ``grid`` with a loop of ``forloop`` steps, its block replayed
    unchanged (None if illegal): every iterator and saver keeps its maps, so each tile is
    cut or joined along the dims the changed axes map. A grid axis partitions independent
    rows, so any size that divides them computes the same function; a loop's steps are
    summed by its accumulators, so a legal step length does too wherever each step's terms
    add up (a sum, a sum rescaled to the running max — the online softmax's value does not
    depend on where its steps cut the keys). The driver verifies the result either way."""
    op = g.ops[op_id]
    if op.kind != GD:
        return None
    bg: BlockGraph = op.attrs["block"]
    if (tuple(grid), forloop) == (tuple(bg.grid), bg.forloop) or (forloop > 1) != (bg.forloop > 1):
        return None

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        k = BlockGraph(tuple(grid), forloop)
        return _replay_block(rb, bg, k, lambda o: k.input(rb.get(bg.sources[o.attrs["source"]]), o.attrs["imap"],
                                                          o.attrs["fmap"]))

    try:
        return rebuild(g, replace={(op_id, None): build}, name=g.name)
    except MugraphError:
        return None


def _cut_dims(bg: BlockGraph, axis: Optional[int]) -> list[int]:
    """The tile extents grid axis ``axis`` (None: the loop) cuts, over every iterator and saver."""
    out = []
    for o in bg.ops:
        if o.kind == "iterator":
            d = o.attrs["fmap"] if axis is None else o.attrs["imap"][axis]
            if d is not None:
                out.append(o.outputs[0].shape[d])
    if axis is not None:
        out += [sv.tensor.shape[sv.omap[axis]] for sv in bg.savers if sv.omap[axis] is not None]
    return out


def fits(g: KernelGraph, smem_budget: Optional[int]) -> bool:
    """Every tile of every graph-defined kernel of ``g`` within ``smem_budget`` bytes, as the
    enumeration bounds each new tile (an accumulator's in fp32); None: no bound. A rewritten
    graph's variants are offered only where this holds (tile, loop and grid variants alike)."""
    if smem_budget is None:
        return True
    for op in (o for k in g.ops if k.kind == GD for o in k.attrs["block"].ops):
        t = op.outputs[0]
        n = 4 if op.kind == "accum" else DTYPES[t.dtype]
        for d in t.shape:
            n *= d
        if n > smem_budget:
            return False
    return True


def tile_variants(g: KernelGraph, smem_budget: Optional[int] = None) -> list[KernelGraph]:
    """:func:`retile` variants of every graph-defined kernel of ``g``: each grid axis of
    more than one block with twice and with half the blocks, each loop with twice and with
    half the steps — where every tile the change cuts keeps at least :data:`MIN_RETILE`
    elements along that dim, the grid at most :data:`MAX_RETILE_BLOCKS` blocks, and (given
    ``smem_budget``) every tile of the new block within it, as the enumeration's are. (A
    loop-free kernel's loop is introduced by :func:`search.loops.loop_variants` instead.)"""
    out = []
    for op in g.ops:
        if op.kind != GD:
            continue
        bg: BlockGraph = op.attrs["block"]
        moves: list[tuple[tuple, int]] = []
        for a, n in enumerate(bg.grid):
            if n < 2:
                continue
            cut = _cut_dims(bg, a)
            if cut and all(x % 2 == 0 and x // 2 >= MIN_RETILE for x in cut) and bg.num_blocks * 2 <= MAX_RETILE_BLOCKS:
                moves.append((tuple(2 * n if k == a else s for k, s in enumerate(bg.grid)), bg.forloop))
            if n % 2 == 0:
                moves.append((tuple(n // 2 if k == a else s for k, s in enumerate(bg.grid)), bg.forloop))
        if bg.forloop > 1:
            cut = _cut_dims(bg, None)
            if cut and all(x % 2 == 0 and x // 2 >= MIN_RETILE for x in cut):
                moves.append((bg.grid, 2 * bg.forloop))
            if bg.forloop % 2 == 0 and bg.forloop > 2:
                moves.append((bg.grid, bg.forloop // 2))
        for grid, forloop in moves:
            h = retile(g, op.id, grid, forloop)
            if h is not None and fits(h, smem_budget):
                out.append(h)
    return out
