r"""The per-test error bound: how likely one field test accepts a non-equivalent pair.

**Shape of the functions.** Every output element of a Lax graph is a real function
``N/D`` where ``N`` and ``D`` are *exponential polynomials*
``Σ_{i≤k} c_i(x) · exp(g_i(x)/h_i(x))`` with polynomial ``c_i, g_i, h_i`` (Mirage
eq. 2; at most one exp on a path keeps the exponents free of exps). For two graphs
``a = Na/Da`` and ``b = Nb/Db`` the test compares ``a`` and ``b`` in the field, i.e.
checks ``F = Na·Db − Nb·Da = 0`` at the drawn point, and ``F`` is again an
exponential polynomial. In the field, ``x`` outside exponents is ``x_p ∈ Z_p``,
inside exponents ``x_q ∈ Z_q`` (independent), and ``exp(e) = ω^e`` for a random
element ``ω`` of order ``q``.

**Polynomial part (Schwartz–Zippel).** Without exp, ``F`` is a polynomial of total
degree ``d``; if it is not identically zero, ``Pr[F(x_p) = 0] ≤ d/p``.

**Exponential part.** Group the ``k`` terms of ``F`` by their exponent as a rational
function; a non-zero ``F`` has a group with non-zero coefficient, say term 1. The
test accepts only if one of these events happens:

1. another exponent collides with term 1's at the draw: ``g_1/h_1 = g_j/h_j`` in
   ``Z_q``; ``g_1h_j − g_jh_1`` is a non-zero polynomial of degree
   ``≤ e = deg g + deg h``, so by Schwartz–Zippel and a union bound this has
   probability ``≤ (k−1)·e/q``;
2. no collision, but term 1's coefficient vanishes: ``≤ d/p`` (Schwartz–Zippel);
3. neither, so ``F`` is a non-zero polynomial ``P(ω) = Σ_j C_j ω^{ε_j}`` with at
   most ``k`` distinct exponents ``ε_j ∈ Z_q`` — a non-zero ``k``-sparse function on
   ``Z_q`` — and ``ω`` must be a root of it. **Conjecture** (the number-theoretic
   hypothesis of Li & Wu, "Identity Testing for Circuits with Exponentiation Gates",
   ITCS 2026, in the form we rely on — an uncertainty principle for the
   number-theoretic transform over ``F_p``): a non-zero ``k``-sparse
   ``f : Z_q → F_p`` has a transform with at most ``k − 1`` zeros among the ``q``-th
   roots of unity. Over ``C`` this is Chebotarev's theorem on the DFT matrix
   (Tao 2005); over ``F_p`` Malavolta & Rosen (2026) prove it for each ``q`` and all
   but finitely many ``p ≡ 1 (mod q)``, and on average over ``p = q^{O(1)}``; it is
   *not* proven for our specific pair. Under it, ``Pr_ω[P(ω) = 0] ≤ (k−1)/(q−1)``.

So one test errs with probability at most::

    ε(F) = d/p                                            (no exp)
    ε(F) = (k−1)·e/q + d/p + (k−1)/(q−1)                  (with exp; conjecture)

assuming the integer coefficients of ``F`` do not vanish mod ``p`` (true unless a
constant's numerator or denominator shares the factor ``p ≈ 2^31``).

**Failed draws.** A draw where some divisor is zero is discarded (never given a
made-up value). Conditioning on "no zero divisor" (probability ``≥ 1 − z``) can
raise the acceptance probability by at most the factor ``1/(1 − z)``, where ``z``
sums, over every division, the number of divisor elements times the bound above
for that divisor (its p-part, and its q-part ``≤ d/q`` when it has one). The per-test
bound is ``max_outputs ε(F) / (1 − z_a − z_b)``; tests are independent (fresh
inputs, fresh ω), so ``n`` passing tests leave ``bound^n``.

**Degrees.** :class:`DegreeAlgebra` runs the graph through the interpreter on
symbolic summaries (degree ``d``, term count ``k``, exponent degrees, and the
denominator as a multiset of *factors*) instead of numbers. Summing ``K`` fractions
normally multiplies their denominators; a factor that provably does not vary along
the reduced dim (it was broadcast along it, as ``s`` in ``(E/s) @ V``) is shared and
counted once. Anything the analysis cannot prove shared is multiplied out, so the
summary is always an upper bound — at worst a loose one. ``sqrt`` is outside the
theorem's class (its field map ``x^((p+1)/4)`` has huge degree): a ``sqrt`` output
is summarized as a fresh variable of degree 1, and the bound is heuristic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from mugraph.algebra import Algebra
from mugraph.errors import NotLaxError
from mugraph.ops import broadcast_shapes

from .field import Field


@dataclass(frozen=True)
class ExpPoly:
    """Summary of an exponential polynomial ``Σ_{i≤k} c_i(x)·exp(g_i/h_i)``.

    ``d``: max degree of the ``c_i``; ``k``: number of terms (1 when exp-free);
    ``eg``/``eh``: max degrees of the exponents' numerators/denominators;
    ``x``: whether any exponent is present."""

    d: int = 0
    k: float = 1.0
    eg: int = 0
    eh: int = 0
    x: bool = False

    def __mul__(self, o: "ExpPoly") -> "ExpPoly":
        if self.eh == 0 and o.eh == 0:
            eg, eh = max(self.eg, o.eg), 0
        else:  # g1/h1 + g2/h2 = (g1h2 + g2h1)/(h1h2)
            eg, eh = max(self.eg + o.eh, o.eg + self.eh), self.eh + o.eh
        x = self.x or o.x
        return ExpPoly(self.d + o.d, self.k * o.k if x else 1.0, eg, eh, x)

    def __add__(self, o: "ExpPoly") -> "ExpPoly":
        x = self.x or o.x
        return ExpPoly(max(self.d, o.d), self.k + o.k if x else 1.0, max(self.eg, o.eg), max(self.eh, o.eh), x)

    def times(self, n: int) -> "ExpPoly":
        """A sum of ``n`` summaries like this one."""
        return ExpPoly(self.d, self.k * n if self.x else 1.0, self.eg, self.eh, self.x)

    def power(self, n: int) -> "ExpPoly":
        """A product of ``n`` summaries like this one (closed form of ``*``)."""
        if n == 0:
            return ExpPoly()
        if self.eh == 0:
            eg, eh = self.eg, 0
        else:
            eg, eh = self.eg + (n - 1) * self.eh, n * self.eh
        return ExpPoly(self.d * n, self.k ** n if self.x else 1.0, eg, eh, self.x)

    def zero_prob(self, fld: Field) -> float:
        """Upper bound on ``Pr[this = 0]`` at a random draw when it is not
        identically zero (module docstring)."""
        p, q = fld.p, fld.q
        eps = self.d / p
        if self.x and self.k > 1:
            eps += (self.k - 1) * (self.eg + self.eh) / q + (self.k - 1) / (q - 1)
        return min(1.0, eps)


ONE = ExpPoly()


@dataclass(frozen=True)
class Factor:
    """One factor of a denominator: its summary, an identity ``key`` (equal keys =
    equal values at every element: same division, same moves since), and ``mask``
    — the dims of the carrier along which it may vary."""

    key: int
    poly: ExpPoly
    mask: tuple[bool, ...]


@dataclass(frozen=True)
class Deg:
    """Symbolic summary of a tensor value: ``num / Π den``."""

    shape: tuple[int, ...]
    num: ExpPoly
    den: tuple[Factor, ...] = ()
    heuristic: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def den_poly(self, factors: Sequence[Factor] | None = None) -> ExpPoly:
        out = ONE
        for f in (self.den if factors is None else factors):
            out = out * f.poly
        return out

    def exp_free(self) -> bool:
        return not self.num.x and not any(f.poly.x for f in self.den)


def _h(*parts) -> int:
    return hash(parts)


def _move(v: Deg, shape, tag, mask_fn) -> Deg:
    """Apply a structural move to every factor: new key, new mask."""
    den = tuple(Factor(_h(f.key, tag), f.poly, tuple(mask_fn(f.mask))) for f in v.den)
    return Deg(tuple(shape), v.num, den, v.heuristic)


def _groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Match the dims of a row-major reshape ``old → new`` into groups of equal
    element count (size-1 dims may form groups of their own)."""
    out, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj, po, pn = [], [], 1, 1
        if i < len(old):
            po *= old[i]; gi.append(i); i += 1
        if j < len(new):
            pn *= new[j]; gj.append(j); j += 1
        while po != pn:
            if po < pn:
                po *= old[i]; gi.append(i); i += 1
            else:
                pn *= new[j]; gj.append(j); j += 1
        out.append((gi, gj))
    return out


