"""Exact rewrites of a piece's Program before its search (docs/design.md §10.3).

ATen spells a normalization ``x * rsqrt(v)``, which the rows build as
``x * (1 / sqrt(v))``: a constant, a division and a product where ``x / sqrt(v)``
says the same with one op. The search matches what the program's abstract
expression allows, and its axioms have no ``1·x = x``, so the longer form makes it
carry the constant into the kernel (``x·1``) and spend two block ops on it — on an
RMSNorm + projection piece, the one that sits at the search's op budget. The
rewrite is an identity of real numbers (``a · (1/b) = a/b`` wherever ``b ≠ 0``,
and where ``b = 0`` both are undefined), so the Program means what the capture
said; the verifier checks candidates against the rewritten Program.
"""

from __future__ import annotations

from fractions import Fraction

from ..core.ir import Program, Tensor
from ..core.ops import CATALOG, Category, category
from ..core.oprules import broadcast_shapes
from ..core.rewrite import Rebuild, live_graph, rebuild


def _binary(kind: str, lax: str) -> bool:
    """An element-wise binary op of that Lax class (the catalog's product: multilinear;
    its quotient: division) — asked of the catalog's traits, not of names."""
    return category(kind) is Category.BINARY and CATALOG[kind].lax == lax


def _reciprocal_of(t: Tensor) -> Tensor | None:
    """``b`` if ``t`` is ``1 / b`` (a division of the constant 1), else None."""
    op = t.op
    if not _binary(op.kind, "division"):
        return None
    one, b = op.inputs
    if category(one.op.kind) is not Category.CONSTANT or Fraction(one.op.attrs["value"]) != 1:
        return None
    return b


def fold_reciprocals(p: Program) -> Program:
    """``p`` with every ``mul(a, div(1, b))`` (either operand order) written
    ``div(a, b)`` where that has the product's shape, and the reciprocals nothing
    else reads dropped; ``p`` itself when there is none."""
    replace = {}
    for op in p.ops:
        if not _binary(op.kind, "multilinear"):
            continue
        for k in (0, 1):
            b = _reciprocal_of(op.inputs[k])
            a = op.inputs[1 - k]
            if b is not None and broadcast_shapes(a.shape, b.shape) == op.outputs[0].shape:
                def build(rb: Rebuild, _op, a=a, b=b, div=op.inputs[k].op.kind):
                    return [rb.graph.add_op(div, [rb.get(a), rb.get(b)], {})]
                replace[(op.id, None)] = build
                break
    if not replace:
        return p
    return live_graph(rebuild(p, replace=replace))
