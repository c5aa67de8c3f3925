"""Functional ops of the public API (``mg.matmul``, ``mg.add``, …).

Each builds one catalog op in the graph of its tensor arguments — a Program, a
hand-written kernel graph or a block graph alike. Python scalars become exact
rational constants: ``x * 0.5`` is ``scale(x, 1/2)``, ``x + 1`` adds a ``const``.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import TYPE_CHECKING, Sequence

from .checks import _is_sequence, rational, short, strict_int
from .errors import ArgumentTypeError, ConstantError, ShapeError

if TYPE_CHECKING:
    from .ir import Tensor

Scalar = int | float | Fraction


class TensorOps:
    """Python's arithmetic operators on a mugraph tensor: ``x + y``, ``x * 0.5``,
    ``2 - x``, ``x @ w``, ``-x`` build ops in the tensor's graph through the
    functions of this module.

    :class:`mugraph.core.ir.Tensor` inherits them, so the IR takes its operators from the
    builder and the builder never imports the IR; it is also the type the builder's
    functions accept as a tensor."""

    __slots__ = ()

    def __add__(self, o):
        return add(self, o)

    def __radd__(self, o):
        return add(o, self)

    def __sub__(self, o):
        return sub(self, o)

    def __rsub__(self, o):
        return sub(o, self)

    def __mul__(self, o):
        return mul(self, o)

    def __rmul__(self, o):
        return mul(o, self)

    def __truediv__(self, o):
        return div(self, o)

    def __rtruediv__(self, o):
        return div(o, self)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    def __neg__(self):
        return scale(self, -1)


def _graph_of(*xs, what: str):
    for x in xs:
        if isinstance(x, TensorOps):
            return x.graph
    raise ArgumentTypeError(f"{what}: needs at least one mugraph Tensor argument, got "
                            f"{[type(x).__name__ for x in xs][:8]}")


def _tensor(x, what: str) -> Tensor:
    if not isinstance(x, TensorOps):
        raise ArgumentTypeError(f"{what}: expected a mugraph Tensor, got {type(x).__name__}")
    return x


def _is_scalar(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _scalar(c, what: str) -> Fraction:
    return rational(c, what)


def _dim(x: Tensor, dim: int, what: str) -> int:
    """A dim of ``x`` (negative counts from the end); a bool or a float is refused
    (``sum(x, True)`` is not ``sum(x, 1)``)."""
    if type(dim) is not int:
        raise ArgumentTypeError(f"{what}: dim {short(dim)} is a {type(dim).__name__}, not an int")
    if not -x.ndim <= dim < x.ndim:
        raise ShapeError(f"{what}: dim {dim} out of range for {x.label()} {x.shape}")
    return dim % x.ndim


def _ints(v, what: str) -> tuple[int, ...]:
    if not _is_sequence(v):
        raise ArgumentTypeError(f"{what}: {short(v)} must be a sequence of ints")
    return tuple(strict_int(s, what) for s in v)


def constant(value: Scalar, like: Tensor) -> Tensor:
    """A rational constant shaped to broadcast against ``like`` (all dims 1)."""
    _tensor(like, "const: like")
    return like.graph.add_op("const", [], {"value": _scalar(value, "const"), "shape": (1,) * like.ndim,
                                           "dtype": like.dtype})


def _binary(kind: str, a, b) -> Tensor:
    g = _graph_of(a, b, what=kind)
    if _is_scalar(a):
        a = constant(a, b)
    if _is_scalar(b):
        b = constant(b, a)
    if not isinstance(a, TensorOps) or not isinstance(b, TensorOps):
        raise ArgumentTypeError(f"{kind}: operands must be Tensors or real scalars, got {type(a).__name__}, "
                                f"{type(b).__name__}")
    return g.add_op(kind, [a, b])


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` over the last two dims; leading dims broadcast."""
    return _tensor(a, "matmul: a").graph.add_op("matmul", [a, _tensor(b, "matmul: b")])


def add(a, b) -> Tensor:
    return _binary("add", a, b)


def sub(a, b) -> Tensor:
    return _binary("sub", a, b)


def mul(a, b) -> Tensor:
    if _is_scalar(a):
        a, b = b, a
    if isinstance(a, TensorOps) and _is_scalar(b):
        return scale(a, b)
    return _binary("mul", a, b)


def div(a, b) -> Tensor:
    if isinstance(a, TensorOps) and _is_scalar(b):
        c = _scalar(b, "div")
        if c == 0:
            raise ConstantError(f"div: {a.label()} divided by the constant 0")
        return scale(a, 1 / c)
    return _binary("div", a, b)


def scale(x: Tensor, c: Scalar) -> Tensor:
    """``x * c`` for a rational constant ``c``."""
    return _tensor(x, "scale").graph.add_op("scale", [x], {"c": _scalar(c, "scale")})


def exp(x: Tensor) -> Tensor:
    return _tensor(x, "exp").graph.add_op("exp", [x])


def sqrt(x: Tensor) -> Tensor:
    return _tensor(x, "sqrt").graph.add_op("sqrt", [x])


def square(x: Tensor) -> Tensor:
    return _tensor(x, "square").graph.add_op("square", [x])


def silu(x: Tensor) -> Tensor:
    return _tensor(x, "silu").graph.add_op("silu", [x])


# ----------------------------------------------------------------- composites
# Functions the catalog expresses: built from catalog ops, so the verifier proves them like
# any other Lax expression and every stage handles them without a row of its own (a new
# primitive costs a catalog entry and a row per facet table: docs/adding-an-op.md).

