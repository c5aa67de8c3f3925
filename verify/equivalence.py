"""Probabilistic equivalence of programs and μGraphs (docs/design.md §4, Mirage §5).

:func:`equivalent` evaluates both graphs on the same random field inputs —
residues mod p outside exponents, mod q inside, a random ω of order q — and
compares their outputs exactly. Every test draws a fresh pair of primes
(:mod:`verify.family`), so a constant that happens to be a multiple of one prime
cannot make different graphs look alike on every test. Equivalent graphs always
agree; a non-equivalent pair agrees in one test with probability at most the
per-test bound of :mod:`verify.bound`, so the tests repeat (fresh primes, fresh
inputs, fresh ω) until the bound compounded over the tests reaches the requested
error. :func:`fingerprint` is one such evaluation on a fixed draw (primes
included, from the seed), hashed, for the search to compare many candidates
against the program cheaply.

**sqrt.** The field's ``sqrt`` is the multiplicative map ``x ↦ x^((m+1)/4)``:
``sqrt(ab) = sqrt(a)·sqrt(b)`` holds exactly, and ``sqrt(x)² = χ(x)·x`` where ``χ``
(the Legendre symbol) plays the part of the sign. For constants the sign must be
the real one: a draw keeps only primes for which every prime factor of the
graphs' constants and dims (and 2, 3, 5, 7) is a square, so every positive
constant ``c`` has ``χ(c) = 1`` and ``sqrt(c²) = c`` while ``χ(−1) = −1`` — then
``rms_norm(c·X) = rms_norm(X)`` holds in the field for ``c > 0`` and a sign flip
(``c < 0``) does not. Where the field meets an identity it cannot decide (one that
needs a non-constant argument of ``sqrt`` to be positive, as ``sqrt(x)² = x``), a
mismatch through ``sqrt`` is not taken as proof: the pair falls back to
:func:`verify.floatcheck.compare_float64` — rejected if float64 confirms the
difference, UNDECIDED (said so in the verdict) if it does not.

**Draws, shared.** Test ``k`` of a comparison uses draw ``k``: primes and ω from a
generator seeded with ``(seed, k)``, and each input's p- and q-part from its own
generator seeded with ``(seed, k, part, name)`` — a function of the seed, the
index and the plan's conditions on the primes alone, never of the candidate or of
the order of evaluation. So a :class:`Reference` (the program) evaluates itself once
per draw and compares any number of candidates against that evaluation, with the
same verdicts as one :func:`equivalent` call per candidate: the search verifies many
candidates against one program, and :meth:`Reference.equivalent_many` runs them
draw by draw (each draw's inputs drawn once). Residues are drawn on the CPU with
numpy whatever the device, so a verdict does not depend on where it was computed.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import zlib
from dataclasses import dataclass, field as dc_field
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Callable, Iterable, Sequence, Union

import numpy as np
import torch

from mugraph.core.errors import ConfigError, NotLaxError
from mugraph.core.interpreter import Picks, evaluate, saved_positions
from mugraph.core.ir import KernelGraph, dataflow_key
from mugraph.core.lax import check_lax
from mugraph.core.ops import exp_like, lax_classes

from . import args, shared_draws
from .analysis import check_compatible, constants, dim_sizes, inputs_needing_q, live_graph, op_kinds
from .bound import (AtomMode, DegreeAlgebra, Primes, atom_kappas, bits, constants_report, counted_bound, pair_bound,
                    tests_needed, tests_needed_counting_voids)
from .family import DEFAULT, MAX_EXTRA_SQUARES, WHEEL_SQUARES, PrimeFamily
from .field import (Field, FieldAlgebra, FieldError, FieldInput, ZeroDivisorDraw, draw_inputs, eval_threads,
                    random_omega, resolve_device, reuse_memory, uniform_residues)
from .floatcheck import FloatReference, compare_float64, differs, float_check as run_float_check
from .verdict import Counterexample, Verdict

DEFAULT_ERROR = 2.0 ** -40
MAX_FAILED_DRAWS = 32
#: a draw's inputs are drawn in parallel threads (at most this many) when they hold at least
#: this many residues in all (:meth:`_Draws.prefetch`)
PARALLEL_DRAW_ELEMENTS = 1 << 22
MAX_DRAW_THREADS = 8
#: field tests run when the per-test bound cannot reach the target error within ``max_tests``:
#: passing them is evidence, not a proof, at any count (128 tests of a 268 MB SwiGLU candidate
#: whose bound was 1 took 380 s of a 60 s search on an H200 machine, 2026-11-27)
EVIDENCE_TESTS = 16
#: primes that are squares mod every drawn pair when the graphs use sqrt (small constants'
#: roots: 1/4096 = (1/64)², 9, 25, 49 …); fingerprints, drawn from the seed alone, use these
BASE_SQUARES = (2, 3, 5, 7)
#: prime factors of constants and dims below this are made squares when the graphs use sqrt
SQUARE_FACTOR_LIMIT = 1 << 10
#: with sqrt, a constant's prime factor left out of the square conditions makes its sign a
#: coin flip per test (random primes): the heuristic per-test bound gets this much added
#: (with fixed primes the sign is the same on every test: no bound)
UNCONDITIONED_SQRT = 0.5
#: bytes of drawn residues and reference outputs a :class:`Reference` keeps on the CPU: at
#: least this, more on a machine with more memory (:data:`CPU_CACHE_SHARE`, up to
#: :data:`CPU_CACHE_MAX`). An attention at b = 8 draws 105 MB a test (K and V 16×4096×64, mod
#: p and q): with 512 MB, five of its ten tests were drawn again for every candidate (0.5 s)
DRAW_CACHE_BYTES = 1 << 29
CPU_CACHE_SHARE = 1 / 16
CPU_CACHE_MAX = 2 << 30
#: on a GPU: at most this many bytes, and at most :data:`GPU_CACHE_SHARE` of its free memory.
#: There the draws (numpy, on the CPU) are most of a verification: a decode attention (K and
#: V 8×4096×128, 128 tests) drew for 11 of its 15 s, and with 512 MB every candidate drew again
GPU_CACHE_BYTES = 16 << 30
GPU_CACHE_SHARE = 0.25
#: separates the stream of a draw's free shifts (the values of its maxima) from the others
_FREE_STREAM = 0x66726565
#: separates the stream of a draw's primes and ω from its inputs' streams
_PRIME_STREAM = 0x7072696D

FieldLike = Union[Field, PrimeFamily]


class _Shape:
    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)


def _small_primes(n: int) -> list[int]:
    return [k for k in range(2, n) if all(k % d for d in range(2, math.isqrt(k) + 1))]


_SMALL = _small_primes(SQUARE_FACTOR_LIMIT)


def _factor_small(n: int) -> tuple[set[int], int]:
    """Prime factors of ``n`` below :data:`SQUARE_FACTOR_LIMIT`, and the cofactor left."""
    n = abs(n)
    out = set()
    for ell in _SMALL:
        if n < ell:
            break
        while n % ell == 0:
            out.add(ell)
            n //= ell
    return out, n


@dataclass
class Plan:
    """What comparing two graphs needs before any test: their op kinds, the integers
    no drawn prime may divide (``avoid``: the constants' numerators and
    denominators), the primes that must be squares mod both (``squares``, with
    sqrt), those that could not be made so (``unconditioned``), and how the bound
    sees the draw (``primes``)."""

    kinds: set[str]
    avoid: tuple[int, ...]
    squares: tuple[int, ...]
    unconditioned: list[int]
    primes: Primes
    notes: list[str] = dc_field(default_factory=list)


def make_plan(a: KernelGraph, b: KernelGraph, fld: FieldLike) -> Plan:
    """The :class:`Plan` for comparing ``a`` with ``b`` under ``fld`` (a family: a
    fresh pair per test; a :class:`~verify.field.Field`: fixed primes)."""
    kinds = op_kinds(a) | op_kinds(b)
    consts = set(constants(a)) | set(constants(b))
    avoid = tuple(sorted({abs(n) for c in consts for n in (c.numerator, c.denominator)} - {0, 1}))
    squares: set[int] = set()
    unconditioned: set[int] = set()
    notes: list[str] = []
    if "sqrt" in lax_classes(kinds):
        squares = set(BASE_SQUARES)
        for n in list(avoid) + sorted(dim_sizes(a) | dim_sizes(b)):
            small, rest = _factor_small(n)
            squares |= small
            if rest > 1 and n in avoid:
                unconditioned.add(rest)
        extra = sorted(squares - WHEEL_SQUARES)  # conditions the draw pays for (factor ~4 each)
        if len(extra) > MAX_EXTRA_SQUARES:
            unconditioned |= set(extra[MAX_EXTRA_SQUARES:])
            squares -= set(extra[MAX_EXTRA_SQUARES:])
    if isinstance(fld, Field):
        primes = Primes(fld.p, fld.q, 1.0)
        notes.append(f"fixed primes p={fld.p}, q={fld.q}: a constant sharing a factor with p or q is not caught, so "
                     f"the bound holds only while every coefficient stays below {math.log2(fld.q):.1f} bits "
                     "(the default draws a fresh random pair per test)")
        non_sq = sorted(s for s in squares if pow(s, (fld.p - 1) // 2, fld.p) != 1
                        or pow(s, (fld.q - 1) // 2, fld.q) != 1)
        if non_sq:
            unconditioned |= set(non_sq)
    else:
        lq = math.log2(fld.q_min)
        excluded = 2 * sum(math.floor(bits(n) / lq) for n in avoid)
        pairs = max(1.0, (fld.size - excluded) * (fld.square_fraction(squares) if squares else 1.0))
        primes = Primes(fld.p_min, fld.q_min, pairs, avoids_constants=True)
    if unconditioned:
        notes.append(f"sqrt: the sign of constants with the prime factors {sorted(unconditioned)} is not controlled "
                     "by the primes (sqrt(c²) may be −c): " + ("with fixed primes there is no bound" if
                     isinstance(fld, Field) else f"the heuristic bound adds {UNCONDITIONED_SQRT} per test")
                     + ", and a mismatch falls back to float64")
    return Plan(kinds, avoid, tuple(sorted(squares)), sorted(unconditioned), primes, notes)


def summarize(graph: KernelGraph, primes: Primes, salt: object = 0, atoms: AtomMode | None = None):
    """Degree summaries of ``graph``'s outputs and its zero-divisor risk
    (:class:`verify.bound.DegreeAlgebra`; ``atoms``: in exponent-atom mode)."""
    alg = DegreeAlgebra(primes, salt, atoms)
    outs = evaluate(graph, {t.name: _Shape(t.shape) for t in graph.inputs}, alg)
    return outs, alg


#: how the per-test bound was argued (``Verdict.argument``)
POLYNOMIAL, ATOMS, CONJECTURE = "polynomial", "exponent atoms", "Li–Wu conjecture"


@dataclass(frozen=True)
class Bound:
    """The per-test bound of a pair (docs/design.md §4.6) and how it was argued."""

    #: conditioned on a draw meeting no zero divisor: ``ε / (1 − z_a − z_b)``
    per_test: float
    #: not conditioned: ``ε`` alone, what a trial that counts its void draws uses (§4.5)
    unconditioned: float
    heuristic: bool
    constant_bits: float
    constant_term: float
    argument: str


def _bound(a: KernelGraph, b: KernelGraph, plan: Plan) -> Bound:
    """The smaller of the classic bound (exponent collisions and the Li–Wu conjecture)
    and, when every exponent of both graphs is a constant times an input element, the
    exponent-atom bound (:class:`verify.bound.AtomMode`: Schwartz–Zippel in the atoms, no
    conjecture) — conditioned on no zero divisor and not."""
    la, lb = live_graph(a), live_graph(b)
    oa, sa = summarize(la, plan.primes, "a")
    ob, sb = summarize(lb, plan.primes, "b")
    eps = pair_bound(plan.primes, oa, ob, sa.z + sb.z)
    eps0 = pair_bound(plan.primes, oa, ob, 0.0)
    heuristic = sa.heuristic or sb.heuristic
    argument = CONJECTURE if sa.exp_args or sb.exp_args else POLYNOMIAL
    atoms = atom_kappas(sa.exp_args + sb.exp_args, plan.primes, sa.shapes)
    if atoms is not None:
        ua, za = summarize(la, plan.primes, "a", atoms)
        ub, zb = summarize(lb, plan.primes, "b", atoms)
        eps_atoms = min(1.0, pair_bound(plan.primes, ua, ub, za.z + zb.z) + atoms.eta)
        eps0_atoms = min(1.0, pair_bound(plan.primes, ua, ub, 0.0) + atoms.eta)
        if eps_atoms <= eps:
            eps, eps0, oa, ob, argument = eps_atoms, eps0_atoms, ua, ub, ATOMS
    if heuristic and plan.unconditioned:
        # random primes: each test flips a fair coin for such a constant's sign; fixed primes
        # give the same (possibly wrong) sign on every test, so no bound at all
        eps, eps0 = ((1.0, 1.0) if plan.primes.pairs == 1
                     else (min(1.0, eps + UNCONDITIONED_SQRT), min(1.0, eps0 + UNCONDITIONED_SQRT)))
    nbits, term = constants_report(plan.primes, oa, ob)
    return Bound(eps, eps0, heuristic, nbits, term, argument)


def per_test_bound(a: KernelGraph, b: KernelGraph, fld: FieldLike = DEFAULT) -> tuple[float, bool]:
    """The probability bound for one test of ``a`` against ``b`` and whether it is
    heuristic (sqrt); see :mod:`verify.bound`. It is the smaller of the conditioned bound
    and the unconditioned one, whichever rule :func:`trial_rule` picks for the pair."""
    bd = _bound(a, b, make_plan(a, b, _check_field(fld)))
    return (bd.unconditioned if trial_rule(bd, DEFAULT_ERROR).counts_voids else bd.per_test), bd.heuristic


@dataclass(frozen=True)
class TrialRule:
    """How many passing field tests a pair needs, and what bound they leave (§4.5, §4.7).

    The *conditioned* rule redraws a draw that met a zero divisor and bounds each test by
    ``ε / (1 − z)``; the tests needed do not depend on the redraws. The *counting* rule
    (``counts_voids``) bounds each test by ``ε`` alone and pays for the void draws
    instead: after ``v`` of them it needs the fewest ``n`` with
    :func:`verify.bound.counted_bound` ``≤ error``. The rule is fixed before the first
    draw, from the bounds alone (never from what the draws meet): the counting one where
    the conditioned rule needs more tests or has no bound — an attention over 8,192 keys
    divides by 131,072 row sums (16 heads × 8,192 queries), whose summed zero risk ``z`` exceeds 1
    though each row's is 2.6·10⁻⁵."""

    per_test: float
    error: float
    counts_voids: bool

    def needed(self, voids: int) -> int | None:
        if self.counts_voids:
            return tests_needed_counting_voids(self.per_test, self.error, voids)
        return tests_needed(self.per_test, self.error)

    def error_bound(self, tests: int, voids: int) -> float:
        if self.counts_voids:
            return counted_bound(self.per_test, tests, voids)
        return self.per_test ** tests


