"""GPU profiling and autotuning of lowered μGraphs.

A μGraph fixes its grid, loop and tiles, but leaves the lowering free to choose
``num_warps``, ``num_stages``, split-K (loop iterations spread over programs, then
a combine kernel) and sub-tiles along parallel dims (:mod:`lower.tiles`). The
calibration in DESIGN §6 shows why that matters: the paper's rmsnorm_matmul
kernel launches 96 programs, too few to pull the H100's bandwidth.

:func:`tune` explores, kernel by kernel: first the grid-shaping choices (split,
sub-tiles) ranked by the cost model, the best ``top`` of them timed; then warps ×
stages around the winner. Every time is a median of ``triton.testing.do_bench``
over CUDA-graph replays of the whole program (the same way the baselines in
``examples/bench_kernels.py`` are timed). Without a GPU nothing is timed:
:func:`profile` returns the cost model's choice and says so (``measured=False``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from mugraph.ir import BlockGraph, KernelGraph

from .codegen import KernelConfig
from .cost_model import H100, DeviceParams, estimate
from .tiles import DOT_MIN, analyze


@dataclass
class ProfileResult:
    graph: KernelGraph
    configs: dict[int, KernelConfig]
    time_s: float | None            # measured median (None without a GPU)
    predicted_s: float
    measured: bool
    trials: list[tuple[str, float | None, float]] = field(default_factory=list)  # (label, measured, predicted)
    program: object | None = None

    def summary(self) -> str:
        if not self.measured:
            return (f"{self.graph.name}: no GPU — cost model's choice, predicted {self.predicted_s * 1e6:.1f} us "
                    f"({len(self.trials)} configs ranked)")
        return (f"{self.graph.name}: {self.time_s * 1e6:.1f} us measured, {self.predicted_s * 1e6:.1f} us predicted, "
                f"{len(self.trials)} configs timed")


def grid_choices(block: BlockGraph, max_programs: int = 8192, min_tile: int = DOT_MIN) -> list[tuple[int, tuple]]:
    """(split, sub) pairs the lowering may use for ``block`` (sub-tiles no smaller than ``min_tile``)."""
    info = analyze(block)
    splits = [s for s in (1, 2, 4, 8, 16) if block.forloop % s == 0 and block.forloop // s >= 1]
    par = sorted(info.parallel, key=lambda c: -info.size[c])[:2]
    per_class = []
    for c in par:
        per_class.append([(c, r) for r in (1, 2, 4, 8) if info.size[c] % r == 0 and info.size[c] // r >= min_tile
                          or r == 1])
    out = []
    for s in splits:
        for combo in itertools.product(*per_class) if per_class else [()]:
            sub = tuple((c, r) for c, r in combo if r > 1)
            n = block.num_blocks * s * math.prod(r for _, r in sub)
            if n <= max_programs:
                out.append((s, sub))
    return out


def config_space(block: BlockGraph) -> list[KernelConfig]:
    """Every config :func:`tune` might try for one block graph."""
    out = []
    for (s, sub), w, st in itertools.product(grid_choices(block), (2, 4, 8), (1, 2, 3, 4)):
        out.append(KernelConfig(num_warps=w, num_stages=st, split=s, sub=sub))
    return out


def bench(fn: Callable[[], None], warmup_ms: int = 20, rep_ms: int = 80) -> float:
    """Median seconds of ``fn`` (events; L2 flushed between runs by do_bench)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e-3


def _time(graph, configs, inputs) -> tuple[float, object]:
    from .runtime import compile as lower_compile

    prog = lower_compile(graph, device="cuda", configs=configs, use_z3=True)
    fn = prog.runner(**inputs)
    return bench(fn), prog


def tune(graph: KernelGraph, inputs: dict[str, torch.Tensor] | None = None, top: int = 4,
         device_params: DeviceParams = H100, warps=(4, 8), stages=(2, 3, 4), log: Callable | None = None
         ) -> ProfileResult:
    """Choose a :class:`KernelConfig` for every graph-defined op (see the module docstring)."""
    gpu = torch.cuda.is_available()
    blocks = [op for op in graph.ops if op.kind == "graph_defined"]
    configs: dict[int, KernelConfig] = {op.id: KernelConfig(num_stages=3) for op in blocks}
    trials: list[tuple[str, float | None, float]] = []
    if gpu and inputs is None:
        from .testing import random_inputs

        inputs = random_inputs(graph, 0, device="cuda")
    best_t = None
    for op in blocks:
        cands = []
        for s, sub in grid_choices(op.attrs["block"]):
            c = KernelConfig(num_warps=4, num_stages=3, split=s, sub=sub)
            cands.append((estimate(graph, device_params, {**configs, op.id: c}), c))
        cands.sort(key=lambda x: x[0])
        if not gpu:
            configs[op.id] = cands[0][1]
            trials += [(c.label(), None, p) for p, c in cands]
            continue
        timed = []
        for pred, c in cands[:top]:
            try:
                t, _ = _time(graph, {**configs, op.id: c}, inputs)
            except Exception as e:  # a config the compiler rejects (resources) is skipped
                if log:
                    log(f"  {op.id} {c.label()} failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            timed.append((t, c))
            trials.append((f"k{op.id}:{c.label()}", t, pred))
            if log:
                log(f"  k{op.id} {c.label():24s} {t * 1e6:8.2f} us  (pred {pred * 1e6:.2f})")
        if not timed:
            continue
        t0, c0 = min(timed, key=lambda x: x[0])
        for w, st in itertools.product(warps, stages):
            c = KernelConfig(num_warps=w, num_stages=st, split=c0.split, sub=c0.sub)
            if c == c0:
                continue
            try:
                t, _ = _time(graph, {**configs, op.id: c}, inputs)
            except Exception:
                continue
            pred = estimate(graph, device_params, {**configs, op.id: c})
            trials.append((f"k{op.id}:{c.label()}", t, pred))
            if log:
                log(f"  k{op.id} {c.label():24s} {t * 1e6:8.2f} us")
            if t < t0:
                t0, c0 = t, c
        configs[op.id] = c0
        best_t = t0
    pred = estimate(graph, device_params, configs)
    if not gpu:
        return ProfileResult(graph, configs, None, pred, False, trials)
    if best_t is None:
        best_t, prog = _time(graph, configs, inputs)
    else:  # re-time the final program once more (the spread between runs is the noise)
        best_t, prog = _time(graph, configs, inputs)
    return ProfileResult(graph, configs, best_t, pred, True, trials, prog)


def profile(graph: KernelGraph, inputs: dict[str, torch.Tensor] | None = None, tune_configs: bool = True,
            configs: dict[int, KernelConfig] | None = None, **kw) -> ProfileResult:
    """Time ``graph`` on the GPU (autotuned unless ``tune_configs=False``); without
    a GPU, return the cost model's choice with ``measured=False``."""
    if tune_configs and configs is None:
        return tune(graph, inputs, **kw)
    configs = dict(configs or {})
    pred = estimate(graph, kw.get("device_params", H100), configs)
    if not torch.cuda.is_available():
        return ProfileResult(graph, configs, None, pred, False)
    if inputs is None:
        from .testing import random_inputs

        inputs = random_inputs(graph, 0, device="cuda")
    t, prog = _time(graph, configs, inputs)
    return ProfileResult(graph, configs, t, pred, True, [("given", t, pred)], prog)
