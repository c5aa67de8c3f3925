"""Random Lax programs, mutations and equivalence-preserving rewrites of graphs.

The verifier is only as trustworthy as the evidence that it neither rejects
equivalent pairs nor accepts different ones. This module produces that evidence
(and the search reuses it to test its own stages):

* :func:`random_program` — a seeded random Lax program over small shapes;
  :func:`random_softmax` — a seeded random safe softmax (a row max as a free shift,
  docs/design.md §3.3), plain or in the split flash-decoding form;
  :func:`random_online_softmax` — its online μGraph (a loop with rescaled accumulators, §3.4);
* :data:`MUTATIONS` — operators that change a graph's meaning the ways a buggy
  search or a buggy hand-written kernel would (swapped operands of sub/div/matmul,
  a changed imap/fmap/omap, a dropped or doubled accumulator, a wrong scale
  constant, a wrong reduction dim, a moved exp, a swapped input, add↔sub, mul↔div),
  and the ways a hostile one would fool a verifier with fixed primes: constants
  moved by a multiple of a prime or sharing it in a numerator or denominator
  (``prime_constant``), the same inside an exponent (``exp_prime_constant``), sign
  flips under ``sqrt`` (``sqrt_sign``, which also makes equivalent positive
  scalings) and a wrong part hidden next to a 2^40-times larger one in the same
  output (``hidden_part``, on graphs from :func:`with_large_part`), and the mistakes
  of a safe softmax (:data:`SOFTMAX_MUTATIONS`: a max over the wrong dim, an unshifted
  denominator, a split combine that forgets a chunk's rescale or applies it to one side
  only, a chunk shifted by another chunk's max; an online accumulator left unrescaled or
  rescaled by another tile) next to its one equivalent change
  (``shift_value``: another per-row shift, which the verifier must accept);
* :data:`REWRITES` — operators that keep the meaning (commuted operands,
  ``square → mul``, ``sub → add ∘ scale(−1)``, ``scale → mul const``,
  ``sqrt(u) → sqrt(c²u)/c`` for ``c > 0``, ``scale(x, c) → scale(scale(x, c/P), P)``);
* :func:`differs` — the float64 ground truth: do two graphs compute different
  functions? (looked at again at smaller inputs where exponents of huge magnitude blind
  the first comparison);
* :func:`corpus_graph` — the mutation fuzz's corpus, a seventh of it safe softmax.

Mutations and rewrites pick a site (an op at the kernel level or inside a block
graph) and rebuild the graph with an edit there (:func:`mugraph.core.rewrite.rebuild`),
through the builder, so every mutant is a *valid* graph (invalid ones are
discarded, never returned).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Callable, NamedTuple, Optional

import numpy as np

from mugraph.core import builder as mg
from mugraph.core import randgraph
from mugraph.core.errors import ConfigError, InputError, MugraphError
from mugraph.core.ir import RESCALED, BlockGraph, KernelGraph, Op, Program, Tensor, accum_monoid
from mugraph.core.lax import check_lax
from mugraph.core.ops import broadcast_shapes
from mugraph.core.randgraph import fuzz_profile
from mugraph.core.rewrite import GD, Rebuild, Site, live_graph, rebuild, splice

from . import args
from .analysis import check_compatible
from .equivalence import fingerprint_field
from .floatcheck import FLOAT64_RTOL, SMALLER_SCALES, compare_float64, differs  # noqa: F401 - the fuzz's ground truth

Rng = np.random.Generator


# ============================================================================ random programs


def _rng(where: str, rng) -> Rng:
    """A generator, or a seed (an int >= 0) for one."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(args.integer(where, "rng (a Generator or a seed)", rng, 0))


def _choice(rng: Rng, xs):
    return xs[int(rng.integers(len(xs)))]


def _broadcastable(a, b) -> bool:
    try:
        broadcast_shapes(a, b)
        return True
    except MugraphError:
        return False


def random_program(rng: Rng | int, *, max_ops: int = 8, sizes: tuple[int, ...] = (2, 3, 4),
                   sqrt: bool = False, name: str = "random") -> Program:
    """A random Lax program: 2–4 inputs of rank 2–3 over the dim sizes in ``sizes``,
    then up to ``max_ops`` ops drawn from the catalog (matmul, add, sub, mul, div,
    exp/silu with at most one per path, square, scale, const, sum, concat,
    reshape, repeat; ``sqrt`` of a sum of squares when ``sqrt``). One or two
    outputs, each computed by an op. Deterministic in ``rng``."""
    rng = _rng("random_program", rng)
    args.integer("random_program", "max_ops", max_ops, 1, 1000)
    if not args.int_list("random_program", "sizes", sizes, 1):
        raise ConfigError("random_program: sizes must hold at least one dim size")
    p = Program(name)
    a, b, c = (int(_choice(rng, sizes)) for _ in range(3))
    shapes = [(a, b), (b, c), (a, c), (a, b), (2, a, b), (b, b)]
    pool: list[tuple[Tensor, int]] = []  # (tensor, exps on the worst path)
    for i in range(int(rng.integers(2, 5))):
        pool.append((p.input(f"x{i}", _choice(rng, shapes), "float32"), 0))
    made: list[Tensor] = []
    tries = 0
    while len(made) < max_ops and tries < 20 * max_ops:
        tries += 1
        kind = _choice(rng, ["matmul", "matmul", "add", "sub", "mul", "div", "exp", "silu", "square",
                             "scale", "const", "sum", "concat", "reshape", "repeat"] + (["sqrt"] if sqrt else []))
        x, ex = pool[int(rng.integers(len(pool)))]
        y, ey = pool[int(rng.integers(len(pool)))]
        try:
            if kind == "matmul":
                if x.ndim < 2 or y.ndim < 2 or x.shape[-1] != y.shape[-2] or not _broadcastable(x.shape[:-2], y.shape[:-2]):
                    continue
                out, e = mg.matmul(x, y), max(ex, ey)
            elif kind in ("add", "sub", "mul", "div"):
                if not _broadcastable(x.shape, y.shape) or (x is y and kind in ("sub", "div")):
                    continue
                if kind == "div":  # divide by something that is not near zero in floats
                    y = mg.exp(y) if ey == 0 and rng.random() < 0.5 else mg.add(mg.square(y), 1)
                    ey = max(ey, 1) if y.op.kind == "exp" else ey
                out, e = getattr(mg, kind)(x, y), max(ex, ey)
            elif kind in ("exp", "silu"):
                if ex:
                    continue
                out, e = getattr(mg, kind)(mg.scale(x, Fraction(1, 2))), 1
            elif kind == "square":
                out, e = mg.square(x), ex
            elif kind == "scale":
                out, e = mg.scale(x, _choice(rng, [Fraction(1, 2), Fraction(-3, 2), Fraction(2), Fraction(1, 3)])), ex
            elif kind == "const":
                out, e = mg.add(x, _choice(rng, [1, Fraction(1, 4), -2])), ex
            elif kind == "sum":
                out, e = mg.sum(x, int(rng.integers(x.ndim))), ex
            elif kind == "concat":
                if x.ndim != y.ndim:
                    continue
                d = int(rng.integers(x.ndim))
                if any(s != t for i, (s, t) in enumerate(zip(x.shape, y.shape)) if i != d):
                    continue
                out, e = mg.concat([x, y], d), max(ex, ey)
            elif kind == "reshape":
                n = x.numel
                if x.ndim == 2:
                    out = mg.reshape(x, (x.shape[1], x.shape[0]) if rng.random() < 0.5 else (1, n))
                else:
                    out = mg.reshape(x, (x.shape[0] * x.shape[1], x.shape[2]))
                e = ex
            elif kind == "repeat":
                reps = [1] * x.ndim
                reps[int(rng.integers(x.ndim))] = 2
                out, e = mg.repeat(x, reps), ex
            elif kind == "sqrt":
                d = int(rng.integers(x.ndim))
                out, e = mg.div(x, mg.sqrt(mg.add(mg.mean(mg.square(x), d), 1))), ex
            else:  # pragma: no cover
                continue
        except MugraphError:
            continue
        if out.numel > 4096:
            continue
        pool.append((out, e))
        made.append(out)
    if not made:
        x = pool[0][0]
        made.append(mg.add(x, x))
    outs = [made[-1]]
    if len(made) > 2 and rng.random() < 0.3:
        outs.append(made[int(rng.integers(len(made) - 1))])
    for t in outs:
        p.output(t)
    return live_graph(p)  # mutating dead code proves nothing


