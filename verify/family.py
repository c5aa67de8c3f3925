"""The family the verifier draws its primes from: a fresh random pair per test.

With fixed primes, every constant that is a multiple of ``p`` (or an exponent
constant that is a multiple of ``q``, or a rational whose numerator or denominator
shares them) vanishes in the field, so ``X*(p+1)`` and ``X`` look alike on every
test. Drawing the pair at random for each test turns that certain failure into an
event of probability at most (number of family members dividing a given non-zero
integer) / (family size); :mod:`verify.bound` adds that term to the per-test bound.

**The family** (:data:`DEFAULT`): the pairs ``(p, q)`` with ``q`` prime in
``[7·2^27, 2^30)``, ``q ≡ 3 (mod 4)`` and ``p = 2q + 1`` prime. There are
:data:`FAMILY_SIZE` = 199,645 of them, counted by :func:`count_pairs` (a segmented
sieve; a test recounts them). Every member keeps the arithmetic of
:mod:`verify.field` exact: ``p < 2^31``, so a product of two residues fits int64 and
the float64 GEMMs split into limbs as before. The range is the top eighth of the
31-bit (p) and 30-bit (q) numbers: a uniform residue is drawn from raw random bits
by rejection (:func:`verify.field.uniform_residues`), which throws away at most
1/8 of the words there (twice [3·2^28, 2^30)'s 401,802 pairs would throw away up to
a quarter and slow the search's small tests by a tenth), and ``p ≥ 2^30.8``,
``q ≥ 2^29.8`` keep the Schwartz–Zippel terms ``d/p``, ``e/q`` small. ``p ≡ 7 (mod 8)`` and
``q ≡ 3 (mod 4)``, so ``sqrt(x) = x^((m+1)/4)`` is a multiplicative map on both
fields and ``χ(−1) = −1`` (a negative constant is a non-square, like a negative
real).

**A draw** (:meth:`PrimeFamily.draw`) is rejection sampling: a candidate ``q`` is
drawn uniformly from the residue classes mod 120120 that can hold a member (a
wheel: ``q`` and ``2q + 1`` prime to 3…13, and the class conditions below), tested
with Miller–Rabin (deterministic below 2^32), and kept only if ``p`` and ``q`` divide
none of the integers in ``avoid`` (the numerators and denominators of the
programs' constants: "a constant ≡ 0 mod a drawn prime forces a redraw") and every
prime in ``squares`` is a quadratic residue mod both (so that a positive constant
``c`` has ``sqrt(c²) = c`` in the field: see :mod:`verify.equivalence`). The kept
pair is uniform over the members that meet these conditions; it is a function of
the generator's state only, so a seeded run is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import numpy as np

from mugraph.core.errors import MugraphError

from . import args
from .field import Field, FieldError, is_prime

Q_LO = 7 << 27
Q_HI = 1 << 30
#: members of the default family, ``count_pairs(Q_LO, Q_HI)`` (checked in the tests)
FAMILY_SIZE = 199_645

#: the wheel: candidates ``q`` are drawn from residue classes mod this number
_WHEEL_PRIMES = (3, 5, 7, 11, 13)
WHEEL = 8 * math.prod(_WHEEL_PRIMES)
#: square conditions for primes beyond the wheel cost a factor ~4 each in candidates (those
#: of the wheel's primes cost nothing): at most this many (``make_plan`` leaves the rest out
#: and says so)
MAX_EXTRA_SQUARES = 3
#: the primes whose square conditions the wheel carries
WHEEL_SQUARES = frozenset((2,) + _WHEEL_PRIMES)
#: candidates drawn per call of the generator (one numpy call, not one per candidate)
_BATCH = 64
#: a draw that finds nothing in this many candidates reports that the conditions exclude
#: (almost) every member (a draw needs ~17 candidates, ~1100 with three extra squares)
_MAX_CANDIDATES = 1 << 18


def _legendre_small(a: int, ell: int) -> int:
    """The Legendre symbol ``(a / ell)`` for a small odd prime ``ell`` (0, 1 or −1)."""
    a %= ell
    if a == 0:
        return 0
    return 1 if pow(a, (ell - 1) // 2, ell) == 1 else -1


@lru_cache(maxsize=64)
def _wheel(squares: frozenset[int]) -> np.ndarray:
    """Residues ``r`` mod :data:`WHEEL` that a member's ``q`` may have.

    ``q ≡ 3 (mod 4)`` (``q ≡ 7 (mod 8)`` when 2 must be a square mod q: the second
    supplement law; mod p it always is, ``p ≡ 7 mod 8``); ``q`` and ``2q + 1`` not
    divisible by 3…13; and for each odd ``ℓ`` of the wheel in ``squares``,
    ``(ℓ/q) = (ℓ/p) = 1``. By quadratic reciprocity, for ``m ≡ 3 (mod 4)``,
    ``(ℓ/m) = (m/ℓ)·(−1)^((ℓ−1)/2)``: a condition on ``q mod ℓ``."""
    r = np.arange(WHEEL, dtype=np.int64)
    ok = (r % 8 == 7) if 2 in squares else (r % 4 == 3)
    for ell in _WHEEL_PRIMES:
        ok &= (r % ell != 0) & ((2 * r + 1) % ell != 0)
        if ell in squares:
            sign = -1 if ell % 4 == 3 else 1
            good = np.array([_legendre_small(a, ell) * sign == 1 and _legendre_small(2 * a + 1, ell) * sign == 1
                             for a in range(ell)])
            ok &= good[r % ell]
    return r[ok]


@dataclass(frozen=True)
class PrimeFamily:
    """Random safe-prime pairs ``p = 2q + 1`` with ``q`` prime in ``[q_lo, q_hi)``,
    ``q ≡ 3 (mod 4)``; ``size`` members (module docstring)."""

    q_lo: int
    q_hi: int
    size: int
    name: str = field(default="custom family", compare=False)

    def __post_init__(self) -> None:
        for k in ("q_lo", "q_hi", "size"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise FieldError(f"PrimeFamily: {k} must be a positive int, got {v!r}")
        if not 17 <= self.q_lo < self.q_hi or 2 * (self.q_hi - 1) + 1 >= 2 ** 31:
            raise FieldError(f"PrimeFamily: need 17 <= q_lo < q_hi <= 2**30 (the wheel's primes are below 17; "
                             f"p = 2q+1 < 2**31 keeps the arithmetic exact in int64), "
                             f"got [{self.q_lo}, {self.q_hi})")

    @property
    def p_min(self) -> int:
        """A lower bound on every member's p."""
        return 2 * self.q_lo + 1

    @property
    def q_min(self) -> int:
        return self.q_lo

    def __str__(self) -> str:
        return (f"random pair per test: q prime in [{self.q_lo}, {self.q_hi}), q ≡ 3 mod 4, "
                f"p = 2q+1 prime ({self.size} pairs)")

    def draw(self, rng: np.random.Generator, *, avoid: Iterable[int] = (), squares: Iterable[int] = ()) -> Field:
        """A uniformly random member such that neither prime divides any integer in
        ``avoid`` and every prime in ``squares`` is a square mod both (module docstring).

        Raises :class:`~verify.field.FieldError` when no member is found in
        ``2^22`` candidates (the conditions exclude nearly every member)."""
        args.generator("PrimeFamily.draw", rng)
        avoid = sorted({abs(a) for a in args.int_list("PrimeFamily.draw", "avoid", avoid, None)} - {0, 1})
        squares = set(args.int_list("PrimeFamily.draw", "squares", squares, 2))
        wheel_sq = frozenset(squares & WHEEL_SQUARES)
        extra = sorted(squares - WHEEL_SQUARES)
        if len(extra) > MAX_EXTRA_SQUARES:
            raise FieldError(f"too many square conditions beyond {sorted(WHEEL_SQUARES)}: {extra}; at most "
                             f"{MAX_EXTRA_SQUARES}")
        res = _wheel(wheel_sq)
        t_lo, t_hi = self.q_lo // WHEEL, -(-self.q_hi // WHEEL)
        span = (t_hi - t_lo) * len(res)  # candidates t·WHEEL + r, each equally likely
        tried = 0
        while tried < _MAX_CANDIDATES:
            t, r = np.divmod(rng.integers(0, span, _BATCH), len(res))
            qs = (t + t_lo) * WHEEL + res[r]
            tried += _BATCH
            for q in qs.tolist():  # in draw order: the first member wins
                p = 2 * q + 1
                # a base-2 Fermat test on both first (one pow each: most candidates fail it),
                # then the deterministic Miller–Rabin on the survivors
                if not (self.q_lo <= q < self.q_hi and pow(2, q - 1, q) == 1 and pow(2, p - 1, p) == 1
                        and is_prime(q) and is_prime(p)):
                    continue
                if any(a % p == 0 or a % q == 0 for a in avoid):
                    continue
                if any(pow(s, (p - 1) // 2, p) != 1 or pow(s, (q - 1) // 2, q) != 1 for s in extra):
                    continue
                return Field._proven(p, q, "drawn")
        raise FieldError(f"no prime pair of the family meets the conditions (avoid {len(avoid)} integers, "
                         f"squares {sorted(squares)}) in {tried} candidates")

    def square_fraction(self, squares: Iterable[int]) -> float:
        """The expected fraction of members for which every prime in ``squares`` is a
        square mod p and mod q (1/2 per condition, by Chebotarev's density theorem —
        a heuristic for a finite range, used only where sqrt makes the bound heuristic)."""
        squares = set(squares)
        n = sum(2 for s in squares if s != 2) + (1 if 2 in squares else 0)  # 2 is a square mod p always
        return 2.0 ** -n


DEFAULT = PrimeFamily(Q_LO, Q_HI, FAMILY_SIZE, "default")
"""The verifier's primes: a fresh random member of this family for every test."""


# ----------------------------------------------------------------------------- counting


def _odd_primes_below(n: int) -> np.ndarray:
    s = np.ones(n + 1, dtype=bool)
    s[:2] = False
    for i in range(2, math.isqrt(n) + 1):
        if s[i]:
            s[i * i::i] = False
    return np.flatnonzero(s)[1:]


def _odd_sieve(lo: int, n: int, small: np.ndarray) -> np.ndarray:
    """Primality of the ``n`` odd numbers ``lo, lo + 2, …`` (``lo`` odd, above every
    prime in ``small``, and ``small`` holding every odd prime up to the root of the last)."""
    out = np.ones(n, dtype=bool)
    hi = lo + 2 * n
    for ell in small.tolist():
        if ell * ell >= hi:
            break
        m = max(ell * ell, -(-lo // ell) * ell)
        if m % 2 == 0:
            m += ell
        out[(m - lo) // 2::ell] = False
    return out


def count_pairs(q_lo: int, q_hi: int, *, segment: int = 1 << 21) -> int:
    """How many ``q`` in ``[q_lo, q_hi)`` are prime, ``≡ 3 (mod 4)``, with ``2q + 1``
    prime: a segmented sieve of Eratosthenes over ``q`` and over ``2q + 1``.

    ``count_pairs(Q_LO, Q_HI)`` is :data:`FAMILY_SIZE` (a few seconds)."""
    if not 50_000 < q_lo < q_hi:
        raise MugraphError(f"count_pairs: need 50000 < q_lo < q_hi, got [{q_lo}, {q_hi})")
    small = _odd_primes_below(math.isqrt(2 * q_hi + 1) + 1)
    total = 0
    a = q_lo | 1
    while a < q_hi:
        n = min(segment, (q_hi - a + 1) // 2)  # the odd q = a, a+2, …
        q_ok = _odd_sieve(a, n, small)
        p_ok = _odd_sieve(2 * a + 1, 2 * n, small)[::2]  # 2q+1 = 2a+1, 2a+5, …: every other odd number
        q = a + 2 * np.arange(n, dtype=np.int64)
        total += int((q_ok & p_ok & (q % 4 == 3)).sum())
        a += 2 * n
    return total
