"""Emission of the ops that rearrange elements: ``concat``, ``reshape``, ``repeat``
and ``permute``.

Register tiles cannot be re-indexed freely, so these go through the per-program
scratch area (the block's "shared memory"; the plan sizes it,
:attr:`lower.plan.KernelPlan.staged`): the pieces are stored at their row-major
offsets in the real (unpadded) layout and the result is loaded back, with barriers
around. A reshape of unpadded tiles is a ``tl.reshape``; a repeat along unit dims a
``tl.broadcast_to``. A permute never goes through scratch: of a tile just loaded (and
read by nothing else) it is folded into the load — the same pointers in permuted
order, so the strides do the work and no element moves — otherwise it is a register
``tl.permute``, with the padding bookkeeping permuted along.
"""

from __future__ import annotations

from mugraph.core.ir import Op

from .core import Emitter, Val, row_major_strides
from .loads import emit_filled, tile_load


def _through_scratch(em: Emitter, op: Op, pieces: list[tuple[Val, list[str]]], out: Val,
                     out_idx: list[str]) -> None:
    """Write ``pieces`` (value, per-dim linear-index terms) into scratch, read ``out`` back."""
    if op.id not in em.p.staged:
        raise AssertionError(f"block op {op.id} ({op.kind}) goes through scratch the plan did not size")
    em.emit("tl.debug_barrier()  # scratch free: earlier readers are done")
    for v, idx in pieces:
        masks = [em.mask_dim(v, d) for d in em.padded_dims(v)]
        m = f", mask={' & '.join(masks)}" if masks else ""
        em.emit(f"tl.store(scratch + {' + '.join(idx)}, {em.f32(v)}{m})")
    em.emit("tl.debug_barrier()  # scratch written")
    masks = [em.mask_dim(out, d) for d in em.padded_dims(out)]
    m = f", mask={' & '.join(masks)}, other=0.0" if masks else ""
    em.emit(f"{out.name} = tl.load(scratch + {' + '.join(out_idx)}{m})")


def emit_concat(em: Emitter, op: Op) -> None:
    t = op.outputs[0]
    dim = op.attrs["dim"]
    out = em.val(t, f32=True, clean=frozenset(range(t.ndim)), finite=True)
    st = row_major_strides(out.rshape)
    pieces, off = [], 0
    for x in op.inputs:
        v = em.vals[x.id]
        idx = [em.r(p) if d != dim else (f"({em.r(p)} + {off})" if off else em.r(p))
               for d, p in enumerate(v.pshape)]
        pieces.append((v, em.terms(idx, st, t.ndim)))
        off += v.rshape[dim]
    out_idx = em.terms([em.r(p) for p in out.pshape], st, t.ndim)
    _through_scratch(em, op, pieces, out, out_idx)


def emit_reshape(em: Emitter, op: Op) -> None:
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    if op.id not in em.p.staged:   # no padding on either side: a register reshape
        v = em.val(t, f32=x.f32, clean=frozenset(range(t.ndim)), finite=True)
        em.emit(f"{v.name} = tl.reshape({x.name}, {v.pshape})")
        return
    out = em.val(t, f32=True, clean=frozenset(range(t.ndim)), finite=True)
    pin = em.terms([em.r(p) for p in x.pshape], row_major_strides(x.rshape), len(x.pshape))
    pout = em.terms([em.r(p) for p in out.pshape], row_major_strides(out.rshape), t.ndim)
    _through_scratch(em, op, [(x, pin)], out, pout)


def emit_repeat(em: Emitter, op: Op) -> None:
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    reps = op.attrs["reps"]
    if op.id not in em.p.staged:   # repeats along unit dims only: a broadcast
        dirty = {d for d, r in enumerate(reps) if r > 1}
        v = em.val(t, f32=x.f32, clean=frozenset(x.clean - dirty), finite=x.finite)
        em.emit(f"{v.name} = tl.broadcast_to({x.name}, {em.info.padded(t)})")
        return
    out = em.val(t, f32=True, clean=frozenset(range(t.ndim)), finite=True)
    st = row_major_strides(x.rshape)
    pin = em.terms([em.r(p) for p in x.pshape], st, len(x.pshape))
    idx = [f"({em.r(p)} % {x.rshape[d]})" if reps[d] > 1 else em.r(p) for d, p in enumerate(out.pshape)]
    pout = em.terms(idx, st, t.ndim)
    _through_scratch(em, op, [(x, pin)], out, pout)


def emit_permute(em: Emitter, op: Op) -> None:
    t = op.outputs[0]
    perm = list(op.attrs["perm"])
    it = em.p.load_permutes.get(op.id)
    if it is not None:   # folded into the load of the iterator tile it reads
        iop = op.inputs[0].op
        if emit_filled(em, t, iop, perm):
            return
        src = em.src[iop.attrs["source"]]
        f32 = src.dtype == "float32" or op.inputs[0].id not in em.p.dot_only
        v = em.val(t, f32=f32, clean=frozenset(range(t.ndim)), finite=True)
        cast = ".to(tl.float32)" if f32 and src.dtype != "float32" else ""
        load = tile_load(em, iop, cast, perm, for_dot=op.inputs[0].id in em.p.dot_only)
        em.emit(f"{v.name} = {load}  # permute {tuple(perm)} read through strides")
        return
    x = em.vals[op.inputs[0].id]
    v = em.val(t, f32=x.f32, clean=frozenset(o for o, d in enumerate(perm) if d in x.clean), finite=x.finite)
    em.emit(f"{v.name} = tl.permute({x.name}, {tuple(perm)})")
