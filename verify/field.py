"""Exact modular arithmetic for the finite-field equivalence test (DESIGN §4).

Every tensor element is a pair ``(x_p, x_q)``: its value mod ``p`` (used outside
exponents) and mod ``q`` (used inside them), with ``q | p - 1`` so that ``Z_p*``
has a subgroup of order ``q``; ``ω`` is a random generator of it, and
``exp(x) = ω^(x_q) mod p`` turns ``(Z_q, +)`` into ``(Z_p*, ×)`` — so
``exp(a + b) = exp(a)·exp(b)`` holds exactly.

Values are numpy ``int64`` arrays of canonical residues in ``[0, m)``. A value is
a tuple ``(x_p, x_q)``, or ``(x_p,)`` once an exponentiation is upstream (the
q-part is then undefined: a second ``exp`` on a path is not Lax and raises).

Overflow: every modulus is below ``2**31``, so a product of two residues is below
``2**62`` and fits ``int64``; sums of up to ``2**32`` residues fit too. Matmul
runs as float64 GEMMs, which are exact while every partial sum stays below
``2**53``; see :func:`matmul_mod` for the limb split that guarantees it.

Primes: the default pair is the largest *safe-prime* pair below ``2**31``
(``p = 2q + 1``, both prime) with ``q ≡ 3 (mod 4)`` — hence ``p ≡ 7 (mod 8)`` —
for which 2, 3, 5 and 7 are quadratic residues mod both ``p`` and ``q``. Then
``sqrt(x) = x^((m+1)/4)`` is a multiplicative map on both fields, and it maps
the squares of small constants (``4``, ``1/4096 = (1/64)²``, ``9``, …) to their
positive roots, as real arithmetic does. Mirage used ``p = 167, q = 83`` in
16-bit integers; :data:`MIRAGE` gives that pair for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np
import torch

from mugraph.algebra import Algebra
from mugraph.errors import MugraphError, NotLaxError

Value = tuple  # (x_p,) or (x_p, x_q) of int64 arrays

#: largest exactly representable integer range of float64
FLOAT_EXACT = 2 ** 53
#: moduli must stay below this so residue products fit int64
MAX_MODULUS = 2 ** 31
#: GEMMs with fewer multiply-adds than this run single-threaded
SMALL_GEMM = 1 << 22


class ZeroDivisorDraw(MugraphError):
    """A division met a zero divisor under this draw of inputs: the draw failed.

    :func:`verify.equivalent` catches it and redraws; a divisor that is zero on
    every draw is (with high probability) identically zero, which is reported."""


class FieldError(MugraphError):
    """Primes that do not meet the conditions of DESIGN §4, or a constant with no
    meaning mod p (its denominator is a multiple of p)."""


def is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3e24 (bases: the first 13 primes)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for s in small:
        if n % s == 0:
            return n == s
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def find_prime_pair(below: int = MAX_MODULUS, residues: tuple[int, ...] = (2, 3, 5, 7)) -> tuple[int, int]:
    """The largest safe-prime pair ``p = 2q+1 < below`` with ``q ≡ 3 (mod 4)`` and
    every number in ``residues`` a quadratic residue mod p and mod q."""
    q = (below - 2) // 2
    q -= (q - 3) % 4
    while q > 3:
        p = 2 * q + 1
        if (is_prime(q) and is_prime(p)
                and all(pow(a, (p - 1) // 2, p) == 1 and pow(a, (q - 1) // 2, q) == 1 for a in residues)):
            return p, q
        q -= 4
    raise FieldError(f"no safe-prime pair below {below}")


@dataclass(frozen=True)
class Field:
    """A pair of primes ``(p, q)`` with ``q | p − 1``; validated on construction.

    ``p ≡ 3 (mod 4)`` (and ``q ≡ 3 (mod 4)``) make ``sqrt`` a multiplicative map;
    a pair that misses it still works for programs without ``sqrt``.
    """

    p: int
    q: int
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        p, q = self.p, self.q
        if not (isinstance(p, int) and isinstance(q, int)):
            raise FieldError(f"primes must be ints, got p={p!r}, q={q!r}")
        if not (is_prime(p) and is_prime(q)):
            raise FieldError(f"p={p} and q={q} must both be prime")
        if (p - 1) % q:
            raise FieldError(f"q={q} must divide p-1={p - 1} (so that Z_p has q-th roots of unity)")
        if q < 3:
            raise FieldError(f"q={q} is too small: ω would have order {q}")
        if p >= MAX_MODULUS:
            raise FieldError(f"p={p} must be < 2**31 so residue products fit int64")

    @property
    def sqrt_ok(self) -> tuple[bool, bool]:
        return self.p % 4 == 3, self.q % 4 == 3

    def __str__(self) -> str:
        return f"p={self.p}, q={self.q}"


DEFAULT = Field(2147471759, 1073735879, "default")
"""Largest safe-prime pair below 2**31 meeting the conditions above
(``find_prime_pair()``; checked in the tests)."""

MIRAGE = Field(167, 83, "mirage")
"""Mirage's 16-bit pair (paper §7), for comparison only."""


