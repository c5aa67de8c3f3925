"""Equality saturation of the target expression (docs/design.md §5.3).

We insert the program's output expressions into an e-graph (its datatype generated
from the symbols of :mod:`search.expr`), saturate it under the axioms A_eq (egglog
does the rewriting; it was 2–20× faster than a pure-Python e-graph on the
prototype), then export the e-graph once into a Python hash-cons
table ``(op, child classes) -> class``. A query term is looked up bottom-up
*without inserting it*: μs per query instead of egglog's ms–s ``check``.

Why a lookup decides ``E ⊑ target`` exactly when saturation finished: A_sub makes
every child of an op a subexpression of it, so the subexpressions of the target
(up to A_eq) are exactly the terms represented by e-classes reachable from the
roots; a saturated e-graph is closed under A_eq, so a term equivalent to a
represented one is itself represented, and its nodes are found by the lookup.

Reductions: ``sum(n, x) = sum(a, sum(n/a, x))`` for every divisor ``a`` of every
size ``n`` written in the target, so partial sums over tiles become subterms.
Sizes are exact integers. Sizes that only appear by merging nested sums
(``sum(16, mul(sum(256, ·), ·))`` → ``sum(4096, ·)``) are not factored: doing so
made ntrans factor sizes up to 2^24 (norm of a sum of norms), and the prototype
found target-size factoring reaches the same classes with 1.3–3.7× fewer nodes.

Distributivity runs in the factoring direction only by default
(``add(mul(x,y),mul(x,z)) → mul(x,add(y,z))``): expanding made norms of sums
(ntrans) blow up past 12 M e-nodes on the prototype. ``distribute="both"``
restores the full axioms.

Likewise ``sum(i, mul(x, y)) = mul(sum(i, x), y)`` runs only inward
(``mul(sum(i,x), y) → sum(i, mul(x,y))``). Pulling a factor *out* of a sum is
what makes shape-blind axioms keep nonsense: it turns ``Σ_k W·(X·G/S)`` into
``(Σ_k W)·X·G/S`` and so keeps ``Σ_k W``, ``√X`` (via ``√(Σ X·X)``) and thousands
of such tiles. Every keep the reference μGraphs need survives (Theorem-1 test);
the price is that the e-graph answers for an oriented subset of A_eq, so Z3
(full axioms) can prove keeps the e-graph prunes — the agreement test counts them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from egglog import bindings

from . import expr as ex

_AXIOMS = """
(ruleset ax)
(rewrite (Add a b) (Add b a) :ruleset ax)
(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset ax)
(rewrite (Mul a b) (Mul b a) :ruleset ax)
(rewrite (Mul a (Mul b c)) (Mul (Mul a b) c) :ruleset ax)
(rewrite (Add (Mul x y) (Mul x z)) (Mul x (Add y z)) :ruleset ax)
(birewrite (Div (Div x y) z) (Div x (Mul y z)) :ruleset ax)
(birewrite (Mul x (Div y z)) (Div (Mul x y) z) :ruleset ax)
(birewrite (Add (Div x z) (Div y z)) (Div (Add x y) z) :ruleset ax)
(rewrite (Sum i (Sum j x)) (Sum (* i j) x) :ruleset ax)
(birewrite (Sum i (Add x y)) (Add (Sum i x) (Sum i y)) :ruleset ax)
(rewrite (Mul (Sum i x) y) (Sum i (Mul x y)) :ruleset ax)
(birewrite (Sum i (Div x y)) (Div (Sum i x) y) :ruleset ax)
(birewrite (Mul (Exp x) (Exp y)) (Exp (Add x y)) :ruleset ax)
(birewrite (Mul (Sqrt x) (Sqrt y)) (Sqrt (Mul x y)) :ruleset ax)
"""
_EXPAND = "(rewrite (Mul x (Add y z)) (Add (Mul x y) (Mul x z)) :ruleset ax)\n"
_PULL = "(rewrite (Sum i (Mul x y)) (Mul (Sum i x) y) :ruleset ax)\n"

_LEAF = {ex.VAR: "V", ex.CONST: "C"}
_CTORS: dict[str, str] = {}


def ctor(kind: str) -> str:
    """The egglog constructor of a term kind: ``V``/``C`` for leaves, the symbol's name
    capitalized (``sum`` -> ``Sum``)."""
    c = _CTORS.get(kind)
    if c is None:
        c = _CTORS[kind] = _LEAF.get(kind) or kind[:1].upper() + kind[1:]
    return c


def datatype() -> str:
    """The egglog datatype of abstract expressions, generated from :func:`search.expr.symbols`:
    a string leaf for inputs and constants, ``(Name E …)`` per symbol, ``(Name i64 E)``
    per reduction symbol."""
    parts = ["(V String)", "(C String)"]
    for sym in ex.symbols():
        parts.append(f"({ctor(sym.name)}{' i64' if sym.sized else ''}{' E' * sym.children})")
    return f"(datatype E {' '.join(parts)})"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_egglog(t: ex.Term) -> str:
    """egglog text of a term (terms with ``cat``/``top`` never reach the e-graph)."""
    n = ex.node(t)
    k = n[0]
    if k in _LEAF:
        return f"({ctor(k)} {_q(n[1])})"
    if k in (ex.CAT, ex.TOP_KIND):
        raise ValueError("cat/top terms are not e-graph terms")
    if ex.sized(k):
        return f"({ctor(k)} {n[1]} {to_egglog(n[2])})"
    return f"({ctor(k)} " + " ".join(to_egglog(c) for c in n[1:]) + ")"


def divisors(n: int) -> list[int]:
    return [a for a in range(2, n) if n % a == 0]


@dataclass
class EGraphStats:
    nodes: int = 0
    classes: int = 0
    reachable: int = 0
    iterations: int = 0
    rounds: int = 0
    sizes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    saturated: bool = False


class SaturatedEGraph:
    """The saturated e-graph of a set of root terms, exported as a hash-cons table.

    A root that is a concatenation enters as its parts (a subexpression of a ``cat`` is
    one of a part); ``top`` parts enter not at all — the oracle then never prunes
    (:class:`search.oracle.SubexprOracle`), since anything may hide in them.

    ``saturated`` is True only when no rule applied any more and no new reduction
    size appeared: then "not found" is an exact answer; otherwise it means "don't know".
    """

    def __init__(self, roots: list[ex.Term], max_nodes: int = 2_000_000, time_limit: float = 60.0,
                 distribute: str = "factor") -> None:
        t0 = time.perf_counter()
        self.stats = EGraphStats()
        eg = bindings.EGraph()
        syms = ex.symbols()
        self._sized_ctors = {ctor(x.name) for x in syms if x.sized}
        prog = datatype() + _AXIOMS + (_EXPAND + _PULL if distribute == "both" else "")
        # a concatenated root is its parts (a cat has no symbol); top has no term at all
        parts = [p for r in roots for p in ex.leaves(r) if ex.node(p)[0] != ex.TOP_KIND]
        for i, r in enumerate(parts):
            prog += f"(let $root{i} {to_egglog(r)})\n"
        eg.run_program(*eg.parse_program(prog))
        written = self._sizes_of(parts)
        sizes = sorted(written | {d for n in written for d in divisors(n)})
        rules = "".join(f"(rewrite (Sum {n} x) (Sum {a} (Sum {n // a} x)) :ruleset ax)\n"
                        for n in sizes for a in divisors(n))
        if rules:
            eg.run_program(*eg.parse_program(rules))
        saturated = False
        while True:
            out = eg.run_program(*eg.parse_program("(run ax 1)"))
            self.stats.iterations += 1
            if not out[0].report.updated:
                saturated = True
                break
            size = sum(n for _, n in eg.run_program(*eg.parse_program("(print-size)"))[0].sizes)
            if size > max_nodes or time.perf_counter() - t0 > time_limit:
                break
        self._export(eg, roots, parts)
        factored = sizes
        self.saturated = saturated
        st = self.stats
        st.saturated, st.seconds, st.sizes = saturated, time.perf_counter() - t0, sorted(factored)

    @staticmethod
    def _sizes_of(roots: list[ex.Term]) -> set[int]:
        out: set[int] = set()
        seen: set[int] = set()

        def walk(t: int) -> None:
            if t in seen:
                return
            seen.add(t)
            n = ex.node(t)
            if ex.sized(n[0]):
                if n[0] == ex.SUM:  # the sizes the factoring axioms split
                    out.add(n[1])
                walk(n[2])
            elif n[0] not in _LEAF:
                for c in n[1:]:
                    walk(c)
        for r in roots:
            walk(r)
        return out

    def _export(self, eg, root_terms: list[ex.Term], parts: list[ex.Term]) -> None:
        doc = json.loads(eg.serialize([]).to_json())
        nodes = doc["nodes"]
        cls_id: dict[str, int] = {}
        table: dict[tuple, int] = {}
        edges: dict[int, set[int]] = {}

        def cid(s: str) -> int:
            i = cls_id.get(s)
            if i is None:
                i = cls_id[s] = len(cls_id)
            return i

        for nid, nd in nodes.items():
            op = nd["op"]
            if nid.startswith("primitive"):
                continue
            ch = nd["children"]
            c = cid(nd["eclass"])
            if op in _LEAF.values():
                key = (op, json.loads(nodes[ch[0]]["op"]))
                kids: tuple = ()
            elif op in self._sized_ctors:
                n = int(nodes[ch[0]]["op"])
                kid = cid(nodes[ch[1]]["eclass"])
                key = (op, n, kid)
                kids = (kid,)
            else:
                kids = tuple(cid(nodes[x]["eclass"]) for x in ch)
                key = (op,) + kids
            table[key] = c
            edges.setdefault(c, set()).update(kids)
        self.table = table
        self._memo: dict[int, int | None] = {}
        found = [self.lookup(r) for r in parts]
        if any(r is None for r in found):
            raise RuntimeError("a target root is missing from its own e-graph")
        # per target its e-class; None for a concatenation or top (no single e-class)
        roots = [self.lookup(r) if r in parts else None for r in root_terms]
        reach: set[int] = set()
        stack = [r for r in found if r >= 0]
        while stack:
            c = stack.pop()
            if c in reach:
                continue
            reach.add(c)
            stack.extend(edges.get(c, ()))
        self.roots, self.reachable = roots, reach
        self.stats.nodes, self.stats.classes, self.stats.reachable = len(table), len(cls_id), len(reach)

    def to_tables(self) -> dict:
        """The exported e-graph as plain data (the hash-cons table, roots, reachable
        classes, statistics): what a search worker needs to answer lookups, so workers
        receive it instead of saturating the same e-graph again."""
        return {"table": self.table, "roots": list(self.roots), "reachable": self.reachable,
                "saturated": self.saturated, "stats": asdict(self.stats)}

    @classmethod
    def from_tables(cls, d: dict) -> "SaturatedEGraph":
        """An e-graph rebuilt from :meth:`to_tables` (no egglog run)."""
        g = cls.__new__(cls)
        g.table, g.roots, g.reachable, g.saturated = d["table"], list(d["roots"]), d["reachable"], d["saturated"]
        g.stats = EGraphStats(**d["stats"])
        g._memo = {}
        return g

    def lookup(self, t: ex.Term) -> int | None:
        """The e-class of term ``t``, or None if the e-graph does not represent it."""
        memo = self._memo
        if t in memo:
            return memo[t]
        n = ex.node(t)
        k = n[0]
        if k in _LEAF:
            r = self.table.get((ctor(k), n[1]))
        elif k in (ex.CAT, ex.TOP_KIND):
            r = None
        elif ex.sized(k):
            c = self.lookup(n[2])
            r = None if c is None else self.table.get((ctor(k), n[1], c))
        else:
            kids = []
            for x in n[1:]:
                c = self.lookup(x)
                if c is None:
                    memo[t] = None
                    return None
                kids.append(c)
            r = self.table.get((ctor(k),) + tuple(kids))
        memo[t] = r
        return r