def random_ugraph(rng: Rng | int, *, n: int = 4, max_ops: int = 5, name: str = "random_ugraph") -> KernelGraph:
    """A random one-kernel Lax μGraph over square ``n×n`` inputs from the one generator
    of random μGraphs (:func:`mugraph.core.randgraph.random_ugraph` under
    :func:`~mugraph.core.randgraph.fuzz_profile`): a grid of 1–2 blocks per axis, a loop of
    1–2 iterations, random imaps/fmaps, up to ``max_ops`` block ops on the tiles,
    accumulators, post-loop ops and a random valid omap. All dims are equal so that
    many imap/fmap/omap changes keep the graph valid (and change its meaning) — food
    for the mapping mutations. One integer drawn from ``rng`` seeds the graph. Dead
    ops are kept (as in any graph a user writes): the verifier must ignore them."""
    rng = _rng("random_ugraph", rng)
    args.integer("random_ugraph", "n", n, 2, 64)
    args.integer("random_ugraph", "max_ops", max_ops, 1, 1000)
    profile = replace(fuzz_profile(n, max_ops), name=name)
    g = randgraph.random_ugraph(int(rng.integers(1 << 31)), profile, max_tries=200)
    g.name = name
    return g


# ---------------------------------------------------------------------------- safe softmax

#: rows of a safe-softmax program's scores. A split form's mistake on one chunk (a missing
#: rescale) changes nothing in a row where that chunk holds the row max, so a float64 draw
#: sees it only if some row's max lies elsewhere: with ``k`` equal chunks a draw misses it with
#: probability ``k^-rows`` — at most 2^-12 over the ground truth's two draws at 6 rows.
SOFTMAX_ROWS = (6, 8)
#: the rational constants that scale ``q @ kᵀ`` (``1/√d``-like, and an amplification)
SOFTMAX_SCALES = (Fraction(1, 2), Fraction(1, 3), Fraction(3, 4), Fraction(2))


def _safe_softmax(s: Tensor, v: Tensor | None, rng: Rng) -> Tensor:
    """``exp(s − m) / Σ exp(s − m)`` with ``m = max(s, 1)``, times ``v`` when given:
    ``(e @ v) / Σe`` or ``(e / Σe) @ v`` (the two ways attention code writes it)."""
    e = mg.exp(mg.sub(s, mg.max(s, 1)))
    den = mg.sum(e, 1)
    if v is None:
        return mg.div(e, den)
    return mg.div(mg.matmul(e, v), den) if rng.random() < 0.7 else mg.matmul(mg.div(e, den), v)


def _split_softmax(s: Tensor, v: Tensor | None, chunks: int) -> Tensor:
    """The flash-decoding form of :func:`_safe_softmax` over ``chunks`` equal slices of the
    row: per chunk its own max ``m_c``, ``e_c = exp(s_c − m_c)``, a partial numerator
    (``e_c @ v_c``, or ``e_c`` itself) and denominator ``Σ e_c``; then ``M = max_c m_c``,
    each side rescaled by ``r_c = exp(m_c − M)`` and combined (numerators summed, or
    concatenated without ``v``), the combined numerator divided by the combined
    denominator. Each ``r_c`` is read by one ``mul`` per side, its other operand a ``sum``
    on the denominator side — the shape the rescale mutations look for."""
    n = s.shape[1]
    w = n // chunks
    parts = []
    for c in range(chunks):
        sc = mg.slice(s, 1, c * w, (c + 1) * w)
        vc = None if v is None else mg.slice(v, 0, c * w, (c + 1) * w)
        parts.append((sc, vc, mg.max(sc, 1)))
    M = mg.max(mg.concat([mc for _, _, mc in parts], 1), 1)
    nums: list[Tensor] = []
    den: Tensor | None = None
    for sc, vc, mc in parts:
        e = mg.exp(mg.sub(sc, mc))
        r = mg.exp(mg.sub(mc, M))
        d = mg.mul(r, mg.sum(e, 1))
        den = d if den is None else mg.add(den, d)
        nums.append(mg.mul(r, e if vc is None else mg.matmul(e, vc)))
    if v is None:
        num = mg.concat(nums, 1)
    else:
        num = nums[0]
        for t in nums[1:]:
            num = mg.add(num, t)
    return mg.div(num, den)


