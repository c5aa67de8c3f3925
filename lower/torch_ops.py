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
