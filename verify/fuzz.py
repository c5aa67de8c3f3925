"""Random Lax programs, mutations and equivalence-preserving rewrites of graphs.

The verifier is only as trustworthy as the evidence that it neither rejects
equivalent pairs nor accepts different ones. This module produces that evidence
(and the search reuses it to test its own stages):

* :func:`random_program` — a seeded random Lax program over small shapes;
* :data:`MUTATIONS` — operators that change a graph's meaning the ways a buggy
  search or a buggy hand-written kernel would (swapped operands of sub/div/matmul,
  a changed imap/fmap/omap, a dropped or doubled accumulator, a wrong scale
  constant, a wrong reduction dim, a moved exp, a swapped input, add↔sub, mul↔div),
  and the ways a hostile one would fool a verifier with fixed primes: constants
  moved by a multiple of a prime or sharing it in a numerator or denominator
  (``prime_constant``), the same inside an exponent (``exp_prime_constant``), sign
  flips under ``sqrt`` (``sqrt_sign``, which also makes equivalent positive
  scalings) and a wrong part hidden next to a 2^40-times larger one in the same
  output (``hidden_part``, on graphs from :func:`with_large_part`);
* :data:`REWRITES` — operators that keep the meaning (commuted operands,
  ``square → mul``, ``sub → add ∘ scale(−1)``, ``scale → mul const``,
  ``sqrt(u) → sqrt(c²u)/c`` for ``c > 0``, ``scale(x, c) → scale(scale(x, c/P), P)``);
* :func:`differs` — the float64 ground truth: do two graphs compute different
  functions?

Mutations work on the versioned JSON form (``mugraph.serialize``), at the kernel
level and inside block graphs alike, and rebuild the graph through the builder,
so every mutant is a *valid* graph (invalid ones are discarded, never returned).
"""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Callable, Iterator

import numpy as np

from mugraph import builder as mg
from mugraph.errors import ConfigError, InputError, MugraphError
from mugraph.ir import BlockGraph, KernelGraph, Program, Tensor
from mugraph.lax import check_lax
from mugraph.ops import broadcast_shapes
from mugraph.rewrite import live_graph
from mugraph.serialize import graph_from_json, graph_to_json

from . import args
from .analysis import check_compatible
from .equivalence import fingerprint_field
from .floatcheck import FLOAT64_RTOL, compare_float64

Doc = dict
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
    """A random one-kernel μGraph over square ``n×n`` inputs with a grid of 1–2
    blocks per axis and a loop of 1–2 iterations: random imaps/fmaps, a few block
    ops on the tiles, one or two accumulators, an optional post-loop op, and a
    random valid omap. All dims are equal so that many imap/fmap/omap changes keep
    the graph valid (and change its meaning) — food for the mapping mutations."""
    rng = _rng("random_ugraph", rng)
    args.integer("random_ugraph", "n", n, 2, 64)
    args.integer("random_ugraph", "max_ops", max_ops, 1, 1000)
    for _ in range(200):
        try:
            return _try_ugraph(rng, n, max_ops, name)
        except MugraphError:
            continue
    raise RuntimeError("random_ugraph: no valid graph in 200 tries")  # pragma: no cover


