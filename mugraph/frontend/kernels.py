"""Superoptimized pieces as torch operators (docs/design.md §10.4).

On a GPU a piece's lowered Triton kernels are registered with
``torch.library.triton_op``: its body launches each kernel through
``torch.library.wrap_triton``, so ``torch.compile``/Inductor traces through the
op and sees the kernels themselves (it can schedule them, and capture them in
its CUDA graphs). Buffers are allocated per call (a traced op must be
functional: no workspace kept between calls) — except the counters of split-K
kernels whose last program combines the partials: those are an argument the
operator declares it mutates (:func:`counter_slots`), a buffer of the stitched
graph that the kernels leave zero, so no call launches a kernel to zero them (where
the backend compiles repeated layers once, such an operator holds its counters itself
and mutates no argument: a mutating call cannot go into their subgraph).

On the CPU the kernels run under Triton's interpreter, whose kernels are not
``JITFunction`` objects, and ``wrap_triton`` refuses them; there the piece is a
``torch.library.custom_op`` (opaque to Inductor, which calls it) running the
compiled program. Both have a fake implementation giving the outputs' shapes.

This module keeps no ``from __future__ import annotations``: ``custom_op`` reads
the body's type hints to infer the operator's schema.
"""

import logging
from typing import Any, Callable, List, Tuple

import torch

from lower.runtime import TORCH_DTYPE, CompiledProgram, conform

from ..core.ir import Program

log = logging.getLogger("mugraph")

#: registered operators by qualified name (a name can be defined once per process)
_OPS: dict = {}
#: per registered operator that takes split-K counters: (its int32 counter slots, whether it
#: returns its one output as a tensor rather than a tuple); operators without counters are absent
_TAKES_COUNTERS: dict = {}
#: the counters eager calls of an operator pass (:func:`call`), by operator and device
_EAGER_COUNTERS: dict = {}


def counter_slots(prog: CompiledProgram) -> int:
    """How many int32 counters ``prog``'s split-K kernels with ``combine="last"`` need: the
    largest kernel's, since the kernels run one after another on one stream and each leaves
    its counters zero, so they can share one buffer. 0 when no kernel has counters.

    Why a buffer the caller keeps: allocated per call, the counters have to be zeroed per
    call — one more kernel launch for every piece with such a kernel (1.3–1.4 μs a piece on
    an H200: Phi-3-mini's attention, down projection and RMSNorm + qkv timed that much
    slower as operators than as the programs the tuner timed)."""
    return max((n for s in prog.steps if s.kernel is not None for n in s.kernel.locks.values()), default=0)


def functional_runner(prog: CompiledProgram, wrap: Callable):
    """Run ``prog``'s schedule with buffers allocated per call; each Triton launch goes
    through ``wrap(fn)`` (``torch.library.wrap_triton`` on a GPU). The returned
    ``run(xs, counters=None)`` hands every split-K kernel ``counters`` (at least
    :func:`counter_slots` int32 zeros, left zero) where given, else zeros of its own."""
    graph = prog.graph
    locks = {name for s in prog.steps if s.kernel is not None for name in s.kernel.locks}
    specs = {name: (tuple(v.shape), tuple(v.stride()), v.dtype) for name, v in prog.views.items()}

    def run(xs: List[torch.Tensor], counters: torch.Tensor | None = None) -> List[torch.Tensor]:
        dev = xs[0].device
        env = {}
        for name, (shape, stride, dtype) in specs.items():
            if name in locks:
                env[name] = counters if counters is not None else torch.zeros(shape, dtype=dtype, device=dev)
            else:
                env[name] = torch.empty_strided(shape, stride, dtype=dtype, device=dev)
        for t, x, st in zip(graph.inputs, xs, prog.input_strides):
            env[t.label()] = conform(x, st)   # a strided view the program was compiled for passes as is
        outs = [torch.empty_strided(t.shape, st, dtype=TORCH_DTYPE[t.dtype], device=dev)
                for t, st in zip(graph.outputs, prog.output_strides)]
        for t, o in zip(graph.outputs, outs):
            env[t.label()] = o
        prog.run_steps(env, dev, wrap)
        return outs
    return run


