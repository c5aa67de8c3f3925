"""Fused CPU loops for the verifier's largest element-wise passes (numba).

A field test of an attention at full shapes spends most of its time on two
element-wise steps over tensors of tens of millions of residues:

* recombining the limbs of an exact matmul (:func:`verify.field.matmul_mod`):
  ``acc ← ((acc·2^w) + P_l) mod m`` over ``L`` float64 GEMM outputs. As torch ops
  that is a cast, a remainder, a shift, another cast, an add and a remainder per
  limb — six passes over memory, two of them strided;
* ``ω^e`` by table lookup (:class:`verify.field.PowTable`): per window a shift, a
  mask, a gather, a product and a remainder;
* and in the float check, the saturation of ``exp`` (:func:`verify.floatcheck.exp`):
  which results are 0 or infinite, found in one pass instead of six.

Here each is one pass, on all of torch's threads. The reduction mod ``m`` uses a
float64 estimate of the quotient instead of an integer division (see
:func:`_reduce`). Nothing here is needed for correctness: without numba, on a GPU,
or for small tensors (where compiling or waking threads costs more) the torch
versions run, and the tests check both agree. The loops are compiled on first use and
checked against Python's integers (:func:`_works`); a numba that fails here is one
warning and the torch path."""

from __future__ import annotations

import logging
import threading
from functools import lru_cache

import numpy as np
import torch

try:  # numba is a dependency; a broken install only costs speed
    import numba
except ImportError:  # pragma: no cover - exercised only without numba
    numba = None

#: tensors with fewer elements than this keep the torch path
MIN_ELEMENTS = 1 << 20
#: the compiled loops are called from one thread at a time (numba's fallback thread pool,
#: "workqueue", aborts on concurrent use; a search verifies on a warm-up thread too)
_LOCK = threading.Lock()


log = logging.getLogger("mugraph")


def available(*tensors: torch.Tensor) -> bool:
    """Should the fused loop handle these tensors? (numba present and working, on the
    CPU, and the first one large enough to pay for the call.)"""
    return (numba is not None and all(t.device.type == "cpu" for t in tensors)
            and tensors[0].numel() >= MIN_ELEMENTS and _works())


