"""The float check (docs/design.md §4.9): exact field equivalence says nothing about rounding,
overflow or cancellation, so the candidate also runs in low precision on random
real inputs and is compared with the float64 reference.

Per case (dtype × input magnitude): inputs ``N(0, scale²)`` are drawn once,
rounded to the dtype, and used by every run; the reference graph in float64 on
those same rounded inputs is the ground truth ``R``. The candidate in the dtype
(as the lowered kernels compute: values in device memory held in the dtype, values
inside a kernel kept in float32 registers, a matmul's operands rounded to the dtype)
gives ``C``.

**Per output, per element.** Each output is compared on its own, element by
element: the error of element ``e`` is ``|C_e − R_e| / (M_e + tiny)``, where
``M_e`` is the *magnitude* of the reference's computation of that element
(:class:`MagnitudeAlgebra`: the same graph in float64 with every op replaced by
its first-order error propagation — ``|a| + |b|`` for a sum, ``|a|·|b|`` for a
product, ``Σ|a||b|`` for a matmul, …), and ``tiny`` the dtype's smallest normal
number. Rounding in a dtype with unit roundoff ``u`` moves an element by a small
multiple of ``u·M_e``, so the tolerance scales with each element's own
magnitude: no output, and no part of an output (a concatenation of a part scaled
by 2^40 and a small one), can hide a wrong value under a larger one, and an
element that cancels to ~0 is still allowed the rounding of the terms that
cancelled. A case passes when every output is finite and its worst element
error is ``≤ max(tol[dtype], slack × err_ref)``, where ``err_ref`` is the
reference graph's own worst error in the same dtype on that output — a
candidate may be as inaccurate as the program it replaces, a little more, never
much more. NaN never passes, nor an infinity of the wrong sign; a candidate's overflow to
±inf counts as the dtype's largest finite value of that sign (what a saturating store
holds), so it passes only at the edge of the range where the reference is as far off. Where ``R`` itself is not finite, or the reference
graph overflows in that dtype (or is grossly inaccurate), that output says nothing
about the candidate and is skipped — the other outputs are still judged; skips are
reported, never silent, and a case with no output left is skipped as a whole.

Accumulators are kept in float32 (:class:`KernelFloatAlgebra`), as the lowering
keeps them (docs/design.md §7.6: fp32 loop-carried values): a loop that sums squares past
the float16 range is fine on the GPU and must not fail here.

:func:`compare_float64` is the same per-element comparison between two graphs in
float64, with a tolerance of ``1e-7`` — the verifier's fallback where the field
cannot decide (a mismatch through ``sqrt``) and the fuzz's ground truth.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from mugraph.core.algebra import Algebra, FloatAlgebra, window
from mugraph.core.errors import ConfigError, InputError
from mugraph.core.ops import is_contraction
from mugraph.core.interpreter import evaluate
from mugraph.core.ir import KernelGraph

from . import args, fused
from .analysis import check_compatible
from .field import eval_threads, reuse_memory
from .verdict import FloatCase, FloatReport

#: worst per-element errors allowed, in units of the element's magnitude (fp16: 10-bit
#: mantissa, u = 4.9e-4; bf16: 7-bit, u = 3.9e-3; fp32: 23-bit, u = 6e-8)
TOLERANCES = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}
DEFAULT_DTYPES = ("float16", "bfloat16", "float32")
#: input standard deviations: ordinary activations and large magnitudes
DEFAULT_SCALES = (0.25, 1.0, 16.0)
SLACK = 4.0
#: a reference graph this inaccurate in a dtype says nothing about a candidate
MEANINGLESS = 0.25
#: float64 comparison (:func:`compare_float64`): per-element tolerance in units of magnitude
FLOAT64_RTOL = 1e-7

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

#: per compute dtype: ``exp`` takes its fast path on ``[lo, hi]``, is exactly 0 at or below
#: ``zero`` and infinite at or above ``inf``
_EXP_RANGES = {torch.float32: (-80.0, 80.0, -104.0, 89.0), torch.float64: (-700.0, 700.0, -746.0, 710.0)}


def exp(x: torch.Tensor) -> torch.Tensor:
    """``torch.exp(x)``, bit for bit, without its slow path: on the CPU an element whose
    result is denormal, zero or infinite costs 15–40× a normal one, and the float
    check's large input magnitudes make most attention scores such elements (a third
    of a check's time at full shapes). Elements in the normal range are computed as
    usual, those beyond the saturation points set to 0 or inf, and the few in between
    (denormal results, the edge of overflow) computed alone."""
    r = _EXP_RANGES.get(x.dtype)
    if r is None or x.device.type != "cpu":
        return torch.exp(x)
    lo, hi, zero, inf = r
    out = torch.clamp(x, lo, hi).exp_()
    if fused.available(x) and x.is_contiguous():
        edge = fused.saturate(x, out, lo, hi, zero, inf)
        if len(edge):
            flat = out.view(-1)
            flat[edge] = torch.exp(x.view(-1)[edge])
        return out
    small, large = x < lo, x > hi
    if bool(small.any()):
        out.masked_fill_(x <= zero, 0.0)
        edge = small & (x > zero)
        out[edge] = torch.exp(x[edge])
    if bool(large.any()):
        out.masked_fill_(x >= inf, math.inf)
        edge = large & (x < inf)
        out[edge] = torch.exp(x[edge])
    return out


class KernelFloatAlgebra(FloatAlgebra):
    """:class:`~mugraph.core.algebra.FloatAlgebra` as the lowered kernels round, on
    ``device`` (torch tensors stay where they are: on a GPU the check runs there):
    an op between kernels computes in float32 and stores the dtype; inside a block
    graph values stay float32 (registers), accumulators included, a matmul's operands
    are rounded to the dtype, and a saver's tile is stored in the dtype. Modelling
    every block op as stored in the dtype would fail correct kernels, e.g. a fused
    RMSNorm·matmul whose un-normalized product exceeds the float16 range only in
    registers."""

    def __init__(self, dtype: str = "float64", device: str | torch.device = "cpu") -> None:
        super().__init__(dtype)
        self.device = torch.device(device)

    def input(self, name, value, shape, dtype):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.layout == torch.strided:
            return value.detach().to(self.device, self.store)
        return super().input(name, value, shape, dtype).to(self.device)

    def accumulate(self, v, axis):
        return v.to(self.compute).sum(dim=axis, keepdim=True)

    def apply(self, kind, inputs, attrs):
        return self._compute(kind, inputs, attrs).to(self.store)

    def block_apply(self, kind, inputs, attrs):
        """Inside a kernel values stay in registers in float32, as the lowering keeps
        them; only a matmul's operands are rounded to the dtype first (a tensor-core
        dot reads them in it). Device memory — a saver, an op between kernels — holds
        the dtype (:meth:`to_memory`, :meth:`apply`)."""
        if is_contraction(kind):
            inputs = [x.to(self.store) for x in inputs]
        return self._compute(kind, inputs, attrs)

    def to_memory(self, v):
        return v.to(self.store)

    def _compute(self, kind, inputs, attrs):
        """The op in the compute dtype, not yet stored (the float facet's row unless
        :data:`KERNEL_FLOAT_ROWS` replaces it)."""
        ins = [x.to(self.compute) for x in inputs]
        row = KERNEL_FLOAT_ROWS.get(kind)
        return row(self, ins, attrs) if row is not None else Algebra.apply(self, kind, ins, attrs)


#: rows of :class:`KernelFloatAlgebra` that replace the float facet's
#: (``mugraph.core.algebra.FLOAT_OPS``): the same values, computed faster
KERNEL_FLOAT_ROWS = {
    # without the CPU's slow path, bit for bit the same
    "exp": lambda alg, xs, at: exp(xs[0]),
}


class MagnitudeAlgebra(Algebra):
    """float64 values paired with their *magnitudes* ``M ≥ |value|``: the scale of
    the terms an element is computed from, so that rounding with unit roundoff
    ``u`` changes the element by a small multiple of ``u·M`` (running error
    analysis, first order, constants dropped).

    | op | value | magnitude |
    |---|---|---|
    | add, sub | ``a ± b`` | ``Ma + Mb`` |
    | mul, square, matmul, sum | as usual | on the magnitudes (``Ma·Mb``, ``Ma @ Mb``, ``Σ Ma``) |
    | div | ``a/b`` | ``(Ma + |a/b|·Mb) / |b|`` |
    | exp | ``e = exp(a)`` | ``e·(1 + Ma)`` (an absolute error δ in ``a`` is a relative one in ``e``) |
    | sqrt | ``s = sqrt(a)`` | ``s + Ma / (2·max(s, sqrt(Ma)))`` |
    | silu | ``silu(a)`` | ``|silu(a)| + 1.1·Ma`` (``|silu'| ≤ 1.1``) |
    | scale, const | ``c·a``, ``c`` | ``|c|·Ma``, ``|c|`` |
    | max | ``max a`` | ``max Ma`` |
    """

    name = "magnitude"

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)

    def input(self, name, value, shape, dtype):
        if not isinstance(value, torch.Tensor):
            raise InputError(f"input {name!r}: the magnitude algebra takes torch tensors")
        v = value.detach().to(self.device, torch.float64)
        return v, v.abs()

    def output(self, v, as_torch):
        return v

    def accumulate(self, v, axis):
        return tuple(x.sum(dim=axis, keepdim=True) for x in v)


def _unpack(xs):
    return [x[0] for x in xs], [x[1] for x in xs]


def _div(alg, xs, at):
    (a, b), (ma, mb) = _unpack(xs)
    v = a / b
    return v, (ma + v.abs() * mb) / b.abs()


def _exp(alg, xs, at):
    (a,), (ma,) = _unpack(xs)
    e = exp(a)
    return e, e * (1 + ma)


def _sqrt(alg, xs, at):
    (a,), (ma,) = _unpack(xs)
    s = torch.sqrt(a)
    return s, s + ma / (2 * torch.maximum(s, torch.sqrt(ma)))


#: the share of its magnitude by which a silu's input may be off (rounding of any float check
#: included) when its slope is bounded on the interval that error spans (:func:`_silu`)
SILU_INPUT_SLACK = 1 / 16


def _silu(alg, xs, at):
    """``silu(a)``: an error ``δ`` in ``a`` moves it by at most ``max|silu'|·δ`` over the
    interval ``a ± δ``: 1.1 anywhere, and ``|silu'(a + δ)|`` where the whole interval lies
    below −3 (there ``|silu'|`` grows with its argument). Without that, a silu of a hugely
    negative argument (``silu(2^29·x)`` for ``x < 0``, exactly 0 in float64) would get a
    magnitude ~``2^29`` and hide a real difference from ``silu(x)`` in its tolerance."""
    (a,), (ma,) = _unpack(xs)
    sig = torch.sigmoid(a)
    v = a * sig
    hi = a + SILU_INPUT_SLACK * ma
    s_hi = torch.sigmoid(hi)
    slope = torch.where(hi <= -3, (s_hi * (1 + hi * (1 - s_hi))).abs(), torch.full_like(a, 1.1))
    return v, v.abs() + slope * ma


def _const(alg, xs, at):
    c = float(at["value"])
    return (torch.full(tuple(at["shape"]), c, dtype=torch.float64, device=alg.device),
            torch.full(tuple(at["shape"]), abs(c), dtype=torch.float64, device=alg.device))


def _both(fn):
    """A row computing the same function of values and of magnitudes."""
    return lambda alg, xs, at: (fn([x[0] for x in xs], at), fn([x[1] for x in xs], at))


#: magnitude evaluation (the float check's rounding scale): op name -> row(algebra, (value, magnitude)s, attrs)
MAGNITUDE_OPS = {
    "matmul": _both(lambda xs, at: torch.matmul(xs[0], xs[1])),
    "add": lambda alg, xs, at: (xs[0][0] + xs[1][0], xs[0][1] + xs[1][1]),
    "sub": lambda alg, xs, at: (xs[0][0] - xs[1][0], xs[0][1] + xs[1][1]),
    "mul": _both(lambda xs, at: xs[0] * xs[1]),
    "div": _div, "exp": _exp, "sqrt": _sqrt, "silu": _silu, "const": _const,
    "square": _both(lambda xs, at: xs[0] * xs[0]),
    "scale": lambda alg, xs, at: (xs[0][0] * float(at["c"]), xs[0][1] * abs(float(at["c"]))),
    "sum": _both(lambda xs, at: xs[0].sum(dim=at["dim"], keepdim=True)),
    "max": _both(lambda xs, at: xs[0].amax(dim=at["dim"], keepdim=True)),
    "concat": _both(lambda xs, at: torch.cat(xs, dim=at["dim"])),
    "reshape": _both(lambda xs, at: xs[0].reshape(tuple(at["shape"]))),
    "repeat": _both(lambda xs, at: xs[0].repeat(*at["reps"])),
    "permute": _both(lambda xs, at: xs[0].permute(*at["perm"])),
    "slice": _both(lambda xs, at: xs[0][window(at)]),
}
MagnitudeAlgebra.ops = MAGNITUDE_OPS



def magnitudes(graph: KernelGraph, inputs: dict[str, torch.Tensor],
               device: str | torch.device = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(value, magnitude)`` of every output of ``graph`` in float64 (:class:`MagnitudeAlgebra`)."""
    with torch.no_grad():
        return evaluate(graph, inputs, MagnitudeAlgebra(device))


def element_errors(outs: Sequence[torch.Tensor], refs: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   tiny: float, fmax: float = math.inf) -> list[tuple[float, tuple[int, ...]] | None]:
    """Per output: the worst ``|out − ref| / (M + tiny)`` over its elements and where,
    or None if the output is not finite. An element that overflowed to ±inf with the
    sign of its float64 value ``r`` counts as ``±fmax``, the dtype's largest finite
    number — what a saturating store would hold — so it is within tolerance only
    where ``r`` is at the edge of the range (or the reference program is as far off
    there); a NaN, or an infinity of the wrong sign, makes the output not finite.
    Without ``fmax`` (the reference graph's side) every infinity does."""
    worst = []
    for o, (r, m) in zip(outs, refs):
        o = o.to(torch.float64)
        bad = ~torch.isfinite(o)
        if bool(bad.any()):
            if math.isinf(fmax) or not bool((torch.isinf(o[bad]) & (torch.sign(o[bad]) == torch.sign(r[bad]))).all()):
                worst.append(None)
                continue
            o = torch.where(bad, torch.sign(o) * fmax, o)  # an overflow counts as the largest finite value
        err = (o - r).abs() / (m + tiny)
        if err.numel() == 0:
            worst.append((0.0, ()))
            continue
        flat = int(torch.argmax(err))
        idx = tuple(int(i) for i in np.unravel_index(flat, tuple(err.shape)))
        worst.append((float(err.reshape(-1)[flat]), idx))
    return worst


def normal_inputs(graph: KernelGraph, scale: float, seed: int, dtype: torch.dtype = torch.float64,
                  device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Normal inputs of std ``scale`` in ``dtype`` on ``device`` (by ``seed``, in input-name
    order, from that device's generator: a GPU draws other numbers than the CPU, each the
    same every time)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=g, dtype=dtype, device=device).mul_(scale)
            for t in sorted(graph.inputs, key=lambda t: t.name)}


def float_inputs(graph: KernelGraph, dtype: str, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """Normal inputs of std ``scale``, rounded to ``dtype``, returned as float64."""
    return {k: x.to(_TORCH[dtype]).to(torch.float64) if dtype in _TORCH else x
            for k, x in normal_inputs(graph, scale, seed).items()}


def _check_args(dtypes, scales, seed, tolerances, slack) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """One-line errors for bad arguments of :func:`float_check`."""
    if isinstance(dtypes, str) or not isinstance(dtypes, Sequence) or not dtypes:
        raise ConfigError(f"float_check: dtypes must be a non-empty sequence of {sorted(_TORCH)}, got {dtypes!r}")
    for d in dtypes:
        if d not in _TORCH:
            raise ConfigError(f"float_check: unknown dtype {d!r}; use one of {sorted(_TORCH)}")
    if isinstance(scales, str) or not isinstance(scales, Sequence) or not scales:
        raise ConfigError(f"float_check: scales must be a non-empty sequence of positive numbers, got {scales!r}")
    for s in scales:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s > 0):
            raise ConfigError(f"float_check: every scale must be a finite number > 0, got {s!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"float_check: seed must be an int >= 0, got {seed!r}")
    if tolerances is not None:
        if not isinstance(tolerances, dict):
            raise ConfigError(f"float_check: tolerances must be a dict dtype -> number, got {tolerances!r}")
        for k, v in tolerances.items():
            if k not in _TORCH:
                raise ConfigError(f"float_check: tolerance for unknown dtype {k!r}; use one of {sorted(_TORCH)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ConfigError(f"float_check: tolerance for {k} must be a finite number > 0, got {v!r}")
    if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not (math.isfinite(slack) and slack >= 1):
        raise ConfigError(f"float_check: slack must be a finite number >= 1, got {slack!r}")
    return tuple(dtypes), tuple(float(s) for s in scales)


class _Case:
    """One case of the reference side: the float64 values and magnitudes of the outputs,
    which outputs are finite, the reference graph's own worst errors in the dtype, and
    whether the inputs are the draw made non-negative. The inputs themselves are not kept
    here: they are the scale's draw (:meth:`FloatReference.draw`) rounded to the dtype."""

    __slots__ = ("R", "finite", "ref", "tiny", "positive")

    def __init__(self, R, finite, ref, tiny, positive) -> None:
        self.R, self.finite, self.ref, self.tiny, self.positive = R, finite, ref, tiny, positive


#: bytes of draws and reference outputs a :class:`FloatReference` keeps when not told
FLOAT_CACHE_BYTES = 1 << 28
#: one draw per scale serves every dtype: normals rounded to float32 (the widest dtype of
#: the check), each dtype's inputs rounded from it
DRAW_DTYPE = torch.float32


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class FloatReference:
    """The reference side of :func:`float_check` for one graph, seed, dtypes and
    scales on one device, computed per case when first needed and kept (within
    ``cache_bytes``): the float64 values and magnitudes of its outputs and its own
    errors in the dtype — three of the four evaluations of a case — and, per scale,
    the drawn inputs (float32, on the device; each dtype's inputs are one rounding
    of them). A verifier comparing many candidates with one program
    (:class:`verify.equivalence.Reference`) pays them once per case. The per-case
    results have a budget of their own (as many bytes again): they are small and each
    saves three evaluations, so a program whose weights do not fit pays only for
    drawing them again (the last scale's draw is kept regardless, for the other
    dtypes of that scale)."""

    def __init__(self, graph: KernelGraph, *, seed: int = 0, dtypes: Sequence[str] = DEFAULT_DTYPES,
                 scales: Sequence[float] = DEFAULT_SCALES, device: str | torch.device = "cpu",
                 cache_bytes: int = FLOAT_CACHE_BYTES) -> None:
        self.graph = graph
        self.dtypes, self.scales = _check_args(dtypes, scales, seed, None, SLACK)
        self.seed = seed
        self.device = torch.device(device)
        self.budget = cache_bytes  # for draws
        self.case_budget = cache_bytes  # for per-case results
        self._cases: dict[tuple[int, str], _Case] = {}
        self._draws: dict[int, dict[str, torch.Tensor]] = {}
        self._last: tuple[int, dict] | None = None

    def matches(self, graph: KernelGraph, dtypes, scales, seed: int) -> bool:
        return graph is self.graph and tuple(dtypes) == self.dtypes and tuple(scales) == self.scales \
            and seed == self.seed

    def draw(self, i: int) -> dict[str, torch.Tensor]:
        """Scale ``i``'s inputs: normals of std ``scales[i]`` rounded to float32, on the device."""
        got = self._draws.get(i)
        if got is None and self._last is not None and self._last[0] == i:
            got = self._last[1]
        if got is None:
            # drawn in float32 itself: torch's CPU normals cost 3× as much in float64 (2.1 against
            # 0.64 s for a 4096×14336 weight on one core), and are rounded to float32 here anyway;
            # on the device that runs the check: a gated MLP's three 4096×14336 weights took 1.6 s
            # a scale on the CPU (2 cores), drawn again for every candidate, since they exceed
            # the cache, where a GPU draws them in milliseconds
            got = normal_inputs(self.graph, self.scales[i], self.seed + i, DRAW_DTYPE, self.device)
            self._last = (i, got)
            size = _nbytes(got.values())
            if size <= self.budget:
                self.budget -= size
                self._draws[i] = got
        return got

    def inputs(self, i: int, dtype: str, positive: bool) -> dict[str, torch.Tensor]:
        """Case (scale ``i``, ``dtype``)'s inputs, as both graphs of the check read them
        (``positive``: the case's :attr:`_Case.positive`)."""
        ins = {k: x.to(_TORCH[dtype]) for k, x in self.draw(i).items()}
        return {k: x.abs() for k, x in ins.items()} if positive else ins

    def prepare(self) -> None:
        """Every case computed now (and kept within the budget), so a check reads them."""
        for i in range(len(self.scales)):
            for dtype in self.dtypes:
                self.case(i, dtype)

    def case(self, i: int, dtype: str) -> _Case:
        """Case (scale index ``i``, ``dtype``): computed, or kept from an earlier call."""
        got = self._cases.get((i, dtype))
        if got is not None:
            return got
        ins = self.inputs(i, dtype, positive=False)
        R = magnitudes(self.graph, ins, self.device)
        finite = _finite(R)
        positive = False
        if not all(finite):
            # outside the program's domain — a piece of a norm gets the mean of squares as an
            # input and takes its sqrt: a negative draw there means nothing. The same draw made
            # non-negative is used when it leaves more outputs finite
            pos = self.inputs(i, dtype, positive=True)
            R_pos = magnitudes(self.graph, pos, self.device)
            finite_pos = _finite(R_pos)
            if sum(finite_pos) > sum(finite):
                ins, R, finite, positive = pos, R_pos, finite_pos, True
        tiny = float(torch.finfo(_TORCH[dtype]).tiny)
        with torch.no_grad():
            # the reference graph's own overflow is not saturated: that output is skipped (module docstring)
            ref = element_errors(evaluate(self.graph, ins, KernelFloatAlgebra(dtype, self.device)), R, tiny)
        got = _Case(R, finite, ref, tiny, positive)
        size = _nbytes(t for rm in R for t in rm)
        if size <= self.case_budget:
            self.case_budget -= size
            self._cases[(i, dtype)] = got
        return got


def _finite(R) -> list[bool]:
    """Per output: whether its float64 values and magnitudes are all finite."""
    return [bool(torch.isfinite(r).all() and torch.isfinite(m).all()) for r, m in R]


def float_check(reference: KernelGraph, candidate: KernelGraph, *, dtypes: Sequence[str] = DEFAULT_DTYPES,
                scales: Sequence[float] = DEFAULT_SCALES, seed: int = 0,
                tolerances: dict[str, float] | None = None, slack: float = SLACK,
                device: str | torch.device | None = None, prepared: FloatReference | None = None) -> FloatReport:
    """Run ``candidate`` in each dtype at each input magnitude and compare it with
    ``reference`` in float64, per output and per element (module docstring). Works
    for any graphs, Lax or not. ``device``: where it runs (default: the CPU, or
    ``prepared``'s); ``prepared``: a :class:`FloatReference` of ``reference`` with the
    same seed, dtypes and scales, whose cases are reused (another one is ignored)."""
    check_compatible(reference, candidate)
    dtypes, scales = _check_args(dtypes, scales, seed, tolerances, slack)
    with eval_threads(reference, candidate), reuse_memory(reference, candidate):
        return _float_check(reference, candidate, dtypes, scales, seed, tolerances, slack, device, prepared)


def _float_check(reference, candidate, dtypes, scales, seed, tolerances, slack, device, prepared) -> FloatReport:
    tol = {**TOLERANCES, **(tolerances or {})}
    if prepared is None or not prepared.matches(reference, dtypes, scales, seed):
        dev = torch.device("cpu") if device is None and prepared is None else \
            torch.device(device if device is not None else prepared.device)
        prepared = FloatReference(reference, seed=seed, dtypes=dtypes, scales=scales, device=dev, cache_bytes=0)
    cases = []
    for i, scale in enumerate(scales):
        for dtype in dtypes:
            c = prepared.case(i, dtype)
            with torch.no_grad():
                cand = element_errors(evaluate(candidate, prepared.inputs(i, dtype, c.positive),
                                               KernelFloatAlgebra(dtype, prepared.device)),
                                      c.R, c.tiny, float(torch.finfo(_TORCH[dtype]).max))
            cases.append(_judge(dtype, scale, tol[dtype], slack, c.finite, c.ref, cand))
    return FloatReport(cases)


def _judge(dtype: str, scale: float, base: float, slack: float, finite: list[bool], ref: list,
           cand: list) -> FloatCase:
    """One case, judged output by output: an output whose float64 reference is not
    finite, or whose reference graph overflows or is inaccurate in the dtype, says
    nothing about the candidate there and is skipped (named in the note); every
    other output must be finite and within its own limit."""
    errors = [None if c is None else c[0] for c in cand]
    skipped, judged = [], []
    for o, (f, r) in enumerate(zip(finite, ref)):
        if not f:
            skipped.append(f"output {o}: the float64 reference overflows")
        elif r is None:
            skipped.append(f"output {o}: the reference graph itself overflows in {dtype}")
        elif r[0] > MEANINGLESS:
            skipped.append(f"output {o}: the reference graph itself is inaccurate in {dtype} (error {r[0]:.2g})")
        else:
            judged.append(o)
    note = "; ".join(skipped) + (" at this magnitude" if skipped else "")
    if not judged:
        return FloatCase(dtype, scale, None, None, base, None, note, errors=errors)
    bad = [o for o in judged if cand[o] is None]
    worst_ref = max(ref[o][0] for o in judged)
    if bad:
        return FloatCase(dtype, scale, None, worst_ref, base, False,
                         "; ".join([f"NaN/Inf in the candidate's output {bad[0]}"] + skipped), output=bad[0],
                         errors=errors)
    limits = {o: max(base, slack * ref[o][0]) for o in judged}
    # the output that exceeds its limit by the largest factor (else the one closest to it)
    o = max(judged, key=lambda k: cand[k][0] / limits[k])
    ok = all(cand[k][0] <= limits[k] for k in judged)
    return FloatCase(dtype, scale, cand[o][0], ref[o][0], limits[o], ok, note, o, list(cand[o][1]), errors)


#: the further input scales of :func:`differs`, relative to the first: those at which a
#: constant near a 31-bit prime times a product of two inputs, or times one input, is of
#: order one
SMALLER_SCALES = (2.0 ** -15, 2.0 ** -30)


def differs(a: KernelGraph, b: KernelGraph, *, seed: int = 0, draws: int = 2, scale: float = 0.5,
            rtol: float = FLOAT64_RTOL) -> bool | None:
    """Whether ``a`` and ``b`` compute different real functions: :func:`compare_float64`,
    and where that finds no difference, the same comparison again at inputs
    :data:`SMALLER_SCALES` times smaller (a difference there counts); None if the first
    run is not finite (undecided).

    Why the second look: an element's magnitude grows with the magnitude of its exponent
    (``exp(a)`` has ``e·(1 + M_a)``), so an exponent scaled by a constant near 2^31 makes
    the tolerance ``rtol·M`` larger than the element itself. Without a max such an exponent
    overflows (undecided); in a safe softmax the shift keeps it finite — a softmax of
    scores ×2^29 is a hard max — and at ``scale`` the comparison would call it the same as
    the softmax it replaced. At a smaller scale its exponents are of order one again. A
    difference seen at any scale is real (beyond the rounding ``rtol·M`` allows)."""
    first = compare_float64(a, b, seed=seed, draws=draws, scale=scale, rtol=rtol)
    if first is False and any(compare_float64(a, b, seed=seed, draws=draws, scale=scale * s, rtol=rtol)
                              for s in SMALLER_SCALES):
        return True
    return first


def compare_float64(a: KernelGraph, b: KernelGraph, *, seed: int = 0, draws: int = 2, scale: float = 0.5,
                    rtol: float = FLOAT64_RTOL) -> bool | None:
    """Whether ``a`` and ``b`` compute different real functions, by float64 runs on
    ``draws`` random normal inputs (std ``scale``): True if some element of some
    output differs by more than ``rtol`` times its magnitude (the larger of the two
    graphs' :class:`MagnitudeAlgebra` magnitudes; ``1e-300`` absolute), False if
    none does, None if a run is not finite (undecided)."""
    check_compatible(a, b)
    args.integer("compare_float64", "seed", seed, 0)
    args.integer("compare_float64", "draws", draws, 1, 1000)
    args.number("compare_float64", "scale", scale, lo=0)
    args.number("compare_float64", "rtol", rtol, lo=0)
    g = torch.Generator().manual_seed(seed)
    for _ in range(draws):
        ins = {t.name: torch.randn(t.shape, generator=g, dtype=torch.float64) * scale
               for t in sorted(a.inputs, key=lambda t: t.name)}
        for (x, mx), (y, my) in zip(magnitudes(a, ins), magnitudes(b, ins)):
            if not all(torch.isfinite(t).all() for t in (x, y, mx, my)):
                return None
            if ((x - y).abs() > rtol * torch.maximum(mx, my) + 1e-300).any():
                return True
    return False
