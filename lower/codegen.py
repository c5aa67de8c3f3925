"""Triton code generation: render a :class:`lower.plan.KernelPlan` as one
``@triton.jit`` kernel per graph-defined op (two when split-K sums its partials in a
second kernel).

Mapping (docs/design.md §7.6, paper §6):

* grid axes (and the lowering's own sub-tile / split indices) are decoded from a
  flat ``tl.program_id(0)``; imaps, fmaps and omaps become pointer offsets;
* the for-loop is a Python ``for`` over the iterations; accumulators are fp32
  loop-carried values; loop-invariant work is hoisted (:mod:`lower.schedule`);
* every tile lives in registers with power-of-two extents (:mod:`lower.tiles`),
  loads and stores are masked to the real extents, and values whose padding may
  be non-zero are masked again right before a reduction reads the padding
  (:mod:`lower.emit.core`);
* ``matmul`` → ``tl.dot`` (fp32 accumulation) or, for tiles with a dim of 1 or
  rank 4 — and, by ``KernelConfig.small_mm``, for m or n below 16 — a broadcast
  multiply-and-sum in fp32 (optionally accumulated un-reduced over the loop and
  summed once after it); reductions → ``tl.sum``/``tl.max`` (``keep_dims``);
* ``concat``/``reshape``/``repeat`` that rearrange elements go through a small
  per-program scratch area (the block's "shared memory"), with barriers; a
  matmul of two matching concats is split into a sum of matmuls instead;
* savers are masked stores at the omap offsets;
* a running max and the sums rescaled to it (the online softmax's state) keep the max
  in fp32 registers, each step rescaling what was accumulated; split-K programs hand
  over their maxima with their partials and the combine rescales each onto the
  common maximum (:meth:`_Kernels.combine_maxima`).

Values are computed in fp32 in registers; a tile is rounded to its dtype only where
it leaves registers (stores) or enters a tensor-core ``tl.dot``. Every decision is
the plan's (:func:`lower.plan.plan`); this module and :mod:`lower.emit` only write
the code: the ops' lines (:func:`lower.emit.emit_block`), then the kernels around
them (:class:`_Kernels`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mugraph.core.ir import AXES, RUNNING_MAX, SUM, BlockGraph

from .config import KernelConfig, KernelConfigError, parse_sub
from .emit import EMITTERS, TL_DTYPE, Emitter, Val, emit_block
from .emit.loads import scale_to
from .plan import KernelPlan, RunningMax, plan
from .tiles import TileInfo

__all__ = ["BlockKernel", "DevArg", "EMITTERS", "KernelConfig", "Launch", "generate", "parse_sub", "render"]


@dataclass(frozen=True)
class DevArg:
    """A device tensor a kernel reads or writes: its name, shape, strides, dtype."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str


@dataclass
class Launch:
    """One kernel launch: a function of the generated module, its flat grid, the
    runtime buffers passed (by name), and the compile options."""

    fn: str
    grid: int
    args: list[str]
    num_warps: int
    num_stages: int
    pdl: bool = False   # launched with programmatic dependent launch (the kernel starts with gdc_wait)


@dataclass
class BlockKernel:
    source: str
    launches: list[Launch]
    buffers: dict[str, int]  # workspace buffers this kernel needs: name -> bytes
    info: TileInfo
    locks: dict[str, int] = field(default_factory=dict)  # zeroed int32 counters (kept zero between runs)


