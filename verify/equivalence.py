"""Probabilistic equivalence of programs and μGraphs (DESIGN §4, Mirage §5).

:func:`equivalent` evaluates both graphs on the same random field inputs —
residues mod p outside exponents, mod q inside, a random ω of order q — and
compares their outputs exactly. Equivalent graphs always agree (no false
rejections); a non-equivalent pair agrees in one test with probability at most
the per-test bound of :mod:`verify.bound`, so the tests repeat (fresh inputs,
fresh ω) until the bound compounded over the tests reaches the requested error.
:func:`fingerprint` is one such evaluation on a fixed draw, hashed, for the
search to compare many candidates against the program cheaply.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

import mugraph as mg
from mugraph.errors import NotLaxError
from mugraph.ir import KernelGraph

from .analysis import check_compatible, inputs_needing_q, live_graph, op_kinds
from .bound import DegreeAlgebra, pair_bound, tests_needed
from .field import DEFAULT, Field, FieldAlgebra, FieldInput, ZeroDivisorDraw, draw_inputs, random_omega, \
    uniform_residues
from .floatcheck import float_check as run_float_check
from .verdict import Counterexample, Verdict

DEFAULT_ERROR = 2.0 ** -40
MAX_FAILED_DRAWS = 32


class _Shape:
    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)


def summarize(graph: KernelGraph, fld: Field = DEFAULT, salt: object = 0):
    """Degree summaries of ``graph``'s outputs and its zero-divisor risk
    (:class:`verify.bound.DegreeAlgebra`)."""
    alg = DegreeAlgebra(fld, salt)
    outs = mg.evaluate(graph, {t.name: _Shape(t.shape) for t in graph.inputs}, alg)
    return outs, alg


def per_test_bound(a: KernelGraph, b: KernelGraph, fld: Field = DEFAULT) -> tuple[float, bool]:
    """The probability bound for one test of ``a`` against ``b`` and whether it is
    heuristic (sqrt); see :mod:`verify.bound`."""
    oa, sa = summarize(live_graph(a), fld, "a")
    ob, sb = summarize(live_graph(b), fld, "b")
    return pair_bound(fld, oa, ob, sa.z + sb.z), sa.heuristic or sb.heuristic


def _specs(graph: KernelGraph, need_q: set[str]):
    return [(t.name, t.shape, t.name in need_q) for t in sorted(graph.inputs, key=lambda t: t.name)]


def _first_mismatch(oa: Sequence[tuple], ob: Sequence[tuple]) -> tuple[int, tuple, int, int, str] | None:
    for i, (x, y) in enumerate(zip(oa, ob)):
        parts = [("mod p", x[0], y[0])]
        if len(x) > 1 and len(y) > 1:
            parts.append(("mod q", x[1], y[1]))
        for label, u, v in parts:
            diff = u != v
            if diff.any():
                idx = tuple(int(j) for j in np.unravel_index(int(np.argmax(diff)), diff.shape))
                return i, idx, int(u[idx]), int(v[idx]), label
    return None


def field_test(a: KernelGraph, b: KernelGraph, *, rng: np.random.Generator, fld: Field = DEFAULT,
               need_q: set[str] | None = None, max_failed_draws: int = MAX_FAILED_DRAWS):
    """One field test: draw inputs and ω, evaluate both graphs, compare exactly.

    Returns ``(mismatch, failed_draws)``: ``mismatch`` is None when all outputs
    agree, else ``(output, index, value_a, value_b, part)``. A draw that meets a
    zero divisor is discarded and redrawn; after ``max_failed_draws`` in a row a
    :class:`~verify.field.ZeroDivisorDraw` says a divisor is (almost surely)
    identically zero."""
    specs = _specs(a, need_q if need_q is not None else inputs_needing_q(a) | inputs_needing_q(b))
    a, b = live_graph(a), live_graph(b)  # a zero divisor in dead code must not fail the draw
    failed = 0
    while True:
        alg = FieldAlgebra(fld, random_omega(fld, rng))
        ins = draw_inputs(specs, fld, rng)
        try:
            oa = mg.evaluate(a, ins, alg)
            ob = mg.evaluate(b, ins, alg)
        except ZeroDivisorDraw:
            failed += 1
            if failed >= max_failed_draws:
                raise ZeroDivisorDraw(
                    f"{a.name} vs {b.name}: {failed} draws in a row divided by zero: a divisor is "
                    "(almost surely) identically zero") from None
            continue
        return _first_mismatch(oa, ob), failed


def _float_values(a: KernelGraph, b: KernelGraph, output: int, index: tuple, seed: int):
    """The element ``index`` of ``output`` for both graphs in float64 on normal inputs."""
    try:
        g = torch.Generator().manual_seed(seed)
        ins = {t.name: torch.randn(t.shape, generator=g, dtype=torch.float64) * 0.5
               for t in sorted(a.inputs, key=lambda t: t.name)}
        with torch.no_grad():
            ra = mg.evaluate(a, ins)[output]
            rb = mg.evaluate(b, ins)[output]
        return float(ra[index]), float(rb[index])
    except Exception:  # a float view is a courtesy; never let it mask the verdict
        return None, None


def _notes(kinds: set[str], a: KernelGraph, b: KernelGraph) -> list[str]:
    notes = []
    if kinds & {"exp", "silu"}:
        notes.append("exp: the per-test bound for exponentials relies on the Li–Wu conjecture "
                     "(an uncertainty principle for the NTT over F_p; see verify.bound)")
    if "silu" in kinds:
        notes.append("silu is outside Mirage's Lax class as an op; its field meaning x·(1+ω^(−x))⁻¹ is that of "
                     "the Lax expression x/(1+exp(−x)), which the bound covers")
    if "sqrt" in kinds:
        notes.append("sqrt is outside the theorem's class: evaluated as the multiplicative map x^((m+1)/4) "
                     "(so sqrt(ab) = sqrt(a)·sqrt(b) holds, but sqrt(x)² = ±x); the bound is heuristic and a "
                     "mismatch through sqrt may be a false rejection")
    da = {t.dtype for t in a.inputs}
    db = {t.dtype for t in b.inputs}
    if da != db:
        notes.append(f"input dtypes differ ({sorted(da)} vs {sorted(db)}); the field test ignores dtypes")
    return notes


def equivalent(a: KernelGraph, b: KernelGraph, *, error: float = DEFAULT_ERROR, seed: int | None = None,
               field: Field = DEFAULT, max_tests: int = 128, float_check: bool = True,
               non_lax: str = "raise", max_failed_draws: int = MAX_FAILED_DRAWS,
               float_kwargs: dict | None = None) -> Verdict:
    """Decide whether ``a`` and ``b`` (programs or μGraphs, any mix) compute the
    same function, with false-accept probability at most ``error``.

    Runs independent field tests until the per-test bound (:mod:`verify.bound`)
    compounded is ≤ ``error`` (at most ``max_tests``; the verdict says when the
    bound was not reached), then — if ``float_check`` — the float check of ``b``
    against ``a``. ``seed`` makes the run reproducible (the verdict records the seed
    used). ``field`` picks the primes (:data:`verify.field.DEFAULT`,
    :data:`verify.field.MIRAGE` or any valid :class:`~verify.field.Field`).

    Non-Lax graphs raise :class:`~mugraph.errors.NotLaxError` naming the op, unless
    ``non_lax="float"``: then only the float check runs and the verdict says that
    equivalence is unproven. Graphs with different inputs or outputs raise
    :class:`~mugraph.errors.InputError`.
    """
    t0 = time.perf_counter()
    check_compatible(a, b)
    if non_lax not in ("raise", "float"):
        raise ValueError(f"non_lax must be 'raise' or 'float', got {non_lax!r}")
    if not 0 < error < 1:
        raise ValueError(f"error must be in (0, 1), got {error}")
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (1 << 63))
    try:
        mg.check_lax(a)
        mg.check_lax(b)
    except NotLaxError as e:
        if non_lax == "raise":
            raise
        report = run_float_check(a, b, seed=seed % (1 << 31), **(float_kwargs or {}))
        return Verdict(a.name, b.name, None, method="float-only", seed=seed, target_error=error,
                       float_check=report, seconds=time.perf_counter() - t0,
                       notes=[f"not Lax ({e}); EQUIVALENCE IS UNPROVEN: only a floating-point comparison ran"])

    kinds = op_kinds(a) | op_kinds(b)
    per_test, heuristic = per_test_bound(a, b, field)
    needed = tests_needed(per_test, error)
    n = max_tests if needed is None else min(needed, max_tests)
    rng = np.random.default_rng(seed)
    need_q = inputs_needing_q(a) | inputs_needing_q(b)
    a_live, b_live = live_graph(a), live_graph(b)
    v = Verdict(a.name, b.name, True, tests=0, per_test_bound=per_test, target_error=error,
                conjecture=bool(kinds & {"exp", "silu"}), heuristic=heuristic, p=field.p, q=field.q,
                seed=seed, notes=_notes(kinds, a, b))
    for i in range(n):
        mismatch, failed = field_test(a_live, b_live, rng=rng, fld=field, need_q=need_q,
                                      max_failed_draws=max_failed_draws)
        v.failed_draws += failed
        v.tests = i + 1
        if mismatch is not None:
            out, idx, va, vb, part = mismatch
            fa, fb = _float_values(a, b, out, idx, seed % (1 << 31))
            v.equivalent = False
            v.counterexample = Counterexample(out, idx, va, vb, part, i + 1, fa, fb)
            break
    if v.equivalent:
        v.error_bound = per_test ** v.tests
        v.bound_met = v.error_bound <= error
        if not v.bound_met:
            v.notes.append(f"the per-test bound {per_test:.3g} is too weak to reach {error:.3g} in "
                           f"{max_tests} tests: passing is evidence, not a proof at that level")
        if float_check:
            v.float_check = run_float_check(a, b, seed=seed % (1 << 31), **(float_kwargs or {}))
    v.seconds = time.perf_counter() - t0
    return v


# ----------------------------------------------------------------------------- fingerprints


@lru_cache(maxsize=256)
def _fixed_draw(seed: int, fld: Field, name: str, shape: tuple[int, ...]) -> FieldInput:
    """The fixed draw of one input: a function of (seed, primes, name, shape) only,
    so every graph with that input sees the same residues."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), *shape])
    xp = uniform_residues(rng, fld.p, shape)
    xq = uniform_residues(rng, fld.q, shape)
    xp.setflags(write=False)
    xq.setflags(write=False)
    return FieldInput(xp, xq)


