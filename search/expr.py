"""Abstract expressions (paper §4.3, DESIGN §3).

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
``("add", a, b)``   ``("mul", a, b)``: commutative, children sorted by text
``("div", a, b)``   ``("exp", a)`` ``("sqrt", a)`` ``("silu", a)``
``("sum", n, a)``   a reduction adding ``n`` terms (exact size, no log2)
``("max", n, a)``   not Lax; kept as an uninterpreted reduction
``("cat", d, parts)`` a concatenation along dim ``d`` (counted from the right),
                    ``parts`` a tuple of ``(size, id)``; see below
``("top",)``        an expression we cannot describe (reshape of a concat, …)
==================  ==================================================

Decisions: rational factors are *erased*: ``scale(x, c)`` is ``E(x)`` and
``sub(a, b)`` is ``add(a, b)``. Erasing is a homomorphism (A_eq-equivalent terms
stay equivalent after it), so Theorem 1 still holds; it only makes E coarser —
``x`` and ``2x`` look alike, and the fingerprint, which sees every constant,
tells them apart. Measured reason: with constants as leaves (``mul(x, #1/64)``)
the saturated e-graph of qknorm_gqa passed 3 M e-nodes in 115 s without
saturating, and rmsnorm_matmul took 2.5 s / 144 K nodes; erased, they saturate in
2.2 s / 114 K and 0.36 s / 23 K. (The enumerator forbids ``scale`` of a
``scale``, which E can no longer see as redundant.) A ``const`` tensor is a leaf
``#value``. ``square(x)`` is ``mul(x, x)``. Reshape and repeat are the identity
(as in the paper).

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

from fractions import Fraction
from typing import Callable, Sequence

from mugraph.ir import BlockGraph, KernelGraph, Tensor
from mugraph.ops import CATALOG

Term = int

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


def _render(t: tuple) -> str:
    k = t[0]
    if k == "var":
        return t[1]
    if k == "const":
        return f"#{t[1]}"
    if k in ("sum", "max"):
        return f"{k}({t[1]},{_TEXT[t[2]]})"
    if k == "cat":
        return f"cat[{t[1]}](" + ",".join(f"{n}:{_TEXT[p]}" for n, p in t[2]) + ")"
    if k == "top":
        return "⊤"
    return f"{k}(" + ",".join(_TEXT[c] for c in t[1:]) + ")"


# ---------------------------------------------------------------- constructors

def var(name: str) -> Term:
    return intern(("var", name))


def const(c) -> Term:
    return intern(("const", str(Fraction(c))))


TOP: Term = intern(("top",))


def _comm(kind: str, a: Term, b: Term) -> Term:
    if _TEXT[a] > _TEXT[b]:
        a, b = b, a
    return intern((kind, a, b))


def add(a: Term, b: Term) -> Term:
    return _lift2(lambda x, y: _comm("add", x, y), a, b)


def mul(a: Term, b: Term) -> Term:
    return _lift2(lambda x, y: _comm("mul", x, y), a, b)


def div(a: Term, b: Term) -> Term:
    return _lift2(lambda x, y: intern(("div", x, y)), a, b)


def unary(kind: str, a: Term) -> Term:
    t = _TERMS[a]
    if t[0] == "top":
        return TOP
    if t[0] == "cat":
        return intern(("cat", t[1], tuple((n, unary(kind, p)) for n, p in t[2])))
    return intern((kind, a))


def reduce(kind: str, n: int, a: Term) -> Term:
    """``sum``/``max`` of ``n`` terms, normalized (``n == 1`` is the identity; nested sums merge)."""
    t = _TERMS[a]
    if t[0] == "top":
        return TOP
    if n == 1:
        return a
    if t[0] == kind and kind == "sum":
        return reduce(kind, n * t[1], t[2])
    return intern((kind, n, a))


def _lift2(fn: Callable[[Term, Term], Term], a: Term, b: Term) -> Term:
    """Apply a binary constructor, pushing it into ``cat`` parts when both sides agree."""
    ta, tb = _TERMS[a], _TERMS[b]
    if ta[0] == "top" or tb[0] == "top":
        return TOP
    if ta[0] == "cat" or tb[0] == "cat":
        return TOP  # shape-aware pushes happen in the op table, where shapes are known
    return fn(a, b)


# ------------------------------------------------------------- concat helpers

def _is_cat(a: Term) -> bool:
    return _TERMS[a][0] == "cat"


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
            return intern(("cat", da, tuple((n, fn(x, y)) for (n, x), (_, y) in zip(pa, pb))))
        return TOP
    if ca:
        d, parts = _cat_parts(a)
        if len(sb) >= -d and sb[d] != 1:
            return TOP
        return intern(("cat", d, tuple((n, _elementwise2(fn, x, sa, b, sb)) for n, x in parts)))
    d, parts = _cat_parts(b)
    if len(sa) >= -d and sa[d] != 1:
        return TOP
    return intern(("cat", d, tuple((n, _elementwise2(fn, a, sa, x, sb)) for n, x in parts)))


def _matmul(a: Term, sa: tuple, b: Term, sb: tuple) -> Term:
    k = sa[-1]
    ca, cb = _is_cat(a), _is_cat(b)
    if not ca and not cb:
        return reduce("sum", k, mul(a, b))
    if ca and _cat_parts(a)[0] == -1:
        if not cb or _cat_parts(b)[0] != -2:
            return TOP
        pa, pb = _cat_parts(a)[1], _cat_parts(b)[1]
        if [n for n, _ in pa] != [n for n, _ in pb]:
            return TOP
        out = None
        for (n, x), (_, y) in zip(pa, pb):
            term = reduce("sum", n, mul(x, y)) if not (_is_cat(x) or _is_cat(y)) else TOP
            out = term if out is None else add(out, term)
        return out
    if cb and _cat_parts(b)[0] == -2:
        return TOP
    if ca and _cat_parts(a)[0] == -2 and not cb:
        return intern(("cat", -2, tuple((n, _matmul(x, sa, b, sb)) for n, x in _cat_parts(a)[1])))
    if cb and _cat_parts(b)[0] == -1 and not ca:
        return intern(("cat", -1, tuple((n, _matmul(a, sa, y, sb)) for n, y in _cat_parts(b)[1])))
    return TOP


def _sum(a: Term, shape: tuple, dim: int) -> Term:
    n = shape[dim]
    if not _is_cat(a):
        return reduce("sum", n, a)
    d, parts = _cat_parts(a)
    if dim - len(shape) == d:
        out = None
        for m, x in parts:
            term = reduce("sum", m, x) if not _is_cat(x) else TOP
            out = term if out is None else add(out, term)
        return out
    return intern(("cat", d, tuple((m, _sum(x, shape, dim)) for m, x in parts)))


def _concat(args: Sequence[Term], shapes: Sequence[tuple], dim: int) -> Term:
    d = dim - len(shapes[0])
    parts: list[tuple[int, Term]] = []
    for a, s in zip(args, shapes):
        if _is_cat(a) and _cat_parts(a)[0] == d:
            parts.extend(_cat_parts(a)[1])
        elif _TERMS[a][0] == "top":
            return TOP
        else:
            parts.append((s[dim], a))
    return intern(("cat", d, tuple(parts)))


# ------------------------------------------------------------------- op table

Rule = Callable[[list[Term], list[tuple], dict], Term]

#: E(output) per catalog op, keyed by op name: (input terms, input shapes, attrs) -> term
EXPR_RULES: dict[str, Rule] = {
    "matmul": lambda a, s, at: _matmul(a[0], s[0], a[1], s[1]),
    "add": lambda a, s, at: _elementwise2(add, a[0], s[0], a[1], s[1]),
    "sub": lambda a, s, at: _elementwise2(add, a[0], s[0], a[1], s[1]),
    "mul": lambda a, s, at: _elementwise2(mul, a[0], s[0], a[1], s[1]),
    "div": lambda a, s, at: _elementwise2(div, a[0], s[0], a[1], s[1]),
    "exp": lambda a, s, at: unary("exp", a[0]),
    "sqrt": lambda a, s, at: unary("sqrt", a[0]),
    "silu": lambda a, s, at: unary("silu", a[0]),
    "square": lambda a, s, at: _elementwise2(mul, a[0], s[0], a[0], s[0]),
    "scale": lambda a, s, at: a[0],
    "const": lambda a, s, at: const(at["value"]),
    "sum": lambda a, s, at: _sum(a[0], s[0], at["dim"]),
    "max": lambda a, s, at: reduce("max", s[0][at["dim"]], a[0]) if not _is_cat(a[0]) else TOP,
    "concat": lambda a, s, at: _concat(a, s, at["dim"]),
    "reshape": lambda a, s, at: a[0] if not _is_cat(a[0]) else TOP,
    "repeat": lambda a, s, at: a[0] if not _is_cat(a[0]) else TOP,
}

assert set(EXPR_RULES) == set(CATALOG), "every catalog op needs an abstract-expression rule"


def op_expr(kind: str, args: list[Term], shapes: list[tuple], attrs: dict) -> Term:
    """E of a catalog op's output."""
    return EXPR_RULES[kind](args, shapes, attrs)


