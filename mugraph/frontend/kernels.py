"""Superoptimized pieces as torch operators (docs/design.md §10.4).

On a GPU a piece's lowered Triton kernels are registered with
``torch.library.triton_op``: its body launches each kernel through
``torch.library.wrap_triton``, so ``torch.compile``/Inductor traces through the
op and sees the kernels themselves (it can schedule them, and capture them in
its CUDA graphs). Buffers are allocated per call (a traced op must be
functional: no workspace kept between calls).

On the CPU the kernels run under Triton's interpreter, whose kernels are not
``JITFunction`` objects, and ``wrap_triton`` refuses them; there the piece is a
``torch.library.custom_op`` (opaque to Inductor, which calls it) running the
compiled program. Both have a fake implementation giving the outputs' shapes.

This module keeps no ``from __future__ import annotations``: ``custom_op`` reads
the body's type hints to infer the operator's schema.
"""

import logging
from typing import Callable, List

import torch

from lower.runtime import TORCH_DTYPE, CompiledProgram, conform

from ..core.ir import Program

log = logging.getLogger("mugraph")

#: registered operators by qualified name (a name can be defined once per process)
_OPS: dict = {}


def functional_runner(prog: CompiledProgram, wrap: Callable) -> Callable[[List[torch.Tensor]], List[torch.Tensor]]:
    """Run ``prog``'s schedule with buffers allocated per call; each Triton launch goes
    through ``wrap(fn)`` (``torch.library.wrap_triton`` on a GPU)."""
    graph = prog.graph
    locks = {name for s in prog.steps if s.kernel is not None for name in s.kernel.locks}
    specs = {name: (tuple(v.shape), tuple(v.stride()), v.dtype) for name, v in prog.views.items()}

    def run(xs: List[torch.Tensor]) -> List[torch.Tensor]:
        dev = xs[0].device
        env = {}
        for name, (shape, stride, dtype) in specs.items():
            env[name] = (torch.zeros(shape, dtype=dtype, device=dev) if name in locks
                         else torch.empty_strided(shape, stride, dtype=dtype, device=dev))
        for t, x, st in zip(graph.inputs, xs, prog.input_strides):
            env[t.label()] = conform(x, st)   # a strided view the program was compiled for passes as is
        outs = [torch.empty_strided(t.shape, st, dtype=TORCH_DTYPE[t.dtype], device=dev)
                for t, st in zip(graph.outputs, prog.output_strides)]
        for t, o in zip(graph.outputs, outs):
            env[t.label()] = o
        prog.run_steps(env, dev, wrap)
        return outs
    return run


def register(name: str, program: Program, run: Callable[[List[torch.Tensor]], List[torch.Tensor]],
             triton: bool, output_strides: List[tuple] | None = None):
    """``torch.ops.mugraph.<name>``: a ``triton_op`` (``triton=True``) or a ``custom_op``
    calling ``run``; defined once per process and name. Its fake implementation gives
    the outputs ``run`` returns: shapes, dtypes and strides (``output_strides``;
    default row-major), so Inductor plans for the layout the kernels write."""
    qual = f"mugraph::{name}"
    if qual in _OPS:
        return _OPS[qual]
    strides = output_strides or [None] * len(program.outputs)
    specs = [(tuple(t.shape), st, TORCH_DTYPE[t.dtype]) for t, st in zip(program.outputs, strides)]

    def body(xs: List[torch.Tensor]) -> List[torch.Tensor]:
        return run(list(xs))

    if triton:
        op = torch.library.triton_op(qual, body, mutates_args=())
    else:
        op = torch.library.custom_op(qual, body, mutates_args=())

    def fake(xs: List[torch.Tensor]) -> List[torch.Tensor]:
        dev = xs[0].device
        return [torch.empty(s, dtype=d, device=dev) if st is None else torch.empty_strided(s, st, dtype=d, device=dev)
                for s, st, d in specs]

    op.register_fake(fake)
    _OPS[qual] = getattr(torch.ops.mugraph, name).default
    return _OPS[qual]


def make_op(name: str, prog: CompiledProgram, kind: str):
    """The operator for a compiled piece. ``kind``: ``"triton_op"`` (GPU; Inductor
    traces through the kernels), ``"custom_op"`` (opaque; the only one the CPU
    interpreter allows), or ``"auto"`` (triton_op on a GPU, custom_op on the CPU)."""
    if kind == "auto":
        kind = "triton_op" if prog.device == "cuda" else "custom_op"
    if kind == "triton_op":
        return register(name, prog.graph, functional_runner(prog, torch.library.wrap_triton), True,
                        prog.output_strides)
    return register(name, prog.graph, functional_runner(prog, lambda f: f), False, prog.output_strides)
