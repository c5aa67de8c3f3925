"""A seeded generator of random valid μGraphs, and a checker, for testing lowering.

Graphs are built bottom-up so they are valid by construction: tile shapes are
drawn first and device shapes derived from them (so every imap/fmap divides), ops
are only applied where the catalog's shape rule accepts them, and the builder's
own checks (:mod:`mugraph.ir`) reject anything else (the draw is then retried).

Numerics are kept tame so a float64 comparison is meaningful: every tile carries a
rough magnitude bound, ``exp`` only sees bounded values, ``sqrt`` only
non-negative ones and ``div`` only denominators bounded away from zero (positive
values with a known lower bound). The generator covers every block op of the
catalog, 1–3 grid axes, loops, dims both imapped and fmapped, replicated inputs,
several savers, post-loop ops, broadcasting of tiles, odd sizes (padding + masks),
chains of graph-defined kernels and pre-defined ops between them (a permute among
them: a strided view the next kernel loads through).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from fractions import Fraction

import torch

from mugraph import builder as B
from mugraph.errors import MugraphError
from mugraph.interpreter import evaluate
from mugraph.ir import BlockGraph, KernelGraph, Tensor
from mugraph.ops import broadcast_shapes

SIZES = (1, 2, 3, 4, 5, 6, 8, 16)


@dataclass
class _T:
    t: Tensor
    mag: float          # bound on |value|
    pos: float = 0.0    # > 0: value >= pos (positive, bounded away from 0)
    nonneg: bool = False


class _Gen:
    def __init__(self, seed: int, dtype: str) -> None:
        self.rng = random.Random(seed)
        self.dtype = dtype

    def shape(self, rank: int) -> tuple[int, ...]:
        return tuple(self.rng.choice(SIZES) for _ in range(rank))

    # ---------------------------------------------------------- block ops
    def unary(self, x: _T) -> _T | None:
        r = self.rng
        k = r.choice(["exp", "sqrt", "square", "silu", "scale", "exp", "square"])
        if k == "exp":
            if x.mag > 4:
                return None
            lo = math.exp(-x.mag)
            return _T(B.exp(x.t), math.exp(x.mag), lo, True)
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
        k = self.rng.choice(["add", "sub", "mul", "div", "add", "mul"])
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
        tile = list(a.t.shape[:-2]) + [a.t.shape[-1], r.choice(SIZES[1:])]
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
        if self.rng.random() < 0.3:
            return _T(B.max(x.t, d), x.mag, x.pos, x.nonneg)
        return _T(B.sum(x.t, d), x.mag * n, x.pos * n, x.nonneg)

    def matmul(self, a: _T, b: _T) -> _T | None:
        if (a.t.ndim < 2 or b.t.ndim < 2 or a.t.shape[-1] != b.t.shape[-2]) and a.t.acc == 0 \
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
            kind = r.choice(["unary", "binary", "binary", "reduce", "matmul", "matmul", "concat", "reshape",
                             "repeat", "permute", "const", "posify"])
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
            if y is None or y.mag > 1e6 or y.t.numel > 4096 or any(s > 64 for s in y.t.shape):
                continue
            pool.append(y)
            n_ops -= 1

    # ---------------------------------------------------------- kernels
    def block(self, kg: KernelGraph, sources: list[tuple[Tensor, float]], n_new_inputs: int) -> list[Tensor]:
        r = self.rng
        grid = [r.choice([1, 2, 3]), r.choice([1, 1, 2]), r.choice([1, 1, 1, 2])]
        F = r.choice([1, 2, 3, 4])
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
        # fresh kernel inputs, shapes derived from drawn tiles
        for _ in range(n_new_inputs):
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
        self.grow(pool, r.randint(2, 7))
        body = [p for p in pool if p.t.acc == 0]
        if not body:
            return []
        r.shuffle(body)
        accs = [self._accum(bg, x, F) for x in sorted(body[: r.randint(1, 3)], key=lambda p: p.t.id)]
        post = list(accs)
        self.grow(post, r.randint(0, 3))
        post = [p for p in post if p.t.acc == 1]
        r.shuffle(post)
        saved = 0
        for p in post:
            if saved >= r.randint(1, 3):
                break
            if p.t.ndim < len(axes):
                continue
            dims = list(range(p.t.ndim))
            r.shuffle(dims)
            omap = [None, None, None]
            for a in axes:
                omap[a] = dims.pop()
            bg.output(p.t, omap=tuple(omap))
            saved += 1
        if not saved:
            return []
        self.mags = getattr(self, "mags", {})
        outs = kg.kernel(bg)
        self.bg = None
        for sv, o in zip(bg.savers, outs):
            self.mags[o.id] = next(p.mag for p in post if p.t is sv.tensor)
        return outs

    def _accum(self, bg: BlockGraph, x: _T, F: int) -> _T:
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


def random_graph(seed: int, dtype: str = "float32", max_tries: int = 50) -> KernelGraph:
    """A random valid μGraph (deterministic in ``seed``)."""
    for attempt in range(max_tries):
        g = _Gen(seed * 1000 + attempt, dtype)
        kg = KernelGraph(f"random{seed}")
        try:
            outs = g.block(kg, [], g.rng.randint(1, 3))
            if not outs:
                continue
            mags = dict(g.mags)
            live = [(o, mags[o.id]) for o in outs]
            # maybe a pre-defined op, and a second graph-defined kernel
            if g.rng.random() < 0.4:
                o, m = g.rng.choice(live)
                u = g.rng.random()
                if u < 0.3 and o.ndim >= 2:  # a view the next kernel loads through permuted strides
                    y = B.permute(o, list(range(o.ndim))[::-1])
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
            if any(m > 1e6 for _, m in live):
                continue
            return kg
        except MugraphError:
            continue
    raise RuntimeError(f"random_graph({seed}): no valid graph in {max_tries} tries")


def random_inputs(graph: KernelGraph, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {t.name: (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1)
            .to(getattr(torch, t.dtype)).to(device) for t in graph.inputs}


def bench_inputs(graph: KernelGraph, seed: int = 0, device: str = "cuda") -> dict[str, torch.Tensor]:
    """fp16 inputs uniform in [−0.5, 0.5), drawn on ``device``: what the H100 scripts
    (``examples/bench_kernels.py``, ``examples/sweep_configs.py``) time."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {t.name: ((torch.rand(t.shape, generator=gen, device=device) * 2 - 1) * 0.5).half()
            for t in graph.inputs}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when ``out`` has a NaN/Inf (e.g. an unwritten element)."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        return math.inf
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den > 0 else 1.0)


def check(prog, graph: KernelGraph, inputs: dict[str, torch.Tensor]) -> list[float]:
    """Run ``prog`` into NaN-poisoned outputs and compare with the float64 interpreter."""
    refs = evaluate(graph, {k: v.to("cpu", torch.float64) for k, v in inputs.items()})
    dev = next(iter(inputs.values())).device
    outs = [torch.full(t.shape, float("nan"), dtype=getattr(torch, t.dtype), device=dev) for t in graph.outputs]
    prog(**inputs, out=outs)
    return [rel_error(o, r) for o, r in zip(outs, refs)]
