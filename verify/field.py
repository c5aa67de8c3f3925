"""Exact modular arithmetic for the finite-field equivalence test (docs/design.md §4.1).

Every tensor element is a pair ``(x_p, x_q)``: its value mod ``p`` (used outside
exponents) and mod ``q`` (used inside them), with ``q | p - 1`` so that ``Z_p*``
has a subgroup of order ``q``; ``ω`` is a random generator of it, and
``exp(x) = ω^(x_q) mod p`` turns ``(Z_q, +)`` into ``(Z_p*, ×)`` — so
``exp(a + b) = exp(a)·exp(b)`` holds exactly.

**Torch, on any device.** Residues are torch tensors of canonical residues in
``[0, m)``: int64 for every computed value; drawn inputs are stored as float64 (exact
below 2^53), which a matmul reads as it is. The same code runs on the CPU and, with
``device="cuda"``, on a GPU (:func:`resolve_device`: ``"auto"`` takes CUDA when it is
present). On the CPU, large results are allocated through numpy
(:func:`new_tensor`): numpy asks the kernel for transparent huge pages, so a fresh
134 MB result costs ~10 ms of page faults instead of ~90 ms through torch's own
allocator — at full shapes that was a third of a test.

**Parts on demand.** A value is a tuple of :class:`Part` s — ``(x_p, x_q)``, or
``(x_p,)`` once an exponentiation is upstream (the q-part is then undefined: a second
``exp`` on a path is not Lax and raises). Evaluating a graph only *describes* each
part (its shape and how to compute it); :meth:`FieldAlgebra.realize` then computes
the parts the outputs need, in evaluation order, and releases each after its last
use. A part nothing reads is never computed: the p-part of ``Q @ K`` under an
``exp`` (only its q-part enters ω^x) — a third of an attention test's matmul work —
and every q-part of a fingerprint, which hashes the p-parts alone. A zero divisor in
a part that is never computed cannot fail a draw: that value reaches no output.

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
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import torch

from mugraph.core.algebra import Algebra, window
from mugraph.core.errors import ConfigError, MugraphError, NotLaxError
from mugraph.core.sizing import largest_value
from mugraph.core.ir import KernelGraph
from mugraph.core.oprules import broadcast_shapes  # not torch.broadcast_shapes: ~80 μs a call through symbolic-shape guards

from . import fused

#: largest exactly representable integer range of float64
FLOAT_EXACT = 2 ** 53
#: moduli must stay below this so residue products fit int64
MAX_MODULUS = 2 ** 31
#: CPU GEMMs with fewer multiply-adds than this run single-threaded
SMALL_GEMM = 1 << 22


class ZeroDivisorDraw(MugraphError):
    """A division met a zero divisor under this draw of inputs: the draw failed.

    :func:`verify.equivalent` catches it and redraws; a divisor that is zero on
    every draw is (with high probability) identically zero, which is reported."""


class EvaluationStopped(Exception):
    """An evaluation ended at its caller's deadline (:class:`FieldAlgebra`'s ``stop_at``)
    before its outputs were computed: it answers nothing about the graph. Not a
    :class:`MugraphError`, which callers read as "this draw decides nothing, let
    verification decide"; a search's fingerprint that stops is simply not answered."""


class FieldError(MugraphError):
    """Primes that do not meet the conditions of docs/design.md §4.2, or a constant with no
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


# ----------------------------------------------------------------------------- devices and memory


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """The device the field arithmetic runs on: ``"auto"`` (or None) is CUDA when
    torch sees a GPU, else the CPU; ``"cpu"``, ``"cuda"``, ``"cuda:1"`` are taken as
    they are. A CUDA device that is not there is a one-line
    :class:`~mugraph.core.errors.ConfigError`, not a failure half-way through a test."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={device!r}: use 'auto', 'cpu' or 'cuda' (optionally 'cuda:N')") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: the field arithmetic runs on 'cpu' or 'cuda'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r}: torch sees no CUDA device here (use 'cpu' or 'auto')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r}: there are {torch.cuda.device_count()} CUDA devices")
    return dev


#: CPU tensors of at least this many bytes are allocated through numpy (huge pages)
HUGE_ALLOC = 1 << 20
_NP = {torch.int64: np.int64, torch.float64: np.float64, torch.int32: np.int32, torch.float32: np.float32}