def trial_rule(bd: Bound, error: float) -> TrialRule:
    """The :class:`TrialRule` of a pair whose bounds are ``bd``."""
    conditioned = tests_needed(bd.per_test, error)
    counting = tests_needed_counting_voids(bd.unconditioned, error, 0)
    if counting is not None and (conditioned is None or counting < conditioned):
        return TrialRule(bd.unconditioned, error, True)
    return TrialRule(bd.per_test, error, False)


def _specs(graph: KernelGraph, need_q: set[str]):
    return [(t.name, t.shape, t.name in need_q) for t in sorted(graph.inputs, key=lambda t: t.name)]


def _first_mismatch(oa: Sequence[tuple], ob: Sequence[tuple]) -> tuple[int, tuple, int, int, str] | None:
    """The first element where two evaluations differ: ``(output, index, a, b, part)``."""
    for i, (x, y) in enumerate(zip(oa, ob)):
        parts = [("mod p", x[0], y[0])]
        if len(x) > 1 and len(y) > 1:
            parts.append(("mod q", x[1], y[1]))
        for label, u, v in parts:
            diff = u != v
            if bool(diff.any()):
                flat = int(torch.argmax(diff.reshape(-1).to(torch.uint8)))
                idx = tuple(int(j) for j in np.unravel_index(flat, tuple(diff.shape)))
                return i, idx, int(u[idx]), int(v[idx]), label
    return None


