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


#: tensors with fewer elements than this keep the torch path
MIN_ELEMENTS = 1 << 20
#: the compiled loops are called from one thread at a time (numba's fallback thread pool,
#: "workqueue", aborts on concurrent use; a search verifies on a warm-up thread too)
_LOCK = threading.Lock()


log = logging.getLogger("mugraph")


def available(*tensors: torch.Tensor) -> bool:
    """Should the fused loop handle these tensors? (numba present and working, on the
    CPU, and the first one large enough to pay for the call.)"""
    return (all(t.device.type == "cpu" for t in tensors)
            and tensors[0].numel() >= MIN_ELEMENTS and _loops() is not None and _works())


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


@lru_cache(maxsize=1)
def _loops():
    """:mod:`verify.fused_loops` (numba imported with it), or None where numba is missing."""
    try:  # numba is a dependency; a broken install only costs speed
        from . import fused_loops
    except ImportError:  # pragma: no cover - exercised only without numba
        return None
    return fused_loops


def _run(fn, *args):
    numba = _loops().numba
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
    loops = _loops()
    split_rows = X >= 8 * torch.get_num_threads() or X >= Y  # threads split the outer axis, else the inner
    _run(loops._combine_outer if split_rows else loops._combine_inner, c.numpy(), w, m, out.numpy())
    return out


def pow_lookup(k: torch.Tensor, tables: np.ndarray, bits: int, p: int, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = Π_w tables[w, window_w(k[i])] mod p`` — ``ω^k`` from per-window power
    tables (window ``w``: bits ``[w·bits, (w+1)·bits)`` of ``k``). ``k``: a contiguous
    int64 vector; ``out``: contiguous, int64 or float64 (exact: every value is below
    ``p < 2^31``); ``tables``: int64 ``(windows, 2^bits)``."""
    assert k.is_contiguous() and out.is_contiguous() and p < 1 << 31
    _run(_loops()._lookup, k.numpy(), tables, bits, p, out.numpy())
    return out


def saturate(x: torch.Tensor, out: torch.Tensor, lo: float, hi: float, zero: float, inf: float) -> torch.Tensor:
    """For ``out = exp(clamp(x, lo, hi))``: set the elements with ``x ≤ zero`` to 0 and
    those with ``x ≥ inf`` to infinity, in place; returns the flat indices of those
    strictly between (``zero < x < lo`` or ``hi < x < inf``: denormal results, the edge
    of overflow), whose ``out`` is still the clamped value — usually few or none.
    ``x``, ``out``: contiguous float tensors of one shape."""
    assert x.is_contiguous() and out.is_contiguous() and x.shape == out.shape
    edge = np.empty(x.numel(), dtype=np.bool_)
    n = _run(_loops()._saturate, x.view(-1).numpy(), out.view(-1).numpy(), lo, hi, zero, inf, edge)
    return torch.from_numpy(np.flatnonzero(edge) if n else np.empty(0, dtype=np.int64))