def _try_ugraph(rng: Rng, n: int, max_ops: int, name: str) -> KernelGraph:
    kg = KernelGraph(name)
    X = [kg.input(f"x{i}", (n, n), "float32") for i in range(int(rng.integers(2, 4)))]
    grid = (int(_choice(rng, [1, 2])), int(_choice(rng, [1, 2])), 1)
    F = int(_choice(rng, [1, 2]))
    bg = BlockGraph(grid=grid, forloop=F)
    tiles = []
    for x in X:
        dims = [0, 1]
        rng.shuffle(dims)
        imap = tuple(dims[a] if grid[a] > 1 else None for a in range(3))
        if grid[0] > 1 and grid[1] > 1 and rng.random() < 0.3:
            imap = (imap[0], None, None)
        fmap = int(_choice(rng, [0, 1])) if F > 1 else None
        tiles.append(bg.input(x, imap=imap, fmap=fmap))
    pool = list(tiles)
    exp_used = set()
    for _ in range(int(rng.integers(1, max_ops + 1))):
        a, b = _choice(rng, pool), _choice(rng, pool)
        kind = _choice(rng, ["matmul", "add", "sub", "mul", "exp", "sum", "scale"])
        try:
            if kind == "matmul":
                t = mg.matmul(a, b)
            elif kind in ("add", "sub", "mul"):
                t = getattr(mg, kind)(a, b)
            elif kind == "exp":
                if id(a) in exp_used:
                    continue
                t = mg.exp(mg.scale(a, Fraction(1, 4)))
            elif kind == "sum":
                t = mg.sum(a, int(rng.integers(a.ndim)))
            else:
                t = mg.scale(a, Fraction(3, 2))
        except MugraphError:
            continue
        pool.append(t)
    body = pool[len(tiles):] or pool
    accs = [bg.accum(_choice(rng, body))]
    if rng.random() < 0.4:
        accs.append(bg.accum(_choice(rng, body)))
    out = accs[0]
    if len(accs) > 1:
        try:
            out = mg.div(accs[0], mg.add(mg.square(accs[1]), 1)) if rng.random() < 0.5 else mg.mul(accs[0], accs[1])
        except MugraphError:
            out = accs[0]
    axes = [a for a in range(3) if grid[a] > 1]
    dims = list(range(out.ndim))
    rng.shuffle(dims)
    omap = [None, None, None]
    for k, a in enumerate(axes):
        omap[a] = dims[k % len(dims)]
    bg.output(out, omap=tuple(omap))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    check_lax(kg)
    return kg


# ============================================================================ JSON plumbing


class _Level:
    """One level of a document: the kernel ops, or one block graph's ops."""

    def __init__(self, doc: Doc, block: dict | None):
        self.doc, self.block = doc, block
        self.ops: list[dict] = block["ops"] if block is not None else doc["ops"]

    def first_tensor(self, pos: int) -> int:
        """The id of the first tensor op ``pos`` creates."""
        if self.block is not None:
            return pos
        n = 0
        for od in self.ops[:pos]:
            n += len(od["block"]["savers"]) if od["op"] == "graph_defined" else 1
        return n

    def producers(self) -> dict[int, int]:
        """tensor id → op index."""
        out, n = {}, 0
        for i, od in enumerate(self.ops):
            k = len(od["block"]["savers"]) if (self.block is None and od["op"] == "graph_defined") else 1
            for _ in range(k):
                out[n] = i
                n += 1
        return out

    def refs(self) -> Iterator[tuple[list, int]]:
        """Every (container, index) holding a reference to a tensor of this level."""
        for od in self.ops:
            if "inputs" in od:
                for j in range(len(od["inputs"])):
                    yield od["inputs"], j
        if self.block is None:
            for j in range(len(self.doc["outputs"])):
                yield self.doc["outputs"], j
            for od in self.ops:
                if od["op"] == "graph_defined":
                    for bo in od["block"]["ops"]:
                        if bo["op"] == "iterator":
                            yield _Ref(bo, "source"), 0
        else:
            for sv in self.block["savers"]:
                yield _Ref(sv, "tensor"), 0

    def insert(self, pos: int, new_ops: list[dict]) -> int:
        """Insert catalog ops before op ``pos``. In ``new_ops``, an input ``("new", k)``
        names the k-th inserted tensor; plain ints name existing tensors (old ids).
        Returns the id of the first inserted tensor."""
        t0 = self.first_tensor(pos)
        n = len(new_ops)
        for cont, j in list(self.refs()):
            if cont[j] >= t0:
                cont[j] += n
        for od in new_ops:
            od["inputs"] = [t0 + r[1] if isinstance(r, tuple) else r for r in od.get("inputs", [])]
        self.ops[pos:pos] = new_ops
        return t0

    def consumers(self, t: int) -> list[tuple[list, int]]:
        return [(c, j) for c, j in self.refs() if c[j] == t]


class _Ref:
    """Adapter so a dict field looks like a one-element list."""

    def __init__(self, d: dict, key: str):
        self.d, self.key = d, key

    def __getitem__(self, j):
        return self.d[self.key]

    def __setitem__(self, j, v):
        self.d[self.key] = v