def _free_shifts(seed: int, k: int, who: int) -> np.random.Generator:
    """The generator of draw ``k``'s free shifts for graph ``who`` (0: the reference, 1 + i:
    candidate ``i``; ``k = −1``: the fingerprint's draw): independent of the inputs' draws and
    of every other graph's shifts — a comparison must hold whatever value each max takes."""
    return np.random.default_rng([seed, k + 1, _FREE_STREAM, who])


def evaluate_field(graph: KernelGraph, inputs: dict[str, FieldInput], fld: Field, omega: int,
                   device: torch.device, parts: int | None = None,
                   free: np.random.Generator | None = None) -> list[tuple]:
    """``graph``'s outputs under one draw, as tuples of int64 tensors on ``device``:
    every intermediate computed once when something reads it, released after its
    last reader (:meth:`verify.field.FieldAlgebra.realize`; ``parts=1``: p-parts only).
    ``free``: the generator of the draw's free shifts (each ``max``'s fresh values)."""
    alg = FieldAlgebra(fld, omega, device, deferred=True, free=free)
    return alg.realize(evaluate(graph, inputs, alg), parts, release=True)


def field_test(a: KernelGraph, b: KernelGraph, *, rng: np.random.Generator, fld: FieldLike = DEFAULT,
               need_q: set[str] | None = None, max_failed_draws: int = MAX_FAILED_DRAWS,
               plan: Plan | None = None, device: str = "auto"):
    """One field test: draw primes (from a family; a :class:`~verify.field.Field` is
    used as it is), inputs and ω from ``rng``, evaluate both graphs, compare exactly.

    Returns ``(mismatch, failed_draws)``: ``mismatch`` is None when all outputs
    agree, else ``(output, index, value_a, value_b, part, p, q)``. A draw that meets
    a zero divisor is discarded and redrawn (primes too); after
    ``max_failed_draws`` in a row a :class:`~verify.field.ZeroDivisorDraw` says a
    divisor is (almost surely) identically zero. ``plan`` (:func:`make_plan`) may
    be passed to skip recomputing it."""
    if need_q is None:
        need_q = inputs_needing_q(a) | inputs_needing_q(b)
    args.generator("field_test", rng)
    args.integer("field_test", "max_failed_draws", max_failed_draws, 1, 1 << 20)
    check_compatible(a, b)
    dev = resolve_device(device)
    if isinstance(_check_field(fld), PrimeFamily) and plan is None:
        plan = make_plan(a, b, fld)
    with eval_threads(a, b), reuse_memory(a, b):
        mismatch, failed, _ = _field_test(a, b, rng, fld, need_q, max_failed_draws, plan, dev)
    return mismatch, failed


def _field_test(a: KernelGraph, b: KernelGraph, rng: np.random.Generator, fld: FieldLike, need_q: set[str],
                max_failed_draws: int, plan: Plan | None,
                device: torch.device = torch.device("cpu")) -> tuple[tuple | None, int, Field]:
    """:func:`field_test`, also returning the primes of the draw that was compared."""
    specs = _specs(a, need_q)
    a, b = live_graph(a), live_graph(b)  # a zero divisor in dead code must not fail a draw
    failed = 0
    while True:
        f = fld if isinstance(fld, Field) else fld.draw(rng, avoid=plan.avoid, squares=plan.squares)
        omega = random_omega(f, rng)
        ins = draw_inputs(specs, f, rng, device)
        try:
            oa = evaluate_field(a, ins, f, omega, device, free=rng)
            ob = evaluate_field(b, ins, f, omega, device, free=rng)
        except ZeroDivisorDraw:
            failed += 1
            if failed >= max_failed_draws:
                raise ZeroDivisorDraw(
                    f"{a.name} vs {b.name}: {failed} draws in a row divided by zero: a divisor is "
                    "(almost surely) identically zero") from None
            continue
        m = _first_mismatch(oa, ob)
        return (None if m is None else m + (f.p, f.q)), failed, f


