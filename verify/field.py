"""Exact modular arithmetic for the finite-field equivalence test (DESIGN §4).

Every tensor element is a pair ``(x_p, x_q)``: its value mod ``p`` (used outside
exponents) and mod ``q`` (used inside them), with ``q | p - 1`` so that ``Z_p*``
has a subgroup of order ``q``; ``ω`` is a random generator of it, and
``exp(x) = ω^(x_q) mod p`` turns ``(Z_q, +)`` into ``(Z_p*, ×)`` — so
``exp(a + b) = exp(a)·exp(b)`` holds exactly.

Values are numpy ``int64`` arrays of canonical residues in ``[0, m)`` (drawn
inputs are stored as float64, which holds them exactly; every op but the
structural ones and matmul sees them as int64: :meth:`FieldAlgebra.apply`). A value is
a tuple ``(x_p, x_q)``, or ``(x_p,)`` once an exponentiation is upstream (the
q-part is then undefined: a second ``exp`` on a path is not Lax and raises).

Overflow: every modulus is below ``2**31`` (:data:`MAX_MODULUS`, enforced by
:class:`Field`), so a product of two residues is below ``2**62`` and fits
``int64``; sums of up to ``2**32`` residues fit too. Matmul runs as float64 GEMMs,
which are exact while every partial sum stays below ``2**53``; see
:func:`matmul_mod` for the limb split that guarantees it.

Primes: :class:`Field` is one pair. The verifier draws a fresh pair for every
test from :data:`verify.family.DEFAULT` (random safe primes ``p = 2q + 1 < 2^31``);
a fixed pair is kept only to reproduce Mirage's test (:data:`MIRAGE`,
``p = 167, q = 83``, which Mirage ran in 16-bit integers). With ``p ≡ 3 (mod 4)``
``sqrt(x) = x^((p+1)/4)`` is a multiplicative map (and the same mod q).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np
import torch

from mugraph.algebra import Algebra
from mugraph.errors import MugraphError, NotLaxError
from mugraph.ops import Category, category

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
    """Deterministic Miller–Rabin: bases 2, 7, 61 below 4,759,123,141 (Jaeschke),
    the first 13 primes up to 3.3e24 (every modulus here is below 2^31)."""
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
    for a in ((2, 7, 61) if n < 4_759_123_141 else small):
        if a % n == 0:  # n = 61: a base that is a multiple of n says nothing
            continue
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

    @classmethod
    def _proven(cls, p: int, q: int, name: str) -> "Field":
        """A pair the caller has just proven valid (:meth:`verify.family.PrimeFamily.draw`):
        built without testing both primes a second time."""
        f = object.__new__(cls)
        for k, v in (("p", p), ("q", q), ("name", name)):
            object.__setattr__(f, k, v)
        return f

    def __str__(self) -> str:
        return f"p={self.p}, q={self.q}"


MIRAGE = Field(167, 83, "mirage")
"""Mirage's 16-bit pair (paper §7): the fixed-prime mode, to reproduce Mirage's test."""


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
    """``ω^k mod p`` for array exponents ``k`` in ``[0, q)`` by two table lookups.

    The exponent is split into 15-bit windows: ``ω^k = T0[k & 0x7fff] · T1[k >> 15]``
    (q < 2^30) — one modular product per element instead of thirty. The tables
    (2^15 entries, 256 KiB each: they stay in cache) are built by doubling,
    ``T[2^j + i] = T[i] · step^(2^j)``, in fifteen vectorized steps."""

    BITS = 15

    def __init__(self, omega: int, p: int, q: int) -> None:
        self.p = p
        nbits = max(1, (q - 1).bit_length())
        self.bits = min(self.BITS, nbits)
        self.windows = -(-nbits // self.bits)
        self.tables = []
        for w in range(self.windows):
            step = pow(omega, 1 << (self.bits * w), p)  # T[i] = step^i
            t = np.empty(1 << self.bits, dtype=np.int64)
            t[0] = 1
            for j in range(self.bits):  # T[2^j + i] = T[i] · step^(2^j), written in place
                n = 1 << j
                np.multiply(t[:n], pow(step, n, p), out=t[n:2 * n])
                np.remainder(t[n:2 * n], p, out=t[n:2 * n])
            self.tables.append(t)

    def __call__(self, k: np.ndarray) -> np.ndarray:
        mask = (1 << self.bits) - 1
        idx = np.bitwise_and(k, mask)
        out = self.tables[0].take(idx)
        for w in range(1, self.windows):
            np.right_shift(k, self.bits * w, out=idx)
            if w + 1 < self.windows:
                np.bitwise_and(idx, mask, out=idx)
            out *= self.tables[w].take(idx)
            out %= self.p
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


def to_float(x: np.ndarray) -> torch.Tensor:
    """Residues (int64, or float64 holding integers) as an exact float64 torch
    tensor in the same memory order: a float64 view (an input iterator's tiles) is
    shared, not copied; an int64 one is converted without a gather."""
    if x.dtype == np.float64 and x.flags.writeable and all(s >= 0 for s in x.strides):
        return torch.from_numpy(x)
    return torch.from_numpy(x.astype(np.float64, order="K"))


def as_ints(v: Value) -> Value:
    """A value's parts as int64 (residues may be stored as float64: see :func:`draw_inputs`)."""
    return tuple(a if a.dtype == np.int64 else a.astype(np.int64) for a in v)


def float_safe(kind: str) -> bool:
    """Ops of the field algebra that take residues stored as float64 as they are:
    contractions convert to float64 anyway, rearrangements only move entries."""
    return category(kind) in (Category.CONTRACTION, Category.REARRANGEMENT)


_SCRATCH = threading.local()
#: scratch buffers of this many bytes are kept per thread and reused
SCRATCH_MIN, SCRATCH_MAX = 1 << 20, 1 << 26


def _scratch(name: str, n: int, dtype) -> np.ndarray:
    """A flat scratch array of ``n`` entries that this thread's next call reuses.

    Fresh memory is paid for at first touch (a page fault per page: here ~0.5 ms
    per MB, as much as the GEMM that fills it), so the GEMM output and the int64
    temporaries of :func:`matmul_mod` — dead once it returns — live here."""
    size = n * np.dtype(dtype).itemsize
    if size > SCRATCH_MAX or size < SCRATCH_MIN:  # small ones come from the heap, already touched
        return np.empty(n, dtype)
    key = (name, np.dtype(dtype).str)
    bufs = _SCRATCH.__dict__.setdefault("bufs", {})
    buf = bufs.get(key)
    if buf is None or buf.size < n:
        buf = bufs[key] = np.empty(n, dtype)
    return buf[:n]


def _gemm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Batched float64 GEMM (torch's: numpy's runs one BLAS call per small matrix,
    10× slower here). Large products write into a scratch buffer; small ones run on
    one thread (thread start-up costs 10× the work there)."""
    if x.shape[0] * x.shape[1] * x.shape[2] * y.shape[2] >= SMALL_GEMM:
        out = torch.from_numpy(_scratch("gemm", x.shape[0] * x.shape[1] * y.shape[2], np.float64))
        return torch.matmul(x, y, out=out.view(x.shape[0], x.shape[1], y.shape[2]))
    threads = torch.get_num_threads()
    if threads == 1:
        return torch.matmul(x, y)
    torch.set_num_threads(1)
    try:
        return torch.matmul(x, y)
    finally:
        torch.set_num_threads(threads)


def _folded_matmul(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, list, list[int]]:
    """``a @ b`` with broadcast batch axes (same ndim; every batch axis equal or 1 in
    one of them) folded into the GEMM: an axis along which only ``a`` varies joins
    its rows, one along which only ``b`` varies joins its columns. So a batch of
    skinny products that share one operand runs as one wide product per shared
    batch index, and a permuted view (an input iterator) usually needs no copy.

    Returns ``(c, labels, shape)``: ``c`` contiguous; ``c.reshape(shape)`` has the
    axes ``labels`` — batch axes by index, ``"M"`` and ``"N"`` — in that order
    (batch axes of size 1 in both operands are left out)."""
    nb = a.dim() - 2
    if nb == 0:
        return _gemm(a[None], b[None]), ["M", "N"], [a.shape[0], b.shape[1]]
    both = [i for i in range(nb) if a.shape[i] > 1 and b.shape[i] > 1]
    only_a = [i for i in range(nb) if a.shape[i] > 1 and b.shape[i] == 1]
    only_b = [i for i in range(nb) if b.shape[i] > 1 and a.shape[i] == 1]
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    tb = math.prod(a.shape[i] for i in both)
    pa = math.prod(a.shape[i] for i in only_a)
    pb = math.prod(b.shape[i] for i in only_b)
    x, y = a, b
    if only_a or only_b:
        x = a.permute(both + only_a + [i for i in range(nb) if i not in both and i not in only_a] + [nb, nb + 1])
        y = b.permute(both + [nb] + only_b + [i for i in range(nb) if i not in both and i not in only_b] + [nb + 1])
    c = _gemm(x.reshape(tb, pa * M, K), y.reshape(tb, K, pb * N))
    labels = both + only_a + ["M"] + only_b + ["N"]
    shape = [a.shape[i] for i in both] + [a.shape[i] for i in only_a] + [M] + [b.shape[i] for i in only_b] + [N]
    return c, labels, shape


def _unbroadcast(x: np.ndarray, nb: int) -> np.ndarray:
    """Cut batch axes that are broadcast (stride 0) down to size 1: the GEMM
    broadcasts them again, without materializing the copies."""
    if all(x.strides[i] or x.shape[i] == 1 for i in range(nb)):
        return x
    return x[tuple(slice(0, 1) if i < nb and x.strides[i] == 0 else slice(None) for i in range(x.ndim))]


def matmul_mod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact ``a @ b mod m`` (numpy batch broadcasting) through float64 GEMMs.

    The smaller operand is split into ``L`` limbs of ``w`` bits (:func:`limb_plan`:
    for ``m ≈ 2^31`` and ``K = 4096``, four limbs of 8 bits; for ``K = 64`` two of
    16; for Mirage's 16-bit primes no split), laid side by side along its free dim
    (rows of ``a`` or columns of ``b``), so one GEMM reads the large operand once
    — skinny GEMMs are memory-bound. Batch axes along which only one operand varies
    join its rows or columns too (:func:`_folded_matmul`): an iterator's tiles of a
    weight, one GEMM per loop step, become a few wide GEMMs over the weight itself,
    read in place. Each limb's product is an exact integer
    ``< 2**53``; the limbs are recombined by Horner's rule in int64,
    ``acc ← ((acc·2^w) + P_l) mod m``, every intermediate ``< 2^(31+w) + 2^53 < 2^62``.
    Reductions too long for any split (``K ≥ 2**53/(m−1)``) are cut into chunks.

    Operands are residues in ``[0, m)``, int64 or float64 (exact integers): a
    float64 operand that is not split into limbs goes to the GEMM without a copy.
    """
    if a.ndim < 2 or b.ndim < 2:  # numpy's 1-D rules: promote, multiply, drop the axis again
        out = matmul_mod(a.reshape(1, -1) if a.ndim == 1 else a, b.reshape(-1, 1) if b.ndim == 1 else b, m)
        return out[..., 0, :] if a.ndim == 1 and b.ndim > 1 else out[..., 0] if b.ndim == 1 and a.ndim > 1 \
            else out[..., 0, 0]
    K = a.shape[-1]
    if b.shape[-2] != K:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match")
    L, w = limb_plan(K, m)
    if L == 0:  # reduction too long: split K in halves
        h = K // 2
        return (matmul_mod(a[..., :h], b[..., :h, :], m) + matmul_mod(a[..., h:], b[..., h:, :], m)) % m
    assert K * ((1 << w) - 1) * (m - 1) < FLOAT_EXACT
    nd = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    batch = []
    for sa, sb in zip(a.shape[:-2], b.shape[:-2]):
        if sa != sb and 1 not in (sa, sb):
            raise ValueError(f"matmul: batch shapes {a.shape[:-2]} and {b.shape[:-2]} do not broadcast")
        batch.append(max(sa, sb))
    a, b = _unbroadcast(a, nd - 2), _unbroadcast(b, nd - 2)
    split_a = a.size <= b.size
    M, N = a.shape[-2], b.shape[-1]
    if L == 1:
        x, y = to_float(a), to_float(b)
    else:  # limbs of the smaller operand side by side along its free dim: rows (L, M) or columns (L, N)
        mask = (1 << w) - 1
        (small,) = as_ints((a if split_a else b,))
        limbs = to_float(np.concatenate([(small >> (w * l)) & mask for l in range(L)], axis=-2 if split_a else -1))
        x, y = (limbs, to_float(b)) if split_a else (to_float(a), limbs)
    c, labels, shape = _folded_matmul(x, y)
    at = labels.index("M" if split_a else "N")  # split that free dim into (limb, dim)
    labels[at:at + 1], shape[at:at + 1] = ["L", labels[at]], [L, M if split_a else N]
    for i in range(nd - 2):  # batch axes of size 1 in both operands
        if i not in labels:
            labels.append(i)
            shape.append(1)
    # (limb, batch..., M, N): gathered into that order by the first cast
    prod = c.numpy().reshape(shape).transpose([labels.index(x) for x in ["L", *range(nd - 2), "M", "N"]])
    acc = prod[L - 1].astype(np.int64, order="C")  # the result: fresh memory
    acc %= m
    if L > 1:
        tmp = _scratch("limb", acc.size, np.int64).reshape(acc.shape)
    for l in range(L - 2, -1, -1):  # Horner: acc·2^w + P_l < 2^(31+w) + 2^53
        acc <<= w
        np.copyto(tmp, prod[l], casting="unsafe")  # exact: P_l is an integer < 2^53
        acc += tmp
        acc %= m
    shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    return acc if acc.shape == shape else np.ascontiguousarray(np.broadcast_to(acc, shape))


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
        self._pow_omega: PowTable | None = None
        p, q = fld.p, fld.q
        self.moduli = (p, q)

    @property
    def pow_omega(self) -> PowTable:
        """``k ↦ ω^k``, built on first use (exp-free graphs never pay for the tables)."""
        if self._pow_omega is None:
            self._pow_omega = PowTable(self.omega, self.field.p, self.field.q)
        return self._pow_omega

    # -- structure: values may have one or two parts; combine on the common ones
    def concat(self, vs, axis: int):
        n = min(len(v) for v in vs)
        return tuple(np.concatenate([v[i] for v in vs], axis) for i in range(n))

    # -- semantics
    def input(self, name, value, shape, dtype):
        if not isinstance(value, FieldInput):
            raise TypeError(f"input {name!r}: the field algebra takes FieldInput values (use verify.draw_inputs)")
        return (value.xp,) if value.xq is None else (value.xp, value.xq)

    def apply(self, kind, inputs, attrs):
        if not float_safe(kind):  # residues stored as float64 become int64 before any arithmetic
            inputs = [as_ints(v) for v in inputs]
        return super().apply(kind, inputs, attrs)

    def output(self, v, as_torch):
        return as_ints(v)

    def accumulate(self, v, axis):
        return tuple(a.sum(axis=axis, keepdims=True) % m for a, m in zip(as_ints(v), self.moduli))

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


def _binary(fn):
    """A field row of an element-wise binary op: ``fn(a, b, m)`` on each part."""
    def row(alg: FieldAlgebra, xs, at):
        x, y = xs
        return tuple(fn(a, b, m) for a, b, m in zip(x, y, alg.moduli))
    return row


#: field evaluation: op name -> row(algebra, inputs, attrs) (ops outside the field's class raise)
FIELD_OPS: dict[str, Callable] = {
    "matmul": FieldAlgebra._matmul,
    "add": _binary(lambda x, y, m: (x + y) % m),
    "sub": _binary(lambda x, y, m: (x - y) % m),
    "mul": _binary(lambda x, y, m: x * y % m),
    "div": FieldAlgebra._div,
    "exp": FieldAlgebra._exp,
    "silu": FieldAlgebra._silu,
    "sqrt": FieldAlgebra._sqrt,
    "square": lambda alg, xs, at: tuple(v * v % m for v, m in zip(xs[0], alg.moduli)),
    "scale": FieldAlgebra._scale,
    "const": FieldAlgebra._const,
    "sum": lambda alg, xs, at: tuple(v.sum(axis=at["dim"], keepdims=True) % m for v, m in zip(xs[0], alg.moduli)),
    "max": FieldAlgebra._max,
    "concat": lambda alg, xs, at: alg.concat(xs, at["dim"]),
    "reshape": lambda alg, xs, at: alg.reshape(xs[0], at["shape"]),
    "repeat": lambda alg, xs, at: alg.lift(xs[0], lambda a: np.tile(a, tuple(at["reps"]))),
    "permute": lambda alg, xs, at: alg.permute(xs[0], at["perm"]),
}
FieldAlgebra.ops = FIELD_OPS


def uniform_residues(rng: np.random.Generator, m: int, shape, dtype=np.int64) -> np.ndarray:
    """Exactly uniform residues in ``[0, m)`` as ``dtype`` (int64, or float64 — exact
    below 2**53) for ``2 ≤ m ≤ 2**32``.

    Takes raw 32-bit words of ``rng``'s bit generator, keeps their low
    ``b = bit_length(m − 1)`` bits (uniform on ``[0, 2^b)``) and rejects values
    ``≥ m``; accepted values are uniform on ``[0, m)`` and independent — no modulo
    bias. Rejected entries (probability ``(2^b − m)/2^b < 1/2``; at most 1/8 for
    the family's primes, :mod:`verify.family`) are redrawn from fresh words. No division at all, and raw
    words are 1.7× faster to get than ``rng.integers(0, 2**32, dtype=uint32)``."""
    n = int(np.prod(shape, dtype=np.int64))
    mask = np.uint32((1 << max(1, (m - 1).bit_length())) - 1)

    def words(k: int) -> np.ndarray:
        u = rng.bit_generator.random_raw((k + 1) // 2).view(np.uint32)[:k]
        return np.bitwise_and(u, mask, out=u)

    u = words(n)
    if m <= int(mask):
        bad = np.flatnonzero(u >= m)
        while bad.size:
            u[bad] = words(bad.size)
            bad = bad[u[bad] >= m]
    return u.astype(dtype).reshape(shape)


def draw_inputs(specs: list[tuple[str, tuple[int, ...], bool]], fld: Field,
                rng: np.random.Generator) -> dict[str, FieldInput]:
    """Independent uniform residues mod p (and mod q where ``need_q``) for each
    ``(name, shape, need_q)``, drawn in the order given (callers sort by name).

    An input whose q-part can never reach an exponent gets none (saves a draw and
    the arithmetic on it); see :func:`verify.analysis.inputs_needing_q`.

    The residues are stored as float64 (exact: they are below 2**31): matmul, the
    bulk of the work at full size, then reads an input — or an iterator's view of
    it — without converting it; every other op converts the entries it needs to
    int64 first (:meth:`FieldAlgebra.apply`)."""
    out = {}
    for name, shape, need_q in specs:
        xp = uniform_residues(rng, fld.p, shape, np.float64)
        xq = uniform_residues(rng, fld.q, shape, np.float64) if need_q else None
        out[name] = FieldInput(xp, xq)
    return out
