"""Loop introduction: a loop-free kernel's contractions spread over the steps of a loop.

The enumeration often finds a kernel first in its loop-free form — each block reads all of
a matmul's contracted dim at once and its accumulators add up one step — because that
form has fewer choices to make. The same kernel with a loop over the contracted dim
streams each block's operands step by step, holds smaller tiles, and lets the lowering
pipeline the loads; for a memory-bound projection that is the form that reaches the copy
floor (a GeLU-gated 2048 → 2 × 16384 projection, H200: 256 blocks × 64 steps ran 33.4 μs,
1.04× its floor, where the loop-free grids the enumeration returned first were priced
38.5–42 μs). :func:`search.rewrite.retile` halves or doubles an *existing* loop but cannot
create one: that is what this module adds.

Which iterators step with the loop is decided by a dim-flow analysis of the block graph
(:func:`loop_assignments`), generic over the catalog's dim maps (:class:`~mugraph.core.
oprules.DimMap`) and Lax classes, never over op names or shapes of a program. Given an
``fmap`` dim for some iterators, every loop-body tile is classified:

* *invariant* — the same at every step (no stepped iterator upstream);
* *cut along d* — one step's slice of the whole tile along its dim ``d``;
* *partial* — one step's term of a sum over the steps: a contraction or an adding
  reduction whose summed dim is cut, or a linear function of partials (a sum of
  partials, a partial scaled or multiplied by an invariant tile, divided by one).

The assignment is kept only where every accumulator (a plain sum) reads a partial, no
cut tile is summed along another dim or crosses a dim that moves, and no cut or partial
tile is read after the loop or saved — then the looped block computes the loop-free
one's function term by term. The driver verifies every variant against the program all
the same: the analysis only spares the verifier proposals that cannot be right.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Optional

from mugraph.core.errors import MugraphError
from mugraph.core.ir import SUM, BlockGraph, KernelGraph, Op, Tensor, accum_monoid
from mugraph.core.ops import CATALOG, adds_up, is_contraction
from mugraph.core.rewrite import GD, Rebuild, rebuild

from .rewrite import _replay_block, fits, replay_op

#: loop-body tile states besides "cut along a dim" (an int)
INVARIANT = "invariant"
PARTIAL = "partial"
#: a tile downstream of an accumulator (computed once, after the loop)
AFTER = "after"

#: the step lengths (elements of the looped dim per step) an introduced loop is offered
#: with: a fine step the lowering can merge (it runs up to 16 steps as one, never cuts one;
#: ``lower.tiles.loop_chunks``), and a coarse one for kernels whose loop it cannot merge
LOOP_STEPS = (32, 128)
#: the most iterator fmap assignments :func:`loop_assignments` tries in one block
MAX_ASSIGNMENTS = 4096
#: coarser grids an introduced loop is offered on: each grid axis's blocks divided by these
#: (a loop's smaller step tiles leave room for more of the other dims per block)
GRID_DIVISORS = (2, 4)


def propagate(bg: BlockGraph, seeds: dict[int, object],
              step: Callable[[Op, list], object]) -> Optional[dict[Tensor, object]]:
    """Every tile's state in ``bg``, in op order: an iterator's from ``seeds`` (block op id ->
    state; :data:`INVARIANT` when absent), any other op's from ``step(op, its inputs' states)``
    — None as soon as a step returns None (the op does not allow those states). The dim-flow
    analyses of this module and of :mod:`search.grids` differ only in their step."""
    state: dict[Tensor, object] = {}
    for op in bg.ops:
        s = seeds.get(op.id, INVARIANT) if op.kind == "iterator" else step(op, [state[t] for t in op.inputs])
        if s is None:
            return None
        state[op.outputs[0]] = s
    return state


def _flow(bg: BlockGraph, fmaps: dict[int, int]) -> bool:
    """Whether ``bg`` with the iterators of ``fmaps`` (block op id -> dim) stepped along
    those dims computes the loop-free block's function term by term (the module docstring's
    rules)."""
    read = {t for op in bg.ops for t in op.inputs}
    if any(bg.ops[i].outputs[0] not in read for i in fmaps):  # a stepped iterator nothing reads
        return False
    state = propagate(bg, fmaps, _loop_step)
    return state is not None and all(state[sv.tensor] in (AFTER, INVARIANT) for sv in bg.savers)


def _loop_step(op: Op, ins: list) -> object:
    """A loop-body op's state, with the loop's accumulators: each reads a partial (a plain
    sum) and what follows it is computed after the loop, from invariant tiles only."""
    if op.kind == "accum":
        return AFTER if accum_monoid(op) == SUM and ins[0] == PARTIAL else None
    if AFTER in ins:  # only invariant tiles may be read after the loop
        return AFTER if all(s in (AFTER, INVARIANT) for s in ins) else None
    return _op_state(op, ins)


def _op_state(op: Op, ins: list) -> object:
    """The state of a loop-body op's output from its inputs' states (None: not allowed)."""
    if all(s == INVARIANT for s in ins):
        return INVARIANT
    d = CATALOG[op.kind]
    if PARTIAL in ins:
        if any(isinstance(s, int) for s in ins):
            return None
        partial = [i for i, s in enumerate(ins) if s == PARTIAL]
        if d.lax == "linear":  # a sum of partials is one; a partial plus a constant tile is not
            return PARTIAL if len(partial) == len(ins) else None
        if d.lax == "multilinear":  # linear in each input: exactly one partial factor
            return PARTIAL if len(partial) == 1 and len(ins) > 1 else None
        if d.lax == "division":  # linear in the numerator
            return PARTIAL if partial == [0] else None
        return None
    dm = d.dims([t.shape for t in op.inputs], op.attrs, op.outputs[0].shape)
    cut = {(i, s) for i, s in enumerate(ins) if isinstance(s, int)}
    for group in dm.contracted:
        if any(m in cut for m in group):
            # every operand's contracted dim steps together, and nothing else is cut
            return PARTIAL if set(group) == cut else None
    for i, dim in dm.reduced:
        if (i, dim) in cut:
            return PARTIAL if adds_up(op.kind) and cut == {(i, dim)} else None
    return cut_through(op, dm, ins, cut)


def cut_through(op: Op, dm, ins: list, cut: set[tuple[int, int]]) -> Optional[int]:
    """The output dim that op ``op``'s cut input dims (``cut``: (input, dim) pairs; ``ins``:
    each input's state, :data:`INVARIANT` or its cut dim) stay as one axis in (its dim map
    ``dm``'s "same" entries), or None: a cut dim that moves (concat's dim, a reshape) is not
    one slice any more, two cut dims must meet in one output dim, and an invariant operand
    along that dim must broadcast (size 1). Shared by :mod:`search.grids`."""
    outs = set()
    for i, s in cut:
        o = [od for (j, idim, od) in dm.same if j == i and idim == s]
        if not o:
            return None
        outs.add(o[0])
    if len(outs) != 1:
        return None
    o = outs.pop()
    for j, idim, od in dm.same:
        if od == o and ins[j] == INVARIANT and op.inputs[j].shape[idim] != 1:
            return None
    return o


def loop_assignments(bg: BlockGraph) -> list[dict[int, int]]:
    """Every choice of iterators to step (block op id -> the dim each steps along) under
    which the loop-free block ``bg`` keeps its function with a loop (:func:`_flow`); empty
    if ``bg`` already loops, accumulates anything but plain sums, or has more choices than
    :data:`MAX_ASSIGNMENTS`."""
    if bg.forloop != 1 or any(op.kind == "accum" and accum_monoid(op) != SUM for op in bg.ops):
        return []
    its = [op for op in bg.ops if op.kind == "iterator"]
    choices = [[None] + [d for d, n in enumerate(op.outputs[0].shape) if n >= 2 * min(LOOP_STEPS)] for op in its]
    return [fmaps for fmaps in picks(its, choices) if _flow(bg, fmaps)]


def picks(its: list[Op], choices: list[list[Optional[int]]]) -> list[dict[int, int]]:
    """Every non-empty choice of a dim for some of the iterators ``its`` (``choices[i]``:
    iterator ``i``'s dims, None among them for "not chosen") as block op id -> dim; none at
    all when there are more than :data:`MAX_ASSIGNMENTS` (a block too wide to analyze whole).
    Shared by :mod:`search.grids`."""
    if math.prod(len(c) for c in choices) > MAX_ASSIGNMENTS:
        return []
    out = []
    for pick in itertools.product(*choices):
        chosen = {op.id: d for op, d in zip(its, pick) if d is not None}
        if chosen:
            out.append(chosen)
    return out


def introduce_loop(g: KernelGraph, op_id: int, fmaps: dict[int, int], forloop: int,
                   grid: Optional[tuple] = None) -> Optional[KernelGraph]:
    """Kernel ``op_id`` (loop-free) with a loop of ``forloop`` steps, the iterators of
    ``fmaps`` (block op id -> dim) stepping along their dims, on ``grid`` (default its own);
    every other op replayed unchanged (None if the IR rejects the result)."""
    op = g.ops[op_id]
    if op.kind != GD or forloop < 2 or op.attrs["block"].forloop != 1:
        return None
    bg: BlockGraph = op.attrs["block"]

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        k = BlockGraph(tuple(grid or bg.grid), forloop)
        return _replay_block(rb, bg, k, lambda o: k.input(rb.get(bg.sources[o.attrs["source"]]), o.attrs["imap"],
                                                          fmaps.get(o.id)))

    try:
        return rebuild(g, replace={(op_id, None): build}, name=g.name)
    except MugraphError:
        return None


def _grids(bg: BlockGraph) -> list[tuple]:
    """``bg``'s grid and the coarser ones :data:`GRID_DIVISORS` give (one axis at a time)."""
    out = [tuple(bg.grid)]
    for a, n in enumerate(bg.grid):
        for q in GRID_DIVISORS:
            if n % q == 0 and n // q >= 1 and n > 1:
                out.append(tuple(n // q if k == a else s for k, s in enumerate(bg.grid)))
    return out


def _hoistable(bg: BlockGraph) -> dict[int, tuple[int, int]]:
    """The sums of two terms (ops the catalog calls linear: ``add``, ``sub``) of loop-free ``bg``
    read only by a sum accumulator, one term with a contraction upstream and the other without:
    op id -> (the summed term's index, the addend's)."""
    # per tile, whether a contraction is upstream of it (the module's dim-flow walk, in op order)
    contracted = propagate(bg, {op.id: False for op in bg.ops if op.kind == "iterator"},
                           lambda op, ins: is_contraction(op.kind) or any(ins))
    cons = bg.consumers()
    out = {}
    for acc in bg.ops:
        if acc.kind != "accum" or accum_monoid(acc) != SUM:
            continue
        a = acc.inputs[0].op
        d = CATALOG.get(a.kind)  # (an accumulator may read an iterator's tile: no catalog op)
        if d is None or d.lax != "linear" or len(a.inputs) != 2 or len(cons[a.outputs[0]]) != 1:
            continue
        summed = [contracted[t] for t in a.inputs]
        if summed.count(True) == 1:
            p = summed.index(True)
            out[a.id] = (p, 1 - p)
    return out


def hoist_addends(g: KernelGraph, op_id: int) -> Optional[KernelGraph]:
    """Loop-free kernel ``op_id`` with each accumulator of a sum ``x + c`` — ``x`` a
    product's, ``c`` free of any (a bias) — written ``accum(x) + c``; None where there is
    none (or the IR rejects the result).

    Why: over one step an accumulator is its input, and the enumeration spells such a sum
    inside it (a loop-free block reads every tile in its loop body). Both forms compute the
    same, but only the hoisted one can take a loop — a loop sums ``x`` over its steps, and
    ``c`` once. Phi-2's ``fc1`` with its bias and the GeLU's first halving was found only
    loop-free (two outputs: 24.2 μs against 17.2 for its torch ops, H200) and no loop could
    be introduced into it."""
    op = g.ops[op_id]
    if op.kind != GD or op.attrs["block"].forloop != 1:
        return None
    bg: BlockGraph = op.attrs["block"]
    moves = _hoistable(bg)
    if not moves:
        return None

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        nb = BlockGraph(tuple(bg.grid), 1)
        tm: dict[Tensor, Tensor] = {}
        for o in bg.ops:
            if o.kind == "iterator":
                tm[o.outputs[0]] = nb.input(rb.get(bg.sources[o.attrs["source"]]), o.attrs["imap"], None)
            elif o.id in moves:
                continue  # replayed after the accumulator that reads it
            elif o.kind == "accum" and o.inputs[0].op.id in moves:
                a = o.inputs[0].op
                p, c = moves[a.id]
                ins = [None, None]
                ins[p] = nb.accum_like(o, [tm[a.inputs[p]]])
                ins[c] = tm[a.inputs[c]]
                tm[o.outputs[0]] = nb.add_op(a.kind, ins, dict(a.attrs))
            else:
                replay_op(nb, o, tm)
        for sv in bg.savers:
            nb.output(tm[sv.tensor], sv.omap)
        return rb.graph.kernel(nb)

    try:
        return rebuild(g, replace={(op_id, None): build}, name=g.name)
    except MugraphError:
        return None


def loop_variants(g: KernelGraph, smem_budget: Optional[int] = None) -> list[KernelGraph]:
    """Every loop-free kernel of ``g`` with a loop introduced (its sums' addends moved past
    the accumulators first, :func:`hoist_addends`): each assignment of
    :func:`loop_assignments`, each step length of :data:`LOOP_STEPS` that divides every
    stepped tile (the loop of at least two steps), on the kernel's grid and the coarser
    ones of :func:`_grids` — where every tile fits ``smem_budget`` (None: no bound), as
    :func:`search.rewrite.tile_variants`' do."""
    out = []
    for op_id in [op.id for op in g.ops if op.kind == GD]:
        # the loop goes into the form whose sums can take one
        base = hoist_addends(g, op_id) or g
        bg: BlockGraph = base.ops[op_id].attrs["block"]
        for fmaps in loop_assignments(bg):
            for grid in _grids(bg):
                # each stepped tile's length on this grid, before the loop cuts it
                whole = [bg.ops[i].outputs[0].shape[d] * _grid_scale(bg, bg.ops[i], grid, d) for i, d in fmaps.items()]
                for step in LOOP_STEPS:
                    if any(w % step for w in whole) or len({w // step for w in whole}) != 1 or whole[0] // step < 2:
                        continue
                    h = introduce_loop(base, op_id, fmaps, whole[0] // step, grid)
                    if h is not None and fits(h, smem_budget):
                        out.append(h)
    return out


def _grid_scale(bg: BlockGraph, it: Op, grid: tuple, dim: int) -> int:
    """How many times longer iterator ``it``'s tile is along ``dim`` on ``grid`` than on
    ``bg``'s own grid (a coarser grid axis mapped to that dim gives each block more of it)."""
    scale = 1
    for a, d in enumerate(it.attrs["imap"]):
        if d == dim and grid[a] != bg.grid[a]:
            scale *= bg.grid[a] // grid[a]
    return scale
