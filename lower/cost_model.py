"""Analytic cost model: rank μGraphs and lowering configs without a GPU.

Per launch (a Triton kernel of a graph-defined op, or a torch call)::

    t = launch + max(t_dram, t_l2, t_compute, t_serial) + t_fma + t_cone

* ``t_dram`` — unique device bytes (each source read once, each output written
  once, split-K partials written and read) over DRAM bandwidth (L2 bandwidth and
  round trip when the whole graph fits in L2: repeated calls find it there, as the
  ``graph`` and ``warm`` timers make them), divided by the
  fraction of it the kernel can pull: the bytes in flight (resident programs ×
  bytes one loop step loads × the steps ``num_stages`` keeps ahead) over
  bandwidth × latency, capped by what the SMs in use can pull (a grid of 32
  programs cannot pull the bandwidth of 132 SMs), and stretched when the grid is
  not a whole number of waves;
* ``t_l2`` — bytes of every tile load (replicated tiles are re-read from L2) over
  L2 bandwidth, with the same occupancy factor;
* ``t_compute`` — ``tl.dot`` flops (at padded tile sizes: padding costs tensor-core
  work) over the tensor-core rate, plus element-wise flops — CUDA-core matmuls
  (``KernelConfig.small_mm``) included, the element-wise ops that make a
  ``tl.dot`` operand counted once per warp that replicates them, and an online
  softmax's running max and rescales per step (:func:`_online_work`) — over the
  CUDA-core rate;
* ``t_fma`` — the CUDA-core matmuls' flops over the CUDA-core rate once more, *added*:
  each step's multiply-adds wait for the step's tiles and keep the program from
  issuing the next loads (measured, docs/history/lowering.md, small-M matmuls);
* ``t_cone`` — the elements a program reduces each loop step to make a ``tl.dot``
  operand (a norm of the tile the step loaded: qknorm_gqa's K when the norm is fused
  into the attention loop) at :attr:`DeviceParams.cone_reduce` per SM, *added*: the
  operand is reduced across threads and converted to the dot's layout before the dot
  can start (fitted on the H200 re-rankings of ``lower/data/h200_candidates.jsonl.gz``:
  the search's such kernels measured 1.8–3.0× the model without it, 0.75–1.4× with it;
  the hand-written references, whose steps normalize 64-key tiles, 0.58–1.04×: over-predicted);
* ``t_serial`` — one memory round trip, plus the generated-loop steps run one
  after another by each program, each paying a latency that software pipelining
  (``num_stages``) hides in part (re-chunking the loop makes fewer, longer steps) —
  all of it when a loop with a ``tl.dot`` also loads a tile Triton does not stage
  (:attr:`lower.plan.KernelPlan.unpipelined_loads`: every step waits for that load), less
  what the other programs resident on the SM transfer meanwhile;
  a CUDA-core matmul's step also pays the reduction across threads before the next loads
  (:attr:`DeviceParams.fma_step_latency`); stretched when a thread would need more than 255
  registers (spills), infinite when the padded tiles do not fit shared memory at all; paid once per round of programs
  an SM runs (a grid larger than the SMs hold at once runs in rounds, each starting as the
  last ends; a last, partial round shares each SM among fewer programs), with two round trips
  more for a program that hands its partial to the last one (split-K, ``combine="last"``: the
  fenced stores and the counter). A last, partial *wave* moves its bytes at what its programs
  pull (``sm_bw`` each), not at a whole wave's time.

Residency (programs per SM) is bounded by shared memory at *padded* extents
(:func:`lower.memory.padded_shared_memory` of the kernel's plan), warps, and registers (accumulators —
the un-reduced products of ``small_mm="va"`` included — and the loop ``tl.dot``'s operands in the
MMA's layout, which a deep step can push past 255 a thread: :func:`_dot_operand_regs`).

Split-K adds the partials' bytes (running maxima handed over with rescaled partials
included) and either a combine launch or (``combine="last"``)
the last program of each tile loading the partials (the stores and the atomic every
program pays, above); either way one program per tile reads the partials back, so they
come at most ``sm_bw`` a tile.

Latencies. A graph that fits in L2 pays its round trips at :attr:`DeviceParams.l2_latency`
(0.2 μs), but the ``"last"`` fix-up chain at the memory's (1 μs: the partials are fenced
before the counter's atomic). Fitted on the recorded H200 re-rankings
(``python -m lower.calibration``, 2026-11-27): with an L2 round trip of 0.6 μs and the
fix-up at it, a split pair's combine kernel — 16 loop steps over 16×16 tiles, 64 programs —
was priced 3.4–4.9 μs of bytes-in-flight time, and gqa b=1's hand-written pair 9.4–10.9
μs against 5.6 measured, while single kernels combined by ``"last"`` ran 1.1–1.5× their
prediction: the model preferred them to the pairs that ran fastest. With 0.2 μs and the
fenced fix-up, on the 122 records then kept, the per-run rank agreement averages 0.47 (was
0.09; gqa b=1 0.82 and 1.00, was -0.01 and -0.80), and the model's favourite among the
search's timed candidates is the fastest measured in every run but three (gqa b=8 and
qknorm_gqa b=8 of 2026-11-26, 1.62× and 1.58× as before; gqa b=8 of 2026-11-27, 1.01×;
gqa b=1 of 2026-11-26 was 1.17×). On the H100 configuration records the favourite's regret
is unchanged (≤ 21 %; median rank agreement within a μGraph 0.47 → 0.40, from lora b=8 and
qknorm_gqa b=1, whose favourites stay within 1 % of their best). Not resolved: among gqa
b=1's split pairs the fastest (128 + 8 blocks, 5.4 μs) is priced 3 % behind pairs that ran
6.2–6.4 — the re-ranking times each grid family (``mugraph.pipeline.timing.grids``).

Agreement with 1918 recorded H100 timings of 20 μGraphs (:mod:`lower.calibration`):
Spearman 0.61 over all, median 0.40 within one μGraph, favourite ≤ 21 % slower than
the best recorded, 0 % on rmsnorm_matmul (docs/history/lowering.md, staged loads: the model does not see warps
or Triton's layout conversions).

Parameters: the H100 SXM's (copy bandwidth measured at about 3.0 TB/s, docs/design.md
§7.13) and the H200's (4.1 TB/s, otherwise the same chip); :func:`default_params` picks the
GPU's this process runs on. The model is meant to *rank* candidates (the profiler then times
the best few), not to be exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from weakref import WeakKeyDictionary

from mugraph.core.ir import DTYPES, KernelGraph, Op
from mugraph.core.ops import Category, category, is_contraction

from .config import KernelConfig, KernelConfigError
from .memory import padded_shared_memory
from .plan import KernelPlan, plan
from .schedule import kernel_order
from .tiles import per_frozen_block
from .torch_ops import TORCH_OPS, matmul_adds


@dataclass(frozen=True)
class DeviceParams:
    name: str
    dram_bw: float        # bytes/s
    l2_bw: float          # bytes/s
    tc_flops: float       # fp16/bf16 tensor-core flop/s
    fp32_flops: float     # CUDA-core flop/s
    sms: int
    launch: float         # s per kernel launch inside a CUDA graph
    iter_latency: float   # s of exposed memory latency per unpipelined loop iteration
    mem_latency: float = 1.0e-6   # s: DRAM round trip (bandwidth × latency = bytes in flight needed)
    sm_bw: float = 6.0e10         # bytes/s one SM can pull from DRAM
    smem: float = 227 * 1024      # shared memory per SM (bytes)
    l2_bytes: float = 25 * 2**20  # a graph whose bytes fit in this stays in L2 between calls (half the
                                  # H100's 50 MB: it is two partitions; rms' 48 MiB streams from DRAM)
    l2_latency: float = 0.2e-6    # s: L2 round trip (fitted: see the module docstring, "Latencies")
    cone_reduce: float = 5.0e9    # elements/s one SM reduces inside a tl.dot operand (see _block_cost)
    fma_step_latency: float = 1.0e-6  # s a CUDA-core matmul's loop step waits beyond the memory's step latency


H100 = DeviceParams("NVIDIA H100 SXM", dram_bw=3.0e12, l2_bw=9.0e12, tc_flops=6.0e14, fp32_flops=5.0e13,
                    sms=132, launch=2.0e-6, iter_latency=6.0e-7)
#: the H200: the H100's chip (SMs, tensor cores, L2) with faster memory — copy bandwidth measured
#: at 4.11 TB/s (``examples/gemv_sweep.py``, 2026-11-29). What the difference decides: a grid of
#: 64 programs pulls at most 64 × ``sm_bw`` = 3.84 TB/s, the H100's whole bandwidth but not the
#: H200's (a gated projection reading 134 MB in one kernel, 2048 → 2 × 16384: 64 programs 35.4 μs,
#: 128 or 256 programs 32.6–32.9, 1.01× the copy floor; 64 × 59 GB/s is what the 64 pulled).
H200 = replace(H100, name="NVIDIA H200", dram_bw=4.1e12)
#: the parameters the model knows, by a substring of the device's name (:func:`params_for`)
KNOWN = {"H200": H200, "H100": H100}


@lru_cache(maxsize=None)
def params_for(device_name: str | None) -> DeviceParams:
    """The parameters of the GPU named ``device_name`` (as ``torch.cuda.get_device_name``
    says it); the H100's for a name the model does not know, or none."""
    for key, params in KNOWN.items():
        if device_name and key in device_name:
            return params
    return H100