# ----------------------------------------------------------------------------- shared draws


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Draws:
    """The draws of one comparison setting (seed, primes' family and the plan's
    conditions on them): draw ``k``'s primes and ω, and each input's residues, drawn
    when first asked for — each from a generator seeded by ``(seed, k, …)`` alone, so
    a draw is the same whoever asks, in whatever order — and kept while ``budget``
    (bytes) lasts."""

    def __init__(self, seed: int, fld: FieldLike, plan: Plan, device: torch.device, budget: list[int]) -> None:
        self.seed, self.fld, self.plan, self.device, self.budget = seed, fld, plan, device, budget
        self.fields: dict[int, tuple[Field, int]] = {}
        self.residues: dict[tuple, torch.Tensor] = {}

    def field(self, k: int) -> tuple[Field, int]:
        """Draw ``k``'s primes (a fresh family member meeting the plan's conditions) and ω."""
        got = self.fields.get(k)
        if got is None:
            rng = np.random.default_rng([self.seed, k, _PRIME_STREAM])
            f = self.fld if isinstance(self.fld, Field) else \
                self.fld.draw(rng, avoid=self.plan.avoid, squares=self.plan.squares)
            got = self.fields[k] = (f, random_omega(f, rng))
        return got

    def _draw(self, k: int, name: str, shape: tuple[int, ...], part: int) -> torch.Tensor:
        f, _ = self.field(k)
        rng = np.random.default_rng([self.seed, k, part, zlib.crc32(name.encode())])
        return torch.from_numpy(uniform_residues(rng, (f.p, f.q)[part], shape, np.float64)).to(self.device)

    def residues_of(self, k: int, name: str, shape: tuple[int, ...], part: int,
                    drawn: dict | None = None) -> torch.Tensor:
        """Uniform residues of input ``name`` for draw ``k``: mod p (``part`` 0) or mod q (1)
        (``drawn``: residues :meth:`prefetch` drew for this call)."""
        key = (k, name, part)
        t = self.residues.get(key)
        if t is None:
            t = drawn.pop(key, None) if drawn else None
            if t is None:
                t = self._draw(k, name, shape, part)
            if _nbytes(t) <= self.budget[0]:
                self.budget[0] -= _nbytes(t)
                self.residues[key] = t
        return t

    def prefetch(self, k: int, graph: KernelGraph, need_q: frozenset[str]) -> dict:
        """Draw ``k``'s residues of ``graph``'s inputs not held yet, several at once when they
        are large: each has its own generator, and numpy's bit generator and array ops run
        without the GIL, so the draws of a program with 268 MB of weights (about 1 s per
        45 M residues on one core) take the time of the largest instead of their sum."""
        todo = [(k, t.name, tuple(t.shape), part) for t in graph.inputs
                for part in ((0, 1) if t.name in need_q else (0,)) if (k, t.name, part) not in self.residues]
        if len(todo) < 2 or sum(math.prod(a[2]) for a in todo) < PARALLEL_DRAW_ELEMENTS:
            return {}
        self.field(k)  # the primes first: the threads only read them
        workers = min(len(todo), os.cpu_count() or 1, MAX_DRAW_THREADS)
        with ThreadPoolExecutor(workers) as ex:
            tensors = list(ex.map(lambda a: self._draw(*a), todo))
        return {(a[0], a[1], a[3]): t for a, t in zip(todo, tensors)}

    def inputs(self, k: int, graph: KernelGraph, need_q: frozenset[str]) -> dict[str, FieldInput]:
        """Draw ``k``'s inputs of ``graph``: the p-parts, and q-parts (drawn when first read)
        for the inputs in ``need_q``."""
        drawn = self.prefetch(k, graph, need_q)
        out = {}
        for t in graph.inputs:
            shape = tuple(t.shape)
            xq = (lambda n=t.name, s=shape: self.residues_of(k, n, s, 1, drawn)) if t.name in need_q else None
            out[t.name] = FieldInput(self.residues_of(k, t.name, shape, 0, drawn), xq)
        return out


class _Trial:
    """One candidate's field tests against a :class:`Reference`: test ``i`` uses the
    ``i``-th draw on which neither graph met a zero divisor; the tests stop at the
    first mismatch, or once ``rule`` has the tests it needs after the void draws met so
    far (at most ``max_tests``; a rule that cannot reach its target within them runs
    :data:`EVIDENCE_TESTS`)."""

    def __init__(self, index: int, candidate: KernelGraph, plan: Plan, rule: TrialRule, max_tests: int,
                 max_failed: int) -> None:
        self.index, self.candidate, self.plan, self.rule, self.max_tests, self.max_failed = \
            index, candidate, plan, rule, max_tests, max_failed
        self.live = live_graph(candidate)
        self.tests = self.failed = self.row = 0
        self.mismatch: tuple | None = None
        self.error: ZeroDivisorDraw | None = None
        self.undecided: FieldError | None = None
        self.used: Field | None = None

    @property
    def n(self) -> int:
        """The passing tests this trial runs, given its void draws so far."""
        needed = self.rule.needed(self.failed)
        # a bound that cannot reach the target leaves evidence only, whatever the count:
        # a few tests give it (a large program's tests take seconds each)
        return min(needed, self.max_tests) if needed is not None and needed <= self.max_tests \
            else min(EVIDENCE_TESTS, self.max_tests)

    def active(self) -> bool:
        return self.error is None and self.undecided is None and self.mismatch is None and self.tests < self.n