def random_softmax(rng: Rng | int, *, name: str = "softmax") -> Program:
    """A random safe-softmax program (docs/design.md §3.3: each ``max`` is a free shift):
    scores ``s`` of 6 or 8 rows (:data:`SOFTMAX_ROWS`) — an input, or ``q @ kᵀ`` (``k``
    transposed by the graph or given transposed) scaled by a rational constant — the row
    max ``m = max(s, 1)``, ``e = exp(s − m)`` and an output ``(e @ v) / Σe``, ``(e/Σe) @ v``
    or ``e / Σe``; in half of them the split (flash-decoding) form over 2–4 chunks
    (:func:`_split_softmax`). The prey of the softmax mutations (:data:`SOFTMAX_MUTATIONS`):
    a program in which every max is a shift that cancels. Deterministic in ``rng``."""
    rng = _rng("random_softmax", rng)
    p = Program(name)
    rows = int(_choice(rng, SOFTMAX_ROWS))
    chunks = int(rng.integers(2, 5)) if rng.random() < 0.5 else 1
    n = chunks * int(_choice(rng, (2, 3))) if chunks > 1 else int(_choice(rng, (3, 4, 5, 8)))
    if rng.random() < 0.4:
        s = p.input("s", (rows, n), "float32")
    else:
        d = int(_choice(rng, (2, 3, 4)))
        q = p.input("q", (rows, d), "float32")
        k = mg.transpose(p.input("k", (n, d), "float32"), 0, 1) if rng.random() < 0.5 \
            else p.input("kt", (d, n), "float32")
        s = mg.scale(mg.matmul(q, k), _choice(rng, SOFTMAX_SCALES))
    v = p.input("v", (n, int(_choice(rng, (2, 3)))), "float32") if rng.random() < 0.7 else None
    p.output(_split_softmax(s, v, chunks) if chunks > 1 else _safe_softmax(s, v, rng))
    return p


