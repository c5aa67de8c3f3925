"""Abstract expressions (paper §4.3, docs/design.md §5.1).

Every tensor of a μGraph gets an abstract expression E: a term over uninterpreted
functions that forgets layouts and tile boundaries but keeps *what is combined with
what* and *how many terms a reduction adds up*. Two μGraphs computing the same
function have A_eq-equivalent E; a prefix whose E is not a subexpression of the
program's E can be pruned (Theorem 1).

Terms are hash-consed: a term is an ``int`` id into a process-wide table of
tuples, so building E for a new op is O(1) and an oracle answer can be cached per
id. Tuples (children are ids, sizes are ints):

==================  ==================================================
``("var", name)``   a kernel input
``("const", text)`` a rational constant (``scale``'s factor, ``const``'s value)
``("add", a, b)``   a *symbol*: an uninterpreted function of the catalog op of
                    that name — binary (``add``, ``mul``, ``div``; children of a
                    commutative op sorted by text), unary (``exp``, ``sqrt``, ``silu``)
``("sum", n, a)``   a reduction symbol folding ``n`` terms (exact size, no log2):
                    ``sum``, and ``max`` (not Lax; kept uninterpreted)
``("cat", d, parts)`` a concatenation along dim ``d`` (counted from the right),
                    ``parts`` a tuple of ``(size, id)``; see below
``("top",)``        an expression we cannot describe (reshape of a concat, …)
==================  ==================================================

The symbols are the ops whose row in :data:`EXPR_RULES` is :data:`OWN`; their arity
follows from the op's category (:func:`symbols`), and the e-graph's constructors
and Z3's function signatures are generated from that list.

Decisions: rational factors are *erased*: ``scale(x, c)`` is ``E(x)`` and
``sub(a, b)`` is ``add(a, b)``. Erasing is a homomorphism (A_eq-equivalent terms
stay equivalent after it), so Theorem 1 still holds; it only makes E coarser —
``x`` and ``2x`` look alike, and the fingerprint, which sees every constant,
tells them apart. Measured reason: with constants as leaves (``mul(x, #1/64)``)
the saturated e-graph of qknorm_gqa passed 3 M e-nodes in 115 s without
saturating, and rmsnorm_matmul took 2.5 s / 144 K nodes; erased, they saturate in
2.2 s / 114 K and 0.36 s / 23 K. (The enumerator forbids ``scale`` of a
``scale``, which E can no longer see as redundant.) A ``const`` tensor is a leaf
``#value``. ``square(x)`` is ``mul(x, x)``. Reshape, repeat and permute are
the identity (as in the paper; a permute moves a concatenated dim to its new place),
and so is a slice (it selects, never combines; of a concatenation it keeps the parts
its window covers).

Concatenation has no symbol in the paper's axioms. We give it a *structured*
value instead of an axiom: ops on a ``cat`` are pushed into its parts when the
shapes say how (a matmul contracting over the concatenated dim becomes an ``add``
of the parts' matmuls — exactly ``[X | XA] @ [W ; B] = X@W + XA@B``); anything we
cannot push through becomes ``top``. The oracle treats a ``cat`` as kept when
every part is, and ``top`` as *unknown* (kept; never prune on doubt).

Normalization happens at construction: ``sum(1, x) = x``, nested sums merge
(``sum(a, sum(b, x)) = sum(a·b, x)``), commutative children are sorted. Queries
therefore arrive at the oracle in one spelling per A_eq-trivial variant.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

from mugraph.core.ir import RUNNING_MAX, BlockGraph, KernelGraph, Tensor, accum_monoid
from mugraph.core.ops import CATALOG, CatalogError, Category

Term = int

#: leaf and structural term kinds (not symbols)
VAR, CONST, CAT, TOP_KIND = "var", "const", "cat", "top"
#: the symbols the composite rules are written in (matmul = Σ_k a·b, an accumulator a Σ over iterations)
SUM, MUL, ADD = "sum", "mul", "add"

_TERMS: list[tuple] = []
_IDS: dict[tuple, int] = {}
_TEXT: list[str] = []


def intern(t: tuple) -> Term:
    """The id of term tuple ``t`` (created on first sight)."""
    i = _IDS.get(t)
    if i is None:
        i = len(_TERMS)
        _TERMS.append(t)
        _IDS[t] = i
        _TEXT.append(_render(t))
    return i


def node(i: Term) -> tuple:
    return _TERMS[i]


def text(i: Term) -> str:
    """Canonical text: equal texts ⇔ equal terms (across processes too)."""
    return _TEXT[i]


def sized(kind: str) -> bool:
    """Is ``kind`` a reduction symbol (``(kind, n, child)``)?"""
    d = CATALOG.get(kind)
    return d is not None and d.category is Category.REDUCTION


def _render(t: tuple) -> str:
    k = t[0]
    if k == VAR:
        return t[1]
    if k == CONST:
        return f"#{t[1]}"
    if k == CAT:
        return f"cat[{t[1]}](" + ",".join(f"{n}:{_TEXT[p]}" for n, p in t[2]) + ")"
    if k == TOP_KIND:
        return "⊤"
    if sized(k):
        return f"{k}({t[1]},{_TEXT[t[2]]})"
    return f"{k}(" + ",".join(_TEXT[c] for c in t[1:]) + ")"


# ---------------------------------------------------------------- constructors

def var(name: str) -> Term:
    return intern((VAR, name))


def const(c) -> Term:
    return intern((CONST, str(Fraction(c))))


TOP: Term = intern((TOP_KIND,))


def _comm(kind: str, a: Term, b: Term) -> Term:
    if _TEXT[a] > _TEXT[b]:
        a, b = b, a
    return intern((kind, a, b))


def binary(kind: str, a: Term, b: Term) -> Term:
    """The symbol ``kind`` of two terms (children sorted when the op is commutative)."""
    if CATALOG[kind].commutative:
        return _lift2(lambda x, y: _comm(kind, x, y), a, b)
    return _lift2(lambda x, y: intern((kind, x, y)), a, b)


def add(a: Term, b: Term) -> Term:
    return binary(ADD, a, b)


def mul(a: Term, b: Term) -> Term:
    return binary(MUL, a, b)


def div(a: Term, b: Term) -> Term:
    return binary("div", a, b)


def unary(kind: str, a: Term) -> Term:
    t = _TERMS[a]
    if t[0] == TOP_KIND:
        return TOP
    if t[0] == CAT:
        return intern((CAT, t[1], tuple((n, unary(kind, p)) for n, p in t[2])))
    return intern((kind, a))


#: the extent E gives every free shift (a ``max``): any, so the sizes never tell shifts apart
SHIFT_EXTENT = 0


def reduce(kind: str, n: int, a: Term) -> Term:
    """The reduction symbol ``kind`` of ``n`` terms, normalized: ``n == 1`` is the
    identity, and nested folds of an addition merge (``sum(a, sum(b, x)) = sum(a·b, x)``)."""
    t = _TERMS[a]
    if t[0] == TOP_KIND:
        return TOP
    if n == 1:
        return a
    if t[0] == kind and CATALOG[kind].adds_up:
        return reduce(kind, n * t[1], t[2])
    return intern((kind, n, a))


def _lift2(fn: Callable[[Term, Term], Term], a: Term, b: Term) -> Term:
    """Apply a binary constructor, pushing it into ``cat`` parts when both sides agree."""
    ta, tb = _TERMS[a], _TERMS[b]
    if ta[0] == TOP_KIND or tb[0] == TOP_KIND:
        return TOP
    if ta[0] == CAT or tb[0] == CAT:
        return TOP  # shape-aware pushes happen in the op table, where shapes are known
    return fn(a, b)


# ------------------------------------------------------------- concat helpers

def _is_cat(a: Term) -> bool:
    return _TERMS[a][0] == CAT


def _cat_parts(a: Term) -> tuple[int, tuple]:
    t = _TERMS[a]
    return t[1], t[2]


def _elementwise2(fn: Callable[[Term, Term], Term], a: Term, sa: tuple, b: Term, sb: tuple) -> Term:
    """Element-wise binary op with concat pushing: matching cats go part by part;
    a cat against an operand broadcast along the cat dim goes part by part too."""
    ca, cb = _is_cat(a), _is_cat(b)
    if not ca and not cb:
        return fn(a, b)
    if ca and cb:
        (da, pa), (db, pb) = _cat_parts(a), _cat_parts(b)
        if da == db and [n for n, _ in pa] == [n for n, _ in pb]:
            return intern((CAT, da, tuple((n, fn(x, y)) for (n, x), (_, y) in zip(pa, pb))))
        return TOP
    if ca:
        d, parts = _cat_parts(a)
        if len(sb) >= -d and sb[d] != 1:
            return TOP
        return intern((CAT, d, tuple((n, _elementwise2(fn, x, sa, b, sb)) for n, x in parts)))
    d, parts = _cat_parts(b)
    if len(sa) >= -d and sa[d] != 1:
        return TOP
    return intern((CAT, d, tuple((n, _elementwise2(fn, a, sa, x, sb)) for n, x in parts)))


def _matmul(a: Term, sa: tuple, b: Term, sb: tuple) -> Term:
    k = sa[-1]
    ca, cb = _is_cat(a), _is_cat(b)
    if not ca and not cb:
        return reduce(SUM, k, mul(a, b))
    if ca and _cat_parts(a)[0] == -1:
        if not cb or _cat_parts(b)[0] != -2:
            return TOP
        pa, pb = _cat_parts(a)[1], _cat_parts(b)[1]
        if [n for n, _ in pa] != [n for n, _ in pb]:
            return TOP
        out = None
        for (n, x), (_, y) in zip(pa, pb):
            term = reduce(SUM, n, mul(x, y)) if not (_is_cat(x) or _is_cat(y)) else TOP
            out = term if out is None else add(out, term)
        return out
    if cb and _cat_parts(b)[0] == -2:
        return TOP
    if ca and _cat_parts(a)[0] == -2 and not cb:
        return intern((CAT, -2, tuple((n, _matmul(x, sa, b, sb)) for n, x in _cat_parts(a)[1])))
    if cb and _cat_parts(b)[0] == -1 and not ca:
        return intern((CAT, -1, tuple((n, _matmul(a, sa, y, sb)) for n, y in _cat_parts(b)[1])))
    return TOP


def _sum(kind: str, a: Term, shape: tuple, dim: int) -> Term:
    """A fold of addition (symbol ``kind``) along ``dim``: over a concatenated dim it is
    the ``add`` of the parts' folds."""
    n = shape[dim]
    if not _is_cat(a):
        return reduce(kind, n, a)
    d, parts = _cat_parts(a)
    if dim - len(shape) == d:
        out = None
        for m, x in parts:
            term = reduce(kind, m, x) if not _is_cat(x) else TOP
            out = term if out is None else add(out, term)
        return out
    return intern((CAT, d, tuple((m, _sum(kind, x, shape, dim)) for m, x in parts)))


