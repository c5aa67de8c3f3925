"""Hand-written reference μGraphs for the six benchmarks.

They are written with the public μGraph API (``KernelGraph``, ``BlockGraph``) the
way a user writes a custom kernel, and each computes exactly its program's
function. Tile parameters default to values that suit the full shapes and shrink
(never below what divides the dims) for reduced shapes.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable

from .. import builder as mg
from ..ir import BlockGraph, KernelGraph
from .programs import SMALL


def _axis(g: int, d: int):
    """imap/omap entry: dim ``d`` for a grid axis of size ``g`` > 1, else None."""
    return d if g > 1 else None


def _fit(size: int, want: int) -> int:
    """The largest divisor of ``size`` that is ≤ ``want``."""
    return max(t for t in range(1, min(size, want) + 1) if size % t == 0)


def rmsnorm_matmul(b: int = 1, hidden: int = 4096, out: int = 6144, dtype: str = "float16",
                   col_tile: int = 64, loop: int = 64, rows: int | None = None) -> KernelGraph:
    """Paper Fig. 3b: grid over W's columns, loop over the hidden dim; the matmul and
    the sum of squares accumulate side by side; the division runs after the loop.
    ``rows``: X's rows (default the benchmark's ``2·b``; one for a decode step's token)."""
    kg = KernelGraph("rmsnorm_matmul")
    X = kg.input("X", (2 * b if rows is None else rows, hidden), dtype)
    G = kg.input("G", (hidden,), dtype)
    W = kg.input("W", (hidden, out), dtype)
    gx, F = out // _fit(out, col_tile), _fit(hidden, loop)
    bg = BlockGraph(grid=(gx, 1, 1), forloop=F)
    x = bg.input(X, imap=(None,), fmap=1 if F > 1 else None)
    g = bg.input(G, fmap=0 if F > 1 else None)
    w = bg.input(W, imap=(_axis(gx, 1),), fmap=0 if F > 1 else None)
    acc = bg.accum(mg.matmul(x * g, w))
    ss = bg.accum(mg.sum(mg.square(x), 1))
    bg.output(acc / mg.sqrt(mg.scale(ss, Fraction(1, hidden))), omap=(_axis(gx, 1),))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def gated_mlp(b: int = 1, hidden: int = 4096, out: int = 4096, dtype: str = "float16",
              col_tile: int = 64, loop: int = 64, act: str = "silu", rows: int | None = None) -> KernelGraph:
    """One kernel: both matmuls accumulate in one loop; the activation (``act``: ``silu``,
    or ``gelu_tanh`` as Gemma's MLP) and the product after it. ``rows``: X's rows (default
    the benchmark's ``8·b``)."""
    kg = KernelGraph("gated_mlp")
    X = kg.input("X", (8 * b if rows is None else rows, hidden), dtype)
    W1 = kg.input("W1", (hidden, out), dtype)
    W2 = kg.input("W2", (hidden, out), dtype)
    gx, F = out // _fit(out, col_tile), _fit(hidden, loop)
    fm = 0 if F > 1 else None
    bg = BlockGraph(grid=(gx, 1, 1), forloop=F)
    x = bg.input(X, fmap=1 if F > 1 else None)
    w1 = bg.input(W1, imap=(_axis(gx, 1),), fmap=fm)
    w2 = bg.input(W2, imap=(_axis(gx, 1),), fmap=fm)
    a1 = bg.accum(x @ w1)
    a2 = bg.accum(x @ w2)
    bg.output(getattr(mg, act)(a1) * a2, omap=(_axis(gx, 1),))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


#: the forms of :func:`gemv`
GEMV_FORMS = ("plain", "residual", "norm")