def random_online_softmax(rng: Rng | int, *, name: str = "online_softmax") -> KernelGraph:
    """A random online softmax μGraph (docs/design.md §3.4): one kernel whose loop walks
    the row in 2–4 steps — each step's scores shifted by their own max ``m``, the numerator
    ``e @ v`` and the denominator ``Σ e`` accumulated rescaled to the running max — over
    6 or 8 rows in one block or two; the output divides them after the loop. The prey of
    the online mutations (``unrescaled_accum``, ``rescale_by_other``) and of ``shift_value``
    (which must be accepted: any per-step shift serves). Deterministic in ``rng``."""
    rng = _rng("random_online_softmax", rng)
    g = KernelGraph(name)
    rows, steps = int(_choice(rng, SOFTMAX_ROWS)), int(rng.integers(2, 5))
    n, d = steps * int(_choice(rng, (2, 3, 4))), int(_choice(rng, (2, 3)))
    s, v = g.input("s", (rows, n), "float32"), g.input("v", (n, d), "float32")
    blocks = 2 if rng.random() < 0.5 else 1
    bg = BlockGraph((blocks, 1, 1), steps)
    st = bg.input(s, (0 if blocks > 1 else None, None, None), 1)
    vt = bg.input(v, (None, None, None), 0)
    if rng.random() < 0.5:
        st = bg.add_op("scale", [st], {"c": _choice(rng, SOFTMAX_SCALES)})
    m = mg.max(st, 1)
    e = mg.exp(mg.sub(st, m))
    bg.output(mg.div(bg.accum(mg.matmul(e, vt), m), bg.accum(mg.sum(e, 1), m)),
              (0 if blocks > 1 else None, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


# ============================================================================ sites and edits
# A mutation or rewrite picks a site of the graph (an op, at the kernel level or in a
# block graph) and returns the edits of :func:`mugraph.core.rewrite.rebuild` that change it;
# the builder checks the result. Every random draw happens while choosing (before any
# graph is built), so a mutant depends only on the graph and the generator's state.


class _Site(NamedTuple):
    """One op and where it lives: ``kop`` is the graph-defined kernel holding it (None
    at the kernel level); ``ops`` / ``tensors`` are that level's."""

    kop: Optional[Op]
    op: Op

    @property
    def key(self) -> Site:
        return (self.op.id, None) if self.kop is None else (self.kop.id, self.op.id)

    @property
    def block(self) -> Optional[BlockGraph]:
        return None if self.kop is None else self.kop.attrs["block"]

    @property
    def ops(self) -> list[Op]:
        return self.kop.attrs["block"].ops if self.kop is not None else self.op.outputs[0].graph.ops

    @property
    def tensors(self) -> list[Tensor]:
        return self.kop.attrs["block"].tensors if self.kop is not None else self.op.outputs[0].graph.tensors


def _levels(g: KernelGraph) -> list[tuple[Optional[Op], list[Op]]]:
    """The kernel level, then each graph-defined kernel's block graph, in op order."""
    return [(None, g.ops)] + [(op, op.attrs["block"].ops) for op in g.ops if op.kind == GD]


def _sites(g: KernelGraph, pred: Callable[[_Site], bool]) -> list[_Site]:
    return [s for kop, ops in _levels(g) for op in ops if pred(s := _Site(kop, op))]


def _catalog(op: Op) -> bool:
    """A catalog op (not an input, a graph-defined kernel, an iterator or an accumulator)."""
    return op.kind not in ("input", GD, "iterator", "accum")


def _replace(site: _Site, build: Callable[[Rebuild, Op], list]) -> dict:
    return {"replace": {site.key: build}}


def _with_inputs(site: _Site, fn: Callable[[list[Tensor]], list[Tensor]], kind: str | None = None,
                 attrs: dict | None = None) -> dict:
    """Edits that rebuild ``site``'s op on ``fn(its new inputs)`` (as ``kind`` / with ``attrs``)."""
    def build(rb: Rebuild, op: Op) -> list:
        ins = fn(rb.inputs(op))
        if op.kind == "accum":
            return [rb.graph.accum(ins[0])]
        return [rb.add(op, ins, kind, attrs)]
    return _replace(site, build)


def _scale(rb: Rebuild, x: Tensor, c: Fraction) -> Tensor:
    return rb.graph.add_op("scale", [x], {"c": c})


# ============================================================================ mutations


def _m_swap_operands(g, rng):
    s = _sites(g, lambda s: s.op.kind in ("sub", "div", "matmul") and len(set(s.op.inputs)) == 2)
    if not s:
        return None
    return _with_inputs(_choice(rng, s), lambda ins: ins[::-1])


def _m_change_kind(g, rng):
    swap = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}
    s = _sites(g, lambda s: s.op.kind in swap)
    if not s:
        return None
    site = _choice(rng, s)
    return _with_inputs(site, lambda ins: ins, kind=swap[site.op.kind])


def _iterator(site: _Site, imap, fmap) -> dict:
    """Edits giving iterator ``site`` another imap / fmap."""
    def build(rb: Rebuild, op: Op) -> list:
        src = site.block.sources[op.attrs["source"]]
        return [rb.graph.input(rb.get(src), tuple(imap), fmap)]
    return _replace(site, build)


def _m_imap(g, rng):
    s = _sites(g, lambda s: s.op.kind == "iterator")
    if not s:
        return None
    site = _choice(rng, s)
    attrs = site.op.attrs
    ndim = site.block.sources[attrs["source"]].ndim
    axes = [a for a in range(3) if site.block.grid[a] > 1]
    if not axes:
        return None
    a = _choice(rng, axes)
    imap = list(attrs["imap"])
    imap[a] = _choice(rng, [d for d in [None] + list(range(ndim)) if d != imap[a]])
    return _iterator(site, imap, attrs["fmap"])


def _m_fmap(g, rng):
    s = _sites(g, lambda s: s.op.kind == "iterator" and s.block.forloop > 1)
    if not s:
        return None
    site = _choice(rng, s)
    attrs = site.op.attrs
    ndim = site.block.sources[attrs["source"]].ndim
    fmap = attrs["fmap"]
    if fmap is not None and ndim > 1 and rng.random() < 0.5:
        # swap the roles of the looped dim and another one (a transposed walk)
        d2 = _choice(rng, [d for d in range(ndim) if d != fmap])
        sw = {fmap: d2, d2: fmap}
        return _iterator(site, [sw.get(d, d) if d is not None else None for d in attrs["imap"]], d2)
    return _iterator(site, attrs["imap"], _choice(rng, [d for d in [None] + list(range(ndim)) if d != fmap]))


def _m_omap(g, rng):
    s = [(kop, k) for kop, _ in _levels(g)[1:] for k in range(len(kop.attrs["block"].savers))]
    if not s:
        return None
    kop, k = _choice(rng, s)
    block = kop.attrs["block"]
    sv = block.savers[k]
    omap = list(sv.omap)
    axes = [a for a in range(3) if block.grid[a] > 1]
    if not axes:
        return None
    if len(axes) > 1 and rng.random() < 0.5:
        a, b = rng.choice(axes, 2, replace=False)
        omap[a], omap[b] = omap[b], omap[a]
    else:
        a = _choice(rng, axes)
        omap[a] = _choice(rng, [d for d in range(sv.tensor.ndim) if d != omap[a]])
    return {"savers": {(kop.id, k): tuple(omap)}}


def _m_double_accum(g, rng):
    """An accumulator read as itself plus a second accumulator of the same tile."""
    s = _sites(g, lambda s: s.op.kind == "accum")
    if not s:
        return None

    def build(rb: Rebuild, op: Op) -> list:
        x = rb.get(op.inputs[0])
        a = rb.graph.accum(x)
        return [rb.graph.add_op("add", [a, rb.graph.accum(x)], {})]
    return _replace(_choice(rng, s), build)


def _m_redirect_accum(g, rng):
    """Drop one accumulator: its readers read another accumulator of that shape."""
    out = []
    for kop, ops in _levels(g):
        accs = [op for op in ops if op.kind == "accum"]
        out += [(a, b) for a in accs for b in accs if a is not b and a.outputs[0].shape == b.outputs[0].shape]
    if not out:
        return None
    a, b = _choice(rng, out)
    return {"reads": {a.outputs[0]: b.outputs[0]}}


def _plus1(c: Fraction) -> Fraction:
    """``c + 1``, or ``c·(1 + 2^-10)`` for ``|c| > 2^10``: a change float64 can see
    (``2^40 + 1`` is ``2^40`` to 12 digits, and the ground truth would call it equal)."""
    return c + 1 if abs(c) <= 2 ** 10 else c * Fraction(1025, 1024)


def _const_key(op: Op) -> str:
    return "c" if "c" in op.attrs else "value"


def _set_const(site: _Site, fn: Callable[[Fraction], Fraction]) -> dict:
    """Edits giving constant ``site`` (a ``scale`` or ``const``) the value ``fn(old)``."""
    key = _const_key(site.op)
    return _with_inputs(site, lambda ins: ins, attrs={**site.op.attrs, key: fn(Fraction(site.op.attrs[key]))})


def _m_scale(g, rng):
    s = _sites(g, lambda s: s.op.kind in ("scale", "const"))
    if not s:
        return None
    site = _choice(rng, s)
    c = Fraction(site.op.attrs[_const_key(site.op)])
    r = _choice(rng, ["x2", "half", "neg", "plus1", "offby1"])
    if r == "x2":
        c *= 2
    elif r == "half":
        c /= 2
    elif r == "neg":
        c = -c if c else Fraction(1)
    elif r == "plus1":
        c = _plus1(c)
    else:  # 1/n → 1/(n−1): a scale off by one block
        c = Fraction(c.numerator, max(1, c.denominator - 1)) if c.denominator > 1 else _plus1(c)
    return _set_const(site, lambda _: c)


def _m_reduction_dim(g, rng):
    s = _sites(g, lambda s: s.op.kind in ("sum", "concat"))
    if not s:
        return None
    site = _choice(rng, s)
    dim = int(_choice(rng, [d for d in range(4) if d != site.op.attrs["dim"]]))
    return _with_inputs(site, lambda ins: ins, attrs={**site.op.attrs, "dim": dim})


def _m_move_exp(g, rng):
    """Move an exp one op upstream (onto an operand of its argument's producer) or
    downstream (onto its first reader's result); the old exp becomes identity."""
    s = _sites(g, lambda s: s.op.kind == "exp")
    if not s:
        return None
    site = _choice(rng, s)
    ident = _with_inputs(site, lambda ins: ins, kind="scale", attrs={"c": Fraction(1)})["replace"]
    e, arg = site.op.outputs[0], site.op.inputs[0]
    if rng.random() < 0.5:  # upstream
        po = arg.op
        if not _catalog(po):
            return None
        cands = [k for k, t in enumerate(po.inputs) if t.shape == arg.shape]
        if not cands:
            return None
        k = _choice(rng, cands)

        def up(rb: Rebuild, op: Op) -> list:
            ins = rb.inputs(op)
            ins[k] = rb.graph.add_op("exp", [ins[k]], {})
            return [rb.add(op, ins)]
        key = _Site(site.kop, po).key
    else:  # downstream
        users = [op for op in site.ops if _catalog(op) and e in op.inputs]
        if not users:
            return None

        def up(rb: Rebuild, op: Op) -> list:
            return [rb.graph.add_op("exp", [rb.add(op, rb.inputs(op))], {})]
        key = _Site(site.kop, users[0]).key
    return {"replace": {**ident, key: up}}


def _m_swap_input(g, rng):
    """An op reads another tensor of the same shape (e.g. W2 instead of W1)."""
    out = []
    for kop, ops in _levels(g):
        for op in ops:
            if not (_catalog(op) or op.kind == "accum"):
                continue
            site = _Site(kop, op)
            earlier = site.tensors[:op.outputs[0].id]
            for k, t in enumerate(op.inputs):
                out += [(site, k, u) for u in earlier if u is not t and u.shape == t.shape]
    if not out:
        return None
    site, k, u = _choice(rng, out)

    def read_u(rb: Rebuild, op: Op) -> list:
        ins = rb.inputs(op)
        ins[k] = rb.get(u)
        return [rb.graph.accum(ins[0])] if op.kind == "accum" else [rb.add(op, ins)]
    return _replace(site, read_u)


# ---------------------------------------------------------------------------- tricks on the primes

#: primes a verifier with fixed primes would use: the largest safe-prime pair below 2^31
#: (this verifier's fixed pair before primes were drawn per test) and Mirage's pair
FIXED_PRIMES = (2147471759, 1073735879, 167, 83)


def trap_primes() -> tuple[int, ...]:
    """Primes a constant can be built around to fool a fixed-prime test:
    :data:`FIXED_PRIMES` and the pair the search's fingerprints use (seed 0)."""
    f = fingerprint_field(0)
    return FIXED_PRIMES + (f.p, f.q)


def _near(P: int) -> int:
    """``k`` with ``P / 2^k`` in ``[1, 2)``."""
    return P.bit_length() - 1


def _const_sites(g, pred: Callable[[_Site], bool] = lambda s: True) -> list[_Site]:
    return _sites(g, lambda s: s.op.kind in ("scale", "const") and pred(s))


def _m_prime_constant(g, rng):
    """A constant changed by a factor that a prime makes invisible to a test whose p
    (or q) is that prime ``P``: ``c·(P+1)``, ``c·(1 + P/2^k)``, ``c·P/2^k`` (numerators
    sharing ``P``), ``c·(1 + 2^k/P)`` (a denominator sharing it) — each a change of a
    factor 1.5 or more in real arithmetic (relative, so float64 sees it next to any
    magnitude)."""
    s = _const_sites(g)
    if not s:
        return None
    site = _choice(rng, s)
    P = int(_choice(rng, trap_primes()))
    k = _near(P)
    r = _choice(rng, ["times_p1", "plus_p", "times_p", "plus_inv"])
    fn = {"times_p1": lambda c: c * (P + 1) if c else Fraction(P),
          "plus_p": lambda c: c * (1 + Fraction(P, 2 ** k)) if c else Fraction(P, 2 ** k),
          "times_p": lambda c: c * Fraction(P, 2 ** k) if c else Fraction(P, 2 ** k),
          "plus_inv": lambda c: c * (1 + Fraction(2 ** k, P)) if c else Fraction(2 ** k, P)}[r]
    return _set_const(site, fn)


def _feeds_exp(site: _Site) -> bool:
    t = site.op.outputs[0]
    return any(op.kind in ("exp", "silu") and t in op.inputs for op in site.ops)


def _m_exp_prime_constant(g, rng):
    """A constant inside an exponent made ≡ itself mod a prime q (``c + Q/2^k``,
    ``c·Q/2^k``, ``c + 2^k/Q``): ``exp(X·(c + q))`` looks like ``exp(X·c)`` to a test
    whose q is ``Q``."""
    s = _const_sites(g, _feeds_exp)
    if not s:
        return None
    site = _choice(rng, s)
    Q = int(_choice(rng, trap_primes()[1::2]))  # the q of each pair
    k = _near(Q)
    r = _choice(rng, ["plus_q", "times_q", "plus_inv"])
    fn = {"plus_q": lambda c: c + Fraction(Q, 2 ** k),
          "times_q": lambda c: c * Fraction(Q, 2 ** k) if c else Fraction(Q, 2 ** k),
          "plus_inv": lambda c: c + Fraction(2 ** k, Q)}[r]
    return _set_const(site, fn)


#: factors ``c`` for ``sqrt(u) → sqrt(c²·u)/c``: equivalent when ``c > 0``, a sign flip when not
SQRT_FACTORS = (Fraction(11), Fraction(-11), Fraction(3), Fraction(-3), Fraction(13, 7), Fraction(-13, 7),
                Fraction(2), Fraction(-1))


def _sqrt_scaled(g, rng, factors) -> dict | None:
    s = _sites(g, lambda s: s.op.kind == "sqrt")
    if not s:
        return None
    site = _choice(rng, s)
    c = _choice(rng, factors)

    def build(rb: Rebuild, op: Op) -> list:
        (u,) = rb.inputs(op)
        if c == -1:  # the root's sign flipped outright
            return [_scale(rb, rb.add(op, [u]), Fraction(-1))]
        return [_scale(rb, rb.add(op, [_scale(rb, u, c * c)]), 1 / c)]  # sqrt(c²·u) / c
    return _replace(site, build)


def _m_sqrt_sign(g, rng):
    """``sqrt(u) → sqrt(c²·u)/c`` for ``c`` in :data:`SQRT_FACTORS` (a sign flip
    under sqrt when ``c < 0``, positive scaling — equivalent — when ``c > 0``), or
    ``−sqrt(u)``."""
    return _sqrt_scaled(g, rng, SQRT_FACTORS)


#: a part this much larger than the rest of its output (:func:`with_large_part`)
LARGE = 2 ** 40


def _m_hidden_part(g, rng):
    """Next to a part scaled by ≥ 2^20 in one concatenated output, the other part
    ``B`` becomes ``B + B·P/2^20``: a norm-wise float comparison of the whole output
    cannot see it, a test whose p is ``P`` neither."""
    out = []
    for kop, ops in _levels(g):
        for op in ops:
            if op.kind != "concat" or len(op.inputs) != 2:
                continue
            big = [k for k, t in enumerate(op.inputs) if t.op.kind == "scale" and abs(t.op.attrs["c"]) >= 2 ** 20]
            out += [(_Site(kop, op), 1 - k) for k in big]
    if not out:
        return None
    site, k = _choice(rng, out)
    P = int(_choice(rng, trap_primes()[0::2]))  # the p of each pair

    def build(rb: Rebuild, op: Op) -> list:
        ins = rb.inputs(op)
        b = ins[k]
        ins[k] = rb.graph.add_op("add", [b, _scale(rb, b, Fraction(P, 2 ** 20))], {})
        return [rb.add(op, ins)]
    return _replace(site, build)


def with_large_part(graph: KernelGraph, dim: int = 0) -> KernelGraph:
    """``graph`` with its first output ``O`` replaced by ``concat([O·2^40, O], dim)``:
    one output with a part 2^40 times larger than the rest — the setting in which a
    wrong small part hides from a norm-wise float comparison (:func:`_m_hidden_part`)."""
    if not isinstance(graph, KernelGraph):
        raise InputError(f"with_large_part: expected a Program or KernelGraph, got {type(graph).__name__}")
    args.integer("with_large_part", f"dim (output 0 has rank {graph.outputs[0].ndim})", dim, 0,
                 graph.outputs[0].ndim - 1)
    g = type(graph)(f"{graph.name}+large")
    m = splice(g, graph, {})
    o = m[graph.outputs[0]]
    big = g.add_op("concat", [g.add_op("scale", [o], {"c": Fraction(LARGE)}), o], {"dim": dim})
    for t in [big] + [m[t] for t in graph.outputs[1:]]:
        g.output(t)
    return g


# ---------------------------------------------------------------------------- safe softmax
# The mistakes of a hand-written (or searched) safe softmax, on graphs from
# :func:`random_softmax`: each makes the result depend on the value of some max, which the
# verifier sees as a free shift (docs/design.md §3.3) — and the one equivalent change,
# another per-row shift, which it must accept.


def _shift_of(t: Tensor) -> Optional[Tensor]:
    """``x`` if ``t`` is ``x − max(x, ·)`` (a softmax's shifted scores), else None."""
    op = t.op
    if op.kind != "sub" or op.inputs[1].op.kind != "max":
        return None
    x = op.inputs[0]
    return x if op.inputs[1].op.inputs[0] is x else None


def _shifted_exp(t: Tensor) -> Optional[Tensor]:
    """``x`` if ``t`` is ``exp(x − max(x, ·))``, else None."""
    return _shift_of(t.op.inputs[0]) if t.op.kind == "exp" else None


def _m_max_dim(g: KernelGraph, rng: Rng) -> dict | None:
    """A max over another dim: ``exp(s − max(s, 0))`` for ``exp(s − max(s, 1))`` — the
    column maxima do not cancel in a row's normalization."""
    s = _sites(g, lambda s: s.op.kind == "max" and s.op.inputs[0].ndim > 1)
    if not s:
        return None
    site = _choice(rng, s)
    dim = int(_choice(rng, [d for d in range(site.op.inputs[0].ndim) if d != site.op.attrs["dim"]]))
    return _with_inputs(site, lambda ins: ins, attrs={**site.op.attrs, "dim": dim})


def _m_unshifted_denominator(g: KernelGraph, rng: Rng) -> dict | None:
    """``Σ exp(x − max x) → Σ exp(x)`` in the denominator only: the numerator keeps the
    shift, so the result is off by ``exp(max x)`` per row."""
    s = _sites(g, lambda s: s.op.kind == "sum" and _shifted_exp(s.op.inputs[0]) is not None)
    if not s:
        return None
    site = _choice(rng, s)
    x = _shifted_exp(site.op.inputs[0])

    def build(rb: Rebuild, op: Op) -> list:
        return [rb.add(op, [rb.graph.add_op("exp", [rb.get(x)], {})])]
    return _replace(site, build)


def _rescale_sides(g) -> list[tuple[Optional[Op], Tensor, dict[str, list[tuple[Op, Tensor]]]]]:
    """The split form's rescales ``r_c = exp(m_c − M)`` (an exp of a difference of two
    maxima), per level: ``(kernel op, r_c, {"num": [(mul, other operand)], "den": [...]})``
    — the ``mul`` ops that apply ``r_c``, on the denominator side when the other operand
    is a ``sum``."""
    out = []
    for kop, ops in _levels(g):
        for op in ops:
            if op.kind != "exp" or op.inputs[0].op.kind != "sub":
                continue
            if not all(t.op.kind == "max" for t in op.inputs[0].op.inputs):
                continue
            r = op.outputs[0]
            sides: dict[str, list[tuple[Op, Tensor]]] = {"num": [], "den": []}
            for u in ops:
                if u.kind == "mul" and r in u.inputs and len(set(u.inputs)) == 2:
                    other = u.inputs[1] if u.inputs[0] is r else u.inputs[0]
                    sides["den" if other.op.kind == "sum" else "num"].append((u, other))
            if sides["num"] or sides["den"]:
                out.append((kop, r, sides))
    return out


def _unscale(kop: Optional[Op], uses: list[tuple[Op, Tensor]]) -> dict:
    """Edits that replace each ``mul(r, x)`` of ``uses`` by ``x`` (the rescale left out)."""
    def keep(other: Tensor) -> Callable[[Rebuild, Op], list]:
        return lambda rb, op: [rb.get(other)]
    return {"replace": {_Site(kop, u).key: keep(other) for u, other in uses}}


def _m_forget_rescale(g: KernelGraph, rng: Rng) -> dict | None:
    """A split (flash-decoding) combine that forgets to rescale one chunk: its partial
    numerator and denominator enter the combine unscaled (wrong wherever another chunk
    holds the row max)."""
    s = [x for x in _rescale_sides(g) if x[2]["num"] and x[2]["den"]]
    if not s:
        return None
    kop, _, sides = _choice(rng, s)
    return _unscale(kop, sides["num"] + sides["den"])


def _rescale_only(side: str) -> Callable:
    """The mutation of a split combine that rescales one chunk's ``side`` ("num" or "den") by
    ``exp(m_c − M)`` but not the other side."""
    other = {"num": "den", "den": "num"}[side]

    def mutation(g: KernelGraph, rng: Rng) -> dict | None:
        s = [x for x in _rescale_sides(g) if x[2]["num"] and x[2]["den"]]
        if not s:
            return None
        kop, _, sides = _choice(rng, s)
        return _unscale(kop, sides[other])
    mutation.__doc__ = f"A split combine that rescales one chunk's {side} but not its {other}."
    return mutation


_m_rescale_numerator_only = _rescale_only("num")
_m_rescale_denominator_only = _rescale_only("den")


def _m_cross_chunk_max(g: KernelGraph, rng: Rng) -> dict | None:
    """``exp(s_c − m_c) → exp(s_c − m_o)``: a chunk shifted by another chunk's max (a max
    of a tensor made by the same kind of op, e.g. another slice). Its rescale
    ``exp(m_c − M)`` no longer cancels the shift."""
    out = []
    for kop, ops in _levels(g):
        for op in ops:
            if op.kind != "sub" or _shift_of(op.outputs[0]) is None:
                continue
            x, m = op.inputs
            for o in ops:
                if o.kind != "max" or o.id >= op.id or o.outputs[0] is m or o.outputs[0].shape != m.shape:
                    continue
                if o.inputs[0] is not x and o.inputs[0].op.kind == x.op.kind:
                    out.append((_Site(kop, op), o.outputs[0]))
    if not out:
        return None
    site, other = _choice(rng, out)

    def build(rb: Rebuild, op: Op) -> list:
        return [rb.add(op, [rb.get(op.inputs[0]), rb.get(other)])]
    return _replace(site, build)


#: the per-row values :func:`_m_shift_value` shifts by instead of a max
SHIFT_VALUES = ("twice the max", "the mean", "a constant")


def _m_shift_value(g: KernelGraph, rng: Rng) -> dict | None:
    """A max replaced by another per-row value — twice the max, the mean, or the constant
    3 (``0·Σx + 3``, so the shape stays the max's): EQUIVALENT wherever the max is a shift
    that cancels, as in every graph of :func:`random_softmax` (a softmax's numerator and
    denominator, and a split form's ``exp(s_c − m_c)·exp(m_c − M)``, are unchanged by any
    per-row shift). The float64 truth calls these mutants the same; a verifier that treats
    the max as a particular value, not a free shift, would reject them."""
    s = _sites(g, lambda s: s.op.kind == "max")
    if not s:
        return None
    site = _choice(rng, s)
    how = _choice(rng, SHIFT_VALUES)
    dtype = g.inputs[0].dtype if g.inputs else "float32"

    def build(rb: Rebuild, op: Op) -> list:
        (x,) = rb.inputs(op)
        d = op.attrs["dim"]
        if how == "twice the max":
            return [_scale(rb, rb.add(op, [x]), Fraction(2))]
        total = rb.graph.add_op("sum", [x], {"dim": d})
        if how == "the mean":
            return [_scale(rb, total, Fraction(1, x.shape[d]))]
        three = rb.graph.add_op("const", [], {"value": Fraction(3), "shape": (1,) * x.ndim, "dtype": dtype})
        return [rb.graph.add_op("add", [_scale(rb, total, Fraction(0)), three], {})]
    return _replace(site, build)


def _rescaled(s: _Site) -> bool:
    return s.op.kind == "accum" and accum_monoid(s.op) == RESCALED


def _m_unrescaled_accum(g: KernelGraph, rng: Rng) -> dict | None:
    """A rescaled accumulator made a plain sum: the steps' terms, each on its own step's
    scale, added as if they shared one (an online softmax that forgets a rescale)."""
    s = _sites(g, _rescaled)
    if not s:
        return None
    return _replace(_choice(rng, s), lambda rb, op: [rb.graph.accum(rb.get(op.inputs[0]))])


def _m_rescale_by_other(g: KernelGraph, rng: Rng) -> dict | None:
    """A rescaled accumulator rescaled by another per-row tile (twice its shift) than the
    one its terms were shifted by: the result then depends on every step's max."""
    s = _sites(g, _rescaled)
    if not s:
        return None

    def build(rb: Rebuild, op: Op) -> list:
        x, m = rb.inputs(op)
        return [rb.graph.accum(x, _scale(rb, m, Fraction(2)))]
    return _replace(_choice(rng, s), build)


MUTATIONS: dict[str, Callable] = {
    "swap_operands": _m_swap_operands, "change_kind": _m_change_kind, "imap": _m_imap, "fmap": _m_fmap,
    "omap": _m_omap, "double_accum": _m_double_accum, "drop_accum": _m_redirect_accum, "scale": _m_scale,
    "reduction_dim": _m_reduction_dim, "move_exp": _m_move_exp, "swap_input": _m_swap_input,
    "prime_constant": _m_prime_constant, "exp_prime_constant": _m_exp_prime_constant, "sqrt_sign": _m_sqrt_sign,
    "hidden_part": _m_hidden_part,
    "max_dim": _m_max_dim, "unshifted_denominator": _m_unshifted_denominator,
    "forget_rescale": _m_forget_rescale, "rescale_numerator_only": _m_rescale_numerator_only,
    "rescale_denominator_only": _m_rescale_denominator_only, "cross_chunk_max": _m_cross_chunk_max,
    "shift_value": _m_shift_value, "unrescaled_accum": _m_unrescaled_accum, "rescale_by_other": _m_rescale_by_other,
}
"""name → fn(graph, rng) returning the edits of :func:`mugraph.core.rewrite.rebuild` that
make the mutant, or None when the graph has no site for it."""

#: the mutations of a safe softmax (they find sites only in graphs with a ``max``, such as
#: those of :func:`random_softmax`); ``shift_value`` among them makes equivalent mutants
SOFTMAX_MUTATIONS: tuple[str, ...] = ("max_dim", "unshifted_denominator", "forget_rescale",
                                      "rescale_numerator_only", "rescale_denominator_only",
                                      "cross_chunk_max", "shift_value", "unrescaled_accum", "rescale_by_other")
#: mutations whose mutants are equivalent by construction on the corpus (the float64 truth: "same")
EQUIVALENT_MUTATIONS: tuple[str, ...] = ("shift_value",)


def mutate(graph: KernelGraph, rng: Rng | int, *, kinds: list[str] | None = None,
           tries: int = 20) -> tuple[KernelGraph, str] | None:
    """A valid, Lax mutant of ``graph`` with the same inputs and output shapes, and
    the mutation's name (None if none of ``tries`` attempts gave one). The mutant may happen to be equivalent (e.g. a
    swap of equal operands); decide with :func:`differs`."""
    rng = _rng("mutate", rng)
    args.integer("mutate", "tries", tries, 1, 10_000)
    if kinds is not None and (isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds) or not kinds):
        raise ConfigError(f"mutate: kinds must be a non-empty list of mutation names, got {kinds!r}")
    unknown = sorted(set(kinds or ()) - set(MUTATIONS))
    if unknown:
        raise ConfigError(f"mutate: unknown mutation(s) {unknown}; known: {sorted(MUTATIONS)}")
    names = list(kinds) if kinds else list(MUTATIONS)
    for _ in range(tries):
        name = _choice(rng, names)
        try:  # no site of the drawn kind (ValueError from an empty choice) or a read of a
            # tensor made after its reader (KeyError): a mutant that cannot exist; next try
            edits = MUTATIONS[name](graph, rng)
            if edits is None:
                continue
            m = rebuild(graph, **edits, name=f"{graph.name}~{name}")
            check_lax(m)
            check_compatible(graph, m)
        except (MugraphError, KeyError, ValueError):
            continue
        return m, name
    return None


