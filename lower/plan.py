"""Kernel planning: every decision about how one block graph is lowered under one
:class:`~lower.config.KernelConfig`, made once, before any code is written.

:func:`plan` checks the config against the block and computes

* the tiles (:func:`lower.tiles.analyze`: dim classes, padded extents, which matmuls
  are ``tl.dot``, which products are accumulated un-reduced) and the schedule
  (:func:`lower.schedule.schedule_block`: prologue, loop, epilogue) — each once;
* the loop: μGraph iterations per program (split-K), generated-loop steps (chunk);
* loads and staging: which loop tiles get a second load for a ``tl.dot`` operand
  (:attr:`KernelPlan.dot_operand_loads`), which loads Triton leaves unpipelined,
  whether the loop asks Triton to stage every load, which tiles stay in their
  storage dtype because only tensor-core dots read them;
* deferred sums (:attr:`KernelPlan.deferred_sums`), their mirror image — sums after the
  loop taken every step instead (:attr:`KernelPlan.early_sums`) — and the concat ∘ matmul peephole
  (split matmuls, concats never materialized);
* the running maxima of an online softmax (:attr:`KernelPlan.running_maxes`): one per
  loop-varying shift tile, shared by every sum rescaled to it and by its ``accum_max``,
  and whether the step's exponentials can be taken against the running maximum itself
  (:attr:`RunningMax.folded`);
* the per-program scratch area of the rearranging ops (:attr:`KernelPlan.staged`);
* the launch geometry: grid axes, programs, the accumulators split-K programs hand
  over, workspace buffers and tile counters (:meth:`KernelPlan.buffers`,
  :meth:`KernelPlan.locks`).

The code generator (:mod:`lower.codegen`) renders a plan; the cost model
(:mod:`lower.cost_model`), the shared-memory estimate (:mod:`lower.memory`) and the
tuner (:mod:`lower.profile`) read one. None of them re-derives a decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from mugraph.core.ir import AXES, RESCALED, RUNNING_MAX, SUM, BlockGraph, Op, Tensor, accum_monoid
from mugraph.core.ops import (CATALOG, adds_up, get_op, is_contraction, is_pointwise, is_rearrangement, joins,
                              reduction, reorders)

from .config import COMBINES, KernelConfig, KernelConfigError
from .schedule import BlockSchedule, schedule_block
from .skipping import MaskedSteps, masked_steps
from .tiles import TileInfo, analyze, shared, sums_up

DEFER_SUM_REGS = 32
"""Most fp32 registers per thread an un-reduced sum accumulator may take
(:attr:`KernelPlan.deferred_sums`)."""



@dataclass(eq=False)
class RunningMax:
    """The running maximum ``M`` of one loop-varying shift tile ``m`` (an online softmax's
    row max), kept in fp32 registers across the loop: the scale every sum rescaled by ``m``
    is kept on, and the value of ``accum_max(m)``. Each step computes the new maximum and
    two factors once — ``alpha = exp(M_old − M_new)`` for what was accumulated so far,
    ``beta = exp(m_i − M_new)`` for the step's terms — and every accumulator of the group
    updates as ``acc·alpha + x·beta``."""

    shift: Tensor                            # the loop tile m_i
    ops: list[Op]                            # its accumulators, in emission order (the first writes the step)
    name: str                                # the register variable holding M
    folded: frozenset[int] = frozenset()     # ids of the subs ``a − m_i`` that read ``M_new`` instead

    @property
    def is_folded(self) -> bool:
        """The step's terms are taken against the new maximum (``beta`` is 1): see
        :func:`_folded_shifts`."""
        return bool(self.folded)

    @property
    def sums(self) -> list[Op]:
        """The sums rescaled to this maximum."""
        return [op for op in self.ops if accum_monoid(op) == RESCALED]

    @property
    def maximum(self) -> Op | None:
        """The ``accum_max`` of the shift, if the block reads ``M`` itself."""
        return next((op for op in self.ops if accum_monoid(op) == RUNNING_MAX), None)


@dataclass(eq=False)
class KernelPlan:
    """How one block graph is lowered under one config (see the module docstring).

    Tensors and ops are the block's own; sets hold op or tensor ids."""

    block: BlockGraph
    config: KernelConfig
    info: TileInfo
    schedule: BlockSchedule
    consumers: dict[Tensor, list[Op]]
    loop_ops: frozenset[int]                 # ids of the loop body's ops (accumulators included)
    iterations: int                          # μGraph loop iterations per program (forloop / split)
    steps: int                               # generated-loop steps per program (iterations / chunk)
    dtype: str                               # the storage dtype (``tl.dot`` operands are cast to it)
    deferred_sums: dict[int, int] = field(default_factory=dict)   # sum op id -> dim, reduced after the loop
    early_sums: dict[int, int] = field(default_factory=dict)      # accum op id -> dim its post-loop sum folds, summed per step
    split_matmuls: dict[int, list[tuple[Tensor, Tensor]]] = field(default_factory=dict)  # matmul -> Σ aᵢ @ bᵢ
    dropped: frozenset[int] = frozenset()    # concats only split matmuls read: never materialized
    dot_cone: frozenset[int] = frozenset()   # the loop's tl.dot operand cones (every dot)
    dot_operand_loads: dict[int, tuple[bool, set[int]]] = field(default_factory=dict)  # tiles loaded twice
    dot_only: frozenset[int] = frozenset()   # loaded tiles only tensor-core dots read
    load_permutes: dict[int, int] = field(default_factory=dict)    # permute op id -> iterator op id it loads
    loop_tiles: list[Tensor] = field(default_factory=list)          # tiles the loop loads every step
    loop_has_dot: bool = False               # the generated loop holds a tl.dot
    asks_staging: bool = False               # the loop is tl.range(…, num_stages=): every load staged
    pipelined: bool = False                  # Triton software-pipelines the loop (asked or not)
    unpipelined_loads: list[Tensor] = field(default_factory=list)   # loop tiles each step waits for
    staged: dict[int, int] = field(default_factory=dict)            # op id -> scratch elements
    axes: list[tuple[str, int]] = field(default_factory=list)       # program-id axes: (name, size)
    programs: int = 1                        # programs per split (grid blocks × sub-tiles)
    accumulators: list[Op] = field(default_factory=list)            # handed over by split-K programs
    loop_accumulators: list[Op] = field(default_factory=list)       # updated every loop step
    running_maxes: list[RunningMax] = field(default_factory=list)   # one per loop-varying shift tile
    masked: MaskedSteps | None = None        # loop steps a band mask hides, skipped (lower.skipping)

    # -- derived views
    @property
    def scratch(self) -> int:
        """fp32 elements of scratch each program needs (0: none)."""
        return max(self.staged.values(), default=0)

    @property
    def order(self) -> list[Op]:
        """The ops in the order their code is emitted: prologue, loop body, accumulators of
        invariant values, the loop's accumulator updates, epilogue."""
        sch = self.schedule
        return (sch.prologue + [o for o in sch.loop if o.kind != "accum"] + sch.invariant_accums
                + [o for o in sch.loop if o.kind == "accum"] + sch.epilogue)

    @cached_property
    def combine_prologue(self) -> list[Op]:
        """Prologue ops a separate combine kernel recomputes: the constants, and the
        loop-invariant tiles the epilogue reads (a residual's iterator and what is made of
        it; it loads them itself)."""
        made = {o.outputs[0].id: o for o in self.schedule.prologue}
        need: set[int] = set()
        todo = [t for o in self.schedule.epilogue for t in o.inputs if t.id in made]
        while todo:
            t = todo.pop()
            if t.id not in need:
                need.add(t.id)
                todo += [x for x in made[t.id].inputs if x.id in made]
        return [o for o in self.schedule.prologue if o.outputs[0].acc is None or o.outputs[0].id in need]

    def folds_as(self, acc: Op) -> str:
        """How accumulator ``acc`` folds the loop here: ``"sum"``, ``"max"`` or ``"rescaled"``
        (:func:`mugraph.core.ir.accum_monoid`), except that a sum rescaled by a loop-invariant
        shift is a plain sum — every ``exp(m_i − M)`` is 1."""
        monoid = accum_monoid(acc)
        if monoid == RESCALED and acc.inputs[1].op.id not in self.loop_ops:
            return SUM
        return monoid

    def running_max(self, acc: Op) -> RunningMax | None:
        """The running maximum accumulator ``acc`` belongs to (``None``: a plain sum, or a
        max or rescale of a loop-invariant tile)."""
        return next((rm for rm in self.running_maxes if acc in rm.ops), None)

    @property
    def max_partials(self) -> list[RunningMax]:
        """Running maxima split-K programs hand over beside their accumulators: those no
        ``accum_max`` hands over already (the combine rescales each partial by its own)."""
        return [rm for rm in self.running_maxes if rm.maximum is None]

    def offset_terms(self, op: Op, d: int) -> list[tuple[str, int]]:
        """Where iterator ``op``'s tile starts along dim ``d`` of its source: ``(index,
        stride)`` terms summing to the offset — the grid axes (``bx``…), the loop step
        (``i``) and the sub-tile index (``s<class>``), each times the elements it moves."""
        t, src = op.outputs[0], self.block.sources[op.attrs["source"]]
        imap, fmap = op.attrs["imap"], op.attrs["fmap"]
        terms = [(f"b{AXES[a]}", src.shape[d] // self.block.grid[a]) for a in range(3) if imap[a] == d]
        if fmap == d and self.block.forloop > 1:
            terms.append(("i", t.shape[d] * self.info.chunk))
        if self.info.factor(t, d) > 1:
            terms.append((f"s{self.info.key(t, d)}", self.info.shape(t)[d]))
        return terms

    @cached_property
    def core_operands(self) -> list[Tensor]:
        """The tiles a loop-free kernel loads for a matmul on the CUDA cores (``small_mm``
        ``"v"``/``"va"``: broadcast against the other operand, then summed). Loaded once and
        whole, they are held in registers, as a loop's tiles are step by step; none in a loop."""
        if self.block.forloop > 1:
            return []
        return [t for t in self.block.tensors if t.op.kind == "iterator"
                and any(is_contraction(c.kind) and c.id not in self.info.dot_ops for c in self.consumers[t])]

    @cached_property
    def mean_steps(self) -> float:
        """Loop steps a program runs, on average over the programs and splits: :attr:`steps`
        less those a band mask hides from the whole program (:mod:`lower.skipping`). Read
        three times per pricing by the cost model: computed once."""
        return self.masked.mean_steps(self) if self.masked is not None else float(self.steps)

    def partial_elements(self, acc: Op) -> int:
        """Elements of one program's partial of accumulator ``acc`` (real extents, compact)."""
        return math.prod(self.info.shape(acc.outputs[0]))

    def buffers(self, name: str) -> dict[str, int]:
        """Workspace buffers of the kernel named ``name``: buffer name -> bytes."""
        out = {}
        if self.scratch:
            out[f"{name}_scratch"] = self.scratch * 4 * self.programs * self.config.split
        if self.config.split > 1:
            for j, acc in enumerate(self.accumulators):
                out[f"{name}_part{j}"] = self.config.split * self.programs * self.partial_elements(acc) * 4
            for g, rm in enumerate(self.max_partials):
                out[f"{name}_max{g}"] = self.config.split * self.programs * math.prod(self.info.shape(rm.shift)) * 4
        return out

    def locks(self, name: str) -> dict[str, int]:
        """Zeroed int32 counters (one per output tile) of the ``"last"`` combine."""
        return {f"{name}_lock": self.programs} if self.config.split > 1 and self.config.combine == "last" else {}


def plan(block: BlockGraph, cfg: KernelConfig | None = None) -> KernelPlan:
    """The plan of ``block`` under ``cfg`` (default :class:`KernelConfig`); a config the
    block cannot take raises :class:`~lower.config.KernelConfigError`. Made once per block
    and config within :func:`lower.tiles.shared_analyses` (a tuning's rankings and sweeps)."""
    cfg = cfg or KernelConfig()
    return shared("plan", block, (cfg,), lambda: _plan(block, cfg))


def _plan(block: BlockGraph, cfg: KernelConfig) -> KernelPlan:
    _check(block, cfg)
    sch = schedule_block(block)
    loop = frozenset(o.id for o in sch.loop)
    info = analyze(block, loop, dict(cfg.sub), chunk=cfg.chunk, small_mm=cfg.small_mm)
    iterations = block.forloop // max(1, cfg.split)
    p = KernelPlan(block, cfg, info, sch, block.consumers(), loop, iterations, iterations // max(1, cfg.chunk),
                   block.savers[0].tensor.dtype if block.savers else "float16")
    p.deferred_sums = _deferred_sums(p) if cfg.defer_sums else {}
    p.split_matmuls, p.dropped = _split_matmuls(p)
    p.dot_cone = frozenset(_dot_cones(p)[0])
    p.dot_operand_loads = (_dot_operand_loads(p, frozenset(p.split_matmuls) | p.dropped) if cfg.split_loads
                           else {})
    p.load_permutes = _load_permutes(p)
    p.dot_only = frozenset(t.id for t in block.tensors if t.op.kind == "iterator" and _dot_only(p, t))
    p.loop_tiles = [t for t in block.tensors if t.op.kind == "iterator" and t.op.attrs["fmap"] is not None
                    and t.op.id in loop]
    looped = block.forloop > 1 and cfg.num_stages > 1
    p.loop_has_dot = block.forloop > 1 and any(o.id in info.dot_ops for o in sch.loop)
    p.asks_staging = looped and (cfg.stage_all_loads or (cfg.small_mm != "dot" and not p.loop_has_dot))
    p.pipelined = looped and (p.loop_has_dot or p.asks_staging)
    p.unpipelined_loads = _unpipelined_loads(p) if looped and not p.asks_staging else []
    p.staged = _staged(p)
    p.axes = ([(f"b{AXES[a]}", g) for a, g in enumerate(block.grid) if g > 1]
              + [(f"s{c}", r) for c, r in sorted(info.split.items())])
    p.programs = math.prod(g for _, g in p.axes)
    p.accumulators = [op for op in sch.loop + sch.invariant_accums if op.kind == "accum"]
    p.loop_accumulators = [op for op in sch.loop if op.kind == "accum"]
    p.running_maxes = _running_maxes(p)
    p.early_sums = _early_sums(p)
    p.masked = masked_steps(p) if cfg.skip_masked else None
    return p


def _check(block: BlockGraph, cfg: KernelConfig) -> None:
    if cfg.split > 1 and (block.forloop % cfg.split or block.forloop == 1):
        raise KernelConfigError(f"split {cfg.split} must divide forloop {block.forloop}")
    if cfg.chunk > 1 and (block.forloop // max(1, cfg.split)) % cfg.chunk:
        raise KernelConfigError(f"chunk {cfg.chunk} must divide forloop/split {block.forloop}/{cfg.split}")
    if cfg.combine not in COMBINES:
        raise KernelConfigError(f"combine must be 'kernel' or 'last', got {cfg.combine!r}")


def _running_maxes(p: KernelPlan) -> list[RunningMax]:
    """The loop's running maxima: one per loop-varying shift tile, with the accumulators
    that rescale by it or read its maximum, in emission order. Two rescaled sums of one
    shift share one ``M`` (the IR's meaning), so they share one register and one pair of
    factors per step."""
    groups: dict[int, RunningMax] = {}
    for op in p.loop_accumulators:
        monoid = p.folds_as(op)
        if monoid == SUM:
            continue
        m = op.inputs[0] if monoid == RUNNING_MAX else op.inputs[1]
        if m.op.id not in p.loop_ops:
            continue  # the max of an invariant tile is that tile
        rm = groups.setdefault(m.id, RunningMax(m, [], f"run_{m.label()}"))
        rm.ops.append(op)
    for rm in groups.values():
        rm.folded = _folded_shifts(p, rm) if rm.sums and p.config.fold_shifts else frozenset()
    return list(groups.values())


def _folded_shifts(p: KernelPlan, rm: RunningMax) -> frozenset[int]:
    """The subtractions ``a − m`` whose shift can be the new running maximum ``M_new``
    itself (empty: none can, the step keeps ``acc·alpha + x·beta``).

    A rescaled sum adds ``x·exp(m − M_new)`` per step. When ``m`` is read only as the
    shift of exponentials ``e = exp(a − m)`` (and by its own accumulators), and every
    summed term ``x`` is linear in those exponentials — reached from them through ops of
    the catalog's Lax classes ``linear`` (all operands linear in them), ``multilinear``
    (one operand linear, the others independent of ``m``) and ``division`` (by a tile
    independent of ``m``) — then ``x·exp(m − M_new)`` is ``x`` computed from
    ``exp(a − M_new)``. The kernel then takes the maximum first and exponentiates against
    it, as FlashAttention does: no ``beta`` factor, one multiply less per summed element,
    and a ``tl.dot`` whose result is only added to its accumulator, which Triton fuses
    into the dot. Exact in real arithmetic; the exponentials stay ≤ 1."""
    m, cons, loop = rm.shift, p.consumers, p.loop_ops
    saved = {sv.tensor.id for sv in p.block.savers}
    dep: set[int] = {m.id}      # tensors computed from m
    lin: set[int] = set()       # tensors linear in the exponentials of a − m
    shifted: set[int] = set()   # the subtractions a − m
    reached: set[int] = set()   # rm's sums whose term is linear
    for op in p.block.ops:
        ins = [t.id in dep for t in op.inputs]
        if not any(ins):
            continue
        if op in rm.ops:
            if accum_monoid(op) == RESCALED:
                if op.inputs[0].id not in lin or op.inputs[1] is not m:
                    return frozenset()
                reached.add(op.id)
            elif op.inputs[0] is not m:
                return frozenset()
            continue
        if op.id not in loop or op.kind not in CATALOG or op.outputs[0].id in saved:
            return frozenset()
        d, out = get_op(op.kind), op.outputs[0]
        if d.signs == (1, -1) and op.inputs[1] is m and not ins[0]:
            if not all(get_op(c.kind).lax == "exponentiation" for c in cons.get(out, [])):
                return frozenset()
            shifted.add(op.id)
            dep.add(out.id)
            continue
        if d.lax == "exponentiation":
            ok = op.inputs[0].op.id in shifted
        elif d.lax == "linear":
            ok = all(t.id in lin for t in op.inputs)
        elif d.lax == "multilinear":
            ok = len(op.inputs) > 1 and ins.count(True) == 1 and all(t.id in lin for t, x in zip(op.inputs, ins) if x)
        elif d.lax == "division":
            ok = op.inputs[0].id in lin and not ins[1]
        else:
            ok = False
        if not ok:
            return frozenset()
        dep.add(out.id)
        lin.add(out.id)
    if reached != {op.id for op in rm.sums} or not shifted:
        return frozenset()
    return frozenset(shifted)


def _deferred_sums(p: KernelPlan) -> dict[int, int]:
    """Sums (reductions whose combine is addition) of the loop body whose only use is an
    accumulator that adds them up (op id -> dim): a sum, or the summed side of a rescaled
    sum — its per-row scale broadcasts over the summed dim, so the un-reduced tile rescales
    as the sum would (:func:`lower.tiles.sums_up`).

    Σ_steps Σ_dim x = Σ_dim Σ_steps x: such a sum can add up the un-reduced tile and
    reduce once after the loop. Reducing every step costs a cross-warp exchange and a
    barrier per step when warps split the summed dim, which stalls the software-pipelined
    loads (rmsnorm_matmul's Σx² beside its matmul). Only while the tile stays within
    :data:`DEFER_SUM_REGS` fp32 registers per thread."""
    block, info = p.block, p.info
    if block.forloop <= 1:
        return {}
    saved = [sv.tensor for sv in block.savers]
    out = {}
    for op in p.schedule.loop:
        if reduction(op.kind) is None or not adds_up(op.kind):
            continue
        x, t = op.inputs[0], op.outputs[0]
        users = p.consumers.get(t, [])
        d = op.attrs["dim"]
        if (len(users) != 1 or not sums_up(users[0], t) or users[0].id not in p.loop_ops
                or info.shape(x)[d] == 1 or t in saved):
            continue
        if math.prod(info.padded(x)) <= DEFER_SUM_REGS * 32 * p.config.num_warps:
            out[op.id] = d
    return out


def _early_sums(p: KernelPlan) -> dict[int, int]:
    """Loop accumulators whose only use is a sum after the loop (accum op id -> the dim it
    folds) and whose tile exceeds :data:`DEFER_SUM_REGS` fp32 registers per thread: each
    step adds up its tile along that dim before accumulating it, and the sum after the loop
    is the accumulator itself. The mirror image of :func:`_deferred_sums`, by the same
    identity Σ_steps Σ_dim x = Σ_dim Σ_steps x, and the same bound on which side holds the
    un-reduced tile: a μGraph may accumulate an online softmax's exponentials whole and sum
    them after the loop (as a search found for a 64 × 128 score tile: 64 more registers
    per thread than the row sums). A rescaled sum qualifies when its shift broadcasts along
    the dim (one factor per row: it commutes with the sum). Not under split-K, whose
    programs hand over their accumulators as the graph shapes them."""
    block, info = p.block, p.info
    if block.forloop <= 1 or p.config.split > 1:
        return {}
    saved = {sv.tensor for sv in block.savers}
    budget = DEFER_SUM_REGS * 32 * p.config.num_warps
    out = {}
    for op in p.loop_accumulators:
        monoid = p.folds_as(op)
        x, t = op.inputs[0], op.outputs[0]
        users = p.consumers.get(t, [])
        if (monoid == RUNNING_MAX or len(users) != 1 or t in saved or x.op.id in info.deferred
                or x.op.id in p.deferred_sums):
            continue
        u = users[0]
        if reduction(u.kind) is None or not adds_up(u.kind) or u.id in p.loop_ops:
            continue
        d = u.attrs["dim"]
        if info.shape(x)[d] == 1 or (monoid == RESCALED and info.shape(op.inputs[1])[d] != 1):
            continue
        if math.prod(info.padded(x)) > budget:
            out[op.id] = d
    return out


def _split_matmuls(p: KernelPlan) -> tuple[dict[int, list], frozenset[int]]:
    """The concat ∘ matmul peephole (pairs found by :func:`lower.tiles.analyze`): matmuls
    lowered as Σᵢ aᵢ @ bᵢ, and the concats whose only users are such matmuls (never
    materialized)."""
    info = p.info
    pairs = {k: v for k, v in info.pairs.items() if k in info.dot_ops}
    saved = {sv.tensor for sv in p.block.savers}
    dropped = set()
    for op in p.block.ops:
        if joins(op.kind):
            users = p.consumers[op.outputs[0]]
            if users and all(u.id in pairs for u in users) and op.outputs[0] not in saved:
                dropped.add(op.id)
    return pairs, frozenset(dropped)


def _dot_cones(p: KernelPlan, skip: frozenset[int] = frozenset()) -> tuple[set[int], list[Tensor]]:
    """The loop's ``tl.dot`` operand cones: (ids of the dots and of the element-wise loop ops
    that make an operand and nothing else, the loop tiles at the cones' leaves).
    Matmuls in ``skip`` (split concats) are left out."""
    loop, cons = p.loop_ops, p.consumers
    dots = [op for op in p.block.ops
            if is_contraction(op.kind) and op.id in p.info.dot_ops and op.id not in skip and op.id in loop]
    cone: set[int] = {op.id for op in dots}   # the cones of every operand of every such dot
    leaves: list[Tensor] = []
    for op in dots:
        for operand in op.inputs:
            stack = [operand]
            while stack:
                t = stack.pop()
                src = t.op
                if src.kind == "iterator":
                    leaves.append(t)
                elif (is_pointwise(src.kind) and src.id in loop
                      and all(c.id in cone or c.id == op.id for c in cons[t])):
                    cone.add(src.id)
                    stack += list(src.inputs)
    return cone, list(dict.fromkeys(leaves))


def _dot_operand_loads(p: KernelPlan, skip: frozenset[int]) -> dict[int, tuple[bool, set[int]]]:
    """Loop-loaded tiles that feed a ``tl.dot`` operand *and* other ops: tensor id ->
    (the operand's cone computes in fp32, ids of the cone's ops that read the tile).

    The cone of an operand is the dot and the element-wise ops that make the operand
    and nothing else. Triton computes the cone in the dot-operand layout; a tile also
    used outside it (rmsnorm_matmul's X: the matmul's x·g and the Σx²) is then
    converted between layouts every step, through shared memory with a barrier
    (H100: rmsnorm_matmul with the Σx² 27.5 μs at 2 warps, without 19.3). Loading it
    once per layout is cheaper. Matmuls in ``skip`` (split concats) are left alone."""
    if p.block.forloop <= 1:
        return {}
    cone, leaves = _dot_cones(p, skip)
    dots = {op.id for op in p.block.ops if op.id in cone and is_contraction(op.kind)}
    out: dict[int, tuple[bool, set[int]]] = {}
    for t in leaves:
        inside = {c.id for c in p.consumers[t] if c.id in cone}
        if t.op.attrs["fmap"] is not None and inside and any(c.id not in cone for c in p.consumers[t]):
            out[t.id] = (any(i not in dots for i in inside), inside)
    return out


def _load_permutes(p: KernelPlan) -> dict[int, int]:
    """Permutes folded into a load: a permute of an iterator's tile that nothing else
    reads (and that is not loaded twice) is loaded in its permuted order directly —
    the pointer terms of the source's dims in the permute's order, i.e. the strides do
    the transposing (:func:`lower.emit.rearrange.emit_permute`)."""
    out = {}
    for op in p.block.ops:
        if not reorders(op.kind):
            continue
        (x,) = op.inputs
        if x.op.kind == "iterator" and len(p.consumers[x]) == 1 and x.id not in p.dot_operand_loads:
            out[op.id] = x.op.id
    return out


def _dot_only(p: KernelPlan, t: Tensor) -> bool:
    """``t`` feeds tensor-core dots only (directly, through a dropped concat or through
    a permute folded into its load): it is kept in its storage dtype, which is what
    ``tl.dot`` takes."""
    def dot(op: Op) -> bool:
        return is_contraction(op.kind) and op.id in p.info.dot_ops

    for c in p.consumers[t]:
        if c.id in p.dropped or c.id in p.load_permutes:
            if not all(dot(u) for u in p.consumers[c.outputs[0]]):
                return False
        elif not dot(c):
            return False
    return bool(p.consumers[t])


def _unpipelined_loads(p: KernelPlan) -> list[Tensor]:
    """Loop tiles whose loads Triton does *not* software-pipeline: each step of the loop
    waits a full memory round trip for them.

    Triton (3.6, 3.9) stages, unasked, only the loads of a loop that feed a ``tl.dot``
    operand (through its element-wise cone); a tile with any other use is loaded
    synchronously — with split loads it gets a second, staged load for the cone, but the
    first one still waits. Asked (``tl.range(…, num_stages=)``: ``stage_all_loads``, and
    the dot-free loops of the ``"v"``/``"va"`` lowerings) it stages every load. (Called
    only for a loop with stages that does not ask.)"""
    if not p.loop_has_dot:
        return list(p.loop_tiles)
    return [t for t in p.loop_tiles if any(c.id not in p.dot_cone for c in p.consumers[t])]


def _staged(p: KernelPlan) -> dict[int, int]:
    """Ops that rearrange elements through the per-program scratch area -> the fp32
    elements they need (:data:`SCRATCH`); concats never materialized take none."""
    out = {}
    for op in p.block.ops:
        if op.id in p.dropped or not is_rearrangement(op.kind):
            continue
        n = SCRATCH[op.kind](p, op)
        if n is not None:
            out[op.id] = n
    return out


def _scratch_reshape(p: KernelPlan, op: Op) -> int | None:
    """A reshape of padded tiles (of unpadded ones: a register reshape)."""
    info, x, t = p.info, op.inputs[0], op.outputs[0]
    if info.padded(x) == info.shape(x) and info.padded(t) == info.shape(t):
        return None
    return math.prod(info.shape(t))


def _scratch_repeat(p: KernelPlan, op: Op) -> int | None:
    """A repeat of dims longer than 1 (along unit dims: a broadcast)."""
    info, x = p.info, op.inputs[0]
    if all(r == 1 or info.shape(x)[d] == 1 for d, r in enumerate(op.attrs["reps"])):
        return None
    return math.prod(info.shape(x))


#: rearrangement -> the fp32 scratch elements it needs per program (None: it stays in registers)
SCRATCH: dict[str, Callable[[KernelPlan, Op], int | None]] = {
    "concat": lambda p, op: math.prod(p.info.shape(op.outputs[0])),
    "reshape": _scratch_reshape,
    "repeat": _scratch_repeat,
    "permute": lambda p, op: None,   # folded into its load, or a register tl.permute
    "slice": lambda p, op: None,     # kernel level only: a torch view, never in a block
}