def _physical_memory() -> int:
    """Bytes of memory of this machine (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def default_cache_bytes(device: torch.device) -> int:
    """What a :class:`Reference` keeps when not told: on the CPU :data:`CPU_CACHE_SHARE`
    of the machine's memory, between :data:`DRAW_CACHE_BYTES` and :data:`CPU_CACHE_MAX`;
    on a GPU, :data:`GPU_CACHE_SHARE` of its free memory, at most :data:`GPU_CACHE_BYTES`
    (and never less than :data:`DRAW_CACHE_BYTES`)."""
    if device.type != "cuda":
        return max(DRAW_CACHE_BYTES, min(CPU_CACHE_MAX, int(_physical_memory() * CPU_CACHE_SHARE)))
    free, _ = torch.cuda.mem_get_info(device)
    return max(DRAW_CACHE_BYTES, min(GPU_CACHE_BYTES, int(free * GPU_CACHE_SHARE)))


class Reference:
    """A reference graph (the program) prepared for comparisons with many candidates.

    Draws are shared (module docstring): the reference is evaluated once per draw
    and every candidate is compared with that evaluation; the reference side of the
    float check (its float64 values, magnitudes and own rounding errors, per case)
    is computed once too. ``Reference(p, seed=s).equivalent(c)`` gives the verdict
    of ``equivalent(p, c, seed=s)``; :meth:`equivalent_many` runs several candidates
    draw by draw. Drawn residues are kept up to ``cache_bytes`` (on ``device``; None:
    :func:`default_cache_bytes`), the reference's outputs up to as many bytes
    again, and the float check's draws and per-case results likewise. ``device``: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda"`` — the
    verdicts do not depend on it (residues are drawn on the CPU; the arithmetic is
    exact)."""

    def __init__(self, graph: KernelGraph, *, seed: int | None = None, field: FieldLike = DEFAULT,
                 device: str = "auto", cache_bytes: int | None = None) -> None:
        if not isinstance(graph, KernelGraph):
            raise ConfigError(f"Reference: expected a mugraph Program or KernelGraph, got {type(graph).__name__}")
        if seed is not None:
            args.integer("Reference", "seed", seed, 0)
        if cache_bytes is not None:
            args.integer("Reference", "cache_bytes", cache_bytes, 0)
        self.graph = graph
        self.field = _check_field(field)
        self.device = resolve_device(device)
        if cache_bytes is None:
            cache_bytes = default_cache_bytes(self.device)
        self.seed = int(np.random.SeedSequence().entropy % (1 << 63)) if seed is None else int(seed)
        self.budget = [int(cache_bytes)]  # drawn residues
        # the reference's outputs have a budget of their own: they are small next to the
        # inputs (an attention output is 1/16 of its K and V) and each one saves a whole
        # evaluation of the program per candidate, where a kept residue saves only its draw
        self.output_budget = [int(cache_bytes)]
        # the float check's draws (and, separately, its per-case results) get as many bytes again
        self.float_budget = int(cache_bytes)
        self._live: KernelGraph | None = None
        self._draws: dict[tuple, _Draws] = {}
        self._outputs: dict[tuple, object] = {}
        self._float: dict[tuple, FloatReference] = {}
        self.evaluations = 0  # of the reference (a statistic: one per draw, not per candidate)
        self.evaluation_times: list[float] = []  # what each of those evaluations took (its draw aside), seconds

    @property
    def live(self) -> KernelGraph:
        if self._live is None:
            self._live = live_graph(self.graph)
        return self._live

    def _draws_for(self, plan: Plan) -> _Draws:
        key = (plan.avoid, plan.squares)
        d = self._draws.get(key)
        if d is None:
            d = self._draws[key] = _Draws(self.seed, self.field, plan, self.device, self.budget)
        return d

    def _reference_outputs(self, draws: _Draws, need_q: frozenset[str], k: int):
        """The reference's outputs on draw ``k`` (or the error its evaluation raised), kept."""
        key = (draws.plan.avoid, draws.plan.squares, need_q, k)
        got = self._outputs.get(key)
        if got is None:
            f, omega = draws.field(k)
            self.evaluations += 1
            t0 = None
            try:
                inputs = draws.inputs(k, self.graph, need_q)
                t0 = time.perf_counter()
                got = evaluate_field(self.live, inputs, f, omega, self.device, free=_free_shifts(self.seed, k, 0))
                size = sum(_nbytes(t) for o in got for t in o)
            except (ZeroDivisorDraw, FieldError) as e:
                got, size = e, 0
            if t0 is not None:
                self.evaluation_times.append(time.perf_counter() - t0)
            if size <= self.output_budget[0]:
                self.output_budget[0] -= size
                self._outputs[key] = got
        return got

    def _run(self, trials: list[_Trial], need_q: frozenset[str]) -> None:
        """Field tests of ``trials`` (one plan, one ``need_q``), draw by draw."""
        draws = self._draws_for(trials[0].plan)
        k = 0
        while True:
            active = [t for t in trials if t.active()]
            if not active:
                return
            try:
                f, omega = draws.field(k)
            except FieldError as e:  # no family member meets the conditions
                for t in active:
                    t.undecided = e
                return
            ref = self._reference_outputs(draws, need_q, k)
            for t in active:
                self._step(t, draws, need_q, k, f, omega, ref)
            k += 1

    def _step(self, t: _Trial, draws: _Draws, need_q: frozenset[str], k: int, f: Field, omega: int, ref) -> None:
        try:
            if isinstance(ref, Exception):
                raise ref
            out = evaluate_field(t.live, draws.inputs(k, t.candidate, need_q), f, omega, self.device,
                                 free=_free_shifts(self.seed, k, 1 + t.index))
        except ZeroDivisorDraw:
            t.failed += 1
            t.row += 1
            if t.row >= t.max_failed:
                t.error = ZeroDivisorDraw(f"{self.graph.name} vs {t.candidate.name}: {t.row} draws in a row divided "
                                          "by zero: a divisor is (almost surely) identically zero")
            return
        except FieldError as e:  # fixed primes only: a constant with no meaning mod p
            t.undecided = e
            t.tests += 1
            return
        t.row = 0
        t.tests += 1
        t.used = f
        m = _first_mismatch(ref, out)
        if m is not None:
            t.mismatch = m + (f.p, f.q)

    def _float_reference(self, fkw: dict) -> FloatReference:
        key = tuple(sorted((k, repr(v)) for k, v in fkw.items() if k in ("dtypes", "scales")))
        fr = self._float.get(key)
        if fr is None:
            kw = {k: v for k, v in fkw.items() if k in ("dtypes", "scales")}
            fr = self._float[key] = FloatReference(self.graph, seed=self.seed % (1 << 31), device=self.device,
                                                      cache_bytes=self.float_budget, **kw)
        return fr

    def prepare(self, *, error: float = DEFAULT_ERROR, max_tests: int = 128, float_check: bool = True,
                float_kwargs: dict | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Compute now the program's side of what a candidate's verdict reads: its outputs on
        the draws of the field tests the program against itself needs (void draws counted as
        a trial counts them), and the reference side of the float check — kept as
        :meth:`equivalent_many` keeps them, so a later verdict evaluates only its candidate.
        Returns the tests prepared (0 for a program outside Lax: nothing to prepare). Nothing
        here decides a verdict: the same draws and evaluations would be made by the first
        candidate's. ``stop()``, asked before each draw, ends the preparation early (what is
        done stays kept).

        Why: at large sizes the program's side is most of a first verification (a causal
        2,048-token prompt attention on a CPU: 4.4 of 6.3 s), and a caller that knows it will
        verify soon — a scouted search, while its scout runs — can pay it ahead."""
        args.number("Reference.prepare", "error", error, lo=0, hi=1)
        args.integer("Reference.prepare", "max_tests", max_tests, 1, 1 << 20)
        try:
            check_lax(self.graph)
        except NotLaxError:
            return 0
        plan = make_plan(self.graph, self.graph, self.field)
        trial = _Trial(0, self.graph, plan, trial_rule(_bound(self.graph, self.graph, plan), error), max_tests,
                       MAX_FAILED_DRAWS)
        need_q = frozenset(inputs_needing_q(self.graph))
        draws = self._draws_for(plan)
        with eval_threads(self.graph), reuse_memory(self.graph):
            k = 0
            while trial.active() and trial.row < MAX_FAILED_DRAWS:
                if stop is not None and stop():
                    return trial.tests
                try:
                    draws.field(k)
                except FieldError:
                    break
                if isinstance(self._reference_outputs(draws, need_q, k), Exception):
                    trial.failed += 1  # a void draw, as a candidate's trial counts it
                    trial.row += 1
                else:
                    trial.tests += 1
                    trial.row = 0
                k += 1
            if float_check:
                self._float_reference(dict(float_kwargs or {})).prepare()
        return trial.tests

    def equivalent(self, candidate: KernelGraph, **kwargs) -> Verdict:
        """:func:`equivalent` of the reference and ``candidate`` (same arguments but
        ``seed``, ``field`` and ``device``, which are the reference's)."""
        return self.equivalent_many([candidate], **kwargs)[0]

    def equivalent_many(self, candidates: Iterable[KernelGraph], *, error: float = DEFAULT_ERROR,
                        max_tests: int = 128, float_check: bool = True, non_lax: str = "raise",
                        max_failed_draws: int = MAX_FAILED_DRAWS, float_kwargs: dict | None = None) -> list[Verdict]:
        """Verdicts for ``candidates`` against the reference, the field tests run draw by
        draw: each draw's inputs are drawn and the reference evaluated once, then every
        candidate still under test is evaluated on them. The verdicts are those of one
        :meth:`equivalent` call per candidate. A candidate whose divisors are zero on
        ``max_failed_draws`` draws in a row raises :class:`~verify.field.ZeroDivisorDraw`
        (the first such candidate, in the order given)."""
        t0 = time.perf_counter()
        candidates = list(candidates)
        _check_args(error, self.seed, self.field, max_tests, float_check, non_lax, max_failed_draws, float_kwargs)
        for c in candidates:
            check_compatible(self.graph, c)
        fkw = dict(float_kwargs or {})
        verdicts: list[Verdict | None] = [None] * len(candidates)
        groups: dict[tuple, list[_Trial]] = {}
        setup: dict[int, tuple] = {}
        with eval_threads(self.graph, *candidates), reuse_memory(self.graph, *candidates):
            for i, c in enumerate(candidates):
                try:
                    check_lax(self.graph)
                    check_lax(c)
                except NotLaxError as e:
                    if non_lax == "raise":
                        raise
                    report = run_float_check(self.graph, c, seed=self.seed % (1 << 31), device=self.device,
                                             prepared=self._float_reference(fkw), **fkw)
                    verdicts[i] = Verdict(self.graph.name, c.name, None, method="float-only", seed=self.seed,
                                          target_error=error, float_check=report, seconds=time.perf_counter() - t0,
                                          checks={"float check": "passed" if report.passed else "failed"},
                                          notes=[f"not Lax ({e}); EQUIVALENCE IS UNPROVEN: only a floating-point "
                                                 "comparison ran"])
                    continue
                plan = make_plan(self.graph, c, self.field)
                bd = _bound(self.graph, c, plan)
                need_q = frozenset(inputs_needing_q(self.graph) | inputs_needing_q(c))
                trial = _Trial(i, c, plan, trial_rule(bd, error), max_tests, max_failed_draws)
                groups.setdefault((plan.avoid, plan.squares, need_q), []).append(trial)
                setup[i] = (trial, plan, bd)
            for (_, _, need_q), trials in groups.items():
                self._run(trials, need_q)
            for i in sorted(setup):
                trial = setup[i][0]
                if trial.error is not None:
                    raise trial.error
            for i in sorted(setup):
                verdicts[i] = self._verdict(candidates[i], *setup[i], error=error, max_tests=max_tests,
                                            float_check=float_check, fkw=fkw, t0=t0)
        return verdicts

    def _verdict(self, c: KernelGraph, trial: _Trial, plan: Plan, bd: Bound, *, error: float, max_tests: int,
                 float_check: bool, fkw: dict, t0: float) -> Verdict:
        a, fld, seed = self.graph, self.field, self.seed
        rule = trial.rule
        v = Verdict(a.name, c.name, True, tests=trial.tests, per_test_bound=rule.per_test, target_error=error,
                    conjecture=bd.argument == CONJECTURE, heuristic=bd.heuristic, argument=bd.argument,
                    p=fld.p if isinstance(fld, Field) else None, q=fld.q if isinstance(fld, Field) else None,
                    seed=seed, notes=_notes(plan.kinds, a, c, bd.argument) + plan.notes, primes=_describe(fld, plan),
                    pairs=plan.primes.pairs, constant_bits=bd.constant_bits, constant_term=bd.constant_term,
                    failed_draws=trial.failed, voids_counted=rule.counts_voids)
        if rule.counts_voids:
            v.notes.append(f"zero divisors: draws that met one count against the bound (design §4.5), not "
                           f"conditioned on — conditioning would give {_short(bd.per_test)} per test")
        if trial.used is not None:
            v.p, v.q = trial.used.p, trial.used.q
        if trial.undecided is not None:
            v.equivalent = None
            v.checks["field tests"] = "undecided"
            v.notes.append(f"UNDECIDED: {trial.undecided} — the fixed primes cannot represent it (the default draws "
                           "primes that avoid every constant)")
        elif trial.mismatch is not None:
            out, idx, va, vb, part, p, q = trial.mismatch
            fa, fb = _float_values(a, c, out, idx, seed % (1 << 31))
            v.counterexample = Counterexample(out, idx, va, vb, part, trial.tests, fa, fb, p, q)
            v.equivalent = False
            v.checks["field tests"] = "failed"
            if lax_classes(plan.kinds) & {"sqrt", "shift"}:
                _float64_fallback(v, a, c, seed, plan.kinds)
        if v.equivalent:
            v.checks["field tests"] = "passed"
            v.error_bound = rule.error_bound(v.tests, trial.failed)
            v.bound_met = v.error_bound <= error
            v.checks["error bound"] = "met" if v.bound_met else "not met"
            if not v.bound_met:
                v.notes.append(f"the per-test bound {rule.per_test:.3g} is too weak to reach {error:.3g} in "
                               f"{max_tests} tests: {v.tests} passing tests are evidence, not a proof at that level")
        if float_check and v.equivalent is not False:
            v.float_check = run_float_check(a, c, seed=seed % (1 << 31), device=self.device,
                                            prepared=self._float_reference(fkw), **fkw)
            v.checks["float check"] = "passed" if v.float_check.passed else "failed"
        v.seconds = time.perf_counter() - t0
        return v


def _short(x: float) -> str:
    return "1 (no bound)" if x >= 1 else f"{x:.3g}"


def _float_values(a: KernelGraph, b: KernelGraph, output: int, index: tuple, seed: int):
    """The element ``index`` of ``output`` for both graphs in float64 on normal inputs."""
    try:
        g = torch.Generator().manual_seed(seed)
        ins = {t.name: torch.randn(t.shape, generator=g, dtype=torch.float64) * 0.5
               for t in sorted(a.inputs, key=lambda t: t.name)}
        with torch.no_grad():
            ra = evaluate(a, ins)[output]
            rb = evaluate(b, ins)[output]
        return float(ra[index]), float(rb[index])
    except Exception:  # a float view is a courtesy; never let it mask the verdict
        return None, None


def _notes(kinds: set[str], a: KernelGraph, b: KernelGraph, argument: str = CONJECTURE) -> list[str]:
    notes = []
    if argument == ATOMS:
        notes.append("exp: every exponent is a constant times an input element, so each exp is a power of an "
                     "independent uniform root of unity and the bound is Schwartz–Zippel in those atoms "
                     "(no conjecture; see verify.bound.AtomMode)")
    elif any(exp_like(k) for k in kinds):
        notes.append("exp: the per-test bound for exponentials relies on the Li–Wu conjecture "
                     "(an uncertainty principle for the NTT over F_p; see verify.bound)")
    if "silu" in lax_classes(kinds):
        notes.append("silu is outside Mirage's Lax class as an op; its field meaning x·(1+ω^(−x))⁻¹ is that of "
                     "the Lax expression x/(1+exp(−x)), which the bound covers")
    if "sqrt" in lax_classes(kinds):
        notes.append("sqrt is outside the theorem's class: evaluated as the multiplicative map x^((m+1)/4), with "
                     "primes drawn so that every constant's sign is its real one (sqrt(c²) = |c|); the bound is "
                     "heuristic, and a mismatch through sqrt is confirmed in float64 before it rejects")
    da = {t.dtype for t in a.inputs}
    db = {t.dtype for t in b.inputs}
    if da != db:
        notes.append(f"input dtypes differ ({sorted(da)} vs {sorted(db)}); the field test ignores dtypes")
    return notes


def _check_field(fld) -> FieldLike:
    if not isinstance(fld, (Field, PrimeFamily)):
        raise ConfigError(f"field must be a verify.PrimeFamily (random primes, the default) or a verify.Field "
                          f"(fixed primes), got {type(fld).__name__}")
    return fld


def _check_args(error, seed, fld, max_tests, float_check, non_lax, max_failed_draws, float_kwargs):
    """One-line :class:`~mugraph.core.errors.ConfigError` for every bad argument of :func:`equivalent`."""
    args.number("equivalent", "error", error, lo=0, hi=1)
    if seed is not None:
        args.integer("equivalent", "seed", seed, 0)
    _check_field(fld)
    args.integer("equivalent", "max_tests", max_tests, 1, 1 << 20)
    args.integer("equivalent", "max_failed_draws", max_failed_draws, 1, 1 << 20)
    if not isinstance(float_check, bool):
        raise ConfigError(f"equivalent: float_check must be True or False, got {float_check!r}")
    if non_lax not in ("raise", "float"):
        raise ConfigError(f"equivalent: non_lax must be 'raise' or 'float', got {non_lax!r}")
    if float_kwargs is not None and not isinstance(float_kwargs, dict):
        raise ConfigError(f"equivalent: float_kwargs must be a dict of float_check arguments, got {float_kwargs!r}")


def _describe(fld: FieldLike, plan: Plan) -> str:
    if isinstance(fld, Field):
        return f"fixed p={fld.p}, q={fld.q}" + (" (Mirage's test)" if fld.name == "mirage" else "")
    s = str(fld)
    if plan.avoid:
        s += f"; redrawn when p or q divides one of the {len(plan.avoid)} constants' numerators/denominators"
    if plan.squares:
        s += f"; {plan.squares} squares mod p and q (sqrt)"
    return s


def equivalent(a: KernelGraph, b: KernelGraph, *, error: float = DEFAULT_ERROR, seed: int | None = None,
               field: FieldLike = DEFAULT, max_tests: int = 128, float_check: bool = True,
               non_lax: str = "raise", max_failed_draws: int = MAX_FAILED_DRAWS,
               float_kwargs: dict | None = None, device: str = "auto") -> Verdict:
    """Decide whether ``a`` and ``b`` (programs or μGraphs, any mix) compute the
    same function, with false-accept probability at most ``error``.

    Runs independent field tests, each with a fresh random pair of primes from
    ``field`` (default :data:`verify.family.DEFAULT`), until the per-test bound
    (:mod:`verify.bound`, with its term for constants sharing a factor with a
    drawn prime) compounded is ≤ ``error`` (at most ``max_tests``; the verdict says
    when the bound was not reached), then — if ``float_check`` — the float check of
    ``b`` against ``a``. ``seed`` makes the run reproducible (the verdict records
    the seed used). A :class:`~verify.field.Field` for ``field`` (e.g.
    :data:`verify.field.MIRAGE`) fixes the primes instead: Mirage's test, kept to
    reproduce it — a constant that is 0 mod a fixed prime is then undetectable,
    and the verdict says so. ``device``: where the arithmetic runs — ``"auto"`` (a
    CUDA GPU when torch sees one, else the CPU), ``"cpu"`` or ``"cuda"``; the field
    verdict is the same on every device.

    The verdict records every check that ran (``Verdict.checks``). Non-Lax graphs
    raise :class:`~mugraph.core.errors.NotLaxError` naming the op, unless
    ``non_lax="float"``: then only the float check runs and the verdict says that
    equivalence is unproven. Graphs with different inputs or outputs raise
    :class:`~mugraph.core.errors.InputError`; bad arguments
    :class:`~mugraph.core.errors.ConfigError`. To compare many candidates with one
    program, :class:`Reference` shares the program's side of every test.
    """
    _check_args(error, seed, field, max_tests, float_check, non_lax, max_failed_draws, float_kwargs)
    check_compatible(a, b)
    ref = Reference(a, seed=seed, field=field, device=device)
    return ref.equivalent(b, error=error, max_tests=max_tests, float_check=float_check, non_lax=non_lax,
                          max_failed_draws=max_failed_draws, float_kwargs=float_kwargs)


def _float64_fallback(v: Verdict, a: KernelGraph, b: KernelGraph, seed: int, kinds: set[str]) -> None:
    """A field mismatch through an op whose field meaning can disagree with its real one —
    ``sqrt`` (the multiplicative map) or ``max`` (a free shift: a fresh value per test, so a
    mismatch proves only that the graphs differ for *some* values of their maxima) — stands
    only if float64 confirms it (for a max :func:`verify.floatcheck.differs`, which also looks
    at smaller inputs: a hard-max softmax of huge scores is blind at the first scale);
    otherwise the verdict is undecided."""
    sqrt = "sqrt" in lax_classes(kinds)
    check = "sqrt fallback (float64)" if sqrt else "shift fallback (float64)"
    truth = (compare_float64 if sqrt else differs)(a, b, seed=seed % (1 << 31))
    if truth:
        v.checks[check] = "differs"
        v.checks["field tests"] = "failed"
        v.notes.append("the field mismatch passes through sqrt; float64 confirms the difference" if sqrt else
                       "the graphs have maxima (free shifts); float64 confirms the difference")
        return
    v.equivalent = None
    v.checks["field tests"] = "undecided"
    v.checks[check] = "agrees" if truth is False else "not finite"
    why = ("the field mismatch passes through sqrt, whose field meaning cannot decide this pair (an identity "
           "that needs a non-constant sqrt argument to be positive, e.g. sqrt(x)² = x); " if sqrt else
           "a result depends on the value of a max, which the field tests treat as a free shift (proven only "
           "where it cancels, as in a softmax); ")
    v.notes.append("UNDECIDED: " + why + ("float64 agrees to 1e-7 per element" if truth is False
                                          else "float64 is not finite") + " — not a proof either way")


# ----------------------------------------------------------------------------- fingerprints


def _fixed_draw(seed: int, fld: Field, name: str, shape: tuple[int, ...]) -> FieldInput:
    """The fixed draw of one input: a function of (seed, primes, name, shape) only,
    so every graph with that input sees the same residues (CPU tensors, never written).
    Cached per shared directory (:mod:`verify.shared_draws`): a draw made before a search
    set one is still written there for its workers."""
    return _fixed_draw_at(seed, fld, name, shape, shared_draws.directory())


@lru_cache(maxsize=256)
def _fixed_draw_at(seed: int, fld: Field, name: str, shape: tuple[int, ...], directory) -> FieldInput:
    """:func:`_fixed_draw` while ``directory`` is the shared one (None: none).
    Stored as float64 (exact), as :func:`~verify.field.draw_inputs` stores a test's: a
    weight enters every candidate's matmuls as the GEMM's operand without a conversion
    (int64 draws cost a 134 MB copy per matmul of a 4096×4096 weight, a sixth of a
    gated_mlp b=8 fingerprint)."""
    def draw() -> list[np.ndarray]:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode()), *shape])
        return [uniform_residues(rng, fld.p, shape, np.float64), uniform_residues(rng, fld.q, shape, np.float64)]

    xp, xq = shared_draws.load_or_make(shared_draws.key("draw", seed, fld.p, fld.q, name, shape), draw)
    return FieldInput(torch.from_numpy(xp), torch.from_numpy(xq))