def generate(block: BlockGraph, name: str, sources: list[DevArg], outputs: list[DevArg],
             cfg: KernelConfig | None = None, interpret: bool = False, pdl: bool = False) -> BlockKernel:
    """Triton source and launches for one graph-defined op: :func:`render` of its plan.

    ``sources``/``outputs`` describe the device tensors (layouts chosen by
    :mod:`lower.layout`); the runtime passes buffers by the names in ``Launch.args``.
    ``pdl``: every kernel starts with ``gdc_wait()`` (the module must import it from
    ``triton.language.extra.cuda``) and is launched with programmatic dependent launch
    (Hopper and later; not in the interpreter): the launch overlaps the previous kernel's
    tail, nothing else changes. A config the block cannot take raises
    :class:`~lower.config.KernelConfigError` naming the kernel.
    """
    if pdl and interpret:
        raise ValueError(f"{name}: programmatic dependent launch needs a GPU (the interpreter has no gdc_wait)")
    try:
        p = plan(block, cfg)
    except KernelConfigError as e:
        raise KernelConfigError(f"{name}: {e}") from None
    return render(p, name, sources, outputs, interpret=interpret, pdl=pdl)


def render(p: KernelPlan, name: str, sources: list[DevArg], outputs: list[DevArg], interpret: bool = False,
           pdl: bool = False) -> BlockKernel:
    """The kernels, launches, workspace and counters of plan ``p``, named ``name``."""
    em = emit_block(p, sources, interpret)
    k = _Kernels(p, em, name, sources, outputs, pdl)
    if p.config.split == 1:
        k.single()
    elif p.config.combine == "last":
        k.split_last()
    else:
        k.split_combine()
    for ln in k.launches:
        ln.pdl = pdl
    return BlockKernel(k.module(), k.launches, p.buffers(name), p.info, p.locks(name))