class DegreeAlgebra(Algebra):
    """Evaluates a graph on :class:`Deg` summaries (see the module docstring).

    After ``evaluate``, :attr:`z` bounds the probability that a draw meets a zero
    divisor in this graph, and :attr:`heuristic` says whether a ``sqrt`` made the
    summaries heuristic."""

    name = "degree"

    def __init__(self, fld: Field, salt: object = 0) -> None:
        self.field = fld
        self.salt = salt
        self.z = 0.0
        self.heuristic = False
        self._fresh = 0
        self.ops = {
            "matmul": self._matmul, "add": self._addsub, "sub": self._addsub, "mul": self._mul,
            "div": self._div, "exp": self._exp, "silu": self._silu, "sqrt": self._sqrt,
            "square": lambda xs, at: self._mul([xs[0], xs[0]], at),
            "scale": lambda xs, at: xs[0],
            "const": lambda xs, at: Deg(tuple(at["shape"]), ONE),
            "sum": lambda xs, at: self._reduce(xs[0], at["dim"]),
            "max": self._max,
            "concat": lambda xs, at: self.concat(xs, at["dim"]),
            "reshape": lambda xs, at: self.reshape(xs[0], at["shape"]),
            "repeat": lambda xs, at: self.tile(xs[0], at["reps"]),
        }

    def fresh(self) -> int:
        self._fresh += 1
        return _h("fresh", self.salt, self._fresh)

    # ------------------------------------------------------------------ structure
    def shape(self, v: Deg):
        return v.shape

    def reshape(self, v: Deg, shape):
        shape = tuple(int(s) for s in shape)
        if shape == v.shape:
            return v
        groups = _groups(v.shape, shape)

        def mask_fn(mask):
            out = [False] * len(shape)
            for gi, gj in groups:
                vary = any(mask[i] for i in gi)
                for j in gj:
                    out[j] = vary and shape[j] > 1
            return out
        return _move(v, shape, ("reshape", v.shape, shape), mask_fn)

    def permute(self, v: Deg, perm):
        perm = tuple(perm)
        return _move(v, tuple(v.shape[i] for i in perm), ("perm", v.shape, perm),
                     lambda m: [m[i] for i in perm])

    def expand(self, v: Deg, shape):
        shape = tuple(shape)
        if shape == v.shape:
            return v
        return self._broadcast(v, shape)

    def _broadcast(self, v: Deg, shape) -> Deg:
        shape = tuple(shape)
        if shape == v.shape:
            return v
        pad = len(shape) - len(v.shape)
        old = (1,) * pad + v.shape

        def mask_fn(m):
            m = [False] * pad + list(m)
            return [m[i] and old[i] == shape[i] for i in range(len(shape))]
        return _move(v, shape, ("bcast", v.shape, shape), mask_fn)

    def tile(self, v: Deg, reps):
        reps = tuple(reps)
        pad = len(reps) - len(v.shape)
        shape = tuple(s * r for s, r in zip((1,) * max(pad, 0) + v.shape, reps))
        return _move(v, shape, ("tile", v.shape, reps),
                     lambda m: [False] * max(pad, 0) + list(m))

    def concat(self, vs, axis: int):
        vs = list(vs)
        shape = list(vs[0].shape)
        shape[axis] = sum(v.shape[axis] for v in vs)
        shape = tuple(shape)
        # each region i: N_i/D_i = (N_i · Π_{j≠i} D_j) / Π_j D_j; a factor is 1 outside its region
        dens = [v.den_poly() for v in vs]
        num = None
        for i, v in enumerate(vs):
            term = v.num
            for j, dj in enumerate(dens):
                if j != i:
                    term = term * dj
            num = term if num is None else num + term
        den = []
        for i, v in enumerate(vs):
            for f in v.den:
                mask = list(f.mask)
                mask[axis] = True
                den.append(Factor(_h(f.key, "concat", i, axis, shape), f.poly, tuple(mask)))
        return Deg(shape, num, tuple(den), any(v.heuristic for v in vs))

    # ------------------------------------------------------------------ semantics
    def input(self, name, value, shape, dtype):
        return Deg(tuple(shape), ExpPoly(d=1))

    def output(self, v, as_torch):
        return v

    def accumulate(self, v, axis):
        return self._reduce(v, axis)

    def _pair(self, a: Deg, b: Deg) -> tuple[Deg, Deg]:
        shape = broadcast_shapes(a.shape, b.shape)
        return self._broadcast(a, shape), self._broadcast(b, shape)

    def _addsub(self, xs, at):
        a, b = self._pair(*xs)
        keys_b = [f.key for f in b.den]
        shared, only_a = [], []
        for f in a.den:
            if f.key in keys_b:
                keys_b.remove(f.key)
                shared.append(f)
            else:
                only_a.append(f)
        only_b = list(b.den)
        for f in shared:
            only_b.remove(next(g for g in only_b if g.key == f.key))
        num = a.num * a.den_poly(only_b) + b.num * a.den_poly(only_a)
        return Deg(a.shape, num, tuple(shared + only_a + only_b), a.heuristic or b.heuristic)

    def _mul(self, xs, at):
        a, b = self._pair(*xs)
        return Deg(a.shape, a.num * b.num, a.den + b.den, a.heuristic or b.heuristic)

    def _divisor_risk(self, b: Deg) -> None:
        n = math.prod(b.shape)
        risk = b.num.zero_prob(self.field)
        if b.exp_free():  # the q-part is divided too
            risk += b.num.d / self.field.q
        self.z += n * risk

    def _div(self, xs, at):
        a, b = xs
        self._divisor_risk(b)
        # 1/b = Db/Nb: Nb becomes a new factor on b's own carrier (so the dims b is
        # broadcast along are known constant), then it is multiplied in like mul
        inv = Deg(b.shape, b.den_poly(), (Factor(self.fresh(), b.num, tuple(s > 1 for s in b.shape)),),
                  b.heuristic)
        return self._mul([a, inv], at)

    def _exp(self, xs, at):
        (x,) = xs
        if not x.exp_free():
            raise NotLaxError("exp: its argument already contains an exponentiation (exp/silu)")
        return Deg(x.shape, ExpPoly(0, 1.0, x.num.d, x.den_poly().d, True), (), x.heuristic)

    def _silu(self, xs, at):
        (x,) = xs
        if not x.exp_free():
            raise NotLaxError("silu: its argument already contains an exponentiation (exp/silu)")
        # x / (1 + exp(−x)): 1 + ω^k is never 0 (ω has odd order), so no failed draws
        f = Factor(self.fresh(), ExpPoly(0, 2.0, x.num.d, x.den_poly().d, True), tuple(s > 1 for s in x.shape))
        return Deg(x.shape, x.num, x.den + (f,), x.heuristic)

    def _sqrt(self, xs, at):
        (x,) = xs
        self.heuristic = True
        return Deg(x.shape, ExpPoly(1, 1.0, 0, 0, not x.exp_free()), (), True)

    def _max(self, xs, at):
        raise NotLaxError("max: not Lax")

    def _reduce(self, v: Deg, dim: int, n: int | None = None) -> Deg:
        """Sum along ``dim``: shared factors stay, varying ones multiply out."""
        K = v.shape[dim]
        shape = v.shape[:dim] + (1,) + v.shape[dim + 1:]
        const = [f for f in v.den if not f.mask[dim]]
        vary = [f for f in v.den if f.mask[dim]]

        def rekey(f: Factor) -> Factor:
            m = list(f.mask)
            m[dim] = False
            return Factor(_h(f.key, "sum", dim, v.shape), f.poly, tuple(m))

        if not vary:
            return Deg(shape, v.num.times(K), tuple(rekey(f) for f in const), v.heuristic)
        V = v.den_poly(vary)
        num = (v.num * V.power(K - 1)).times(K)
        mask = [any(f.mask[i] for f in vary) and i != dim for i in range(len(shape))]
        merged = Factor(self.fresh(), V.power(K), tuple(mask))
        return Deg(shape, num, tuple(rekey(f) for f in const) + (merged,), v.heuristic)

    def _matmul(self, xs, at):
        a, b = xs
        lead = broadcast_shapes(a.shape[:-2], b.shape[:-2]) if (a.ndim > 2 or b.ndim > 2) else ()
        m, K, n = a.shape[-2], a.shape[-1], b.shape[-1]
        # view both operands on a virtual carrier (*lead, m, K, n) and reduce over K
        carrier = lead + (m, K, n)
        a4 = self._broadcast(self.reshape(a, a.shape + (1,)), carrier)
        b4 = self._broadcast(self.reshape(b, b.shape[:-2] + (1,) + b.shape[-2:]), carrier)
        prod = Deg(carrier, a4.num * b4.num, a4.den + b4.den, a4.heuristic or b4.heuristic)
        r = self._reduce(prod, len(carrier) - 2)
        return self.reshape(r, lead + (m, n))


def pair_bound(fld: Field, outs_a: Sequence[Deg], outs_b: Sequence[Deg], z: float) -> float:
    """The per-test bound for two graphs whose outputs are summarized by
    ``outs_a``/``outs_b`` and whose zero-divisor risks add up to ``z``."""
    eps = 0.0
    for a, b in zip(outs_a, outs_b):
        F = a.num * b.den_poly() + b.num * a.den_poly()
        eps = max(eps, F.zero_prob(fld))
    if z >= 1:
        return 1.0
    return min(1.0, eps / (1 - z))


def tests_needed(per_test: float, error: float) -> int | None:
    """Fewest independent tests with ``per_test ** n ≤ error`` (None if per_test ≥ 1)."""
    if per_test <= 0:
        return 1
    if per_test >= 1:
        return None
    return max(1, math.ceil(math.log(error) / math.log(per_test) - 1e-12))
