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
Lax fragment. (``amax`` maps to the catalog's ``max``, a free shift: a safe softmax's
max is inside its piece, docs/design.md §3.3.)

Attention has an operator of the front end's own, ``torch.ops.mugraph.attention``
(:func:`sdpa`): the capture calls it in place of every
``F.scaled_dot_product_attention``, before the dispatcher picks one of ATen's
backend kernels, and its row writes the attention as a safe softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import torch

from ..core import builder as B
from ..core.errors import MugraphError
from ..core.fills import BandMask, causal_mask

aten = torch.ops.aten


class Unmapped(MugraphError):
    """This use of an ATen op has no form in the catalog (the node stays a torch call)."""


@dataclass
class Context:
    """What a row may ask of the piece being built: constant tensors (RoPE's
    rotation matrix) become extra inputs of the piece, fed by the runtime."""

    make_input: Callable[[int, torch.Tensor, BandMask | None], Any]
    constants: list = field(default_factory=list)

    def constant(self, t: torch.Tensor, fill: BandMask | None = None):
        """``t`` as a new input of the piece (its value is kept in ``constants``). ``fill``:
        ``t`` is that position-dependent constant, which the kernels make instead of
        reading (:mod:`mugraph.core.fills`)."""
        self.constants.append(t)
        return self.make_input(len(self.constants) - 1, t, fill)


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


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """``var_mean`` as two means, ``mean((x - mean(x))²)`` (torch's own decomposition goes
    to prims no row reads). It is what LayerNorm's decomposition computes its statistics
    with, so a LayerNorm maps op by op — its mean, square, rsqrt and affine — and fuses with
    the projections that read it, as an RMSNorm does."""
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    c = 1 if correction is None else correction
    mean = aten.mean.dim(x, dims, True)
    var = aten.mean.dim(aten.pow.Tensor_Scalar(aten.sub.Tensor(x, mean), 2), dims, keepdim)
    if c:
        var = aten.mul.Tensor(var, n / (n - c))
    return var, (mean if keepdim else aten.squeeze.dims(mean, dims))


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    """LayerNorm op by op: its statistics in float32 for a narrower input (as ATen's kernel
    computes them), the centred row times the reciprocal root, the affine in that dtype,
    then cast back. Written here rather than taken from torch's decomposition, which
    multiplies a float32 row by a narrower weight with no cast between — a promotion no
    row maps, so the affine stayed torch code outside the norm's piece."""
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xf = x if x.dtype == acc else aten._to_copy.default(x, dtype=acc)
    dims = list(range(x.ndim - len(normalized_shape), x.ndim))
    mean = aten.mean.dim(xf, dims, True)
    centred = aten.sub.Tensor(xf, mean)
    rstd = aten.rsqrt.default(aten.add.Tensor(aten.mean.dim(aten.pow.Tensor_Scalar(centred, 2), dims, True), eps))
    out = aten.mul.Tensor(centred, rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight if weight.dtype == acc else aten._to_copy.default(weight, dtype=acc))
    if bias is not None:
        out = aten.add.Tensor(out, bias if bias.dtype == acc else aten._to_copy.default(bias, dtype=acc))
    if out.dtype != x.dtype:
        out = aten._to_copy.default(out, dtype=x.dtype)
    return out, mean, rstd


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


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


# ---------------------------------------------------------------------------- attention
# ``F.scaled_dot_product_attention`` reaches ATen as one of several backend kernels
# (flash, efficient, cuDNN, math — chosen by device, dtype and mask) whose outputs are
# tuples, with a boolean mask already turned into a float one on some. The capture
# therefore replaces the call itself (capture.py, the SDPA mode) by :func:`sdpa`: torch code
# that brings the mask into the form a piece can read, and one call of the operator
# ``mugraph::attention`` (keys given transposed, so that transpose is a torch view at the
# piece's boundary, read in place). Unmapped, the operator runs SDPA itself.

_ATTENTION_SCHEMA = ("(Tensor q, Tensor kt, Tensor v, Tensor? bias, float dropout_p, bool is_causal, "
                     "float? scale, bool enable_gqa, int groups=1) -> Tensor")


