"""The numba loops behind :mod:`verify.fused` (imported on first use, see there).

Kept apart so that importing the verifier does not import numba: numba reads its thread
count (``NUMBA_NUM_THREADS``) once, when imported, and starts that many OpenMP threads at the
first parallel loop — even when asked to use fewer (``numba.set_num_threads`` masks them;
the rest still wake and spin). A search worker sets the variable to its share of the
cores before this module is imported (:func:`search.worker.share_cores`)."""

from __future__ import annotations

import numba
import numpy as np


def _jit(**options):
    """``numba.njit`` that caches the machine code on disk where it can (a read-only
    install without a writable cache folder compiles in each process instead)."""
    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # numba: no locator available for the file
            return numba.njit(**options)(fn)
    return decorate



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