#: timings whose calls read every input from DRAM (``lower.profile.TIMINGS``): ``"cold"`` flushes
#: the L2 before each call, ``"dram"`` cycles through copies of the large inputs
COLD_TIMINGS = ("cold", "dram")


def for_timing(dev: DeviceParams, timing: str) -> DeviceParams:
    """``dev`` as ``timing`` runs a graph: under a cold timing (:data:`COLD_TIMINGS`) nothing
    stays in L2 between calls, so no graph is priced as L2-resident, however small.

    Why: a decode step reads each layer's weights once, from DRAM, and the ``torch.compile``
    backend times its pieces so (``"dram"``). Priced as L2-resident, Phi-3-mini's output
    projection (3072 × 3072, 18.9 MB) ranked 96 programs without split-K first, at 6.1-7.0 μs;
    from DRAM they ran 7.9-12.1 μs, and split-K 4 ran 7.8 (H200, docs/results.md, "Priced as
    the timing runs them")."""
    return replace(dev, l2_bytes=0) if timing in COLD_TIMINGS else dev


def default_params() -> DeviceParams:
    """The parameters the model prices with when a caller names none: the GPU this process
    already uses (it never initializes CUDA itself: a forked search worker must not), else
    ``$MUGRAPH_COST_DEVICE`` (a device name, for searching on a CPU for a GPU), else the
    H100's."""
    import os
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return params_for(torch.cuda.get_device_name())
    return params_for(os.environ.get("MUGRAPH_COST_DEVICE"))