#: GeLU's tanh approximation: ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` (as torch's
#: ``gelu(approximate="tanh")``; √(2/π) as the float64 torch rounds it to)
GELU_TANH_C = Fraction(math.sqrt(2 / math.pi))
GELU_TANH_CUBIC = Fraction("0.044715")


def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + exp(−x))``: one exp, so it counts as one exponentiation on its paths."""
    return div(1, add(exp(scale(_tensor(x, "sigmoid"), -1)), 1))


def tanh(x: Tensor) -> Tensor:
    """``2·sigmoid(2x) − 1 = 1 − 2 / (1 + exp(2x))``: one exp."""
    return sub(1, div(2, add(exp(scale(_tensor(x, "tanh"), 2)), 1)))


def gelu_tanh(x: Tensor) -> Tensor:
    """GeLU's tanh approximation, ``0.5·x·(1 + tanh(y))`` with ``y = √(2/π)·(x + 0.044715·x³)``,
    written as ``x · sigmoid(2y)`` (the same function: ``(1 + tanh y)/2 = sigmoid(2y)``): one
    exp of a cubic."""
    x = _tensor(x, "gelu_tanh")
    y = scale(add(x, scale(mul(square(x), x), GELU_TANH_CUBIC)), 2 * GELU_TANH_C)
    return div(x, add(exp(scale(y, -1)), 1))


def sum(x: Tensor, dim: int) -> Tensor:  # noqa: A001 - the public name mirrors the op
    """Sum along ``dim``; the dim is kept with size 1."""
    return _tensor(x, "sum").graph.add_op("sum", [x], {"dim": _dim(x, dim, "sum")})


def max(x: Tensor, dim: int) -> Tensor:  # noqa: A001
    """Max along ``dim`` (size 1 kept). Not Lax: such programs are only float-comparable."""
    return _tensor(x, "max").graph.add_op("max", [x], {"dim": _dim(x, dim, "max")})


def mean(x: Tensor, dim: int) -> Tensor:
    d = _dim(_tensor(x, "mean"), dim, "mean")
    return scale(sum(x, d), Fraction(1, x.shape[d]))


def rms_norm(x: Tensor, dim: int = -1) -> Tensor:
    """``x / sqrt(mean(x*x, dim))`` expanded into catalog ops (no weight, no epsilon)."""
    d = _dim(_tensor(x, "rms_norm"), dim, "rms_norm")
    return div(x, sqrt(mean(square(x), d)))


def concat(xs: Sequence[Tensor], dim: int) -> Tensor:
    if not _is_sequence(xs) or not xs:
        raise ArgumentTypeError(f"concat: expected a non-empty list of Tensors, got {short(xs)}")
    xs = [_tensor(x, f"concat: xs[{i}]") for i, x in enumerate(xs)]
    return xs[0].graph.add_op("concat", xs, {"dim": _dim(xs[0], dim, "concat")})


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    return _tensor(x, "reshape").graph.add_op("reshape", [x], {"shape": _ints(shape, "reshape: shape")})


def repeat(x: Tensor, reps: Sequence[int]) -> Tensor:
    return _tensor(x, "repeat").graph.add_op("repeat", [x], {"reps": _ints(reps, "repeat: reps")})


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    """``x`` with its dims reordered: output dim ``o`` is input dim ``dims[o]`` (negative
    dims count from the end), as ``torch.permute``. Lowering folds it into the strides
    of the load that reads it; no data moves."""
    x = _tensor(x, "permute")
    dims = _ints(dims, "permute: dims")
    if len(dims) != x.ndim:
        raise ShapeError(f"permute: dims {dims} name {len(dims)} dims, {x.label()} {x.shape} has {x.ndim}")
    perm = tuple(_dim(x, d, "permute") for d in dims)
    if len(set(perm)) != len(perm):
        raise ShapeError(f"permute: dims {dims} repeat a dim of {x.label()} {x.shape}")
    return x.graph.add_op("permute", [x], {"perm": perm})


def slice(x: Tensor, dim: int, start: int, end: int, step: int = 1) -> Tensor:  # noqa: A001 - torch's word
    """The window ``start:end:step`` of ``x`` along ``dim`` (as ``x[..., start:end:step]``;
    negative ``dim``, ``start`` and ``end`` count from the end; anything outside the dim
    is refused, not clipped). Kernel level only: lowering reads it as a view of its input
    (the input's strides from an offset), so no element moves."""
    x = _tensor(x, "slice")
    d = _dim(x, dim, "slice")
    n = x.shape[d]
    idx = []
    for name, v in (("start", start), ("end", end), ("step", step)):
        v = strict_int(v, f"slice: {name}")
        idx.append(v + n if v < 0 and name != "step" else v)
    a, b, st = idx
    if st < 1 or not 0 <= a < b <= n:
        raise ShapeError(f"slice: [{start}:{end}:{step}] of dim {dim} of {x.label()} {x.shape} is not a non-empty "
                         f"window (0 <= start < end <= {n}, step >= 1)")
    return x.graph.add_op("slice", [x], {"dim": d, "start": a, "end": b, "step": st})


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """``x`` with dims ``dim0`` and ``dim1`` swapped (a :func:`permute`), as ``torch.transpose``."""
    x = _tensor(x, "transpose")
    d0, d1 = _dim(x, dim0, "transpose"), _dim(x, dim1, "transpose")
    perm = list(range(x.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return x.graph.add_op("permute", [x], {"perm": tuple(perm)})
