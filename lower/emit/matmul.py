"""Emission of matmuls: ``tl.dot`` with fp32 accumulation where the plan says so, else a
broadcast multiply-and-sum on the CUDA cores in fp32 (optionally left un-reduced over
k for the accumulator to add up); a matmul of two matching concats is a sum of dots."""

from __future__ import annotations

import math

from mugraph.core.ir import Op

from ..layout import k_major
from .core import TL_DTYPE, Emitter, Val


def dot_operand(em: Emitter, x: Val, contract: int, kind: str) -> str:
    """``x`` as a ``tl.dot`` operand of a ``kind`` op: padding along the contracted dim as
    the op reads it (zero), cast to the storage dtype (fp32 stays fp32)."""
    expr = em.read_padding(x, [contract], kind)
    if em.dtype == "bfloat16" and em.interpret:
        # Triton's interpreter computes bf16 tl.dot wrongly (numpy has no bf16):
        # round to bf16, then multiply exactly in fp32 — the same products.
        return f"({expr}).to(tl.bfloat16).to(tl.float32)"
    if em.dtype == "float32":
        return expr if x.f32 else f"{expr}.to(tl.float32)"
    if x.f32 or expr != x.name:
        return f"({expr}).to({TL_DTYPE[em.dtype]})" if expr != x.name else f"{x.name}.to({TL_DTYPE[em.dtype]})"
    return expr


def _dot(em: Emitter, op: Op, ta, tb, a: Val, b: Val) -> str:
    """``tl.dot`` of one pair of operands. Rank 2 as is; rank 3 and more as one batched
    3-D dot over the batch dims flattened (a grouped-query attention's block holds several
    heads: its tiles are (1, heads, rows, d)) — a batch of one, or a batch whose right
    operand is one shared matrix (:func:`shared_right`), as a 2-D dot."""
    t = op.outputs[0]
    r = t.ndim
    pt = em.info.padded(t)
    ka, kb = len(a.pshape) - 1, len(b.pshape) - 2
    ea, eb = dot_operand(em, a, ka, op.kind), dot_operand(em, b, kb, op.kind)
    ea, eb = em.align(ea, len(a.pshape), r), em.align(eb, len(b.pshape), r)
    exact32 = em.dtype == "float32" or (em.dtype == "bfloat16" and em.interpret)
    prec = f", input_precision=\"{em.cfg.fp32_dot}\"" if exact32 else ""
    if r == 2:
        return f"tl.dot({ea}, {eb}, out_dtype=tl.float32{prec})"
    batch = tuple(pt[:-2])
    n = math.prod(batch)
    pa = batch + tuple(em.info.padded(ta)[-2:])
    pb = batch + tuple(em.info.padded(tb)[-2:])
    if n > 1 and shared_right(a, b, batch):
        # one right matrix for every batch element (RoPE's rotation for every head of a block):
        # the batch's rows as one 2-D dot, not a 3-D dot over n broadcast copies of it (16
        # heads of one row times a 128 × 128 rotation: 16 copies, 512 KB). The RoPE μGraphs
        # of the H200 decoder layers multiply so, and timed 140-302 μs against 8.5-9 μs for
        # their programs op by op (docs/results.md, "A loop introduced")
        ea, eb = f"tl.reshape({ea}, {(n * pa[-2], pa[-1])})", f"tl.reshape({eb}, {pb[-2:]})"
        return f"tl.reshape(tl.dot({ea}, {eb}, out_dtype=tl.float32{prec}), {pt})"
    if len(a.pshape) < r or tuple(a.pshape[:-2]) != batch:
        ea = f"tl.broadcast_to({ea}, {pa})"
    if len(b.pshape) < r or tuple(b.pshape[:-2]) != batch:
        eb = f"tl.broadcast_to({eb}, {pb})"
    if n == 1:
        # a batch of one: a 2-D dot (Triton's 3-D dot takes a slower path on GPU)
        ea, eb = f"tl.reshape({ea}, {pa[-2:]})", f"tl.reshape({eb}, {pb[-2:]})"
        return f"tl.reshape(tl.dot({ea}, {eb}, out_dtype=tl.float32{prec}), {pt})"
    if r == 3:
        return f"tl.dot({ea}, {eb}, out_dtype=tl.float32{prec})"
    ea, eb = f"tl.reshape({ea}, {(n,) + pa[-2:]})", f"tl.reshape({eb}, {(n,) + pb[-2:]})"
    return f"tl.reshape(tl.dot({ea}, {eb}, out_dtype=tl.float32{prec}), {pt})"


def shared_right(a: Val, b: Val, batch: tuple) -> bool:
    """Whether a batched matmul's right operand is one matrix for the whole batch (its batch
    dims absent or all 1) while the left one holds every batch element: then the batch's
    rows multiply it in one 2-D ``tl.dot``."""
    return all(x == 1 for x in b.pshape[:-2]) and tuple(a.pshape[:-2]) == tuple(batch)