shared_draws.on_release(_fixed_draw_at.cache_clear)


@lru_cache(maxsize=16)
def fingerprint_field(seed: int, fld: FieldLike = DEFAULT) -> Field:
    """The primes of the fingerprint for ``seed``: drawn from the family by a
    generator seeded with ``seed`` alone (so every graph gets the same pair), with
    :data:`BASE_SQUARES` squares; a fixed :class:`~verify.field.Field` as it is."""
    if isinstance(fld, Field):
        return fld
    return fld.draw(np.random.default_rng([seed, 0x7072696D65]), squares=BASE_SQUARES)


@lru_cache(maxsize=16)
def _fixed_omega(seed: int, fld: Field) -> int:
    return random_omega(fld, np.random.default_rng([seed, 0x6F6D656761]))


def fingerprint(graph: KernelGraph, *, seed: int = 0, field: FieldLike = DEFAULT, device: str = "cpu") -> str:
    """A hash of ``graph``'s outputs on a fixed random field draw (by ``seed``:
    primes, inputs and ω).

    Equivalent graphs (same input names and shapes) always get the same
    fingerprint; a non-equivalent one collides with probability at most the
    per-test bound of :mod:`verify.bound` (plus 2^-128 for the hash). So the search
    fingerprints the program once and keeps candidates whose fingerprint matches,
    then confirms them with :func:`equivalent`. Primes, input draws and ω are
    cached, so repeated calls at small shapes cost one evaluation each — of the
    p-parts the hash reads, and the q-parts under an exp, nothing more. The
    default device is the CPU: the search fingerprints small graphs, where a GPU
    would wait on launches.

    Raises :class:`~mugraph.core.errors.NotLaxError` for non-Lax graphs,
    :class:`~verify.field.FieldError` for a constant whose denominator is a multiple
    of the seed's prime, and :class:`~verify.field.ZeroDivisorDraw` when the fixed
    draw makes a divisor zero (probability ~ size/2^30 for a graph that divides;
    always for a divisor that is identically zero) — treat that candidate with
    :func:`equivalent`.
    """
    args.integer("fingerprint", "seed", seed, 0)
    fld = fingerprint_field(seed, _check_field(field))
    outs = _fixed_outputs(live_graph(graph), seed, fld, resolve_device(device))
    h = hashlib.blake2b(digest_size=16)
    for o in outs:
        x = o.to("cpu").contiguous()
        h.update(repr(tuple(x.shape)).encode())
        h.update(x.numpy().tobytes())
    return h.hexdigest()


