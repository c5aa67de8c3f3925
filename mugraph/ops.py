"""The op catalog: one definition per op — name, arity, levels, shape rule, Lax class.

This is the single place where an op's meaning at the graph level lives. Every
stage keeps its own table for its facet (float/field evaluation in the algebras,
abstract expressions in ``search``, Triton emission in ``lower``) keyed by the op
name, and each stage's tests assert that its table covers every name in
:data:`CATALOG`. Adding an operator = one entry here + one row per table.

Levels: ``"K"`` kernel graph (a pre-defined kernel op run by a library),
``"B"`` block graph (an op on tiles inside a graph-defined kernel).

Lax classes (paper §5): ``linear``, ``multilinear``, ``division``,
``exponentiation`` (at most one exp-like op on any path), ``sqrt`` and ``silu``
(supported by the field algebra but outside the theorem's class; silu contains an
exp and counts as one for the path rule), and ``none`` (outside the Lax fragment:
programs using it can only be compared in floating point).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .errors import ShapeError, UnsupportedOpError

Shape = tuple[int, ...]
ShapeRule = Callable[[Sequence[Shape], dict], Shape]

MAX_RANK = 4


def broadcast_shapes(a: Shape, b: Shape) -> Shape:
    """Numpy broadcasting (right-aligned; a size-1 dim stretches)."""
    n = max(len(a), len(b))
    a1 = (1,) * (n - len(a)) + tuple(a)
    b1 = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a1, b1):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _elementwise(shapes: Sequence[Shape], attrs: dict) -> Shape:
    out = shapes[0]
    for s in shapes[1:]:
        out = broadcast_shapes(out, s)
    return out


def _same(shapes: Sequence[Shape], attrs: dict) -> Shape:
    return tuple(shapes[0])


def _matmul(shapes: Sequence[Shape], attrs: dict) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"needs operands of rank >= 2, got {tuple(a)} @ {tuple(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"inner dims differ: {tuple(a)} @ {tuple(b)} ({a[-1]} != {b[-2]})")
    lead = broadcast_shapes(a[:-2], b[:-2]) if (a[:-2] or b[:-2]) else ()
    return tuple(lead) + (a[-2], b[-1])


def _check_dim(shape: Shape, dim: int) -> None:
    if not 0 <= dim < len(shape):
        raise ShapeError(f"dim {dim} out of range for shape {tuple(shape)}")


def _reduce(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    _check_dim(s, attrs["dim"])
    out = list(s)
    out[attrs["dim"]] = 1
    return tuple(out)


def _concat(shapes: Sequence[Shape], attrs: dict) -> Shape:
    dim = attrs["dim"]
    first = shapes[0]
    _check_dim(first, dim)
    total = 0
    for s in shapes:
        if len(s) != len(first) or any(x != y for i, (x, y) in enumerate(zip(s, first)) if i != dim):
            raise ShapeError(f"shapes {[tuple(x) for x in shapes]} differ outside dim {dim}")
        total += s[dim]
    out = list(first)
    out[dim] = total
    return tuple(out)


def _reshape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    new = tuple(attrs["shape"])
    if _numel(s) != _numel(new):
        raise ShapeError(f"cannot reshape {tuple(s)} ({_numel(s)} elements) to {new} ({_numel(new)})")
    return new


def _repeat(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    reps = tuple(attrs["reps"])
    if len(reps) != len(s) or any(r < 1 for r in reps):
        raise ShapeError(f"reps {reps} must be one positive count per dim of {tuple(s)}")
    return tuple(x * r for x, r in zip(s, reps))


def _const(shapes: Sequence[Shape], attrs: dict) -> Shape:
    return tuple(attrs["shape"])


def _numel(s: Shape) -> int:
    n = 1
    for x in s:
        n *= x
    return n


@dataclass(frozen=True)
class OpDef:
    """One catalog entry.

    ``arity`` is the number of tensor inputs (``-1``: one or more). ``attrs`` names
    the attributes the op carries (their meaning is in ``doc``). ``elementwise`` ops
    are the ones a thread graph may fuse.
    """

    name: str
    arity: int
    levels: str
    lax: str
    shape_rule: ShapeRule
    attrs: tuple[str, ...] = ()
    elementwise: bool = False
    commutative: bool = False
    doc: str = ""


def _op(name, arity, levels, lax, rule, attrs=(), elementwise=False, commutative=False, doc=""):
    return OpDef(name, arity, levels, lax, rule, tuple(attrs), elementwise, commutative, doc)


CATALOG: dict[str, OpDef] = {
    d.name: d
    for d in [
        _op("matmul", 2, "KB", "multilinear", _matmul,
            doc="(…,m,k)@(…,k,n) -> (…,m,n); leading dims broadcast"),
        _op("add", 2, "KB", "linear", _elementwise, elementwise=True, commutative=True,
            doc="element-wise a+b; size-1 dims broadcast"),
        _op("sub", 2, "KB", "linear", _elementwise, elementwise=True, doc="element-wise a-b"),
        _op("mul", 2, "KB", "multilinear", _elementwise, elementwise=True, commutative=True,
            doc="element-wise a*b"),
        _op("div", 2, "KB", "division", _elementwise, elementwise=True, doc="element-wise a/b"),
        _op("exp", 1, "KB", "exponentiation", _same, elementwise=True, doc="e**x; at most one per path"),
        _op("sqrt", 1, "KB", "sqrt", _same, elementwise=True, doc="square root"),
        _op("square", 1, "KB", "multilinear", _same, elementwise=True, doc="x*x"),
        _op("silu", 1, "KB", "silu", _same, elementwise=True, doc="x/(1+e**-x); counts as an exp"),
        _op("scale", 1, "KB", "linear", _same, attrs=("c",), elementwise=True,
            doc="x*c for a rational constant c"),
        _op("const", 0, "KB", "linear", _const, attrs=("value", "shape"), elementwise=True,
            doc="a rational constant filling `shape` (all-ones dims; it broadcasts)"),
        _op("sum", 1, "KB", "linear", _reduce, attrs=("dim",), doc="sum along dim; dim becomes 1"),
        _op("max", 1, "KB", "none", _reduce, attrs=("dim",),
            doc="max along dim; dim becomes 1 (not Lax: float comparison only)"),
        _op("concat", -1, "KB", "linear", _concat, attrs=("dim",), doc="join along dim"),
        _op("reshape", 1, "KB", "linear", _reshape, attrs=("shape",), doc="row-major reshape"),
        _op("repeat", 1, "KB", "linear", _repeat, attrs=("reps",), doc="tile each dim reps[d] times"),
    ]
}

#: ops whose path rule counts as one exponentiation
EXP_LIKE = frozenset({"exp", "silu"})

#: structural ops of the IR that are not catalog entries (they have no meaning on
#: their own outside a graph): kernel input, graph-defined op, input iterator,
#: accumulator. Output savers are records of a block graph, not ops.
STRUCTURAL = ("input", "graph_defined", "iterator", "accum")


def get_op(name: str) -> OpDef:
    try:
        return CATALOG[name]
    except KeyError:
        raise UnsupportedOpError(f"unknown op {name!r}; the catalog has {sorted(CATALOG)}") from None

