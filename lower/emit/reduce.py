"""Emission of reductions along one dim (``keep_dims``), from the catalog's reduction
trait: the combine op picks the Triton reduction (:data:`TL_REDUCE`) and the padding is
set to the combine's identity before it is read, so a new reduction computes its own
fold or is refused — never another one's."""

from __future__ import annotations

from mugraph.core.errors import UnsupportedOpError
from mugraph.core.ir import Op
from mugraph.core.ops import get_op, reduction

from .core import Emitter, Val

TL_REDUCE = {"add": "tl.sum", "max": "tl.max", "min": "tl.min"}
"""Combine op of a reduction -> the Triton reduction that folds with it."""


def _deferred(em: Emitter, op: Op, x: Val, d: int) -> None:
    """A sum only an accumulator uses: it adds up the un-reduced tile (padding zeroed) and
    reduces once after the loop — no cross-warp reduction (and barrier) per step."""
    t = op.outputs[0]
    src = em.read_padding(x, [d], op.kind)
    src = src if x.f32 else f"({src}).to(tl.float32)"
    v = em.val(t, f32=True, clean=x.clean | {d}, finite=x.finite)
    v.pshape, v.rshape = x.pshape, x.rshape
    em.emit(f"{v.name} = {src}  # summed over dim {d} once, after the loop")


def emit_reduce(em: Emitter, op: Op) -> None:
    """A reduction along ``dim``; over a dim of real size 1 it is the value itself. The
    padding along ``dim`` is set to the identity first (zero padding already known to
    be zero is left as it is); the other dims stay clean when the op keeps zeros."""
    red = reduction(op.kind)
    fn = TL_REDUCE.get(red.combine) if red is not None else None
    if fn is None:
        raise UnsupportedOpError(f"op {op.kind!r} (block op {op.id}): no Triton reduction for it; "
                                 f"the lowering folds with {sorted(TL_REDUCE)}")
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    d = op.attrs["dim"]
    if x.rshape[d] == 1:
        v = em.val(t, f32=x.f32, clean=x.clean, finite=x.finite)
        em.emit(f"{v.name} = {x.name}")
        return
    if op.id in em.p.deferred_sums:
        _deferred(em, op, x, d)
        return
    src = em.read_padding(x, [d], op.kind)
    keeps = get_op(op.kind).padding.zero == "keeps"
    v = em.val(t, f32=True, clean=x.clean - {d} if keeps else frozenset(), finite=x.finite)
    em.emit(f"{v.name} = {fn}({src}, axis={d}, keep_dims=True)")