def k_last(em: Emitter, op: Op, tb) -> bool:
    """Whether a CUDA-core matmul multiplies over (.., m, n, k) rather than (.., m, k, n):
    when its right operand was loaded with k, not n, as the dim next to each other in memory
    — a key-major cache read as K^T in ``q @ k.transpose(-1, -2)``. Over (m, k, n) the
    threads of a warp lie along n, and each reads the staged tile 2 × head-dim bytes from
    its neighbour: every lane in one shared-memory bank. Phi-3-mini's one-row decode over
    2,304 keys (H200) ran 47.2 μs so against 10.5 with K^T stored key-minor; over (m, n, k)
    the lanes read along k, as stored, and sum across the warp. An un-reduced product
    (summed after the loop) keeps (m, k, n), the accumulator's order."""
    return op.id not in em.info.deferred and k_major(tb, [s.strides for s in em.src])


def _cuda_core(em: Emitter, op: Op, tb, a: Val, b: Val) -> str:
    """out[.., m, n] = Σ_k a[.., m, k] · b[.., k, n] as a broadcast product over
    (.., m, k, n) in fp32, summed over k (no padding to tl.dot's 16) — or not summed,
    for a product the accumulator adds up un-reduced; over (.., m, n, k) when b lies
    k-major in memory (:func:`k_last`)."""
    r = op.outputs[0].ndim
    ka, kb = len(a.pshape) - 1, len(b.pshape) - 2
    ea = em.align(em.read_padding(a, [ka], op.kind), len(a.pshape), r)
    eb = em.align(em.read_padding(b, [kb], op.kind), len(b.pshape), r)
    ea, eb = (e if x.f32 else f"({e}).to(tl.float32)" for e, x in ((ea, a), (eb, b)))
    if k_last(em, op, tb):
        perm = tuple(range(r - 2)) + (r - 1, r - 2)
        ea = f"{ea}[{', '.join([':'] * (r - 1) + ['None', ':'])}]"
        eb = f"tl.permute({eb}, {perm})[{', '.join([':'] * (r - 2) + ['None', ':', ':'])}]"
        return f"tl.sum({ea} * {eb}, axis={r})"
    ea = f"{ea}[{', '.join([':'] * r + ['None'])}]"
    eb = f"{eb}[{', '.join([':'] * (r - 2) + ['None', ':', ':'])}]"
    prod = f"{ea} * {eb}"
    if op.id in em.info.deferred:
        return prod  # summed over k after the loop (emit_accum, the kernel's loop block)
    return f"tl.sum({prod}, axis={r - 1})"


def emit_matmul(em: Emitter, op: Op) -> None:
    """Padding of the result: rows are clean when a's rows are (and b is finite), columns
    when b's columns are (and a is finite); batch dims are never padded by a matmul."""
    t = op.outputs[0]
    r = t.ndim
    pairs = em.p.split_matmuls.get(op.id) or [tuple(op.inputs)]
    parts = []
    clean: set = set(range(r))
    finite = True
    for ta, tb in pairs:
        a, b = em.vals[ta.id], em.vals[tb.id]
        if op.id in em.info.dot_ops:
            parts.append(_dot(em, op, ta, tb, a, b))
        else:
            parts.append(_cuda_core(em, op, tb, a, b))
        ca = {r - 2} if (len(a.pshape) - 2) in a.clean and b.finite else set()
        cb = {r - 1} if (len(b.pshape) - 1) in b.clean and a.finite else set()
        clean &= ca | cb | set(range(r - 2))
        finite = finite and a.finite and b.finite
    clean = {d for d in clean if d >= r - 2}
    v = em.val(t, f32=True, clean=frozenset(clean), finite=finite)
    if op.id not in em.info.dot_ops:
        m, n = em.info.shape(t)[-2:]
        why = (f"m = {m}, n = {n}: small, KernelConfig.small_mm={em.cfg.small_mm!r}"
               if em.cfg.small_mm != "dot" and min(m, n) < 16 else "no tl.dot for this shape")
        order = "(m, n, k), b read k-major" if k_last(em, op, pairs[0][1]) else "(m, k, n)"
        em.emit(f"# on the CUDA cores in fp32 ({why}): a broadcast product over {order}, summed over k")
    if op.id in em.info.deferred:
        # the un-reduced product (.., m, k, n): the accumulator adds it up as is
        kp = em.info.padded(op.inputs[0])[-1]
        v.pshape = v.pshape[:-1] + (kp,) + v.pshape[-1:]
        v.rshape = v.rshape[:-1] + (kp,) + v.rshape[-1:]
        em.emit("# not reduced over k here: accumulated as is, summed once after the loop")
    em.emit(f"{v.name} = {' + '.join(parts)}")