def _levels(doc: Doc) -> list[_Level]:
    out = [_Level(doc, None)]
    for od in doc["ops"]:
        if od["op"] == "graph_defined":
            out.append(_Level(doc, od["block"]))
    return out


def _sites(doc: Doc, pred: Callable[[_Level, int, dict], bool]) -> list[tuple[_Level, int]]:
    return [(lv, i) for lv in _levels(doc) for i, od in enumerate(lv.ops) if pred(lv, i, od)]


def _shape_map(graph: KernelGraph, doc: Doc) -> dict[tuple[int, int], tuple]:
    """(level index, tensor id) → shape, from the built graph."""
    out = {(0, t.id): t.shape for t in graph.tensors}
    li = 1
    for op in graph.ops:
        if op.kind == "graph_defined":
            for t in op.attrs["block"].tensors:
                out[(li, t.id)] = t.shape
            li += 1
    return out


# ============================================================================ mutations


def _m_swap_operands(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] in ("sub", "div", "matmul") and len(set(od["inputs"])) == 2)
    if not s:
        return None
    lv, i = _choice(rng, s)
    lv.ops[i]["inputs"].reverse()
    return doc


def _m_change_kind(doc, rng, g):
    swap = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}
    s = _sites(doc, lambda lv, i, od: od["op"] in swap)
    if not s:
        return None
    lv, i = _choice(rng, s)
    lv.ops[i]["op"] = swap[lv.ops[i]["op"]]
    return doc


def _m_imap(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] == "iterator")
    if not s:
        return None
    lv, i = _choice(rng, s)
    od = lv.ops[i]
    ndim = len(g.tensors[od["source"]].shape)
    axes = [a for a in range(3) if lv.block["grid"][a] > 1]
    if not axes:
        return None
    a = _choice(rng, axes)
    opts = [d for d in [None] + list(range(ndim)) if d != od["imap"][a]]
    od["imap"][a] = _choice(rng, opts)
    return doc


def _m_fmap(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] == "iterator" and lv.block["forloop"] > 1)
    if not s:
        return None
    lv, i = _choice(rng, s)
    od = lv.ops[i]
    ndim = len(g.tensors[od["source"]].shape)
    if od["fmap"] is not None and ndim > 1 and rng.random() < 0.5:
        # swap the roles of the looped dim and another one (a transposed walk)
        d1 = od["fmap"]
        d2 = _choice(rng, [d for d in range(ndim) if d != d1])
        sw = {d1: d2, d2: d1}
        od["fmap"] = d2
        od["imap"] = [sw.get(d, d) if d is not None else None for d in od["imap"]]
        return doc
    od["fmap"] = _choice(rng, [d for d in [None] + list(range(ndim)) if d != od["fmap"]])
    return doc


def _m_omap(doc, rng, g):
    shapes = _shape_map(g, doc)
    s = [(li, lv, k) for li, lv in enumerate(_levels(doc)) if lv.block is not None
         for k in range(len(lv.block["savers"]))]
    if not s:
        return None
    li, lv, k = _choice(rng, s)
    sv = lv.block["savers"][k]
    axes = [a for a in range(3) if lv.block["grid"][a] > 1]
    if not axes:
        return None
    if len(axes) > 1 and rng.random() < 0.5:
        a, b = rng.choice(axes, 2, replace=False)
        sv["omap"][a], sv["omap"][b] = sv["omap"][b], sv["omap"][a]
    else:
        a = _choice(rng, axes)
        ndim = len(shapes[(li, sv["tensor"])])
        sv["omap"][a] = _choice(rng, [d for d in range(ndim) if d != sv["omap"][a]])
    return doc


def _m_double_accum(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] == "accum")
    if not s:
        return None
    lv, i = _choice(rng, s)
    x = lv.ops[i]["inputs"][0]
    users = lv.consumers(i)
    t0 = lv.insert(i + 1, [{"op": "accum", "inputs": [x]}, {"op": "add", "inputs": [i, ("new", 0)]}])
    for c, j in users:  # consumers were shifted by the insertion; redirect them
        c[j] = t0 + 1
    return doc