# ============================================================================ rewrites (meaning-preserving)


def _r_commute(g, rng):
    s = _sites(g, lambda s: s.op.kind in ("add", "mul"))
    if not s:
        return None
    return _with_inputs(_choice(rng, s), lambda ins: ins[::-1])


def _r_square(g, rng):
    s = _sites(g, lambda s: s.op.kind == "square")
    if not s:
        return None
    return _with_inputs(_choice(rng, s), lambda ins: [ins[0], ins[0]], kind="mul", attrs={})


def _r_sub(g, rng):
    s = _sites(g, lambda s: s.op.kind == "sub")
    if not s:
        return None

    def build(rb: Rebuild, op: Op) -> list:
        a, b = rb.inputs(op)
        return [rb.graph.add_op("add", [a, _scale(rb, b, Fraction(-1))], {})]
    return _replace(_choice(rng, s), build)


def _r_scale(g, rng):
    s = _sites(g, lambda s: s.op.kind == "scale")
    if not s:
        return None
    dtype = g.inputs[0].dtype if g.inputs else "float16"

    def build(rb: Rebuild, op: Op) -> list:
        (x,) = rb.inputs(op)
        c = rb.graph.add_op("const", [], {"value": op.attrs["c"], "shape": (1,) * x.ndim, "dtype": dtype})
        return [rb.graph.add_op("mul", [x, c], {})]
    return _replace(_choice(rng, s), build)