def _fixed_outputs(graph: KernelGraph, seed: int, fld: Field, device: torch.device,
                   blocks: dict[int, Picks] | None = None, stop_at: float | None = None) -> list[torch.Tensor]:
    """``graph``'s outputs (p-parts) on the fingerprint's fixed draw; ``blocks``: the
    kernels to run on a sample of their grid (:func:`mugraph.core.interpreter.evaluate`);
    ``stop_at``: raise :class:`~verify.field.EvaluationStopped` past this monotonic time."""
    ins = {t.name: _fixed_draw(seed, fld, t.name, tuple(t.shape)) for t in graph.inputs}
    with eval_threads(graph):
        alg = FieldAlgebra(fld, _fixed_omega(seed, fld), device, deferred=True, free=_free_shifts(seed, -1, 0),
                           stop_at=stop_at)
        return [o[0] for o in alg.realize(evaluate(graph, ins, alg, blocks=blocks), 1, release=True)]


#: blocks a sampled fingerprint runs per grid axis (of a larger axis)
SAMPLE_BLOCKS = 2


def sample_blocks(graph: KernelGraph, seed: int = 0, per_axis: int = SAMPLE_BLOCKS) -> dict[int, Picks]:
    """The grid positions a sampled fingerprint runs: for every graph-defined kernel
    whose outputs nothing else reads (what a sample of its blocks changes is only
    which output elements exist), ``per_axis`` indices per grid axis longer than
    that. They are drawn from the seed and the axis, never 0 when the axis has
    more than ``per_axis`` + 1 blocks — block 0 reads every operand at offset 0
    along every axis, so a candidate that maps a grid axis to the wrong dim would
    look right there — and rarely the same index on two axes (a swap of axes
    would look right there too). Kernels whose grid is that small already are
    left out: sampling would save nothing."""
    read = {t for op in graph.ops for t in op.inputs}
    out: dict[int, Picks] = {}
    for op in graph.ops:
        if op.kind != "graph_defined" or any(t in read for t in op.outputs):
            continue
        grid = op.attrs["block"].grid
        if all(g <= per_axis for g in grid):
            continue
        picks = []
        for axis, g in enumerate(grid):
            if g <= per_axis:
                picks.append(tuple(range(g)))
                continue
            rng = np.random.default_rng([seed, 0x626C6B, axis, g])
            lo = 1 if g > per_axis + 1 else 0
            picks.append(tuple(sorted(int(i) + lo for i in rng.choice(g - lo, per_axis, replace=False))))
        out[op.id] = (picks[0], picks[1], picks[2])
    return out


