"""Op emission: the Triton lines of every block op of a plan, one module per op category.

* :mod:`.loads` — input iterators (masked loads) and accumulators;
* :mod:`.elementwise` — constants, unary and binary ops (a row per op from its
  Triton expression);
* :mod:`.reduce` — reductions, from the catalog's combine op and identity;
* :mod:`.matmul` — ``tl.dot`` or CUDA-core multiply-and-sum;
* :mod:`.rearrange` — concat / reshape / repeat through scratch, permute folded
  into its load or permuted in registers;
* :mod:`.core` — the emitter's state and the padding bookkeeping every category keeps.

:func:`emit_block` runs them over a :class:`lower.plan.KernelPlan` in its emission
order; :mod:`lower.codegen` assembles the kernels from the lines.
"""

from __future__ import annotations

from typing import Callable

from mugraph.core.errors import UnsupportedOpError
from mugraph.core.ir import Op

from ..plan import KernelPlan
from .core import TL_DTYPE, Emitter, Val, describe
from .core import fmt_number
from .elementwise import binary, emit_const, unary
from .loads import emit_accum, emit_folded_max, emit_iterator
from .matmul import emit_matmul
from .rearrange import emit_concat, emit_permute, emit_repeat, emit_reshape
from .reduce import emit_reduce

EmitFn = Callable[[Emitter, Op], None]

#: Triton emission: block op -> its emitter (a test walks it against the catalog)
EMITTERS: dict[str, EmitFn] = {
    "iterator": emit_iterator, "accum": emit_accum,
    "const": emit_const,
    "exp": unary(lambda a, op: f"tl.exp({a})"),
    "sqrt": unary(lambda a, op: f"tl.sqrt({a})"),
    "square": unary(lambda a, op: f"{a} * {a}"),
    "silu": unary(lambda a, op: f"{a} * tl.sigmoid({a})"),
    "scale": unary(lambda a, op: f"{a} * {fmt_number(op.attrs.get('c', 1))}"),
    "add": binary("+"), "sub": binary("-"), "mul": binary("*"), "div": binary("/"),
    "sum": emit_reduce, "max": emit_reduce,
    "matmul": emit_matmul,
    "concat": emit_concat, "reshape": emit_reshape, "repeat": emit_repeat, "permute": emit_permute,
}

__all__ = ["EMITTERS", "TL_DTYPE", "Emitter", "Val", "emit_block"]


def emit_block(plan: KernelPlan, sources: list, interpret: bool = False) -> Emitter:
    """Emit every op of ``plan`` (``sources``: the DevArg of each block source); the lines
    are in ``Emitter.lines`` by op id."""
    em = Emitter(plan, sources, interpret)
    folded_after = {rm.shift.op.id: rm for rm in plan.running_maxes if rm.is_folded}
    shift_of = {sub: rm.shift.id for rm in plan.running_maxes for sub in rm.folded}
    new_max: dict[int, Val] = {}           # shift tile id -> the safe new maximum its subs read
    for op in plan.order:
        em.cur = []
        em.lines[op.id] = em.cur
        if op.id in plan.dropped:
            continue
        fn = EMITTERS.get(op.kind)
        if fn is None:
            raise UnsupportedOpError(f"op {op.kind!r} (block op {op.id}): the Triton lowering has no emitter for it")
        out = op.outputs[0]
        info = plan.info
        em.emit(f"# {out.label()} = {describe(op)}  tile {out.shape}"
                + (f" (per program {info.shape(out)})" if info.shape(out) != out.shape else ""))
        # an op of a tl.dot operand's cone reads the cone's own load of a shared tile
        swapped = {tid: em.vals[tid] for tid, (_, ops) in plan.dot_operand_loads.items()
                   if op.id in ops and tid in em.vals}
        for tid in swapped:
            em.vals[tid] = em.dup_vals[tid]
        if op.id in shift_of:  # a − m against the new running maximum (lower.plan._folded_shifts)
            swapped[shift_of[op.id]] = em.vals[shift_of[op.id]]
            em.vals[shift_of[op.id]] = new_max[shift_of[op.id]]
        fn(em, op)
        em.vals.update(swapped)
        if op.id in folded_after:
            rm = folded_after[op.id]
            new_max[rm.shift.id] = emit_folded_max(em, rm)
    return em
