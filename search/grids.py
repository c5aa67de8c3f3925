"""Grid introduction: a one-block kernel spread over a grid of blocks.

The retiling's moves (:func:`search.rewrite.tile_variants`) halve or double a grid axis
that is already in use; a kernel that runs as one block along every axis — the whole
computation in one thread block, which a compositional search returns when its piece
searches found that form first (an RMSNorm feeding two projections of a decoder layer,
composed on a CPU: one block looping 256 times over K, priced 20.4 μs where its columns
could be spread over the GPU's SMs) — has no axis to halve or double. This module gives
such a kernel a new grid axis over dims that are independent rows of its work — and a
kernel on a grid whose blocks each re-read more than the grid cuts (:func:`rereads_dominate`),
joined into one block first (:func:`joined`).

Which iterators and savers the new axis cuts is decided by a dim-flow analysis of the
block graph (:func:`grid_assignments`), generic over the catalog's dim maps
(:class:`~mugraph.core.oprules.DimMap`), never over op names or shapes. Given a dim for
some iterators, every tile is classified *invariant* (the same in every block of the new
axis) or *cut along d* (one block's slice along its dim ``d``); a cut dim must stay the
same axis through every op — never the dim the loop steps along (its steps are summed),
never contracted, reduced or moved, never met by an
invariant operand that does not broadcast along it — and every saver must save a tile cut
along some dim, which the new axis then maps (its blocks write disjoint slices). Then each
block computes its slice of the one-block kernel's outputs, exactly. The driver verifies
every variant against the program all the same.
"""

from __future__ import annotations

from typing import Callable, Optional

from mugraph.core.errors import MugraphError
from mugraph.core.ir import BlockGraph, KernelGraph, Op, Tensor
from mugraph.core.ops import CATALOG
from mugraph.core.oprules import dims_elementwise
from mugraph.core.rewrite import GD, Rebuild, rebuild

from .loops import INVARIANT, cut_through, picks, propagate
from .rewrite import MIN_RETILE, _replay_ops, fits

#: block counts offered along the new axis: the finest that keeps every cut tile at least
#: :data:`search.rewrite.MIN_RETILE` long, and that divided by these (the estimate picks)
COARSER = (1, 4, 16)


def _flow(bg: BlockGraph, cuts: dict[int, int]) -> Optional[list[int]]:
    """The dim each saver's tile is cut along when the iterators of ``cuts`` (block op id
    -> dim) are cut by a new grid axis — None if the block's function does not split into
    independent slices that way (the module docstring's rules)."""
    state = propagate(bg, cuts, _op_state)
    if state is None:
        return None
    saved = [state[sv.tensor] for sv in bg.savers]
    if any(s == INVARIANT for s in saved):  # every block would write the same tile to one place
        return None
    return saved  # type: ignore[return-value]


def _op_state(op: Op, ins: list) -> object:
    """A block op's output state from its inputs' (None: not allowed). An accumulator is
    element-wise across the loop's steps (each element its own, its inputs broadcast)."""
    if all(s == INVARIANT for s in ins):
        return INVARIANT
    shapes, out = [t.shape for t in op.inputs], op.outputs[0].shape
    dm = dims_elementwise(shapes, {}, out) if op.kind == "accum" else CATALOG[op.kind].dims(shapes, op.attrs, out)
    cut = {(i, s) for i, s in enumerate(ins) if s != INVARIANT}
    summed = {m for group in dm.contracted for m in group} | set(dm.reduced) | set(dm.moved_in)
    if cut & summed:  # a cut dim summed, folded or moved: blocks would need each other's slices
        return None
    return cut_through(op, dm, ins, cut)


def _free_axis(bg: BlockGraph) -> Optional[int]:
    """The first grid axis of one block (None: all three in use)."""
    return next((a for a, n in enumerate(bg.grid) if n == 1), None)


def grid_assignments(bg: BlockGraph) -> list[tuple[dict[int, int], list[int]]]:
    """Every way a new grid axis can cut ``bg`` into independent slices: (iterator block op
    id -> the dim it cuts, the dim each saver's tile is cut along); empty when ``bg`` has
    no free grid axis or more than :data:`search.loops.MAX_ASSIGNMENTS` choices. A dim another grid axis
    already maps, of an iterator or a saver, is not offered, nor an iterator's looped dim."""
    a = _free_axis(bg)
    if a is None:
        return []
    its = [op for op in bg.ops if op.kind == "iterator"]
    choices = []
    for op in its:
        # neither a dim another axis maps nor the one the loop steps along: the
        # accumulators add the loop's steps up, so that dim is summed, not independent
        taken = {d for d in op.attrs["imap"] if d is not None} | {op.attrs["fmap"]}
        choices.append([None] + [d for d, n in enumerate(op.outputs[0].shape)
                                 if d not in taken and n >= 2 * MIN_RETILE])
    out = []
    for cuts in picks(its, choices):
        saved = _flow(bg, cuts)
        if saved is None:
            continue
        if any(d in {x for x in sv.omap if x is not None} for sv, d in zip(bg.savers, saved)):
            continue
        out.append((cuts, saved))
    return out


