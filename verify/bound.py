r"""The per-test error bound: how likely one field test accepts a non-equivalent pair.

**Shape of the functions.** Every output element of a Lax graph is a real function
``N/D`` where ``N`` and ``D`` are *exponential polynomials*
``Σ_{i≤k} c_i(x) · exp(g_i(x)/h_i(x))`` with polynomial ``c_i, g_i, h_i`` (Mirage
eq. 2; at most one exp on a path keeps the exponents free of exps). Clearing the
denominators of the rational constants, all of ``c_i, g_i, h_i`` have *integer*
coefficients. For two graphs ``a = Na/Da`` and ``b = Nb/Db`` the test compares
``a`` and ``b`` in the field, i.e. checks ``F = Na·Db − Nb·Da = 0`` at the drawn
point, and ``F`` is again such an exponential polynomial. In the field, ``x``
outside exponents is ``x_p ∈ Z_p``, inside exponents ``x_q ∈ Z_q`` (independent),
and ``exp(e) = ω^e`` for a random element ``ω`` of order ``q``.

**Random primes.** Each test draws a fresh pair ``(p, q)`` uniformly from a
family of ``N`` pairs (:mod:`verify.family`) with every ``p ≥ p_min`` and
``q ≥ q_min``; pairs for which ``p`` or ``q`` divides a numerator or denominator of
a constant of either graph are excluded (redrawn), leaving ``N' ≥ N − X`` where
``X`` counts, over those integers ``c``, the primes ``≥ q_min`` that can divide
them: at most ``⌊log2|c| / log2 q_min⌋`` each. A non-zero integer ``C`` with
``|C| ≤ 2^h`` has at most ``⌊h / log2 m⌋`` prime factors ``≥ m`` (their product
would exceed ``|C|``), so

    Pr[the drawn p divides C] ≤ bad_p(h) = ⌊h / log2 p_min⌋ / N'

(and ``bad_q`` likewise). With a fixed pair (Mirage's test) ``N' = 1``: the term is
0 while ``h < log2 p`` and 1 (no bound) from there on — ``X·(p+1)`` against ``X``
is then indistinguishable, and the verdict says the bound was not reached.
``h`` comes from the analysis below: the log2 of the L1 norm (sum of absolute
values) of the integer coefficients, which bounds every single coefficient, also
after terms with equal exponents are grouped.

**Polynomial part (Schwartz–Zippel).** Without exp, ``F`` is an integer polynomial
of total degree ``d`` and height ``h``; if it is not identically zero, some
coefficient ``C ≠ 0`` has ``|C| ≤ 2^h``; unless ``p | C`` (``bad_p(h)``), ``F mod p``
is a non-zero polynomial and ``Pr[F(x_p) = 0] ≤ d/p``.

**Exponential part.** Group the ``k`` terms of ``F`` by their exponent as a rational
function over Q; a non-zero ``F`` has a group with non-zero coefficient, say term 1.
The test accepts only if one of these events happens:

1. another exponent collides with term 1's mod q: ``g_1h_j − g_jh_1`` is a non-zero
   integer polynomial of degree ``≤ e = deg g + deg h`` and height
   ``≤ h_e = 1 + h_g + h_h``; it vanishes identically mod q with probability
   ``≤ bad_q(h_e)``, else at the draw with probability ``≤ e/q`` (Schwartz–Zippel);
   a union bound over the other terms gives ``(k−1)·(e/q + bad_q(h_e))``. When every
   exponent carries one constant factor ``κ`` (``g_i/h_i = κ·P_i/D_i``, as an
   attention's scale multiplies all its scores) and the pair is drawn avoiding the
   prime factors of every constant (random pairs; not a fixed pair), ``q`` divides
   neither numerator nor denominator of ``κ``, so the collision polynomial vanishes
   mod q only if ``P_1·D_j − P_j·D_1`` does: ``h_e = 1 + h(P) + h(D)`` then, without
   ``κ``'s height (1/√128 as a float64 is a 56-bit dyadic fraction, which made the
   bound of a d = 128 attention 1). Exponents carrying different constants ``κ_1``,
   ``κ_2`` share their rational gcd ``κ`` (gcd of the numerators over lcm of the
   denominators, whose prime factors are still the constants'): ``κ_i·P_i = κ·(m_i·P_i)``
   with integers ``m_i``, whose heights join ``P_i``'s;
2. no collision, but term 1's coefficient vanishes: ``≤ d/p + bad_p(h)``;
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
   *not* proven for our pairs. Under it, ``Pr_ω[P(ω) = 0] ≤ (k−1)/(q−1)``.

**Exponent sets.** ``k`` counts distinct exponents. When ``a``'s numerator and its
one exp-carrying denominator factor draw their exponents from one set ``A`` per element
(an attention: ``N = E@V``, ``D = ΣE``), and ``b``'s from ``B``, both ``Na·Db`` and
``Nb·Da`` have exponents in ``A + B``: ``k ≤ |A|·|B|`` instead of the product of the
summaries' ``k(Na)·k(Db) + k(Nb)·k(Da)`` (:class:`Support`, :func:`compared`).

So one test errs with probability at most::

    ε(F) = d/p + bad_p(h)                                                  (no exp)
    ε(F) = (k−1)·(e/q + bad_q(h_e)) + d/p + bad_p(h) + (k−1)/(q−1)           (with exp; conjecture)

with ``p = p_min``, ``q = q_min``. The constants' term ``bad`` is 0 while every
height stays below ``log2 q_min`` (≈ 29.8 bits for the default family): then no
member can divide a coefficient at all.

**Failed draws.** A draw where some divisor is zero is discarded (never given a
made-up value). Conditioning on "no zero divisor" (probability ``≥ 1 − z``) can
raise the acceptance probability by at most the factor ``1/(1 − z)``, where ``z``
sums, over every division, the number of divisor elements times the bound above
for that divisor (its p-part, and its q-part ``≤ d/q + bad_q(h)`` when it has one).
The per-test bound is ``max_outputs ε(F) / (1 − z_a − z_b)``; tests are independent
(fresh primes, fresh inputs, fresh ω), so ``n`` passing tests leave ``bound^n``. Where
``z`` makes that weak (a union over every divisor element: 131,072 row sums of an
attention over 8,192 keys on 16 heads), the trial counts its failed draws instead of
conditioning on their absence: ``ε`` per test, and :func:`counted_bound` pays for the
draws that met a zero (docs/design.md §4.5, with the proof).

**Degrees and heights.** :class:`DegreeAlgebra` runs the graph through the
interpreter on symbolic summaries (degree ``d``, term count ``k``, exponent degrees,
the heights ``h``, ``h_g``, ``h_h``, the integer constant of the denominator, and
the rest of the denominator as a multiset of *factors*) instead of numbers. Heights
follow ``‖fg‖₁ ≤ ‖f‖₁‖g‖₁`` and ``‖f + g‖₁ ≤ ‖f‖₁ + ‖g‖₁``; a constant ``a/b`` puts
``|a|`` into the numerator and ``b`` into the denominator's constant (sums of
fractions share it through the lcm). Summing ``K`` fractions normally multiplies
their denominators; a factor that provably does not vary along the reduced dim (it
was broadcast along it, as ``s`` in ``(E/s) @ V``) is shared and counted once.
Anything the analysis cannot prove shared is multiplied out, so the summary is
always an upper bound — at worst a loose one. ``sqrt`` is outside the theorem's
class (its field map ``x^((p+1)/4)`` has huge degree): a ``sqrt`` output is
summarized as a fresh variable of degree 1, and the bound is heuristic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Sequence

from mugraph.core.algebra import Algebra
from mugraph.core.errors import NotLaxError
from mugraph.core.ops import broadcast_shapes

from .exponent_sets import Support, reshape_groups


def _log2add(a: float, b: float) -> float:
    """``log2(2^a + 2^b)``."""
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log2(1.0 + 2.0 ** (lo - hi))


def _pow(k: float, n: int) -> float:
    """``k ** n`` for a term count, ``inf`` past the float range (Python's ``**`` raises
    there): a product of K sums of exp terms — a matmul over fractions whose
    denominators hold an exp, as ``silu(X @ W1) @ W2`` — has ``k^K`` terms, and an
    infinite count makes the bound 1 (no guarantee), which the verdict reports."""
    try:
        return k ** n
    except OverflowError:
        return math.inf


def bits(n: int) -> float:
    """``log2 max(1, |n|)``: the height of an integer constant."""
    n = abs(int(n))
    return math.log2(n) if n > 1 else 0.0


@dataclass(frozen=True)
class Primes:
    """How a test's primes are drawn, as far as the bound is concerned: every ``p``
    is ``≥ p_min``, every ``q ≥ q_min``, and the pair is uniform over ``pairs``
    equally likely pairs (1 for a fixed pair)."""

    p_min: int
    q_min: int
    pairs: float
    #: whether every drawn pair avoids the prime factors of every constant's numerator and
    #: denominator (random pairs drawn with ``avoid``; not a fixed pair)
    avoids_constants: bool = False

    def bad(self, height: float, m_min: int) -> float:
        """``Pr[the drawn prime (≥ m_min) divides a given non-zero integer of at most
        2^height]``: ``⌊height / log2 m_min⌋ / pairs``, at most 1."""
        t = math.floor(height * (1 + 1e-12) / math.log2(m_min) + 1e-9)  # rounding may only raise it
        return min(1.0, t / self.pairs) if t else 0.0


def _common_factor(k1: Fraction | None, k2: Fraction | None) -> tuple[Fraction | None, float, float]:
    """``(kappa, bits1, bits2)``: a constant both exponent factors ``k1``, ``k2`` are integer
    multiples of, and the heights of those integers (``k_i = kappa · m_i``, ``bits_i =
    log2 m_i``): their rational gcd ``gcd(numerators) / lcm(denominators)`` (equal factors:
    themselves, 0 and 0), so ``k1·P1/D1`` is ``kappa·(m1·P1)/D1`` — the
    integer ``m1`` moves into ``P1``, whose height grows by ``log2 m1``. Its prime factors
    are the constants' own (a random pair avoids them), as ``k1``'s and ``k2``'s are. A
    search's candidate that scales a matmul's operands (``q/64 · k/64 · 1/8``) where the
    program scales the product (``q·k/8``) keeps a shared factor this way: only
    12 bits of ``m`` count against the collisions, not both constants' whole height.
    None when either is unknown."""
    if k1 is None or k2 is None:
        return None, 0.0, 0.0
    kappa = Fraction(math.gcd(k1.numerator, k2.numerator), math.lcm(k1.denominator, k2.denominator))
    m1, m2 = k1 / kappa, k2 / kappa
    assert m1.denominator == 1 and m2.denominator == 1, (k1, k2, kappa)  # integers by construction
    return kappa, bits(m1.numerator), bits(m2.numerator)


@dataclass(frozen=True)
class ExpPoly:
    """Summary of an exponential polynomial ``Σ_{i≤k} c_i(x)·exp(g_i/h_i)`` with
    integer coefficients.

    ``d``: max degree of the ``c_i``; ``k``: number of terms (1 when exp-free);
    ``eg``/``eh``: max degrees of the exponents' numerators/denominators;
    ``x``: whether any exponent is present; ``h``: log2 of ``Σ‖c_i‖₁`` (the
    coefficients' height); ``hg``/``hh``: max log2 L1 norms of the exponents'
    numerators/denominators.

    ``kappa``: a positive rational every exponent is known to carry as a factor —
    each exponent is ``±kappa · P_i / D_i`` with integer polynomials of heights at most
    ``sg``/``sh`` (None: not known; exponents scaled by different constants keep their
    common factor, :func:`_common_factor`). An
    attention's exponents all carry its scale (1/√128 as a float64 constant is a
    56-bit dyadic fraction); its prime factors are the constants' own, which a random
    pair avoids, so only ``P_1·D_j − P_j·D_1`` can vanish mod q identically
    (:meth:`zero_prob`)."""

    d: int = 0
    k: float = 1.0
    eg: int = 0
    eh: int = 0
    x: bool = False
    h: float = 0.0
    hg: float = 0.0
    hh: float = 0.0
    kappa: Fraction | None = None
    sg: float = 0.0
    sh: float = 0.0
    #: where every exponent comes from (:class:`Support`), None when not known
    support: Support | None = None
    #: degree in the exponent atoms ``u`` (exponent-atom mode, :class:`AtomMode`): an
    #: ``exp`` of an atom is the monomial ``u^m``, a polynomial variable like any other but
    #: drawn from the ``q``-th roots of unity, so it counts ``du/q`` (Schwartz–Zippel)
    du: int = 0

    def __mul__(self, o: "ExpPoly") -> "ExpPoly":
        x = self.x or o.x
        if not o.x:  # exponents add: an exp-free side adds 0
            eg, eh, hg, hh, kappa, sg, sh = self.eg, self.eh, self.hg, self.hh, self.kappa, self.sg, self.sh
        elif not self.x:
            eg, eh, hg, hh, kappa, sg, sh = o.eg, o.eh, o.hg, o.hh, o.kappa, o.sg, o.sh
        else:  # g1/h1 + g2/h2 = (g1h2 + g2h1)/(h1h2); κP1/D1 + κP2/D2 = κ(P1D2 + P2D1)/(D1D2)
            if self.eh == 0 and o.eh == 0:
                eg, eh = max(self.eg, o.eg), 0
            else:
                eg, eh = max(self.eg + o.eh, o.eg + self.eh), self.eh + o.eh
            hg, hh = _log2add(self.hg + o.hh, o.hg + self.hh), self.hh + o.hh
            kappa, b1, b2 = _common_factor(self.kappa, o.kappa)
            sg, sh = _log2add(self.sg + b1 + o.sh, o.sg + b2 + self.sh), self.sh + o.sh
        # exponents add: an exp-free side keeps the other's; two with exps give sums, a known set
        # only where one side is a single term (a rescale: Support.shifted)
        support = _shifted_support(self, o) if self.x and o.x else (self.support if self.x else o.support)
        return ExpPoly(self.d + o.d, self.k * o.k if x else 1.0, eg, eh, x, self.h + o.h, hg, hh, kappa, sg, sh,
                       support, self.du + o.du)

    def __add__(self, o: "ExpPoly") -> "ExpPoly":
        x = self.x or o.x
        if self.x and o.x:
            eg, eh, hg, hh = max(self.eg, o.eg), max(self.eh, o.eh), max(self.hg, o.hg), max(self.hh, o.hh)
            kappa, b1, b2 = _common_factor(self.kappa, o.kappa)
            sg, sh = max(self.sg + b1, o.sg + b2), max(self.sh, o.sh)
        else:
            s = self if self.x else o
            eg, eh, hg, hh, kappa, sg, sh = s.eg, s.eh, s.hg, s.hh, s.kappa, s.sg, s.sh
        # a union of two subsets of one set stays in it; an exp-free side adds the exponent 0
        support = self.support if self.x and o.x and self.support == o.support else None
        return ExpPoly(max(self.d, o.d), self.k + o.k if x else 1.0, eg, eh, x, _log2add(self.h, o.h), hg, hh,
                       kappa, sg, sh, support, max(self.du, o.du))

    def times(self, n: int) -> "ExpPoly":
        """A sum of ``n`` summaries like this one (the same support: a sum along a dim
        passes its own, :meth:`DegreeAlgebra._reduce`)."""
        return ExpPoly(self.d, self.k * n if self.x else 1.0, self.eg, self.eh, self.x, self.h + math.log2(n),
                       self.hg, self.hh, self.kappa, self.sg, self.sh, self.support, self.du)

    def power(self, n: int) -> "ExpPoly":
        """A product of ``n`` summaries like this one (closed form of ``*``)."""
        if n == 0:
            return ExpPoly()
        if self.eh == 0:
            eg, eh = self.eg, 0
        else:
            eg, eh = self.eg + (n - 1) * self.eh, n * self.eh
        hg, hh = (math.log2(n) + self.hg + (n - 1) * self.hh, n * self.hh) if self.x else (self.hg, self.hh)
        sg, sh = (math.log2(n) + self.sg + (n - 1) * self.sh, n * self.sh) if self.x else (self.sg, self.sh)
        return ExpPoly(self.d * n, _pow(self.k, n) if self.x else 1.0, eg, eh, self.x, self.h * n, hg, hh,
                       self.kappa, sg, sh, self.support if n == 1 else None, self.du * n)

    def scaled(self, height: float) -> "ExpPoly":
        """This summary with its coefficients multiplied by an integer of that height."""
        return ExpPoly(self.d, self.k, self.eg, self.eh, self.x, self.h + height, self.hg, self.hh,
                       self.kappa, self.sg, self.sh, self.support, self.du)

    def with_support(self, support: Support | None) -> "ExpPoly":
        return self if support == self.support else replace(self, support=support)

    def zero_prob(self, primes: Primes) -> float:
        """Upper bound on ``Pr[this = 0]`` at a random draw when it is not
        identically zero over Q (module docstring)."""
        if not math.isfinite(self.k):
            return 1.0
        p, q = primes.p_min, primes.q_min
        eps = self.d / p + self.du / q + primes.bad(self.h, p)
        if self.x and self.k > 1:
            he = self.collision_height(primes)
            eps += (self.k - 1) * ((self.eg + self.eh) / q + primes.bad(he, q)) + (self.k - 1) / (q - 1)
        return min(1.0, eps)

    def collision_height(self, primes: Primes) -> float:
        """Height (bits) of the integer polynomials whose vanishing mod q makes two
        exponents collide: ``g_1·h_j − g_j·h_1``, or, when every exponent carries one
        constant ``kappa`` and the drawn pair avoids the constants' prime factors (so q
        divides neither ``kappa``'s numerator nor its denominator), ``P_1·D_j − P_j·D_1``."""
        if self.kappa is not None and primes.avoids_constants:
            return 1 + self.sg + self.sh
        return 1 + self.hg + self.hh


