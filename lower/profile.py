"""GPU profiling and autotuning of lowered μGraphs.

A μGraph fixes its grid, loop and tiles, but leaves the lowering free to choose
``num_warps``, ``num_stages``, split-K (loop iterations spread over programs, then
a combine kernel), sub-tiles along parallel dims (:mod:`lower.tiles`) and, for
matmuls with fewer than 16 rows or columns, ``tl.dot`` or a CUDA-core broadcast
multiply-and-sum (``KernelConfig.small_mm``). The
calibration in docs/design.md §7.13 shows why that matters: the paper's rmsnorm_matmul
kernel launches 96 programs, too few to pull the H100's bandwidth.

:func:`tune` explores, kernel by kernel: first the grid-shaping choices (split,
sub-tiles, loop re-chunking, how split-K partials are combined) ranked by the
cost model, the best ``top`` of them timed; then warps × stages around the
winner. Every timed variant is first checked against float64 outputs. Every time
is a median over CUDA-graph replays of the whole program (:func:`measure`, one of
:data:`TIMINGS` — the same way the baselines in ``examples/bench_kernels.py`` are
timed). Without a GPU nothing is timed: :func:`profile` returns the cost model's choice
and says so (``measured=False``). The configs it ranks and times are
:func:`first_round` and the :func:`neighbours` of the best; every decision about a
config is read from its kernel plan (:func:`lower.plan.plan`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable
from weakref import WeakKeyDictionary

import torch

from mugraph.core.checks import _is_sequence, short, strict_int
from mugraph.core.errors import ArgumentTypeError, ConfigError, InputError, MugraphError, ResourceError
from mugraph.core.ir import DEFAULT_SMEM_BUDGET, BlockGraph, KernelGraph
from mugraph.core.ops import is_contraction

from .cold_inputs import cycling, rotated_sets
from .compile_guard import bounded_compiles
from .config import MAX_STAGES, MAX_WARPS, KernelConfig, KernelConfigError, configs_for
from .cost_model import DeviceParams, default_params, estimate, for_timing, residency
from .layout import k_major, solve as solve_layout
from .memory import padded_shared_memory
from .plan import KernelPlan, plan
from .precompile import Precompiler, kernel_job, shared as shared_precompiler, summary as precompile_summary
from .runtime import capture_graph, compile as lower_compile
from .testing import random_inputs, rel_error
from .tiles import CORE_PRODUCT_MAX, DOT_MIN, SMALL_MM, core_product, loop_chunks, per_frozen_block, shared_analyses
from .tuning_order import ErrorModel, layout_steps


@dataclass
class ProfileResult:
    graph: KernelGraph
    configs: dict[int, KernelConfig]
    time_s: float | None            # measured median (None without a GPU)
    predicted_s: float
    measured: bool
    trials: list[tuple[str, float | None, float]] = field(default_factory=list)  # (label, measured, predicted)
    program: object | None = None
    #: every whole-program configuration timed (:func:`program_key` -> seconds; None: it failed),
    #: what a later :func:`tune` call given it as ``history`` does not run again
    timings: dict[str, float | None] = field(default_factory=dict)
    #: the budget stopped some kernel's tuning before every configuration it plans had run
    cut: bool = False
    #: configurations timed whose compile a worker process had done ahead (:mod:`lower.precompile`)
    compiled_ahead: int = 0

    def summary(self) -> str:
        if not self.measured:
            return (f"{self.graph.name}: no GPU — cost model's choice, predicted {self.predicted_s * 1e6:.1f} us "
                    f"({len(self.trials)} configs ranked)")
        return (f"{self.graph.name}: {self.time_s * 1e6:.1f} us measured, {self.predicted_s * 1e6:.1f} us predicted, "
                f"{len(self.trials)} configs timed")


#: the largest split-K factor the tuner tries
MAX_SPLIT = 24


def split_factors(loop: int) -> list[int]:
    """The split-K factors the tuner tries for a loop of ``loop`` steps: every divisor up to
    :data:`MAX_SPLIT` (each program then runs ``loop // s`` steps, none masked). Not only
    powers of two: a static KV cache of 8,192 + 256 slots is 132 steps of 64 keys, whose
    power-of-two splits stop at 4 (128 programs for 32 heads, under one wave of 132 SMs,
    each 33 steps long); 2,304 slots are 36 steps, split at most 4 ways. The cost model
    prices 12 ways 16–20 % below 4 for both (one query row, head dim 96, H200 parameters)."""
    return [s for s in range(1, min(loop, MAX_SPLIT) + 1) if loop % s == 0]


def grid_choices(block: BlockGraph, max_programs: int = 8192, min_tile: int = DOT_MIN) -> list[tuple[int, tuple]]:
    """(split, sub) pairs the lowering may use for ``block`` (sub-tiles no smaller than ``min_tile``)."""
    info = plan(block).info
    splits = split_factors(block.forloop)
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


SMALL_MM_MENU = ("dot", "v")
"""The small-matmul lowerings :func:`tune` times by default. ``"va"`` (un-reduced
accumulation) is left out: on the H100 it lost to ``"v"`` on every config measured
(rmsnorm_matmul b=1 best 31.7 vs 23.7 μs, gated_mlp b=1 46 vs 35; docs/history/lowering.md, small-M matmuls)."""


def small_mm_modes(block: BlockGraph, sub: tuple = (), chunk: int = 1, menu=SMALL_MM) -> list[str]:
    """Ways to lower ``block``'s small matmuls (:data:`lower.tiles.SMALL_MM`, those in
    ``menu``) that differ from ``tl.dot`` everywhere: ``"v"`` when some matmul has a
    real m or n below 16, ``"va"`` when one of those also feeds an accumulator
    directly (and its un-reduced product fits :data:`lower.tiles.DEFER_MAX`).
    ``"dot"`` always, first. Neither CUDA-core mode where its broadcast product passes
    :data:`lower.tiles.CORE_PRODUCT_MAX` while the ``tl.dot`` form fits shared memory: it
    spills, and its trials cost seconds each."""
    def the_plan(mm: str) -> KernelPlan:
        return plan(block, KernelConfig(sub=sub, chunk=chunk, small_mm=mm))

    modes = ["dot"]
    if "v" not in menu and "va" not in menu:
        return modes
    cores, dot = the_plan("v"), the_plan("dot")
    if cores.info.dot_ops == dot.info.dot_ops:  # no small matmul: nothing moves off tl.dot
        return modes
    if core_product(cores.info) > CORE_PRODUCT_MAX and padded_shared_memory(dot) <= DEFAULT_SMEM_BUDGET:
        return modes  # the product spills, and the tiling runs on tl.dot
    if "v" in menu:
        modes.append("v")
    if "va" in menu and the_plan("va").info.deferred:
        modes.append("va")
    return modes


def small_mm_menu(op, source_strides: list[tuple[int, ...]], menu=SMALL_MM_MENU) -> tuple[str, ...]:
    """The small-matmul lowerings worth timing for kernel ``op`` whose sources lie with
    ``source_strides``: ``menu`` less the CUDA-core ones when a matmul they would move off
    ``tl.dot`` reads its right operand k-major (:func:`lower.layout.k_major`: Kᵀ of a
    key-major KV cache) while its left operand is the same every step of the kernel's loop
    (a decode's query rows, loaded once). Phi-3-mini's one-row decode over 2,304 keys (H200) ran 28.1 μs
    so on the CUDA cores against 11.3–11.6 with ``tl.dot``, and the cost model, which sees
    no strides, priced the CUDA cores first. A projection's GEMV, whose activation and
    k-major weight both step along k, keeps them: Gemma-2B's output projection ran 4.65 μs
    on the CUDA cores over its weight's transposed view (H200). A menu without ``"dot"`` is
    the caller's own and kept."""
    if "dot" not in menu or len(menu) == 1:
        return tuple(menu)
    blk = op.attrs["block"]
    if blk.forloop <= 1:  # measured in a loop only
        return tuple(menu)
    cores = plan(blk, KernelConfig(small_mm="v")).info.dot_ops
    # (a tile after the loop, acc 1, is computed once: the same at every step too)
    if any(k_major(b.inputs[1], source_strides) and (b.inputs[0].acc == 1 or blk.loop_invariant(b.inputs[0]))
           for b in blk.ops if is_contraction(b.kind) and b.id not in cores):
        return ("dot",)
    return tuple(menu)


def layout_choices(block: BlockGraph, max_programs: int = 8192, min_tile: int = DOT_MIN,
                   small_mm=SMALL_MM_MENU) -> list[tuple[int, tuple, int, str, str]]:
    """(split, sub, chunk, combine, small_mm) choices for ``block``: the grid shape,
    the loop's re-chunking, how split-K partials are combined, and how small
    matmuls are lowered (:func:`small_mm_modes` of the ``small_mm`` menu)."""
    out = []
    chunks = loop_chunks(plan(block).info)
    for s, sub in grid_choices(block, max_programs, min_tile):
        for c in chunks:
            if (block.forloop // s) % c:
                continue
            modes = small_mm_modes(block, sub, c, small_mm)
            for comb in (("kernel", "last") if s > 1 else ("kernel",)):
                for mm in modes:
                    out.append((s, sub, c, comb, mm))
    return out


def rechunks(block: BlockGraph) -> bool:
    """Whether the lowering may re-chunk ``block``'s loop (:func:`lower.tiles.loop_chunks`
    offers a factor above 1): a loop of one step cannot, nor one whose sums are rescaled to
    a running maximum (each step's shift is its own tile's)."""
    try:
        return loop_chunks(plan(block).info) != [1]
    except KernelConfigError:
        return True  # not lowerable at the default config: nothing to say about its loop


def stage_all_choices(block: BlockGraph, cfg: KernelConfig, p: KernelPlan | None = None) -> tuple[bool, ...]:
    """``KernelConfig.stage_all_loads`` values worth timing for ``block`` laid out as ``cfg``:
    both where a loop with a ``tl.dot`` also loads a tile Triton does not stage unasked
    (:attr:`lower.plan.KernelPlan.unpipelined_loads`; H100 rmsnorm_matmul b=8: staging it
    28.8 → 20.2 μs without split-K, 21.4 → 21.5 with it — the grid decides), else only
    ``False`` (dot-free loops: asking measured slower, docs/history/lowering.md, rmsnorm_matmul b=8 probed).
    ``p``: the layout's plan where the caller made one (at any warps: the staging does not
    depend on them)."""
    if block.forloop <= 1:
        return (False,)
    p = p if p is not None else plan(block, cfg)
    return (False, True) if p.loop_has_dot and p.unpipelined_loads else (False,)


#: seconds past a kernel's budget share after which, if none of its configurations has run,
#: it stops trying more (:meth:`_KernelTuning.hopeless`)
NONE_RAN_GRACE_S = 30.0


#: fp32 registers a thread the largest loop-carried tile (an accumulator, or a ``tl.dot``'s
#: result in the loop) may take at the first round's warps before it starts at twice the warps
FIRST_ROUND_REGS = 64


def first_round_warps(p: KernelPlan) -> int:
    """The warps the first round times the layout planned as ``p`` at: 4, or 8 where the
    largest fp32 tile the loop carries or a loop ``tl.dot`` makes would take more than
    :data:`FIRST_ROUND_REGS` registers a thread at 4. Why: short tunings (a few seconds a
    candidate under a model's budget) time the first round and little of the sweep, and a
    128 × 128 tile at 4 warps spills — a prompt attention at head dim 128 (H200): 128-row
    tiles 328–417 μs at 4 warps and 3 stages, 176–190 at 8; 64-row tiles 177 at 4, 333 at 8. A
    loop-free kernel's CUDA-core operands count too (:attr:`lower.plan.KernelPlan.core_operands`):
    one row times Mistral-7B's v projection (4096 × 1024) as 64 programs of one 4,096-deep step
    ran 7.88–7.92 μs at 4 warps, 5.70 at 8 (H200)."""
    info = p.info
    tiles = [op.outputs[0] for op in p.block.ops
             if op.id in p.loop_ops and (op.kind == "accum" or op.id in info.dot_ops)] + p.core_operands
    largest = max((math.prod(info.padded(t)) for t in tiles), default=0)
    return 8 if largest > FIRST_ROUND_REGS * 32 * 4 and MAX_WARPS >= 8 else 4


#: first rounds already listed, per frozen block and small-matmul menu: a candidate's check, its
#: re-ranking plan, its tuning budget and its tuning each list the same one (configs only: an
#: entry goes with its block)
_FIRST_ROUNDS: WeakKeyDictionary = WeakKeyDictionary()


def first_round(block: BlockGraph, small_mm=SMALL_MM_MENU) -> list[KernelConfig]:
    """The configs :func:`tune` ranks first for ``block``: every layout choice at 3 stages
    and 4 warps (8 where a loop tile would spill at 4: :func:`first_round_warps`), with each
    of its load-staging choices."""
    return list(per_frozen_block(_FIRST_ROUNDS, block, tuple(small_mm), lambda: tuple(_first_round(block, small_mm))))


def _first_round(block: BlockGraph, small_mm) -> list[KernelConfig]:
    out = []
    for s, sub, ch, comb, mm in layout_choices(block, small_mm=small_mm):
        c = KernelConfig(num_warps=4, num_stages=3, split=s, sub=sub, chunk=ch, combine=comb, small_mm=mm)
        try:  # one plan for both questions (its staging does not depend on the warps)
            p = plan(block, c)
        except KernelConfigError:
            p = None
        if p is not None:
            c = dataclasses.replace(c, num_warps=first_round_warps(p))
        out += [dataclasses.replace(c, stage_all_loads=a) for a in stage_all_choices(block, c, p)]
    return out


def load_choices(block: BlockGraph) -> tuple[bool, ...]:
    """``KernelConfig.split_loads`` values worth timing: both where a loop tile feeds a
    ``tl.dot`` operand and other ops (:attr:`lower.plan.KernelPlan.dot_operand_loads`;
    H100 rmsnorm_matmul b=1: split loads 20.1 μs at w4s3k4L, one load 24.2; but at w2s4c2
    29.6 vs 21.5 — no single answer; docs/history/lowering.md, split loads), else only ``True``."""
    return (True, False) if plan(block).dot_operand_loads else (True,)


def neighbours(block: BlockGraph, base: KernelConfig, warps, stages) -> list[KernelConfig]:
    """The configs :func:`tune` times around ``base`` (a layout it measured best): its
    layout at every ``warps`` × ``stages`` × :func:`load_choices` × :func:`stage_all_choices`.

    The staging choices are those of ``base``'s layout *unstaged*: a base that stages every
    load (label ``A``) has no unstaged loads left, and asking its own plan would drop ``A``
    from the sweep — the tuner kept w4s3c4A on rmsnorm_matmul b=8 where a sweep found
    w2s5c2A at 19.83 μs."""
    unstaged = dataclasses.replace(base, stage_all_loads=False)
    return [KernelConfig(num_warps=w, num_stages=st, split=base.split, sub=base.sub, chunk=base.chunk,
                         combine=base.combine, small_mm=base.small_mm, split_loads=sl, stage_all_loads=a)
            for w, st, sl, a in itertools.product(warps, stages, load_choices(block),
                                                   stage_all_choices(block, unstaged))]


_FLUSH: dict = {}


def _flush_l2() -> None:
    """Evict L2 by *reading* 256 MB (5x the H100's L2): L2 is left holding clean lines,
    so no write-back of the flush lands inside the timed region (zero-filling a buffer,
    as ``do_bench`` does, leaves 50 MB of dirty lines to write back during the run)."""
    buf = _FLUSH.get("buf")
    if buf is None:
        buf = _FLUSH["buf"] = torch.ones(64 * 2**20, dtype=torch.float32, device="cuda")
        _FLUSH["out"] = torch.empty((), dtype=torch.float32, device="cuda")
    torch.sum(buf, dim=0, out=_FLUSH["out"])


TIMINGS = {
    "graph": "triton.testing.do_bench_cudagraph: calls unrolled in one CUDA graph, warm L2, median of 10 replays",
    "cold": "one CUDA-graph replay per call, L2 evicted (256 MB read, left clean) before each",
    "warm": "one CUDA-graph replay per call, back to back on the same buffers",
    "dram": "as graph, each call on its own copy of the inputs of 1 MiB or more (2x the L2 read between two "
            "uses of a copy): weights and caches from DRAM, as in a model's step",
}
"""How a program is timed (name -> the line tables print); every table says which. All of them replay CUDA graphs
and report a median, for ours and every PyTorch baseline alike:

* ``"graph"`` (default): ``triton.testing.do_bench_cudagraph`` — many calls unrolled
  into one CUDA graph, L2 warm, the graph's launch cost amortized: each call costs its
  kernels plus the gaps between them. The method behind the target baselines of
  docs/design.md §8.5 (torch.compile: rmsnorm_matmul b=1 22.1 μs, ntrans b=1 2.5 μs).
* ``"cold"``: one call per graph replay, L2 evicted (left clean) before each — the
  setting of the memory floor; adds one graph launch (~4.8 μs measured) to every call.
* ``"warm"``: one call per graph replay, replays back to back on the same buffers.
* ``"dram"``: as ``"graph"``, but the calls cycle through copies of the large inputs
  (:mod:`lower.cold_inputs`), so weights and KV caches come from DRAM as they do in a
  model's step while activations stay in L2. Needs the inputs: :func:`measure_on`.
  The ``torch.compile`` backend tunes and judges its pieces so.
"""


def measure(launch: Callable[[], object], timing: str = "graph", rep_ms: int = 20) -> float:
    """Median seconds of one ``launch()`` under ``timing`` (:data:`TIMINGS`).

    ``launch`` must be capturable into a CUDA graph (no host synchronization)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {tuple(TIMINGS)}, got {timing!r}")
    if timing == "dram":
        raise ValueError("timing 'dram' copies the inputs: time with lower.profile.measure_on(make, inputs, 'dram')")
    if timing == "graph":
        import triton.testing

        # do_bench_cudagraph calls launch() uncaptured first (compiles happen there)
        return triton.testing.do_bench_cudagraph(launch, rep=rep_ms, return_mode="median") * 1e-3
    return bench(capture_graph(launch), flush=timing == "cold")


def measure_on(make: Callable[[Any], Callable[[], object]], inputs: Any, timing: str = "graph",
               sets: list | None = None) -> float:
    """Median seconds of ``make(inputs)()`` under ``timing`` (:data:`TIMINGS`). ``"dram"``
    makes one launch per set of :func:`lower.cold_inputs.rotated_sets` (``sets``: those sets,
    made once by a caller that times many launches on the same inputs) and times them in
    turn, as ``"graph"`` times one; the other timings time ``make(inputs)``."""
    if timing == "dram":
        return measure(cycling([make(s) for s in sets or rotated_sets(inputs)]), "graph")
    return measure(make(inputs), timing)


def measure_together(launches: dict[str, Callable[[], object]], timing: str = "graph",
                     rounds: int = 5) -> dict[str, float]:
    """Median seconds of each of ``launches`` (name -> launch, as :func:`measure` takes),
    timed side by side: ``rounds`` rounds, each timing every launch once in turn, and the
    median of each one's rounds. A table's ours-vs-baseline ratio compares programs timed
    at different moments otherwise, across the minute or more of other work (compiles,
    tuning) between them, while the card's clocks and temperature drift."""
    import statistics

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    times: dict[str, list[float]] = {name: [] for name in launches}
    for _ in range(rounds):
        for name, launch in launches.items():
            times[name].append(measure(launch, timing))
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(fn: Callable[[], None], flush: bool = True, rep_ms: int = 60, max_reps: int = 400) -> float:
    """Median seconds of one call of ``fn`` (a CUDA-graph replay), timed with events.

    ``flush=True`` ("cold"): L2 is evicted (left clean, :func:`_flush_l2`) before
    every call, so inputs come from DRAM — the setting of the memory floor.
    ``flush=False`` ("warm"): back-to-back calls on the same buffers, ``n`` between
    two events (the CPU runs ahead, so the gaps are the GPU's own); whatever fits
    in L2 stays there (the target baselines of docs/design.md §8.5 are reproduced by the graph timer, not this one).
    """
    import statistics

    fn()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(5):
        fn()
    t1.record()
    torch.cuda.synchronize()
    est = max(t0.elapsed_time(t1) / 5, 1e-3)  # ms
    if not flush:
        n = max(1, min(200, int(0.5 / est)))
        times = []
        for _ in range(max(5, min(50, int(rep_ms / (est * n))))):
            t0.record()
            for _ in range(n):
                fn()
            t1.record()
            torch.cuda.synchronize()
            times.append(t0.elapsed_time(t1) / n)
        return statistics.median(times) * 1e-3
    reps = max(20, min(max_reps, int(rep_ms / (est + 0.1))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        _flush_l2()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends)) * 1e-3


def strides_of(inputs: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The strides of the inputs that are not row-major (``lower.compile(input_strides=)``)."""
    return {k: tuple(v.stride()) for k, v in inputs.items() if not v.is_contiguous()}


def _time(graph, configs, inputs, ref=None, tol: float = 2e-2, timing: str = "graph",
          sets: list | None = None) -> tuple[float, object, float]:
    """Compile with ``configs``, check against ``ref`` (float64 outputs; poisoned
    output buffers), time. Returns (seconds, program, worst relative error). An input handed in
    as a strided view (a transposed weight) is read in place (:func:`strides_of`): the time is
    that of the layout the caller runs, not of a copy into row-major order."""
    prog = lower_compile(graph, device="cuda", configs=configs, use_z3=True, input_strides=strides_of(inputs))
    err = 0.0
    if ref is not None:
        outs = [torch.full(t.shape, float("nan"), dtype=o.dtype, device="cuda")
                for t, o in zip(graph.outputs, prog.outputs)]
        prog(**inputs, out=outs)
        err = max(rel_error(o, r) for o, r in zip(outs, ref))
        if not err <= tol:
            raise ValueError(f"wrong result: relative error {err:.2e} > {tol}")
    return measure_on(lambda s: prog.launcher(**s), inputs, timing, sets), prog, err


def _pick(cands: list[tuple[float, KernelConfig]], top: int,
          waves: Callable[[KernelConfig], tuple[float, int]] | None = None) -> list[tuple[float, KernelConfig]]:
    """The first-round configs :func:`tune` times, from ``cands`` ((prediction, config),
    best first), in the order :func:`_split_factors_first` gives.

    Per small-matmul lowering ("dot" first): the best ``top`` by prediction (``top // 2``
    for the CUDA-core lowerings), round-robin over (split, combine, staging) groups so that
    each way of shaping the grid is measured at least once when the model ties; then the
    best of every (split, chunk) pair not yet picked. The model's per-SM terms are rough:
    rmsnorm_matmul ranks 96 programs first, yet split-K 4 — 384 programs, a balanced grid
    on 132 SMs — measures 20 % faster (docs/history/lowering.md, balanced grids); gated_mlp b=8: no split, chunk 2
    measured 25.2 μs, predicted 35.6, while its top pick measured 27.4 (lower/calibration.py).
    """
    picked = []
    for mm in [m for m in SMALL_MM if any(c.small_mm == m for _, c in cands)]:
        mine = [x for x in cands if x[1].small_mm == mm]
        n = top if mm == "dot" else max(2, top // 2)
        groups: dict = {}
        for pred, c in mine:
            groups.setdefault((c.split > 1, c.combine, c.stage_all_loads), []).append((pred, c))
        got = []
        while len(got) < min(n, len(mine)):
            for g in sorted(groups.values(), key=lambda v: v[0][0] if v else float("inf")):
                if g and len(got) < n:
                    got.append(g.pop(0))
        for s, ch in sorted({(c.split, c.chunk) for _, c in mine} - {(c.split, c.chunk) for _, c in got}):
            got.append(min((x for x in mine if (x[1].split, x[1].chunk) == (s, ch)), key=lambda x: x[0]))
        picked += got
    return _split_factors_first(picked, waves)


def _split_factors_first(picked: list[tuple[float, KernelConfig]],
                         waves: Callable[[KernelConfig], tuple[float, int]] | None = None) -> list[tuple[float, KernelConfig]]:
    """The order :func:`tune` times the first round in: the best predicted config of every
    split-K factor first (in order of prediction), then the rest by prediction — a budget
    that ends inside the first round has then measured each degree of parallelism once.
    The model's per-SM terms are what it gets most wrong: decode_h32 b=8's single kernel (64
    blocks on 132 SMs) has 46 first-round picks, its split-K 8 and 16 ranked 12th–17th.

    With ``waves`` (a config's programs over what the SMs hold at once, and the loop steps
    each program runs), the best predicted factor leads unless it is held back (below), then
    the factors predicted within :data:`NEAR_TIE` of it follow by how full they leave the
    chip's one wave, the fullest first. A memory-bound loop pulls faster
    the more of its programs each SM keeps in flight, which the model does not see while its
    bytes in flight already cover the latency: Phi-3-mini's decode attention (264 steps,
    five programs an SM) measured 51.5, 43.1, 33.6, 32.4 and 30.6 μs at split-K 4, 6, 8, 11
    and 12 (128–384 programs), then 41.8 and 44.2 at 22 and 24 (a second wave), where the
    model priced split-K 8 to 12 within 7 % and its tuning reached split-K 8 only. A factor
    that needs a second wave, or leaves a program fewer than twice its pipeline's stages in
    loop steps, follows by prediction: the same kernel over 2,304 keys (72 steps) ran
    12.4 μs at split-K 12 (six steps a program) and 14.5 at 18 (four). The best predicted leads
    because where splitting buys nothing the fullest wave is a split: Phi-3-mini's gated
    projection (3072 → 2 × 8192, one row), priced flat within 10 % over its factors, ran 25.4 μs
    unsplit (the model's pick) and 27.0–29.2 at split-K 2–6, which the fullest-wave order timed
    first (lower/data/h200_sweeps.jsonl.gz, "gated silu")."""
    ordered = sorted(picked, key=lambda x: x[0])
    head: dict[int, tuple[float, KernelConfig]] = {}
    for x in ordered:
        if x[0] < float("inf"):
            head.setdefault(x[1].split, x)
    first = list(head.values())
    if waves is not None and first:
        near = [x for x in first if x[0] <= first[0][0] * NEAR_TIE]

        fill = {id(x): waves(x[1]) for x in near}   # each plans the kernel: once a pick

        def held_back(x: tuple[float, KernelConfig]) -> bool:
            w, steps = fill[id(x)]
            return w > 1 or steps < 2 * x[1].num_stages

        def rank(x: tuple[float, KernelConfig]) -> tuple[bool, float]:
            return held_back(x), x[0] if held_back(x) else -fill[id(x)][0]
        lead = next((x for x in near if not held_back(x)), None)   # the best priced that may run
        near = ([lead] if lead is not None else []) + sorted((x for x in near if x is not lead), key=rank)
        first = near + first[len(near):]
    return first + [x for x in ordered if not any(x is h for h in first)]


#: warps and stages :func:`tune` sweeps around its first round's winner
WARPS, STAGES = (1, 2, 4, 8, 16), (2, 3, 4, 5)
#: seconds one configuration costs :func:`tune` on the H100: a Triton compile (~1 s) and its timing
SECONDS_PER_CONFIG = 1.5
#: the second-best first-round layout is swept too when it measured within this factor of the best
SECOND_LAYOUT = 1.1
#: the first round's combine pair (or small-matmul lowerings) decides the later split factors' mode only
#: when one mode measured faster by more than this factor (Phi-3-mini's decode attention, H200: 8-10 %)
COMBINE_MARGIN = 1.03
#: a value the first pick's siblings decided applies to a later split factor's pick only where the
#: model prices the pick with it within this factor of the pick itself: a mode measured faster at one
#: layout is not always faster at another (Phi-3-mini's down projection, one row, 8192 → 3072, H200:
#: the CUDA-core product of 16-column programs at split-K 2 ran 17.1 μs against tl.dot's 18.1, and
#: of 32-column programs at split-K 4 and 8 ran 23.2 and 38.2 against 15.5 and 15.7)
CONFORM_SPREAD = 1.25
#: the layout choices the first round times its first pick in every value of, to time the later
#: split-K factors in the one that measured clearly faster (:meth:`_KernelTuning.first_round`)
SIBLING_FIELDS = ("combine", "small_mm")
#: split-K factors whose best first-round predictions lie within this factor of the best are timed
#: fullest wave first (:func:`_split_factors_first`)
NEAR_TIE = 1.1
#: with a budget, first-round picks whose corrected prediction is more than this factor over the
#: fastest measured are timed only after the layout climb and the sweeps
DEFER = 1.5
#: how far down a kernel's timing order configurations are handed to the worker processes that
#: compile ahead (:mod:`lower.precompile`; the pool itself keeps a few per worker under way)
AHEAD_LOOK = 32


@dataclass
class _KernelSpace:
    """What :func:`tune` does for one kernel: its first-round candidates ranked by the cost
    model ((prediction, config), best first), the picks it times, and the sweep sizes."""

    cands: list[tuple[float, KernelConfig]]
    picked: list[tuple[float, KernelConfig]]
    sweep: int          # configs around one winner (warps × stages × load modes × staging)
    climb: int          # configs of a layout climb of two steps from the best-predicted pick

    @property
    def head(self) -> int:
        """How many of ``picked`` lead as the best of each split-K factor (:func:`_split_factors_first`)."""
        return len({c.split for p, c in self.picked if p < math.inf})


def _space(graph: KernelGraph, op, configs: dict, top: int, warps, stages, small_mm,
           device_params: DeviceParams) -> _KernelSpace:
    blk = op.attrs["block"]
    cands = sorted(((estimate(graph, device_params, {**configs, op.id: c}), c)
                    for c in first_round(blk, small_mm)), key=lambda x: x[0])
    dev = device_params or default_params()

    def waves(c: KernelConfig) -> tuple[float, int]:
        p = plan(blk, c)
        return p.programs * c.split / (dev.sms * residency(op, c, dev)["resident"]), p.steps
    picked = _pick(cands, top, waves)
    sts = stages if blk.forloop > 1 else (3,)
    sweep = len(neighbours(blk, cands[0][1], warps, sts)) if cands else 0
    picks = {c for _, c in picked}
    climb = 2 * len([c for c in layout_steps(cands[0][1], [c for _, c in cands]) if c not in picks]) if cands else 0
    return _KernelSpace(cands, picked, sweep, climb)


def config_space(graph: KernelGraph, top: int = 6, warps=WARPS, stages=STAGES, small_mm=SMALL_MM_MENU,
                 device_params: DeviceParams | None = None) -> dict[int, int]:
    """Per graph-defined kernel, how many configurations :func:`tune` times when no budget
    stops it: its first-round picks, a layout climb of two steps and the sweeps around two
    winning layouts (a rough bound: a second layout is swept only when it measures close to
    the best; a climb ends where no neighbour is faster). The GPU re-ranking sizes each
    candidate's tuning time by it (``mugraph.pipeline.timing``)."""
    out = {}
    with shared_analyses():
        for op in graph.ops:
            if op.kind == "graph_defined":
                sp = _space(graph, op, {}, top, warps, stages, small_mm, device_params)
                out[op.id] = len(sp.picked) + sp.climb + 2 * sp.sweep
    return out


def _budget_ends(graph: KernelGraph, blocks: list, budget_s: float, t_start: float, top: int,
                 warps: tuple[int, ...], stages: tuple[int, ...], small_mm: tuple[str, ...],
                 device_params: DeviceParams) -> dict[int, float]:
    """When each kernel's share of ``budget_s`` ends (``time.monotonic`` seconds, by op id): the
    budget is shared in proportion to the kernels' configuration spaces (:func:`config_space`),
    and the shares are cumulative, so time one kernel leaves unused passes to the next."""
    sizes = config_space(graph, top, warps, stages, small_mm, device_params)
    total, acc = max(1, sum(sizes.values())), 0
    ends: dict[int, float] = {}
    for op in blocks:
        acc += sizes[op.id]
        ends[op.id] = t_start + budget_s * acc / total
    return ends


@dataclass
class _TuneCall:
    """What the kernels of one :func:`tune` call share: how a configuration is checked and
    timed, the configs chosen so far (each kernel is timed inside the whole program, the
    kernels before it at the configs they were given), and what the call reports."""

    graph: KernelGraph
    blocks: list                     # the graph-defined ops, in graph order
    inputs: dict[str, torch.Tensor] | None
    ref: Any
    tol: float
    timing: str
    log: Callable[[str], object] | None
    history: Mapping[str, float | None] | None
    device_params: DeviceParams
    warps: tuple[int, ...]
    stages: tuple[int, ...]
    configs: dict[int, KernelConfig]
    trials: list[tuple[str, float | None, float]] = field(default_factory=list)
    timings: dict[str, float | None] = field(default_factory=dict)
    cut: bool = False                # a kernel's budget share stopped it before its plan was done
    #: worker processes compiling the configurations to be timed next (None: each is
    #: compiled at its first launch, here)
    precompiler: Precompiler | None = None
    #: stands in for compiling and timing on the GPU: the program's configs -> seconds (None:
    #: it did not run); :mod:`lower.replay` replays the tuner's order against recorded times
    timer: Callable[[dict[int, KernelConfig]], float | None] | None = None

    @functools.cached_property
    def compile_layout(self):
        """The layout ``lower.compile`` solves for every configuration :func:`_time` compiles
        (Z3, the inputs' own strides): the same for all of them, so solved once for the jobs
        the workers that compile ahead are given (:func:`lower.precompile.kernel_job`)."""
        return solve_layout(self.graph, use_z3=True, input_strides=strides_of(self.inputs))

    @functools.cached_property
    def input_sets(self) -> list | None:
        """The copies of the inputs a ``"dram"`` timing cycles through, made once for every
        configuration the call times (:func:`lower.cold_inputs.rotated_sets`)."""
        return rotated_sets(self.inputs) if self.timing == "dram" else None


@dataclass
class _KernelTuning:
    """One kernel's tuning on the GPU: the configs timed so far, those tried, and the cost
    model's error on this kernel learned as they are timed — what each step reads to choose
    what to time next (:meth:`choose` runs the steps)."""

    call: _TuneCall
    op: Any                          # the graph-defined op being tuned
    end: float | None                # when its budget share ends (None: no budget)
    timed: list[tuple[float, KernelConfig]] = field(default_factory=list)
    seen: set[KernelConfig] = field(default_factory=set)
    #: the cost model's error on this kernel, learned as it is timed
    errors: ErrorModel = field(default_factory=ErrorModel)

    @property
    def block(self) -> BlockGraph:
        return self.op.attrs["block"]

    def fastest(self) -> KernelConfig:
        """The config timed fastest so far (the first of equals)."""
        return min(self.timed, key=lambda x: x[0])[1]

    def over(self) -> bool:
        """This kernel's share of the budget is spent (once one configuration has run)."""
        return self.end is not None and bool(self.timed) and time.monotonic() > self.end

    def run(self, c: KernelConfig, pred: float) -> float | None:
        """Seconds of the whole program with this kernel at ``c`` (None: it failed or the budget
        is spent); taken from ``history`` when an earlier call timed it."""
        call, op = self.call, self.op
        key = program_key(call.blocks, {**call.configs, op.id: c})
        if call.history is not None and key in call.history:  # timed by an earlier call: not again
            t = call.timings[key] = call.history[key]
            if t is not None:
                call.trials.append((f"k{op.id}:{c.label()}", t, pred))
                self.errors.observe(c, pred, t)
            return t
        if self.over():
            call.cut = True
            return None
        failed = call.precompiler.claim(key, self.end) if call.precompiler is not None else None
        if failed is not None:  # a worker's compile of it failed in Triton's compiler: so would this one
            call.timings[key] = None
            if call.log:
                call.log(f"  k{op.id} {c.label()} failed (compiled ahead): {failed[:160]}")
            return None
        try:
            if call.timer is not None:
                t, err = call.timer({**call.configs, op.id: c}), 0.0
            else:
                t, _, err = _time(call.graph, {**call.configs, op.id: c}, call.inputs, call.ref, call.tol,
                                  call.timing, call.input_sets)
        except Exception as e:  # a config the compiler rejects (resources), or a wrong result
            call.timings[key] = None
            if call.log:
                call.log(f"  k{op.id} {c.label()} failed: {type(e).__name__}: {str(e)[:160]}")
            return None
        if t is None:
            call.timings[key] = None
            return None
        call.timings[key] = t
        call.trials.append((f"k{op.id}:{c.label()}", t, pred))
        self.errors.observe(c, pred, t)
        if call.log:
            call.log(f"  k{op.id} {c.label():24s} {t * 1e6:8.2f} us  (pred {pred * 1e6:.2f}, err {err:.1e})")
        return t

    def hopeless(self) -> bool:
        """Nothing has run and this kernel's share was spent :data:`NONE_RAN_GRACE_S` ago: its
        configurations fail or take minutes to compile (:mod:`lower.compile_guard`), and
        trying the rest one by one would hold the tuning for as long again each."""
        return self.end is not None and not self.timed and time.monotonic() > self.end + NONE_RAN_GRACE_S

    def ahead(self, cs: list[KernelConfig]) -> None:
        """Hand the configurations ``cs`` (next first) to the worker processes that compile
        ahead (:mod:`lower.precompile`), those not tried nor in the history."""
        call, pre = self.call, self.call.precompiler
        if pre is None:
            return
        jobs = []
        for c in cs:
            configs = {**call.configs, self.op.id: c}
            key = program_key(call.blocks, configs)
            if c in self.seen or (call.history is not None and key in call.history):
                continue
            jobs.append((key, functools.partial(kernel_job, call.graph, configs, self.op.id,
                                                layout=call.compile_layout)))
        pre.ahead(jobs)

    def time_one(self, pred: float, c: KernelConfig) -> None:
        """Time ``c`` unless it was tried already (or the kernel is :meth:`hopeless`)."""
        if c in self.seen or self.hopeless():
            return
        self.seen.add(c)
        t = self.run(c, pred)
        if t is not None:
            self.timed.append((t, c))

    def time_in_order(self, todo: list[tuple[float, KernelConfig]], defer: float | None = None
                      ) -> list[tuple[float, KernelConfig]]:
        """Time ``todo`` ((prediction, config)), next always the one whose prediction,
        corrected by every time measured so far (:class:`ErrorModel`), is best. With
        ``defer``: stop when that is more than ``defer`` × the fastest measured, and
        return what is left."""
        todo = [x for x in todo if x[1] not in self.seen]
        while todo:
            corrected = [self.errors.corrected(c, p) for p, c in todo]
            order = sorted(range(len(todo)), key=corrected.__getitem__)
            i = order[0]
            if defer is not None and self.timed and corrected[i] > defer * min(t for t, _ in self.timed):
                return todo
            self.ahead([todo[j][1] for j in order[1:AHEAD_LOOK + 1]])
            self.time_one(*todo.pop(i))
        return []

    def time_predicted(self, pred: dict[KernelConfig, float], cs: list[KernelConfig]) -> None:
        """Time ``cs`` (each once) in the corrected order of their predictions ``pred``."""
        self.time_in_order([(pred[c], c) for c in dict.fromkeys(cs)])

    def sweep(self, bases: list[tuple[KernelConfig, tuple[int, ...]]]) -> None:
        """Time every config around ``bases`` ((base, stages)) not timed yet: first a climb from
        each base (its one-field changes — warps, stages, loads, staging — then those of the
        fastest so far, until none is faster), then the rest; each in the order of the
        cost model corrected by the times measured (:class:`ErrorModel`). Within one
        layout the model's ranking agrees with the measured one about half the time
        (``lower/calibration.py``), and a re-ranking's
        budget often ends within the sweep: what it times should follow the measurements
        (a best two steps away, ranked 71st of 80 by the model, is reached in ~17)."""
        call = self.call
        around = {base: [c for c in neighbours(self.block, base, call.warps, sts) if c != base]
                  for base, sts in bases}
        pred: dict[KernelConfig, float] = {}
        for c in (c for cs in around.values() for c in cs if c not in pred):
            pred[c] = estimate(call.graph, call.device_params, {**call.configs, self.op.id: c})

        for base, space_b in around.items():
            mine_set, cur = {base, *space_b}, base
            while not self.over():
                self.time_predicted(pred, [c for c in space_b if _steps(c, cur) == 1])
                mine = [(t, c) for t, c in self.timed if c in mine_set]
                best = min(mine, key=lambda x: x[0])[1] if mine else cur
                if best == cur:
                    break
                cur = best
        self.time_predicted(pred, list(pred))

    def first_round(self, space: _KernelSpace) -> list[tuple[float, KernelConfig]]:
        """Time the first round: one config of each split-K factor, then the rest of the picks in
        the order of their predictions corrected by what has been measured (:class:`ErrorModel`).
        With a budget, the picks it expects to lose by more than :data:`DEFER` wait until after
        the climbs and sweeps: those are returned.

        The split-K factors are timed in the order of their best predictions. The first pick a
        choice of :data:`SIBLING_FIELDS` applies to is also timed with each other value of it
        (:meth:`time_siblings`); each later factor's pick is then timed with the value that
        measured clearly faster — so a mode the model misprices is learned once, not met once
        per factor, while the rest of each pick's layout stays the model's choice — where the
        model prices the pick with that value within :data:`CONFORM_SPREAD` of the pick itself.

        * The combine: Phi-3-mini's decode attention (32 heads of one query row, 8,448 keys,
          H200), combined by the last program, split-K 12 measured 30.6–32.7 μs, the model
          pricing it 0.5 μs *above* a combine kernel; the tuning timed the combine kernel for
          each of its ten factors (32.7–35.2 μs at best) and its budget ended there.
        * The small-matmul lowering: in the same kernel the model priced the CUDA-core product
          (``v``) of every split factor from 8 to 24 at 33.1 μs, below every ``tl.dot`` config
          (37.1 and up); the first round's ten factors began with ten ``v`` picks, and a 10 s
          tuning reached only split-K 8 of the ``tl.dot`` kernel (34.0 μs, where split-K 12 runs
          30.6)."""
        head = space.picked[:space.head]
        left: list[tuple[float, KernelConfig]] = []
        tried: set[str] = set()
        decided: dict[str, object] = {}  # field -> the value its siblings measured clearly faster
        for i, (pred, c) in enumerate(head):
            pick = self.conform(space, (pred, c), decided)
            if pick[1] != c:
                left.append((pred, c))
            self.ahead([x for _, x in [pick, *head[i + 1:], *space.picked[space.head:]][:AHEAD_LOOK]])
            self.time_one(*pick)
            for name in SIBLING_FIELDS:
                sibs = [] if name in tried else self.siblings(space, pick[1], name)
                if sibs:
                    tried.add(name)
                    faster = self.time_siblings(pick[1], sibs, name)
                    if faster is not None:
                        decided[name] = faster
        return self.time_in_order(space.picked[space.head:] + left, defer=DEFER if self.end is not None else None)

    @staticmethod
    def in_cands(space: _KernelSpace, c: KernelConfig) -> tuple[float, KernelConfig] | None:
        """``c`` with its prediction, where the first round has it."""
        return next(((p, s) for p, s in space.cands if s == c), None)

    def siblings(self, space: _KernelSpace, c: KernelConfig, name: str) -> list[tuple[float, KernelConfig]]:
        """``c`` with each other value of field ``name`` the first round has (with predictions);
        none for the combine of a config without split-K."""
        if name == "combine" and c.split == 1:
            return []
        values = dict.fromkeys(getattr(x, name) for _, x in space.cands)
        out = [self.in_cands(space, dataclasses.replace(c, **{name: v})) for v in values if v != getattr(c, name)]
        return [x for x in out if x is not None]

    def conform(self, space: _KernelSpace, pick: tuple[float, KernelConfig], decided: dict[str, object]
                ) -> tuple[float, KernelConfig]:
        """``pick`` with the ``decided`` values (where they apply): the same config with them where
        the first round has it, else the best-predicted config of its split-K factor with them —
        either only where the model prices it within :data:`CONFORM_SPREAD` of ``pick`` — else
        ``pick`` itself."""
        c = pick[1]
        want = {k: v for k, v in decided.items() if getattr(c, k) != v and not (k == "combine" and c.split == 1)}
        if not want:
            return pick
        same = self.in_cands(space, dataclasses.replace(c, **want))
        if same is None:
            fits = [(p, x) for p, x in space.cands if x.split == c.split and p < math.inf
                    and all(getattr(x, k) == v for k, v in want.items())]
            same = min(fits, key=lambda x: x[0]) if fits else None
        return same if same is not None and same[0] <= CONFORM_SPREAD * pick[0] else pick

    def time_siblings(self, c: KernelConfig, sibs: list[tuple[float, KernelConfig]], name: str) -> object | None:
        """Time the siblings ``sibs`` of ``c`` (just timed) that differ from it in field ``name``;
        the value whose config measured faster than every other by more than
        :data:`COMBINE_MARGIN` (the one that ran, where only one did), or None: within the
        margin one set of timings is noise, and each later split factor keeps the model's value."""
        for sib in sibs:
            self.time_one(*sib)
        time_of = {x: t for t, x in self.timed}
        times = sorted((time_of.get(x, math.inf), getattr(x, name)) for x in [c, *(s for _, s in sibs)])
        if times[0][0] < math.inf and times[0][0] * COMBINE_MARGIN < times[1][0]:
            return times[0][1]
        return None

    def climb_layouts(self, space: _KernelSpace) -> None:
        """A climb through layouts one step from the winner's (:func:`lower.tuning_order.layout_steps`):
        the first round times a subset of the layouts, chosen by the uncorrected model."""
        predicted = {c: p for p, c in space.cands}
        cur = self.fastest() if self.timed else None
        while cur is not None and not self.over():
            self.time_in_order([(predicted[c], c) for c in layout_steps(cur, list(predicted))])
            best = self.fastest()
            if best == cur:
                break
            cur = best

    def sweep_winners(self, first: list[tuple[float, KernelConfig]]) -> None:
        """Warps × stages around the winner; warps alone around the best layout of each other
        small-matmul lowering (the best warp count differs between tl.dot and the CUDA-core
        path, so one lowering must not lose for being timed at the other's best); then around
        the runner-up layout of ``first`` (the first round and the layout climb) when it
        measured within :data:`SECOND_LAYOUT`: the first round times every layout at 4 warps
        and 3 stages only, and another layout may win at its own best warps and stages
        (rmsnorm_matmul b=8: c4A first at w4s3, c2A best at w2s5)."""
        stages = self.call.stages
        t0, c0 = min(self.timed, key=lambda x: x[0])
        # (no loop: num_stages changes nothing, only warps are swept)
        looped = self.block.forloop > 1
        around = [(c0, stages if looped else (c0.num_stages,))]
        around += [(min((x for x in self.timed if x[1].small_mm == mm), key=lambda x: x[0])[1], (c0.num_stages,))
                   for mm in dict.fromkeys(c.small_mm for _, c in self.timed) if mm != c0.small_mm]
        # (and both ways of loading shared tiles, of staging loads, where they differ: neighbours)
        self.sweep(around)
        second = [(t, c) for t, c in sorted(first, key=lambda x: x[0]) if _layout(c) != _layout(c0)]
        if second and second[0][0] <= SECOND_LAYOUT * t0:
            self.sweep([(second[0][1], stages if looped else (second[0][1].num_stages,))])

    def choose(self, space: _KernelSpace) -> KernelConfig:
        """The kernel's fastest config: the first round, the layout climb, the sweeps around the
        winners, then the first-round picks deferred. ResourceError when none runs."""
        deferred = self.first_round(space)
        self.climb_layouts(space)
        if not self.timed:
            raise ResourceError(f"{self.call.graph.name}: kernel k{self.op.id}: none of {len(space.picked)} "
                                "configurations compiles and runs correctly on this GPU (e.g. shared memory beyond "
                                "the hardware limit)")
        self.sweep_winners(list(self.timed))
        self.time_in_order(deferred)
        return self.fastest()


#: a kernel's config before its tuning when the model prices none as runnable
DEFAULT_WAITING = KernelConfig(num_stages=3)


def initial_configs(spaces: dict[int, _KernelSpace]) -> dict[int, KernelConfig]:
    """The configs the kernels run at while they wait for their turn: each kernel's best
    predicted one where the model prices any as runnable (its shared memory fits), else
    the default. Each kernel is timed inside the whole program, so a kernel not yet tuned
    must run: at the default (4 warps, 3 stages, no split-K, whole tiles) a projection whose
    loop step is 16 × 4096 stages 328 KB of shared memory, no launch succeeded, and every
    configuration of the kernel tuned before it failed — that kernel was blamed, and a
    verified μGraph set aside (a decode step's RMSNorm with q and k over 8 tokens, H200).
    Where a predicted config is what fails, :func:`tune` falls back to the default."""
    return {k: sp.cands[0][1] for k, sp in spaces.items() if sp.cands and sp.cands[0][0] < math.inf}


def tune(graph: KernelGraph, inputs: dict[str, torch.Tensor] | None = None, top: int = 6,
         device_params: DeviceParams | None = None, warps=WARPS, stages=STAGES, log: Callable | None = None,
         ref=None, tol: float = 2e-2, timing: str = "graph", small_mm=SMALL_MM_MENU,
         budget_s: float | None = None, predict_only: bool = False,
         history: dict[str, float | None] | None = None,
         input_strides: dict[str, tuple[int, ...]] | None = None,
         precompile: bool = True) -> ProfileResult:
    """Choose a :class:`KernelConfig` for every graph-defined op (see the module docstring).

    ``predict_only``: rank the configurations by the cost model alone, as without a GPU —
    nothing is compiled or run (ranking candidates before the GPU re-ranking times them).

    ``ref``: float64 outputs every timed variant must match (relative error ≤
    ``tol``; a variant that does not is logged and dropped). ``timing``: how each
    variant is timed (:data:`TIMINGS`, :func:`measure`); a cold one (``"dram"``, ``"cold"``)
    is also how the model prices (:func:`lower.cost_model.for_timing`), in ``predict_only``
    too. ``small_mm``: the
    lowerings of small matmuls to consider (:data:`SMALL_MM_MENU`; add ``"va"``
    to time the un-reduced accumulation too). ``budget_s``: seconds of trying
    configurations in all (each costs a Triton compile, ~1 s), shared by the kernels in
    proportion to their configuration spaces (:func:`config_space`; time one kernel leaves
    unused passes to the next); a kernel stops trying new ones when its share is spent,
    once one has run, and keeps the best so far — for bounded re-ranking runs.

    ``input_strides``: the layout of inputs read as strided views (``lower.compile``'s),
    for a call given no ``inputs`` (``predict_only``): the configuration space is the one the
    tuner would time on such inputs (:func:`small_mm_menu` — a key-major Kᵀ is read on
    ``tl.dot`` only), so a prediction prices what runs. Given ``inputs``, their own strides
    decide.

    ``history``: the :attr:`ProfileResult.timings` of an earlier call on the same graph,
    inputs and timing — its configurations are not compiled or run again, their times are
    taken as measured. The tuner's choices depend only on the times it sees, so a call
    with the history of a call its budget cut (:attr:`ProfileResult.cut`) walks the same
    path at once and goes on where that one stopped, with ``budget_s`` for what is new:
    tuning in installments, as the GPU re-ranking does for its leaders.

    Per kernel: the first round (:func:`first_round`, :func:`_pick`), then a climb through
    the layouts one step from the winner's (:func:`lower.tuning_order.layout_steps`), then
    warps × stages × load modes × staging around the winner (:func:`neighbours`), then
    around the second-best layout if it measured within :data:`SECOND_LAYOUT` of the best.
    Each sweep climbs first (one field at a time from the fastest so far), then times the
    rest. Whatever is timed next is chosen by the cost model corrected by the times measured
    so far on this kernel (:class:`lower.tuning_order.ErrorModel`), so a budget cut keeps
    what the measurements point to.

    ``precompile``: on a GPU, the configurations to be timed next are compiled ahead in worker
    processes (:mod:`lower.precompile`; ``MUGRAPH_PRECOMPILE_WORKERS`` sets how many, 0 none);
    what is timed and chosen does not change, only how long each trial waits for Triton.

    Every argument is checked first (:func:`_check_tune_args`): a wrong one is a one-line
    :class:`~mugraph.core.errors.MugraphError` naming it, before anything is ranked or compiled.
    """
    if device_params is None:
        device_params = default_params()
    warps, stages, small_mm = _check_tune_args(graph, inputs, top, device_params, warps, stages, log, ref, tol,
                                               timing, small_mm, budget_s, predict_only, history, precompile)
    device_params = for_timing(device_params, timing)
    t_start = time.monotonic()
    gpu = torch.cuda.is_available() and not predict_only
    blocks = [op for op in graph.ops if op.kind == "graph_defined"]
    call = _TuneCall(graph, blocks, inputs, ref, tol, timing, log, history, device_params, warps, stages,
                     configs={op.id: DEFAULT_WAITING for op in blocks})
    if gpu and inputs is None:
        call.inputs = random_inputs(graph, 0, device="cuda")
    if gpu and precompile:
        call.precompiler = shared_precompiler()
    counts0 = dict(call.precompiler.stats) if call.precompiler is not None else {}
    ends = {}
    if budget_s is not None and gpu:
        ends = _budget_ends(graph, blocks, budget_s, t_start, top, warps, stages, small_mm, device_params)
    # on the GPU, a configuration whose assembly runs minutes counts as not compiling
    in_use = call.precompiler.in_use() if call.precompiler is not None else nullcontext()
    with bounded_compiles() if gpu else nullcontext(), shared_analyses(), in_use:
        lay = solve_layout(graph, use_z3=False,
                           input_strides=strides_of(call.inputs) if call.inputs else input_strides or None)
        spaces = {op.id: _space(graph, op, call.configs, top, warps, stages,
                                small_mm_menu(op, [lay.strides[t.id] for t in op.inputs], small_mm), device_params)
                  for op in blocks}
        call.configs.update(initial_configs(spaces))
        for i, op in enumerate(blocks):
            space = spaces[op.id]
            if not gpu:
                call.configs[op.id] = space.cands[0][1]
                call.trials += [(c.label(), None, p) for p, c in space.cands]
                continue
            try:
                call.configs[op.id] = _KernelTuning(call, op, ends.get(op.id)).choose(space)
                if call.precompiler is not None:  # the next kernel's module differs: theirs are of no use
                    call.precompiler.withdraw_all()
            except ResourceError:
                # nothing ran: a waiting kernel's predicted config may be what fails (one the
                # model prices but Triton does not compile), so once more with those at the
                # default, as tuning ran before the waiting configs were predicted
                after = blocks[i + 1:]
                if all(call.configs[o.id] == DEFAULT_WAITING for o in after):
                    raise
                call.configs.update({o.id: DEFAULT_WAITING for o in after})
                call.configs[op.id] = _KernelTuning(call, op, ends.get(op.id)).choose(space)
        pred = estimate(graph, device_params, call.configs)
        if not gpu:
            return ProfileResult(graph, call.configs, None, pred, False, call.trials)
        # re-time the final program (the spread between this and the search's time is the noise)
        t, prog, _ = _time(graph, call.configs, call.inputs, ref, tol, timing, call.input_sets)
    ahead = 0
    if call.precompiler is not None:
        counts = {k: v - counts0.get(k, 0) for k, v in call.precompiler.stats.items()}
        ahead = counts["compiled"]
        if log:
            log("  " + precompile_summary(counts, time.monotonic() - t_start))
    return ProfileResult(graph, call.configs, t, pred, True, call.trials, prog, call.timings, call.cut, ahead)


def _finite(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _choices(v: Any, name: str, ok: Callable[[Any], bool], allowed: str) -> tuple:
    """A non-empty sequence (not a string) whose every item passes ``ok``, as a tuple."""
    if not _is_sequence(v) or not len(v):
        raise ArgumentTypeError(f"lower.tune: {name}={short(v)} must be a non-empty list or tuple, each item "
                                f"{allowed}")
    for x in v:
        if not ok(x):
            raise ConfigError(f"lower.tune: {name} holds {short(x, 30)}; each must be {allowed}")
    return tuple(v)


def _check_tune_args(graph: Any, inputs: Any, top: Any, device_params: Any, warps: Any, stages: Any, log: Any,
                     ref: Any, tol: Any, timing: Any, small_mm: Any, budget_s: Any, predict_only: Any,
                     history: Any, precompile: Any = True) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """:func:`tune`'s arguments checked up front, each by type and range, so a wrong one is a
    one-line error naming it — not a ``TypeError`` from deep in the sweep after minutes of
    compiling, or a silent misuse (``warps=4`` iterated, a NaN tolerance that passes nothing).
    Returns ``warps``, ``stages`` and ``small_mm`` as tuples."""
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"lower.tune: expected a KernelGraph or Program, got {type(graph).__name__}")
    if inputs is not None:
        if not isinstance(inputs, Mapping):
            raise InputError(f"lower.tune: inputs must map input names to torch tensors, got {type(inputs).__name__}")
        names = [t.name for t in graph.inputs]
        for k, v in inputs.items():
            if k not in names:
                raise InputError(f"lower.tune: unexpected input {short(k, 30)}; the inputs are {names}")
            if not isinstance(v, torch.Tensor):
                raise InputError(f"lower.tune: input {k!r} must be a torch.Tensor, got {type(v).__name__}")
    try:
        n = strict_int(top, "lower.tune: top")
    except MugraphError:
        raise ArgumentTypeError(f"lower.tune: top={short(top)} must be an int >= 1") from None
    if n < 1:
        raise ConfigError(f"lower.tune: top={n} must be >= 1 (first-round layouts timed per kernel)")
    if not isinstance(device_params, DeviceParams):
        raise ArgumentTypeError(f"lower.tune: device_params must be a lower.cost_model.DeviceParams (e.g. H100), "
                                f"got {type(device_params).__name__}")

    def small_int(lo: int, hi: int, pow2: bool = False) -> Callable[[Any], bool]:
        return lambda x: (isinstance(x, numbers.Integral) and not isinstance(x, bool) and lo <= x <= hi
                          and (not pow2 or x & (x - 1) == 0))

    warps = _choices(warps, "warps", small_int(1, MAX_WARPS, True), f"a power of two from 1 to {MAX_WARPS}")
    stages = _choices(stages, "stages", small_int(1, MAX_STAGES), f"an int from 1 to {MAX_STAGES}")
    warps, stages = tuple(int(w) for w in warps), tuple(int(st) for st in stages)
    if log is not None and not callable(log):
        raise ArgumentTypeError(f"lower.tune: log={short(log)} must be a function of one string, or None")
    if ref is not None:
        if not _is_sequence(ref) or len(ref) != len(graph.outputs) or not all(isinstance(r, torch.Tensor)
                                                                                for r in ref):
            raise InputError(f"lower.tune: ref must be a list of {len(graph.outputs)} torch tensors (the float64 "
                             f"outputs), got {short(ref, 40)}")
    if not _finite(tol):
        raise ArgumentTypeError(f"lower.tune: tol={short(tol)} must be a finite number > 0")
    if not tol > 0:
        raise ConfigError(f"lower.tune: tol={tol} must be > 0 (the relative error a timed variant may have)")
    if not isinstance(timing, str) or timing not in TIMINGS:
        raise ConfigError(f"lower.tune: timing={short(timing)} must be one of {sorted(TIMINGS)}")
    small_mm = _choices(small_mm, "small_mm", lambda x: isinstance(x, str) and x in SMALL_MM,
                        f"one of {SMALL_MM}")
    if budget_s is not None:
        if not _finite(budget_s):
            raise ArgumentTypeError(f"lower.tune: budget_s={short(budget_s)} must be None or a finite number of "
                                    "seconds >= 0")
        if budget_s < 0:
            raise ConfigError(f"lower.tune: budget_s={budget_s} must be >= 0 seconds")
    for name, flag in (("predict_only", predict_only), ("precompile", precompile)):
        if not isinstance(flag, bool):
            raise ArgumentTypeError(f"lower.tune: {name}={short(flag)} must be True or False")
    if history is not None:
        if not isinstance(history, Mapping):
            raise ArgumentTypeError(f"lower.tune: history must be the timings dict of an earlier ProfileResult, "
                                    f"got {type(history).__name__}")
        for k, v in history.items():
            if not isinstance(k, str) or not (v is None or _finite(v)):
                raise ArgumentTypeError(f"lower.tune: history entry {short(k, 40)}: {short(v, 20)} is not a "
                                        "configuration key and its seconds (or None)")
    return warps, stages, small_mm


def program_key(blocks, configs: dict[int, KernelConfig]) -> str:
    """One whole-program configuration: every graph-defined kernel's config label, in
    graph order (what :attr:`ProfileResult.timings` is keyed by)."""
    return " ".join(f"k{op.id}:{configs[op.id].label()}" for op in blocks)


def _steps(a: KernelConfig, b: KernelConfig) -> int:
    """How many of the sweep's fields (warps, stages, loads, staging) ``a`` and ``b`` differ in."""
    return sum(getattr(a, f) != getattr(b, f) for f in ("num_warps", "num_stages", "split_loads", "stage_all_loads"))


def _layout(c: KernelConfig) -> tuple:
    """A config's layout: what the first round varies and a sweep keeps (grid shape, chunking,
    combine, small-matmul lowering; a sweep tries both stagings itself)."""
    return (c.split, c.sub, c.chunk, c.combine, c.small_mm)


def profile(graph: KernelGraph, inputs: dict[str, torch.Tensor] | None = None, tune_configs: bool = True,
            configs: dict[int, KernelConfig] | None = None, **kw) -> ProfileResult:
    """Time ``graph`` on the GPU (autotuned unless ``tune_configs=False``); without
    a GPU, return the cost model's choice with ``measured=False``."""
    if tune_configs and configs is None:
        return tune(graph, inputs, **kw)
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"lower.profile: expected a KernelGraph or Program, got {type(graph).__name__}")
    configs = configs_for(graph, configs, "lower.profile")
    pred = estimate(graph, for_timing(kw.get("device_params") or default_params(), kw.get("timing", "graph")), configs)
    if not torch.cuda.is_available():
        return ProfileResult(graph, configs, None, pred, False)
    if inputs is None:
        inputs = random_inputs(graph, 0, device="cuda")
    t, prog, _ = _time(graph, configs, inputs, kw.get("ref"), kw.get("tol", 2e-2), kw.get("timing", "graph"))
    return ProfileResult(graph, configs, t, pred, True, [("given", t, pred)], prog)
