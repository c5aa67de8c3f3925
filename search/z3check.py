"""Z3 with the axioms as quantified formulas: the reference oracle (docs/design.md §5.4).

Measured on the prototype: Z3 proves "is a subexpression" in milliseconds when it
is true, and never proves "is not" (always *unknown*). So it is used in one
direction only — to *prove keeps* where the e-graph's budget stopped saturation —
and as the reference the e-graph oracle is tested against.

The encoding is the paper's: an uninterpreted sort ``E``, one function per
abstract operator (generated from :func:`search.expr.symbols`, its signature from the
symbol's arity), reduction sizes as integers, ``sub(x, y)`` the subexpression
relation, A_eq as universally quantified equalities and A_sub as quantified
implications (every argument of every symbol is a subexpression of it: generated too). Distributivity is the full equality here (an equality has no
direction); the e-graph only factors, so a keep that needs expansion would show
up as a disagreement in the agreement test.
"""

from __future__ import annotations

import z3

from . import expr as ex

#: Z3's resource units (``rlimit``) to a millisecond of this prover's checks, by Z3's major
#: version — they count differently: Z3 4 about a million (its proofs took 5–18 M units), Z3
#: 5.4 about two thousand (every keep of the agreement test's five programs proven within 60 k
#: units, 25–34 ms at worst on a 2-core CPU)
UNITS_PER_MS = {4: 1_000_000, 5: 2_000}
#: the wall-clock timeout is only a backstop, this many times the work bound's milliseconds
#: and at least :data:`BACKSTOP_MIN_MS` (why: see :meth:`Z3Prover.proves_sub`)
BACKSTOP_FACTOR, BACKSTOP_MIN_MS = 20, 1000


def units_per_ms() -> int:
    """:data:`UNITS_PER_MS` for the installed Z3 (a version outside the table counts as the
    nearest one in it)."""
    known = sorted(UNITS_PER_MS)
    return UNITS_PER_MS[min(max(z3.get_version()[0], known[0]), known[-1])]


class Z3Prover:
    """Proves ``q ⊑ t`` for abstract expressions, or says it could not. ``timeout_ms`` bounds
    each check's work (:data:`UNITS_PER_MS` of Z3's resource units a millisecond), not its
    wall-clock time."""

    def __init__(self, timeout_ms: int = 200, rlimit: int | None = None) -> None:
        self.timeout_ms = timeout_ms
        #: a fixed work bound (Z3's units) instead of one from ``timeout_ms``
        self.rlimit = rlimit
        self._units_per_ms = units_per_ms()
        E = self.E = z3.DeclareSort("E")
        I = z3.IntSort()
        self.symbols = ex.symbols()
        # one function per symbol, its signature from the symbol's arity: (Int,)? E… -> E
        self.fn = {sym.name: z3.Function(sym.name, *([I] if sym.sized else []), *[E] * sym.children, E)
                   for sym in self.symbols}
        self.sub = z3.Function("sub", E, E, z3.BoolSort())
        self._consts: dict[str, z3.ExprRef] = {}
        self._memo: dict[int, z3.ExprRef] = {}
        self.axioms = self._axioms()

    def _axioms(self) -> list:
        E, fn, sub = self.E, self.fn, self.sub
        x, y, z = z3.Consts("x y z", E)
        i, j = z3.Ints("i j")
        add, mul, div, sm = fn[ex.ADD], fn[ex.MUL], fn["div"], fn[ex.SUM]
        A = z3.ForAll
        ax = [
            # A_eq
            A([x, y], add(x, y) == add(y, x)),
            A([x, y, z], add(x, add(y, z)) == add(add(x, y), z)),
            A([x, y], mul(x, y) == mul(y, x)),
            A([x, y, z], mul(x, mul(y, z)) == mul(mul(x, y), z)),
            A([x, y, z], mul(x, add(y, z)) == add(mul(x, y), mul(x, z))),
            A([x, y, z], div(div(x, y), z) == div(x, mul(y, z))),
            A([x, y, z], mul(x, div(y, z)) == div(mul(x, y), z)),
            A([x, y, z], add(div(x, z), div(y, z)) == div(add(x, y), z)),
            A([x], sm(1, x) == x),
            A([i, j, x], sm(i, sm(j, x)) == sm(i * j, x)),
            A([i, x, y], sm(i, add(x, y)) == add(sm(i, x), sm(i, y))),
            A([i, x, y], sm(i, mul(x, y)) == mul(sm(i, x), y)),
            A([i, x, y], sm(i, div(x, y)) == div(sm(i, x), y)),
            A([x, y], mul(fn["exp"](x), fn["exp"](y)) == fn["exp"](add(x, y))),
            A([x, y], mul(fn["sqrt"](x), fn["sqrt"](y)) == fn["sqrt"](mul(x, y))),
            # A_sub
            A([x], sub(x, x)),
            A([x, y, z], z3.Implies(z3.And(sub(x, y), sub(y, z)), sub(x, z)),
              patterns=[z3.MultiPattern(sub(x, y), sub(y, z))]),
        ]
        # every argument of a symbol is a subexpression of it (generated per symbol)
        for sym in self.symbols:
            f = fn[sym.name]
            if sym.sized:
                ax.append(A([i, x], sub(x, f(i, x))))
            elif sym.children == 1:
                ax.append(A([x], sub(x, f(x))))
            else:
                args = [x, y, z][:sym.children]
                ax.append(A(args, z3.And(*[sub(a, f(*args)) for a in args])))
        # a partial sum over a divisor of the size is a subexpression of the whole sum
        ax.append(A([i, j, x], z3.Implies(z3.And(i > 0, j > 0, j % i == 0), sub(sm(i, x), sm(j, x))),
                    patterns=[z3.MultiPattern(sm(i, x), sm(j, x))]))
        return ax

    def encode(self, t: ex.Term) -> z3.ExprRef:
        m = self._memo.get(t)
        if m is not None:
            return m
        n = ex.node(t)
        k = n[0]
        if k in (ex.VAR, ex.CONST):
            key = ("" if k == ex.VAR else "#") + n[1]
            r = self._consts.get(key)
            if r is None:
                r = self._consts[key] = z3.Const(key, self.E)
        elif k in (ex.CAT, ex.TOP_KIND):
            raise ValueError("cat/top terms have no Z3 encoding")
        elif ex.sized(k):
            r = self.fn[k](z3.IntVal(n[1]), self.encode(n[2]))
        else:
            r = self.fn[k](*[self.encode(c) for c in n[1:]])
        self._memo[t] = r
        return r

    def proves_sub(self, q: ex.Term, target: ex.Term) -> bool:
        """True when Z3 proves ``q ⊑ target`` within the timeout; False means *unknown*."""
        s = z3.Solver()
        # bounded by work, not by a clock: a wall-clock timeout that fires while Z3's
        # E-matching runs can leave it matching on, deaf to every limit (Z3 5.4: minutes and
        # 10–14 GB, at 30 ms under load and at 1 ms every time), and where it ends depends on
        # the load; a work bound ends each check at the same point on every machine. The
        # clock stays as a backstop far past it.
        work = self.rlimit if self.rlimit is not None else max(1, self.timeout_ms) * self._units_per_ms
        s.set("rlimit", work)
        s.set("timeout", max(BACKSTOP_MIN_MS, BACKSTOP_FACTOR * self.timeout_ms))
        s.add(*self.axioms)
        s.add(z3.Not(self.sub(self.encode(q), self.encode(target))))
        return s.check() == z3.unsat