def _shifted_support(a: ExpPoly, b: ExpPoly) -> Support | None:
    """The support of the product of two exp-carrying summaries: known when one of them is
    a single term (``k = 1``) — the other's support shifted by it (:meth:`Support.shifted`;
    the many-term side is the source, the left one when both are single terms)."""
    if a.support is None or b.support is None:
        return None
    if b.k == 1:
        return a.support.shifted(b.support)
    if a.k == 1:
        return b.support.shifted(a.support)
    return None


ONE = ExpPoly()
#: most atoms one exponent may sum (a view of more terms is forgotten: the classic bound applies)
MAX_TERMS = 8


@dataclass(frozen=True)
class Factor:
    """One factor of a denominator: its summary, an identity ``key`` (equal keys =
    equal values at every element: same division, same moves since), and ``mask``
    — the dims of the carrier along which it may vary."""

    key: int
    poly: ExpPoly
    mask: tuple[bool, ...]


@dataclass(frozen=True)
class View:
    """A value each of whose elements is ``coef`` times one *atom* of ``source``, the atom
    ``index`` picks. A source is an input's name (its elements; ``index`` is one
    :class:`Support` over its dims with nothing reduced) or a :class:`Contraction` of two
    inputs (``index`` is one :class:`Support` per input, over its other dims). The supports move
    through reshapes, permutes and broadcasts as the value does; an ``exp`` of such a value
    is an atom's power (:class:`AtomMode`)."""

    source: "str | Contraction"
    coef: Fraction
    index: tuple[Support, ...]

    def moved(self, fn) -> "View | None":
        index = tuple(fn(sp) for sp in self.index)
        return None if any(sp is None for sp in index) else View(self.source, self.coef, index)


