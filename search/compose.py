"""Compositional search for programs too deep to enumerate in one piece.

The enumeration's cost grows exponentially with the block ops a kernel needs;
a norm feeding attention needs ~18, far past what a DFS exhausts in minutes.
So, like Mirage for large programs, we cut the program into pieces, search each
piece on its own (small, fast), compose the pieces' μGraphs into one graph of
the whole program, and let :func:`search.rewrite.fuse` merge the kernels again.
A composed or fused graph is proposed only when its fingerprint matches the
*whole* program (cheapest first, one per kernel shape first, within the time:
:func:`search.derive.composed`) and is verified by the driver; the piece
searches only propose.

Where to cut: the cut tensors (piece outputs read by other pieces) are what an
unfused implementation writes to and reads back from device memory, so we
choose the cut of fewest bytes such that every piece has at most ``max_ops``
ops and the pieces form a DAG; ties go to fewer pieces. Contractions that read one
tensor stay in one piece where some cut allows it (the gate and up projections of one
activation, Q, K and V): in two pieces each becomes a kernel looping over that tensor,
and no fusion merges two loops, so the kernel reading it once for both could never be
composed. Programs here have tens of ops, so trying every cut of up to ``max_cut``
tensors is cheap.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

from mugraph.core.ir import DTYPES, BlockGraph, KernelGraph, Program, Tensor
from mugraph.core.ops import is_contraction, is_elementwise
from mugraph.core.rewrite import splice
from mugraph.core.unionfind import UnionFind

from .rewrite import broadcast_map, replay_op, stretches_to


@dataclass
class Piece:
    """A sub-program: ``program`` computes ``outputs`` (tensors of the whole program) from ``inputs``."""

    program: Program
    inputs: list[Tensor]
    outputs: list[Tensor]
    op_ids: list[int]


def _nbytes(t: Tensor) -> int:
    n = DTYPES[t.dtype]
    for s in t.shape:
        n *= s
    return n


def partition(program: Program, max_ops: int, max_cut: int = 3,
              max_inputs: Optional[int] = None) -> Optional[list[Piece]]:
    """The cheapest cut of ``program`` into pieces of at most ``max_ops`` ops and ``max_inputs``
    inputs each (None: no cut needed or none found)."""
    ops = [op for op in program.ops if op.kind != "input"]
    if len(ops) <= max_ops:
        return None
    outs = set(program.outputs)
    consumers: dict[Tensor, list] = {}
    for op in ops:
        for t in op.inputs:
            consumers.setdefault(t, []).append(op)
    # cut points: inner tensors, and outputs the program reads again (an RMSNorm's product
    # that a q and a k projection read and the layer hands on to its v projection). Such an
    # output left inside its readers' piece must be saved by the kernel that contracts it —
    # a kernel looping over its dim saves nothing per step, so that piece has no one-kernel
    # μGraph: LLaMA-3-8B's norm with q and k matched nothing in a complete search
    inner = [op.outputs[0] for op in ops if op.outputs[0] not in outs or consumers.get(op.outputs[0])]
    again = [t for t in inner if t in outs]
    siblings = _sibling_contractions(ops)
    for joined in ([siblings, []] if siblings else [[]]):  # siblings in one piece, if any cut allows it
        best = None
        for k in range(1, max_cut + 1):
            for cut in itertools.combinations(inner, k):
                pieces = _pieces(ops, set(cut), consumers, max_ops, joined)
                if pieces is None:
                    continue
                if max_inputs is not None and any(_n_inputs(program, ids) > max_inputs for ids in pieces):
                    continue
                # the bytes a cut writes and reads back (an output is written anyway), and those
                # of each output read again that stays inside its readers' piece (a kernel
                # contracting it cannot save it: a 2-piece cut of Gemma-2B's norm with its q
                # projection left the product there, and that piece matched nothing)
                cost = (sum(_nbytes(t) for t in cut if t not in outs)
                        + sum(_nbytes(t) for t in again if t not in cut), len(pieces))
                if best is None or cost < best[0]:
                    best = (cost, cut, pieces)
        if best is not None:
            return [_sub_program(program, ids, i) for i, ids in enumerate(best[2])]
    return None


def _unlinked_contractions(program: Program) -> list[tuple]:
    """Pairs of contractions of ``program`` neither of which reads the other's result."""
    ops = [op for op in program.ops if op.kind != "input"]
    made = {t: op for op in ops for t in op.outputs}
    upstream: dict[int, set[int]] = {}
    for op in ops:  # in order: every input's producer comes first
        ups = set()
        for t in op.inputs:
            if t in made:
                ups |= {made[t].id} | upstream[made[t].id]
        upstream[op.id] = ups
    contractions = [op for op in ops if is_contraction(op.kind)]
    return [(a, b) for a, b in itertools.combinations(contractions, 2)
            if a.id not in upstream[b.id] and b.id not in upstream[a.id]]