def new_tensor(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor. On the CPU, large ones come from numpy, which asks
    for transparent huge pages (``madvise``): the first touch of a fresh 134 MB
    array faults 64 pages instead of 32,768 — ~10 ms instead of ~90 ms here, where
    page faults are slow — and torch shares numpy's memory without a copy."""
    shape = tuple(int(s) for s in shape)
    if device.type == "cpu" and dtype in _NP and math.prod(shape) * dtype.itemsize >= HUGE_ALLOC:
        return torch.from_numpy(np.empty(shape, _NP[dtype]))
    return torch.empty(shape, dtype=dtype, device=device)


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if contiguous, else a contiguous copy (allocated by :func:`new_tensor`)."""
    if x.is_contiguous():
        return x
    out = new_tensor(x.shape, x.dtype, x.device)
    out.copy_(x)
    return out


def converted(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as ``dtype`` (exact for residues: integers below 2^53), same shape, one pass."""
    if x.dtype == dtype:
        return x
    out = new_tensor(x.shape, dtype, x.device)
    out.copy_(x)
    return out


#: graphs whose largest value holds fewer elements are evaluated on one torch thread
SMALL_EVAL = 1 << 17


def all_small(graphs: Sequence[KernelGraph]) -> bool:
    """Does every graph's largest value stay below :data:`SMALL_EVAL` elements?"""
    return all(largest_value(g)[0] < SMALL_EVAL for g in graphs)


@contextmanager
def eval_threads(*graphs: KernelGraph):
    """Torch on one thread while every graph is small (:data:`SMALL_EVAL`): a test
    there is a few hundred small ops, and waking a second thread for each costs more
    than the op — far more when another process holds the other core (a float check
    at the search's small shapes: 30 ms on one thread, 0.3–1.5 s on two)."""
    small = all_small(graphs)
    threads = torch.get_num_threads()
    if not small or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


#: glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_HEAP_LOCK = threading.Lock()
_heap_depth = 0


@lru_cache(maxsize=1)
def _glibc():
    """glibc (for ``mallopt``/``malloc_trim``), or None on another C library."""
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextmanager
def reuse_memory(*graphs: KernelGraph):
    """Keep freed memory for reuse while a verification runs (glibc only; elsewhere
    nothing changes).

    A test allocates and frees arrays of up to hundreds of MB, op after op. glibc
    serves each allocation over 32 MB with a fresh ``mmap`` and returns it on free, so
    every op pays page faults on fresh memory — here 2.8 μs per 4 KiB page: 45 ms for
    a 134 MB result whose computation takes 10 ms. Inside this scope ``mmap`` is off
    and the heap is not trimmed, so freed blocks are reused without a fault (an
    ``exp`` of 16.7M floats: 44 → 11 ms; a modular product: 213 → 38 ms). On leaving
    the outermost scope the free memory goes back to the system (``malloc_trim``) and
    the thresholds are set to the values glibc's own sliding thresholds reach under
    large allocations (mmap from 32 MB, trim above 64 MB). With ``graphs`` given and
    all of them small (:data:`SMALL_EVAL`), nothing changes: their arrays are below
    glibc's mmap threshold anyway, and the final trim would cost more than the test."""
    global _heap_depth
    libc = _glibc()
    if libc is None or (graphs and all_small(graphs)):
        yield
        return
    with _HEAP_LOCK:
        _heap_depth += 1
        if _heap_depth == 1:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    try:
        yield
    finally:
        with _HEAP_LOCK:
            _heap_depth -= 1
            if _heap_depth == 0:
                libc.mallopt(_M_MMAP_MAX, 65536)
                libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
                libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
                libc.malloc_trim(0)


_SCRATCH = threading.local()
#: CPU scratch buffers of this many bytes are kept per thread and reused
SCRATCH_MIN, SCRATCH_MAX = 1 << 20, 1 << 28


def scratch(name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch tensor that this thread's next call with the same name reuses.

    Fresh memory is paid for at first touch, so the GEMM outputs and temporaries
    of :func:`matmul_mod` — dead once it returns — live here on the CPU (CUDA's
    caching allocator already reuses its blocks)."""
    n = math.prod(int(s) for s in shape)
    size = n * dtype.itemsize
    if device.type != "cpu" or size > SCRATCH_MAX or size < SCRATCH_MIN:
        return new_tensor(shape, dtype, device)
    bufs = _SCRATCH.__dict__.setdefault("bufs", {})
    buf = bufs.get((name, dtype))
    if buf is None or buf.numel() < n:
        buf = bufs[(name, dtype)] = new_tensor((n,), dtype, device)
    return buf[:n].view(tuple(int(s) for s in shape))


# ----------------------------------------------------------------------------- array helpers


def numpy_io(fn):
    """Let an array helper take numpy arrays too: they are wrapped as CPU tensors
    (no copy) and the result comes back as a numpy array (cross-checks and scripts
    hold numpy arrays; the verifier itself passes tensors)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not any(isinstance(a, np.ndarray) for a in args):
            return fn(*args, **kwargs)
        out = fn(*(torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in args),
                 **kwargs)
        return out.cpu().numpy()
    return wrapper



#: CPU tensors with fewer elements than this are exponentiated in numpy (:func:`pow_fixed`)
SMALL_POW = 1 << 15


def mulmod(x: torch.Tensor, y: torch.Tensor | int, m: int) -> torch.Tensor:
    """``x·y mod m`` element-wise (broadcasting), into a fresh int64 tensor."""
    shape = broadcast_shapes(x.shape, y.shape) if isinstance(y, torch.Tensor) else x.shape
    out = new_tensor(shape, torch.int64, x.device)
    torch.mul(x, y, out=out)
    return out.remainder_(m)


def _square_multiply(base, e: int, m: int, copy):
    """``base ** e mod m`` element-wise by square and multiply, squaring ``base`` in place:
    one loop for int64 numpy arrays and torch tensors of residues (every product below
    2^62). ``copy`` gives the result its own array; ``None`` when ``e`` is 0."""
    result = None
    while e:
        if e & 1:
            if result is None:
                result = copy(base)
            else:
                result *= base
                result %= m
        e >>= 1
        if e:
            base *= base
            base %= m
    return result


@numpy_io
def pow_fixed(x: torch.Tensor, e: int, m: int) -> torch.Tensor:
    """``x ** e mod m`` element-wise for a fixed exponent (square and multiply).

    About 1.5·log2(e) passes: for a small CPU tensor (a softmax's row sums) the
    per-op cost decides, so below :data:`SMALL_POW` elements the same integer
    arithmetic runs in numpy (~1 μs an op against torch's ~5–10 μs) — the same
    residues either way (exact int64 arithmetic, every product below 2^62)."""
    if x.device.type == "cpu" and x.numel() < SMALL_POW:
        base = np.asarray(np.remainder(x.to(torch.int64).numpy(), m), dtype=np.int64)
        result = _square_multiply(base, e, m, np.copy)
        return torch.from_numpy(np.ones_like(base) if result is None else result)
    base = new_tensor(x.shape, torch.int64, x.device)
    torch.remainder(x, m, out=base)
    result = _square_multiply(base, e, m, lambda b: new_tensor(b.shape, torch.int64, b.device).copy_(b))
    return torch.ones_like(base) if result is None else result


@numpy_io
def inverse(x: torch.Tensor, m: int) -> torch.Tensor:
    """Modular inverse by Fermat (m prime); the caller has checked x has no zero."""
    return pow_fixed(x, m - 2, m)


class PowTable:
    """``ω^k mod p`` for tensor exponents ``k`` in ``[0, q)`` by two table lookups.

    The exponent is split into 15-bit windows: ``ω^k = T0[k & 0x7fff] · T1[k >> 15]``
    (q < 2^30) — one modular product per element instead of thirty. The tables
    (2^15 entries, 256 KiB each: they stay in cache) are built by doubling,
    ``T[2^j + i] = T[i] · step^(2^j)``, in fifteen vectorized steps, on the device."""

    BITS = 15

    def __init__(self, omega: int, p: int, q: int, device: torch.device | str = "cpu") -> None:
        self.p = p
        dev = torch.device(device)
        nbits = max(1, (q - 1).bit_length())
        self.bits = min(self.BITS, nbits)
        self.windows = -(-nbits // self.bits)
        # built in numpy (cheap small ops), one row a window, then moved to the device; on the
        # CPU the rows themselves are the tables, and the fused lookup reads the whole array
        stacked = np.empty((self.windows, 1 << self.bits), dtype=np.int64)
        for w, t in enumerate(stacked):
            step = pow(omega, 1 << (self.bits * w), p)  # T[i] = step^i
            t[0] = 1
            for j in range(self.bits):  # T[2^j + i] = T[i] · step^(2^j), written in place
                n = 1 << j
                np.multiply(t[:n], pow(step, n, p), out=t[n:2 * n])
                np.remainder(t[n:2 * n], p, out=t[n:2 * n])
        self.tables = [torch.from_numpy(t).to(dev) for t in stacked]
        self.stacked = stacked if dev.type == "cpu" else None

    def __call__(self, k: torch.Tensor, floats: bool = False) -> torch.Tensor:
        """``ω^k`` (flat); ``floats``: as exact float64 where that costs nothing (the fused
        CPU loop writes either), for a result that enters a GEMM — else int64."""
        if isinstance(k, np.ndarray):
            return self(torch.from_numpy(np.ascontiguousarray(k, dtype=np.int64))).view(k.shape).numpy()
        k = contiguous(k).view(-1)
        if self.stacked is not None and fused.available(k):
            out = new_tensor(k.shape, torch.float64 if floats else torch.int64, k.device)
            return fused.pow_lookup(k, self.stacked, self.bits, self.p, out)
        out = new_tensor(k.shape, torch.int64, k.device)
        mask = (1 << self.bits) - 1
        idx = scratch("pow-idx", k.shape, torch.int64, k.device)
        torch.bitwise_and(k, mask, out=idx)
        torch.index_select(self.tables[0], 0, idx, out=out)
        if self.windows > 1:
            tmp = scratch("pow-tmp", k.shape, torch.int64, k.device)
            for w in range(1, self.windows):
                torch.bitwise_right_shift(k, self.bits * w, out=idx)
                if w + 1 < self.windows:
                    idx.bitwise_and_(mask)
                torch.index_select(self.tables[w], 0, idx, out=tmp)
                out.mul_(tmp).remainder_(self.p)
        return out


@lru_cache(maxsize=8)
def pow_table(omega: int, p: int, q: int, device: torch.device) -> PowTable:
    """:class:`PowTable`, kept for the last few (ω, p, q): a fingerprint's fixed draw
    builds its tables once per process, not once per graph."""
    return PowTable(omega, p, q, device)


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


def _gemm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Batched float64 GEMM. On the CPU, large products write into a scratch buffer
    and small ones run on one thread (thread start-up costs 10× the work there, and
    more when another process holds the other cores)."""
    if x.device.type != "cpu":
        return torch.matmul(x, y)
    if x.shape[0] * x.shape[1] * x.shape[2] * y.shape[2] >= SMALL_GEMM:
        out = scratch("gemm", (x.shape[0], x.shape[1], y.shape[2]), torch.float64, x.device)
        return torch.matmul(x, y, out=out)
    threads = torch.get_num_threads()
    if threads == 1:
        return torch.matmul(x, y)
    torch.set_num_threads(1)
    try:
        return torch.matmul(x, y)
    finally:
        torch.set_num_threads(threads)


def _reshape(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``x.reshape(shape)``, a view where possible, else a copy made by :func:`contiguous`."""
    try:
        return x.view(tuple(shape))
    except RuntimeError:
        return contiguous(x).view(tuple(shape))


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
    c = _gemm(_reshape(x, (tb, pa * M, K)), _reshape(y, (tb, K, pb * N)))
    labels = both + only_a + ["M"] + only_b + ["N"]
    shape = [a.shape[i] for i in both] + [a.shape[i] for i in only_a] + [M] + [b.shape[i] for i in only_b] + [N]
    return c, labels, shape


def _unbroadcast(x: torch.Tensor, nb: int) -> torch.Tensor:
    """Cut batch axes that are broadcast (stride 0) down to size 1: the GEMM
    broadcasts them again, without materializing the copies."""
    if all(x.stride(i) or x.shape[i] == 1 for i in range(nb)):
        return x
    return x[tuple(slice(0, 1) if i < nb and x.stride(i) == 0 else slice(None) for i in range(x.dim()))]


def _limbs(x: torch.Tensor, L: int, w: int, axis: int) -> torch.Tensor:
    """The ``L`` limbs of ``w`` bits of residues ``x`` (int64 or exact float64), side
    by side along ``axis`` (-2: rows, -1: columns), as float64 for the GEMM."""
    xi = converted(x, torch.int64)
    mask = (1 << w) - 1
    shape = list(x.shape)
    shape[axis] *= L
    out = new_tensor(shape, torch.float64, x.device)
    n = x.shape[axis]
    tmp = new_tensor(x.shape, torch.int64, x.device)
    for l in range(L):
        torch.bitwise_right_shift(xi, w * l, out=tmp)
        tmp.bitwise_and_(mask)
        out.narrow(axis, l * n, n).copy_(tmp)
    return out


@numpy_io
def matmul_mod(a: torch.Tensor, b: torch.Tensor, m: int) -> torch.Tensor:
    """Exact ``a @ b mod m`` (numpy batch broadcasting, operands of rank ≥ 2) through
    float64 GEMMs, on the operands' device.

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
    Returns a fresh int64 tensor.
    """
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"matmul: operands of rank >= 2 expected, got {tuple(a.shape)} @ {tuple(b.shape)}")
    K = a.shape[-1]
    if b.shape[-2] != K:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not match")
    L, w = limb_plan(K, m)
    if L == 0:  # reduction too long: split K in halves
        h = K // 2
        out = matmul_mod(a[..., :h], b[..., :h, :], m)
        out += matmul_mod(a[..., h:], b[..., h:, :], m)
        return out.remainder_(m)
    assert K * ((1 << w) - 1) * (m - 1) < FLOAT_EXACT
    nd = max(a.dim(), b.dim())
    a = a.reshape((1,) * (nd - a.dim()) + tuple(a.shape))
    b = b.reshape((1,) * (nd - b.dim()) + tuple(b.shape))
    batch = []
    for sa, sb in zip(a.shape[:-2], b.shape[:-2]):
        if sa != sb and 1 not in (sa, sb):
            raise ValueError(f"matmul: batch shapes {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} do not broadcast")
        batch.append(max(sa, sb))
    a, b = _unbroadcast(a, nd - 2), _unbroadcast(b, nd - 2)
    split_a = a.numel() <= b.numel()
    M, N = a.shape[-2], b.shape[-1]
    if L == 1:
        x, y = converted(a, torch.float64), converted(b, torch.float64)
    else:  # limbs of the smaller operand side by side along its free dim: rows (L, M) or columns (L, N)
        limbs = _limbs(a if split_a else b, L, w, -2 if split_a else -1)
        x, y = (limbs, converted(b, torch.float64)) if split_a else (converted(a, torch.float64), limbs)
    c, labels, shape = _folded_matmul(x, y)
    at = labels.index("M" if split_a else "N")  # split that free dim into (limb, dim)
    labels[at:at + 1], shape[at:at + 1] = ["L", labels[at]], [L, M if split_a else N]
    for i in range(nd - 2):  # batch axes of size 1 in both operands
        if i not in labels:
            labels.append(i)
            shape.append(1)
    order = [labels.index(x) for x in ["L", *range(nd - 2), "M", "N"]]
    if m >= 8 and fused.available(c):  # one pass in the GEMM's own layout, then one reorder if needed
        X, Y = math.prod(shape[:at]), math.prod(shape[at + 1:])
        keep = [i - (i > at) for i in order[1:]]  # the result's axes in the GEMM's layout without L
        same = keep == sorted(keep)
        # the result's own memory when no reorder follows, else a scratch buffer copied out of
        acc = new_tensor((X, Y), torch.int64, c.device) if same else scratch("limb-acc", (X, Y), torch.int64, c.device)
        fused.combine_limbs(c.view(X, L, Y), w, m, acc)
        acc = acc.view(shape[:at] + shape[at + 1:]).permute(keep)
        if not same:
            acc = contiguous(acc)
    else:
        acc = _combine_limbs(c.reshape(shape).permute(order), L, w, m)
    shape = tuple(batch) + (a.shape[-2], b.shape[-1])
    return acc if tuple(acc.shape) == shape else contiguous(acc.expand(shape))


def _combine_limbs(prod: torch.Tensor, L: int, w: int, m: int) -> torch.Tensor:
    """Horner's rule over the limbs' products ``prod`` (limb, batch..., M, N) in int64,
    ``acc ← ((acc·2^w) + P_l) mod m`` (the torch version of :func:`verify.fused.combine_limbs`),
    gathered into (batch..., M, N) order by the first cast; a fresh tensor."""
    acc = new_tensor(prod.shape[1:], torch.int64, prod.device)  # the result: fresh memory
    acc.copy_(prod[L - 1])
    acc.remainder_(m)
    if L > 1:
        tmp = scratch("limb", acc.shape, torch.int64, acc.device)
    for l in range(L - 2, -1, -1):  # Horner: acc·2^w + P_l < 2^(31+w) + 2^53
        acc.bitwise_left_shift_(w)
        tmp.copy_(prod[l])  # exact: P_l is an integer < 2^53
        acc.add_(tmp)
        acc.remainder_(m)
    return acc


# ----------------------------------------------------------------------------- parts on demand


class Part:
    """One residue tensor of a field value (its value mod p, or mod q), computed
    when first needed.

    ``fn`` computes it from ``deps`` (other parts, computed before it); a *view*
    part (``view`` set) is a reshape/permute/broadcast of its one dep, taken of
    whichever dtype the caller asks for, so converting a float64 input to int64
    happens once, on the input, not once per view. :meth:`FieldAlgebra.realize`
    computes parts in creation order (every dep first) and releases each after
    its last reader."""

    __slots__ = ("shape", "fn", "deps", "view", "val", "alt", "order", "done")

    def __init__(self, shape, fn: Callable[[], torch.Tensor] | None = None, deps: tuple = (),
                 value: torch.Tensor | None = None, view: Callable | None = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.fn, self.deps, self.view = fn, deps, view
        self.val = value  # as computed (int64, or float64 for drawn inputs)
        self.alt = None  # the other dtype, once asked for
        self.order = -1
        self.done = value is not None

    def any(self) -> torch.Tensor:
        """The residues, int64 or exact float64 (whatever they were computed as)."""
        if not self.done:
            self.compute()
        return self.val

    def ints(self) -> torch.Tensor:
        return self._as(torch.int64)

    def floats(self) -> torch.Tensor:
        return self._as(torch.float64)

    def _as(self, dtype: torch.dtype) -> torch.Tensor:
        v = self.any()
        if v.dtype == dtype:
            return v
        if self.alt is None:
            self.alt = self.view(self.deps[0]._as(dtype)) if self.view is not None else converted(v, dtype)
        return self.alt

    def compute(self) -> None:
        if self.view is not None:
            self.val = self.view(self.deps[0].any())
        else:
            self.val = self.fn()
        self.done = True

    def release(self) -> None:
        """Drop the tensors (the part is not read again)."""
        self.val = self.alt = None
        self.fn = None


class FieldInput:
    """An input handed to :func:`mugraph.evaluate` for the field algebra: the two
    residue tensors of one input (it has the ``shape`` the interpreter checks).

    ``xq`` may be a function that draws the q-part when a computation first reads
    it (:mod:`verify.equivalence` draws parts on demand), or None: no q-part."""

    __slots__ = ("xp", "xq", "shape")

    def __init__(self, xp: torch.Tensor | np.ndarray, xq) -> None:
        self.xp = torch.from_numpy(xp) if isinstance(xp, np.ndarray) else xp
        self.xq = torch.from_numpy(xq) if isinstance(xq, np.ndarray) else xq
        self.shape = tuple(self.xp.shape)


def _matmul_shape(a: tuple, b: tuple) -> tuple:
    lead = tuple(broadcast_shapes(a[:-2], b[:-2]))
    return lead + (a[-2], b[-1])


def _dim(d: int, nd: int) -> int:
    return d + nd if d < 0 else d


class FieldAlgebra(Algebra):
    """The (mod p, mod q) algebra of docs/design.md §4.1 for :func:`mugraph.evaluate`.

    | op | p-part | q-part |
    |---|---|---|
    | add, sub, mul, sum, matmul, constants | mod p | mod q |
    | div | ``x_p·y_p⁻¹`` | ``x_q·y_q⁻¹`` |
    | exp | ``ω^(x_q)`` | undefined |
    | silu | ``x_p·(1 + ω^(−x_q))⁻¹`` | undefined |
    | sqrt | ``x_p^((p+1)/4)`` | ``x_q^((q+1)/4)`` |

    A zero divisor raises :class:`ZeroDivisorDraw` (the draw failed) when the part
    that divides is computed; ``1 + ω^k`` is never zero because ω has odd order q,
    so silu never fails a draw.

    Values are tuples of :class:`Part` s. With ``deferred=False`` (the default)
    :meth:`output` computes each output as :func:`mugraph.evaluate` returns it (int64
    tensors); with ``deferred=True`` it returns the parts, and :meth:`realize` computes
    all outputs at once — each intermediate then lives only until its last reader.
    """

    name = "field"

    def __init__(self, fld: Field, omega: int, device: str | torch.device = "cpu", *,
                 deferred: bool = False, free: np.random.Generator | None = None,
                 stop_at: float | None = None) -> None:
        self.field = fld
        #: a :func:`time.monotonic` time after which :meth:`realize` computes no further
        #: part and raises :class:`EvaluationStopped` (None: never). A search's fingerprint at
        #: a large shape is many parts of hundreds of MB each (a 14336 × 4096 weight: 0.2 s
        #: a copy, one candidate 2 s on a core, more with 15 processes sharing the memory):
        #: checked only between candidates, its workers ran seconds past their deadline,
        #: into the time kept for verifying what they had found
        self.stop_at = stop_at
        #: where a ``max`` (a free shift, docs/design.md §3.3) draws its fresh values; None:
        #: a max has no field meaning here
        self.free = free
        self.omega = omega
        self.device = torch.device(device)
        self.deferred = deferred
        self._pow_omega: PowTable | None = None
        p, q = fld.p, fld.q
        self.moduli = (p, q)
        self.parts: list[Part] = []

    @property
    def pow_omega(self) -> PowTable:
        """``k ↦ ω^k``, built on first use (exp-free graphs never pay for the tables)."""
        if self._pow_omega is None:
            self._pow_omega = pow_table(self.omega, self.field.p, self.field.q, self.device)
        return self._pow_omega

    # -- parts
    def _part(self, shape, fn, deps) -> Part:
        part = Part(shape, fn, tuple(deps))
        part.order = len(self.parts)
        self.parts.append(part)
        return part

    def _view(self, x: Part, shape, fn) -> Part:
        part = Part(shape, view=fn, deps=(x,))
        part.order = len(self.parts)
        self.parts.append(part)
        return part

    def realize(self, values: Sequence[tuple], parts: int | None = None, release: bool = False) -> list[tuple]:
        """Compute the outputs ``values`` (tuples of parts; only the first ``parts`` of
        each when given): each needed part once, in evaluation order. Returns tuples of
        int64 tensors (canonical residues). ``release``: drop each intermediate after
        its last reader among these outputs — for the one call that computes every
        output of an evaluation (a later call could not read them again)."""
        wanted = [v[:parts] if parts is not None else v for v in values]
        need: set[int] = set()
        last: dict[int, int] = {}
        stack = [p for v in wanted for p in v]
        keep = set()  # the outputs, and the bases they are views of (read when converted at the end)
        for p in stack:
            while p is not None:
                keep.add(id(p))
                p = p.deps[0] if p.view is not None else None
        while stack:
            p = stack.pop()
            if id(p) in need or p.done:
                continue
            need.add(id(p))
            for d in p.deps:
                stack.append(d)
                # a view reads its base whenever it is read: its readers are the base's readers too
                while d is not None:
                    last[id(d)] = max(last.get(id(d), -1), p.order)
                    d = d.deps[0] if d.view is not None else None
        for p in self.parts:
            if id(p) not in need or p.done:
                continue
            if self.stop_at is not None and time.monotonic() > self.stop_at:
                raise EvaluationStopped("the evaluation's deadline passed")
            p.compute()
            for d in p.deps if release else ():
                if last.get(id(d)) == p.order and id(d) not in keep and d.order >= 0 and id(d) in need:
                    d.release()
        return [tuple(p.ints() for p in v) for v in wanted]

    # -- structure: values may have one or two parts; combine on the common ones
    def shape(self, v) -> tuple[int, ...]:
        return v[0].shape

    def reshape(self, v, shape):
        shape = tuple(int(s) for s in shape)
        return tuple(self._view(x, shape, lambda t, s=shape: _reshape(t, s)) for x in v)

    def permute(self, v, perm):
        perm = tuple(perm)
        shape = tuple(v[0].shape[i] for i in perm)
        return tuple(self._view(x, shape, lambda t: t.permute(perm)) for x in v)

    def expand(self, v, shape):
        shape = tuple(int(s) for s in shape)
        return tuple(self._view(x, shape, lambda t: t.expand(shape)) for x in v)

    def window(self, v, at: dict):
        """A slice's window of each residue tensor: a view (selection is exact in any ring)."""
        idx = window(at)
        shape = list(v[0].shape)
        shape[at["dim"]] = len(range(at["start"], at["end"], at["step"]))
        return tuple(self._view(x, tuple(shape), lambda t: t[idx]) for x in v)

    def concat(self, vs, axis: int):
        n = min(len(v) for v in vs)
        nd = len(vs[0][0].shape)
        ax = _dim(axis, nd)
        shape = list(vs[0][0].shape)
        shape[ax] = sum(v[0].shape[ax] for v in vs)

        def cat(i):
            ts = [v[i].any() for v in vs]
            if len({t.dtype for t in ts}) > 1:
                ts = [v[i].ints() for v in vs]
            return torch.cat(ts, ax)

        return tuple(self._part(shape, lambda i=i: cat(i), [v[i] for v in vs]) for i in range(n))

    def tile(self, v, reps):
        reps = tuple(int(r) for r in reps)
        s = v[0].shape
        s = (1,) * (len(reps) - len(s)) + tuple(s)
        r = (1,) * (len(s) - len(reps)) + reps
        shape = tuple(a * b for a, b in zip(s, r))
        return tuple(self._part(shape, lambda x=x: x.any().tile(reps), [x]) for x in v)

    def select(self, v, axis: int, index):
        """A computed part, not a view: the few picked entries are copied out of the
        base as they are (int64), so a sampled evaluation never converts the whole base."""
        idx = list(index)
        shape = list(v[0].shape)
        shape[axis] = len(idx)

        def take(x: Part) -> torch.Tensor:
            # slices of the (often permuted) base, copied once: index_select would first
            # make the whole base contiguous
            t = x.any()
            return torch.cat([t.narrow(axis, i, 1) for i in idx], axis)

        return tuple(self._part(shape, lambda x=x: take(x), [x]) for x in v)

    # -- semantics
    def input(self, name, value, shape, dtype):
        if not isinstance(value, FieldInput):
            raise TypeError(f"input {name!r}: the field algebra takes FieldInput values (use verify.draw_inputs)")
        xp = Part(value.shape, value=value.xp.to(self.device))
        if value.xq is None:
            return (xp,)
        if callable(value.xq):
            xq = self._part(value.shape, lambda: value.xq().to(self.device), ())
        else:
            xq = Part(value.shape, value=value.xq.to(self.device))
        return (xp, xq)

    def output(self, v, as_torch):
        return v if self.deferred else self.realize([v])[0]

    def apply(self, kind, inputs, attrs):
        """An op on field values; on plain residue arrays (tuples of numpy arrays or
        tensors, as a script or a cross-check holds them) it computes at once and
        returns arrays of the same kind."""
        if all(isinstance(x, Part) for v in inputs for x in v):
            return super().apply(kind, inputs, attrs)
        as_numpy = any(isinstance(x, np.ndarray) for v in inputs for x in v)
        parts = [tuple(Part(x.shape, value=(torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray)
                                            else x).to(self.device)) for x in v) for v in inputs]
        (out,) = self.realize([super().apply(kind, parts, attrs)])
        return tuple(x.cpu().numpy() for x in out) if as_numpy else out

    def accumulate(self, v, axis):
        nd = len(v[0].shape)
        ax = _dim(axis, nd)
        shape = tuple(1 if i == ax else s for i, s in enumerate(v[0].shape))
        return tuple(self._part(shape, lambda x=x, m=m: _summod(x, ax, m), [x]) for x, m in zip(v, self.moduli))

    def _matmul(self, xs, at):
        x, y = xs
        shape = _matmul_shape(x[0].shape, y[0].shape)
        # the larger operand enters the GEMM whole, as float64: convert it once per part
        a_large = math.prod(x[0].shape) > math.prod(y[0].shape)

        def mm(a: Part, b: Part, m: int) -> torch.Tensor:
            return matmul_mod(a.floats() if a_large else a.any(), b.any() if a_large else b.floats(), m)

        return tuple(self._part(shape, lambda a=a, b=b, m=m: mm(a, b, m), [a, b])
                     for a, b, m in zip(x, y, self.moduli))

    def _div(self, xs, at):
        x, y = xs
        shape = tuple(broadcast_shapes(x[0].shape, y[0].shape))

        def div(a: Part, b: Part, m: int) -> torch.Tensor:
            d = b.ints()
            if not bool(d.all()):
                raise ZeroDivisorDraw(f"division by a value that is 0 mod {m} under this draw")
            return mulmod(a.ints(), inverse(d, m), m)

        return tuple(self._part(shape, lambda a=a, b=b, m=m: div(a, b, m), [a, b])
                     for a, b, m in zip(x, y, self.moduli))

    def _exp(self, xs, at):
        (x,) = xs
        if len(x) < 2:
            raise NotLaxError("exp: its argument already contains an exponentiation (exp/silu); "
                              "a second one on a path is not Lax")
        # floats: an exp's result usually enters a matmul (attention's E @ V) or a sum
        return (self._part(x[0].shape, lambda: self.pow_omega(x[1].ints(), floats=True).view(x[0].shape), [x[1]]),)

    def _silu(self, xs, at):
        (x,) = xs
        if len(x) < 2:
            raise NotLaxError("silu: its argument already contains an exponentiation (exp/silu); "
                              "a second one on a path is not Lax")
        p, q = self.moduli

        def silu() -> torch.Tensor:
            e = self.pow_omega(torch.remainder(q - x[1].ints(), q)).view(x[0].shape)  # ω^(−x_q)
            e.add_(1).remainder_(p)
            return mulmod(x[0].ints(), inverse(e, p), p)

        return (self._part(x[0].shape, silu, [x[0], x[1]]),)

    def _sqrt(self, xs, at):
        (x,) = xs
        for m in self.moduli[:len(x)]:
            if m % 4 != 3:
                raise FieldError(f"sqrt needs a prime ≡ 3 (mod 4); {m} is not")
        return tuple(self._part(a.shape, lambda a=a, m=m: pow_fixed(a.ints(), (m + 1) // 4, m), [a])
                     for a, m in zip(x, self.moduli))

    def _scale(self, xs, at):
        (x,) = xs
        cs = [const_mod(at["c"], m) for m in self.moduli[:len(x)]]
        return tuple(self._part(a.shape, lambda a=a, c=c, m=m: mulmod(a.ints(), c, m), [a])
                     for a, c, m in zip(x, cs, self.moduli))

    def _const(self, xs, at):
        shape = tuple(at["shape"])
        cs = [const_mod(at["value"], m) for m in self.moduli]
        return tuple(self._part(shape, lambda c=c: torch.full(shape, c, dtype=torch.int64, device=self.device), ())
                     for c in cs)

    def _sum(self, xs, at):
        (x,) = xs
        return self.accumulate(x, at["dim"])

    def _repeat(self, xs, at):
        return self.tile(xs[0], at["reps"])

    def _max(self, xs, at):
        """A *free shift* (docs/design.md §3.3): a fresh uniform value per element, mod p and
        mod q — the comparison then holds for every value the max could take, the true
        maximum among them."""
        if self.free is None:
            raise NotLaxError("max: has no finite-field meaning without free draws (verify.equivalent gives them)")
        (x,) = xs
        shape = tuple(1 if i == at["dim"] else s for i, s in enumerate(x[0].shape))
        return tuple(Part(shape, value=torch.from_numpy(uniform_residues(self.free, m, shape, np.float64))
                          .to(self.device)) for m in self.moduli)


def unary_row(fn):
    """A field row of an element-wise unary op: ``fn(a, m)`` on each part's residues."""
    def row(alg: FieldAlgebra, xs, at):
        (x,) = xs
        return tuple(alg._part(x[0].shape, lambda a=a, m=m: fn(a.ints(), m), [a]) for a, m in zip(x, alg.moduli))
    return row


def binary_row(fn):
    """A field row of an element-wise binary op: ``fn(a, b, m)`` on each part's residues."""
    def row(alg: FieldAlgebra, xs, at):
        x, y = xs
        shape = tuple(broadcast_shapes(x[0].shape, y[0].shape))
        return tuple(alg._part(shape, lambda a=a, b=b, m=m: fn(a.ints(), b.ints(), m), [a, b])
                     for a, b, m in zip(x, y, alg.moduli))
    return row


#: field evaluation: op name -> row(algebra, inputs, attrs) (ops outside the field's class raise)
FIELD_OPS: dict[str, Callable] = {
    "matmul": FieldAlgebra._matmul,
    "add": binary_row(lambda x, y, m: _addmod(x, y, m)),
    "sub": binary_row(lambda x, y, m: _submod(x, y, m)),
    "mul": binary_row(lambda x, y, m: mulmod(x, y, m)),
    "div": FieldAlgebra._div,
    "exp": FieldAlgebra._exp,
    "silu": FieldAlgebra._silu,
    "sqrt": FieldAlgebra._sqrt,
    "square": unary_row(lambda x, m: mulmod(x, x, m)),
    "scale": FieldAlgebra._scale,
    "const": FieldAlgebra._const,
    "sum": FieldAlgebra._sum,
    "max": FieldAlgebra._max,
    "concat": lambda alg, xs, at: alg.concat(xs, at["dim"]),
    "reshape": lambda alg, xs, at: alg.reshape(xs[0], at["shape"]),
    "repeat": FieldAlgebra._repeat,
    "permute": lambda alg, xs, at: alg.permute(xs[0], at["perm"]),
    "slice": lambda alg, xs, at: alg.window(xs[0], at),
}
FieldAlgebra.ops = FIELD_OPS


def _addmod(x: torch.Tensor, y: torch.Tensor, m: int) -> torch.Tensor:
    out = new_tensor(broadcast_shapes(x.shape, y.shape), torch.int64, x.device)
    torch.add(x, y, out=out)
    return out.remainder_(m)


def _submod(x: torch.Tensor, y: torch.Tensor, m: int) -> torch.Tensor:
    out = new_tensor(broadcast_shapes(x.shape, y.shape), torch.int64, x.device)
    torch.sub(x, y, out=out)
    return out.remainder_(m)  # remainder takes the divisor's sign: [0, m)


def _summod(x: Part, axis: int, m: int) -> torch.Tensor:
    v = x.any()
    # float64 residues (a drawn input) sum exactly while the sum stays below 2^53
    if v.dtype == torch.float64 and v.shape[axis] * (m - 1) >= FLOAT_EXACT:
        v = x.ints()
    s = v.sum(dim=axis, keepdim=True)
    return converted(s, torch.int64).remainder_(m) if s.dtype != torch.int64 else s.remainder_(m)


# ----------------------------------------------------------------------------- draws


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
    if n >= LARGE_DRAW and int(mask) < 2**31 and np.dtype(dtype) in _TORCH_DTYPE:  # by torch: LARGE_DRAW
        return torch.from_numpy(u.view(np.int32)).to(_TORCH_DTYPE[np.dtype(dtype)]).numpy().reshape(shape)
    return u.astype(dtype).reshape(shape)


#: draws of at least this many entries are converted to their dtype by torch, not numpy: the
#: values are the same, but torch's allocator backs a large tensor with huge pages where
#: numpy's array is faulted in 4 KiB pages: four 4096 × 14336 float64 draws, each kept (as the
#: fingerprint's fixed draws are), took 3.6–3.9 s through numpy and 1.0–1.4 s through torch on
#: a 2-core machine — a gated 4096 → 2 × 14336 projection draws four such before its search's
#: first fingerprint
LARGE_DRAW = 1 << 20
_TORCH_DTYPE = {np.dtype(np.float64): torch.float64, np.dtype(np.int64): torch.int64}


def draw_inputs(specs: list[tuple[str, tuple[int, ...], bool]], fld: Field,
                rng: np.random.Generator, device: str | torch.device = "cpu") -> dict[str, FieldInput]:
    """Independent uniform residues mod p (and mod q where ``need_q``) for each
    ``(name, shape, need_q)``, drawn in the order given (callers sort by name).

    An input whose q-part can never reach an exponent gets none (saves a draw and
    the arithmetic on it); see :func:`verify.analysis.inputs_needing_q`.

    The residues are stored as float64 (exact: they are below 2**31): matmul, the
    bulk of the work at full size, then reads an input — or an iterator's view of
    it — without converting it; every other op converts the entries it needs to
    int64 first (once per input: :class:`Part`)."""
    dev = torch.device(device)
    out = {}
    for name, shape, need_q in specs:
        xp = torch.from_numpy(uniform_residues(rng, fld.p, shape, np.float64)).to(dev)
        xq = torch.from_numpy(uniform_residues(rng, fld.q, shape, np.float64)).to(dev) if need_q else None
        out[name] = FieldInput(xp, xq)
    return out