@dataclass(frozen=True)
class Contraction:
    """A contraction source (:class:`View`): input ``left``'s dim ``a`` summed against
    input ``right``'s dim ``b``, over their whole length (the inputs in name order: one
    spelling per contraction). ``batch``: pairs ``(dl, dr)`` of a dim of ``left`` and one of
    ``right``, of one length, that a batched matmul walks together — its atoms pair row
    ``i`` of ``left``'s slice ``s`` with column ``j`` of ``right``'s slice ``s`` only, never
    slices of two batch indices (:class:`AtomMode`: what the rank condition is taken over)."""

    left: str
    a: int
    right: str
    b: int
    batch: tuple[tuple[int, int], ...] = ()

    @property
    def inputs(self) -> tuple[str, str]:
        return self.left, self.right


def input_key(name: str) -> int:
    """The source key of input ``name``'s elements: the same in every graph, so that both
    graphs' exponents are read as powers of the same atoms."""
    return _h("input", name)


@dataclass(frozen=True)
class AtomMode:
    r"""Exponent atoms: the argument that needs neither the exponents' collisions nor the
    conjecture (docs/design.md, "exponent atoms").

    When every ``exp`` (and ``silu``) argument of both graphs is a rational constant times
    one *atom* — an input element ``x_v``, or an element ``B_rc = Σ_k P_rk·Q_kc`` of a
    contraction of two inputs over a whole dim (:class:`View`) — let ``κ_S`` be the rational
    gcd of the constants applied to source ``S`` (``kappas``), so each exponent is
    ``m·κ_S·B`` with an integer ``m``. In the field the exponent is evaluated mod q on the
    q-draws: ``exp = u^m`` with ``u = ω^{κ_S·B(x_q)}``. The q-draws are independent and
    uniform on ``Z_q``, ``ω`` generates the order-q subgroup ``μ_q``, and ``κ_S`` is
    invertible mod q (a random pair avoids the constants' prime factors). So the input atoms
    are independent and uniform on ``μ_q``; so are a contraction's, given its *conditioned*
    input's rows (``R`` of them, length ``K``, ``R ≤ K``) are linearly independent mod q —
    probability ``≥ 1 − q^{R−K}/(q−1)`` (``eta``) — as long as its other, *free* input enters
    no other atom (``free``: checked when the mode is made). Both graphs are then rational
    functions of ``(x_p, u)``, and ``F = Na·Db − Nb·Da`` is a polynomial with integer
    coefficients (negative powers of ``u`` are denominator factors that never vanish). If
    the graphs differ as real functions, ``F`` is not the zero polynomial (``u = e^{κ_S B}``
    gives the real difference); unless ``p`` divides its coefficients (``bad_p(h)``),
    Schwartz–Zippel over the product set ``Z_p^n × μ_q^r`` bounds a zero by
    ``d/p + du/q`` (``d``: degree in ``x_p``, ``du``: in ``u``), plus ``eta``. A
    softmax-weighted sum over 32,000 logits has ``du = 2`` where the classic bound's term
    count is about 10^9 (over ``q``: no bound); ``silu(X@W1)@W2`` over 4,096 columns has
    ``du = 4096`` where the classic count is 2^4096."""

    kappas: dict["str | Contraction", Fraction]
    #: the probability that some contraction's conditioned input is rank-deficient mod q
    eta: float = 0.0