class _Kernels:
    """The kernels of one plan around the emitted op lines: headers (program-id
    decoding), the loop, savers, and the split-K partials and their combination."""

    def __init__(self, p: KernelPlan, em: Emitter, name: str, sources: list[DevArg], outputs: list[DevArg],
                 pdl: bool) -> None:
        self.p, self.em, self.name, self.sources, self.outputs, self.pdl = p, em, name, sources, outputs, pdl
        self.kernels: list[tuple[list[str], list[str]]] = []
        self.launches: list[Launch] = []
        self.src_args = [f"{s.name}_ptr" for s in sources]
        self.out_args = [f"{o.name}_ptr" for o in outputs]
        self.scratch_args = ["scratch_ptr"] if p.scratch else []
        self.scratch_buf = [f"{name}_scratch"] if p.scratch else []
        self.part_args = [f"part{j}_ptr" for j in range(len(p.accumulators))]
        self.part_bufs = [f"{name}_part{j}" for j in range(len(p.accumulators))]
        # running maxima handed over beside the accumulators (no accum_max hands them over)
        self.part_args += [f"max{g}_ptr" for g in range(len(p.max_partials))]
        self.part_bufs += [f"{name}_max{g}" for g in range(len(p.max_partials))]

    # -- the three shapes of a kernel
    def single(self) -> None:
        """No split-K: one kernel, one program per (grid block, sub-tile)."""
        p, em, name = self.p, self.em, self.name
        h, body = self.header(name, self.src_args + self.out_args + self.scratch_args, False)
        body += self.scratch_base() + em.lines_of(p.schedule.prologue) + self.loop_block("0")
        body += em.lines_of(p.schedule.invariant_accums) + em.lines_of(p.schedule.epilogue) + self.savers()
        self.add(h, body, Launch(name, p.programs, [s.name for s in self.sources] + [o.name for o in self.outputs]
                                 + self.scratch_buf, p.config.num_warps, p.config.num_stages))

    def split_last(self) -> None:
        """Split-K, ``combine="last"``: the last program of each output tile to finish (an
        atomic counter per tile) sums the partials and runs the post-loop ops."""
        p, split = self.p, self.p.config.split
        h, body = self.partial_kernel(self.name, ["lock_ptr"] + self.out_args, last=True)
        body.append("tl.debug_barrier()  # every thread's partial stores precede the release below")
        body.append("done = tl.atomic_add(lock_ptr + blk, 1, sem=\"acq_rel\")")
        body.append(f"if done == {split - 1}:")
        inner = ["# the last split of this tile: reset its counter for the next run, combine, save",
                 "tl.store(lock_ptr + blk, 0)"] + self.combine_lines("blk", [], last=True)
        body += ["    " + ln for ln in inner]
        self.add(h, body, Launch(self.name, p.programs * split, [s.name for s in self.sources] + self.part_bufs
                                 + [f"{self.name}_lock"] + [o.name for o in self.outputs] + self.scratch_buf,
                                 p.config.num_warps, p.config.num_stages))

    def split_combine(self) -> None:
        """Split-K, ``combine="kernel"``: a partial kernel, then a combine kernel that sums
        the partials and runs the post-loop ops."""
        p, name = self.p, self.name
        h, body = self.partial_kernel(f"{name}_partial", [], last=False)
        self.add(h, body, Launch(f"{name}_partial", p.programs * p.config.split,
                                 [s.name for s in self.sources] + self.part_bufs + self.scratch_buf,
                                 p.config.num_warps, p.config.num_stages))
        # the combine reads a source only for a loop-invariant tile the epilogue adds (a residual)
        used = {o.attrs["source"] for o in p.combine_prologue if o.kind == "iterator"}
        reads = [(a, s.name) for i, (a, s) in enumerate(zip(self.src_args, self.sources)) if i in used]
        h, body = self.header(f"{name}_combine", [a for a, _ in reads] + self.part_args + self.out_args
                              + self.scratch_args, False)
        body += self.scratch_base() + self.combine_lines("pid", self.em.lines_of(p.combine_prologue), last=False)
        self.add(h, body, Launch(f"{name}_combine", p.programs, [n for _, n in reads] + self.part_bufs
                                 + [o.name for o in self.outputs] + self.scratch_buf, 4, 1))

    def add(self, header: list[str], body: list[str], launch: Launch) -> None:
        self.kernels.append((header, body))
        self.launches.append(launch)

    # -- pieces
    def header(self, fn: str, params: list[str], with_split: bool) -> tuple[list[str], list[str]]:
        """The ``def`` line, and the body's first lines: the grid axes (and the split
        index) decoded from the flat program id."""
        h = ["@triton.jit", f"def {fn}({', '.join(params)}):"]
        body = ["pid = tl.program_id(0)"]
        if self.pdl:
            # launched early (programmatic dependent launch); wait, before touching memory,
            # until the kernel before this one on the stream has finished and its writes show
            body = ["gdc_wait()  # programmatic dependent launch: the previous kernel's writes are visible "
                    "from here"] + body
        rest = "pid"
        dec = self.p.axes + ([("split", self.p.config.split)] if with_split else [])
        for i, (v, g) in enumerate(dec):
            if i == len(dec) - 1:
                body.append(f"{v} = {rest}")
            else:
                body.append(f"{v} = {rest} % {g}")
                body.append(f"q{i} = {rest} // {g}")
                rest = f"q{i}"
        return h, body

    def scratch_base(self) -> list[str]:
        return [f"scratch = scratch_ptr + pid * {self.p.scratch}"] if self.p.scratch else []

    def loop_block(self, lo: str) -> list[str]:
        """Accumulators zeroed, the loop over this program's steps (from ``lo``), and the
        once-after-the-loop reductions of deferred sums and products."""
        p, em = self.p, self.em
        body, post = [], []
        for rm in p.running_maxes:
            body.append(f"{rm.name} = tl.full({em.vals[rm.shift.id].pshape}, float('-inf'), tl.float32)  "
                        f"# running max of {rm.shift.label()}")
        for op in p.loop_accumulators:
            if p.folds_as(op) == RUNNING_MAX:
                continue  # its value is the running max
            v = em.vals[op.outputs[0].id]
            x = em.vals[op.inputs[0].id]
            src = op.inputs[0].op.id
            if src in p.info.deferred:
                ax = len(x.pshape) - 2
                body.append(f"# {v.name}_k: the un-reduced product {x.pshape} (m, k, n), fp32: no per-step "
                            "reduction over k")
                body.append(f"{v.name}_k = tl.zeros({x.pshape}, dtype=tl.float32)")
                post.append(f"{v.name} = tl.sum({v.name}_k, axis={ax})  # the k-reduction, once")
            elif src in p.deferred_sums:
                d = p.deferred_sums[src]
                body.append(f"# {v.name}_k: the un-reduced {x.pshape} tile, fp32: one reduction after the loop")
                body.append(f"{v.name}_k = tl.zeros({x.pshape}, dtype=tl.float32)")
                post.append(f"{v.name} = tl.sum({v.name}_k, axis={d}, keep_dims=True)  # once")
            else:
                body.append(f"{v.name} = tl.zeros({v.pshape}, dtype=tl.float32)")
        loop_ops = [o for o in p.schedule.loop if o.kind != "accum"]
        lines = em.lines_of(loop_ops + p.loop_accumulators)
        if p.block.forloop > 1 and loop_ops:
            hi = f"{lo} + {p.steps}" if lo != "0" else f"{p.steps}"
            if p.masked is not None:
                lo, hi = self.masked_range(lo, hi, body)
            if p.asks_staging:
                body.append("# stage every load of this loop num_stages - 1 steps ahead (unasked, Triton stages "
                            "only the loads that feed a tl.dot)")
                body.append(f"for i in tl.range({lo}, {hi}, num_stages={p.config.num_stages}):")
            else:
                body.append(f"for i in range({lo}, {hi}):")
            body += ["    " + ln for ln in lines]
        else:
            body += lines
        return body + post

    def masked_range(self, lo: str, hi: str, body: list[str]) -> tuple[str, str]:
        """The loop's bounds narrowed to the steps the band mask leaves visible to this
        program's rows (:mod:`lower.skipping`); their lines go to ``body``."""
        first, end = self.p.masked.bounds(self.p)
        body.append(f"# steps where {self.p.masked.band} hides every key from this program's rows add nothing "
                    "(lower.skipping): skipped")
        if first != "0":
            body.append(f"i_first = {first}" if lo == "0" else f"i_first = tl.maximum({lo}, {first})")
            lo = "i_first"
        body.append(f"i_end = tl.minimum({hi}, {end})")
        return lo, "i_end"

    def savers(self) -> list[str]:
        """Masked stores of the saved tiles at their omap (and sub-tile) offsets."""
        em, info = self.em, self.p.info
        body = []
        for k, sv in enumerate(self.p.block.savers):
            v = em.vals[sv.tensor.id]
            o = self.outputs[k]
            rank = sv.tensor.ndim
            terms, masks = [], []
            for d in range(rank):
                offs = [f"b{AXES[a]} * {sv.tensor.shape[d]}" for a in range(3) if sv.omap[a] == d]
                if info.factor(sv.tensor, d) > 1:
                    offs.append(f"s{info.key(sv.tensor, d)} * {v.rshape[d]}")
                ar = em.r(v.pshape[d])
                idx = f"({' + '.join(offs)} + {ar})" if offs else ar
                terms.append(em.ex(idx, d, rank) + ("" if o.strides[d] == 1 else f" * {o.strides[d]}"))
                if v.rshape[d] < v.pshape[d]:
                    masks.append(em.ex(f"({ar} < {v.rshape[d]})", d, rank))
            m = f", mask={' & '.join(masks)}" if masks else ""
            body.append(f"# save {k}: {sv.tensor.label()} omap={sv.omap} -> {o.name} {o.shape}")
            body.append(f"tl.store({o.name}_ptr + {' + '.join(terms)}, {v.name}.to({TL_DTYPE[o.dtype]}){m})")
        return body

    def part_index(self, v: Val) -> tuple[str, str]:
        """Index of each element of ``v`` in a compact (real-extent, row-major) partial
        tile, and the mask of its real elements (padding is neither stored nor read)."""
        em = self.em
        st, acc = [], 1
        for s in reversed(v.rshape):
            st.append(acc)
            acc *= s
        idx = " + ".join(em.terms([em.r(p) for p in v.pshape], st[::-1], len(v.pshape)))
        masks = [em.mask_dim(v, d) for d in em.padded_dims(v)]
        return idx, (" & ".join(masks) if masks else "")

    def partial_kernel(self, fn: str, extra_params: list[str], last: bool) -> tuple[list[str], list[str]]:
        """A split-K program: its share of the loop, then its fp32 partial accumulators stored."""
        p, em = self.p, self.em
        h, body = self.header(fn, self.src_args + self.part_args + extra_params + self.scratch_args, True)
        body += self.scratch_base() + em.lines_of(p.schedule.prologue) + self.loop_block(f"split * {p.steps}")
        body += em.lines_of(p.schedule.invariant_accums)
        body.append("# fp32 partial accumulators of this split" +
                    (" (the last program of this tile sums them)" if last else f", combined by {self.name}_combine"))
        body.append(f"blk = pid % {p.programs}")
        for j, op in enumerate(p.accumulators):
            v = em.vals[op.outputs[0].id]
            idx, m = self.part_index(v)
            mk = f", mask={m}" if m else ""
            body.append(f"tl.store(part{j}_ptr + (split * {p.programs} + blk) * {p.partial_elements(op)} + {idx}, "
                        f"{v.name}{mk})")
        for g, rm in enumerate(p.max_partials):
            mv = self.max_val(rm)
            idx, m = self.part_index(mv)
            mk = f", mask={m}" if m else ""
            body.append(f"tl.store(max{g}_ptr + (split * {p.programs} + blk) * {math.prod(mv.rshape)} + {idx}, "
                        f"{rm.name}{mk})  # the scale of this split's rescaled partials")
        return h, body

    def max_val(self, rm: RunningMax) -> Val:
        """The register value of running maximum ``rm`` (shaped like its shift tile)."""
        m = self.em.vals[rm.shift.id]
        return Val(rm.name, m.pshape, m.rshape, True, m.clean, m.finite)

    def max_partial(self, rm: RunningMax) -> tuple[str, int]:
        """The pointer and elements per tile of the partials of running maximum ``rm``: its
        ``accum_max``'s, or a buffer of its own."""
        p = self.p
        if rm.maximum is not None:
            return f"part{p.accumulators.index(rm.maximum)}_ptr", p.partial_elements(rm.maximum)
        return f"max{p.max_partials.index(rm)}_ptr", math.prod(self.max_val(rm).rshape)

    def combine_lines(self, blk: str, pro: list[str], last: bool) -> list[str]:
        """Sum the ``split`` partials of output tile ``blk``, then the epilogue and savers."""
        p, em, split = self.p, self.em, self.p.config.split
        body = list(pro)
        body.append(f"# sum the {split} partial accumulators")
        for j, op in enumerate(p.accumulators):
            if p.folds_as(op) != SUM:
                continue  # a running max or a rescaled sum: combined below
            v = em.vals[op.outputs[0].id]
            idx, m = self.part_index(v)
            mk = f", mask={m}, other=0.0" if m else ""
            cm = ', cache_modifier=".cg"' if last else ""
            body.append(f"{v.name} = tl.zeros({v.pshape}, dtype=tl.float32)")
            # unrolled in the fix-up, so the partials' loads issue together: one L2 round trip
            # at the kernel's tail, not `split` (H100, rms b=8 k4L 21.33 -> 20.99 μs)
            body.append(f"for k in {'tl.static_range' if last else 'range'}({split}):")
            body.append(f"    {v.name} += tl.load(part{j}_ptr + (k * {p.programs} + {blk}) * "
                        f"{p.partial_elements(op)} + {idx}{mk}{cm})")
        body += self.combine_maxima(blk, last)
        return body + em.lines_of(p.schedule.epilogue) + self.savers()

    def combine_maxima(self, blk: str, last: bool) -> list[str]:
        """Combine the split-K partials of running maxima and of the sums rescaled to them
        (flash-decoding's combine): ``M = max_k M_k`` and ``acc = Σ_k acc_k·exp(M_k − M)``
        — each partial was kept on the scale of its own split's ``M_k`` — with the safe
        shift of the loop (0 where ``M`` is −inf: such a row's partials are all zero). A max
        of a loop-invariant tile is the max of its copies."""
        p, em, split = self.p, self.em, self.p.config.split
        rng = "tl.static_range" if last else "range"
        cm = ', cache_modifier=".cg"' if last else ""
        body: list[str] = []

        def load(ptr: str, elements: int, v: Val) -> str:
            idx, m = self.part_index(v)
            mk = f", mask={m}, other=0.0" if m else ""
            return f"tl.load({ptr} + (k * {p.programs} + {blk}) * {elements} + {idx}{mk}{cm})"

        for j, op in enumerate(p.accumulators):
            if p.folds_as(op) == RUNNING_MAX and p.running_max(op) is None:
                v = em.vals[op.outputs[0].id]
                body.append(f"{v.name} = tl.full({v.pshape}, float('-inf'), tl.float32)  # max of the splits' copies")
                body.append(f"for k in {rng}({split}):")
                body.append(f"    {v.name} = tl.maximum({v.name}, {load(f'part{j}_ptr', p.partial_elements(op), v)})")
        for rm in p.running_maxes:
            mv, (ptr, n) = self.max_val(rm), self.max_partial(rm)
            body.append(f"# the running max of {rm.shift.label()} over the {split} splits"
                        + (", and its rescaled sums" if rm.sums else ""))
            body.append(f"{rm.name} = tl.full({mv.pshape}, float('-inf'), tl.float32)")
            body.append(f"for k in {rng}({split}):")
            body.append(f"    {rm.name} = tl.maximum({rm.name}, {load(ptr, n, mv)})")
            if not rm.sums:
                continue
            body.append(f"{rm.name}_safe = tl.where({rm.name} == float('-inf'), 0.0, {rm.name})")
            for op in rm.sums:
                v = em.vals[op.outputs[0].id]
                body.append(f"{v.name} = tl.zeros({v.pshape}, dtype=tl.float32)")
            body.append(f"for k in {rng}({split}):")
            body.append(f"    {rm.name}_alpha = tl.exp({load(ptr, n, mv)} - {rm.name}_safe)  # split k onto the "
                        "common scale")
            for op in rm.sums:
                v = em.vals[op.outputs[0].id]
                j = p.accumulators.index(op)
                alpha = scale_to(em, f"{rm.name}_alpha", mv, op.outputs[0].ndim, False)
                body.append(f"    {v.name} += {load(f'part{j}_ptr', p.partial_elements(op), v)} * {alpha}")
        return body

    def module(self) -> str:
        """The kernels' source: a comment naming the block, config and tensors, then each
        kernel with the ``tl.arange`` vectors it uses declared first."""
        p = self.p
        lines = [f"# ---- {self.name}: grid={p.block.grid} forloop={p.block.forloop} config={p.config.label()}"]
        for s, t in zip(self.sources, p.block.sources):
            lines.append(f"#   makes  {s.name}: {s.shape} {s.dtype}, {t.fill} (its pointer is not read)"
                         if t.fill is not None else f"#   reads  {s.name}: {s.shape} {s.dtype} strides {s.strides}")
        lines += [f"#   writes {o.name}: {o.shape} {o.dtype} strides {o.strides}" for o in self.outputs]
        ar_lines = [f"r{n} = tl.arange(0, {n})" for n in sorted(self.em.aranges)]
        for h, body in self.kernels:
            lines += h
            lines += ["    " + ln for ln in ar_lines + body]
            lines.append("")
        return "\n".join(lines) + "\n"