# ----------------------------------------------------------------------------- scalar helpers


def const_mod(c: Fraction, m: int) -> int:
    """A rational constant as a residue mod m."""
    c = Fraction(c)
    if c.denominator % m == 0:
        raise FieldError(f"constant {c} has no meaning mod {m} (its denominator is a multiple of {m})")
    return c.numerator % m * pow(c.denominator, -1, m) % m


def random_omega(f: Field, rng: np.random.Generator) -> int:
    """A uniformly random element of order q in Z_p* (a primitive q-th root of unity).

    ``g ↦ g^((p−1)/q)`` maps the uniform distribution on Z_p* onto the uniform
    distribution on the order-q subgroup; rejecting 1 leaves the q−1 generators."""
    e = (f.p - 1) // f.q
    while True:
        g = int(rng.integers(2, f.p))
        w = pow(g, e, f.p)
        if w != 1:
            return w


# ----------------------------------------------------------------------------- array helpers


def pow_fixed(x: np.ndarray, e: int, m: int) -> np.ndarray:
    """``x ** e mod m`` element-wise for a fixed exponent (square and multiply)."""
    result = np.ones_like(x)
    base = x % m
    while e:
        if e & 1:
            result = result * base % m
        e >>= 1
        if e:
            base = base * base % m
    return result


def inverse(x: np.ndarray, m: int) -> np.ndarray:
    """Modular inverse by Fermat (m prime); the caller has checked x has no zero."""
    return pow_fixed(x, m - 2, m)


