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
* ``x[T, last] = 1`` for user-visible tensors and torch-produced ones (fixed);
* a permute (a torch view, :mod:`lower.torch_ops`) is no variable: its strides are
  its input's, permuted, so a kernel reading it loads through them — the transpose
  is folded into the load's pointer arithmetic and no copy is made (unless it is a
  graph output, which the runtime writes row-major);

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

from mugraph.ir import KernelGraph, Tensor
from mugraph.ops import reduction, reorders

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


def solve(graph: KernelGraph, use_z3: bool = True) -> LayoutPlan:
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
    outs = {t.id for t in graph.outputs}
    for op in graph.ops:  # topological: a permute of a permute sees its input's strides
        t = op.outputs[0] if op.outputs else None
        if reorders(op.kind) and t.id not in outs:
            src = strides[op.inputs[0].id]
            strides[t.id] = tuple(src[d] for d in op.attrs["perm"])
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