def _m_redirect_accum(doc, rng, g):
    """Drop one accumulator: its consumers read another accumulator of that shape."""
    shapes = _shape_map(g, doc)
    out = []
    for li, lv in enumerate(_levels(doc)):
        accs = [i for i, od in enumerate(lv.ops) if od["op"] == "accum"]
        for i in accs:
            for j in accs:
                if i != j and shapes[(li, i)] == shapes[(li, j)]:
                    out.append((lv, i, j))
    if not out:
        return None
    lv, i, j = _choice(rng, out)
    for c, k in lv.consumers(i):
        c[k] = j
    return doc


def _plus1(c: Fraction) -> Fraction:
    """``c + 1``, or ``c·(1 + 2^-10)`` for ``|c| > 2^10``: a change float64 can see
    (``2^40 + 1`` is ``2^40`` to 12 digits, and the ground truth would call it equal)."""
    return c + 1 if abs(c) <= 2 ** 10 else c * Fraction(1025, 1024)


def _m_scale(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] in ("scale", "const"))
    if not s:
        return None
    lv, i = _choice(rng, s)
    attrs = lv.ops[i]["attrs"]
    key = "c" if "c" in attrs else "value"
    c = Fraction(attrs[key])
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
    attrs[key] = str(c)
    return doc


def _m_reduction_dim(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] in ("sum", "concat"))
    if not s:
        return None
    lv, i = _choice(rng, s)
    attrs = lv.ops[i]["attrs"]
    attrs["dim"] = int(_choice(rng, [d for d in range(4) if d != attrs["dim"]]))
    return doc


def _m_move_exp(doc, rng, g):
    """Move an exp one op upstream (onto an operand of its argument's producer) or
    downstream (onto its first consumer's result); the old exp becomes identity."""
    shapes = _shape_map(g, doc)
    li_of = {id(lv.ops): li for li, lv in enumerate(_levels(doc))}
    s = _sites(doc, lambda lv, i, od: od["op"] == "exp")
    if not s:
        return None
    lv, i = _choice(rng, s)
    li = li_of[id(lv.ops)]
    prod = lv.producers()
    e = lv.first_tensor(i)
    arg = lv.ops[i]["inputs"][0]
    lv.ops[i] = {"op": "scale", "inputs": [arg], "attrs": {"c": "1"}}
    if rng.random() < 0.5:  # upstream
        po = prod.get(arg)
        if po is None or "inputs" not in lv.ops[po] or lv.ops[po]["op"] in ("iterator", "accum"):
            return None
        cands = [k for k, t in enumerate(lv.ops[po]["inputs"]) if shapes.get((li, t)) == shapes.get((li, arg))]
        if not cands:
            return None
        k = _choice(rng, cands)
        src = lv.ops[po]["inputs"][k]
        t0 = lv.insert(po, [{"op": "exp", "inputs": [src]}])
        lv.ops[po + 1]["inputs"][k] = t0
    else:  # downstream
        ops_using = [k for k, od in enumerate(lv.ops) if e in od.get("inputs", []) and od["op"] not in ("accum",)]
        if not ops_using:
            return None
        k = ops_using[0]
        out_t = lv.first_tensor(k)
        later = lv.consumers(out_t)
        t0 = lv.insert(k + 1, [{"op": "exp", "inputs": [out_t]}])
        for c, j in later:
            c[j] = t0
    return doc


def _m_swap_input(doc, rng, g):
    """An op reads another tensor of the same shape (e.g. W2 instead of W1)."""
    shapes = _shape_map(g, doc)
    out = []
    for li, lv in enumerate(_levels(doc)):
        for i, od in enumerate(lv.ops):
            for k, t in enumerate(od.get("inputs", [])):
                for u in range(lv.first_tensor(i)):
                    if u != t and shapes.get((li, u)) == shapes.get((li, t)):
                        out.append((lv, i, k, u))
    if not out:
        return None
    lv, i, k, u = _choice(rng, out)
    lv.ops[i]["inputs"][k] = u
    return doc


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


def _const_sites(doc, pred=lambda lv, i, od: True):
    return _sites(doc, lambda lv, i, od: od["op"] in ("scale", "const") and pred(lv, i, od))


def _set_const(od: dict, fn) -> None:
    key = "c" if "c" in od["attrs"] else "value"
    od["attrs"][key] = str(fn(Fraction(od["attrs"][key])))


