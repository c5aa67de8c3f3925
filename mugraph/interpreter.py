"""One evaluator for programs and μGraphs over any :class:`~mugraph.algebra.Algebra`.

Block graphs are evaluated vectorized: every tile carries four leading batch axes
``(gx, gy, gz, F)`` — the grid and the loop — of size 1 where it does not vary, so
a whole grid × loop runs as a handful of array ops instead of a Python loop over
blocks. An input iterator is a reshape + permute of its device tensor; an
accumulator sums over the loop axis; an output saver permutes grid axes next to
the dims they tile and reshapes.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .algebra import Algebra, FloatAlgebra
from .errors import InputError
from .ir import BlockGraph, KernelGraph, Tensor
from .ops import CATALOG

NB = 4  # batch axes of a block tile: grid x, y, z and the loop
ELEMENTWISE = frozenset(n for n, d in CATALOG.items() if d.elementwise)


def evaluate(graph: KernelGraph, inputs: Mapping[str, Any], algebra: Algebra | None = None) -> list:
    """Run ``graph`` (a Program or μGraph) on ``inputs`` (name -> numpy array or torch tensor).

    Returns the outputs in order: numpy arrays, or torch tensors if any input was
    one (float algebras); the algebra's own values otherwise. The default algebra is
    float64 — the numerical reference.
    """
    if not isinstance(graph, KernelGraph):
        raise TypeError(f"evaluate: expected a Program or KernelGraph, got {type(graph).__name__}")
    alg = algebra if algebra is not None else FloatAlgebra("float64")
    as_torch = any(isinstance(v, torch.Tensor) for v in inputs.values())
    env = bind_inputs(graph, inputs, alg)
    for op in graph.ops:
        if op.kind == "input":
            continue
        args = [env[t] for t in op.inputs]
        if op.kind == "graph_defined":
            for t, v in zip(op.outputs, evaluate_block(op.attrs["block"], args, alg)):
                env[t] = v
        else:
            env[op.outputs[0]] = alg.apply(op.kind, args, op.attrs)
    return [alg.output(env[t], as_torch) for t in graph.outputs]


def bind_inputs(graph: KernelGraph, inputs: Mapping[str, Any], alg: Algebra) -> dict[Tensor, Any]:
    """Check names and shapes of ``inputs`` against the graph's and convert them."""
    names = [t.name for t in graph.inputs]
    missing = [n for n in names if n not in inputs]
    extra = [n for n in inputs if n not in names]
    if missing or extra:
        raise InputError(f"{graph.name}: inputs do not match: missing {missing}, unexpected {extra}")
    env = {}
    for t in graph.inputs:
        shape = tuple(getattr(inputs[t.name], "shape", ()))
        if shape != t.shape:
            raise InputError(f"{graph.name}: input {t.name!r} has shape {shape}, expected {t.shape}")
        env[t] = alg.input(t.name, inputs[t.name], t.shape, t.dtype)
    return env


def evaluate_block(block: BlockGraph, sources: list, alg: Algebra) -> list:
    """Evaluate a block graph for all blocks and iterations at once; returns one
    device value per output saver."""
    env: dict[Tensor, Any] = {}
    for op in block.ops:
        out = op.outputs[0]
        if op.kind == "iterator":
            env[out] = _iterate(block, sources[op.attrs["source"]], op.attrs, alg)
        elif op.kind == "accum":
            v = env[op.inputs[0]]
            s = alg.shape(v)
            if s[NB - 1] != block.forloop:  # loop-invariant tile: Σ over F iterations is F copies
                v = alg.expand(v, s[:NB - 1] + (block.forloop,) + s[NB:])
            env[out] = alg.accumulate(v, NB - 1)
        else:
            args = [env[t] for t in op.inputs]
            if op.kind == "concat":  # tiles varying along different grid/loop axes: broadcast them first
                batch = tuple(max(alg.shape(a)[i] for a in args) for i in range(NB))
                args = [alg.expand(a, batch + alg.shape(a)[NB:]) for a in args]
            if op.kind == "matmul" or op.kind in ELEMENTWISE:
                target = max(t.ndim for t in op.inputs) if op.kind == "matmul" else out.ndim
                args = [_align(alg, a, t.ndim, target) for a, t in zip(args, op.inputs)]
            env[out] = alg.apply(op.kind, args, _batched_attrs(op.kind, op.attrs, args, alg))
    return [_save(block, env[sv.tensor], sv, alg) for sv in block.savers]


def _align(alg: Algebra, v, ndim: int, target: int):
    """Insert size-1 tile dims after the batch axes so right-aligned broadcasting
    of tiles does not mix tile dims with batch axes."""
    if ndim >= target:
        return v
    s = alg.shape(v)
    return alg.reshape(v, s[:NB] + (1,) * (target - ndim) + s[NB:])


def _batched_attrs(kind: str, attrs: dict, args: list, alg: Algebra) -> dict:
    if kind in ("sum", "max", "concat"):
        return {**attrs, "dim": attrs["dim"] + NB}
    if kind == "reshape":
        return {**attrs, "shape": alg.shape(args[0])[:NB] + tuple(attrs["shape"])}
    if kind == "repeat":
        return {**attrs, "reps": (1,) * NB + tuple(attrs["reps"])}
    if kind == "const":
        return {**attrs, "shape": (1,) * NB + tuple(attrs["shape"])}
    return attrs


def _iterate(block: BlockGraph, v, attrs: dict, alg: Algebra):
    """The tiles an input iterator hands each block at each iteration, as one value
    of shape (gx|1, gy|1, gz|1, F|1, *tile)."""
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
    v = alg.reshape(v, split)
    return alg.permute(v, batch_pos + tile_pos)


def _save(block: BlockGraph, v, saver, alg: Algebra):
    """Assemble the tiles of all blocks into the output device tensor."""
    tile = saver.tensor.shape
    s = alg.shape(v)
    full = tuple(block.grid) + (1,) + s[NB:]
    v = alg.expand(alg.reshape(v, s), full)  # replicate along grid axes the tile does not vary on
    order: list[int] = [a for a in range(3) if saver.omap[a] is None] + [NB - 1]
    for d in range(len(tile)):
        if d in saver.omap:
            order.append(saver.omap.index(d))
        order.append(NB + d)
    v = alg.permute(v, order)
    return alg.reshape(v, saver.shape)