def _fold(kind: str, a: Term, shape: tuple, dim: int) -> Term:
    """The reduction symbol ``kind`` along ``dim``: pushed through a concat for an
    addition; any other fold of a concat is ``top``."""
    if CATALOG[kind].adds_up:
        return _sum(kind, a, shape, dim)
    if _is_cat(a):
        return TOP
    # a free shift's extent is erased (docs/design.md §3.4): the max of a loop step's tile
    # and the max of the whole row are one shift to E, as the online softmax needs
    return reduce(kind, SHIFT_EXTENT if CATALOG[kind].lax == "shift" and shape[dim] > 1 else shape[dim], a)


def _concat(args: Sequence[Term], shapes: Sequence[tuple], dim: int) -> Term:
    d = dim - len(shapes[0])
    parts: list[tuple[int, Term]] = []
    for a, s in zip(args, shapes):
        if _is_cat(a) and _cat_parts(a)[0] == d:
            parts.extend(_cat_parts(a)[1])
        elif _TERMS[a][0] == TOP_KIND:
            return TOP
        else:
            parts.append((s[dim], a))
    return intern((CAT, d, tuple(parts)))


def _permute(a: Term, rank: int, perm: Sequence[int]) -> Term:
    """A permute forgets only the layout, so it is the identity on E; a concatenated
    dim moves to its new place (counted from the right)."""
    if not _is_cat(a):
        return a
    d, parts = _cat_parts(a)
    new = list(perm).index(rank + d) - rank
    return intern((CAT, new, tuple((n, _permute(p, rank, perm)) for n, p in parts)))


