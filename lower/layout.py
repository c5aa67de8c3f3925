"""Layout selection for device tensors, as a 0-1 integer linear program.

Graph semantics never fix strides (docs/design.md §2.1), so for every device tensor that the
lowering owns — an intermediate written by a graph-defined kernel — we choose which
dim is contiguous. Kernel-graph inputs and outputs are the user's and stay
row-major; tensors produced by pre-defined (torch) ops are row-major because torch
makes them so.

Model
-----
Variables: one boolean ``x[T, d]`` per device tensor ``T`` and dim ``d`` with
``T.shape[d] > 1`` (or the last dim, when all are 1): "``d`` is the innermost
(stride-1) dim; the other dims keep their row-major order outside it".

Constraints (linear):

* ``Σ_d x[T, d] = 1`` for every tensor (exactly one innermost dim);
* ``x[T, last] = 1`` for user-visible tensors and torch-produced ones (fixed) — except
  inputs the caller hands in with other strides (``input_strides``: a transposed weight
  or a slice passed as a view, docs/design.md §10.3), whose strides are taken as given;
* a permute (a torch view, :mod:`lower.torch_ops`) is no variable: its strides are
  its input's, permuted, so a kernel reading it loads through them — the transpose
  is folded into the load's pointer arithmetic and no copy is made (unless it is a
  graph output, which the runtime writes row-major); a slice likewise: its input's
  strides (the sliced dim's times the step), its offset in the view's pointer;

Cost (linear in ``x``), summed over every access of ``T``: each output saver
that writes it and each input iterator that reads it, weighted by how often it
happens (programs × loop iterations, 1 for hoisted loads):

* **coalescing** — 32-byte sectors the access touches:
  ``numel(tile) / tile[d] · ceil(tile[d] · bytes / 32)`` when ``d`` is innermost,
  i.e. a tile whose contiguous run is short wastes most of every sector;
* **tl.dot operand order** — 1/16 of that again when an iterator feeding ``tl.dot``
  as the left operand has m innermost, or as the right operand has k innermost
  (the tensor-core path then transposes in shared memory);
* **reductions across the contiguous dim** — 1/32 of it when the tile is summed
  along its innermost dim (a cross-thread shuffle instead of a per-thread add).

The objective is minimized exactly with ``z3.Optimize``. With these costs the
problem separates per tensor, so when Z3 is not installed (e.g. on the GPU image)
:func:`solve` minimizes each tensor's cost by enumeration, which is the same
optimum; :attr:`LayoutPlan.solver` records which one ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from mugraph.core.errors import InputError
from mugraph.core.ir import KernelGraph, Tensor
from mugraph.core.ops import is_elementwise, reduction, reorders, selects

from .plan import plan


@dataclass
class LayoutPlan:
    """Chosen innermost dim and strides for every device tensor of a kernel graph."""

    inner: dict[int, int]                    # tensor id -> innermost dim
    strides: dict[int, tuple[int, ...]]      # tensor id -> strides (elements)
    cost: dict[int, dict[int, float]] = field(default_factory=dict)  # free tensors' cost table
    solver: str = "fixed"
    objective: float = 0.0


def strides_for(shape: tuple[int, ...], inner: int) -> tuple[int, ...]:
    order = [d for d in range(len(shape)) if d != inner] + [inner]  # outermost … innermost
    st = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        st[d] = acc
        acc *= shape[d]
    return tuple(st)


def check_strides(t: Tensor, strides) -> tuple[int, ...]:
    """``strides`` as a tuple for graph input or output ``t``: one non-negative int per
    dim, no two elements at one address (a stride-0 broadcast view is refused: the
    kernels could read it, but nothing could be copied into that layout when a call's
    tensor differs, nor written to it)."""
    where = f"input_strides[{t.name!r}]" if t.op.kind == "input" else f"output_strides ({t.label()})"
    st = tuple(strides) if isinstance(strides, (tuple, list)) else None
    if st is None or len(st) != t.ndim or any(type(s) is not int or s < 0 for s in st):
        raise InputError(f"{where}={strides!r}: one int >= 0 per dim of {t.shape}")
    if overlapping(t.shape, st):
        raise InputError(f"{where}={st}: elements of {t.shape} would overlap")
    return st


def overlapping(shape, strides) -> bool:
    """Whether a tensor of ``shape`` laid out with ``strides`` may put two elements at one
    address: sorted by stride, some dim's stride does not cover the dims inside it."""
    span = 1
    for d in sorted((d for d in range(len(shape)) if shape[d] > 1), key=lambda d: strides[d]):
        if strides[d] < span:
            return True
        span = strides[d] * shape[d]
    return False