@dataclass
class LaunchCost:
    name: str
    programs: int
    dram_bytes: float
    l2_bytes: float
    flops: float
    t_dram: float
    t_l2: float
    t_compute: float
    t_serial: float
    launch: float
    t_fma: float = 0.0    # CUDA-core matmul work, not overlapped with the rest
    t_cone: float = 0.0   # reductions inside a loop's tl.dot operand, not overlapped either

    @property
    def total(self) -> float:
        return self.launch + max(self.t_dram, self.t_l2, self.t_compute, self.t_serial) + self.t_fma + self.t_cone


@dataclass
class Breakdown:
    launches: list[LaunchCost] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(c.total for c in self.launches)


#: launch costs already priced, per frozen block: (op id, config, device, in L2, the kernel's bytes)
#: -> its LaunchCosts (:func:`lower.tiles.per_frozen_block`). A candidate is priced by its check,
#: its re-ranking plan, its tuning budget and its tuning, each over the same few hundred
#: configurations of each kernel; the costs hold no reference to the block.
_PRICED: WeakKeyDictionary = WeakKeyDictionary()


def _block_cost(op: Op, cfg: KernelConfig, dev: DeviceParams, in_l2: bool = False) -> list[LaunchCost]:
    """The launches of graph-defined ``op`` under ``cfg`` (:func:`_price_block`), priced once
    per frozen block and arguments: what the price reads of the op (its id, the bytes and
    fills of its inputs and outputs) is part of the key."""
    key = (op.id, cfg, dev, in_l2, tuple((t.nbytes, t.fill is None) for t in op.inputs),
           tuple(t.nbytes for t in op.outputs))
    costs = per_frozen_block(_PRICED, op.attrs["block"], key, lambda: tuple(_price_block(op, cfg, dev, in_l2)))
    return [replace(c) for c in costs]