def gemv(rows: int, k: int, n: int, cols: int, steps: int, form: str = "plain",
         dtype: str = "float16") -> KernelGraph:
    """``X(rows × k) @ W(k × n)``, a skinny projection: ``n / cols`` blocks, each a
    ``cols``-wide column slice of W, its loop walking K ``steps`` rows at a time (loop-free
    at ``steps == k``). ``form`` (:data:`GEMV_FORMS`): ``"residual"`` adds a row block ``R``
    after the loop; ``"norm"`` is :func:`rmsnorm_matmul` at ``rows`` rows (an RMSNorm fused
    into the projection, without its epsilon). The tuner's and cost model's tests and
    ``examples/gemv_sweep.py`` build their projections with it."""
    if form not in GEMV_FORMS:
        raise ValueError(f"gemv: form={form!r}: choose from {GEMV_FORMS}")
    if form == "norm":
        return rmsnorm_matmul(hidden=k, out=n, dtype=dtype, col_tile=cols, loop=k // steps, rows=rows)
    kg = KernelGraph(f"gemv_{form}_{rows}x{k}x{n}")
    X, W = kg.input("X", (rows, k), dtype), kg.input("W", (k, n), dtype)
    R = kg.input("R", (rows, n), dtype) if form == "residual" else None
    loop = k // steps
    looped = loop > 1  # a loop-free block maps no input onto a loop
    bg = BlockGraph(grid=(n // cols, 1, 1), forloop=loop)
    out = bg.accum(bg.input(X, imap=(None,), fmap=1 if looped else None)
                   @ bg.input(W, imap=(1,), fmap=0 if looped else None))
    if R is not None:
        out = out + bg.input(R, imap=(1,))
    bg.output(out, omap=(1,))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def lora(b: int = 1, hidden: int = 256, out: int = 4096, rank: int = 16, dtype: str = "float16",
         col_tile: int = 64) -> KernelGraph:
    """One kernel using ``X@W + (X@A)@B = [X | X@A] @ [W ; B]`` (no loop)."""
    kg = KernelGraph("lora")
    X = kg.input("X", (16 * b, hidden), dtype)
    W = kg.input("W", (hidden, out), dtype)
    A = kg.input("A", (hidden, rank), dtype)
    B = kg.input("B", (rank, out), dtype)
    gx = out // _fit(out, col_tile)
    bg = BlockGraph(grid=(gx, 1, 1), forloop=1)
    x = bg.input(X)
    w = bg.input(W, imap=(_axis(gx, 1),))
    a = bg.input(A)
    bb = bg.input(B, imap=(_axis(gx, 1),))
    xa = mg.concat([x, x @ a], 1)
    wb = mg.concat([w, bb], 0)
    bg.output(bg.accum(xa @ wb), omap=(_axis(gx, 1),))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def _split_kv(name: str, b: int, queries: int, head_dim: int, kv: int, dtype: str, chunks: int, loop: int,
              row_tile: int, qk_norm: bool) -> KernelGraph:
    """FlashDecoding-style split-KV attention in two kernels.

    Kernel 1, grid (batch, KV chunk): per chunk, the partial exp-sums Σ exp(q·k) and
    the partial Σ exp(q·k)·v, accumulated over a loop through the chunk; both saved
    side by side along a chunk dim. Kernel 2, grid (batch, query rows): a loop over
    the chunks accumulates both partials, then divides.
    """
    kg = KernelGraph(name)
    B = 2 * b
    Q = kg.input("Q", (B, queries, head_dim), dtype)
    K = kg.input("K", (B, head_dim, kv), dtype)
    V = kg.input("V", (B, kv, head_dim), dtype)
    C = _fit(kv, chunks)
    F = _fit(kv // C, loop)
    k1 = BlockGraph(grid=(B, C, 1), forloop=F)
    q = k1.input(Q, imap=(_axis(B, 0),))
    k = k1.input(K, imap=(_axis(B, 0), _axis(C, 2)), fmap=2 if F > 1 else None)
    v = k1.input(V, imap=(_axis(B, 0), _axis(C, 1)), fmap=1 if F > 1 else None)
    if qk_norm:
        q = mg.rms_norm(q, 2)
        k = mg.rms_norm(k, 1)
        e = mg.exp(mg.scale(q @ k, Fraction(1, 8)))
    else:
        e = mg.exp(q @ k)
    z = k1.accum(mg.sum(e, 2))
    ev = k1.accum(e @ v)
    k1.output(z, omap=(_axis(B, 0), _axis(C, 2)))
    k1.output(ev, omap=(_axis(B, 0), _axis(C, 2)))
    Z, EV = kg.kernel(k1)

    R = queries // _fit(queries, row_tile)
    k2 = BlockGraph(grid=(B, R, 1), forloop=C)
    fm = 2 if C > 1 else None
    zs = k2.accum(k2.input(Z, imap=(_axis(B, 0), _axis(R, 1)), fmap=fm))
    evs = k2.accum(k2.input(EV, imap=(_axis(B, 0), _axis(R, 1)), fmap=fm))
    k2.output(evs / zs, omap=(_axis(B, 0), _axis(R, 1)))
    (Y,) = kg.kernel(k2)
    kg.output(Y)
    return kg


def gqa(b: int = 1, queries: int = 256, head_dim: int = 64, kv: int = 4096, dtype: str = "float16",
        chunks: int = 16, loop: int = 4, row_tile: int = 64) -> KernelGraph:
    return _split_kv("gqa", b, queries, head_dim, kv, dtype, chunks, loop, row_tile, qk_norm=False)


def qknorm_gqa(b: int = 1, queries: int = 256, head_dim: int = 64, kv: int = 4096, dtype: str = "float16",
               chunks: int = 16, loop: int = 4, row_tile: int = 64) -> KernelGraph:
    """As :func:`gqa`, with Q and K RMS-normalized inside kernel 1 (the norms are over
    head_dim, which every tile holds whole)."""
    return _split_kv("qknorm_gqa", b, queries, head_dim, kv, dtype, chunks, loop, row_tile, qk_norm=True)


def ntrans(b: int = 1, hidden: int = 4096, dtype: str = "float16") -> KernelGraph:
    """One kernel, one block per row, no loop: both RMS norms over the whole row."""
    kg = KernelGraph("ntrans")
    rows = 8 * b
    H = kg.input("H", (rows, hidden), dtype)
    X = kg.input("X", (rows, hidden), dtype)
    A = kg.input("A", (rows, hidden), dtype)
    bg = BlockGraph(grid=(rows, 1, 1), forloop=1)
    m = (_axis(rows, 0),)
    h, x, a = bg.input(H, imap=m), bg.input(X, imap=m), bg.input(A, imap=m)
    y = mg.rms_norm(h + a * (mg.rms_norm(x, 1) - h), 1)
    bg.output(bg.accum(y), omap=m)
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


REFERENCES: dict[str, Callable[..., KernelGraph]] = {
    "rmsnorm_matmul": rmsnorm_matmul, "gated_mlp": gated_mlp, "lora": lora,
    "gqa": gqa, "qknorm_gqa": qknorm_gqa, "ntrans": ntrans,
}


def reference(name: str, b: int = 1, small: bool = False, **sizes) -> KernelGraph:
    """The hand-written μGraph of benchmark ``name`` (same inputs as ``program(name, …)``)."""
    if name not in REFERENCES:
        raise KeyError(f"unknown benchmark {name!r}; choose from {sorted(REFERENCES)}")
    kw = {**(SMALL[name] if small else {}), **sizes}
    return REFERENCES[name](b=b, **kw)
