"""The float check (DESIGN §4): exact field equivalence says nothing about rounding,
overflow or cancellation, so the candidate also runs in low precision on random
real inputs and is compared with the float64 reference.

Per case (dtype × input magnitude): inputs ``N(0, scale²)`` are drawn once,
rounded to the dtype, and used by every run; the reference graph in float64 on
those same rounded inputs is the ground truth ``R``. The candidate in the dtype
(values stored in it, each op computed in float32 as a GPU kernel with fp32
accumulation does) gives ``C``; it passes when it is finite and
``‖C − R‖/‖R‖ ≤ max(tol[dtype], slack × err_ref)`` for every output, where
``err_ref`` is the reference graph's own error in the same dtype — a candidate
may be as inaccurate as the program it replaces, a little more, never much more.
NaN/Inf never pass. When ``R`` itself is not finite, or the reference graph
overflows in that dtype, the case says nothing about the candidate and is skipped
(reported, never silently).

Accumulators are kept in float32 (:class:`KernelFloatAlgebra`), as the lowering
keeps them (DESIGN §6: fp32 loop-carried values): a loop that sums squares past
the float16 range is fine on the GPU and must not fail here.
"""

from __future__ import annotations

from typing import Sequence

import torch

import mugraph as mg
from mugraph.algebra import FloatAlgebra
from mugraph.ir import KernelGraph

from .analysis import check_compatible
from .verdict import FloatCase, FloatReport

#: relative-error tolerances by dtype (fp16: 10-bit mantissa, bf16: 7-bit, fp32: 23-bit)
TOLERANCES = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}
DEFAULT_DTYPES = ("float16", "bfloat16", "float32")
#: input standard deviations: ordinary activations and large magnitudes
DEFAULT_SCALES = (0.25, 1.0, 16.0)
SLACK = 4.0
#: a reference graph this inaccurate in a dtype says nothing about a candidate
MEANINGLESS = 0.25

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class KernelFloatAlgebra(FloatAlgebra):
    """:class:`~mugraph.algebra.FloatAlgebra` with float32 accumulators (the next op
    computes in float32 anyway and stores its result in the dtype)."""

    def accumulate(self, v, axis):
        return v.to(self.compute).sum(dim=axis, keepdim=True)


def _rel_errors(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> float | None:
    """Max over outputs of ‖out − ref‖/‖ref‖ in float64; None if any is not finite."""
    worst = 0.0
    for o, r in zip(outs, refs):
        o = o.to(torch.float64)
        if not torch.isfinite(o).all():
            return None
        n = torch.linalg.vector_norm(r).item()
        d = torch.linalg.vector_norm(o - r).item()
        worst = max(worst, d / n if n > 0 else d)
    return worst


def float_inputs(graph: KernelGraph, dtype: str, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """Normal inputs of std ``scale``, rounded to ``dtype``, returned as float64."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for t in sorted(graph.inputs, key=lambda t: t.name):
        x = torch.randn(t.shape, generator=g, dtype=torch.float64) * scale
        out[t.name] = x.to(_TORCH[dtype]).to(torch.float64)
    return out


def float_check(reference: KernelGraph, candidate: KernelGraph, *, dtypes: Sequence[str] = DEFAULT_DTYPES,
                scales: Sequence[float] = DEFAULT_SCALES, seed: int = 0,
                tolerances: dict[str, float] | None = None, slack: float = SLACK) -> FloatReport:
    """Run ``candidate`` in each dtype at each input magnitude and compare it with
    ``reference`` in float64 (module docstring). Works for any graphs, Lax or not."""
    check_compatible(reference, candidate)
    tol = {**TOLERANCES, **(tolerances or {})}
    cases = []
    for i, scale in enumerate(scales):
        for dtype in dtypes:
            if dtype not in _TORCH:
                raise mg.InputError(f"float_check: unknown dtype {dtype!r}; use one of {sorted(_TORCH)}")
            ins = float_inputs(reference, dtype, scale, seed + i)
            with torch.no_grad():
                R = mg.evaluate(reference, ins, FloatAlgebra("float64"))
                base = tol[dtype]
                if not all(torch.isfinite(r).all() for r in R):
                    cases.append(FloatCase(dtype, scale, None, None, base, None,
                                           "the float64 reference overflows at this magnitude"))
                    continue
                ref_err = _rel_errors(mg.evaluate(reference, ins, KernelFloatAlgebra(dtype)), R)
                cand_err = _rel_errors(mg.evaluate(candidate, ins, KernelFloatAlgebra(dtype)), R)
            if ref_err is None:
                cases.append(FloatCase(dtype, scale, cand_err, None, base, None,
                                       f"the reference graph itself overflows in {dtype} at this magnitude"))
                continue
            if ref_err > MEANINGLESS:
                cases.append(FloatCase(dtype, scale, cand_err, ref_err, base, None,
                                       f"the reference graph itself is inaccurate in {dtype} at this magnitude "
                                       f"(error {ref_err:.2g})"))
                continue
            limit = max(base, slack * ref_err)
            ok = cand_err is not None and cand_err <= limit
            note = "" if cand_err is not None else "NaN/Inf in the candidate's output"
            cases.append(FloatCase(dtype, scale, cand_err, ref_err, limit, ok, note))
    return FloatReport(cases)