def _attention_torch(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                     dropout_p: float, is_causal: bool, scale: float | None,
                     enable_gqa: bool, groups: int = 1) -> torch.Tensor:
    """``mugraph::attention`` as torch code (also its fake implementation: the same call on
    fake tensors gives SDPA's own output strides). ``bias``: an additive mask (a boolean
    one, as :func:`sdpa` made it additive).

    ``groups > 1``: the grouped-query form (:func:`group_query_rows`): ``q`` is
    ``(…, Hkv, groups · L, D)`` — the ``groups`` query heads of each KV head as rows — and
    so is the result; a mask with ``groups · L`` rows is grouped alike (others broadcast
    over the query heads as SDPA's own)."""
    if groups > 1:
        rows = q.shape[-2]
        queries = rows // groups

        def heads(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or t.ndim < 3 or t.shape[-2] != rows:
                return t
            if t.shape[-3] == 1 < q.shape[-3]:  # grouped rows shared by the KV heads (tile_rows)
                lead = t.shape[:-3]
                t = t.reshape(*lead, 1, groups, queries, t.shape[-1]).expand(
                    *lead, q.shape[-3], groups, queries, t.shape[-1])
                return t.reshape(*lead, q.shape[-3] * groups, queries, t.shape[-1])
            return t.reshape(*t.shape[:-3], t.shape[-3] * groups, queries, t.shape[-1])
        out = _attention_torch(heads(q), kt, v, heads(bias), dropout_p, is_causal, scale, True)
        return out.reshape(*out.shape[:-3], q.shape[-3], rows, out.shape[-1])
    return torch.nn.functional.scaled_dot_product_attention(
        q, kt.transpose(-2, -1), v, attn_mask=bias, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa)


def regroup(x: torch.Tensor, shape: tuple, strides: tuple | None = None) -> torch.Tensor:
    """``x.reshape(shape)``, laid out with ``strides`` when given: the copy a grouped-query
    attention's Q or output takes (torch code between pieces, :func:`group_query_rows`)
    where the strides allow no view."""
    y = x.reshape(shape)
    if strides is not None and tuple(y.stride()) != tuple(strides):
        y = y.new_empty_strided(tuple(shape), tuple(strides)).copy_(y)
    return y


def tile_rows(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``x``'s rows (its second-to-last dim) tiled ``groups`` times: a mask shared by the
    query heads, in the grouped-query layout — row ``g · L + i`` is row ``i`` — made by
    torch code before the attention's piece (:func:`.capture.group_query_rows`), so the
    piece reads a mask of its own row count instead of tiling one inside."""
    return x.repeat(*(1,) * (x.ndim - 2), groups, 1)


def _define_attention() -> torch._ops.OpOverload:
    """``torch.ops.mugraph.attention`` (defined once per process)."""
    if not hasattr(torch.ops.mugraph, "attention"):
        op = torch.library.custom_op("mugraph::attention", _attention_torch, mutates_args=(),
                                     schema=_ATTENTION_SCHEMA)
        op.register_fake(_attention_torch)
    return torch.ops.mugraph.attention.default


attention = _define_attention()

#: ``mugraph::attention``'s arguments in schema order, and their defaults (where the schema has one)
ATTENTION_ARGS = tuple(a.name for a in attention._schema.arguments)
_ATTENTION_DEFAULTS = {a.name: a.default_value for a in attention._schema.arguments if a.has_default_value()}


def attention_args(node: Any) -> dict[str, Any]:
    """The arguments of a ``mugraph::attention`` FX node by name (defaults filled in), so a
    rewrite reads and changes them without counting positions."""
    named = dict(zip(ATTENTION_ARGS, node.args))
    named.update(node.kwargs)
    return {k: named[k] if k in named else _ATTENTION_DEFAULTS[k] for k in ATTENTION_ARGS}


def attention_call(named: dict[str, Any]) -> tuple:
    """Positional arguments of a ``mugraph::attention`` call from :func:`attention_args`'s form."""
    return tuple(named[k] for k in ATTENTION_ARGS)


def _full_rank(m: torch.Tensor, ndim: int) -> torch.Tensor:
    """``m`` with leading dims of size 1 up to rank ``ndim`` (a torch view)."""
    return m if m.ndim >= ndim else m.view((1,) * (ndim - m.ndim) + tuple(m.shape))


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as the capture records it: equal in value (a row
    no key may see is 0, as in SDPA), written so that its row can map it.

    A mask enters the piece finite and additive, whatever candidate the search finds — a
    split-KV μGraph shifts each chunk by its own max, and a chunk all ``-inf`` would give
    ``exp(-inf + inf)``. So ``-inf`` in a float mask, and a boolean mask's hidden keys,
    become the dtype's lowest finite value (``exp`` still gives 0), added before the max:
    a 0/1 factor after the exp would let hidden scores far above the visible ones set the
    max and underflow every visible exponential. A row with no visible key is given all
    its keys (its softmax stays finite: a denominator of 0 would give NaN) and zeroed
    after the call, by ``rows``; the row masks are computed by torch, outside the piece
    (comparisons are not catalog ops)."""
    bias = rows = None
    if attn_mask is not None:
        m = _full_rank(attn_mask, query.ndim)
        if m.dtype == torch.bool:
            empty = ~m.any(-1, keepdim=True)
            hidden = torch.zeros(m.shape, dtype=query.dtype, device=m.device)
            bias = hidden.masked_fill(~(m | empty), torch.finfo(query.dtype).min)
            rows = (~empty).to(query.dtype)
        elif m.dtype == query.dtype and m.is_floating_point():
            rows = (~m.isneginf().all(-1, keepdim=True)).to(query.dtype)
            bias = m.clamp_min(torch.finfo(m.dtype).min)
        else:
            bias = m  # SDPA refuses it (the fake call raises while tracing, as eager would)
    out = attention(query, key.transpose(-2, -1), value, bias, float(dropout_p), bool(is_causal),
                    None if scale is None else float(scale), bool(enable_gqa))
    return out if rows is None else out * rows


def causal_bias(queries: int, keys: int, groups: int, ndim: int, dtype: str) -> tuple[torch.Tensor, BandMask]:
    """SDPA's ``is_causal`` mask, additive: query ``i`` sees key ``j`` iff ``j <= i`` (the
    upper-left alignment torch uses when ``queries != keys``), its rows tiled ``groups``
    times (the grouped-query layout of :func:`_attention`), shaped to rank ``ndim``; with
    the fill that makes it (:func:`mugraph.causal_mask`), so kernels never read it."""
    fill = causal_mask(0, period=queries if groups > 1 else None)
    shape = (1,) * (ndim - 2) + (groups * queries, keys)
    return torch.from_numpy(fill.values(shape, dtype)).to(getattr(torch, dtype)), fill


def _grouped_mask(m, heads: int, groups: int, queries: int):
    """A mask over ``(…, heads, queries, keys)`` in the grouped-query layout
    ``(…, heads // groups, groups · queries, keys)``: a mask shared by the heads repeats
    its query rows ``groups`` times; a per-head mask regroups its heads into rows."""
    if groups == 1:
        return m
    h, rows = m.shape[-3], m.shape[-2]
    if rows == groups * queries and h in (1, heads // groups):
        return m  # already grouped (a per-head mask regrouped by a view outside the piece)
    if h == 1:
        return m if rows == 1 else B.repeat(m, (1,) * (m.ndim - 2) + (groups, 1))
    if h != heads:
        raise Unmapped(f"a mask over {h} heads for {heads} query heads")
    if rows == 1 and queries > 1:
        m = B.repeat(m, (1,) * (m.ndim - 2) + (queries, 1))
    return B.reshape(m, tuple(m.shape[:-3]) + (heads // groups, groups * queries, m.shape[-1]))


def _attention(ctx: Context, q, kt, v, bias=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False, groups=1):
    """``mugraph::attention`` as a safe softmax: ``S = (Q @ Kᵀ) · scale (+ bias)``,
    ``P = exp(S − max S)``, ``out = (P @ V) / Σ P``. The max is a free shift
    (docs/design.md §3.3), so the piece stays provable; masks are finite (no ``-inf`` in a
    finite field), and ``is_causal``'s is a fill the kernels make from positions.
    Grouped-query heads are read without repeating
    K and V: Q's ``groups`` heads per KV head become rows, ``(…, Hkv, groups · L, D)``. Given
    ``groups > 1``, Q arrives in that form and the result stays in it (the capture's
    :func:`.capture.group_query_rows` regroups them by torch views outside the piece), so
    the piece holds no ``reshape``."""
    if dropout_p != 0:
        raise Unmapped(f"attention with dropout_p={dropout_p}: random, no Lax form")
    if not 2 <= q.ndim == kt.ndim == v.ndim:
        raise Unmapped(f"attention of ranks {q.ndim}, {kt.ndim}, {v.ndim}")
    if bias is not None and (bias.dtype != q.dtype or bias.ndim != q.ndim):
        raise Unmapped(f"attention mask {bias.dtype} {tuple(bias.shape)} for queries {q.dtype} {tuple(q.shape)}")
    queries, d = q.shape[-2:]
    heads, kv_heads = (q.shape[-3], kt.shape[-3]) if q.ndim > 2 else (1, 1)
    grouped = type(groups) is int and groups > 1
    if grouped:
        if q.ndim < 3 or heads != kv_heads or queries % groups or v.shape[-3] != kv_heads:
            raise Unmapped(f"grouped-query attention of queries {tuple(q.shape)} in {groups} groups over "
                           f"keys {tuple(kt.shape)}")
        queries, heads = queries // groups, kv_heads * groups
    elif groups != 1:
        raise Unmapped(f"attention with groups={groups!r}")
    if heads != kv_heads and not grouped:
        if not enable_gqa or kv_heads < 1 or heads % kv_heads or v.shape[-3] != kv_heads:
            raise Unmapped(f"attention of {heads} query heads over {kv_heads} key heads (enable_gqa={enable_gqa})")
        groups = heads // kv_heads
        q = B.reshape(q, tuple(q.shape[:-3]) + (kv_heads, groups * queries, d))
    c = 1 / math.sqrt(d) if scale is None else scale
    s = B.matmul(q, kt)
    s = s if c == 1 else B.scale(s, c)
    if bias is not None:
        s = B.add(s, _grouped_mask(bias, heads, groups, queries))
    if is_causal:
        s = B.add(s, ctx.constant(*causal_bias(queries, kt.shape[-1], groups, q.ndim, q.dtype)))
    p = B.exp(B.sub(s, B.max(s, -1)))
    out = B.div(B.matmul(p, v), B.sum(p, -1))
    if groups > 1 and not grouped:
        out = B.reshape(out, tuple(out.shape[:-3]) + (heads, queries, out.shape[-1]))
    return out


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
    attention: _attention,
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
    """ATen decompositions applied while tracing: softmax into ``amax`` (the catalog's
    ``max``, a free shift), ``x - m``, ``exp``, ``sum`` and ``div`` — so the whole softmax
    lands in a Lax piece; ``_safe_softmax`` (SDPA's math kernel) into that softmax and a
    ``where`` that zeroes the rows all ``-inf`` (torch code reading the piece's result) —
    and the other composite ops a block uses into the rows above (``split``, ``chunk``
    and ``unbind`` into slices); LayerNorm into its statistics (:func:`_var_mean`) and its
    affine, op by op."""
    from torch._decomp import get_decompositions

    return {**get_decompositions([aten._softmax, aten._safe_softmax, aten._log_softmax, aten.silu_backward,
                                  aten.addcmul, aten.t, aten.linear, aten.unbind.int]),
            aten.split.Tensor: _split, aten.split_with_sizes.default: _split_with_sizes,
            aten.var_mean.correction: _var_mean, aten.var.correction: _var,
            aten.native_layer_norm.default: _native_layer_norm}