def loaded_fast_dim(t: Tensor, source_strides: list[tuple[int, ...]]) -> int | None:
    """The dim of block tile ``t`` along which its elements lie next to each other in the
    memory they were loaded from: the stride-1 dim of its iterator's source
    (``source_strides[i]``: the strides of the block's source ``i``), through the permutes
    and one-input element-wise ops between the load and ``t``; ``None`` when ``t`` is made
    otherwise or its source has no single stride-1 dim longer than 1."""
    op = t.op
    if op.kind == "iterator":
        st = source_strides[op.attrs["source"]]
        fast = [d for d, s in enumerate(st) if s == 1 and t.shape[d] > 1]
        return fast[0] if len(fast) == 1 else None
    if reorders(op.kind):  # dim o of the permute is dim perm[o] of its input
        d = loaded_fast_dim(op.inputs[0], source_strides)
        return None if d is None else list(op.attrs["perm"]).index(d)
    if len(op.inputs) == 1 and is_elementwise(op.kind) and op.inputs[0].shape == t.shape:
        return loaded_fast_dim(op.inputs[0], source_strides)
    return None


def k_major(b: Tensor, source_strides: list[tuple[int, ...]]) -> bool:
    """Whether ``b``, a matmul's right operand (.., k, n), lies k-major in the memory it
    was loaded from — a key-major KV cache read as Kᵀ for ``q @ k.transpose(-1, -2)``."""
    return loaded_fast_dim(b, source_strides) == b.ndim - 2


def _sectors(tile: tuple[int, ...], d: int, esize: int) -> float:
    n = math.prod(tile)
    return n / tile[d] * math.ceil(tile[d] * esize / 32)


def access_costs(graph: KernelGraph) -> dict[int, dict[int, float]]:
    """Cost table ``T.id -> {innermost dim: cost}`` for the tensors the lowering may lay out."""
    fixed = {t.id for t in graph.inputs} | {t.id for t in graph.outputs}
    for op in graph.ops:
        if op.kind not in ("input", "graph_defined"):
            fixed |= {t.id for t in op.outputs}
    tensors = {t.id: t for t in graph.tensors}
    costs: dict[int, dict[int, float]] = {}
    for t in graph.tensors:
        if t.id not in fixed:
            dims = [d for d in range(t.ndim) if t.shape[d] > 1] or [t.ndim - 1]
            costs[t.id] = {d: 0.0 for d in dims}

    def add(t: Tensor, tile: tuple[int, ...], times: int, dot_side: str | None, reduced: set[int]) -> None:
        if t.id not in costs:
            return
        esize = 2 if t.dtype != "float32" else 4
        for d in costs[t.id]:
            c = _sectors(tile, d, esize)
            extra = 0.0
            if (dot_side == "a" and d == t.ndim - 2) or (dot_side == "b" and d == t.ndim - 1 - 1):
                extra += c / 16
            if d in reduced:
                extra += c / 32
            costs[t.id][d] += (c + extra) * times

    for op in graph.ops:
        if op.kind != "graph_defined":
            continue
        bg = op.attrs["block"]
        info = plan(bg).info
        consumers = bg.consumers()
        for k, sv in enumerate(bg.savers):
            add(op.outputs[k], sv.tensor.shape, bg.num_blocks, None, set())
        for bop in bg.ops:
            if bop.kind != "iterator":
                continue
            it = bop.outputs[0]
            src = bg.sources[bop.attrs["source"]]
            times = bg.num_blocks * (bg.forloop if bop.attrs["fmap"] is not None else 1)
            side, red = None, set()
            for c in consumers[it]:
                if c.id in info.dot_ops:
                    side = "a" if c.inputs[0] is it else "b"
                if reduction(c.kind) is not None:
                    red.add(c.attrs["dim"])
            add(tensors[src.id], it.shape, times, side, red)
    return costs