@dataclass(frozen=True)
class Deg:
    """Symbolic summary of a tensor value: ``num / (c · Π den)`` with ``c`` a
    positive integer (the constants' denominators). ``num = a·P`` for an integer
    polynomial ``P`` and a positive integer ``a`` (a product of constants' numerators
    and denominators, 1 when none is known): ``num.h − log2 a`` bounds ``P``'s height,
    which is what an exponent's collisions depend on (:meth:`DegreeAlgebra._exp`)."""

    shape: tuple[int, ...]
    num: ExpPoly
    den: tuple[Factor, ...] = ()
    heuristic: bool = False
    c: int = 1
    a: int = 1
    #: every element is a sum of constants times atoms, one :class:`View` per term (a
    #: value ``x − m`` has two); None when not known to be
    view: "tuple[View, ...] | None" = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def den_poly(self, factors: Sequence[Factor] | None = None) -> ExpPoly:
        """The product of ``factors`` (default: the whole denominator, ``c`` included)."""
        out = ONE if factors is not None else ExpPoly(h=bits(self.c))
        for f in (self.den if factors is None else factors):
            out = out * f.poly
        return out

    def exp_free(self) -> bool:
        return not (self.num.x or self.num.du) and not any(f.poly.x or f.poly.du for f in self.den)


def _h(*parts) -> int:
    return hash(parts)


def _exponent(x: "Deg", dp: ExpPoly) -> tuple[Fraction, float, float]:
    """``(kappa, sg, sh)`` of ``exp(x)``'s exponent ``x = a·P / (c·D)``: the constant
    ``a/c`` and the heights of ``P`` (``num.h − log2 a``) and ``D`` (``dp.h − log2 c``)."""
    return Fraction(x.a, x.c), max(0.0, x.num.h - bits(x.a)), max(0.0, dp.h - bits(x.c))


