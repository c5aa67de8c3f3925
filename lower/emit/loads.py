"""Emission of the ops that move data in and across the loop: input iterators
(masked loads at the imap/fmap offsets) and accumulators (``acc += x``)."""

from __future__ import annotations

from mugraph.core.ir import AXES, Op

from .core import Emitter, Val


def load_args(em: Emitter, op: Op, order: list[int] | None = None) -> str:
    """The ``tl.load`` arguments of iterator ``op``'s tile at the grid block's, loop
    step's and sub-tile's offsets, masked to the real extents (padding reads as zero).
    ``order``: the source dim each dim of the loaded tile reads (a permute folded into
    the load: the same elements through permuted strides; default: the tile's own)."""
    t = op.outputs[0]
    src = em.src[op.attrs["source"]]
    imap, fmap = op.attrs["imap"], op.attrs["fmap"]
    pshape, rshape = em.info.padded(t), em.info.shape(t)
    rank = t.ndim
    order = list(range(rank)) if order is None else order
    terms, masks = [], []
    for o, d in enumerate(order):
        offs = []
        for a in range(3):
            if imap[a] == d:
                offs.append(f"b{AXES[a]} * {src.shape[d] // em.b.grid[a]}")
        if fmap == d and em.b.forloop > 1:
            offs.append(f"i * {t.shape[d] * em.info.chunk}")
        if em.info.factor(t, d) > 1:
            offs.append(f"s{em.info.key(t, d)} * {rshape[d]}")
        ar = em.r(pshape[d])
        idx = f"({' + '.join(offs)} + {ar})" if offs else ar
        stride = src.strides[d]
        terms.append(em.ex(idx, o, rank) + ("" if stride == 1 else f" * {stride}"))
        if rshape[d] < pshape[d]:
            masks.append(em.ex(f"({ar} < {rshape[d]})", o, rank))
    return f"{src.name}_ptr + {' + '.join(terms)}" + (f", mask={' & '.join(masks)}, other=0.0" if masks else "")


def emit_iterator(em: Emitter, op: Op) -> None:
    """``tl.load`` of the tile (:func:`load_args`); a tile only tensor-core dots read
    stays in its storage dtype, anything else is fp32. A tile the plan loads twice
    (:attr:`lower.plan.KernelPlan.dot_operand_loads`) gets its second load here too. A
    tile only a permute reads is loaded by the permute (:attr:`lower.plan.KernelPlan.load_permutes`)."""
    t = op.outputs[0]
    if op.id in em.p.load_permutes.values():
        return
    src = em.src[op.attrs["source"]]
    args = load_args(em, op)
    rank = t.ndim

    def load(f32: bool, extra: str = "") -> str:
        return f"tl.load({args}{extra})" + (".to(tl.float32)" if f32 and src.dtype != "float32" else "")

    f32 = src.dtype == "float32" or t.id not in em.p.dot_only
    v = em.val(t, f32=f32, clean=frozenset(range(rank)), finite=True)
    em.emit(f"{v.name} = {load(f32)}")
    if t.id in em.p.dot_operand_loads:
        # a second load of the same tile for the tl.dot operand's cone: each load gets the
        # layout its users need, instead of a per-step layout conversion (a shared-memory
        # round trip and a barrier); the eviction hint keeps Triton from merging the two
        d32 = em.p.dot_operand_loads[t.id][0] or src.dtype == "float32"
        em.dup_vals[t.id] = Val(f"{v.name}_d", v.pshape, v.rshape, d32, v.clean, True)
        hint = ', eviction_policy="evict_last"'
        em.emit(f"{v.name}_d = {load(d32, hint)}  # for the tl.dot operand")


def emit_accum(em: Emitter, op: Op) -> None:
    """``acc += x`` each loop step (fp32); ``acc = F·x`` once for a loop-invariant ``x``; the
    un-reduced ``acc_k += x`` for a deferred sum or product (reduced after the loop)."""
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    v = em.val(t, f32=True, clean=x.clean, finite=x.finite)
    if op in em.p.schedule.invariant_accums:
        n = em.p.iterations
        em.emit(f"{v.name} = {em.f32(x)}" + (f" * {float(n)!r}" if n != 1 else ""))
    elif op.inputs[0].op.id in em.info.deferred or op.inputs[0].op.id in em.p.deferred_sums:
        em.emit(f"{v.name}_k += {x.name}")
    else:
        em.emit(f"{v.name} += {em.f32(x)}")