class PowTable:
    """``ω^k mod p`` for array exponents ``k`` in ``[0, q)`` by three table lookups.

    The exponent is split into 10-bit windows: ``ω^k = T0[k & 1023] · T1[(k>>10) & 1023] ·
    T2[k>>20]`` — two modular products per element instead of thirty."""

    BITS = 10

    def __init__(self, omega: int, p: int, q: int) -> None:
        self.p = p
        self.windows = max(1, -(-(q - 1).bit_length() // self.BITS))
        size = 1 << self.BITS
        self.tables = []
        for w in range(self.windows):
            step = pow(omega, 1 << (self.BITS * w), p)
            t = np.empty(size, dtype=np.int64)
            acc = 1
            for i in range(size):
                t[i] = acc
                acc = acc * step % p
            self.tables.append(t)

    def __call__(self, k: np.ndarray) -> np.ndarray:
        mask = (1 << self.BITS) - 1
        out = self.tables[0][k & mask]
        for w in range(1, self.windows):
            out = out * self.tables[w][(k >> (self.BITS * w)) & mask] % self.p
        return out


def limb_plan(K: int, m: int) -> tuple[int, int]:
    """``(L, w)``: split one operand into ``L`` limbs of ``w`` bits so that a float64
    GEMM over a reduction of length ``K`` is exact, or ``(0, 0)`` if no split fits.

    A GEMM of limbs (each ``≤ 2^w − 1``) by residues (each ``≤ m − 1``) has partial
    sums ``≤ K·(2^w − 1)·(m − 1)``; float64 represents every integer below ``2**53``
    exactly, and a sum of exact products stays exact while below it. So the plan is
    the fewest limbs with ``K·(2^w − 1)·(m − 1) < 2**53`` (``L = 1``: no split)."""
    bits = max(1, (m - 1).bit_length())
    for L in range(1, bits + 1):
        w = -(-bits // L)
        if K * ((1 << w) - 1) * (m - 1) < FLOAT_EXACT:
            return L, w
    return 0, 0


def matmul_mod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact ``a @ b mod m`` (numpy batch broadcasting) through float64 GEMMs.

    The smaller operand is split into ``L`` limbs of ``w`` bits (:func:`limb_plan`:
    for ``m ≈ 2^31`` and ``K = 4096``, four limbs of 8 bits; for Mirage's 16-bit
    primes no split) and the limbs are stacked along its free dim, so one GEMM
    reads the large operand once — skinny GEMMs are memory-bound. Each limb's
    product is an exact integer ``< 2**53``; it is reduced mod m in int64 and
    recombined as ``Σ_l (P_l mod m)·(2^(w·l) mod m)``, every term ``< 2**62``.
    Reductions too long for any split (``K ≥ 2**53/(m−1)``) are cut into chunks.
    """
    K = a.shape[-1]
    L, w = limb_plan(K, m)
    if L == 0:  # reduction too long: split K in halves
        h = K // 2
        return (matmul_mod(a[..., :h], b[..., :h, :], m) + matmul_mod(a[..., h:], b[..., h:, :], m)) % m
    assert K * ((1 << w) - 1) * (m - 1) < FLOAT_EXACT
    def f(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))

    def mm(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        # torch's batched float64 GEMM: numpy's runs one BLAS call per small matrix (10× slower
        # here); small products run on one thread (thread start-up costs 10× the work there)
        work = x.numel() * y.shape[-1]
        if work >= SMALL_GEMM:
            return torch.matmul(x, y).numpy()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return torch.matmul(x, y).numpy()
        finally:
            torch.set_num_threads(threads)

    if L == 1:
        return mm(f(a), f(b)).astype(np.int64) % m
    mask = (1 << w) - 1
    split_a = a.size <= b.size
    small = a if split_a else b
    axis = -2 if split_a else -1
    limbs = f(np.concatenate([(small >> (w * l)) & mask for l in range(L)], axis=axis))
    prod = mm(limbs, f(b)) if split_a else mm(f(a), limbs)
    parts = np.split(prod.astype(np.int64), L, axis=axis)
    out = parts[0] % m
    for l in range(1, L):
        out = (out + (parts[l] % m) * pow(2, w * l, m)) % m
    return out


# ----------------------------------------------------------------------------- the algebra


class FieldInput:
    """An input handed to :func:`mugraph.evaluate` for the field algebra: the two
    residue arrays of one input tensor (it has the ``shape`` the interpreter checks)."""

    __slots__ = ("xp", "xq", "shape")

    def __init__(self, xp: np.ndarray, xq: np.ndarray | None) -> None:
        self.xp, self.xq, self.shape = xp, xq, tuple(xp.shape)


class FieldAlgebra(Algebra):
    """The (mod p, mod q) algebra of DESIGN §4 for :func:`mugraph.evaluate`.

    | op | p-part | q-part |
    |---|---|---|
    | add, sub, mul, sum, matmul, constants | mod p | mod q |
    | div | ``x_p·y_p⁻¹`` | ``x_q·y_q⁻¹`` |
    | exp | ``ω^(x_q)`` | undefined |
    | silu | ``x_p·(1 + ω^(−x_q))⁻¹`` | undefined |
    | sqrt | ``x_p^((p+1)/4)`` | ``x_q^((q+1)/4)`` |

    A zero divisor raises :class:`ZeroDivisorDraw` (the draw failed); ``1 + ω^k``
    is never zero because ω has odd order q, so silu never fails a draw.
    """

    name = "field"

    def __init__(self, fld: Field, omega: int) -> None:
        self.field = fld
        self.omega = omega
        self.pow_omega = PowTable(omega, fld.p, fld.q)
        p, q = fld.p, fld.q
        self.moduli = (p, q)
        self.ops: dict[str, Callable] = {
            "matmul": self._matmul,
            "add": self._binary(lambda x, y, m: (x + y) % m),
            "sub": self._binary(lambda x, y, m: (x - y) % m),
            "mul": self._binary(lambda x, y, m: x * y % m),
            "div": self._div,
            "exp": self._exp,
            "silu": self._silu,
            "sqrt": self._sqrt,
            "square": lambda xs, at: tuple(v * v % m for v, m in zip(xs[0], self.moduli)),
            "scale": self._scale,
            "const": self._const,
            "sum": lambda xs, at: tuple(v.sum(axis=at["dim"], keepdims=True) % m
                                        for v, m in zip(xs[0], self.moduli)),
            "max": self._max,
            "concat": lambda xs, at: self.concat(xs, at["dim"]),
            "reshape": lambda xs, at: self.reshape(xs[0], at["shape"]),
            "repeat": lambda xs, at: self.lift(xs[0], lambda a: np.tile(a, tuple(at["reps"]))),
        }

    # -- structure: values may have one or two parts; combine on the common ones
    def concat(self, vs, axis: int):
        n = min(len(v) for v in vs)
        return tuple(np.concatenate([v[i] for v in vs], axis) for i in range(n))

    # -- semantics
    def input(self, name, value, shape, dtype):
        if not isinstance(value, FieldInput):
            raise TypeError(f"input {name!r}: the field algebra takes FieldInput values (use verify.draw_inputs)")
        return (value.xp,) if value.xq is None else (value.xp, value.xq)

    def output(self, v, as_torch):
        return v

    def accumulate(self, v, axis):
        return tuple(a.sum(axis=axis, keepdims=True) % m for a, m in zip(v, self.moduli))

    def _binary(self, fn):
        def op(xs, at):
            x, y = xs
            return tuple(fn(a, b, m) for a, b, m in zip(x, y, self.moduli))
        return op

    def _matmul(self, xs, at):
        x, y = xs
        return tuple(matmul_mod(a, b, m) for a, b, m in zip(x, y, self.moduli))

    def _div(self, xs, at):
        x, y = xs
        out = []
        for a, b, m in zip(x, y, self.moduli):
            if not b.all():
                raise ZeroDivisorDraw(f"division by a value that is 0 mod {m} under this draw")
            out.append(a * inverse(b, m) % m)
        return tuple(out)

    def _exp(self, xs, at):
        (x,) = xs
        if len(x) < 2:
            raise NotLaxError("exp: its argument already contains an exponentiation (exp/silu); "
                              "a second one on a path is not Lax")
        return (self.pow_omega(x[1]),)

    def _silu(self, xs, at):
        (x,) = xs
        if len(x) < 2:
            raise NotLaxError("silu: its argument already contains an exponentiation (exp/silu); "
                              "a second one on a path is not Lax")
        p, q = self.moduli
        e = self.pow_omega((q - x[1]) % q)  # ω^(−x_q)
        return (x[0] * inverse((1 + e) % p, p) % p,)

    def _sqrt(self, xs, at):
        (x,) = xs
        out = []
        for a, m in zip(x, self.moduli):
            if m % 4 != 3:
                raise FieldError(f"sqrt needs a prime ≡ 3 (mod 4); {m} is not")
            out.append(pow_fixed(a, (m + 1) // 4, m))
        return tuple(out)

    def _scale(self, xs, at):
        (x,) = xs
        return tuple(a * const_mod(at["c"], m) % m for a, m in zip(x, self.moduli))

    def _const(self, xs, at):
        shape = tuple(at["shape"])
        return tuple(np.full(shape, const_mod(at["value"], m), dtype=np.int64) for m in self.moduli)

    def _max(self, xs, at):
        raise NotLaxError("max: has no finite-field meaning (not Lax); compare such graphs in floating point")


def uniform_residues(rng: np.random.Generator, m: int, shape) -> np.ndarray:
    """Exactly uniform residues in ``[0, m)`` as int64 (``m < 2**32``).

    Draws 32-bit words and keeps those below ``k·m`` (``k = ⌊2^32/m⌋``), reduced
    mod m: every residue has exactly k preimages, so the result is uniform — no
    modulo bias. Rejected words (probability ``(2^32 mod m)/2^32``, about 5e-6 for
    the default primes) are redrawn. Twice as fast as ``rng.integers(0, m)``."""
    n = int(np.prod(shape, dtype=np.int64))
    limit = (1 << 32) // m * m
    u = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    bad = np.flatnonzero(u >= limit) if limit < (1 << 32) else np.empty(0, np.int64)
    while bad.size:
        u[bad] = rng.integers(0, 1 << 32, size=bad.size, dtype=np.uint32)
        bad = bad[u[bad] >= limit]
    out = np.empty(n, dtype=np.int64)  # one large allocation: fresh pages are costly
    np.remainder(u, np.uint32(m), out=out, casting="unsafe")
    return out.reshape(shape)


def draw_inputs(specs: list[tuple[str, tuple[int, ...], bool]], fld: Field,
                rng: np.random.Generator) -> dict[str, FieldInput]:
    """Independent uniform residues mod p (and mod q where ``need_q``) for each
    ``(name, shape, need_q)``, drawn in the order given (callers sort by name).

    An input whose q-part can never reach an exponent gets none (saves a draw and
    the arithmetic on it); see :func:`verify.analysis.inputs_needing_q`."""
    out = {}
    for name, shape, need_q in specs:
        xp = uniform_residues(rng, fld.p, shape)
        xq = uniform_residues(rng, fld.q, shape) if need_q else None
        out[name] = FieldInput(xp, xq)
    return out