def _moved_terms(terms: tuple[View, ...], fn) -> tuple[View, ...] | None:
    moved = tuple(t.moved(fn) for t in terms)
    return None if any(t is None for t in moved) else moved


def _move(v: Deg, shape, tag, mask_fn, support_fn=lambda s: None) -> Deg:
    """Apply a structural move to every factor (new key, new mask), to every support
    and to the view (``support_fn``; by default a move forgets them)."""
    def moved(poly: ExpPoly) -> ExpPoly:
        return poly.with_support(support_fn(poly.support) if poly.support is not None else None)

    den = tuple(Factor(_h(f.key, tag), moved(f.poly), tuple(mask_fn(f.mask))) for f in v.den)
    view = None if v.view is None else _moved_terms(v.view, support_fn)
    return Deg(tuple(shape), moved(v.num), den, v.heuristic, v.c, v.a, view)


class DegreeAlgebra(Algebra):
    """Evaluates a graph on :class:`Deg` summaries (see the module docstring).

    After ``evaluate``, :attr:`z` bounds the probability that a draw meets a zero
    divisor in this graph, and :attr:`heuristic` says whether a ``sqrt`` made the
    summaries heuristic."""

    name = "degree"
    per_element = False  # a Deg summarizes a whole value: no element limit, no chunks

    def __init__(self, primes: Primes, salt: object = 0, atoms: AtomMode | None = None) -> None:
        self.primes = primes
        self.salt = salt
        self.z = 0.0
        self.heuristic = False
        self._fresh = 0
        self._maxima = 0  # maxima named so far (:meth:`_max`)
        #: exponent-atom mode (:class:`AtomMode`), or None: the classic exponent analysis
        self.atoms = atoms
        #: every exp/silu argument's view (None where it is not one): what decides whether
        #: the graph's exponents are atoms (:func:`atom_kappas`)
        self.exp_args: list[tuple[View | None, int]] = []
        #: the inputs' shapes (a contraction must sum a whole dim)
        self.shapes: dict[str, tuple[int, ...]] = {}

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
        groups = reshape_groups(v.shape, shape)

        def mask_fn(mask):
            out = [False] * len(shape)
            for gi, gj in groups:
                vary = any(mask[i] for i in gi)
                for j in gj:
                    out[j] = vary and shape[j] > 1
            return out
        return _move(v, shape, ("reshape", v.shape, shape), mask_fn, lambda sp: sp.reshape(v.shape, shape))

    def permute(self, v: Deg, perm):
        perm = tuple(perm)
        return _move(v, tuple(v.shape[i] for i in perm), ("perm", v.shape, perm),
                     lambda m: [m[i] for i in perm], lambda sp: sp.permute(perm))

    def expand(self, v: Deg, shape):
        shape = tuple(shape)
        if shape == v.shape:
            return v
        return self._broadcast(v, shape)

    def window(self, v: Deg, at: dict) -> Deg:
        """A slice: the same summary on fewer elements (a selection raises no degree and
        no height); a denominator factor keeps varying along the dims it did, unless the
        window leaves one element there."""
        dim = at["dim"]
        shape = list(v.shape)
        shape[dim] = len(range(at["start"], at["end"], at["step"]))
        shape = tuple(shape)
        tag = ("slice", v.shape, dim, at["start"], at["end"], at["step"])
        return _move(v, shape, tag, lambda m: [m[i] and shape[i] > 1 for i in range(len(shape))])

    def _broadcast(self, v: Deg, shape) -> Deg:
        shape = tuple(shape)
        if shape == v.shape:
            return v
        pad = len(shape) - len(v.shape)
        old = (1,) * pad + v.shape

        def mask_fn(m):
            m = [False] * pad + list(m)
            return [m[i] and old[i] == shape[i] for i in range(len(shape))]
        return _move(v, shape, ("bcast", v.shape, shape), mask_fn, lambda sp: sp.broadcast(v.shape, shape))

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
        dens = [v.den_poly() for v in vs]  # constants included: the result's constant is their product
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
                den.append(Factor(_h(f.key, "concat", i, axis, shape), f.poly.with_support(None), tuple(mask)))
        return Deg(shape, num.with_support(None), tuple(den), any(v.heuristic for v in vs),
                   math.prod(v.c for v in vs))

    # ------------------------------------------------------------------ semantics
    def input(self, name, value, shape, dtype):
        shape = tuple(shape)
        self.shapes[name] = shape
        return Deg(shape, ExpPoly(d=1), view=(View(name, Fraction(1), (Support.source(input_key(name), shape),)),))

    def output(self, v, as_torch):
        return v

    def accumulate(self, v, axis):
        return self._reduce(v, axis)

    def _pair(self, a: Deg, b: Deg) -> tuple[Deg, Deg]:
        shape = broadcast_shapes(a.shape, b.shape)
        return self._broadcast(a, shape), self._broadcast(b, shape)

    def _addsub(self, xs, at, sign: int = 1):
        a, b = self._pair(*xs)
        view = None
        if a.view is not None and b.view is not None and len(a.view) + len(b.view) <= MAX_TERMS:
            view = a.view + tuple(View(t.source, sign * t.coef, t.index) for t in b.view)
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
        c = math.lcm(a.c, b.c)  # a/(ca·…) + b/(cb·…) over the common constant lcm(ca, cb)
        num = a.num.scaled(bits(c // a.c)) * a.den_poly(only_b) + b.num.scaled(bits(c // b.c)) * a.den_poly(only_a)
        common = math.gcd(a.a * (c // a.c), b.a * (c // b.c))  # a factor of both terms
        return Deg(a.shape, num, tuple(shared + only_a + only_b), a.heuristic or b.heuristic, c, common, view)

    def _mul(self, xs, at):
        a, b = self._pair(*xs)
        return Deg(a.shape, a.num * b.num, a.den + b.den, a.heuristic or b.heuristic, a.c * b.c, a.a * b.a)

    def _scale(self, xs, at):
        (x,) = xs
        c = Fraction(at["c"])
        view = None if x.view is None or not c else tuple(View(t.source, t.coef * c, t.index) for t in x.view)
        return Deg(x.shape, x.num.scaled(bits(c.numerator)), x.den, x.heuristic, x.c * c.denominator,
                   x.a * abs(c.numerator) if c.numerator else x.a, view)

    def _const(self, xs, at):
        v = Fraction(at["value"])
        return Deg(tuple(at["shape"]), ExpPoly(h=bits(v.numerator)), (), False, v.denominator,
                   abs(v.numerator) if v.numerator else 1)

    def _divisor_risk(self, b: Deg) -> None:
        n = math.prod(b.shape)
        risk = b.num.zero_prob(self.primes)
        if b.exp_free():  # the q-part is divided too
            risk += b.num.d / self.primes.q_min + self.primes.bad(b.num.h, self.primes.q_min)
        self.z += n * risk

    def _div(self, xs, at):
        a, b = xs
        self._divisor_risk(b)
        # 1/b = (cb·Db)/Nb: Nb becomes a new factor on b's own carrier (so the dims b is
        # broadcast along are known constant), then it is multiplied in like mul
        inv = Deg(b.shape, b.den_poly(), (Factor(self.fresh(), b.num, tuple(s > 1 for s in b.shape)),),
                  b.heuristic, 1, b.c)
        return self._mul([a, inv], at)

    def _power_of_atoms(self, x: Deg, sign: int) -> tuple[ExpPoly, ExpPoly]:
        """``exp(sign·x) = P/Q`` in exponent-atom mode, ``x = Σ_t c_t·B_t``: the monomials
        ``P = Π u_t^{m_t}`` over the terms with ``m_t = sign·c_t/κ_t > 0`` and ``Q`` over the
        others (``|m_t|``), as summaries of their degrees in the atoms; each ``m_t`` is an
        integer by the choice of ``κ``."""
        pos = neg = 0
        for t in x.view:
            m = sign * t.coef / self.atoms.kappas[t.source]
            assert m.denominator == 1 and m != 0, (t, self.atoms)  # κ divides every coefficient
            pos, neg = (pos + m.numerator, neg) if m > 0 else (pos, neg - m.numerator)
        return ExpPoly(du=pos), ExpPoly(du=neg)

    def _exp(self, xs, at):
        (x,) = xs
        if not x.exp_free():
            raise NotLaxError("exp: its argument already contains an exponentiation (exp/silu)")
        self.exp_args.append((x.view, 1))
        if self.atoms is not None:  # P/Q: Q is a factor that never vanishes (a product of roots of unity)
            pos, neg = self._power_of_atoms(x, 1)
            den = (Factor(self.fresh(), neg, tuple(s > 1 for s in x.shape)),) if neg.du else ()
            return Deg(x.shape, pos, den, x.heuristic)
        dp = x.den_poly()
        return Deg(x.shape, ExpPoly(0, 1.0, x.num.d, dp.d, True, 0.0, x.num.h, dp.h, *_exponent(x, dp),
                                    Support.source(self.fresh(), x.shape)), (), x.heuristic)

    def _silu(self, xs, at):
        (x,) = xs
        if not x.exp_free():
            raise NotLaxError("silu: its argument already contains an exponentiation (exp/silu)")
        # x / (1 + exp(−x)): 1 + ω^k is never 0 (ω has odd order), so no failed draws
        self.exp_args.append((x.view, -1))
        if self.atoms is not None:  # exp(−x) = P/Q: silu(x) = x·Q/(Q + P), and Q + P ≠ 0 (P/Q ≠ −1 in μ_q)
            pos, neg = self._power_of_atoms(x, -1)
            mask = tuple(s > 1 for s in x.shape)
            f = Factor(self.fresh(), ExpPoly(h=1.0, du=max(pos.du, neg.du)), mask)
            return Deg(x.shape, x.num * neg, x.den + (f,), x.heuristic, x.c)
        dp = x.den_poly()
        f = Factor(self.fresh(), ExpPoly(0, 2.0, x.num.d, dp.d, True, 1.0, x.num.h, dp.h, *_exponent(x, dp)),
                   tuple(s > 1 for s in x.shape))
        return Deg(x.shape, x.num, x.den + (f,), x.heuristic, x.c)

    def _sqrt(self, xs, at):
        (x,) = xs
        self.heuristic = True
        return Deg(x.shape, ExpPoly(1, 1.0, 0, 0, not x.exp_free()), (), True)

    def _max(self, xs, at):
        """A max is a *free shift* (docs/design.md §3.3): the field test evaluates it as a
        fresh uniform value per element, so here it is a fresh input of degree 1 — and an
        atom source of its own, its elements independent and uniform."""
        (x,) = xs
        shape = tuple(1 if i == at["dim"] else s for i, s in enumerate(x.shape))
        # named by its own count, not :meth:`fresh`: both passes of the atom mode (which
        # draw fresh factors differently) must name each max alike
        self._maxima += 1
        name = f"max#{self.salt}#{self._maxima}"
        self.shapes[name] = shape
        return Deg(shape, ExpPoly(d=1), view=(View(name, Fraction(1), (Support.source(input_key(name), shape),)),),
                   heuristic=x.heuristic)

    def _reduce(self, v: Deg, dim: int, n: int | None = None) -> Deg:
        """Sum along ``dim``: shared factors stay, varying ones multiply out."""
        K = v.shape[dim]
        shape = v.shape[:dim] + (1,) + v.shape[dim + 1:]
        const = [f for f in v.den if not f.mask[dim]]
        vary = [f for f in v.den if f.mask[dim]]

        def reduced(poly: ExpPoly) -> ExpPoly:  # the sum's support: the dim's components join the set
            return poly.with_support(poly.support.reduce(dim) if poly.support is not None else None)

        def rekey(f: Factor) -> Factor:  # a factor constant along dim: the same set at every position
            m = list(f.mask)
            m[dim] = False
            sp = f.poly.support
            keep = sp.reduce(dim) if sp is not None and sp.constant_along(dim) else None
            return Factor(_h(f.key, "sum", dim, v.shape), f.poly.with_support(keep), tuple(m))

        if not vary:
            return Deg(shape, reduced(v.num.times(K)), tuple(rekey(f) for f in const), v.heuristic, v.c, v.a)
        V = v.den_poly(vary)
        num = reduced((v.num * V.power(K - 1)).times(K))
        mask = [any(f.mask[i] for f in vary) and i != dim for i in range(len(shape))]
        merged = Factor(self.fresh(), V.power(K), tuple(mask))
        return Deg(shape, num, tuple(rekey(f) for f in const) + (merged,), v.heuristic, v.c, v.a)

    def _matmul(self, xs, at):
        a, b = xs
        lead = broadcast_shapes(a.shape[:-2], b.shape[:-2]) if (a.ndim > 2 or b.ndim > 2) else ()
        m, K, n = a.shape[-2], a.shape[-1], b.shape[-1]
        # view both operands on a virtual carrier (*lead, m, K, n) and reduce over K
        carrier = lead + (m, K, n)
        a4 = self._broadcast(self.reshape(a, a.shape + (1,)), carrier)
        b4 = self._broadcast(self.reshape(b, b.shape[:-2] + (1,) + b.shape[-2:]), carrier)
        prod = Deg(carrier, a4.num * b4.num, a4.den + b4.den, a4.heuristic or b4.heuristic, a4.c * b4.c, a4.a * b4.a)
        r = self._reduce(prod, len(carrier) - 2)
        return replace(self.reshape(r, lead + (m, n)), view=self._contraction(a, b, lead + (m, n)))

    def _contraction(self, a: Deg, b: Deg, shape: tuple[int, ...]) -> View | None:
        """The view of ``a @ b`` when it is a contraction atom (:class:`View`): ``a`` and
        ``b`` views of two different inputs whose summed dims are each one whole dim of
        its input. Its index: ``a``'s support without the summed dim (and a broadcast one
        for the columns), ``b``'s likewise for the rows, both broadcast to ``shape``."""
        if a.view is None or b.view is None or len(a.view) != 1 or len(b.view) != 1:
            return None
        (va,), (vb,) = a.view, b.view
        if len(va.index) != 1 or len(vb.index) != 1 or va.source == vb.source:
            return None
        (sa,), (sb,) = va.index, vb.index
        ia, ib = sa.dims[-1], sb.dims[-2]
        if len(ia) != 1 or len(ib) != 1:
            return None
        (pa, na, ta), (qb, nb, tb) = ia[0], ib[0]
        if (pa < 0 or qb < 0 or ta != 1 or tb != 1 or na != self.shapes[va.source][pa]
                or nb != self.shapes[vb.source][qb]):
            return None
        left = Support(sa.key, sa.dims[:-1] + ((),)).broadcast(a.shape[:-1] + (1,), shape)
        right = Support(sb.key, sb.dims[:-2] + ((),) + sb.dims[-1:]).broadcast(b.shape[:-2] + (1, b.shape[-1]), shape)
        batch = self._batch_pairs(left, right, va.source, vb.source, len(shape) - 2)
        c = Contraction(va.source, pa, vb.source, qb, batch)
        if vb.source < va.source:  # one spelling per contraction: the inputs in name order
            c = Contraction(vb.source, qb, va.source, pa, tuple((dr, dl) for dl, dr in batch))
            left, right = right, left
        return (View(c, va.coef * vb.coef, (left, right)),)

    def _batch_pairs(self, left: Support, right: Support, a: str, b: str, lead: int) -> tuple[tuple[int, int], ...]:
        """The dims of inputs ``a`` and ``b`` a batched matmul walks together: at each of the
        product's ``lead`` (batch) dims, the index of one whole dim of ``a`` on the left and
        of one whole dim of ``b`` on the right, of one length. A batch dim indexed in any
        other way is left out: the contraction then counts as pairing every slice with
        every other, a superset of its atoms (sound, only looser)."""
        pairs = []
        for i in range(lead):
            la, rb = left.dims[i], right.dims[i]
            if len(la) != 1 or len(rb) != 1:
                continue
            (dl, nl, tl), (dr, nr, tr) = la[0], rb[0]
            if (dl >= 0 and dr >= 0 and tl == 1 and tr == 1 and nl == nr
                    and nl == self.shapes[a][dl] and nr == self.shapes[b][dr]):
                pairs.append((dl, dr))
        return tuple(pairs)



#: degree bound: op name -> row(algebra, input summaries, attrs) (ops outside the theorem's class raise)
DEGREE_OPS = {
    "matmul": DegreeAlgebra._matmul, "add": DegreeAlgebra._addsub,
    "sub": lambda alg, xs, at: alg._addsub(xs, at, -1),
    "mul": DegreeAlgebra._mul, "div": DegreeAlgebra._div, "exp": DegreeAlgebra._exp, "silu": DegreeAlgebra._silu,
    "sqrt": DegreeAlgebra._sqrt,
    "square": lambda alg, xs, at: alg._mul([xs[0], xs[0]], at),
    "scale": DegreeAlgebra._scale,
    "const": DegreeAlgebra._const,
    "sum": lambda alg, xs, at: alg._reduce(xs[0], at["dim"]),
    "max": DegreeAlgebra._max,
    "concat": lambda alg, xs, at: alg.concat(xs, at["dim"]),
    "reshape": lambda alg, xs, at: alg.reshape(xs[0], at["shape"]),
    "repeat": lambda alg, xs, at: alg.tile(xs[0], at["reps"]),
    "permute": lambda alg, xs, at: alg.permute(xs[0], at["perm"]),
    "slice": lambda alg, xs, at: alg.window(xs[0], at),
}
DegreeAlgebra.ops = DEGREE_OPS

def atom_kappas(args: Sequence[tuple[View | None, int]], primes: Primes,
                shapes: dict[str, tuple[int, ...]]) -> AtomMode | None:
    """The :class:`AtomMode` of graphs whose exp/silu arguments are ``args`` (every
    argument's view, collected by a classic :class:`DegreeAlgebra` pass over both graphs;
    ``shapes``: the inputs'), or None when the argument does not apply: some argument is
    not a constant times an atom; the primes do not avoid the constants (a fixed pair: ``κ``
    might vanish mod q); or some contraction has no side to condition on (more rows than
    the summed length on both sides) whose other input enters no other atom."""
    if not args or any(v is None for v, _ in args):
        return None
    kappas: dict[str | Contraction, Fraction] = {}
    for terms, _ in args:
        for v in terms:
            c = abs(v.coef)
            k = kappas.get(v.source)
            kappas[v.source] = c if k is None else Fraction(math.gcd(k.numerator, c.numerator),
                                                            math.lcm(k.denominator, c.denominator))
    if not primes.avoids_constants and any(k != 1 for k in kappas.values()):
        return None
    contractions = [c for c in kappas if isinstance(c, Contraction)]
    uses: dict[str, int] = {}  # how many sources each input enters
    for src in kappas:
        for name in (src.inputs if isinstance(src, Contraction) else (src,)):
            uses[name] = uses.get(name, 0) + 1
    eta, free, conditioned = 0.0, set(), set()
    for c in contractions:
        K = shapes[c.left][c.a]
        # a batched contraction pairs each slice of one input with the same slice of the
        # other only: its atoms are uniform once each slice's conditioned rows are independent
        slices = math.prod(shapes[c.left][dl] for dl, _ in c.batch)
        rows = {c.left: math.prod(shapes[c.left]) // K // slices, c.right: math.prod(shapes[c.right]) // K // slices}
        for cond, fr in ((c.left, c.right), (c.right, c.left)):
            if rows[cond] <= K and uses[fr] == 1 and fr not in conditioned:
                break
        else:
            return None
        free.add(fr)
        conditioned.add(cond)
        # R uniform vectors of Z_q^K are dependent with probability ≤ Σ_{i<R} q^i/q^K ≤ q^(R−K)/(q−1),
        # for each of the slices
        eta += slices * primes.q_min ** (rows[cond] - K) / (primes.q_min - 1)
    if free & conditioned:
        return None
    return AtomMode(kappas, eta)


def _exponent_set(v: Deg) -> Support | None:
    """A support holding every exponent of both ``v``'s numerator and its whole
    denominator: the numerator's, when exactly one denominator factor has exps and
    its support is the same (a softmax-weighted sum ``(E@V) / ΣE``)."""
    with_exp = [f for f in v.den if f.poly.x]
    if not v.num.x or v.num.support is None or len(with_exp) != 1 or with_exp[0].poly.support != v.num.support:
        return None
    return v.num.support


def compared(a: Deg, b: Deg) -> ExpPoly:
    """The summary of ``F = Na·Db − Nb·Da``, whose zeros are the test's false accepts.
    When ``a``'s numerator and denominator draw their exponents from one set ``A``
    and ``b``'s from one set ``B`` (:func:`_exponent_set`), both products have
    exponents in ``A + B``: at most ``|A|·|B|`` distinct ones, where the product of
    the summaries counts ``k(Na)·k(Db) + k(Nb)·k(Da)``."""
    F = a.num * b.den_poly() + b.num * a.den_poly()
    sa, sb = _exponent_set(a), _exponent_set(b)
    if F.x and sa is not None and sb is not None:
        F = replace(F, k=min(F.k, float(sa.size) * float(sb.size)))
    return F


def pair_bound(primes: Primes, outs_a: Sequence[Deg], outs_b: Sequence[Deg], z: float) -> float:
    """The per-test bound for two graphs whose outputs are summarized by
    ``outs_a``/``outs_b`` and whose zero-divisor risks add up to ``z``."""
    eps = 0.0
    for a, b in zip(outs_a, outs_b):
        eps = max(eps, compared(a, b).zero_prob(primes))
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


def counted_bound(per_test: float, tests: int, voids: int) -> float:
    """The false-accept bound of a trial that counts its void draws (draws on which a
    divisor was zero, docs/design.md §4.5) instead of conditioning on their absence:
    ``C(tests + voids, voids) · per_test^tests · 2^(voids + 1)``, at most 1. ``per_test``
    is the unconditioned bound (no ``1/(1 − z)``). The trial that ends with ``voids`` void
    draws and ``tests`` passing ones is one of at most ``C(tests + voids, voids)`` orders of
    them, each accepted with probability at most ``per_test^tests``; the factor
    ``2^(voids + 1)`` spends the target error ``error·2^−(v+1)`` on the trials ending with
    ``v`` voids, so that the sum over every ``v`` stays within ``error``."""
    if per_test <= 0:
        return 0.0
    if per_test >= 1:
        return 1.0
    log2 = (math.lgamma(tests + voids + 1) - math.lgamma(tests + 1) - math.lgamma(voids + 1)) / math.log(2)
    log2 += tests * math.log2(per_test) + voids + 1
    return 1.0 if log2 >= 0 else 2.0 ** log2


def tests_needed_counting_voids(per_test: float, error: float, voids: int, limit: int = 1 << 16) -> int | None:
    """Fewest passing tests ``n`` with ``counted_bound(per_test, n, voids) ≤ error`` (None if
    ``per_test ≥ 1`` or more than ``limit`` would be needed)."""
    if per_test <= 0:
        return 1
    if per_test >= 1:
        return None
    # the bound without the orders, per_test^n·2^(v+1) ≤ error, needs at least this many
    start = max(1, math.ceil((math.log(error) - (voids + 1) * math.log(2)) / math.log(per_test) - 1e-12))
    for n in range(start, limit + 1):
        if counted_bound(per_test, n, voids) <= error:
            return n
    return None


def constants_report(primes: Primes, outs_a: Sequence[Deg], outs_b: Sequence[Deg]) -> tuple[float, float]:
    """``(bits, term)``: the largest coefficient height (bits) of the compared
    functions ``F`` — their coefficients, and their exponents' collision polynomials
    — and the largest part of the per-test bound that comes from a drawn prime
    dividing one of them (the ``bad_p``/``bad_q`` terms of the module docstring)."""
    worst_bits, worst_term = 0.0, 0.0
    for a, b in zip(outs_a, outs_b):
        F = compared(a, b)
        term = primes.bad(F.h, primes.p_min)
        hb = F.h
        if F.x and F.k > 1:
            he = F.collision_height(primes)
            hb = max(hb, he)
            term += (F.k - 1) * primes.bad(he, primes.q_min) if math.isfinite(F.k) else 1.0
        worst_bits, worst_term = max(worst_bits, hb), max(worst_term, min(1.0, term))
    return worst_bits, worst_term
