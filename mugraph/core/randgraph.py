"""One seeded generator of random valid μGraphs, for the tests of every stage.

The lowering's tests and the verifier's mutation fuzz draw their random μGraphs here,
each through a :class:`Profile` (:data:`LOWERING`, :func:`fuzz_profile`): what sizes,
grids, loops, op kinds, kernels and magnitudes may be drawn. The generator is the same.

Graphs are built bottom-up so they are valid by construction: tile shapes are drawn
first and device shapes derived from them (so every imap/fmap divides) — or, in a
profile with ``square=n``, every kernel input is ``n×n`` and the maps are drawn on it —
ops are only applied where the catalog's shape rule accepts them, and the builder's
own checks (:mod:`mugraph.core.ir`) reject anything else (the draw is then retried).

Numerics can be kept tame so a float64 comparison is meaningful: every tile carries a
rough magnitude bound, ``exp`` only sees arguments up to ``Profile.exp_arg``, ``sqrt``
only non-negative values and ``div`` only denominators bounded away from zero
(positive values with a known lower bound). The generator covers every block op of
the catalog, 1–3 grid axes, loops, dims both imapped and fmapped, replicated inputs,
several savers, post-loop ops, broadcasting of tiles, odd sizes (padding + masks),
chains of graph-defined kernels and pre-defined ops between them (a permute and a
slice among them: strided views the next kernel loads through); a profile narrows
that (the fuzz's: one kernel over square inputs, Lax ops only, so that changing an
imap, fmap or omap mostly keeps the graph valid and changes its meaning).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

from . import builder as B
from .errors import MugraphError
from .ir import BlockGraph, KernelGraph, Tensor, broadcasts_to
from .lax import check_lax
from .ops import broadcast_shapes

SIZES = (1, 2, 3, 4, 5, 6, 8, 16)

#: every kind of step :meth:`_Gen.grow` can take ("posify": ``x² + c``, a positive
#: value to divide by; "const": a binary op with a constant)
STEPS = ("unary", "binary", "binary", "reduce", "matmul", "matmul", "concat", "reshape", "repeat", "permute", "const",
         "posify")
UNARY = ("exp", "sqrt", "square", "silu", "scale", "exp", "square")
BINARY = ("add", "sub", "mul", "div", "add", "mul")
ALL_OPS = frozenset(UNARY + BINARY + ("sum", "max", "matmul", "concat", "reshape", "repeat", "permute", "const"))


@dataclass(frozen=True)
class Profile:
    """What :func:`random_ugraph` may draw. Choices are tuples (drawn uniformly, a
    repeated entry weighs more); ``(lo, hi)`` ranges are inclusive."""

    #: tile dims drawn from
    sizes: tuple[int, ...] = SIZES
    #: when set, every fresh kernel input is ``square × square`` (2-D) and its maps are
    #: drawn on it, instead of a drawn tile scaled up by the maps
    square: Optional[int] = None
    #: grid size choices per axis (x, y, z)
    grid: tuple[tuple[int, ...], ...] = ((1, 2, 3), (1, 1, 2), (1, 1, 1, 2))
    #: loop length choices
    forloops: tuple[int, ...] = (1, 2, 3, 4)
    #: block op kinds that may be drawn (a subset of :data:`ALL_OPS`)
    ops: frozenset = ALL_OPS
    #: the kinds of step and of unary op, drawn uniformly from these (a repeated entry
    #: weighs more; entries whose ops are not in ``ops`` are left out)
    steps: tuple[str, ...] = STEPS
    unary: tuple[str, ...] = UNARY
    binary: tuple[str, ...] = BINARY
    #: ``exp(x)`` is drawn as ``exp(scale(x, exp_scale))`` (exponents kept small without
    #: a magnitude bound; None: plain ``exp``)
    exp_scale: Optional[Fraction] = None
    #: a second graph-defined kernel (and a pre-defined op between the two) may be drawn
    chain: bool = True
    #: fresh inputs of the first kernel
    inputs: tuple[int, int] = (1, 3)
    #: block ops drawn before the loop's accumulators, and after them
    body_ops: tuple[int, int] = (2, 7)
    post_ops: tuple[int, int] = (0, 3)
    #: raw tiles may be accumulated (False: only the results of block ops, when there are any)
    acc_tiles: bool = True
    #: the chance that an accumulated tile is summed rescaled to the running max of a body
    #: tile that broadcasts to it (an online accumulator, docs/design.md §3.4) instead of
    #: plainly, and that a kernel also keeps the running max of a body tile (0: never)
    online: float = 0.0
    #: the chance that a kernel's post-loop ops may also read its loop-invariant body tiles
    #: (iterators without an fmap and what is made of them: a residual or bias added after
    #: the loop, docs/design.md §2.4; 0: post-loop ops read only accumulators' results)
    invariant_post: float = 0.0
    #: how many tensors each kernel saves (at most), and whether the latest post-loop
    #: tensors (those that depend on the most ops) are saved first instead of random ones
    savers: tuple[int, int] = (1, 3)
    save_latest: bool = False
    #: a matmul whose operands do not fit gets a fresh iterator as its right operand
    partner: bool = True
    #: largest magnitude a tile may reach (None: no bound), and ``exp``'s largest argument
    max_magnitude: Optional[float] = 1e6
    exp_arg: Optional[float] = 4.0
    #: the graph must be in the Lax fragment (:func:`mugraph.core.lax.check_lax`)
    lax: bool = False
    dtype: str = "float32"
    name: str = field(default="random")


#: the lowering's tests: everything the lowering must handle, with tame numerics
LOWERING = Profile()
#: the same with online accumulators (rescaled sums and running maxima) drawn often
ONLINE_LOWERING = Profile(online=0.5, name="random_online")
#: the same with post-loop ops reading loop-invariant tiles drawn often (residual epilogues)
EPILOGUE_LOWERING = Profile(invariant_post=0.7, post_ops=(1, 4), name="random_epilogue")


def fuzz_profile(n: int = 4, max_ops: int = 5) -> Profile:
    """The verifier fuzz's graphs: one Lax kernel over 2–3 square ``n×n`` inputs, a
    grid of 1–2 blocks per axis, a loop of 1–2 iterations, 0..``max_ops`` body ops (none: a raw tile is accumulated),
    unary ops (scalings and exps, the mutations' targets) drawn more often; no
    magnitude bound (float64 overflow is counted as undecided by the fuzz)."""
    return Profile(square=n, grid=((1, 2), (1, 2), (1,)), forloops=(1, 2),
                   ops=frozenset({"matmul", "add", "sub", "mul", "div", "exp", "sum", "scale", "square", "const"}),
                   steps=("matmul", "binary", "binary", "binary", "unary", "unary", "reduce", "const", "posify"),
                   unary=("scale", "exp"), binary=("add", "sub", "mul", "div"), exp_scale=Fraction(1, 4),
                   acc_tiles=False, savers=(1, 1), save_latest=True,
                   chain=False, inputs=(2, 3), body_ops=(0, max_ops), partner=False, max_magnitude=None,
                   exp_arg=None, lax=True, name="random_ugraph")


def random_ugraph(seed: int, profile: Profile = LOWERING, max_tries: int = 50) -> KernelGraph:
    """A random valid μGraph drawn under ``profile``, deterministic in ``seed``
    (attempt ``i`` draws from ``random.Random(seed * 1000 + i)``; an attempt the
    builder, the magnitude bound or the Lax check rejects is retried)."""
    for attempt in range(max_tries):
        g = _Gen(seed * 1000 + attempt, profile)
        kg = KernelGraph(f"{profile.name}{seed}")
        try:
            outs = g.block(kg, [], g.rng.randint(*profile.inputs))
            if not outs:
                continue
            mags = dict(g.mags)
            live = [(o, mags[o.id]) for o in outs]
            if profile.chain:
                # maybe a pre-defined op, and a second graph-defined kernel
                if g.rng.random() < 0.4:
                    o, m = g.rng.choice(live)
                    u = g.rng.random()
                    if u < 0.3 and o.ndim >= 2 and "permute" in profile.ops:
                        y = B.permute(o, list(range(o.ndim))[::-1])  # a view the next kernel loads through permuted strides
                    elif u < 0.45 and max(o.shape) > 1:
                        # a kernel-level slice: a view from an offset (every other element of a dim
                        # longer than 3), which the next kernel loads through the strides
                        d = max(range(o.ndim), key=lambda i: o.shape[i])
                        y = B.slice(o, d, 1, o.shape[d], 2 if o.shape[d] > 3 else 1)
                    else:
                        y = B.scale(o, Fraction(1, 2)) if u < 0.65 else B.sqrt(B.add(B.square(o), 1))
                    live.append((y, m))
                if g.rng.random() < 0.5:
                    outs2 = g.block(kg, g.rng.sample(live, min(2, len(live))), g.rng.randint(0, 1))
                    live += [(o, g.mags[o.id]) for o in outs2]
            finals = [t for t, _ in live if t.op.kind != "input"]
            ends = [t for t in finals if not any(t in op.inputs for op in kg.ops)]
            for t in (ends or finals[-1:]):
                kg.output(t)
            if profile.max_magnitude is not None and any(m > profile.max_magnitude for _, m in live):
                continue
            if profile.lax:
                check_lax(kg)
            return kg
        except MugraphError:
            continue
    raise RuntimeError(f"random_ugraph({seed}): no valid graph in {max_tries} tries")


@dataclass
class _T:
    t: Tensor
    mag: float          # bound on |value|
    pos: float = 0.0    # > 0: value >= pos (positive, bounded away from 0)
    nonneg: bool = False


class _Gen:
    def __init__(self, seed: int, profile: Profile) -> None:
        self.rng = random.Random(seed)
        self.p = profile
        self.dtype = profile.dtype
        self.mags: dict[int, float] = {}
        ops = profile.ops
        self.unary_kinds = [k for k in profile.unary if k in ops]
        self.binary_kinds = [k for k in profile.binary if k in ops]
        allowed = {"unary": bool(self.unary_kinds), "binary": bool(self.binary_kinds),
                   "reduce": bool(ops & {"sum", "max"}), "posify": {"square", "add", "const"} <= ops,
                   "const": "const" in ops and bool(self.binary_kinds)}
        self.steps = [s for s in profile.steps if allowed.get(s, s in ops)]

    def shape(self, rank: int) -> tuple[int, ...]:
        return tuple(self.rng.choice(self.p.sizes) for _ in range(rank))

    def _fits(self, y: _T) -> bool:
        p = self.p
        if p.max_magnitude is not None and y.mag > p.max_magnitude:
            return False
        return y.t.numel <= 4096 and all(s <= 64 for s in y.t.shape)

    # ---------------------------------------------------------- block ops
    def unary(self, x: _T) -> _T | None:
        r = self.rng
        k = r.choice(self.unary_kinds)
        if k == "exp":
            if self.p.exp_arg is not None and x.mag > self.p.exp_arg:
                return None
            if self.p.exp_scale is not None:
                c = self.p.exp_scale
                x = _T(B.scale(x.t, c), x.mag * abs(float(c)))
            lo = math.exp(-x.mag) if x.mag < 700 else 0.0
            return _T(B.exp(x.t), math.exp(min(x.mag, 700.0)), lo, True)
        if k == "sqrt":
            if not (x.nonneg or x.pos):
                return None
            return _T(B.sqrt(x.t), math.sqrt(x.mag), math.sqrt(x.pos), True)
        if k == "square":
            return _T(B.square(x.t), x.mag ** 2, x.pos ** 2, True)
        if k == "silu":
            return _T(B.silu(x.t), x.mag, 0.0, False)
        c = Fraction(r.choice([-3, -1, 1, 2, 3]), r.choice([1, 2, 4]))
        return _T(B.scale(x.t, c), x.mag * abs(float(c)), x.pos * float(c) if c > 0 else 0.0, c > 0 and x.nonneg)

    def binary(self, a: _T, b: _T) -> _T | None:
        try:
            broadcast_shapes(a.t.shape, b.t.shape)
        except MugraphError:
            return None
        k = self.rng.choice(self.binary_kinds)
        if k == "div":
            if not b.pos:
                return None
            return _T(B.div(a.t, b.t), a.mag / b.pos, a.pos / b.mag if a.pos else 0.0, a.nonneg)
        if k == "add":
            return _T(B.add(a.t, b.t), a.mag + b.mag, a.pos + b.pos if a.pos and b.pos else 0.0,
                      a.nonneg and b.nonneg)
        if k == "sub":
            return _T(B.sub(a.t, b.t), a.mag + b.mag)
        return _T(B.mul(a.t, b.t), a.mag * b.mag, a.pos * b.pos, a.nonneg and b.nonneg)

    def partner(self, a: _T) -> _T:
        r = self.rng
        tile = list(a.t.shape[:-2]) + [a.t.shape[-1], r.choice(self.p.sizes[1:])]
        if tile[:-2] and r.random() < 0.5:
            tile[0] = 1  # broadcast batch
        full = list(tile)
        fmap = None
        if self.bg.forloop > 1 and r.random() < 0.6:
            fmap = r.randrange(len(tile))
            full[fmap] *= self.bg.forloop
        src = self.kg.input(f"I{len(self.kg.inputs)}", tuple(full), self.dtype)
        return _T(self.bg.input(src, fmap=fmap), 1.0)

    def reduce(self, x: _T) -> _T:
        d = self.rng.randrange(x.t.ndim)
        n = x.t.shape[d]
        kinds = self.p.ops & {"sum", "max"}
        if "max" in kinds and (self.rng.random() < 0.3 or "sum" not in kinds):
            return _T(B.max(x.t, d), x.mag, x.pos, x.nonneg)
        return _T(B.sum(x.t, d), x.mag * n, x.pos * n, x.nonneg)

    def matmul(self, a: _T, b: _T) -> _T | None:
        if self.p.partner and (a.t.ndim < 2 or b.t.ndim < 2 or a.t.shape[-1] != b.t.shape[-2]) and a.t.acc == 0 \
                and a.t.ndim >= 2 and getattr(self, "bg", None) is not None:
            b = self.partner(a)  # a fresh iterator whose tile fits as the right operand
        try:
            out = B.matmul(a.t, b.t)
        except MugraphError:
            return None
        k = a.t.shape[-1]
        return _T(out, a.mag * b.mag * k, a.pos * b.pos * k, a.nonneg and b.nonneg)

    def concat(self, a: _T, b: _T) -> _T | None:
        if a.t.ndim != b.t.ndim:
            return None
        diff = [d for d in range(a.t.ndim) if a.t.shape[d] != b.t.shape[d]]
        if len(diff) > 1:
            return None
        d = diff[0] if diff else self.rng.randrange(a.t.ndim)
        return _T(B.concat([a.t, b.t], d), max(a.mag, b.mag), min(a.pos, b.pos), a.nonneg and b.nonneg)

    def reshape(self, x: _T) -> _T | None:
        n = x.t.numel
        divs = [d for d in range(1, n + 1) if n % d == 0]
        rank = self.rng.choice([1, 2, 3])
        shape = []
        rest = n
        for _ in range(rank - 1):
            d = self.rng.choice([d for d in divs if rest % d == 0])
            shape.append(d)
            rest //= d
        shape.append(rest)
        self.rng.shuffle(shape)
        if tuple(shape) == x.t.shape:
            return None
        return _T(B.reshape(x.t, shape), x.mag, x.pos, x.nonneg)

    def repeat(self, x: _T) -> _T | None:
        reps = [1] * x.t.ndim
        reps[self.rng.randrange(x.t.ndim)] = self.rng.choice([2, 3])
        return _T(B.repeat(x.t, reps), x.mag, x.pos, x.nonneg)

    def permute(self, x: _T) -> _T | None:
        if x.t.ndim < 2:
            return None
        perm = list(range(x.t.ndim))
        while perm == sorted(perm):
            self.rng.shuffle(perm)
        return _T(B.permute(x.t, perm), x.mag, x.pos, x.nonneg)

    def const(self, like: _T) -> _T:
        v = Fraction(self.rng.choice([1, 2, 3, 5]), self.rng.choice([1, 2, 4]))
        shape = tuple(s if self.rng.random() < 0.2 else 1 for s in like.t.shape)
        t = like.t.graph.add_op("const", [], {"value": v, "shape": shape, "dtype": self.dtype})
        return _T(t, float(v), float(v), True)

    def grow(self, pool: list[_T], n_ops: int) -> None:
        r = self.rng
        for _ in range(n_ops * 6):
            if n_ops <= 0:
                break
            kind = r.choice(self.steps)
            a, b = r.choice(pool), r.choice(pool)
            try:
                if kind == "unary":
                    y = self.unary(a)
                elif kind == "binary":
                    y = self.binary(a, b)
                elif kind == "reduce":
                    y = self.reduce(a)
                elif kind == "matmul":
                    y = self.matmul(a, b)
                elif kind == "concat":
                    y = self.concat(a, b)
                elif kind == "reshape":
                    y = self.reshape(a)
                elif kind == "repeat":
                    y = self.repeat(a)
                elif kind == "permute":
                    y = self.permute(a)
                elif kind == "const":
                    y = self.binary(a, self.const(a))
                else:  # a positive value to divide by: x*x + c
                    c = self.const(a)
                    sq = _T(B.square(a.t), a.mag ** 2, 0.0, True)
                    y = _T(B.add(sq.t, c.t), sq.mag + c.mag, c.pos, True)
            except MugraphError:
                y = None
            if y is None or not self._fits(y):
                continue
            pool.append(y)
            n_ops -= 1

    # ---------------------------------------------------------- kernels
    def block(self, kg: KernelGraph, sources: list[tuple[Tensor, float]], n_new_inputs: int) -> list[Tensor]:
        r, p = self.rng, self.p
        grid = [r.choice(p.grid[0]), r.choice(p.grid[1]), r.choice(p.grid[2])]
        F = r.choice(p.forloops)
        bg = BlockGraph(grid=tuple(grid), forloop=F)
        self.bg, self.kg = bg, kg
        axes = [a for a in range(3) if grid[a] > 1]
        pool: list[_T] = []
        # iterators over existing device tensors (outputs of earlier kernels)
        for src, mag in sources:
            opts = self._iter_maps(src.shape, grid, F)
            if opts is None:
                continue
            imap, fmap = opts
            pool.append(_T(bg.input(src, imap=imap, fmap=fmap), mag))
        # fresh kernel inputs: shapes derived from drawn tiles, or square ones
        for _ in range(n_new_inputs):
            if p.square is not None:
                imap, fmap, full = self._square_maps(grid, F)
            else:
                rank = r.choice([1, 2, 2, 3, 3])
                tile = list(self.shape(rank))
                imap = [None, None, None]
                dims = list(range(rank))
                r.shuffle(dims)
                full = list(tile)
                for a in axes:
                    if dims and r.random() < 0.7:
                        d = dims.pop()
                        imap[a] = d
                        full[d] *= grid[a]
                fmap = None
                if F > 1 and r.random() < 0.8:
                    fmap = r.randrange(rank)
                    full[fmap] *= F
            name = f"I{len(kg.inputs)}"
            src = kg.input(name, tuple(full), self.dtype)
            pool.append(_T(bg.input(src, imap=tuple(imap), fmap=fmap), 1.0))
        if not pool:
            return []
        self.grow(pool, r.randint(*p.body_ops))
        body = [x for x in pool if x.t.acc == 0]
        if not p.acc_tiles:
            body = [x for x in body if x.t.op.kind != "iterator"] or body
        if not body:
            return []
        r.shuffle(body)
        accs = [self._accum(bg, x, F, body) for x in sorted(body[: r.randint(1, 3)], key=lambda x: x.t.id)]
        if p.online and r.random() < p.online:
            m = r.choice(body)
            accs.append(_T(bg.accum_max(m.t), m.mag, m.pos, m.nonneg))
        post = list(accs)
        if p.invariant_post and r.random() < p.invariant_post:
            post += [x for x in pool if x.t.acc == 0 and bg.loop_invariant(x.t)]
        self.grow(post, r.randint(*p.post_ops))
        post = [x for x in post if x.t.acc == 1]
        if p.save_latest:
            post.reverse()
        else:
            r.shuffle(post)
        saved = 0
        for x in post:
            if saved >= r.randint(*p.savers):
                break
            if x.t.ndim < len(axes):
                continue
            dims = list(range(x.t.ndim))
            r.shuffle(dims)
            omap = [None, None, None]
            for a in axes:
                omap[a] = dims.pop()
            bg.output(x.t, omap=tuple(omap))
            saved += 1
        if not saved:
            return []
        outs = kg.kernel(bg)
        self.bg = None
        for sv, o in zip(bg.savers, outs):
            self.mags[o.id] = next(x.mag for x in post if x.t is sv.tensor)
        return outs

    def _square_maps(self, grid: list[int], F: int) -> tuple[list, Optional[int], list[int]]:
        """imap, fmap and shape of a fresh ``n×n`` input: the grid's x and y axes (of size
        > 1) map the dims in a random order — with two such axes, y replicates the input
        three times in ten — and a loop walks a random dim (the builder rejects a map
        that does not divide)."""
        r, n = self.rng, self.p.square
        dims = [0, 1]
        r.shuffle(dims)
        imap = [dims[a] if a < 2 and grid[a] > 1 else None for a in range(3)]
        if grid[0] > 1 and grid[1] > 1 and r.random() < 0.3:
            imap[1] = None
        fmap = r.randrange(2) if F > 1 else None
        return imap, fmap, [n, n]

    def _accum(self, bg: BlockGraph, x: _T, F: int, body: list[_T]) -> _T:
        """``x`` summed over the loop — or, under :attr:`Profile.online`, summed rescaled to
        the running max of a body tile that broadcasts to it (each term's factor
        ``exp(m_i − M)`` is at most 1, so the bound is a plain sum's; positivity is lost)."""
        if self.p.online and self.rng.random() < self.p.online:
            shifts = [m for m in body if broadcasts_to(m.t.shape, x.t.shape)]
            if shifts:
                m = self.rng.choice(shifts)
                return _T(bg.accum(x.t, shift=m.t), x.mag * F, 0.0, x.nonneg)
        return _T(bg.accum(x.t), x.mag * F, x.pos * F, x.nonneg)

    def _iter_maps(self, shape, grid, F):
        r = self.rng
        imap = [None, None, None]
        rem = list(shape)
        used = set()
        for a in range(3):
            if grid[a] == 1:
                continue
            cands = [d for d in range(len(shape)) if d not in used and rem[d] % grid[a] == 0]
            if cands and r.random() < 0.8:
                d = r.choice(cands)
                imap[a] = d
                used.add(d)
                rem[d] //= grid[a]
        fmap = None
        if F > 1:
            cands = [d for d in range(len(shape)) if rem[d] % F == 0]
            if cands:
                fmap = r.choice(cands)
        return tuple(imap), fmap