def _window(a: Term, shape: tuple, at: dict) -> Term:
    """A slice selects elements without combining any, so E keeps its argument (as for a
    reshape); a window of a concatenation along the concatenated dim is the parts it
    covers whole — one part is that part, several a ``cat`` of them — and ``top``
    when it cuts a part or steps over elements; along another dim it goes into each part."""
    if not _is_cat(a):
        return a
    d, parts = _cat_parts(a)
    dim = at["dim"] - len(shape)
    if dim != d:
        return intern((CAT, d, tuple((n, _window(p, shape, at)) for n, p in parts)))
    if at["step"] != 1:
        return TOP
    kept, pos = [], 0
    for n, p in parts:
        lo, hi = pos, pos + n
        pos = hi
        if hi <= at["start"] or lo >= at["end"]:
            continue
        if lo < at["start"] or hi > at["end"]:
            return TOP
        kept.append((n, p))
    return kept[0][1] if len(kept) == 1 else intern((CAT, d, tuple(kept)))


# ------------------------------------------------------------------- op table

Rule = Callable[[list[Term], list[tuple], dict], Term]

OWN = object()
"""The row of an op that is its own symbol: an uninterpreted function named after the
op, of the arity its category says (:func:`symbols`)."""

#: E(output) per catalog op, keyed by op name: (input terms, input shapes, attrs) -> term, or OWN
EXPR_RULES: dict[str, Rule | object] = {
    "matmul": lambda a, s, at: _matmul(a[0], s[0], a[1], s[1]),
    "add": OWN,
    "sub": lambda a, s, at: _elementwise2(add, a[0], s[0], a[1], s[1]),
    "mul": OWN,
    "div": OWN,
    "exp": OWN,
    "sqrt": OWN,
    "silu": OWN,
    "square": lambda a, s, at: _elementwise2(mul, a[0], s[0], a[0], s[0]),
    "scale": lambda a, s, at: a[0],
    "const": lambda a, s, at: const(at["value"]),
    "sum": OWN,
    "max": OWN,
    "concat": lambda a, s, at: _concat(a, s, at["dim"]),
    "reshape": lambda a, s, at: a[0] if not _is_cat(a[0]) else TOP,
    "repeat": lambda a, s, at: a[0] if not _is_cat(a[0]) else TOP,
    "permute": lambda a, s, at: _permute(a[0], len(s[0]), at["perm"]),
    "slice": lambda a, s, at: _window(a[0], s[0], at),
}


