"""One evaluator for programs and μGraphs over any :class:`~mugraph.core.algebra.Algebra`.

Block graphs are evaluated vectorized: every tile carries four leading batch axes
``(gx, gy, gz, F)`` — the grid and the loop — of size 1 where it does not vary, so
a whole grid × loop runs as a handful of array ops instead of a Python loop over
blocks. An input iterator is a reshape + permute of its device tensor; an
accumulator sums over the loop axis; an output saver permutes grid axes next to
the dims they tile and reshapes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from .algebra import Algebra, FloatAlgebra
from .errors import ArgumentTypeError, InputError
from .ir import RUNNING_MAX, SUM, BlockGraph, KernelGraph, Op, Tensor, accum_monoid, short
from .limits import MAX_EVAL_ELEMENTS
from .ops import OpDef, get_op
from .sizing import NB, Picks, Slices, chunking, slicing


def evaluate(graph: KernelGraph, inputs: Mapping[str, Any], algebra: Algebra | None = None, *,
             max_elements: int = MAX_EVAL_ELEMENTS, blocks: Mapping[int, Picks] | None = None) -> list:
    """Run ``graph`` (a Program or μGraph) on ``inputs`` (name -> numpy array or torch tensor).

    Returns the outputs in order: numpy arrays, or torch tensors if any input was
    one (float algebras); the algebra's own values otherwise. The default algebra is
    float64 — the numerical reference. Past ``max_elements`` elements in one value (a
    block tile counts once per block and loop iteration) a kernel runs its grid in
    chunks of blocks, and a program its kernel-level values in slices of an index no op
    mixes (:mod:`mugraph.core.sizing`); a graph in which some value would hold more even
    then (an input or output, or one block's tiles over the whole loop) is refused
    before anything is computed: a clear error, not a ``MemoryError`` half-way. An
    algebra of summaries (:attr:`~mugraph.core.algebra.Algebra.per_element` false) runs
    whole at any size.

    ``blocks`` (kernel op id -> :data:`Picks`) runs those graph-defined kernels on
    the chosen grid positions only: their outputs then hold just the elements those
    blocks write (:func:`saved_positions` says which), a fraction of the work — how
    the search compares a candidate with its program on a sample of the output
    before paying for all of it. Only kernels whose outputs nothing else reads may
    be sampled (their partial outputs are not what a reader expects).
    """
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"evaluate: expected a Program or KernelGraph, got {type(graph).__name__}")
    if not isinstance(inputs, Mapping):
        raise ArgumentTypeError(f"evaluate: inputs must be a dict name -> array, got {type(inputs).__name__}")
    if algebra is not None and not isinstance(algebra, Algebra):
        raise ArgumentTypeError(f"evaluate: algebra must be a mugraph Algebra, got {type(algebra).__name__}")
    if type(max_elements) is not int or max_elements < 1:
        raise ArgumentTypeError(f"evaluate: max_elements={short(max_elements)} must be a positive int")
    alg = algebra if algebra is not None else FloatAlgebra("float64")
    sliced = slicing(graph, max_elements) if alg.per_element else None
    chunks = chunking(graph, max_elements, blocks, sliced) if alg.per_element else {}
    as_torch = any(isinstance(v, torch.Tensor) for v in inputs.values())
    env = bind_inputs(graph, inputs, alg)
    if sliced is not None:
        outs = _evaluate_sliced(graph, env, alg, sliced)
        return [alg.output(outs[t], as_torch) for t in graph.outputs]
    last = last_uses(graph)
    for i, op in enumerate(graph.ops):
        if op.kind == "input":
            continue
        args = [env[t] for t in op.inputs]
        if op.kind == "graph_defined":
            picks = None if blocks is None else blocks.get(op.id)
            for t, v in zip(op.outputs, evaluate_block_chunked(op.attrs["block"], args, alg, picks,
                                                                chunks.get(op.id))):
                env[t] = v
        else:
            env[op.outputs[0]] = alg.apply(op.kind, args, op.attrs)
        del args
        _drop_dead(env, op, i, last)
    return [alg.output(env[t], as_torch) for t in graph.outputs]


def last_uses(graph: KernelGraph) -> dict[Tensor, int]:
    """Each value's last reader, by its index in ``graph.ops``; the outputs are read at the
    end (``len(graph.ops)``), so they are never dropped."""
    last: dict[Tensor, int] = {}
    for i, op in enumerate(graph.ops):
        for t in op.inputs:
            last[t] = i
    for t in graph.outputs:
        last[t] = len(graph.ops)
    return last


def _drop_dead(env: dict, op: Op, i: int, last: dict[Tensor, int]) -> None:
    """Forget the values op ``i`` read for the last time (and those nothing reads). Why: a
    program's values at full size are the evaluation's memory — an 8k-token causal prompt's
    scores are 8.6 GB in float64, twice that with their magnitudes — and kept to the end,
    every intermediate of a program held at once: the float check of such a program ran an
    H200 (140 GB) out of memory."""
    for t in (*op.inputs, *op.outputs):
        if last.get(t, -1) <= i and t in env:
            del env[t]


def bind_inputs(graph: KernelGraph, inputs: Mapping[str, Any], alg: Algebra) -> dict[Tensor, Any]:
    """Check names and shapes of ``inputs`` against the graph's and convert them. An input
    with a fill (:mod:`mugraph.core.fills`) the caller leaves out gets its fill's values."""
    names = [t.name for t in graph.inputs]
    filled = {t.name: t.fill.values(t.shape, t.dtype) for t in graph.inputs
              if t.fill is not None and t.name not in inputs}
    inputs = {**inputs, **filled} if filled else inputs
    missing = [n for n in names if n not in inputs]
    extra = [n if isinstance(n, str) and len(n) <= 40 else short(n, 40) for n in inputs if n not in names]
    if missing or extra:
        raise InputError(f"{graph.name}: inputs do not match: missing {missing}, unexpected {extra[:8]}")
    env = {}
    for t in graph.inputs:
        v = inputs[t.name]
        if getattr(v, "shape", None) is None:
            raise InputError(f"{graph.name}: input {t.name!r} is a {type(v).__name__}, not an array "
                             "(pass a numpy array or torch tensor)")
        shape = tuple(v.shape)
        if shape != t.shape:
            raise InputError(f"{graph.name}: input {t.name!r} has shape {shape}, expected {t.shape}")
        env[t] = alg.input(t.name, inputs[t.name], t.shape, t.dtype)
    return env


def _evaluate_sliced(graph: KernelGraph, env: dict, alg: Algebra, sl: Slices) -> dict:
    """The outputs of ``graph`` (kernel-level catalog ops only) from its bound inputs
    ``env``, computed slice by slice of ``sl``'s index and joined along it."""
    parts = []
    last = last_uses(graph)
    for start in range(0, sl.size, sl.step):
        index = list(range(start, min(sl.size, start + sl.step)))
        part = {t: alg.select(v, sl.dims[t], index) if t in sl.dims else v for t, v in env.items()}
        for i, op in enumerate(graph.ops):
            if op.kind == "input":
                continue
            out = op.outputs[0]
            attrs = op.attrs
            if "shape" in attrs and out in sl.dims:  # a constant's shape: one slice of it
                shape = list(attrs["shape"])
                shape[sl.dims[out]] = len(index)
                attrs = {**attrs, "shape": tuple(shape)}
            part[out] = alg.apply(op.kind, [part[t] for t in op.inputs], attrs)
            _drop_dead(part, op, i, last)
        # only the slice's outputs are kept until the slices are joined: slicing bounds the
        # evaluation's memory only if a slice's intermediates go with it
        parts.append({t: part[t] for t in graph.outputs})
        del part
    return {t: alg.concat([p[t] for p in parts], sl.dims[t]) for t in graph.outputs}


def evaluate_block_chunked(block: BlockGraph, sources: list, alg: Algebra, picks: Picks | None = None,
                           chunk: Sequence[int] | None = None) -> list:
    """:func:`evaluate_block` over the grid in chunks of ``chunk[a]`` blocks along each
    axis ``a`` (:func:`~mugraph.core.sizing.block_chunks`; None: all at once), the
    chunks' outputs joined along the dims their axes tile: the values, and the layout,
    of one evaluation."""
    if chunk is None:
        return evaluate_block(block, sources, alg, picks)
    runs = [list(range(g)) if picks is None else list(picks[a]) for a, g in enumerate(block.grid)]
    groups = [[tuple(r[i:i + c]) for i in range(0, len(r), c)] for r, c in zip(runs, chunk)]
    parts = {(i, j, k): evaluate_block(block, sources, alg, (gx, gy, gz))
             for i, gx in enumerate(groups[0]) for j, gy in enumerate(groups[1]) for k, gz in enumerate(groups[2])}

    def joined(s: int, prefix: tuple[int, ...]):
        """Saver ``s``'s value of the chunks under ``prefix``, joined along the next axis."""
        a = len(prefix)
        if a == 3:
            return parts[prefix][s]
        pieces = [joined(s, prefix + (i,)) for i in range(len(groups[a]))]
        return pieces[0] if len(pieces) == 1 else alg.concat(pieces, block.savers[s].omap[a])
    return [joined(s, ()) for s in range(len(block.savers))]


def evaluate_block(block: BlockGraph, sources: list, alg: Algebra, picks: Picks | None = None) -> list:
    """Evaluate a block graph for all blocks and iterations at once; returns one
    device value per output saver. With ``picks`` only those grid positions run
    (every loop iteration of each), and each saver's value holds only what they
    write, laid out as :func:`saved_positions` says."""
    env: dict[Tensor, Any] = {}
    running: dict = {}  # shift tile -> its running maximum over the loop, and its rescale (one per tile)
    for op in block.ops:
        out = op.outputs[0]
        if op.kind == "iterator":
            env[out] = _iterate(block, sources[op.attrs["source"]], op.attrs, alg, picks)
        elif op.kind == "accum":
            env[out] = _accumulate(block, op, env, running, alg)
        else:
            args = [env[t] for t in op.inputs]
            d = get_op(op.kind)
            if d.broadcasts:  # tile dims broadcast right-aligned, after the batch axes
                target = max(t.ndim for t in op.inputs)
                args = [_align(alg, a, t.ndim, target) for a, t in zip(args, op.inputs)]
            elif len(args) > 1:  # tiles varying along different grid/loop axes: broadcast them first
                batch = tuple(max(alg.shape(a)[i] for a in args) for i in range(NB))
                args = [alg.expand(a, batch + alg.shape(a)[NB:]) for a in args]
            env[out] = alg.block_apply(op.kind, args, _batched_attrs(d, op.attrs, args, alg))
    return [alg.to_memory(_save(block, env[sv.tensor], sv, alg, picks)) for sv in block.savers]


def _accumulate(block: BlockGraph, op: Op, env: dict, running: dict, alg: Algebra):
    """An accumulator over the loop axis, by its monoid: ``Σ_i x_i``; ``max_i m_i``; or the
    rescaled ``Σ_i x_i·exp(m_i − M)`` with ``M = max_i m_i`` (docs/design.md §3.4). The
    running maximum of a tile is computed once, so every accumulator rescaled by one shift
    and that shift's :meth:`~mugraph.core.ir.BlockGraph.accum_max` see the same ``M`` —
    in a field test, the same free value."""
    monoid = accum_monoid(op)

    def over_loop(t: Tensor):  # a loop-invariant tile: F copies
        v = env[t]
        s = alg.shape(v)
        return v if s[NB - 1] == block.forloop else alg.expand(v, s[:NB - 1] + (block.forloop,) + s[NB:])

    def maximum(t: Tensor):
        if t not in running:
            running[t] = alg.block_apply("max", [over_loop(t)], {"dim": NB - 1})
        return running[t]

    if monoid == RUNNING_MAX:
        return maximum(op.inputs[0])
    if monoid == SUM:
        return alg.accumulate(over_loop(op.inputs[0]), NB - 1)
    x, m = op.inputs
    key = ("rescale", m)  # one rescale per shift tile, as one running maximum: accumulators rescaled
    if key not in running:  # by one shift multiply by one value (the verifier's bound sees them alike)
        running[key] = alg.block_apply("exp", [alg.block_apply("sub", [over_loop(m), maximum(m)], {})], {})
    rescale = _align(alg, running[key], m.ndim, x.ndim)
    return alg.accumulate(alg.block_apply("mul", [over_loop(x), rescale], {}), NB - 1)


def _align(alg: Algebra, v, ndim: int, target: int):
    """Insert size-1 tile dims after the batch axes so right-aligned broadcasting
    of tiles does not mix tile dims with batch axes."""
    if ndim >= target:
        return v
    s = alg.shape(v)
    return alg.reshape(v, s[:NB] + (1,) * (target - ndim) + s[NB:])


def _batched_attrs(d: OpDef, attrs: dict, args: list, alg: Algebra) -> dict:
    """The op's attributes for values with :data:`NB` leading batch axes, by attribute
    type: a dim moves past them, a shape or per-dim counts get them in front, a
    permutation keeps them in place."""
    out = dict(attrs)
    for a in d.attrs:
        if a.type == "dim":
            out[a.name] = attrs[a.name] + NB
        elif a.type == "shape":
            out[a.name] = (alg.shape(args[0])[:NB] if args else (1,) * NB) + tuple(attrs[a.name])
        elif a.type == "counts":
            out[a.name] = (1,) * NB + tuple(attrs[a.name])
        elif a.type == "perm":
            out[a.name] = tuple(range(NB)) + tuple(NB + p for p in attrs[a.name])
    return out


def _iterate(block: BlockGraph, v, attrs: dict, alg: Algebra, picks: Picks | None = None):
    """The tiles an input iterator hands each block at each iteration, as one value
    of shape (gx|1, gy|1, gz|1, F|1, *tile) — with ``picks``, only the picked
    positions along the grid axes the tile varies on."""
    shape = alg.shape(v)
    imap, fmap, F = attrs["imap"], attrs["fmap"], block.forloop
    split: list[int] = []
    batch_pos: list[int | None] = [None] * NB  # where each batch axis sits in `split`
    tile_pos: list[int] = []
    for d, size in enumerate(shape):
        axis = imap.index(d) if d in imap else None
        if axis is not None:
            batch_pos[axis] = len(split)
            split.append(block.grid[axis])
            size //= block.grid[axis]
        if fmap == d:
            batch_pos[NB - 1] = len(split)
            split.append(F)
            size //= F
        tile_pos.append(len(split))
        split.append(size)
    for i in range(NB):  # batch axes along which this tile does not vary
        if batch_pos[i] is None:
            batch_pos[i] = len(split)
            split.append(1)
    v = alg.permute(alg.reshape(v, split), batch_pos + tile_pos)
    if picks is not None:
        for axis in range(3):  # a tile the same for every block along an axis stays size 1 there
            if imap[axis] is not None and len(picks[axis]) < block.grid[axis]:
                v = alg.select(v, axis, picks[axis])
    return v


def _save(block: BlockGraph, v, saver, alg: Algebra, picks: Picks | None = None):
    """Assemble the tiles of all blocks (or of the picked ones) into the output device tensor."""
    tile = saver.tensor.shape
    s = alg.shape(v)
    grid = tuple(block.grid) if picks is None else tuple(len(p) for p in picks)
    full = grid + (1,) + s[NB:]
    v = alg.expand(alg.reshape(v, s), full)  # replicate along grid axes the tile does not vary on
    order: list[int] = [a for a in range(3) if saver.omap[a] is None] + [NB - 1]
    for d in range(len(tile)):
        if d in saver.omap:
            order.append(saver.omap.index(d))
        order.append(NB + d)
    v = alg.permute(v, order)
    if picks is None:
        return alg.reshape(v, saver.shape)
    return alg.reshape(v, tuple(len(ix) for ix in saved_positions(block, saver, picks)))


def saved_positions(block: BlockGraph, saver, picks: Picks) -> list[list[int]]:
    """Per dim of ``saver``'s device tensor, the indices the picked blocks write, in
    the order :func:`evaluate_block` lays them out: along a dim a grid axis tiles,
    the picked blocks' tiles one after another; along any other dim, all of it."""
    tile = saver.tensor.shape
    out: list[list[int]] = []
    for d, size in enumerate(saver.shape):
        axis = saver.omap.index(d) if d in saver.omap else None
        if axis is None:
            out.append(list(range(size)))
        else:
            out.append([i * tile[d] + t for i in picks[axis] for t in range(tile[d])])
    return out