def _m_prime_constant(doc, rng, g):
    """A constant changed by a factor that a prime makes invisible to a test whose p
    (or q) is that prime ``P``: ``c·(P+1)``, ``c·(1 + P/2^k)``, ``c·P/2^k`` (numerators
    sharing ``P``), ``c·(1 + 2^k/P)`` (a denominator sharing it) — each a change of a
    factor 1.5 or more in real arithmetic (relative, so float64 sees it next to any
    magnitude)."""
    s = _const_sites(doc)
    if not s:
        return None
    lv, i = _choice(rng, s)
    P = int(_choice(rng, trap_primes()))
    k = _near(P)
    r = _choice(rng, ["times_p1", "plus_p", "times_p", "plus_inv"])
    fn = {"times_p1": lambda c: c * (P + 1) if c else Fraction(P),
          "plus_p": lambda c: c * (1 + Fraction(P, 2 ** k)) if c else Fraction(P, 2 ** k),
          "times_p": lambda c: c * Fraction(P, 2 ** k) if c else Fraction(P, 2 ** k),
          "plus_inv": lambda c: c * (1 + Fraction(2 ** k, P)) if c else Fraction(2 ** k, P)}[r]
    _set_const(lv.ops[i], fn)
    return doc


def _feeds_exp(lv: _Level, i: int) -> bool:
    t = lv.first_tensor(i)
    return any(od["op"] in ("exp", "silu") and t in od.get("inputs", []) for od in lv.ops)


def _m_exp_prime_constant(doc, rng, g):
    """A constant inside an exponent made ≡ itself mod a prime q (``c + Q/2^k``,
    ``c·Q/2^k``, ``c + 2^k/Q``): ``exp(X·(c + q))`` looks like ``exp(X·c)`` to a test
    whose q is ``Q``."""
    s = _const_sites(doc, lambda lv, i, od: _feeds_exp(lv, i))
    if not s:
        return None
    lv, i = _choice(rng, s)
    Q = int(_choice(rng, trap_primes()[1::2]))  # the q of each pair
    k = _near(Q)
    r = _choice(rng, ["plus_q", "times_q", "plus_inv"])
    fn = {"plus_q": lambda c: c + Fraction(Q, 2 ** k),
          "times_q": lambda c: c * Fraction(Q, 2 ** k) if c else Fraction(Q, 2 ** k),
          "plus_inv": lambda c: c + Fraction(2 ** k, Q)}[r]
    _set_const(lv.ops[i], fn)
    return doc


#: factors ``c`` for ``sqrt(u) → sqrt(c²·u)/c``: equivalent when ``c > 0``, a sign flip when not
SQRT_FACTORS = (Fraction(11), Fraction(-11), Fraction(3), Fraction(-3), Fraction(13, 7), Fraction(-13, 7),
                Fraction(2), Fraction(-1))


def _sqrt_scaled(doc, rng, factors) -> Doc | None:
    s = _sites(doc, lambda lv, i, od: od["op"] == "sqrt")
    if not s:
        return None
    lv, i = _choice(rng, s)
    c = _choice(rng, factors)
    u = lv.ops[i]["inputs"][0]
    out = lv.first_tensor(i)
    users = lv.consumers(out)
    if c == -1:  # the root's sign flipped outright
        t0 = lv.insert(i + 1, [{"op": "scale", "inputs": [out], "attrs": {"c": "-1"}}])
    else:  # sqrt(c²·u) / c
        pre = lv.insert(i, [{"op": "scale", "inputs": [u], "attrs": {"c": str(c * c)}}])
        lv.ops[i + 1]["inputs"] = [pre]
        out = lv.first_tensor(i + 1)
        t0 = lv.insert(i + 2, [{"op": "scale", "inputs": [out], "attrs": {"c": str(1 / c)}}])
    for cont, j in users:  # shifted by the insertions; redirect them to the new root
        cont[j] = t0
    return doc


def _m_sqrt_sign(doc, rng, g):
    """``sqrt(u) → sqrt(c²·u)/c`` for ``c`` in :data:`SQRT_FACTORS` (a sign flip
    under sqrt when ``c < 0``, positive scaling — equivalent — when ``c > 0``), or
    ``−sqrt(u)``."""
    return _sqrt_scaled(doc, rng, SQRT_FACTORS)