@dataclass(frozen=True)
class Symbol:
    """An uninterpreted function of abstract expressions: ``children`` term arguments,
    after a size when ``sized`` (a reduction: ``(name, n, child)``)."""

    name: str
    children: int
    sized: bool


_ARITY = {Category.UNARY: (1, False), Category.BINARY: (2, False), Category.REDUCTION: (1, True)}


def symbols() -> list[Symbol]:
    """The symbols of E in catalog order: every op whose row is :data:`OWN`, with the
    arity its category gives (unary, binary, or a reduction's size and child)."""
    out = []
    for k, d in CATALOG.items():
        if EXPR_RULES.get(k) is OWN:
            if d.category not in _ARITY:
                raise CatalogError(f"{k}: a {d.category.value} op cannot be its own symbol; give it a rule")
            out.append(Symbol(k, *_ARITY[d.category]))
    return out


def _own(kind: str, a: list[Term], s: list[tuple], at: dict) -> Term:
    c = CATALOG[kind].category
    if c is Category.UNARY:
        return unary(kind, a[0])
    if c is Category.BINARY:
        return _elementwise2(lambda x, y: binary(kind, x, y), a[0], s[0], a[1], s[1])
    return _fold(kind, a[0], s[0], at["dim"])


def op_expr(kind: str, args: list[Term], shapes: list[tuple], attrs: dict) -> Term:
    """E of a catalog op's output."""
    rule = EXPR_RULES[kind]
    if rule is OWN:
        return _own(kind, args, shapes, attrs)
    return rule(args, shapes, attrs)