def _price_block(op: Op, cfg: KernelConfig, dev: DeviceParams, in_l2: bool = False) -> list[LaunchCost]:
    bg = op.attrs["block"]
    # where the bytes come from: DRAM, or L2 when the whole graph fits in it (repeated calls, as
    # every timer but "cold" makes them, find it there): bandwidth, round trip, per-step latency
    bw, lat_mem = (dev.l2_bw, dev.l2_latency) if in_l2 else (dev.dram_bw, dev.mem_latency)
    lat_step = dev.iter_latency * lat_mem / dev.mem_latency
    p = plan(bg, cfg)
    info = p.info
    nprog = p.programs                           # programs per split (grid blocks × sub-tiles)
    split = cfg.split
    steps = p.steps                              # generated-loop steps per program
    total = nprog * split                        # programs launched
    dram, l2, step_bytes = _traffic(op, p)
    tc, ew, fma, acc_regs = _work(p)
    # bytes in flight: resident programs × (stages − 1) loop steps each (uniform: see t_serial below
    # for the one case charged differently)
    pipe = max(1, min(cfg.num_stages - 1, steps))
    lowered, smem, regs = _on_chip(p, step_bytes, acc_regs)
    spill = max(1.0, regs / (32 * cfg.num_warps) / 255)
    resident = max(1, min(_resident(smem, regs, cfg, dev), math.ceil(total / dev.sms)))
    active = min(total, dev.sms * resident)
    inflight = active * max(step_bytes, 1.0) * pipe
    eff = min(1.0, inflight / (bw * lat_mem), min(total, dev.sms) * dev.sm_bw / bw)
    # a grid that is not a whole number of waves runs its last, partial wave on fewer programs,
    # at the bandwidth they pull (one an SM first, each SM at most sm_bw): the card's whole
    # bandwidth unless the tail is small. Charging the partial wave as a whole one priced a
    # one-row norm + projection (3072 x 9216) split 6 ways, 864 programs in 1.09 waves, at
    # 1.8x its DRAM time; it ran 18.3 us, as fast as split-K 4 in one wave (17.7; H200,
    # lower/data/h200_sweeps.jsonl.gz, run 2d310f5)
    slots = dev.sms * resident                     # programs the chip holds at once
    full_rounds, tail = divmod(total, slots)       # whole waves, and the programs of a last partial one
    quant = 1.0
    if full_rounds and tail:
        tail_bw = min(bw, min(tail, dev.sms) * dev.sm_bw)
        waves = total / slots
        quant = (full_rounds + (waves - full_rounds) * bw / tail_bw) / waves
    busy = min(1.0, total / dev.sms)
    # one round trip, then each step's latency (pipelining hides part) plus its transfer into the SM.
    # A loop with a tl.dot that loads some tile Triton does not stage waits for it every step: the
    # full latency (H100 rmsnorm_matmul b=8, 96 programs, no split-K: 64 / 32 / 16 steps measured
    # 51 / 36 / 29 μs, 24 / - / 20 with every load staged; docs/history/lowering.md, staged loads). Dot-free loops are not
    # charged so: the attention combine loops over L2-resident partials do not show it (same history, rmsnorm_matmul b=8 probed).
    # A loop whose matmul runs on the CUDA cores (small_mm "v"/"va") waits for each step's tiles
    # too: one row times Phi-3-mini's projections from DRAM ran 0.7-1.3 μs a step more than the
    # model's pipelined price (11.9-104 μs against 6.6-20.4; the tl.dot forms of the same tilings
    # 7.8-9.4; H200, docs/results.md, "Priced as the timing runs them")
    exposed = (p.loop_has_dot and bool(p.unpipelined_loads)) or (fma > 0 and steps > 1)
    per_step_latency = lat_step if exposed else lat_step / pipe
    # while one program waits for its unstaged load, the others resident on its SM transfer their
    # steps: that wait is hidden up to their transfer time. Without this, every load staged
    # (``stage_all_loads``) priced 13 % cheaper (median over 132 pairs) where it ran 2 % dearer:
    # one row's RMSNorm fused into a 3072 x 9216 projection, 2-7 programs an SM (same record)
    if exposed and not fma:
        unstaged_wait = lat_step - lat_step / pipe
        per_step_latency -= min(unstaged_wait, (resident - 1) * step_bytes / dev.sm_bw)
    # a CUDA-core matmul's step waits longer than an unpipelined memory step: its product is
    # reduced across the threads before the next step's loads issue (H200, one row times 8192 x
    # 3072 on the CUDA cores in 128-deep steps: 2.0 us a step where the model charged 0.7; with
    # this term the rank agreement over that sweep's 228 configs went from 0.73 to 0.81,
    # lower/data/h200_sweeps.jsonl.gz)
    if fma > 0 and steps > 1:
        per_step_latency += dev.fma_step_latency
    # each SM runs its share of the grid in rounds of `resident` programs; a round starts as the
    # last ends, so the chain is paid per round (H200 from DRAM, one row's RMSNorm fused into a
    # 3072 x 9216 projection: 1,152 programs of 8 columns ran 46-83 us where the chain charged
    # once priced 16-42; with it the rank agreement over 140 tilings and configs
    # went from -0.19 to 0.68; docs/results.md, "Chunks, sub-tiles and rounds")
    # A program that leaves its partial for the last one to combine (split-K, combine "last")
    # fences its stores and takes the tile's counter before it exits: two round trips more in
    # every round, not only the last program's (short split programs: 1,152 of 3 steps ran 23.5
    # us where 576 of 12 ran 17.7 — the model had them even). A last, partial round shares each
    # SM among fewer programs, so its steps move faster.
    exit_wait = 2 * dev.mem_latency if split > 1 and cfg.combine == "last" else 0.0

    def chain(sharing: int) -> float:
        """One program's round trip and steps, ``sharing`` programs pulling on its SM."""
        return lat_mem + exit_wait + steps * (per_step_latency + step_bytes * sharing / dev.sm_bw)

    serial = (full_rounds * chain(resident) + (chain(math.ceil(tail / dev.sms)) if tail else 0.0)) * spill
    if lowered > dev.smem:  # does not fit one SM at all (Triton refuses to compile it)
        serial = math.inf
    costs = []
    t_c = tc / dev.tc_flops / busy + ew / dev.fp32_flops / busy
    # a CUDA-core matmul's multiply-adds of a step wait for that step's tiles and hold the
    # warps that would issue the next loads: added to the kernel's time, not overlapped
    # (H100, gated_mlp b=1, M = 8: tl.dot 28.1 μs, CUDA cores ≥ 34.8; docs/history/lowering.md, small-M matmuls)
    t_fma = fma / dev.fp32_flops / busy
    # a tl.dot operand normalized every step (qknorm_gqa's K: Σk² over the tile inside the dot's
    # cone) is reduced across threads in the operand's layout and converted through shared memory
    # before the dot can start: on an H200 such kernels measured 1.8-3.0x the model without this
    # term, about 5e9 reduced elements a second per SM (lower/data/h200_candidates.jsonl.gz)
    t_cone = _cone_reduced(p) * p.mean_steps * math.ceil(total / dev.sms) / dev.cone_reduce
    if split > 1:
        part = sum(math.prod(info.shape(t)) * 4 for t in bg.tensors if t.op.kind == "accum") * nprog * split
        part += sum(math.prod(info.shape(rm.shift)) * 4 for rm in p.max_partials) * nprog * split
        d_in = dram - sum(t.nbytes for t in op.outputs) + part
        costs.append(LaunchCost(f"k{op.id}_partial", total, d_in, l2 + part, tc + ew,
                                d_in / bw / eff * quant, (l2 + part) / dev.l2_bw / busy, t_c, serial,
                                dev.launch, t_fma, t_cone))
        out_b = sum(t.nbytes for t in op.outputs) + part
        # the partials are read back by one program per tile: nprog SMs pull them, each at
        # most sm_bw (gqa b=1 on an H200: 8 programs reading 16 partials of 128 rows ran 11.3 and
        # 12.5 μs where the aggregate bandwidth predicted 6.2; 16 programs reading 8, 7.4-7.6)
        pull = min(bw, min(nprog, dev.sms) * dev.sm_bw)
        if cfg.combine == "last":
            # no launch; the last program of each tile, past the fenced stores and the counter
            # every program pays (exit_wait above), loads the partials: longer the more there
            # are — at the memory's latency even when the graph sits in L2, the stores being
            # fenced to the device's point of coherence (module docstring, "Latencies")
            fixup = dev.mem_latency * (split / 8)
            costs.append(LaunchCost(f"k{op.id}_fixup", nprog, out_b, out_b, 0.0, out_b / pull,
                                    out_b / dev.l2_bw, 0.0, fixup, 0.0))
        else:
            costs.append(LaunchCost(f"k{op.id}_combine", nprog, out_b, out_b, 0.0, out_b / pull,
                                    out_b / dev.l2_bw, 0.0, lat_mem, dev.launch))
    else:
        costs.append(LaunchCost(f"k{op.id}", total, dram, l2, tc + ew, dram / bw / eff * quant,
                                l2 / dev.l2_bw / busy, t_c, serial, dev.launch, t_fma, t_cone))
    return costs