def separate_contractions(program: Program) -> bool:
    """Whether ``program`` holds two contractions that read no tensor in common and neither
    of which reads the other's result: two loops over different operands, which no kernel
    spells as one and no fusion merges (:func:`search.rewrite.fuse` inlines loop-free kernels
    only) — its μGraphs have a kernel each at least, a depth the enumeration reaches slowly
    however few its ops. Phi-2's output projection beside its MLP's second one (8 ops, their
    biases and the residual): nothing in 16 s of enumeration on an H200's 16 cores; cut into
    pieces, 3-kernel μGraphs in 21 s on 2 CPU cores."""
    return any(not set(a.inputs) & set(b.inputs) for a, b in _unlinked_contractions(program))


def parallel_contractions(program: Program) -> bool:
    """Whether ``program`` holds two contractions neither of which reads the other's result
    (:func:`separate_contractions`, or siblings reading a tensor in common: two projections
    of one activation). One kernel holds such siblings only as a composition fuses them; the
    whole program's enumeration found none (LLaMA-3-8B's RMSNorm with its q and k
    projections: nothing in 8 s on an H200, nothing but composed graphs and their retiles in
    40 s on 2 CPU cores)."""
    return bool(_unlinked_contractions(program))


def _sibling_contractions(ops: list) -> list[tuple[int, int]]:
    """Pairs of contractions (op ids) that read a tensor in common."""
    contractions = [op for op in ops if is_contraction(op.kind)]
    return [(a.id, b.id) for a, b in itertools.combinations(contractions, 2) if set(a.inputs) & set(b.inputs)]


def _n_inputs(program: Program, op_ids: list[int]) -> int:
    made = {program.ops[i].outputs[0] for i in op_ids}
    return len({t for i in op_ids for t in program.ops[i].inputs if t not in made})


def _pieces(ops: list, cut: set, consumers: dict, max_ops: int,
            joined: Sequence[tuple[int, int]] = ()) -> Optional[list[list[int]]]:
    """The pieces (op ids, in a topological order) that cutting at tensors ``cut`` leaves,
    each pair of ops in ``joined`` kept in one piece; None if a piece exceeds ``max_ops``, a
    cut tensor does not cross pieces, or the pieces depend on each other in a cycle."""
    uf = UnionFind(op.id for op in ops)
    for a, b in joined:
        uf.union(a, b)
    for op in ops:
        t = op.outputs[0]
        if t in cut:
            continue
        for c in consumers.get(t, []):
            uf.union(c.id, op.id)
    groups = uf.groups()
    if any(len(g) > max_ops for g in groups.values()):
        return None
    # every cut tensor must cross pieces, and the pieces must form a DAG (topological by min op id)
    of = {i: uf.find(i) for i in uf}
    edges = set()
    for op in ops:
        t = op.outputs[0]
        for c in consumers.get(t, []):
            if of[c.id] != of[op.id]:
                edges.add((of[op.id], of[c.id]))
            elif t in cut:
                return None
    order = _topo(set(groups), edges, groups)
    if len(order) != len(groups):
        return None  # the pieces depend on each other in a cycle
    return [sorted(groups[r]) for r in order]