#: a part this much larger than the rest of its output (:func:`with_large_part`)
LARGE = 2 ** 40


def _m_hidden_part(doc, rng, g):
    """Next to a part scaled by ≥ 2^20 in one concatenated output, the other part
    ``B`` becomes ``B + B·P/2^20``: a norm-wise float comparison of the whole output
    cannot see it, a test whose p is ``P`` neither."""
    out = []
    for li, lv in enumerate(_levels(doc)):
        prod = lv.producers()
        for i, od in enumerate(lv.ops):
            if od["op"] != "concat" or len(od["inputs"]) != 2:
                continue
            big = [k for k, t in enumerate(od["inputs"])
                   if lv.ops[prod[t]]["op"] == "scale" and abs(Fraction(lv.ops[prod[t]]["attrs"]["c"])) >= 2 ** 20]
            out += [(lv, i, 1 - k) for k in big]
    if not out:
        return None
    lv, i, k = _choice(rng, out)
    P = int(_choice(rng, trap_primes()[0::2]))  # the p of each pair
    b = lv.ops[i]["inputs"][k]
    t0 = lv.insert(i, [{"op": "scale", "inputs": [b], "attrs": {"c": str(Fraction(P, 2 ** 20))}},
                       {"op": "add", "inputs": [b, ("new", 0)]}])
    lv.ops[i + 2]["inputs"][k] = t0 + 1
    return doc


def with_large_part(graph: KernelGraph, dim: int = 0) -> KernelGraph:
    """``graph`` with its first output ``O`` replaced by ``concat([O·2^40, O], dim)``:
    one output with a part 2^40 times larger than the rest — the setting in which a
    wrong small part hides from a norm-wise float comparison (:func:`_m_hidden_part`)."""
    if not isinstance(graph, KernelGraph):
        raise InputError(f"with_large_part: expected a Program or KernelGraph, got {type(graph).__name__}")
    args.integer("with_large_part", f"dim (output 0 has rank {graph.outputs[0].ndim})", dim, 0,
                 graph.outputs[0].ndim - 1)
    doc = graph_to_json(graph)
    lv = _Level(doc, None)
    o = doc["outputs"][0]
    t0 = lv.insert(len(lv.ops), [{"op": "scale", "inputs": [o], "attrs": {"c": str(LARGE)}},
                                 {"op": "concat", "inputs": [("new", 0), o], "attrs": {"dim": dim}}])
    doc["outputs"][0] = t0 + 1
    g = graph_from_json(doc)
    g.name = f"{graph.name}+large"
    return g


MUTATIONS: dict[str, Callable] = {
    "swap_operands": _m_swap_operands, "change_kind": _m_change_kind, "imap": _m_imap, "fmap": _m_fmap,
    "omap": _m_omap, "double_accum": _m_double_accum, "drop_accum": _m_redirect_accum, "scale": _m_scale,
    "reduction_dim": _m_reduction_dim, "move_exp": _m_move_exp, "swap_input": _m_swap_input,
    "prime_constant": _m_prime_constant, "exp_prime_constant": _m_exp_prime_constant, "sqrt_sign": _m_sqrt_sign,
    "hidden_part": _m_hidden_part,
}
"""name → fn(doc, rng, graph) returning the mutated doc (mutated in place) or None."""


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
    base = graph_to_json(graph)
    for _ in range(tries):
        name = _choice(rng, names)
        doc = copy.deepcopy(base)
        try:
            doc = MUTATIONS[name](doc, rng, graph)
            if doc is None:
                continue
            m = graph_from_json(doc)
            check_lax(m)
            check_compatible(graph, m)
        except (MugraphError, KeyError, IndexError, ValueError, TypeError, ZeroDivisionError):
            continue
        m.name = f"{graph.name}~{name}"
        return m, name
    return None


# ============================================================================ rewrites (meaning-preserving)


def _r_commute(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] in ("add", "mul"))
    if not s:
        return None
    lv, i = _choice(rng, s)
    lv.ops[i]["inputs"].reverse()
    return doc


def _r_square(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] == "square")
    if not s:
        return None
    lv, i = _choice(rng, s)
    x = lv.ops[i]["inputs"][0]
    lv.ops[i] = {"op": "mul", "inputs": [x, x]}
    return doc