def register(name: str, program: Program, run: Callable, triton: bool,
             output_strides: List[tuple] | None = None, counters: int = 0):
    """``torch.ops.mugraph.<name>``: a ``triton_op`` (``triton=True``) or a ``custom_op``
    calling ``run``; defined once per process and name. Its fake implementation gives
    the outputs ``run`` returns: shapes, dtypes and strides (``output_strides``;
    default row-major), so Inductor plans for the layout the kernels write. With
    ``counters`` slots the operator takes a second argument, an int32 tensor of at least
    that many zeros that it mutates and leaves zero (:func:`counter_slots`)."""
    qual = f"mugraph::{name}"
    if qual in _OPS:
        return _OPS[qual]
    strides = output_strides or [None] * len(program.outputs)
    specs = [(tuple(t.shape), st, TORCH_DTYPE[t.dtype]) for t, st in zip(program.outputs, strides)]
    define = torch.library.triton_op if triton else torch.library.custom_op

    def outputs_like(xs: List[torch.Tensor]) -> List[torch.Tensor]:
        dev = xs[0].device
        return [torch.empty(s, dtype=d, device=dev) if st is None else torch.empty_strided(s, st, dtype=d, device=dev)
                for s, st, d in specs]

    # an operator that mutates an argument must return tensors, not a list (functionalization
    # does not take a list): one tensor, or a tuple of as many as the program has outputs
    single = len(specs) == 1
    if counters:

        def body(xs: List[torch.Tensor], counters: torch.Tensor):
            outs = run(list(xs), counters)
            return outs[0] if single else tuple(outs)

        def fake(xs: List[torch.Tensor], counters: torch.Tensor):
            outs = outputs_like(xs)
            return outs[0] if single else tuple(outs)
        for fn in (body, fake):
            fn.__annotations__["return"] = torch.Tensor if single else Tuple[tuple([torch.Tensor] * len(specs))]
        op = define(qual, body, mutates_args=("counters",))
    else:
        def body(xs: List[torch.Tensor]) -> List[torch.Tensor]:  # type: ignore[misc]
            return run(list(xs))

        def fake(xs: List[torch.Tensor]) -> List[torch.Tensor]:  # type: ignore[misc]
            return outputs_like(xs)
        op = define(qual, body, mutates_args=())
    op.register_fake(fake)
    _OPS[qual] = getattr(torch.ops.mugraph, name).default
    if counters:
        _TAKES_COUNTERS[_OPS[qual]] = (counters, single)
    return _OPS[qual]


def _counters_entry(op: Any) -> tuple[int, bool]:
    """``op``'s entry of :data:`_TAKES_COUNTERS`; ``(0, False)`` for any other callable."""
    try:
        return _TAKES_COUNTERS.get(op, (0, False))
    except TypeError:  # an unhashable callable is no registered operator
        return 0, False


def returns_one(op: Any) -> bool:
    """Whether operator ``op`` returns its one output as a tensor (one that takes counters
    and has one output), not in a list of outputs."""
    return _counters_entry(op)[1]


def counters_of(op: Any) -> int:
    """The counter slots operator ``op`` takes (:func:`register`; 0 for any other callable)."""
    return _counters_entry(op)[0]


def call(op: Any, xs: List[torch.Tensor]) -> List[torch.Tensor]:
    """``op(xs)`` eagerly as a list of outputs, with the counters it takes kept per operator
    and device."""
    n = counters_of(op)
    if not n:
        return op(xs)
    key = (op, xs[0].device)
    if key not in _EAGER_COUNTERS:
        _EAGER_COUNTERS[key] = torch.zeros(n, dtype=torch.int32, device=xs[0].device)
    out = op(xs, _EAGER_COUNTERS[key])
    return [out] if isinstance(out, torch.Tensor) else list(out)


def make_op(name: str, prog: CompiledProgram, kind: str, keep_counters: bool = True):
    """The operator for a compiled piece. ``kind``: ``"triton_op"`` (GPU; Inductor
    traces through the kernels), ``"custom_op"`` (opaque; the only one the CPU
    interpreter allows), or ``"auto"`` (triton_op on a GPU, custom_op on the CPU).

    ``keep_counters=False`` (the backend's ``repeats_once``): an operator that mutates no
    argument, so a call of it can go into a subgraph of repeated layers (AOTAutograd does not
    functionalize a mutating operator there). Where the program's split-K kernels need
    counters, the operator holds a buffer of them itself, made zero once and left zero by
    the kernels — state like cuBLAS's workspace, so no call launches a kernel to zero them
    (a zeroing launch cost 1.2–1.5 μs a piece on an H200). Such an operator is a
    ``custom_op`` whatever ``kind`` asks: a ``triton_op``'s body is traced, and its own
    buffer would become a constant the kernels mutate, which the trace copies at every
    call. Two calls of one such operator must not run at once on two streams."""
    if kind == "auto":
        kind = "triton_op" if prog.device == "cuda" else "custom_op"
    n = counter_slots(prog)
    if n and not keep_counters:
        own = torch.zeros(n, dtype=torch.int32, device=prog.device)
        run = functional_runner(prog, lambda f: f)
        return register(name, prog.graph, lambda xs: run(xs, own), False, prog.output_strides)
    if kind == "triton_op":
        return register(name, prog.graph, functional_runner(prog, torch.library.wrap_triton), True,
                        prog.output_strides, n)
    return register(name, prog.graph, functional_runner(prog, lambda f: f), False, prog.output_strides, n)