def _topo(nodes: set, edges: set, groups: dict) -> list:
    """Kahn's order of the pieces, ties by first op (deterministic); shorter than ``nodes`` on a cycle."""
    readers: dict = {}
    waiting = dict.fromkeys(nodes, 0)
    for a, b in edges:
        readers.setdefault(a, []).append(b)
        waiting[b] += 1
    ready = [(min(groups[n]), n) for n in nodes if not waiting[n]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(n)
        for b in readers.get(n, ()):
            waiting[b] -= 1
            if not waiting[b]:
                heapq.heappush(ready, (min(groups[b]), b))
    return out


def _sub_program(program: Program, op_ids: list[int], index: int) -> Piece:
    ids = set(op_ids)
    made = {program.ops[i].outputs[0] for i in ids}
    p = Program(f"{program.name}.piece{index}")
    m: dict[Tensor, Tensor] = {}
    inputs: list[Tensor] = []
    for i in sorted(ids):
        op = program.ops[i]
        for t in op.inputs:
            if t not in made and t not in m:
                m[t] = p.input(_piece_input_name(t), t.shape, t.dtype, fill=t.fill)
                inputs.append(t)
        attrs = dict(op.attrs)
        if not op.inputs:  # a constant keeps its dtype (add_op takes it from the attrs)
            attrs.setdefault("dtype", op.outputs[0].dtype)
        m[op.outputs[0]] = p.add_op(op.kind, [m[t] for t in op.inputs], attrs)
    used_outside = set()
    for op in program.ops:
        if op.id not in ids:
            used_outside.update(t for t in op.inputs if t in made)
    outputs = [program.ops[i].outputs[0] for i in sorted(ids)
               if program.ops[i].outputs[0] in used_outside or program.ops[i].outputs[0] in program.outputs]
    for t in outputs:
        p.output(m[t])
    return Piece(p, inputs, outputs, sorted(ids))


#: the tile a direct element-wise kernel (:func:`pointwise_kernel`) cuts its dims into, at most
POINTWISE_TILE = 256


def pointwise_kernel(program: Program) -> Optional[KernelGraph]:
    """``program`` as one loop-free kernel applying its ops element by element, if every op
    is element-wise (unary, binary, a constant) and its outputs share one shape its inputs
    broadcast to; else None. Up to three dims longer than a tile are cut by the grid.

    Why not search such a piece: its μGraph is this kernel on some tiling, and the search's
    only work would be to find constants and op orders it already has (a GeLU's tail —
    ``x / (1 + exp(−y))``, a constant 1 among its ops — matched nothing in a complete
    search). Its tiling does not matter either: :func:`search.rewrite.fuse_epilogue` runs it
    on its producer's tiles. The composition that holds it is verified like any other."""
    ops = [op for op in program.ops if op.kind != "input"]
    if not ops or not all(is_elementwise(op.kind) for op in ops):
        return None
    shapes = {t.shape for t in program.outputs}
    if len(shapes) != 1 or any(t.op.kind == "input" for t in program.outputs):
        return None
    shape = shapes.pop()
    # an input of lower rank broadcasts from the right, as the ops that read it do (an RMSNorm's
    # weight of shape (K,) times its (1, K) product): it is read on its trailing dims
    lead = {t: len(shape) - len(t.shape) for t in program.inputs}
    if not all(lead[t] >= 0 and stretches_to((1,) * lead[t] + tuple(t.shape), shape) for t in program.inputs):
        return None
    cut = []  # (dim, blocks): the longest dims first, each into tiles of at most POINTWISE_TILE
    for d in sorted(range(len(shape)), key=lambda d: -shape[d])[:3]:
        tile = next((t for t in (POINTWISE_TILE, 128, 64, 32, 16) if shape[d] % t == 0 and shape[d] > t), None)
        if tile is not None:
            cut.append((d, shape[d] // tile))
    grid = tuple(n for _, n in cut) + (1,) * (3 - len(cut))
    omap = tuple([d for d, _ in cut] + [None] * (3 - len(cut)))
    g = KernelGraph(program.name)
    bg = BlockGraph(grid, 1)
    tiles = {t: bg.input(g.input(t.name, t.shape, t.dtype, fill=t.fill), _trailing_map(omap, t.shape, lead[t]))
             for t in program.inputs}
    for op in ops:
        replay_op(bg, op, tiles)
    for t in program.outputs:
        bg.output(bg.accum(tiles[t]), omap)
    for t in g.kernel(bg):
        g.output(t)
    return g


def pointwise_runs(program: Program) -> Optional[KernelGraph]:
    """``program`` with each run of its element-wise ops as one loop-free kernel
    (:func:`pointwise_kernel`) and every other op as it is — a compiler's default fusion —
    or None when no run holds two ops that compute (constants aside).

    Why: where the search finds nothing, the answer was the program op by op, one launch an
    op, and a GeLU written out is ten of them: a Gemma-2B MLP's gated projection over 64 rows
    ran 13 kernels, 71.6 μs against 47.4 for its torch calls (H200). This graph is one more
    candidate, fingerprinted and verified like any other.

    A run is a set of element-wise ops joined through their values, such that the runs and
    the other ops can still run one after another: no path leaves a run and comes back to it,
    directly or through another run (two runs that each feed the other through a sum would
    wait on each other). Ops are taken in the program's order; each joins the runs of its
    element-wise producers when that keeps an order, else the first of them it can join
    alone, else a run of its own. A run :func:`pointwise_kernel` cannot write as one kernel
    (outputs of two shapes) stays op by op."""
    ops = [op for op in program.ops if op.kind != "input"]
    made = {op.outputs[0]: op for op in ops}
    run_of: dict[int, int] = {}
    runs: dict[int, set[int]] = {}
    for op in ops:
        if not is_elementwise(op.kind):
            continue
        near = list(dict.fromkeys(run_of[made[t].id] for t in op.inputs if t in made and made[t].id in run_of))
        for choice in ([near] + [[r] for r in near] if len(near) > 1 else [near]):
            if not choice:
                continue
            members = set().union(*(runs[r] for r in choice)) | {op.id}
            trial = {**run_of, **dict.fromkeys(members, choice[0])}
            if _in_dependency_order(_groups(ops, trial), made, program) is not None:
                for r in choice[1:]:
                    del runs[r]
                runs[choice[0]] = members
                run_of = trial
                break
        else:
            runs[op.id] = {op.id}
            run_of[op.id] = op.id
    # runs of two ops that compute (a constant has no inputs), the other ops one by one
    groups = [sorted(ids) for ids in runs.values() if sum(bool(program.ops[i].inputs) for i in ids) >= 2]
    if not groups:
        return None
    grouped = {i for ids in groups for i in ids}
    pieces, graphs, fused = [], [], 0
    order = _in_dependency_order(groups + [[op.id] for op in ops if op.id not in grouped], made, program)
    assert order is not None, "runs are grown only while the pieces keep an order"
    for ids in order:
        piece = _sub_program(program, ids, len(pieces))
        kernel = pointwise_kernel(piece.program) if len(ids) > 1 else None
        if kernel is None and len(ids) > 1:  # not one kernel: its ops stay one by one
            for i in ids:
                single = _sub_program(program, [i], len(pieces))
                pieces.append(single)
                graphs.append(single.program)
            continue
        fused += kernel is not None
        pieces.append(piece)
        graphs.append(kernel if kernel is not None else piece.program)
    return compose(program, pieces, graphs) if fused else None


def _groups(ops: list, run_of: dict[int, int]) -> list[list[int]]:
    """The ops' ids in groups: one a run (``run_of``: op id → run), one an op outside any."""
    by: dict[int, list[int]] = {}
    for op in ops:
        by.setdefault(run_of.get(op.id, -1 - op.id), []).append(op.id)
    return list(by.values())


def _in_dependency_order(groups: list[list[int]], made: dict, program: Program) -> list[list[int]] | None:
    """``groups`` of op ids in an order where each comes after every group it reads from
    (:func:`_topo`); None when two groups wait on each other."""
    where = {i: g for g, ids in enumerate(groups) for i in ids}
    edges = {(where[made[t].id], g) for g, ids in enumerate(groups) for i in ids
             for t in program.ops[i].inputs if t in made and where[made[t].id] != g}
    order = _topo(set(range(len(groups))), edges, dict(enumerate(groups)))
    return [groups[g] for g in order] if len(order) == len(groups) else None


def _trailing_map(omap: tuple, shape: tuple, lead: int) -> tuple:
    """:func:`~search.rewrite.broadcast_map` for a tensor that lacks the ``lead`` leading dims
    of the tiles ``omap`` writes: a grid axis over one of those dims reads it whole."""
    full = broadcast_map(omap, (1,) * lead + tuple(shape))
    return tuple(None if d is None else d - lead for d in full)


def compose(program: Program, pieces: list[Piece], graphs: list[KernelGraph]) -> KernelGraph:
    """One graph of the whole program: each piece's μGraph spliced in on the tensors its inputs name."""
    g = KernelGraph(program.name)
    m: dict[Tensor, Tensor] = {t: g.input(t.name, t.shape, t.dtype, fill=t.fill) for t in program.inputs}
    for piece, pg in zip(pieces, graphs):
        by_name = {_piece_input_name(t): m[t] for t in piece.inputs}
        pm = splice(g, pg, {t: by_name[t.name] for t in pg.inputs})
        for t, o in zip(piece.outputs, pg.outputs):
            m[t] = pm[o]
    for t in program.outputs:
        g.output(m[t])
    return g


def _piece_input_name(t: Tensor) -> str:
    return t.name if t.op.kind == "input" else f"cut{t.id}"
