"""The front end's op table: ATen ops as mugraph builder calls (docs/design.md §10.2).

One row per ATen overload a transformer block uses. A row turns the node's
arguments — its tensor arguments already mugraph tensors, the rest plain Python
values — into builder calls, or raises :class:`Unmapped` when this particular use
cannot be expressed (``pow(x, 3)``, a softmax over a dtype change, …). Whether a
node maps is decided by building it (see :mod:`.capture`), so the builder's own
shape, dtype and constant checks are the rules; this table holds no shape logic of
its own beyond translating ATen's conventions (negative dims, ``keepdim``, lists
of dims) into the catalog's (one dim, kept with size 1).

ATen ops not in the table stay torch calls; so do ops whose IR form is outside the
Lax fragment (``amax`` maps to the catalog's ``max``, which the partition keeps
outside every piece).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import torch

from ..core import builder as B
from ..core.errors import MugraphError

aten = torch.ops.aten


class Unmapped(MugraphError):
    """This use of an ATen op has no form in the catalog (the node stays a torch call)."""


@dataclass
class Context:
    """What a row may ask of the piece being built: constant tensors (RoPE's
    rotation matrix) become extra inputs of the piece, fed by the runtime."""

    make_input: Callable[[int, torch.Tensor], Any]
    constants: list = field(default_factory=list)

    def constant(self, t: torch.Tensor):
        """``t`` as a new input of the piece (its value is kept in ``constants``)."""
        self.constants.append(t)
        return self.make_input(len(self.constants) - 1, t)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotate-half, ``cat(-x[..., h:], x[..., :h])`` with ``h`` half the last dim.

    The capture replaces the slice/neg/cat pattern with a call of this function
    (so the graph still runs as torch where it is not mapped); mapped, it is
    ``x @ R`` for the constant signed permutation ``R`` — a multilinear op,
    inside the Lax fragment, where the slices are not."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_half_matrix(d: int, dtype: torch.dtype) -> torch.Tensor:
    """``R`` with ``x @ R == rotate_half(x)`` for a last dim of size ``d`` (even)."""
    h = d // 2
    r = torch.zeros(d, d, dtype=dtype)
    idx = torch.arange(h)
    r[idx + h, idx] = -1  # out[:, j] = -x[:, j + h] for j < h
    r[idx, idx + h] = 1   # out[:, j + h] = x[:, j]
    return r


def _dim(x, d: int) -> int:
    if type(d) is not int or not -x.ndim <= d < x.ndim:
        raise Unmapped(f"dim {d!r} of a rank-{x.ndim} tensor")
    return d % x.ndim


def _dims(x, dims) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({_dim(x, d) for d in dims})


def _drop(x, dims: list[int], shape_before) -> Any:
    keep = tuple(s for i, s in enumerate(shape_before) if i not in dims)
    if not keep:
        raise Unmapped("a reduction to a 0-dim tensor")
    return B.reshape(x, keep)


def _reduce(kind: str, x, dims, keepdim: bool = False, dtype=None):
    """``sum``/``mean``/``max`` over ``dims``: one catalog reduction per dim (``mean``
    is a ``sum`` scaled by ``1/n``)."""
    if dtype is not None:
        raise Unmapped(f"{kind} with dtype={dtype}")
    fold = {"sum": B.sum, "mean": B.sum, "max": B.max}[kind]
    ds = _dims(x, dims)
    shape = x.shape
    y = x
    for d in ds:
        y = fold(y, d)
    if kind == "mean":
        n = 1
        for d in ds:
            n *= shape[d]
        y = B.scale(y, Fraction(1, n))
    return y if keepdim else _drop(y, ds, shape)


def _alpha(y, alpha):
    return y if alpha == 1 else B.mul(y, alpha)


def _scalar_or_tensor(v):
    if isinstance(v, bool) or not isinstance(v, (int, float, B.TensorOps)):
        raise Unmapped(f"operand {type(v).__name__}")
    return v


def _binary(fn):
    def row(ctx, a, b, alpha=1):
        a, b = _scalar_or_tensor(a), _scalar_or_tensor(b)
        if not isinstance(a, B.TensorOps) and not isinstance(b, B.TensorOps):
            raise Unmapped("two scalars")
        return fn(a, _alpha(b, alpha) if isinstance(b, B.TensorOps) else b * alpha)
    return row


def _div(ctx, a, b, rounding_mode=None):
    if rounding_mode is not None:
        raise Unmapped(f"div with rounding_mode={rounding_mode!r}")
    return B.div(_scalar_or_tensor(a), _scalar_or_tensor(b))


def _pow(ctx, x, e):
    if isinstance(e, bool) or not isinstance(e, (int, float)):
        raise Unmapped("pow with a tensor exponent")
    if e == 2:
        return B.square(x)
    if e == 1:
        return x
    if e == 0.5:
        return B.sqrt(x)
    if e == -0.5:
        return B.div(1, B.sqrt(x))
    if e == -1:
        return B.div(1, x)
    raise Unmapped(f"pow with exponent {e}")


def _expand(ctx, x, size, implicit=False):
    size = list(size)
    if len(size) < x.ndim:
        raise Unmapped(f"expand of rank {x.ndim} to {size}")
    lead = len(size) - x.ndim
    src = (1,) * lead + tuple(x.shape)
    target = tuple(src[i] if s == -1 else s for i, s in enumerate(size))
    y = B.reshape(x, src) if lead else x
    reps = []
    for s, t in zip(src, target):
        if s == t:
            reps.append(1)
        elif s == 1:
            reps.append(t)
        else:
            raise Unmapped(f"expand of {tuple(x.shape)} to {tuple(size)}")
    return B.repeat(y, reps) if any(r != 1 for r in reps) else y


def _reshaped(x, shape):
    """``x`` in ``shape``: ``x`` itself when the shape is its own (no op: a copy or a
    view that changes nothing builds nothing, so the search never meets an identity)."""
    shape = tuple(shape)
    return x if shape == tuple(x.shape) else B.reshape(x, shape)


def _reshape(ctx, x, shape):
    shape = list(shape)
    if shape.count(-1) == 1:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        n = 1
        for s in x.shape:
            n *= s
        shape[shape.index(-1)] = n // known if known else 0
    return _reshaped(x, shape)


def _unsqueeze(ctx, x, d):
    if type(d) is not int or not -x.ndim - 1 <= d <= x.ndim:
        raise Unmapped(f"unsqueeze dim {d!r}")
    d = d % (x.ndim + 1)
    s = list(x.shape)
    s.insert(d, 1)
    return B.reshape(x, tuple(s))


def _squeeze(ctx, x, dims=None):
    ds = _dims(x, dims)
    s = tuple(n for i, n in enumerate(x.shape) if not (i in ds and n == 1))
    if not s:
        raise Unmapped("squeeze to a 0-dim tensor")
    return _reshaped(x, s)


#: float dtypes between which a cast may be absorbed into a piece (docs/design.md §10.3):
#: float32 and one narrower float; fp8, integers and bool change values beyond any of
#: their tolerances and stay torch calls
CAST_DTYPES = ("float16", "bfloat16", "float32")


def _copy(ctx, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
          memory_format=None):
    """``clone``/``contiguous``/``_to_copy``: a copy, i.e. identity in value: the row
    returns ``x`` itself and builds no op. A cast between two of :data:`CAST_DTYPES` is
    the identity too, at ``x``'s dtype: the probe records it as a cast, and the
    partition absorbs it only under the rule of §10.3 (the piece then runs at its
    narrow dtype); any other cast is unmapped."""
    if dtype is not None and str(dtype).removeprefix("torch.") != x.dtype:
        to = str(dtype).removeprefix("torch.")
        if x.dtype not in CAST_DTYPES or to not in CAST_DTYPES:
            raise Unmapped(f"a cast from {x.dtype} to {to}")
    return x


def _identity(ctx, x, *rest, **kw):
    return x


def _cat(ctx, xs, dim=0):
    xs = list(xs)
    if len(xs) == 1:
        return xs[0]
    return B.concat(xs, _dim(xs[0], dim))


def _transpose(ctx, x, d0, d1):
    return B.transpose(x, _dim(x, d0), _dim(x, d1))


def _t(ctx, x):
    """``x.t()``: a 2-d transpose; of a rank-0/1 tensor the identity."""
    return B.transpose(x, 0, 1) if x.ndim == 2 else x


def _permute(ctx, x, dims):
    dims = list(dims)
    if len(dims) != x.ndim:
        raise Unmapped(f"permute of a rank-{x.ndim} tensor by {dims}")
    return B.permute(x, [_dim(x, d) for d in dims])


def _window(x, dim, start, end) -> tuple[int, int, int]:
    """ATen's slice arguments as the catalog's: ``(dim, start, end)`` with ``None`` for
    the ends, negatives counted from the end and both clipped to the dim (torch's rule)."""
    d = _dim(x, dim)
    n = x.shape[d]
    out = []
    for v, default in ((start, 0), (end, n)):
        if v is None:
            v = default
        if type(v) is not int:
            raise Unmapped(f"slice bound {v!r}")
        out.append(min(max(v + n if v < 0 else v, 0), n))
    return d, out[0], out[1]


def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    """``x[..., start:end:step]``: the catalog's ``slice`` (a kernel-level view); the
    whole dim is the identity, an empty window has no form (the IR's dims are >= 1)."""
    d, a, b = _window(x, dim, start, end)
    if type(step) is not int or step < 1:
        raise Unmapped(f"slice step {step!r}")
    if a >= b:
        raise Unmapped(f"an empty slice [{start}:{end}] of dim {d} of {tuple(x.shape)}")
    if (a, b, step) == (0, x.shape[d], 1):
        return x
    return B.slice(x, d, a, b, step)


def _select(ctx, x, dim, index):
    """``x.select(dim, i)`` (``x[:, i]``): the one-element window, its dim dropped."""
    d = _dim(x, dim)
    if type(index) is not int or not -x.shape[d] <= index < x.shape[d]:
        raise Unmapped(f"select index {index!r} of dim {d} of {tuple(x.shape)}")
    i = index % x.shape[d]
    return _drop(B.slice(x, d, i, i + 1) if x.shape[d] > 1 else x, [d], x.shape)


def _split(x, split_size, dim=0):
    """``split`` as slices (traced through these, its pieces map one by one; torch's own
    decomposition would give ``as_strided``, which says nothing a row can read)."""
    n = x.shape[dim]
    return [aten.slice.Tensor(x, dim, s, min(s + split_size, n)) for s in range(0, n, split_size)]


def _split_with_sizes(x, sizes, dim=0):
    out, s = [], 0
    for k in sizes:
        out.append(aten.slice.Tensor(x, dim, s, s + k))
        s += k
    return out


def _addmm(ctx, bias, a, b, beta=1, alpha=1):
    return B.add(_alpha(B.matmul(a, b), alpha), _alpha(bias, beta))


def _rotate_half(ctx, x):
    d = x.shape[-1]
    if d % 2 or x.ndim < 2:
        raise Unmapped(f"rotate_half of shape {x.shape}")
    r = ctx.constant(rotate_half_matrix(d, getattr(torch, x.dtype)))
    return B.matmul(x, r)


def _gelu(ctx, x, approximate="none"):
    """GeLU: the tanh approximation is a builder composite; the exact one (erf) has no
    expression in the catalog's ops, so it stays torch code."""
    if approximate != "tanh":
        raise Unmapped(f"gelu(approximate={approximate!r}): erf is not expressible in Lax ops")
    return B.gelu_tanh(x)


#: ATen overload -> row. Ops a row can refuse are refused per use (``Unmapped``).
ROWS: dict[Any, Callable] = {
    aten.mm.default: lambda ctx, a, b: B.matmul(a, b),
    aten.bmm.default: lambda ctx, a, b: B.matmul(a, b),
    aten.matmul.default: lambda ctx, a, b: B.matmul(a, b),
    aten.addmm.default: _addmm,
    aten.add.Tensor: _binary(B.add),
    aten.add.Scalar: _binary(B.add),
    aten.sub.Tensor: _binary(B.sub),
    aten.sub.Scalar: _binary(B.sub),
    aten.rsub.Scalar: lambda ctx, a, b, alpha=1: B.sub(b, _alpha(a, alpha)),
    aten.rsub.Tensor: lambda ctx, a, b, alpha=1: B.sub(b, _alpha(a, alpha)),
    aten.mul.Tensor: _binary(B.mul),
    aten.mul.Scalar: _binary(B.mul),
    aten.div.Tensor: _div,
    aten.div.Scalar: _div,
    aten.div.Tensor_mode: _div,
    aten.neg.default: lambda ctx, x: B.scale(x, -1),
    aten.exp.default: lambda ctx, x: B.exp(x),
    aten.sqrt.default: lambda ctx, x: B.sqrt(x),
    aten.rsqrt.default: lambda ctx, x: B.div(1, B.sqrt(x)),
    aten.reciprocal.default: lambda ctx, x: B.div(1, x),
    aten.pow.Tensor_Scalar: _pow,
    aten.mean.dim: lambda ctx, x, dims=None, keepdim=False, dtype=None: _reduce("mean", x, dims, keepdim, dtype),
    aten.mean.default: lambda ctx, x, dtype=None: _reduce("mean", x, None, False, dtype),
    aten.sum.dim_IntList: lambda ctx, x, dims=None, keepdim=False, dtype=None: _reduce("sum", x, dims, keepdim, dtype),
    aten.sum.default: lambda ctx, x, dtype=None: _reduce("sum", x, None, False, dtype),
    aten.amax.default: lambda ctx, x, dims=(), keepdim=False: _reduce("max", x, dims, keepdim),
    aten.silu.default: lambda ctx, x: B.silu(x),
    aten.sigmoid.default: lambda ctx, x: B.sigmoid(x),
    aten.tanh.default: lambda ctx, x: B.tanh(x),
    aten.gelu.default: _gelu,
    aten.view.default: _reshape,
    aten._unsafe_view.default: _reshape,
    aten.reshape.default: _reshape,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dim: lambda ctx, x, d: _squeeze(ctx, x, [d]),
    aten.squeeze.dims: _squeeze,
    aten.squeeze.default: lambda ctx, x: _squeeze(ctx, x, None),
    aten.expand.default: _expand,
    aten.clone.default: _copy,
    aten.contiguous.default: _copy,
    aten._to_copy.default: _copy,
    aten.alias.default: _identity,
    aten.detach.default: _identity,
    aten.cat.default: _cat,
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    rotate_half: _rotate_half,
}


#: ATen ops whose torch result is a view of all of their input (no copy, every element
#: kept) and whose mapping is that view: at a piece's boundary the partition leaves them
#: to torch, so the piece reads (or writes) the tensor the view is of, and the runtime
#: hands the view's strides to the lowering (docs/design.md §10.3, views at the
#: boundary). ``expand`` is a view too,
#: but a stride-0 input is one the runtime could not copy into when a call's tensor has
#: other strides, so it stays in the piece (a ``repeat``); copies (``clone``,
#: ``contiguous``, casts) are not views, nor is ``reshape`` (a copy when the input's
#: strides do not allow a view; traced code has ``view``, or ``clone`` + ``_unsafe_view``).
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.t.default, aten.transpose.int,
    aten.permute.default, aten.alias.default, aten.detach.default,
})
#: views that keep a window of their input (slices): left to torch at a piece's input
#: side only — at its output side the piece would compute the elements the view drops
SELECT_OPS = frozenset({aten.slice.Tensor, aten.select.int})


def decompositions() -> dict:
    """ATen decompositions applied while tracing: softmax into ``amax`` (a library op),
    ``x - m``, ``exp``, ``sum`` and ``div`` — so the exp/sum/div land in a Lax piece —
    and the other composite ops a block uses into the rows above (``split``, ``chunk``
    and ``unbind`` into slices)."""
    from torch._decomp import get_decompositions

    return {**get_decompositions([aten._softmax, aten._log_softmax, aten.silu_backward, aten.addcmul,
                                  aten.t, aten.linear, aten.unbind.int]),
            aten.split.Tensor: _split, aten.split_with_sizes.default: _split_with_sizes}