def accum_expr(x: Term, forloop: int) -> Term:
    """E of an accumulator over ``forloop`` iterations: ``sum(F, E(x))``."""
    if _is_cat(x):
        d, parts = _cat_parts(x)
        return intern((CAT, d, tuple((n, accum_expr(p, forloop)) for n, p in parts)))
    return reduce(SUM, forloop, x)


# --------------------------------------------------------------- whole graphs

def abstract_expr(graph: KernelGraph) -> dict[Tensor, Term]:
    """E of every tensor of ``graph`` (kernel tensors and, inlined, every block tile).

    Graph-defined ops are inlined: an input iterator's tile has its source's E,
    an accumulator adds ``sum(F, ·)``, an output saver passes E through.
    """
    env: dict[Tensor, Term] = {}
    for op in graph.ops:
        if op.kind == "input":
            env[op.outputs[0]] = var(op.attrs["name"])
        elif op.kind == "graph_defined":
            block: BlockGraph = op.attrs["block"]
            benv = block_expr(block, [env[t] for t in block.sources])
            for t, sv in zip(op.outputs, block.savers):
                env[t] = benv[sv.tensor]
            env.update(benv)
        else:
            env[op.outputs[0]] = op_expr(op.kind, [env[t] for t in op.inputs],
                                         [t.shape for t in op.inputs], op.attrs)
    return env


def block_expr(block: BlockGraph, sources: list[Term]) -> dict[Tensor, Term]:
    env: dict[Tensor, Term] = {}
    for op in block.ops:
        out = op.outputs[0]
        if op.kind == "iterator":
            env[out] = sources[op.attrs["source"]]
        elif op.kind == "accum":
            x = env[op.inputs[0]]  # a running max is its shift; a rescaled sum a sum (§3.4)
            env[out] = x if accum_monoid(op) == RUNNING_MAX else accum_expr(x, block.forloop)
        else:
            env[out] = op_expr(op.kind, [env[t] for t in op.inputs], [t.shape for t in op.inputs], op.attrs)
    return env


def output_exprs(graph: KernelGraph) -> list[Term]:
    env = abstract_expr(graph)
    return [env[t] for t in graph.outputs]


def leaves(i: Term) -> list[Term]:
    """The non-cat parts of a term (itself unless it is a ``cat``)."""
    t = _TERMS[i]
    if t[0] != CAT:
        return [i]
    return [x for _, p in t[2] for x in leaves(p)]


@functools.lru_cache(maxsize=1 << 16)
def contains(i: Term, sub: Term) -> bool:
    """Does term ``i`` have ``sub`` among its subterms (itself included)? Terms are
    hash-consed, so this is a walk over ids, memoized."""
    if i == sub:
        return True
    t = _TERMS[i]
    if t[0] in (VAR, CONST, TOP_KIND):
        return False
    if sized(t[0]):
        return contains(t[2], sub)
    if t[0] == CAT:
        return any(contains(p, sub) for _, p in t[2])
    return any(contains(c, sub) for c in t[1:])


def size(i: Term) -> int:
    """Number of nodes of the term tree (for statistics and test corpora)."""
    t = _TERMS[i]
    if t[0] in (VAR, CONST, TOP_KIND):
        return 1
    if sized(t[0]):
        return 1 + size(t[2])
    if t[0] == CAT:
        return 1 + sum(size(p) for _, p in t[2])
    return 1 + sum(size(c) for c in t[1:])