def _r_sub(doc, rng, g):
    s = _sites(doc, lambda lv, i, od: od["op"] == "sub")
    if not s:
        return None
    lv, i = _choice(rng, s)
    a, b = lv.ops[i]["inputs"]
    t0 = lv.insert(i, [{"op": "scale", "inputs": [b], "attrs": {"c": "-1"}}])
    lv.ops[i + 1] = {"op": "add", "inputs": [a, t0]}
    return doc


def _r_scale(doc, rng, g):
    shapes = _shape_map(g, doc)
    li_of = {id(lv.ops): li for li, lv in enumerate(_levels(doc))}
    s = _sites(doc, lambda lv, i, od: od["op"] == "scale")
    if not s:
        return None
    lv, i = _choice(rng, s)
    x = lv.ops[i]["inputs"][0]
    nd = len(shapes[(li_of[id(lv.ops)], x)])
    c = lv.ops[i]["attrs"]["c"]
    t0 = lv.insert(i, [{"op": "const", "inputs": [], "attrs": {"value": c, "shape": [1] * nd},
                        "dtype": "float16"}])
    lv.ops[i + 1] = {"op": "mul", "inputs": [x, t0]}
    return doc


def _r_sqrt_scale(doc, rng, g):
    """``sqrt(u) → sqrt(c²·u)/c`` for a positive ``c``: real arithmetic keeps the value."""
    return _sqrt_scaled(doc, rng, [c for c in SQRT_FACTORS if c > 0])


def _r_prime_roundtrip(doc, rng, g):
    """``scale(x, c) → scale(scale(x, c/P), P)`` for a prime ``P`` a fixed-prime test
    might use: ``(X/p)·p`` is ``X``."""
    s = _sites(doc, lambda lv, i, od: od["op"] == "scale")
    if not s:
        return None
    lv, i = _choice(rng, s)
    P = int(_choice(rng, trap_primes()))
    c = Fraction(lv.ops[i]["attrs"]["c"])
    x = lv.ops[i]["inputs"][0]
    t0 = lv.insert(i, [{"op": "scale", "inputs": [x], "attrs": {"c": str(c / P)}}])
    lv.ops[i + 1] = {"op": "scale", "inputs": [t0], "attrs": {"c": str(P)}}
    return doc


REWRITES: dict[str, Callable] = {"commute": _r_commute, "square": _r_square, "sub": _r_sub, "scale": _r_scale,
                                 "sqrt_scale": _r_sqrt_scale, "prime_roundtrip": _r_prime_roundtrip}


def rewrite(graph: KernelGraph, rng: Rng | int, *, steps: int = 2) -> KernelGraph:
    """Apply up to ``steps`` meaning-preserving rewrites (the result is equivalent)."""
    rng = _rng("rewrite", rng)
    args.integer("rewrite", "steps", steps, 0, 1000)
    g = graph
    for _ in range(steps):
        name = _choice(rng, list(REWRITES))
        doc = copy.deepcopy(graph_to_json(g))
        dtype = g.inputs[0].dtype if g.inputs else "float16"
        try:
            doc = REWRITES[name](doc, rng, g)
            if doc is None:
                continue
            for lv in _levels(doc):
                for od in lv.ops:
                    if od["op"] == "const":
                        od["dtype"] = dtype
            g = graph_from_json(doc)
        except MugraphError:
            continue
    return g


# ============================================================================ ground truth


def differs(a: KernelGraph, b: KernelGraph, *, seed: int = 0, draws: int = 2, scale: float = 0.5,
            rtol: float = FLOAT64_RTOL) -> bool | None:
    """Whether ``a`` and ``b`` compute different real functions — the fuzz's ground
    truth: :func:`verify.floatcheck.compare_float64` (float64 on ``draws`` random
    normal inputs of std ``scale``; an element differs when it moves by more than
    ``rtol`` times its own magnitude, so a wrong small part next to a large one is
    seen, and an output that cancels to ~1e-17 is no difference); None if a run is
    not finite (undecided)."""
    return compare_float64(a, b, seed=seed, draws=draws, scale=scale, rtol=rtol)