class Fingerprinter:
    """Whether candidates' :func:`fingerprint` s equal a program's, at a fraction of the cost.

    The search compares every complete candidate with its program on the fixed
    draw; at full shapes most of that work is the candidate's kernels over all
    their blocks. A candidate is first run on a few blocks of each output kernel
    (:func:`sample_blocks`) and compared with the program's outputs at the elements
    those blocks write: one that differs there is rejected (its fingerprint
    differs). One that agrees is run in full and compared everywhere, so the
    answer is exactly "the fingerprints are equal" — the sample only decides
    sooner, for the many candidates that are wrong everywhere. The program is
    evaluated once, in full.

    Raises what :func:`fingerprint` raises."""

    def __init__(self, program: KernelGraph, *, seed: int = 0, field: FieldLike = DEFAULT,
                 device: str = "cpu", per_axis: int = SAMPLE_BLOCKS) -> None:
        args.integer("Fingerprinter", "seed", seed, 0)
        args.integer("Fingerprinter", "per_axis", per_axis, 1, 1 << 16)
        self.program = program
        self.seed, self.per_axis = seed, per_axis
        self.fld = fingerprint_field(seed, _check_field(field))
        self.device = resolve_device(device)
        self._target: list[torch.Tensor] | None = None
        #: candidates rejected by the sample, and those evaluated in full
        self.sample_rejected = 0
        self.full = 0

    def target(self, compute_on: str | torch.device | None = None) -> list[torch.Tensor]:
        """The program's outputs on the fixed draw (p-parts). ``compute_on``: where to
        evaluate the program when they are not made yet (default: this fingerprinter's
        device) — the residues are the same on every device, and a search's process on a
        GPU machine makes them there for its CPU workers: a 16-head, 8,192-token causal
        attention program takes about 65 s on 2 CPU cores."""
        if self._target is None:
            live = live_graph(self.program)
            if self.device.type != "cpu":
                self._target = _fixed_outputs(live, self.seed, self.fld, self.device)
            else:  # every worker of a search compares with the same outputs: computed once (shared_draws)
                name = shared_draws.key("target", dataflow_key(live), self.seed,
                                        self.fld.p, self.fld.q)
                dev = self.device if compute_on is None else resolve_device(compute_on)
                arrays = shared_draws.load_or_make(
                    name, lambda: [o.cpu().numpy() for o in _fixed_outputs(live, self.seed, self.fld, dev)])
                self._target = [torch.from_numpy(a) for a in arrays]
        return self._target

    def matches(self, graph: KernelGraph, stop_at: float | None = None) -> bool:
        """Whether ``graph``'s fingerprint equals the program's. ``stop_at`` (monotonic; None:
        no limit): the evaluation raises :class:`~verify.field.EvaluationStopped` once past it
        — the caller's deadline, for a candidate whose evaluation would outlast it."""
        target = self.target()
        live = live_graph(graph)
        if [tuple(t.shape) for t in live.outputs] != [tuple(t.shape) for t in target]:
            return False
        picks = sample_blocks(live, self.seed, self.per_axis)
        if picks:
            outs = _fixed_outputs(live, self.seed, self.fld, self.device, picks, stop_at)
            for t, o, want in zip(live.outputs, outs, target):
                if not torch.equal(o, _at(want, _written(live, t, picks))):
                    self.sample_rejected += 1
                    return False
        self.full += 1
        outs = _fixed_outputs(live, self.seed, self.fld, self.device, stop_at=stop_at)
        return all(torch.equal(o, want) for o, want in zip(outs, target))


def _written(graph: KernelGraph, t, picks: dict[int, Picks]) -> list[list[int]] | None:
    """Per dim, the elements of output ``t`` that the sampled evaluation holds (None: all)."""
    for op in graph.ops:
        if op.id in picks and t in op.outputs:
            block = op.attrs["block"]
            return saved_positions(block, block.savers[op.outputs.index(t)], picks[op.id])
    return None


def _at(x: torch.Tensor, positions: list[list[int]] | None) -> torch.Tensor:
    """``x`` at ``positions`` (per dim, a list of indices), in that order."""
    for d, ix in enumerate(positions or ()):
        if len(ix) < x.shape[d]:
            x = x.index_select(d, torch.tensor(ix, dtype=torch.long, device=x.device))
    return x