def _r_sqrt_scale(g, rng):
    """``sqrt(u) → sqrt(c²·u)/c`` for a positive ``c``: real arithmetic keeps the value."""
    return _sqrt_scaled(g, rng, [c for c in SQRT_FACTORS if c > 0])


def _r_prime_roundtrip(g, rng):
    """``scale(x, c) → scale(scale(x, c/P), P)`` for a prime ``P`` a fixed-prime test
    might use: ``(X/p)·p`` is ``X``."""
    s = _sites(g, lambda s: s.op.kind == "scale")
    if not s:
        return None
    site = _choice(rng, s)
    P = int(_choice(rng, trap_primes()))

    def build(rb: Rebuild, op: Op) -> list:
        (x,) = rb.inputs(op)
        return [_scale(rb, _scale(rb, x, Fraction(op.attrs["c"]) / P), Fraction(P))]
    return _replace(site, build)


REWRITES: dict[str, Callable] = {"commute": _r_commute, "square": _r_square, "sub": _r_sub, "scale": _r_scale,
                                 "sqrt_scale": _r_sqrt_scale, "prime_roundtrip": _r_prime_roundtrip}
"""name → fn(graph, rng) returning the edits of a meaning-preserving rewrite, or None."""


def rewrite(graph: KernelGraph, rng: Rng | int, *, steps: int = 2) -> KernelGraph:
    """Apply up to ``steps`` meaning-preserving rewrites (the result is equivalent)."""
    rng = _rng("rewrite", rng)
    args.integer("rewrite", "steps", steps, 0, 1000)
    g = graph
    for _ in range(steps):
        name = _choice(rng, list(REWRITES))
        try:
            edits = REWRITES[name](g, rng)
            if edits is not None:
                g = rebuild(g, **edits)
        except MugraphError:
            continue
    return g