@lru_cache(maxsize=16)
def _fixed_algebra(seed: int, fld: Field) -> FieldAlgebra:
    return FieldAlgebra(fld, random_omega(fld, np.random.default_rng([seed, 0x6F6D656761])))


def fingerprint(graph: KernelGraph, *, seed: int = 0, field: Field = DEFAULT) -> str:
    """A hash of ``graph``'s outputs on a fixed random field draw (by ``seed``).

    Equivalent graphs (same input names and shapes) always get the same
    fingerprint; a non-equivalent one collides with probability at most the
    per-test bound of :mod:`verify.bound` (plus 2^-128 for the hash). So the search
    fingerprints the program once and keeps candidates whose fingerprint matches,
    then confirms them with :func:`equivalent`. Input draws and ω are cached, so
    repeated calls at small shapes cost one evaluation each.

    Raises :class:`~mugraph.errors.NotLaxError` for non-Lax graphs and
    :class:`~verify.field.ZeroDivisorDraw` when the fixed draw makes a divisor zero
    (probability ~ size/2^30 for a graph that divides; always for a divisor that is
    identically zero) — treat that candidate with :func:`equivalent`.
    """
    ins = {t.name: _fixed_draw(seed, field, t.name, tuple(t.shape)) for t in graph.inputs}
    outs = mg.evaluate(live_graph(graph), ins, _fixed_algebra(seed, field))
    h = hashlib.blake2b(digest_size=16)
    for o in outs:
        x = np.ascontiguousarray(o[0])
        h.update(repr(x.shape).encode())
        h.update(x.tobytes())
    return h.hexdigest()