def introduce_grid(g: KernelGraph, op_id: int, cuts: dict[int, int], saved: list[int],
                   blocks: int, join: bool = False) -> Optional[KernelGraph]:
    """Kernel ``op_id`` with ``blocks`` blocks along its first free grid axis, which cuts the
    iterators of ``cuts`` (block op id -> dim) and each saver ``i`` along ``saved[i]``; every
    op replayed unchanged (None if the IR rejects the result). ``join``: the kernel's grid
    is joined into one block first (:func:`joined`), the new axis its only one."""
    op = g.ops[op_id]
    if op.kind != GD or blocks < 2:
        return None
    bg: BlockGraph = op.attrs["block"]
    a = 0 if join else _free_axis(bg)
    if a is None:
        return None

    def with_axis(m: tuple, d: Optional[int]) -> tuple:
        return tuple(d if k == a else (None if join else x) for k, x in enumerate(m))

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        grid = tuple(blocks if k == a else (1 if join else n) for k, n in enumerate(bg.grid))
        return rb.graph.kernel(_remapped(bg, grid, lambda o: with_axis(o.attrs["imap"], cuts.get(o.id)),
                                         lambda i, sv: with_axis(sv.omap, saved[i]), rb.get))

    try:
        return rebuild(g, replace={(op_id, None): build}, name=g.name)
    except MugraphError:
        return None


def joined(bg: BlockGraph) -> Optional[BlockGraph]:
    """``bg`` as one block — every grid axis of one block and mapping nothing, the loop and
    every op kept — for :func:`grid_assignments` to analyse: each tile then covers the dims
    the grid had cut. Not a kernel of any graph (its tiles may exceed shared memory until
    :func:`introduce_grid` spreads it again). None where an op does not take the larger
    tiles (a block-level reshape to its old tile's shape)."""
    none = (None,) * len(bg.grid)
    try:
        return _remapped(bg, (1,) * len(bg.grid), lambda o: none, lambda i, sv: none)
    except MugraphError:
        return None


def _remapped(bg: BlockGraph, grid: tuple, imap: Callable[[Op], tuple], omap: Callable[[int, object], tuple],
              source: Callable[[Tensor], Tensor] = lambda t: t) -> BlockGraph:
    """``bg``'s ops replayed in a block graph on ``grid``: each iterator ``o`` reads
    ``source`` of its tensor through ``imap(o)`` (its loop map kept), saver ``i`` writes
    through ``omap(i, saver)``."""
    k = BlockGraph(grid, bg.forloop)
    tm = _replay_ops(bg, k, lambda o: k.input(source(bg.sources[o.attrs["source"]]), imap(o), o.attrs["fmap"]))
    for i, sv in enumerate(bg.savers):
        k.output(tm[sv.tensor], omap(i, sv))
    return k


def _block_counts(bg: BlockGraph, cuts: dict[int, int]) -> list[int]:
    """Blocks offered along the new axis: the finest count (a power of two) that leaves
    every cut tile at least :data:`~search.rewrite.MIN_RETILE` long and divides it, and
    that count divided by :data:`COARSER` (at least 2)."""
    tiles = [bg.ops[i].outputs[0].shape[d] for i, d in cuts.items()]
    n = 1
    while all(t % (2 * n) == 0 and t // (2 * n) >= MIN_RETILE for t in tiles):
        n *= 2
    return sorted({n // c for c in COARSER if n // c >= 2}, reverse=True)


def rereads_dominate(bg: BlockGraph) -> bool:
    """Whether ``bg``'s blocks spend more bytes reading inputs that every block reads whole
    (no grid axis in use cuts them) than reading the inputs the grid cuts: a grid over a few
    rows of activations (eight new tokens, a block each) whose blocks each read a whole
    weight matrix — eight times the weight's bytes, where a grid over the weight's columns
    reads it once."""
    used = [a for a, n in enumerate(bg.grid) if n > 1]
    whole = cut = 0
    for o in bg.ops:
        if o.kind != "iterator":
            continue
        nbytes = bg.sources[o.attrs["source"]].nbytes
        if all(o.attrs["imap"][a] is None for a in used):
            whole += nbytes * (bg.num_blocks - 1)
        else:
            cut += nbytes
    return whole > cut


def grid_variants(g: KernelGraph, smem_budget: Optional[int] = None) -> list[KernelGraph]:
    """Every kernel of ``g`` with a free grid axis spread over blocks: each assignment of
    :func:`grid_assignments` at each count of :func:`_block_counts` — where every tile fits
    ``smem_budget`` (None: no bound), as :func:`search.rewrite.tile_variants`' do.

    A one-block kernel, and a kernel on a grid whose re-reads dominate
    (:func:`rereads_dominate`): that one is first joined into one block
    (:func:`joined`), so the new axis cuts what the old one
    made every block read whole. Retiling alone never gets there: it halves or doubles the
    axes in use, and a grid over eight rows cannot be halved into a grid over columns (a
    decode step's RMSNorm with its q and k projections over 8 new tokens, composed on a
    CPU: one block a row, each reading both 4096-row weights, priced 51 μs; joined and
    spread over the columns, 64 blocks priced 16 μs)."""
    out = []
    for op in g.ops:
        if op.kind != GD:
            continue
        bg: BlockGraph = op.attrs["block"]
        join = bg.num_blocks > 1
        if join:  # a kernel on a grid: retiled, unless its re-reads dominate
            if not rereads_dominate(bg):
                continue
            bg = joined(bg)
            if bg is None:
                continue
        for cuts, saved in grid_assignments(bg):
            for n in _block_counts(bg, cuts):
                h = introduce_grid(g, op.id, cuts, saved, n, join)
                if h is not None and fits(h, smem_budget):
                    out.append(h)
    return out
