"""Emission of element-wise ops: constants, unary and binary ops, in fp32.

A unary or binary op's row in :data:`lower.emit.EMITTERS` is made by :func:`unary` or
:func:`binary` from its Triton expression; what the result's padding holds follows
from the op's padding rule in the catalog (:class:`mugraph.core.ops.Padding`)."""

from __future__ import annotations

from typing import Callable

from mugraph.core.ir import Op
from mugraph.core.ops import get_op

from .core import Emitter, fmt_number

UnaryExpr = Callable[[str, Op], str]


def emit_const(em: Emitter, op: Op) -> None:
    t = op.outputs[0]
    v = em.val(t, f32=True, clean=frozenset(), finite=True)
    em.emit(f"{v.name} = tl.full({v.pshape}, {fmt_number(op.attrs['value'])}, tl.float32)")


def unary(expr: UnaryExpr) -> Callable[[Emitter, Op], None]:
    """The emitter of a unary op whose fp32 Triton expression of the operand ``a`` is
    ``expr(a, op)``."""
    def emit(em: Emitter, op: Op) -> None:
        _emit_unary(em, op, expr)
    return emit


def _emit_unary(em: Emitter, op: Op, expr: UnaryExpr) -> None:
    """Padding: clean dims stay clean when f(0) = 0 (``zero="keeps"``); the result is
    finite when the operand is, except after an op that may overflow (``"never"``) or
    one that is finite only on zero padding (``"if_zero"``) read where it is not."""
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    rule = get_op(op.kind).padding
    clean = x.clean if rule.zero == "keeps" else frozenset()
    finite = (x.finite and rule.finite != "never"
              and (rule.finite != "if_zero" or not [d for d in em.padded_dims(x) if d not in x.clean]))
    v = em.val(t, f32=True, clean=clean, finite=finite)
    em.emit(f"{v.name} = {expr(em.f32(x), op)}")


def binary(symbol: str) -> Callable[[Emitter, Op], None]:
    """The emitter of a broadcasting binary op written ``a <symbol> b`` in Triton."""
    def emit(em: Emitter, op: Op) -> None:
        _emit_binary(em, op, symbol)
    return emit


def _emit_binary(em: Emitter, op: Op, symbol: str) -> None:
    """Padding of the result, by the op's padding rule: clean along a padded dim when every
    operand spanning it is clean (``zero="all"``: add, sub) or one is and all are finite
    (``"any"``: mul); finite unless the op may divide by zero (``finite="never"``)."""
    t = op.outputs[0]
    xs = [em.vals[x.id] for x in op.inputs]
    rule = get_op(op.kind).padding
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
        if rule.zero == "all" and all(full):
            clean.add(d)
        elif rule.zero == "any" and any(full) and all(x.finite for x in xs):
            clean.add(d)
    finite = all(x.finite for x in xs) and rule.finite != "never"
    v = em.val(t, f32=True, clean=frozenset(clean), finite=finite)
    em.emit(f"{v.name} = {a} {symbol} {b}")
