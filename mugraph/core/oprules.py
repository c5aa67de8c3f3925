"""Shape and dim rules of the catalog's ops (:mod:`mugraph.core.ops`).

A shape rule gives an op's output shape from its input shapes and attributes (or
raises :class:`~mugraph.core.errors.ShapeError`); a dim rule says how the output's dims
follow the inputs' (:class:`DimMap`), which is what lowering's tile-dim unification
and the search's index labels read instead of the op's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import ShapeError

Shape = tuple[int, ...]
ShapeRule = Callable[[Sequence[Shape], dict], Shape]


@dataclass(frozen=True)
class DimMap:
    """How the dims of one op's output follow the dims of its inputs (for given shapes).

    ``same``: ``(input, input dim, output dim)`` — the same axis; the input's size is the
    output's, or 1 (broadcast). ``contracted``: groups of ``(input, dim)`` that are one
    axis, summed over (a matmul's k). ``reduced``: ``(input, dim)`` folded into the
    output's size-1 dim of the same index. ``moved_in``/``moved_out``: input dims
    ``(input, dim)`` and output dims whose elements change place (concat's dim,
    reshape's dims, repeat's repeated dims): no axis of one side is an axis of the other.
    """

    same: tuple[tuple[int, int, int], ...] = ()
    contracted: tuple[tuple[tuple[int, int], ...], ...] = ()
    reduced: tuple[tuple[int, int], ...] = ()
    moved_in: tuple[tuple[int, int], ...] = ()
    moved_out: tuple[int, ...] = ()


DimRule = Callable[[Sequence[Shape], dict, Shape], DimMap]


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


def broadcast_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    out = shapes[0]
    for s in shapes[1:]:
        out = broadcast_shapes(out, s)
    return out


def same_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    return tuple(shapes[0])


def matmul_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"needs operands of rank >= 2, got {tuple(a)} @ {tuple(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"inner dims differ: {tuple(a)} @ {tuple(b)} ({a[-1]} != {b[-2]})")
    lead = broadcast_shapes(a[:-2], b[:-2]) if (a[:-2] or b[:-2]) else ()
    return tuple(lead) + (a[-2], b[-1])


def check_dim(shape: Shape, dim: int) -> None:
    if not 0 <= dim < len(shape):
        raise ShapeError(f"dim {dim} out of range for shape {tuple(shape)}")


def reduce_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    check_dim(s, attrs["dim"])
    out = list(s)
    out[attrs["dim"]] = 1
    return tuple(out)


def concat_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    dim = attrs["dim"]
    first = shapes[0]
    check_dim(first, dim)
    total = 0
    for s in shapes:
        if len(s) != len(first) or any(x != y for i, (x, y) in enumerate(zip(s, first)) if i != dim):
            raise ShapeError(f"shapes {[tuple(x) for x in shapes]} differ outside dim {dim}")
        total += s[dim]
    out = list(first)
    out[dim] = total
    return tuple(out)


def reshape_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    new = tuple(attrs["shape"])
    if math.prod(s) != math.prod(new):
        raise ShapeError(f"cannot reshape {tuple(s)} ({math.prod(s)} elements) to {new} ({math.prod(new)})")
    return new


def repeat_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    reps = tuple(attrs["reps"])
    if len(reps) != len(s) or any(r < 1 for r in reps):
        raise ShapeError(f"reps {reps} must be one positive count per dim of {tuple(s)}")
    return tuple(x * r for x, r in zip(s, reps))


def permute_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    (s,) = shapes
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(len(s))):
        raise ShapeError(f"perm {perm} is not a permutation of the {len(s)} dims of {tuple(s)}")
    return tuple(s[p] for p in perm)


def slice_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    """The window ``start:end:step`` of dim ``dim``: ``len(range(start, end, step))`` elements."""
    (s,) = shapes
    dim, start, end, step = attrs["dim"], attrs["start"], attrs["end"], attrs["step"]
    check_dim(s, dim)
    if step < 1 or not 0 <= start < end <= s[dim]:
        raise ShapeError(f"slice [{start}:{end}:{step}] of dim {dim} is not a non-empty window of {tuple(s)} "
                         f"(0 <= start < end <= {s[dim]}, step >= 1)")
    out = list(s)
    out[dim] = len(range(start, end, step))
    return tuple(out)


def const_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    return tuple(attrs["shape"])


def dims_elementwise(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    """Right-aligned: the last dims line up (numpy broadcasting)."""
    return DimMap(same=tuple((i, d, d + len(out) - len(s)) for i, s in enumerate(shapes) for d in range(len(s))))


def dims_reduce(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    (s,) = shapes
    dim = attrs["dim"]
    return DimMap(same=tuple((0, d, d) for d in range(len(s)) if d != dim), reduced=((0, dim),))


def dims_matmul(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    a, b = shapes
    r = len(out)
    batch = tuple((i, d, d + r - len(x)) for i, x in enumerate((a, b)) for d in range(len(x) - 2))
    return DimMap(same=batch + ((0, len(a) - 2, r - 2), (1, len(b) - 1, r - 1)),
                  contracted=(((0, len(a) - 1), (1, len(b) - 2)),))


def dims_none(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    return DimMap()


def dims_concat(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    dim = attrs["dim"]
    return DimMap(same=tuple((i, d, d) for i, s in enumerate(shapes) for d in range(len(s)) if d != dim),
                  moved_in=tuple((i, dim) for i in range(len(shapes))), moved_out=(dim,))


def dims_reshape(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    return DimMap(moved_in=tuple((0, d) for d in range(len(shapes[0]))), moved_out=tuple(range(len(out))))


def dims_repeat(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    reps = attrs["reps"]
    return DimMap(same=tuple((0, d, d) for d, r in enumerate(reps) if r == 1),
                  moved_in=tuple((0, d) for d, r in enumerate(reps) if r != 1),
                  moved_out=tuple(d for d, r in enumerate(reps) if r != 1))


def dims_slice(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    """The other dims are the same axes; the sliced dim's elements change place (its
    output index ``i`` is input index ``start + i·step``), like a concat's dim."""
    (s,) = shapes
    dim = attrs["dim"]
    return DimMap(same=tuple((0, d, d) for d in range(len(s)) if d != dim), moved_in=((0, dim),), moved_out=(dim,))


def dims_permute(shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    """Output dim ``o`` is input dim ``perm[o]``: the same axis, only its place in the
    layout changes (so a tile dim unifies across a permute, and a load can read it
    through the permuted strides)."""
    return DimMap(same=tuple((0, p, o) for o, p in enumerate(attrs["perm"])))