def accum_expr(x: Term, forloop: int) -> Term:
    """E of an accumulator over ``forloop`` iterations: ``sum(F, E(x))``."""
    if _is_cat(x):
        d, parts = _cat_parts(x)
        return intern(("cat", d, tuple((n, accum_expr(p, forloop)) for n, p in parts)))
    return reduce("sum", forloop, x)


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
            env[out] = accum_expr(env[op.inputs[0]], block.forloop)
        else:
            env[out] = op_expr(op.kind, [env[t] for t in op.inputs], [t.shape for t in op.inputs], op.attrs)
    return env


def output_exprs(graph: KernelGraph) -> list[Term]:
    env = abstract_expr(graph)
    return [env[t] for t in graph.outputs]


def leaves(i: Term) -> list[Term]:
    """The non-cat parts of a term (itself unless it is a ``cat``)."""
    t = _TERMS[i]
    if t[0] != "cat":
        return [i]
    return [x for _, p in t[2] for x in leaves(p)]


def size(i: Term) -> int:
    """Number of nodes of the term tree (for statistics and test corpora)."""
    t = _TERMS[i]
    if t[0] in ("var", "const", "top"):
        return 1
    if t[0] in ("sum", "max"):
        return 1 + size(t[2])
    if t[0] == "cat":
        return 1 + sum(size(p) for _, p in t[2])
    return 1 + sum(size(c) for c in t[1:])