def solve(graph: KernelGraph, use_z3: bool = True, input_strides: Mapping[str, tuple[int, ...]] | None = None,
          output_strides: Mapping[int, tuple[int, ...]] | None = None) -> LayoutPlan:
    """The layout of every device tensor. ``input_strides`` (input name -> strides in
    elements) gives inputs that arrive as strided views instead of row-major: the
    kernels reading them load through those strides (no copy). ``output_strides``
    (output index -> strides) gives outputs the caller wants in another layout (the
    one eager PyTorch gave the value): the kernels write them so."""
    costs = access_costs(graph)
    inner = {t.id: t.ndim - 1 for t in graph.tensors}
    solver = "fixed"
    objective = 0.0
    if costs:
        chosen = None
        if use_z3:
            try:
                chosen, objective = _solve_z3(costs)
                solver = "z3"
            except ImportError:
                chosen = None
        if chosen is None:
            chosen = {tid: min(tab, key=lambda d: (tab[d], -d)) for tid, tab in costs.items()}
            objective = sum(costs[tid][d] for tid, d in chosen.items())
            solver = "enumeration"
        inner.update(chosen)
    strides = {t.id: strides_for(t.shape, inner[t.id]) for t in graph.tensors}
    given = [(t, (input_strides or {}).get(t.name)) for t in graph.inputs]
    given += [(t, (output_strides or {}).get(k)) for k, t in enumerate(graph.outputs)]
    for t, st in given:
        if st is not None:
            strides[t.id] = check_strides(t, st)
            inner[t.id] = min(range(t.ndim), key=lambda d: (strides[t.id][d], -d))
    outs = {t.id for t in graph.outputs}
    for op in graph.ops:  # topological: a permute of a permute sees its input's strides
        t = op.outputs[0] if op.outputs else None
        if t is None or t.id in outs:
            continue
        src = strides[op.inputs[0].id] if op.inputs else None
        if reorders(op.kind):
            strides[t.id] = tuple(src[d] for d in op.attrs["perm"])
        elif selects(op.kind):  # the window's view: the same strides, its dim's times the step
            strides[t.id] = tuple(s * (op.attrs["step"] if d == op.attrs["dim"] else 1) for d, s in enumerate(src))
        else:
            continue
        inner[t.id] = min(range(t.ndim), key=lambda d: (strides[t.id][d], -d))
    return LayoutPlan(inner, strides, costs, solver, objective)


def _solve_z3(costs: dict[int, dict[int, float]]) -> tuple[dict[int, int], float]:
    import z3

    opt = z3.Optimize()
    x = {(tid, d): z3.Bool(f"x_{tid}_{d}") for tid, tab in costs.items() for d in tab}
    terms = []
    for tid, tab in costs.items():
        opt.add(z3.PbEq([(x[tid, d], 1) for d in tab], 1))
        for d, c in tab.items():
            # prefer the row-major choice on ties: a tiny bonus for the last dim
            w = int(round(c * 16)) + (0 if d == max(tab) else 1)
            terms.append(z3.If(x[tid, d], w, 0))
    opt.minimize(z3.Sum(terms) if terms else z3.IntVal(0))
    if opt.check() != z3.sat:  # pragma: no cover - the model is always feasible
        raise RuntimeError("layout ILP infeasible")
    m = opt.model()
    chosen = {tid: next(d for d in tab if z3.is_true(m.eval(x[tid, d]))) for tid, tab in costs.items()}
    return chosen, sum(costs[t][d] for t, d in chosen.items())
