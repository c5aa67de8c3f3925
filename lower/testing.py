"""Random valid μGraphs, inputs and a checker, for testing lowering.

The graphs come from the one generator of random μGraphs, :mod:`mugraph.core.randgraph`
(the verifier's fuzz draws from it too), under its lowering profile: every block op
of the catalog, 1–3 grid axes, loops, dims both imapped and fmapped, replicated
inputs, several savers, post-loop ops, broadcasting of tiles, odd sizes (padding +
masks), chains of graph-defined kernels and pre-defined ops between them, with
numerics kept tame so a float64 comparison is meaningful.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from mugraph.core.interpreter import evaluate
from mugraph.core.ir import KernelGraph
from mugraph.core.randgraph import LOWERING, random_ugraph


def random_graph(seed: int, dtype: str = "float32", max_tries: int = 50) -> KernelGraph:
    """A random valid μGraph (deterministic in ``seed``): :func:`mugraph.core.randgraph.random_ugraph`
    under the lowering's profile (:data:`mugraph.core.randgraph.LOWERING`) with ``dtype`` inputs."""
    return random_ugraph(seed, replace(LOWERING, dtype=dtype), max_tries)


def random_inputs(graph: KernelGraph, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Uniform [−1, 1) inputs, but none for a filled input (the program makes it)."""
    g = torch.Generator().manual_seed(seed)
    return {t.name: (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1)
            .to(getattr(torch, t.dtype)).to(device) for t in graph.inputs if t.fill is None}


def bench_inputs(graph: KernelGraph, seed: int = 0, device: str = "cuda") -> dict[str, torch.Tensor]:
    """fp16 inputs uniform in [−0.5, 0.5), drawn on ``device``: what the H100 scripts
    (``examples/bench_kernels.py``, ``examples/sweep_configs.py``) time."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {t.name: ((torch.rand(t.shape, generator=gen, device=device) * 2 - 1) * 0.5).half()
            for t in graph.inputs if t.fill is None}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when ``out`` has a NaN/Inf (e.g. an unwritten element)."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        return math.inf
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den > 0 else 1.0)


def check(prog, graph: KernelGraph, inputs: dict[str, torch.Tensor]) -> list[float]:
    """Run ``prog`` into NaN-poisoned outputs and compare with the float64 interpreter."""
    refs = evaluate(graph, {k: v.to("cpu", torch.float64) for k, v in inputs.items()})
    dev = next(iter(inputs.values())).device
    outs = [torch.full(t.shape, float("nan"), dtype=getattr(torch, t.dtype), device=dev) for t in graph.outputs]
    prog(**inputs, out=outs)
    return [rel_error(o, r) for o, r in zip(outs, refs)]
