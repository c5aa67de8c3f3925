"""Emission of element-wise ops: constants, unary and binary ops, in fp32."""

from __future__ import annotations

from mugraph.ir import Op

from .core import Emitter, fmt_number

UNARY = {
    "exp": lambda a, op: f"tl.exp({a})",
    "sqrt": lambda a, op: f"tl.sqrt({a})",
    "square": lambda a, op: f"{a} * {a}",
    "silu": lambda a, op: f"{a} * tl.sigmoid({a})",
    "scale": lambda a, op: f"{a} * {fmt_number(op.attrs.get('c', 1))}",
}
"""Unary op -> its fp32 Triton expression of the operand ``a``."""

ZERO_PRESERVING = ("square", "silu", "scale", "sqrt")
"""Unary ops that map 0 to 0: a clean (zero) padding stays clean."""

BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def emit_const(em: Emitter, op: Op) -> None:
    t = op.outputs[0]
    v = em.val(t, f32=True, clean=frozenset(), finite=True)
    em.emit(f"{v.name} = tl.full({v.pshape}, {fmt_number(op.attrs['value'])}, tl.float32)")


def emit_unary(em: Emitter, op: Op) -> None:
    """Padding: kept clean by zero-preserving ops; ``exp`` makes it non-zero, and it stays
    finite except after ``exp``, or ``sqrt`` of padding not known to be zero."""
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    k = op.kind
    expr = UNARY[k](em.f32(x), op)
    clean = x.clean if k in ZERO_PRESERVING else frozenset()
    finite = (x.finite and (k != "sqrt" or not [d for d in em.padded_dims(x) if d not in x.clean])
              and k != "exp")
    v = em.val(t, f32=True, clean=clean, finite=finite)
    em.emit(f"{v.name} = {expr}")


def emit_binary(em: Emitter, op: Op) -> None:
    """Broadcasting binary op. Padding of the result is clean along a padded dim when
    both operands span it cleanly (``add``, ``sub``) or one does and both are finite
    (``mul``); ``div`` may make it non-finite."""
    t = op.outputs[0]
    xs = [em.vals[x.id] for x in op.inputs]
    r = t.ndim
    a, b = (em.align(em.f32(x), len(x.pshape), r) for x in xs)
    pt, rt = em.info.padded(t), em.info.shape(t)
    clean = set()
    for d in range(r):
        if pt[d] == rt[d]:
            continue
        full = []  # operands spanning this dim (not broadcast), with their own dim index
        for x in xs:
            dx = d - (r - len(x.pshape))
            full.append(dx >= 0 and x.rshape[dx] == rt[d] and dx in x.clean)
        if op.kind in ("add", "sub") and all(full):
            clean.add(d)
        elif op.kind == "mul" and any(full) and all(x.finite for x in xs):
            clean.add(d)
    finite = all(x.finite for x in xs) and op.kind != "div"
    v = em.val(t, f32=True, clean=frozenset(clean), finite=finite)
    em.emit(f"{v.name} = {a} {BINARY[op.kind]} {b}")
