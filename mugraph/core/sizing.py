"""How an evaluation fits in memory (docs/design.md §2.10): the most elements a value of
:func:`~mugraph.core.interpreter.evaluate` holds, and, past ``max_elements``, how it runs
instead — a kernel's grid in chunks of blocks (:func:`block_chunks`), a program's
kernel-level values in slices of an index no op mixes (:func:`slicing`) — or the one-line
error naming the value that fits neither way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from .errors import ResourceError
from .ir import BlockGraph, KernelGraph, Tensor
from .ops import dim_map
from .unionfind import UnionFind

NB = 4  # batch axes of a block tile in the evaluator: grid x, y, z and the loop
#: grid positions to run, per grid axis (x, y, z): the block indices along that axis
Picks = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def largest_value(graph: KernelGraph) -> tuple[int, str]:
    """The most elements one value of :func:`~mugraph.core.interpreter.evaluate` holds
    when it runs every grid whole, and which: a kernel tensor holds its own elements; a
    block tile holds its elements once per grid position and loop iteration along which
    it varies (the vectorized evaluation's batch axes), and an accumulator's input is
    summed over all loop iterations."""
    worst, where = 0, ""
    for op in graph.ops:
        for t in op.outputs:
            if t.numel > worst:
                worst, where = t.numel, f"{t.label()} {t.shape}"
        if op.kind == "graph_defined":
            n, w = block_largest(op.attrs["block"], op.attrs["block"].grid)
            if n > worst:
                worst, where = n, f"kernel#{op.id}/{w}"
    return worst, where


def block_largest(block: BlockGraph, positions: Sequence[int]) -> tuple[int, str]:
    """The most elements one tile value of :func:`~mugraph.core.interpreter.evaluate_block`
    holds when it runs ``positions[a]`` blocks along each grid axis ``a`` (every loop
    iteration), and which."""
    worst, where = 0, ""
    batch: dict[Tensor, tuple[int, ...]] = {}
    for bop in block.ops:
        out = bop.outputs[0]
        if bop.kind == "iterator":
            imap, fmap = bop.attrs["imap"], bop.attrs["fmap"]
            b = tuple(g if d is not None else 1 for g, d in zip(positions, imap))
            b += (block.forloop if fmap is not None else 1,)
            n = math.prod(b) * out.numel
        elif bop.kind == "accum":
            src = batch[bop.inputs[0]]
            b = src[:NB - 1] + (1,)
            n = math.prod(src[:NB - 1]) * block.forloop * out.numel
        else:
            ins = [batch[t] for t in bop.inputs]
            b = tuple(max(x) for x in zip(*ins)) if ins else (1,) * NB
            n = math.prod(b) * out.numel
        batch[out] = b
        if n > worst:
            worst, where = n, f"{out.label()} {out.shape} x batch {b}"
    return worst, where


def _chunkable(block: BlockGraph) -> list[int]:
    """The grid axes every saver maps to an output dim: along them, chunks of blocks
    write disjoint slices of each output."""
    return [a for a in range(3) if all(sv.omap[a] is not None for sv in block.savers)]


def block_chunks(block: BlockGraph, positions: Sequence[int], max_elements: int) -> tuple[int, ...] | None:
    """Blocks per chunk along each grid axis such that no tile value of one chunk holds
    more than ``max_elements`` elements: ``positions`` (the blocks to run per axis) halved,
    the longest :func:`_chunkable` axis first. None when even one block along each such
    axis is too large (the loop is never split: its accumulators would need their
    partial results combined). A 32-head, 2,048-row prompt attention with 128×128 tiles
    holds 2^29 elements in a score tile over its 32×16 grid and 64 loop steps, twice the
    limit; in chunks of 16 heads it fits."""
    chunk = list(positions)
    axes = _chunkable(block)
    while block_largest(block, chunk)[0] > max_elements:
        longer = [a for a in axes if chunk[a] > 1]
        if not longer:
            return None
        a = max(longer, key=lambda a: chunk[a])
        chunk[a] = (chunk[a] + 1) // 2
    return tuple(chunk)


def chunking(graph: KernelGraph, max_elements: int, blocks: Mapping[int, Picks] | None = None,
             sliced: Slices | None = None) -> dict[int, tuple[int, ...]]:
    """:func:`block_chunks` of each graph-defined kernel too large to run whole (kernel op
    id -> blocks per chunk); raises :class:`TooLarge`, naming the value, when some
    value would not fit even so (a kernel-level value: in one slice of ``sliced``, when
    the graph runs in slices)."""
    out: dict[int, tuple[int, ...]] = {}
    whole = {*graph.inputs, *graph.outputs}  # held whole however the rest is sliced
    for op in graph.ops:
        for t in op.outputs:
            n = t.numel if sliced is None or t in whole else sliced.elements(t)
            if n > max_elements:
                raise TooLarge(graph, f"{t.label()} {t.shape}" + (" (in slices)" if n < t.numel else ""), n,
                               max_elements)
        if op.kind != "graph_defined":
            continue
        block: BlockGraph = op.attrs["block"]
        picks = None if blocks is None else blocks.get(op.id)
        positions = tuple(block.grid) if picks is None else tuple(len(p) for p in picks)
        if block_largest(block, positions)[0] <= max_elements:
            continue
        chunk = block_chunks(block, positions, max_elements)
        if chunk is None:
            axes = _chunkable(block)
            n, where = block_largest(block, [1 if a in axes else g for a, g in enumerate(positions)])
            raise TooLarge(graph, f"kernel#{op.id}/{where} (in chunks of one block)", n, max_elements)
        out[op.id] = chunk
    return out


@dataclass(frozen=True)
class Slices:
    """How :func:`~mugraph.core.interpreter.evaluate` runs a graph whose kernel-level
    values are too large to hold whole: one slice of an index no op mixes after another
    (:func:`parallel_indices`). ``dims`` maps each tensor holding the index to its dim of
    it, ``size`` is the index's length and ``step`` one slice's."""

    dims: dict
    size: int
    step: int

    def elements(self, t: Tensor) -> int:
        """The elements ``t`` holds in one slice (all of them when it does not hold the index)."""
        return t.numel // self.size * self.step if t in self.dims else t.numel


def parallel_indices(graph: KernelGraph) -> list[tuple[dict[Tensor, int], int]]:
    """The indices of ``graph`` that no op mixes — the heads or query rows of an attention
    program, the rows of a normalization — each as (tensor -> its dim of that index, the
    index's length), those every output holds; none when the graph has graph-defined
    kernels (their grids are chunked instead: :func:`block_chunks`).

    An index is a class of dims that ops line up as one axis (``DimMap.same``; a broadcast
    size-1 dim is not one). It is mixed where an op contracts, reduces or moves one of its
    dims, or where one tensor holds it twice. Along an unmixed index, a slice of the
    inputs gives the same slice of every value, so slice after slice computes the graph."""
    if any(op.kind == "graph_defined" for op in graph.ops):
        return []
    uf: UnionFind[tuple[int, int]] = UnionFind()
    mixed: list[tuple[int, int]] = []
    for op in graph.ops:
        for t in op.outputs:
            for d, s in enumerate(t.shape):
                if s > 1:
                    uf.add((t.id, d))
        if op.kind == "input":
            continue
        out, ins = op.outputs[0], op.inputs
        dm = dim_map(op.kind, [t.shape for t in ins], op.attrs, out.shape)
        for i, dx, do in dm.same:
            if ins[i].shape[dx] > 1 and out.shape[do] > 1:
                uf.union((ins[i].id, dx), (out.id, do))
        pairs = [p for group in dm.contracted for p in group] + list(dm.reduced) + list(dm.moved_in)
        mixed += [(ins[i].id, d) for i, d in pairs if ins[i].shape[d] > 1]
        mixed += [(out.id, d) for d in dm.moved_out if out.shape[d] > 1]
    bad = {uf.find(k) for k in mixed}
    held: dict[Tensor, dict[tuple[int, int], int]] = {}  # tensor -> index root -> its dim
    for op in graph.ops:
        for t in op.outputs:
            roots = [uf.find((t.id, d)) for d, s in enumerate(t.shape) if s > 1]
            bad.update(r for r in roots if roots.count(r) > 1)
            held[t] = {uf.find((t.id, d)): d for d, s in enumerate(t.shape) if s > 1}
    common = set.intersection(*(set(held[t]) for t in graph.outputs)) - bad if graph.outputs else set()
    out = []
    for r in sorted(common):
        t = next(t for t in graph.outputs if r in held[t])
        out.append(({t: ds[r] for t, ds in held.items() if r in ds}, t.shape[held[t][r]]))
    return out


def slicing(graph: KernelGraph, max_elements: int) -> Slices | None:
    """The slices :func:`~mugraph.core.interpreter.evaluate` runs ``graph`` in: None when
    every kernel-level value fits whole, or when no :func:`parallel_indices` index lets it
    (then :func:`chunking` names the value that does not fit). Of the indices, the one whose slices of length 1
    hold the least (the longest on a tie: a value that does not hold an index is computed
    whole in every slice); its slices halved until every value of one fits."""
    if max(t.numel for op in graph.ops for t in op.outputs) <= max_elements:
        return None
    found = parallel_indices(graph)
    if not found:
        return None
    dims, size = min(found, key=lambda f: (_sliced_largest(graph, Slices(*f, step=1)), -f[1]))
    sl = Slices(dims, size, size)
    while sl.step > 1 and _sliced_largest(graph, sl) > max_elements:
        sl = Slices(dims, size, (sl.step + 1) // 2)
    return sl if sl.step < size else None


def _sliced_largest(graph: KernelGraph, sl: Slices) -> int:
    """The most elements one intermediate value holds in one slice of ``sl`` (inputs and
    outputs are held whole: :func:`chunking` bounds them)."""
    whole = {*graph.inputs, *graph.outputs}
    return max((sl.elements(t) for op in graph.ops for t in op.outputs if t not in whole), default=0)


class TooLarge(ResourceError):
    """A value of ``graph`` that would hold ``n`` elements > ``max_elements`` even in chunks
    or slices; ``where`` names it. Its fields let a caller say so in its own words."""

    def __init__(self, graph: KernelGraph, where: str, n: int, max_elements: int) -> None:
        self.where, self.n, self.max_elements = where, n, max_elements
        super().__init__(f"evaluate: {graph.name}: {self.clause} (mugraph.core.limits.MAX_EVAL_ELEMENTS); "
                         "evaluate smaller shapes or raise the limit")

    @property
    def clause(self) -> str:
        return f"{self.where} would hold {self.n} elements > max_elements={self.max_elements}"


def too_large(graph: KernelGraph, max_elements: int) -> TooLarge | None:
    """The value of ``graph`` that its evaluation cannot hold within ``max_elements`` even in
    chunks of blocks or slices (the verifier and the float check evaluate it at its shapes),
    or None when it fits."""
    try:
        chunking(graph, max_elements, sliced=slicing(graph, max_elements))
    except TooLarge as e:
        return e
    return None

