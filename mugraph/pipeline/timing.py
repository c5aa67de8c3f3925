"""Ranking candidates on a GPU: autotune and time the best predicted ones
(``lower.profile``), each checked against the program in float64 on the card."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

import lower
from verify.floatcheck import float_inputs

from ..errors import MugraphError
from ..interpreter import evaluate
from ..ir import KernelGraph

if TYPE_CHECKING:
    from .results import Candidate


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def time_on_gpu(program: KernelGraph, alive: list[Candidate], top_k: int,
                tune_seconds: float | None = None, timing: str = "graph") -> tuple[Candidate, str]:
    """Autotune and time the ``top_k`` candidates (by prediction) on the GPU; the fastest wins.

    Every timed configuration must match the program evaluated in float64 on the same
    inputs (rel. error ≤ 2e-2 for fp16/bf16, 1e-4 for fp32): a candidate that is wrong on
    the card — fp16 overflow of an intermediate the unfused program stores, say — is
    rejected, never shipped."""
    # the float check's smallest input scale: inside every benchmark's fp16 range (attention
    # without a max subtraction overflows fp16 for inputs of std ≳ 0.5 — the program itself does)
    inputs = float_inputs(program, program.inputs[0].dtype, 0.25, 0)
    ref = [r.to("cuda") for r in evaluate(program, inputs)]
    inputs = {t.name: inputs[t.name].to(getattr(torch, t.dtype)).to("cuda") for t in program.inputs}
    tol = 1e-4 if program.inputs[0].dtype == "float32" else 2e-2
    tried = 0
    for c in alive:
        if c.origin != "program" and tried >= top_k and any(x.measured_s is not None for x in alive):
            continue  # past the top_k; the unfused program is always timed as the safety net
        tried += 1
        try:
            res = lower.profile(c.graph, inputs=inputs, ref=ref, tol=tol, budget_s=tune_seconds, timing=timing)
        except Exception as e:  # the compiler or the card rejects it (resources): never ship it
            c.rejected = f"does not run on this GPU: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        c.measured_s = res.time_s
        c.configs = {k: asdict(v) for k, v in res.configs.items()}
    timed = [c for c in alive if c.measured_s is not None]
    if not timed:
        raise MugraphError("superoptimize: no candidate runs on this GPU: "
                           + "; ".join(c.rejected for c in alive if c.rejected))
    best = min(timed, key=lambda c: c.measured_s)
    return best, (f"fastest of {len(timed)} autotuned and timed on {device_name('cuda')} "
                  f"(median, {timing} timing: lower.profile.TIMINGS)")


def predict_tuned(graph: KernelGraph):
    """The cost model's best kernel configs without a GPU (``lower.tune`` ranks its
    configuration space by the model and times nothing when there is no CUDA)."""
    if torch.cuda.is_available():
        return lower.profile(graph, tune_configs=False)
    return lower.profile(graph)