def _on_chip(p: KernelPlan, step_bytes: float, acc_regs: float) -> tuple[float, float, float]:
    """One program's on-chip needs: (shared memory at padded extents, shared memory the model
    charges, registers of all its threads).

    Shared memory: a step's tiles for each stage kept ahead (in shared memory when pipelined,
    else in registers), or the shared memory at padded extents where that is more (tl.dot pads
    m, n to 16 and stages its operands). Registers: accumulators plus a few per thread of
    everything else (64 K per SM); a thread holds at most 255, beyond that the compiler spills
    to local memory."""
    cfg = p.config
    lowered = float(padded_shared_memory(p))
    smem = max(step_bytes * max(1, cfg.num_stages - 1), lowered, 1.0)
    regs = acc_regs + _loop_tile_regs(p) + _dot_operand_regs(p) + 16 * 32 * cfg.num_warps
    return lowered, smem, regs


#: shared memory the card sets aside for each resident program beside its own
SMEM_RESERVED = 1024


def _resident(smem: float, regs: float, cfg: KernelConfig, dev: DeviceParams) -> int:
    """Programs one SM holds at once by the model's shared memory (with the card's
    :data:`SMEM_RESERVED` per program), registers and warps."""
    return max(1, min(int(dev.smem // (smem + SMEM_RESERVED)), 64 // cfg.num_warps, int(65536 // regs) or 1))


def residency(op: Op, cfg: KernelConfig, dev: DeviceParams | None = None) -> dict[str, float]:
    """What the model assumes of graph-defined ``op``'s kernel under ``cfg`` on one SM: its
    registers per thread, shared memory per program, and programs resident at once — to set
    beside what the compiled kernel has (:meth:`lower.runtime.CompiledProgram.resources`)."""
    dev = dev or default_params()
    p = plan(op.attrs["block"], cfg)
    _, _, step_bytes = _traffic(op, p)
    _, _, _, acc_regs = _work(p)
    _, smem, regs = _on_chip(p, step_bytes, acc_regs)
    return {"regs": regs / (32 * cfg.num_warps), "shared": smem, "resident": _resident(smem, regs, cfg, dev)}


def _traffic(op: Op, p: KernelPlan) -> tuple[float, float, float]:
    """Bytes of one kernel: (unique device bytes — each source read once, each output
    written once; bytes through L2 — every tile load, replicated tiles re-read, and the
    outputs; bytes one program loads per loop step — the prologue's loads for a kernel
    without a loop)."""
    bg, info = p.block, p.info
    # the steps a program runs on average: a band mask's hidden steps are skipped (lower.skipping)
    nprog, split, steps, F = p.programs, p.config.split, p.mean_steps, bg.forloop
    # a filled input (mugraph.core.fills) is made in registers: no bytes move
    dram = sum(t.nbytes for t in op.inputs if t.fill is None) + sum(t.nbytes for t in op.outputs)
    l2 = 0.0
    step_bytes = 0.0
    loaded = [t for t in bg.tensors if t.op.kind == "iterator" and bg.sources[t.op.attrs["source"]].fill is None]
    for t in loaded:
        per = math.prod(info.shape(t)) * DTYPES[t.dtype]
        looped = t.op.attrs["fmap"] is not None and F > 1
        l2 += per * nprog * split * (steps if looped else 1)
        step_bytes += per if looped else 0.0
    if step_bytes == 0.0:  # no loop (or nothing loaded in it): the prologue's loads are the one step
        step_bytes = sum(math.prod(info.shape(t)) * DTYPES[t.dtype] for t in loaded)
    l2 += sum(t.nbytes for t in op.outputs)
    return dram, l2, step_bytes


def _work(p: KernelPlan) -> tuple[float, float, float, float]:
    """Flops of one kernel, at padded tile sizes: (``tl.dot``, element-wise — CUDA-core
    matmuls included, ops of a dot operand's cone once per warp that replicates them —,
    CUDA-core matmuls alone), and the fp32 accumulator elements one program holds (the
    un-reduced tiles of deferred sums and products included)."""
    info, total, steps = p.info, p.programs * p.config.split, p.mean_steps
    tc, ew, fma = 0.0, 0.0, 0.0
    rep = _dot_operand_replication(p)
    acc_regs = 0.0
    for b in p.block.ops:
        out = b.outputs[0]
        reps = total * (steps if out.acc == 0 else 1)
        if is_contraction(b.kind):
            a = b.inputs[0]
            p_out = info.padded(out)
            k = info.padded(a)[-1]
            fl = 2.0 * math.prod(p_out) * k * reps
            if b.id in info.dot_ops:
                tc += fl
            else:
                ew += fl
                fma += fl
            if b.id in info.deferred:            # "va": the un-reduced product is the accumulator
                acc_regs += math.prod(p_out) * k - math.prod(p_out)
            elif b.id not in info.dot_ops and math.prod(p_out[:-2]) > 1:
                # a batched broadcast product on the CUDA cores (a block of several heads with one
                # query row each) holds its (batch, m, k, n) values at once before the sum over k
                acc_regs += math.prod(p_out) * k
        elif b.kind == "accum":
            acc_regs += _held(p, b)
        elif b.kind != "iterator":
            ew += math.prod(info.padded(out)) * reps * rep.get(b.id, 1)
    online_ew, online_regs = _online_work(p)
    return tc, ew + online_ew * total * steps, fma, acc_regs + online_regs


#: element-wise ops per element of a shift tile, per loop step, to keep its running max: the new
#: max, the safe shift, two differences, two exponentials (:class:`lower.plan.RunningMax`);
#: one difference and one exponential fewer when the shift is folded (``beta`` is 1)
RUNNING_MAX_OPS = 6
RUNNING_MAX_OPS_FOLDED = 4
#: element-wise ops per element of a rescaled accumulator per loop step: acc·alpha + x·beta,
#: or acc·alpha + x when folded
RESCALE_OPS = 3
RESCALE_OPS_FOLDED = 2


def _held(p: KernelPlan, acc: Op) -> int:
    """fp32 elements accumulator ``acc`` holds per program: a deferred sum's un-reduced
    tile, an early sum's reduced one (:attr:`lower.plan.KernelPlan.early_sums`), else its
    own tile."""
    src, out, info = acc.inputs[0].op, acc.outputs[0], p.info
    if src.id in p.deferred_sums:
        return math.prod(info.padded(src.inputs[0]))
    shape = info.padded(out)
    d = p.early_sums.get(acc.id)
    return math.prod(n for i, n in enumerate(shape) if i != d)


def _online_work(p: KernelPlan) -> tuple[float, float]:
    """Element-wise ops one program adds per loop step for its running maxima and the
    sums rescaled to them (at padded sizes; a plain sum's add is not counted, as before),
    and the fp32 registers of running maxima no ``accum_max`` holds already."""
    info, ew, regs = p.info, 0.0, 0.0
    for rm in p.running_maxes:
        m = math.prod(info.padded(rm.shift))
        ew += (RUNNING_MAX_OPS_FOLDED if rm.is_folded else RUNNING_MAX_OPS) * m
        if rm.maximum is None:
            regs += m
        for op in rm.ops:
            if op is not rm.maximum:
                src = op.inputs[0].op
                n = _held(p, op)
                if src.id in info.deferred:        # "va": the un-reduced product (.., m, k, n)
                    n *= info.padded(src.inputs[0])[-1]
                ew += (RESCALE_OPS_FOLDED if rm.is_folded else RESCALE_OPS) * n
    return ew, regs


def _cone_reduced(p: KernelPlan) -> float:
    """Elements one program reduces per loop step to make a ``tl.dot`` operand: the inputs
    (padded) of reductions that read a tile loaded that step and whose result reaches a dot
    (through element-wise ops, not through an accumulator). A norm of a tile loaded once (Q
    before the loop) and a row sum only accumulated (softmax's) are not counted."""
    if p.block.forloop <= 1 or not p.loop_tiles:
        return 0.0
    looped = {t.id for t in p.loop_tiles}
    varies: dict[int, bool] = {}

    def per_step(t) -> bool:  # does tensor t change from one loop step to the next?
        if t.id not in varies:
            varies[t.id] = t.id in looped or (t.op.kind not in ("iterator", "accum")
                                              and any(per_step(x) for x in t.op.inputs))
        return varies[t.id]

    def feeds_dot(t) -> bool:
        stack, seen = [t], set()
        while stack:
            x = stack.pop()
            for c in p.consumers[x]:
                if c.id in p.info.dot_ops:
                    return True
                if c.kind != "accum" and c.id not in seen:
                    seen.add(c.id)
                    stack += list(c.outputs)
        return False

    return float(sum(math.prod(p.info.padded(op.inputs[0])) for op in p.block.ops
                     if category(op.kind) == Category.REDUCTION and per_step(op.inputs[0])
                     and feeds_dot(op.outputs[0])))


def _dot_operand_regs(p: KernelPlan) -> float:
    """32-bit registers (per program) the loop ``tl.dot`` operands take once converted to the
    MMA's operand layout: A (m padded to 16 × the step's K) is held whole by every warp along n,
    B (K × n) split over the warps; of a loop with several dots, the largest's (they run one
    after another, and one's operands are dead before the next's are loaded: an attention step's
    q·kᵀ and p·v at 39,936 bytes of shared memory still ran five programs an SM).

    Why: with few rows the MMA is the register-operand kind (a warpgroup MMA needs 64 rows),
    and a deep step's operands alone can pass what a thread holds. One row times 8192 × 3072 on
    an H200, 32 columns a program at 4 warps: 1,024-deep steps (A: 256 registers a thread,
    B: 128) ran 19.0 μs where the model priced 14.4, and 512-deep ones 15.1 as priced; with
    the operands counted the rank agreement over the recorded sweeps went from 0.59–0.70 to
    0.70–0.84 (with the CUDA-core step price below) and the model's favourite of each shape
    is its fastest or within 9 % of it (was 9–38 %); over the H100 table from 0.64 to 0.68
    (median within a μGraph 0.42 → 0.53; lower/calibration.py)."""
    if p.block.forloop <= 1:
        return 0.0
    info = p.info

    def regs(o: Op) -> float:
        a, b = o.inputs[0], o.inputs[1]
        return (math.prod(info.padded(a)) * _a_copies(p, o) * DTYPES[a.dtype]
                + math.prod(info.padded(b)) * DTYPES[b.dtype]) / 4
    return max((regs(o) for o in p.block.ops if o.id in info.dot_ops and o.id in p.loop_ops), default=0.0)


def _loop_tile_regs(p: KernelPlan) -> float:
    """fp32 registers (elements, per program) the loop's loaded tiles take while element-wise
    ops use them: every loop tile with a use outside ``tl.dot`` (twice with split loads, one copy
    per layout). ``tl.dot`` operands: :func:`_dot_operand_regs`.

    A loop-free kernel loads each of its tiles once, whole: those a matmul on the CUDA cores
    multiplies are counted (:attr:`lower.plan.KernelPlan.core_operands`). Why: one
    row times Phi-2's 2560 × 2560 projection as 80 programs of one 2,560-deep step, its
    product on the CUDA cores (the only form whose operands fit shared memory), ran 27.1 μs
    where the model, counting no tile of a loop-free kernel, priced 7.11 — below the looped
    tilings it ranked second (80 programs of 512-deep steps: 6.38 μs); a short tuning timed
    it first and nothing else (H200, docs/results.md, "Loop-free tiles in registers")."""
    info = p.info
    if p.block.forloop <= 1:
        return float(sum(math.prod(info.padded(t)) for t in p.core_operands))
    return float(sum(math.prod(info.padded(t)) * (2 if t.id in p.dot_operand_loads else 1) for t in p.loop_tiles
                     if any(c.id not in info.dot_ops for c in p.consumers[t])))


def _a_copies(p: KernelPlan, dot: Op) -> int:
    """Warps that each hold the whole A operand of ``dot``: the warps along n, ``num_warps /
    (m / 16)`` when its m rows (padded to ≥ 16) are fewer than 16 a warp."""
    return max(1, p.config.num_warps // max(1, p.info.padded(dot.inputs[0])[-2] // 16))


def _dot_operand_replication(p: KernelPlan) -> dict[int, int]:
    """Block op id -> how many times the generated code computes it per program.

    Element-wise ops that only make an operand of a ``tl.dot`` run in the dot-operand
    layout, where every warp that shares the operand holds all of it: an A operand
    (m rows, padded to ≥ 16) is computed once per warp along n — ``num_warps / (m / 16)``
    times when m is small (the x·g of rmsnorm_matmul at M = 2: 4× at 4 warps; TTGIR,
    docs/history/lowering.md, balanced grids). B operands are split over the warps along n, not replicated.
    """
    info, cons = p.info, p.consumers
    out: dict[int, int] = {}
    for op in p.block.ops:
        if op.id not in info.dot_ops:
            continue
        a = op.inputs[0]
        r = _a_copies(p, op)
        if r == 1:
            continue
        stack = [a]
        while stack:  # the cone of element-wise producers used by this operand only
            t = stack.pop()
            src = t.op
            if (src.kind in ("iterator", "accum") or category(src.kind) in (Category.CONTRACTION, Category.CONSTANT)
                    or any(c is not op and c.id not in out for c in cons[t])):
                continue
            out[src.id] = r
            stack += list(src.inputs)
    return out


#: rows up to which a library matmul is priced as the split-K pair cuBLAS runs it (:func:`_torch_cost`)
LIBRARY_SKINNY_ROWS = 64


def _torch_cost(op: Op, dev: DeviceParams) -> LaunchCost:
    """A library call (cuBLAS, an ATen kernel): its bytes at the card's bandwidth, one launch.

    A matmul of at most :data:`LIBRARY_SKINNY_ROWS` rows pays two launches and two memory
    round trips more than its bytes: cuBLAS runs it as a split-K kernel and a reduce kernel
    (``splitKreduce_kernel`` beside ``nvjet…splitK`` in the profiles of decode steps). Priced
    at its bytes alone, one row times Mistral-7B's v projection (4096 × 1024) ranked first
    at 4.05 μs and ran 9.1 (H200, from DRAM), ahead of tilings that ran 5.4; with these terms
    8.05. OLMo-2-7B's q projection (4096 × 4096): 14.2 against 14.1–14.8 measured, its down
    projection (11008 × 4096): 28 against 27.3–29.0 (docs/results.md, "Loop-free tiles in
    registers")."""
    nbytes = sum(t.nbytes for t in op.inputs) + sum(t.nbytes for t in op.outputs)
    flops, launch, wait = 0.0, dev.launch, 0.0
    if is_contraction(op.kind):
        a = op.inputs[0]
        flops = 2.0 * op.outputs[0].numel * a.shape[-1]
        if a.shape[-2] <= LIBRARY_SKINNY_ROWS:
            launch, wait = 2 * dev.launch, 2 * dev.mem_latency
    t_c = flops / dev.tc_flops
    return LaunchCost(op.kind, dev.sms, nbytes, nbytes, flops, nbytes / dev.dram_bw + wait, nbytes / dev.l2_bw + wait,
                      t_c, 0.0, launch)


def breakdown(graph: KernelGraph, device_params: DeviceParams | None = None,
              configs: dict[int, KernelConfig] | None = None) -> Breakdown:
    """Per-launch cost terms of ``graph`` lowered with ``configs`` (``device_params``: by
    default :func:`default_params`; :func:`for_timing` makes them price a cold timing)."""
    configs = configs or {}
    device_params = device_params or default_params()
    out = Breakdown()
    in_l2 = footprint_bytes(graph) <= device_params.l2_bytes
    fused = matmul_adds(graph)  # an add run by its matmul's cuBLAS call costs no launch of its own
    for op in kernel_order(graph):
        if op.id in fused:
            continue
        if op.kind == "graph_defined":
            try:
                out.launches += _block_cost(op, configs.get(op.id, KernelConfig()), device_params, in_l2)
            except KernelConfigError as e:
                raise KernelConfigError(f"{graph.name} k{op.id}: {e}") from None
        elif TORCH_OPS[op.kind].view:
            continue  # no kernel runs
        else:
            out.launches.append(_torch_cost(op, device_params))
    return out


def estimate(graph: KernelGraph, device_params: DeviceParams | None = None,
             configs: dict[int, KernelConfig] | None = None) -> float:
    """Predicted run time of ``graph`` in seconds (see the module docstring)."""
    return breakdown(graph, device_params, configs).total


def footprint_bytes(graph: KernelGraph) -> int:
    """Bytes of every tensor of the kernel graph: inputs, intermediates, outputs."""
    return sum(t.nbytes for t in graph.inputs) + sum(t.nbytes for op in graph.ops for t in op.outputs
                                                     if op.kind != "input")


def memory_floor_bytes(graph: KernelGraph) -> int:
    """Fewest device bytes any implementation moves: inputs read once, outputs written once."""
    return sum(t.nbytes for t in graph.inputs) + sum(t.nbytes for t in graph.outputs)
