"""Pre-defined kernel ops as torch calls (one row per catalog op).

A kernel-graph op that is not graph-defined is a library kernel (docs/design.md §2.2); torch
is our library. Results are made contiguous so every device tensor the lowering
did not lay out itself is row-major, as :mod:`lower.layout` assumes — except a
``permute`` and a ``slice``, which stay views: their strides are their input's
(permuted; the sliced dim's times the step, from an offset the view's pointer
carries), and :mod:`lower.layout` gives the kernels that read them exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from mugraph.core.algebra import window
from mugraph.core.ir import KernelGraph, Op, broadcasts_to
from mugraph.core.ops import CATALOG, Category, is_contraction

TorchFn = Callable[[list[torch.Tensor], dict, torch.dtype, torch.device], torch.Tensor]


@dataclass(frozen=True)
class TorchOp:
    """One row: the call ``fn(inputs, attrs, dtype, device)``, and whether it is a view
    (no kernel runs: the cost model charges no launch)."""

    fn: TorchFn
    view: bool = False

    def __call__(self, x: list[torch.Tensor], attrs: dict, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.fn(x, attrs, dtype, device)


def _rows(table: dict[str, TorchFn | TorchOp]) -> dict[str, TorchOp]:
    return {k: v if isinstance(v, TorchOp) else TorchOp(v) for k, v in table.items()}


#: torch call: catalog op -> its row
TORCH_OPS: dict[str, TorchOp] = _rows({
    "matmul": lambda x, at, dt, dev: torch.matmul(x[0], x[1]),
    "add": lambda x, at, dt, dev: x[0] + x[1],
    "sub": lambda x, at, dt, dev: x[0] - x[1],
    "mul": lambda x, at, dt, dev: x[0] * x[1],
    "div": lambda x, at, dt, dev: x[0] / x[1],
    "exp": lambda x, at, dt, dev: torch.exp(x[0]),
    "sqrt": lambda x, at, dt, dev: torch.sqrt(x[0]),
    "square": lambda x, at, dt, dev: x[0] * x[0],
    "silu": lambda x, at, dt, dev: F.silu(x[0]),
    "scale": lambda x, at, dt, dev: x[0] * float(at["c"]),
    "const": lambda x, at, dt, dev: torch.full(tuple(at["shape"]), float(at["value"]), dtype=dt, device=dev),
    "sum": lambda x, at, dt, dev: x[0].sum(dim=at["dim"], keepdim=True),
    "max": lambda x, at, dt, dev: x[0].amax(dim=at["dim"], keepdim=True),
    "concat": lambda x, at, dt, dev: torch.cat(list(x), dim=at["dim"]),
    "reshape": TorchOp(lambda x, at, dt, dev: x[0].reshape(tuple(at["shape"])), view=True),
    "repeat": lambda x, at, dt, dev: x[0].repeat(*at["reps"]),
    # a strided view: the runtime keeps it (no copy) and the kernels that read it load
    # through its permuted strides (lower/layout.py derives them)
    "permute": TorchOp(lambda x, at, dt, dev: x[0].permute(*at["perm"]), view=True),
    # a strided view from an offset (the pointer a kernel reading it gets starts at the window)
    "slice": TorchOp(lambda x, at, dt, dev: x[0][window(at)], view=True),
})


def source_line(kind: str, out: str, args: list[str], attrs: dict) -> str:
    """A readable line for the generated listing (what the torch call computes)."""
    extra = {k: v for k, v in attrs.items() if k != "dtype"}
    return f"{out} = torch:{kind}({', '.join(args)}{''.join(f', {k}={v}' for k, v in extra.items())})"


def _is_addition(kind: str) -> bool:
    """A commutative, linear element-wise binary op: the catalog's addition."""
    d = CATALOG.get(kind)
    return d is not None and d.category is Category.BINARY and d.commutative and d.lax == "linear"


def matmul_adds(graph: KernelGraph) -> dict[int, Op]:
    """Library ``add`` op id -> the library ``matmul`` it adds to a residual or bias, where
    one cuBLAS call computes both (``addmm`` for 2-D operands, ``baddbmm`` for 3-D ones with
    equal batches): the matmul's output is read by that add alone and is no graph output,
    and the other operand broadcasts to the result. A decode step's projection plus its
    residual is then one kernel, as cuBLAS runs it, instead of a product and an add."""
    readers: dict[int, list[Op]] = {}
    for op in graph.ops:
        for t in op.inputs:
            readers.setdefault(t.id, []).append(op)
    outs = {t.id for t in graph.outputs}
    found: dict[int, Op] = {}
    for op in graph.ops:
        if not _is_addition(op.kind):
            continue
        for mm_out, other in (op.inputs, op.inputs[::-1]):
            mm = mm_out.op
            if (not is_contraction(mm.kind) or mm in found.values() or mm_out.id in outs
                    or [r.id for r in readers.get(mm_out.id, [])] != [op.id]
                    or mm_out.shape != op.outputs[0].shape or mm_out.dtype != op.outputs[0].dtype):
                continue
            a, b = mm.inputs
            if a.ndim == b.ndim == 2 or (a.ndim == b.ndim == 3 and a.shape[0] == b.shape[0]):
                if broadcasts_to(other.shape, mm_out.shape):
                    found[op.id] = mm
                    break
    return found
