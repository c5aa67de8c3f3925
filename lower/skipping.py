"""Loop steps a band mask hides from a whole program, and why skipping them changes nothing
(docs/design.md §7.16).

A causal prompt attention loops over key tiles; for the query rows of one program, every
key tile past the diagonal is masked entirely. Such a step still costs its loads, its
``tl.dot`` and its exponentials, and adds nothing a float can hold: the band's masked
value ``L`` (:data:`mugraph.core.fills.MASKED_VALUE`, −65504 for fp16) drives each score
to ``exp(L + s − M) = 0``. Skipping those steps halves a causal prompt's work.

Whether a step "adds nothing" is a property of the block graph, not of attention, and is
decided by an abstract evaluation of the loop body at a step whose filled tile is ``L``
everywhere. Every loop tile gets one of these kinds:

* ``ZERO`` — exactly 0;
* ``DATA`` — a value computed from the data alone (the masked value cancelled, or never
  entered);
* ``NEG(c)`` — ``c·L + d`` with ``c > 0`` and ``d`` computed from the data: below any
  score by far;
* ``ANY`` — anything else (the step's effect is unknown: no skipping).

The filled tile is ``NEG(1)``, other tiles and loop-invariant values ``DATA``. Sums and
differences add the coefficients (``NEG − NEG`` of equal ``c`` is ``DATA``), a positive
constant factor scales them, ``exp(NEG(c ≥ 1))`` is ``ZERO``, products and contractions
with a ``ZERO`` are ``ZERO``, reductions and rearrangements keep the kind (a sum of ``n``
elements multiplies ``c`` by ``n``). A step adds nothing when every accumulator the loop
updates is left as it was: a sum of ``ZERO``, a running max of ``NEG(c ≥ 1)``, a sum
rescaled to the running max of ``NEG(c ≥ 1)`` (each of its terms is multiplied by
``exp(m_i − M) = 0``) or of ``ZERO`` terms.

The bound: a skipped term is ``exp(s + L − M)`` with ``s`` a masked score and ``M`` a
visible one, exactly 0 in fp32 when ``s − M < |L| − 104``; so the skipping kernel computes
what the full loop computes whenever the scores' magnitudes stay under ``(|L| − 104)/2`` —
32,700 for an fp16 band, about 1.7e38 for bf16 or fp32 (beyond that the full loop lets
masked keys through, which a ``-inf`` mask would not). It also needs each row to see a key
somewhere (:meth:`~mugraph.core.fills.BandMask.every_row_sees`), so that the running max
``M`` is a visible score; a band that hides a whole row is never skipped. The tests compare
both kernels with float64 at logits ×30.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Union

import numpy as np

from mugraph.core.fills import BandMask, eval_bounds
from mugraph.core.ir import RESCALED, RUNNING_MAX, SUM, Op
from mugraph.core.ops import CATALOG, Category, category

if TYPE_CHECKING:
    from .plan import KernelPlan

#: the abstract kinds of a loop tile at a fully masked step (module docstring); NEG(c) is a Fraction c > 0
ZERO, DATA, ANY = "zero", "data", "any"
Kind = Union[str, Fraction]


@dataclass(frozen=True)
class MaskedSteps:
    """The loop steps of one plan that a band mask hides from every row of a program: the
    filled iterator ``op`` (its rows dim ``-2`` fixed per program, its keys dim ``-1``
    iterated), and the band."""

    op: Op
    band: BandMask

    def bounds(self, p: "KernelPlan") -> tuple[str, str]:
        """``(first, end)``: the Triton expressions of the steps a program runs (before
        the split's own range is intersected)."""
        t = self.op.outputs[0]
        rows, keys = p.info.shape(t)[-2], p.info.shape(t)[-1]
        row0 = " + ".join(f"{v} * {n}" for v, n in p.offset_terms(self.op, t.ndim - 2)) or "0"
        key_terms = p.offset_terms(self.op, t.ndim - 1)
        width = next(n for v, n in key_terms if v == "i")
        key0 = " + ".join(f"{v} * {n}" for v, n in key_terms if v != "i") or "0"
        first, end = self.band.step_bounds(row0, rows, key0, width, keys)
        return _literal(first), _literal(end)

    def mean_steps(self, p: "KernelPlan") -> float:
        """Steps a program runs, on average over every program and split (the bounds
        evaluated once over all programs' indices at once)."""
        first, end = self.bounds(p)
        names = [n for n, _ in p.axes]
        grids = np.meshgrid(*(np.arange(g) for _, g in p.axes), indexing="ij") if p.axes else []
        env = {n: g.ravel() for n, g in zip(names, grids)}
        lo_all = np.broadcast_to(eval_bounds(first, env), (p.programs,))
        hi_all = np.broadcast_to(eval_bounds(end, env), (p.programs,))
        runs = [np.clip(np.minimum((s + 1) * p.steps, hi_all) - np.maximum(s * p.steps, lo_all), 0, None)
                for s in range(p.config.split)]
        return float(np.mean(runs))


def _literal(expr: str) -> str:
    """``expr`` as a number where it names no index (one program along the rows)."""
    try:
        return str(eval_bounds(expr, {}))
    except NameError:
        return expr


def masked_steps(p: "KernelPlan") -> MaskedSteps | None:
    """The plan's skippable steps: the first loop-varying band-mask iterator, iterated
    along its keys, under which a fully masked step adds nothing (module docstring);
    ``None`` where there is none."""
    block = p.block
    if block.forloop <= 1:
        return None
    for op in p.schedule.loop:
        if op.kind != "iterator":
            continue
        src = block.sources[op.attrs["source"]]
        band = src.fill
        if not isinstance(band, BandMask) or op.attrs["fmap"] != src.ndim - 1:
            continue
        if not band.every_row_sees(src.shape[-2], src.shape[-1]):
            continue
        if _adds_nothing(p, op):
            return MaskedSteps(op, band)
    return None


def step_kinds(p: "KernelPlan", fill_op: Op) -> dict[int, Kind]:
    """The abstract kind of every loop tile (tensor id -> kind) at a step where
    ``fill_op``'s tile is the masked value everywhere."""
    kinds: dict[int, Kind] = {}
    for op in p.schedule.loop:
        if op.kind != "accum":
            kinds[op.outputs[0].id] = _transfer(op, [_kind(kinds, t) for t in op.inputs], fill_op)
    return kinds


def _kind(kinds: dict[int, Kind], t) -> Kind:
    """Tile ``t``'s kind; loop-invariant tiles (not in ``kinds``) are data."""
    return kinds.get(t.id, DATA)


def _adds_nothing(p: "KernelPlan", fill_op: Op) -> bool:
    """Whether every loop accumulator is left as it was by a fully masked step."""
    kinds = step_kinds(p, fill_op)
    for acc in p.loop_accumulators:
        monoid = p.folds_as(acc)
        x = _kind(kinds, acc.inputs[0])
        if monoid == SUM:
            ok = x == ZERO
        elif monoid == RUNNING_MAX:
            ok = _below(x)
        else:
            assert monoid == RESCALED
            ok = x == ZERO or (_below(_kind(kinds, acc.inputs[1])) and x in (ZERO, DATA))
        if not ok:
            return False
    return bool(p.loop_accumulators)


def _below(k: Kind) -> bool:
    """``NEG(c)`` with ``c ≥ 1``: at least the masked value's own distance below the data."""
    return isinstance(k, Fraction) and k >= 1


def _affine(k: Kind) -> Fraction | None:
    """``k``'s coefficient of the masked value (``DATA``: 0); ``None`` for ``ZERO``/``ANY``."""
    if isinstance(k, Fraction):
        return k
    return Fraction(0) if k == DATA else None


def _of(c: Fraction) -> Kind:
    return DATA if c == 0 else (c if c > 0 else ANY)  # c < 0: far above the data


def _rational(op: Op) -> Fraction:
    """The rational attribute of a constant or a constant factor (its value, its factor)."""
    return Fraction(next(op.attrs[a.name] for a in CATALOG[op.kind].attrs if a.type == "rational"))


def _transfer(op: Op, ins: list[Kind], fill_op: Op) -> Kind:
    """The kind of ``op``'s output from its inputs' kinds (module docstring), from the op's
    catalog entry: its category, Lax class, ``signs``, constant factor, reduction and zero
    padding rule."""
    if op.kind == "iterator":
        return Fraction(1) if op is fill_op else DATA
    if ANY in ins or op.kind not in CATALOG:
        return ANY
    d = CATALOG[op.kind]
    if d.category is Category.CONSTANT:
        return ZERO if _rational(op) == 0 else DATA
    if d.constant_factor:                       # x·c
        c = _rational(op)
        return ZERO if ins[0] == ZERO or c == 0 else _of(_affine(ins[0]) * c)
    if d.signs is not None:                     # ±a ± b
        terms = [(sg, k) for sg, k in zip(d.signs, ins) if k != ZERO]
        if not terms:
            return ZERO
        return _of(sum((sg * _affine(k) for sg, k in terms), Fraction(0)))
    if d.category is Category.CONTRACTION or (d.category is Category.BINARY and d.lax == "multilinear"):
        if ZERO in ins:                         # a product with a zero factor
            return ZERO
        if d.category is Category.BINARY:       # a constant factor scales the masked value's coefficient
            for k, other in ((ins[0], op.inputs[1]), (ins[1], op.inputs[0])):
                if isinstance(k, Fraction) and category(other.op.kind) is Category.CONSTANT:
                    return _of(k * _rational(other.op))
        return DATA if all(k == DATA for k in ins) else ANY
    if d.lax == "division":
        a, b = ins
        return ZERO if a == ZERO and b == DATA else (DATA if a == b == DATA else ANY)
    if d.lax == "exponentiation":               # exp(NEG) underflows to 0
        return ZERO if _below(ins[0]) else (DATA if ins[0] in (DATA, ZERO) else ANY)
    if d.category is Category.UNARY:
        x = ins[0]
        return ZERO if x == ZERO and d.padding.zero == "keeps" else (DATA if x in (DATA, ZERO) else ANY)
    if d.reduction is not None:                 # a sum of n NEG(c) is NEG(n·c); a max keeps the kind
        x = ins[0]
        if isinstance(x, Fraction) and d.reduction.combine == "add":
            return x * op.inputs[0].shape[op.attrs["dim"]]
        return x
    if d.category is Category.REARRANGEMENT:
        return ins[0] if all(k == ins[0] for k in ins) else ANY
    return ANY