# ============================================================================ ground truth


#: the corpus's period: three rounds of the six older kinds, then three safe-softmax programs
CORPUS_PERIOD = 21
#: graphs of a period that are safe-softmax programs (its last ones)
CORPUS_SOFTMAX = 3


def corpus_graph(i: int, rng: Rng, refs: list[KernelGraph]) -> KernelGraph:
    """The ``i``-th graph of the mutation fuzz's corpus: in each period of 21, three rounds
    of six kinds — a reference μGraph of ``refs``, a random program, a random μGraph, a
    random program with sqrt, and a random program or a reference with a 2^40-times
    larger part — then three safe softmaxes, a seventh of the corpus like each other kind:
    two programs (:func:`random_softmax`) and an online μGraph
    (:func:`random_online_softmax`).

    The softmax programs come last in their period, not every seventh graph, so that the
    first 18 graphs have no ``max``: a ``max`` has a field meaning only with the free
    draws of a field test (docs/design.md §3.3), and a caller that evaluates a prefix of
    the corpus with the field algebra alone (a residue comparison of two evaluation paths)
    keeps working. The six older kinds appear in the same order as before the softmax
    programs joined."""
    period, k = divmod(i, CORPUS_PERIOD)
    if k == CORPUS_PERIOD - 1:  # the last softmax of a period: its online μGraph (§3.4)
        return random_online_softmax(rng)
    if k >= CORPUS_PERIOD - CORPUS_SOFTMAX:
        return random_softmax(rng)
    j = (CORPUS_PERIOD - CORPUS_SOFTMAX) * period + k  # the index among the older kinds' graphs
    kind = j % 6
    if kind == 0:
        return refs[(j // 6) % len(refs)]
    if kind == 1:
        return random_program(rng)
    if kind == 2:
        return random_ugraph(rng)
    if kind == 3:
        return random_program(rng, sqrt=True)
    if kind == 4:
        return with_large_part(random_program(rng))
    return with_large_part(refs[(j // 6) % len(refs)])