@lru_cache(maxsize=1)
def _works() -> bool:
    """Compile and run every loop once on tiny inputs, checked against Python's integers:
    a numba that cannot compile here costs one warning and the torch path, never a verdict."""
    try:
        m, w = 2147471759, 16
        c = torch.tensor([[[float((1 << 53) - 1)], [float((1 << 53) - 3)]]], dtype=torch.float64)
        out = torch.empty((1, 1), dtype=torch.int64)
        combine_limbs(c, w, m, out)
        tables = np.array([[1, 3], [1, 9]], dtype=np.int64)
        got = torch.empty(2, dtype=torch.int64)
        pow_lookup(torch.tensor([3, 2], dtype=torch.int64), tables, 1, 11, got)
        x = torch.tensor([-200.0, -90.0, 0.5, 200.0], dtype=torch.float32)
        y = x.clamp(-80.0, 80.0).exp()
        edge = saturate(x, y, -80.0, 80.0, -104.0, 89.0)
        ok = (int(out) == ((((1 << 53) - 3) % m) * (1 << w) + (1 << 53) - 1) % m
              and got.tolist() == [27 % 11, 9] and edge.tolist() == [1] and float(y[0]) == 0.0
              and y[3].item() == float("inf"))
        if not ok:
            log.warning("mugraph verify: the fused CPU loops gave wrong values here; using torch ops")
        return bool(ok)
    except Exception as e:  # noqa: BLE001 — any failure of the optional fast path
        log.warning("mugraph verify: the fused CPU loops do not compile here (%s: %s); using torch ops",
                    type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
        return False


def _jit(**options):
    """``numba.njit`` that caches the machine code on disk where it can (a read-only
    install without a writable cache folder compiles in each process instead)."""
    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # numba: no locator available for the file
            return numba.njit(**options)(fn)
    return decorate


if numba is not None:

    @_jit(inline="always")
    def _reduce(r, m, inv):
        """``r mod m`` for ``0 ≤ r < 2^62`` with ``r/m < 2^50``. The quotient is estimated
        in float64: ``r``, ``1/m`` and their product each round with relative error
        ``2^-53``, so the estimate is off by less than ``3·2^-53·r/m < 1``, and truncating
        it gives the true quotient or one less or more; one correction step finishes.
        The callers stay far inside: Horner's rule has ``r < m·2^w + 2^53`` (``w ≤ 30``,
        ``m ≥ 8``: ``r/m < 2^30 + 2^50``), the lookup ``r < m²``."""
        r -= np.int64(np.float64(r) * inv) * m
        if r < 0:
            r += m
        elif r >= m:
            r -= m
        return r

    @_jit(inline="always")
    def _horner(c, x, y, w, m, inv):
        L = c.shape[1]
        r = _reduce(np.int64(c[x, L - 1, y]), m, inv)
        for l in range(L - 2, -1, -1):
            r = _reduce((r << w) + np.int64(c[x, l, y]), m, inv)
        return r

    @_jit(parallel=True)
    def _combine_outer(c, w, m, out):  # threads split the outer axis (many rows)
        X, _, Y = c.shape
        inv = 1.0 / m
        for x in numba.prange(X):
            for y in range(Y):
                out[x, y] = _horner(c, x, y, w, m, inv)

    @_jit(parallel=True)
    def _combine_inner(c, w, m, out):  # threads split the inner axis (few rows)
        X, _, Y = c.shape
        inv = 1.0 / m
        for x in range(X):
            for y in numba.prange(Y):
                out[x, y] = _horner(c, x, y, w, m, inv)

    @_jit(parallel=True)
    def _lookup(k, tables, bits, p, out):
        n = k.shape[0]
        windows = tables.shape[0]
        mask = (1 << bits) - 1
        inv = 1.0 / p
        for i in numba.prange(n):
            e = k[i]
            r = tables[0, e & mask]
            for w in range(1, windows):
                r = _reduce(r * tables[w, (e >> (bits * w)) & mask], p, inv)
            out[i] = r


    @_jit(parallel=True)
    def _saturate(x, out, lo, hi, zero, inf, edge):
        edges = 0
        for i in numba.prange(x.shape[0]):
            v = x[i]
            e = False
            if v < lo:
                if v <= zero:
                    out[i] = 0.0
                else:
                    e = True
            elif v > hi:
                if v >= inf:
                    out[i] = np.inf
                else:
                    e = True
            edge[i] = e
            edges += e
        return edges


def _run(fn, *args):
    with _LOCK:
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        return fn(*args)


def combine_limbs(c: torch.Tensor, w: int, m: int, out: torch.Tensor) -> torch.Tensor:
    """``out[x, y] = Σ_l c[x, l, y]·2^(w·l) mod m`` by Horner's rule, for ``c`` a
    contiguous float64 ``(X, L, Y)`` of exact integers ``< 2^53`` (limb products) and
    ``8 ≤ m < 2^31``: every intermediate ``< 2^(31+w) + 2^53 < 2^62``. ``out``: contiguous
    int64 ``(X, Y)``; returned."""
    assert c.is_contiguous() and out.is_contiguous() and c.dtype == torch.float64 and 8 <= m < 1 << 31 and w <= 30
    X, Y = out.shape
    _run(_combine_outer if X >= 8 * torch.get_num_threads() or X >= Y else _combine_inner, c.numpy(), w, m, out.numpy())
    return out


def pow_lookup(k: torch.Tensor, tables: np.ndarray, bits: int, p: int, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = Π_w tables[w, window_w(k[i])] mod p`` — ``ω^k`` from per-window power
    tables (window ``w``: bits ``[w·bits, (w+1)·bits)`` of ``k``). ``k``: a contiguous
    int64 vector; ``out``: contiguous, int64 or float64 (exact: every value is below
    ``p < 2^31``); ``tables``: int64 ``(windows, 2^bits)``."""
    assert k.is_contiguous() and out.is_contiguous() and p < 1 << 31
    _run(_lookup, k.numpy(), tables, bits, p, out.numpy())
    return out


def saturate(x: torch.Tensor, out: torch.Tensor, lo: float, hi: float, zero: float, inf: float) -> torch.Tensor:
    """For ``out = exp(clamp(x, lo, hi))``: set the elements with ``x ≤ zero`` to 0 and
    those with ``x ≥ inf`` to infinity, in place; returns the flat indices of those
    strictly between (``zero < x < lo`` or ``hi < x < inf``: denormal results, the edge
    of overflow), whose ``out`` is still the clamped value — usually few or none.
    ``x``, ``out``: contiguous float tensors of one shape."""
    assert x.is_contiguous() and out.is_contiguous() and x.shape == out.shape
    edge = np.empty(x.numel(), dtype=np.bool_)
    n = _run(_saturate, x.view(-1).numpy(), out.view(-1).numpy(), lo, hi, zero, inf, edge)
    return torch.from_numpy(np.flatnonzero(edge) if n else np.empty(0, dtype=np.int64))
