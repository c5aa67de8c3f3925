"""Emission of reductions along one dim (``keep_dims``), dispatched on the reduction's
kind: each kind names its Triton reduction and what the padding must be set to
before it (the reduction's identity), so a new reduction cannot silently compute
another one's result."""

from __future__ import annotations

from mugraph.errors import UnsupportedOpError
from mugraph.ir import Op

from .core import Emitter, Val


def _sum(em: Emitter, op: Op, x: Val, d: int) -> None:
    t = op.outputs[0]
    if op.id in em.p.deferred_sums:
        # only an accumulator uses this sum: it adds up the un-reduced tile (padding zeroed)
        # and reduces once after the loop — no cross-warp reduction (and barrier) per step
        src = em.clean_only(x, [d])
        src = src if x.f32 else f"({src}).to(tl.float32)"
        v = em.val(t, f32=True, clean=x.clean | {d}, finite=x.finite)
        v.pshape, v.rshape = x.pshape, x.rshape
        em.emit(f"{v.name} = {src}  # summed over dim {d} once, after the loop")
        return
    src = em.clean_only(x, [d])               # padding: 0, the identity of +
    v = em.val(t, f32=True, clean=x.clean - {d}, finite=x.finite)
    em.emit(f"{v.name} = tl.sum({src}, axis={d}, keep_dims=True)")


def _max(em: Emitter, op: Op, x: Val, d: int) -> None:
    t = op.outputs[0]
    src = em.f32(x)
    if x.pshape[d] > x.rshape[d]:              # padding: -inf, the identity of max
        src = f"tl.where({em.mask_dim(x, d)}, {src}, float('-inf'))"
    v = em.val(t, f32=True, clean=frozenset(), finite=x.finite)
    em.emit(f"{v.name} = tl.max({src}, axis={d}, keep_dims=True)")


REDUCTIONS = {"sum": _sum, "max": _max}
"""Reduction op -> its emitter."""


def emit_reduce(em: Emitter, op: Op) -> None:
    """A reduction along ``dim``; over a dim of real size 1 it is the value itself."""
    kind = REDUCTIONS.get(op.kind)
    if kind is None:
        raise UnsupportedOpError(f"op {op.kind!r} (block op {op.id}): no Triton reduction for it; "
                                 f"the lowering reduces with {sorted(REDUCTIONS)}")
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    d = op.attrs["dim"]
    if x.rshape[d] == 1:
        v = em.val(t, f32=x.f32, clean=x.clean, finite=x.finite)
        em.emit(f"{v.name} = {x.name}")
        return
    kind(em, op, x, d)
