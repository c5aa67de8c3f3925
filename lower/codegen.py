"""Triton code generation: one ``@triton.jit`` kernel per graph-defined op
(two when the loop is split across programs).

Mapping (DESIGN §6, paper §6):

* grid axes (and the lowering's own sub-tile / split indices) are decoded from a
  flat ``tl.program_id(0)``; imaps, fmaps and omaps become pointer offsets;
* the for-loop is a Python ``for`` over the iterations; accumulators are fp32
  loop-carried values; loop-invariant work is hoisted (:mod:`lower.schedule`);
* every tile lives in registers with power-of-two extents (:mod:`lower.tiles`),
  loads and stores are masked to the real extents, and values whose padding may
  be non-zero are masked again right before a reduction reads the padding;
* ``matmul`` → ``tl.dot`` (fp32 accumulation) or, for tiles with a dim of 1 or
  rank 4 — and, by ``KernelConfig.small_mm``, for m or n below 16 — a broadcast
  multiply-and-sum in fp32 (optionally accumulated un-reduced over the loop and
  summed once after it); reductions → ``tl.sum/tl.max(keep_dims)``;
* ``concat``/``reshape``/``repeat`` that rearrange elements go through a small
  per-program scratch area (the block's "shared memory"), with barriers; a
  matmul of two matching concats is split into a sum of matmuls instead;
* savers are masked stores at the omap offsets.

Values are computed in fp32 in registers; a tile is rounded to its dtype only where
it leaves registers (stores) or enters a tensor-core ``tl.dot``.

Padding bookkeeping: each value records the dims along which its padding is known
to be zero (``clean``) and whether its padding is finite. Loads give zeros; ops
propagate what they can prove; a reduction or dot contraction along a dim that is
not clean masks first. So the common paths (load → dot, load → square → sum) carry
no extra masks, and no path can leak padding into a real element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from mugraph.ir import AXES, BlockGraph, Op, Tensor

from .schedule import schedule_block
from .tiles import ELEMENTWISE, TileInfo, analyze

TL_DTYPE = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}


@dataclass(frozen=True)
class DevArg:
    """A device tensor a kernel reads or writes: its name, shape, strides, dtype."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class KernelConfig:
    """The lowering's free choices for one block graph (what the profiler tunes).

    ``split``: the loop's iterations are divided over ``split`` programs that write
    fp32 partial accumulators, and a second kernel sums them and runs the post-loop
    ops (split-K). ``sub``: ``((class id, r), …)`` cuts parallel tile dims
    (:func:`lower.tiles.analyze`) into ``r`` sub-tiles, one program each.
    ``chunk``: each step of the generated loop runs ``chunk`` μGraph iterations at
    once (longer tiles along the loop's dim, more bytes in flight; only where
    :func:`lower.tiles.loop_chunks` allows). ``combine``: with split-K, ``"kernel"``
    sums the partials in a second launch; ``"last"`` lets the last program of each
    output tile to finish (an atomic counter per tile) sum them and run the
    post-loop ops — one launch. ``small_mm``: how matmuls with a real m or n below
    16 are lowered — ``"dot"`` (``tl.dot``, padded to 16), ``"v"`` (broadcast
    multiply and ``tl.sum`` in fp32, unpadded) or ``"va"`` (as ``"v"``, the
    un-reduced product accumulated and summed once after the loop); see
    :data:`lower.tiles.SMALL_MM`. Label suffix: the mode's name (``w1s3k4Lv``).
    ``defer_sums``: a loop-body ``sum`` used only by an accumulator adds up the
    un-reduced tile and reduces once after the loop (:func:`deferred_sums`); ``False``
    reduces every step (label suffix ``r``). ``split_loads``: a loop tile that feeds a
    ``tl.dot`` operand and other ops is loaded once for each (:func:`dot_operand_loads`);
    ``False`` loads it once (label suffix ``u``). ``stage_all_loads``: ask Triton to
    software-pipeline *every* load of the loop (``tl.range(…, num_stages=)``); unasked it
    stages only loads that feed a ``tl.dot`` operand, so a loop that also loads a tile for
    other ops (rmsnorm_matmul's X for Σx²) waits for that load every step
    (:func:`unpipelined_loads`; H100 rmsnorm_matmul b=8, no split-K, chunk 4: 28.8 →
    20.2 μs; label suffix ``A``).
    """

    num_warps: int = 4
    num_stages: int = 2
    split: int = 1
    sub: tuple[tuple[int, int], ...] = ()
    fp32_dot: str = "ieee"
    chunk: int = 1
    combine: str = "kernel"
    small_mm: str = "dot"
    defer_sums: bool = True
    split_loads: bool = True
    stage_all_loads: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        """The config ``dataclasses.asdict`` wrote (JSON turns ``sub``'s tuples into lists)."""
        return cls(**{**d, "sub": tuple(tuple(x) for x in d.get("sub", ()))})

    @classmethod
    def from_label(cls, label: str) -> "KernelConfig":
        """The config :meth:`label` names (``"w4s3c2k4Lp1:2x3:4va"``); ``ValueError`` if none."""
        import re

        m = re.fullmatch(r"w(\d+)s(\d+)(?:c(\d+))?(?:k(\d+)(L?))?(?:p([\d:x]+))?(va|v)?(r)?(u)?(A)?", label)
        if not m:
            raise ValueError(f"not a KernelConfig label: {label!r} (e.g. 'w4s3c2k4Lp1:2v')")
        w, st, c, k, last, sub, mm, r, u, a = m.groups()
        return cls(num_warps=int(w), num_stages=int(st), chunk=int(c or 1), split=int(k or 1),
                   combine="last" if last else "kernel", sub=parse_sub(sub or ""), small_mm=mm or "dot",
                   defer_sums=not r, split_loads=not u, stage_all_loads=bool(a))

    def label(self) -> str:
        s = f"w{self.num_warps}s{self.num_stages}"
        if self.chunk > 1:
            s += f"c{self.chunk}"
        if self.split > 1:
            s += f"k{self.split}" + ("L" if self.combine == "last" else "")
        if self.sub:
            s += "p" + "x".join(f"{c}:{r}" for c, r in self.sub)
        if self.small_mm != "dot":
            s += self.small_mm
        if not self.defer_sums:
            s += "r"
        if not self.split_loads:
            s += "u"
        if self.stage_all_loads:
            s += "A"
        return s


def parse_sub(text: str) -> tuple[tuple[int, int], ...]:
    """``KernelConfig.sub`` from its label form ``"1:2x3:4"`` (``""``: none)."""
    return tuple(tuple(int(x) for x in p.split(":")) for p in text.split("x")) if text else ()


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


@dataclass
class Val:
    name: str
    pshape: tuple[int, ...]
    rshape: tuple[int, ...]
    f32: bool                     # register dtype is fp32 (else the storage dtype)
    clean: frozenset = frozenset()
    finite: bool = True


def _fmt(c) -> str:
    f = float(Fraction(c))
    return repr(f)


DEFER_SUM_REGS = 32
"""Most fp32 registers per thread an un-reduced sum accumulator may take
(:func:`deferred_sums`)."""


def deferred_sums(block: BlockGraph, info: TileInfo, cfg: KernelConfig) -> dict[int, int]:
    """``sum`` ops of the loop body whose only use is an accumulator (sum op id -> dim).

    Σ_steps Σ_dim x = Σ_dim Σ_steps x: such a sum can add up the un-reduced tile and
    reduce once after the loop. Reducing every step costs a cross-warp exchange and a
    barrier per step when warps split the summed dim, which stalls the software-pipelined
    loads (rmsnorm_matmul's Σx² beside its matmul). Only while the tile stays within
    :data:`DEFER_SUM_REGS` fp32 registers per thread."""
    if block.forloop <= 1:
        return {}
    sch = schedule_block(block)
    loop = {o.id for o in sch.loop}
    cons = block.consumers()
    out = {}
    for op in sch.loop:
        if op.kind != "sum":
            continue
        x, t = op.inputs[0], op.outputs[0]
        users = cons.get(t, [])
        d = op.attrs["dim"]
        if (len(users) != 1 or users[0].kind != "accum" or users[0].id not in loop or info.shape(x)[d] == 1
                or t in [sv.tensor for sv in block.savers]):
            continue
        if math.prod(info.padded(x)) <= DEFER_SUM_REGS * 32 * cfg.num_warps:
            out[op.id] = d
    return out


def _dot_cones(block: BlockGraph, info: TileInfo, skip: frozenset[int] = frozenset()
               ) -> tuple[set[int], list[Tensor]]:
    """The loop's ``tl.dot`` operand cones: (ids of the dots and of the element-wise loop ops
    that make an operand and nothing else, the loop tiles at the cones' leaves).
    Matmuls in ``skip`` (split concats) are left out."""
    loop = {o.id for o in schedule_block(block).loop}
    cons = block.consumers()
    dots = [op for op in block.ops
            if op.kind == "matmul" and op.id in info.dot_ops and op.id not in skip and op.id in loop]
    cone: set[int] = {op.id for op in dots}   # the cones of every operand of every such dot
    leaves: list[Tensor] = []
    for op in dots:
        for operand in op.inputs:
            stack = [operand]
            while stack:
                t = stack.pop()
                p = t.op
                if p.kind == "iterator":
                    leaves.append(t)
                elif (p.kind in ELEMENTWISE and p.id in loop
                      and all(c.id in cone or c.id == op.id for c in cons[t])):
                    cone.add(p.id)
                    stack += list(p.inputs)
    return cone, list(dict.fromkeys(leaves))


def dot_operand_loads(block: BlockGraph, info: TileInfo, skip: frozenset[int] = frozenset()
                      ) -> dict[int, tuple[bool, set[int]]]:
    """Loop-loaded tiles that feed a ``tl.dot`` operand *and* other ops: tensor id ->
    (the operand's cone computes in fp32, ids of the cone's ops that read the tile).

    The cone of an operand is the dot and the element-wise ops that make the operand
    and nothing else. Triton computes the cone in the dot-operand layout; a tile also
    used outside it (rmsnorm_matmul's X: the matmul's x·g and the Σx²) is then
    converted between layouts every step, through shared memory with a barrier
    (H100: rmsnorm_matmul with the Σx² 27.5 μs at 2 warps, without 19.3). Loading it
    once per layout is cheaper. Matmuls in ``skip`` (split concats) are left alone."""
    if block.forloop <= 1:
        return {}
    cone, leaves = _dot_cones(block, info, skip)
    dots = {op.id for op in block.ops if op.id in cone and op.kind == "matmul"}
    cons = block.consumers()
    out: dict[int, tuple[bool, set[int]]] = {}
    for t in leaves:
        inside = {c.id for c in cons[t] if c.id in cone}
        if t.op.attrs["fmap"] is not None and inside and any(c.id not in cone for c in cons[t]):
            out[t.id] = (any(i not in dots for i in inside), inside)
    return out


def loop_has_dot(block: BlockGraph, info: TileInfo) -> bool:
    """Whether the generated loop of ``block`` holds a ``tl.dot`` (what Triton's pipeliner keys on)."""
    return block.forloop > 1 and any(o.id in info.dot_ops for o in schedule_block(block).loop)


def loop_asks_staging(block: BlockGraph, info: TileInfo, cfg: "KernelConfig") -> bool:
    """Whether the generated loop is ``tl.range(…, num_stages=)``, which asks Triton to stage
    every load: under ``stage_all_loads``, and in the dot-free loops of the ``"v"``/``"va"``
    lowerings (unasked, Triton stages only loads feeding a ``tl.dot``)."""
    if block.forloop <= 1 or cfg.num_stages <= 1:
        return False
    return cfg.stage_all_loads or (cfg.small_mm != "dot" and not loop_has_dot(block, info))


def loop_tiles(block: BlockGraph) -> list[Tensor]:
    """The tiles the generated loop loads every step (iterators with an fmap, in the loop)."""
    loop = {o.id for o in schedule_block(block).loop}
    return [t for t in block.tensors if t.op.kind == "iterator" and t.op.attrs["fmap"] is not None
            and t.op.id in loop]


def unpipelined_loads(block: BlockGraph, info: TileInfo, cfg: "KernelConfig") -> list[Tensor]:
    """Loop tiles whose loads Triton does *not* software-pipeline under ``cfg``: each step
    of the loop waits a full memory round trip for them.

    Triton (3.6, 3.9) stages, unasked, only the loads of a loop that feed a ``tl.dot``
    operand (through its element-wise cone); a tile with any other use is loaded
    synchronously — with split loads it gets a second, staged load for the cone, but the
    first one still waits. Asked (``tl.range(…, num_stages=)``: ``stage_all_loads``, and
    the dot-free loops of the ``"v"``/``"va"`` lowerings) it stages every load. Without a
    loop, or with ``num_stages`` ≤ 1, there is nothing to pipeline: empty."""
    if block.forloop <= 1 or cfg.num_stages <= 1 or loop_asks_staging(block, info, cfg):
        return []
    tiles = loop_tiles(block)
    if not loop_has_dot(block, info):
        return tiles
    cone, _ = _dot_cones(block, info)
    cons = block.consumers()
    return [t for t in tiles if any(c.id not in cone for c in cons[t])]


class _Emitter:
    def __init__(self, block: BlockGraph, name: str, sources: list[DevArg], outputs: list[DevArg],
                 cfg: KernelConfig, info: TileInfo) -> None:
        self.b, self.name, self.src, self.out, self.cfg, self.info = block, name, sources, outputs, cfg, info
        self.dtype = block.savers[0].tensor.dtype if block.savers else "float16"
        self.vals: dict[int, Val] = {}
        self.lines: dict[int, list[str]] = {}   # op id -> lines
        self.cur: list[str] = []
        self.aranges: set[int] = set()
        self.scratch = 0                       # fp32 elements of scratch per program
        self.consumers = block.consumers()
        self.sched = schedule_block(block)
        self.loop_F = block.forloop // max(1, cfg.split)      # μGraph iterations per program
        self.iters = self.loop_F // max(1, cfg.chunk)          # generated-loop steps per program
        self.interpret = False
        self.deferred_sums = deferred_sums(block, info, cfg) if cfg.defer_sums else {}
        self.dup_loads: dict[int, tuple[bool, set[int]]] = {}
        self.dup_vals: dict[int, Val] = {}

    # -- helpers
    def r(self, p: int) -> str:
        self.aranges.add(p)
        return f"r{p}"

    @staticmethod
    def ex(expr: str, d: int, rank: int) -> str:
        if rank == 1:
            return expr
        return f"{expr}[{', '.join(':' if i == d else 'None' for i in range(rank))}]"

    def mask_dim(self, v: Val, d: int) -> str:
        return self.ex(f"({self.r(v.pshape[d])} < {v.rshape[d]})", d, len(v.pshape))

    def padded_dims(self, v: Val) -> list[int]:
        return [d for d in range(len(v.pshape)) if v.pshape[d] > v.rshape[d]]

    def f32(self, v: Val) -> str:
        return v.name if v.f32 else f"{v.name}.to(tl.float32)"

    def emit(self, line: str) -> None:
        self.cur.append(line)

    def val(self, t: Tensor, **kw) -> Val:
        v = Val(self.name_of(t), self.info.padded(t), self.info.shape(t), **kw)
        self.vals[t.id] = v
        return v

    @staticmethod
    def name_of(t: Tensor) -> str:
        return t.label() if t.op.kind != "accum" else f"acc_{t.label()}"

    def clean_only(self, v: Val, dims) -> str:
        """``v`` as an expression whose padding along ``dims`` is zero."""
        need = [d for d in dims if v.pshape[d] > v.rshape[d] and d not in v.clean]
        if not need:
            return self.f32(v) if v.f32 else v.name
        m = " & ".join(self.mask_dim(v, d) for d in need)
        return f"tl.where({m}, {v.name}, 0.0)"

    def align(self, expr: str, rank: int, target: int) -> str:
        if rank >= target:
            return expr
        return f"{expr}[{', '.join(['None'] * (target - rank) + [':'] * rank)}]"

    # -- ops
    def op_iterator(self, op: Op) -> None:
        t = op.outputs[0]
        src = self.src[op.attrs["source"]]
        imap, fmap = op.attrs["imap"], op.attrs["fmap"]
        pshape, rshape = self.info.padded(t), self.info.shape(t)
        rank = t.ndim
        terms, masks = [], []
        for d in range(rank):
            offs = []
            for a in range(3):
                if imap[a] == d:
                    offs.append(f"b{AXES[a]} * {src.shape[d] // self.b.grid[a]}")
            if fmap == d and self.b.forloop > 1:
                offs.append(f"i * {t.shape[d] * self.info.chunk}")
            if self.info.factor(t, d) > 1:
                offs.append(f"s{self.info.key(t, d)} * {rshape[d]}")
            ar = self.r(pshape[d])
            idx = f"({' + '.join(offs)} + {ar})" if offs else ar
            stride = src.strides[d]
            terms.append(self.ex(idx, d, rank) + ("" if stride == 1 else f" * {stride}"))
            if rshape[d] < pshape[d]:
                masks.append(self.ex(f"({ar} < {rshape[d]})", d, rank))
        args = f"{src.name}_ptr + {' + '.join(terms)}" + (f", mask={' & '.join(masks)}, other=0.0" if masks else "")

        def load(f32: bool, extra: str = "") -> str:
            return f"tl.load({args}{extra})" + (".to(tl.float32)" if f32 and src.dtype != "float32" else "")

        f32 = src.dtype == "float32" or not self.dot_only(t)
        v = self.val(t, f32=f32, clean=frozenset(range(rank)), finite=True)
        self.emit(f"{v.name} = {load(f32)}")
        if t.id in self.dup_loads:
            # a second load of the same tile for the tl.dot operand's cone: each load gets the
            # layout its users need, instead of a per-step layout conversion (a shared-memory
            # round trip and a barrier); the eviction hint keeps Triton from merging the two
            d32 = self.dup_loads[t.id][0] or src.dtype == "float32"
            self.dup_vals[t.id] = Val(f"{v.name}_d", v.pshape, v.rshape, d32, v.clean, True)
            hint = ', eviction_policy="evict_last"'
            self.emit(f"{v.name}_d = {load(d32, hint)}  # for the tl.dot operand")

    def op_const(self, op: Op) -> None:
        t = op.outputs[0]
        v = self.val(t, f32=True, clean=frozenset(), finite=True)
        self.emit(f"{v.name} = tl.full({v.pshape}, {_fmt(op.attrs['value'])}, tl.float32)")

    def op_unary(self, op: Op) -> None:
        t = op.outputs[0]
        x = self.vals[op.inputs[0].id]
        a = self.f32(x)
        k = op.kind
        expr = {"exp": f"tl.exp({a})", "sqrt": f"tl.sqrt({a})", "square": f"{a} * {a}",
                "silu": f"{a} * tl.sigmoid({a})", "scale": f"{a} * {_fmt(op.attrs.get('c', 1))}"}[k]
        keeps_zero = k in ("square", "silu", "scale", "sqrt")
        clean = x.clean if keeps_zero else frozenset()
        finite = x.finite and (k != "sqrt" or not [d for d in self.padded_dims(x) if d not in x.clean]) \
            and k != "exp"
        if k == "exp":
            finite = False
        v = self.val(t, f32=True, clean=clean, finite=finite)
        self.emit(f"{v.name} = {expr}")

    def op_binary(self, op: Op) -> None:
        t = op.outputs[0]
        xs = [self.vals[x.id] for x in op.inputs]
        r = t.ndim
        a, b = (self.align(self.f32(x), len(x.pshape), r) for x in xs)
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op.kind]
        pt, rt = self.info.padded(t), self.info.shape(t)
        clean = set()
        for d in range(r):
            if pt[d] == rt[d]:
                continue
            full = []  # operands spanning this dim (not broadcast), with their own dim index
            for x in xs:
                dx = d - (r - len(x.pshape))
                full.append(dx >= 0 and x.rshape[dx] == rt[d] and dx in x.clean)
            if op.kind in ("add", "sub") and all(full):
                clean.add(d)
            elif op.kind == "mul" and any(full) and all(x.finite for x in xs):
                clean.add(d)
        finite = all(x.finite for x in xs) and op.kind != "div"
        v = self.val(t, f32=True, clean=frozenset(clean), finite=finite)
        self.emit(f"{v.name} = {a} {sym} {b}")

    def op_reduce(self, op: Op) -> None:
        t = op.outputs[0]
        x = self.vals[op.inputs[0].id]
        d = op.attrs["dim"]
        if x.rshape[d] == 1:
            v = self.val(t, f32=x.f32, clean=x.clean, finite=x.finite)
            self.emit(f"{v.name} = {x.name}")
            return
        if op.kind == "sum" and op.id in self.deferred_sums:
            # only an accumulator uses this sum: it adds up the un-reduced tile (padding zeroed)
            # and reduces once after the loop — no cross-warp reduction (and barrier) per step
            src = self.clean_only(x, [d])
            src = src if x.f32 else f"({src}).to(tl.float32)"
            v = self.val(t, f32=True, clean=x.clean | {d}, finite=x.finite)
            v.pshape, v.rshape = x.pshape, x.rshape
            self.emit(f"{v.name} = {src}  # summed over dim {d} once, after the loop")
        elif op.kind == "sum":
            src = self.clean_only(x, [d])
            v = self.val(t, f32=True, clean=x.clean - {d}, finite=x.finite)
            self.emit(f"{v.name} = tl.sum({src}, axis={d}, keep_dims=True)")
        else:
            src = self.f32(x)
            if x.pshape[d] > x.rshape[d]:
                src = f"tl.where({self.mask_dim(x, d)}, {src}, float('-inf'))"
            v = self.val(t, f32=True, clean=frozenset(), finite=x.finite)
            self.emit(f"{v.name} = tl.max({src}, axis={d}, keep_dims=True)")

    def _dot_operand(self, x: Val, contract: int) -> str:
        expr = self.clean_only(x, [contract])
        if self.dtype == "bfloat16" and self.interpret:
            # Triton's interpreter computes bf16 tl.dot wrongly (numpy has no bf16):
            # round to bf16, then multiply exactly in fp32 — the same products.
            return f"({expr}).to(tl.bfloat16).to(tl.float32)"
        if self.dtype == "float32":
            return expr if x.f32 else f"{expr}.to(tl.float32)"
        if x.f32 or expr != x.name:
            return f"({expr}).to({TL_DTYPE[self.dtype]})" if expr != x.name else f"{x.name}.to({TL_DTYPE[self.dtype]})"
        return expr

    def op_matmul(self, op: Op) -> None:
        t = op.outputs[0]
        r = t.ndim
        pt = self.info.padded(t)
        pairs = self.pairs.get(op.id) or [tuple(op.inputs)]
        parts = []
        clean: set = set(range(r))
        finite = True
        for ta, tb in pairs:
            a, b = self.vals[ta.id], self.vals[tb.id]
            ka, kb = len(a.pshape) - 1, len(b.pshape) - 2
            if op.id in self.info.dot_ops:
                ea, eb = self._dot_operand(a, ka), self._dot_operand(b, kb)
                ea, eb = self.align(ea, len(a.pshape), r), self.align(eb, len(b.pshape), r)
                if r == 3:
                    pa = (pt[0],) + tuple(self.info.padded(ta)[-2:])
                    pb = (pt[0],) + tuple(self.info.padded(tb)[-2:])
                    if len(a.pshape) < 3 or a.pshape[0] != pt[0]:
                        ea = f"tl.broadcast_to({ea}, {pa})"
                    if len(b.pshape) < 3 or b.pshape[0] != pt[0]:
                        eb = f"tl.broadcast_to({eb}, {pb})"
                exact32 = self.dtype == "float32" or (self.dtype == "bfloat16" and self.interpret)
                prec = f", input_precision=\"{self.cfg.fp32_dot}\"" if exact32 else ""
                if r == 3 and pt[0] == 1:
                    # a batch of one: a 2-D dot (Triton's 3-D dot takes a slower path on GPU)
                    pa2, pb2 = tuple(self.info.padded(ta)[-2:]), tuple(self.info.padded(tb)[-2:])
                    ea, eb = f"tl.reshape({ea}, {pa2})", f"tl.reshape({eb}, {pb2})"
                    parts.append(f"tl.reshape(tl.dot({ea}, {eb}, out_dtype=tl.float32{prec}), {pt})")
                else:
                    parts.append(f"tl.dot({ea}, {eb}, out_dtype=tl.float32{prec})")
            else:
                # CUDA cores, fp32: out[.., m, n] = Σ_k a[.., m, k] · b[.., k, n] as a broadcast
                # product over (.., m, k, n), summed over k (no padding to tl.dot's 16)
                ea = self.align(self.clean_only(a, [ka]), len(a.pshape), r)
                eb = self.align(self.clean_only(b, [kb]), len(b.pshape), r)
                ea = f"{ea}[{', '.join([':'] * r + ['None'])}]"
                eb = f"{eb}[{', '.join([':'] * (r - 2) + ['None', ':', ':'])}]"
                ea, eb = (e if x.f32 else f"({e}).to(tl.float32)" for e, x in ((ea, a), (eb, b)))
                prod = f"{ea} * {eb}"
                if op.id in self.info.deferred:
                    parts.append(prod)  # summed over k after the loop (op_accum, loop_block)
                else:
                    parts.append(f"tl.sum({prod}, axis={r - 1})")
            # output padding: rows of a's padding / columns of b's padding
            ca = {r - 2} if (len(a.pshape) - 2) in a.clean and b.finite else set()
            cb = {r - 1} if (len(b.pshape) - 1) in b.clean and a.finite else set()
            batch = {d for d in range(r - 2)}
            clean &= ca | cb | batch
            finite = finite and a.finite and b.finite
        clean = {d for d in clean if d >= r - 2}
        v = self.val(t, f32=True, clean=frozenset(clean), finite=finite)
        if op.id not in self.info.dot_ops:
            m, n = self.info.shape(t)[-2:]
            why = (f"m = {m}, n = {n}: small, KernelConfig.small_mm={self.cfg.small_mm!r}"
                   if self.cfg.small_mm != "dot" and min(m, n) < 16 else "no tl.dot for this shape")
            self.emit(f"# on the CUDA cores in fp32 ({why}): a broadcast product over (m, k, n), summed over k")
        if op.id in self.info.deferred:
            # the un-reduced product (.., m, k, n): the accumulator adds it up as is
            kp = self.info.padded(op.inputs[0])[-1]
            v.pshape = v.pshape[:-1] + (kp,) + v.pshape[-1:]
            v.rshape = v.rshape[:-1] + (kp,) + v.rshape[-1:]
            self.emit("# not reduced over k here: accumulated as is, summed once after the loop")
        self.emit(f"{v.name} = {' + '.join(parts)}")

    def _lin(self, names_ranges: list[str], strides: list[int], rank: int) -> str:
        terms = []
        for d, (idx, st) in enumerate(zip(names_ranges, strides)):
            terms.append(self.ex(idx, d, rank) + ("" if st == 1 else f" * {st}"))
        return " + ".join(terms)

    @staticmethod
    def _rm_strides(shape) -> list[int]:
        st, acc = [], 1
        for s in reversed(shape):
            st.append(acc)
            acc *= s
        return st[::-1]

    def _staged(self, op: Op, pieces: list[tuple[Val, list[str]]], out: Val, out_idx: list[str], numel: int) -> None:
        """Write ``pieces`` (value, per-dim linear-index exprs) into scratch, read ``out`` back."""
        self.scratch = max(self.scratch, numel)
        rank_out = len(out.pshape)
        self.emit("tl.debug_barrier()  # scratch free: earlier readers are done")
        for v, idx in pieces:
            rank = len(v.pshape)
            masks = [self.mask_dim(v, d) for d in self.padded_dims(v)]
            m = f", mask={' & '.join(masks)}" if masks else ""
            self.emit(f"tl.store(scratch + {' + '.join(idx)}, {self.f32(v)}{m})")
        self.emit("tl.debug_barrier()  # scratch written")
        masks = [self.mask_dim(out, d) for d in self.padded_dims(out)]
        m = f", mask={' & '.join(masks)}, other=0.0" if masks else ""
        self.emit(f"{out.name} = tl.load(scratch + {' + '.join(out_idx)}{m})")

    def _terms(self, idx: list[str], strides: list[int], rank: int) -> list[str]:
        return [self.ex(i, d, rank) + ("" if s == 1 else f" * {s}") for d, (i, s) in enumerate(zip(idx, strides))]

    def op_concat(self, op: Op) -> None:
        t = op.outputs[0]
        dim = op.attrs["dim"]
        out = self.val(t, f32=True, clean=frozenset(range(t.ndim)), finite=True)
        st = self._rm_strides(out.rshape)
        pieces, off = [], 0
        for x in op.inputs:
            v = self.vals[x.id]
            idx = [self.r(p) if d != dim else (f"({self.r(p)} + {off})" if off else self.r(p))
                   for d, p in enumerate(v.pshape)]
            pieces.append((v, self._terms(idx, st, t.ndim)))
            off += v.rshape[dim]
        out_idx = self._terms([self.r(p) for p in out.pshape], st, t.ndim)
        self._staged(op, pieces, out, out_idx, _numel(out.rshape))

    def op_reshape(self, op: Op) -> None:
        t = op.outputs[0]
        x = self.vals[op.inputs[0].id]
        if x.pshape == x.rshape and self.info.padded(t) == self.info.shape(t):
            v = self.val(t, f32=x.f32, clean=frozenset(range(t.ndim)), finite=True)
            self.emit(f"{v.name} = tl.reshape({x.name}, {v.pshape})")
            return
        out = self.val(t, f32=True, clean=frozenset(range(t.ndim)), finite=True)
        pin = self._terms([self.r(p) for p in x.pshape], self._rm_strides(x.rshape), len(x.pshape))
        pout = self._terms([self.r(p) for p in out.pshape], self._rm_strides(out.rshape), t.ndim)
        self._staged(op, [(x, pin)], out, pout, _numel(out.rshape))

    def op_repeat(self, op: Op) -> None:
        t = op.outputs[0]
        x = self.vals[op.inputs[0].id]
        reps = op.attrs["reps"]
        pt = self.info.padded(t)
        if all(r == 1 or x.rshape[d] == 1 for d, r in enumerate(reps)):
            dirty = {d for d, r in enumerate(reps) if r > 1}
            v = self.val(t, f32=x.f32, clean=frozenset(x.clean - dirty), finite=x.finite)
            self.emit(f"{v.name} = tl.broadcast_to({x.name}, {pt})")
            return
        out = self.val(t, f32=True, clean=frozenset(range(t.ndim)), finite=True)
        st = self._rm_strides(x.rshape)
        pin = self._terms([self.r(p) for p in x.pshape], st, len(x.pshape))
        idx = [f"({self.r(p)} % {x.rshape[d]})" if reps[d] > 1 else self.r(p) for d, p in enumerate(out.pshape)]
        pout = self._terms(idx, st, t.ndim)
        self._staged(op, [(x, pin)], out, pout, _numel(x.rshape))

    # -- concat ∘ matmul peephole (pairs found by lower.tiles)
    def split_matmuls(self) -> tuple[dict[int, list], set[int]]:
        """Concats whose only users are split matmuls are never materialized."""
        pairs = {k: v for k, v in self.info.pairs.items() if k in self.info.dot_ops}
        saved = {sv.tensor for sv in self.b.savers}
        dropped = set()
        for op in self.b.ops:
            if op.kind == "concat":
                users = self.consumers[op.outputs[0]]
                if users and all(u.id in pairs for u in users) and op.outputs[0] not in saved:
                    dropped.add(op.id)
        return pairs, dropped

    def dot_only(self, t: Tensor) -> bool:
        """``t`` feeds tensor-core dots only (directly or through a dropped concat)."""
        for c in self.consumers[t]:
            if c.id in self.dropped:
                if not all(self.dot_only_op(u) for u in self.consumers[c.outputs[0]]):
                    return False
            elif not self.dot_only_op(c):
                return False
        return bool(self.consumers[t])

    def dot_only_op(self, op: Op) -> bool:
        return op.kind == "matmul" and op.id in self.info.dot_ops

    def run(self) -> None:
        self.pairs, self.dropped = self.split_matmuls()
        self.dup_loads = (dot_operand_loads(self.b, self.info, frozenset(self.pairs) | self.dropped)
                          if self.cfg.split_loads else {})
        order = self.sched.prologue + [o for o in self.sched.loop if o.kind != "accum"] + \
            self.sched.invariant_accums + [o for o in self.sched.loop if o.kind == "accum"] + self.sched.epilogue
        for op in order:
            self.cur = []
            self.lines[op.id] = self.cur
            if op.id in self.dropped:
                continue
            out = op.outputs[0]
            self.emit(f"# {out.label()} = {_describe(op)}  tile {out.shape}"
                      + (f" (per program {self.info.shape(out)})" if self.info.shape(out) != out.shape else ""))
            # an op of a tl.dot operand's cone reads the cone's own load of a shared tile
            swapped = {tid: self.vals[tid] for tid, (_, ops) in self.dup_loads.items()
                       if op.id in ops and tid in self.vals}
            for tid in swapped:
                self.vals[tid] = self.dup_vals[tid]
            getattr(self, EMITTERS[op.kind])(op)
            self.vals.update(swapped)

    def op_accum(self, op: Op) -> None:
        t = op.outputs[0]
        x = self.vals[op.inputs[0].id]
        v = self.val(t, f32=True, clean=x.clean, finite=x.finite)
        if op in self.sched.invariant_accums:
            n = self.loop_F
            self.emit(f"{v.name} = {self.f32(x)}" + (f" * {float(n)!r}" if n != 1 else ""))
        elif op.inputs[0].op.id in self.info.deferred or op.inputs[0].op.id in self.deferred_sums:
            self.emit(f"{v.name}_k += {x.name}")
        else:
            self.emit(f"{v.name} += {self.f32(x)}")


#: block op -> emitter method (a test asserts it covers the whole catalog)
EMITTERS: dict[str, str] = {
    "iterator": "op_iterator", "accum": "op_accum", "const": "op_const",
    **{k: "op_unary" for k in ("exp", "sqrt", "square", "silu", "scale")},
    **{k: "op_binary" for k in ("add", "sub", "mul", "div")},
    "sum": "op_reduce", "max": "op_reduce", "matmul": "op_matmul",
    "concat": "op_concat", "reshape": "op_reshape", "repeat": "op_repeat",
}


def _numel(s) -> int:
    n = 1
    for x in s:
        n *= x
    return n


def _describe(op: Op) -> str:
    args = ", ".join(t.label() for t in op.inputs)
    attrs = {k: v for k, v in op.attrs.items() if k not in ("source",)}
    if op.kind == "iterator":
        return f"iterator(source {op.attrs['source']}, imap={attrs['imap']}, fmap={attrs['fmap']})"
    extra = "".join(f", {k}={v}" for k, v in attrs.items() if k != "dtype")
    return f"{op.kind}({args}{extra})"


def generate(block: BlockGraph, name: str, sources: list[DevArg], outputs: list[DevArg],
             cfg: KernelConfig | None = None, interpret: bool = False, pdl: bool = False) -> BlockKernel:
    """Triton source and launches for one graph-defined op.

    ``sources``/``outputs`` describe the device tensors (layouts chosen by
    :mod:`lower.layout`); the runtime passes buffers by the names in ``Launch.args``.
    ``pdl``: every kernel starts with ``gdc_wait()`` (the module must import it from
    ``triton.language.extra.cuda``) and is launched with programmatic dependent launch
    (Hopper and later; not in the interpreter): the launch overlaps the previous kernel's
    tail, nothing else changes.
    """
    if pdl and interpret:
        raise ValueError(f"{name}: programmatic dependent launch needs a GPU (the interpreter has no gdc_wait)")
    cfg = cfg or KernelConfig()
    if cfg.split > 1 and (block.forloop % cfg.split or block.forloop == 1):
        raise ValueError(f"{name}: split {cfg.split} must divide forloop {block.forloop}")
    if cfg.chunk > 1 and (block.forloop // max(1, cfg.split)) % cfg.chunk:
        raise ValueError(f"{name}: chunk {cfg.chunk} must divide forloop/split {block.forloop}/{cfg.split}")
    if cfg.combine not in ("kernel", "last"):
        raise ValueError(f"{name}: combine must be 'kernel' or 'last', got {cfg.combine!r}")
    info = analyze(block, dict(cfg.sub), chunk=cfg.chunk, small_mm=cfg.small_mm)
    em = _Emitter(block, name, sources, outputs, cfg, info)
    em.interpret = interpret
    em.run()
    sch = em.sched
    split = cfg.split
    accs_needed = [op for op in sch.loop + sch.invariant_accums if op.kind == "accum"]
    loop_accs = [op for op in sch.loop if op.kind == "accum"]

    axes = [(f"b{AXES[a]}", g) for a, g in enumerate(block.grid) if g > 1]
    axes += [(f"s{c}", r) for c, r in sorted(info.split.items())]
    nprog = _numel([g for _, g in axes])
    src_args = [f"{s.name}_ptr" for s in sources]
    out_args = [f"{o.name}_ptr" for o in outputs]

    def header(fn: str, params: list[str], with_split: bool) -> list[str]:
        h = ["@triton.jit", f"def {fn}({', '.join(params)}):"]
        body = ["pid = tl.program_id(0)"]
        if pdl:
            # launched early (programmatic dependent launch); wait, before touching memory,
            # until the kernel before this one on the stream has finished and its writes show
            body = ["gdc_wait()  # programmatic dependent launch: the previous kernel's writes are visible "
                    "from here"] + body
        rest = "pid"
        dec = axes + ([("split", split)] if with_split else [])
        for i, (v, g) in enumerate(dec):
            if i == len(dec) - 1:
                body.append(f"{v} = {rest}")
            else:
                body.append(f"{v} = {rest} % {g}")
                body.append(f"q{i} = {rest} // {g}")
                rest = f"q{i}"
        return h, body

    def lines_of(ops) -> list[str]:
        out = []
        for op in ops:
            out += em.lines.get(op.id, [])
        return out

    def loop_block(lo: str) -> list[str]:
        body, post = [], []
        for op in loop_accs:
            v = em.vals[op.outputs[0].id]
            x = em.vals[op.inputs[0].id]
            if op.inputs[0].op.id in info.deferred:
                ax = len(x.pshape) - 2
                body.append(f"# {v.name}_k: the un-reduced product {x.pshape} (m, k, n), fp32: no per-step "
                            "reduction over k")
                body.append(f"{v.name}_k = tl.zeros({x.pshape}, dtype=tl.float32)")
                post.append(f"{v.name} = tl.sum({v.name}_k, axis={ax})  # the k-reduction, once")
            elif op.inputs[0].op.id in em.deferred_sums:
                d = em.deferred_sums[op.inputs[0].op.id]
                body.append(f"# {v.name}_k: the un-reduced {x.pshape} tile, fp32: one reduction after the loop")
                body.append(f"{v.name}_k = tl.zeros({x.pshape}, dtype=tl.float32)")
                post.append(f"{v.name} = tl.sum({v.name}_k, axis={d}, keep_dims=True)  # once")
            else:
                body.append(f"{v.name} = tl.zeros({v.pshape}, dtype=tl.float32)")
        loop_ops = [o for o in sch.loop if o.kind != "accum"]
        if block.forloop > 1 and loop_ops:
            hi = f"{lo} + {em.iters}" if lo != "0" else f"{em.iters}"
            if loop_asks_staging(block, info, cfg):
                body.append("# stage every load of this loop num_stages - 1 steps ahead (unasked, Triton stages "
                            "only the loads that feed a tl.dot)")
                body.append(f"for i in tl.range({lo}, {hi}, num_stages={cfg.num_stages}):")
            else:
                body.append(f"for i in range({lo}, {hi}):")
            body += ["    " + ln for ln in lines_of(loop_ops + loop_accs)]
        else:
            body += lines_of(loop_ops + loop_accs)
        return body + post

    def savers() -> list[str]:
        body = []
        for k, sv in enumerate(block.savers):
            v = em.vals[sv.tensor.id]
            o = outputs[k]
            rank = sv.tensor.ndim
            terms, masks = [], []
            for d in range(rank):
                offs = []
                for a in range(3):
                    if sv.omap[a] == d:
                        offs.append(f"b{AXES[a]} * {sv.tensor.shape[d]}")
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

    def part_index(v: Val) -> tuple[str, str]:
        """Index of each element of ``v`` in a compact (real-extent, row-major) partial
        tile, and the mask of its real elements (padding is neither stored nor read)."""
        st = em._rm_strides(v.rshape)
        idx = " + ".join(em._terms([em.r(p) for p in v.pshape], st, len(v.pshape)))
        masks = [em.mask_dim(v, d) for d in em.padded_dims(v)]
        return idx, (" & ".join(masks) if masks else "")

    kernels: list[tuple[list[str], list[str]]] = []
    launches: list[Launch] = []
    buffers: dict[str, int] = {}
    locks: dict[str, int] = {}
    scratch_args = ["scratch_ptr"] if em.scratch else []
    scratch_buf = [f"{name}_scratch"] if em.scratch else []
    if em.scratch:
        buffers[f"{name}_scratch"] = em.scratch * 4 * nprog * split
    const_pro = [o for o in sch.prologue if o.outputs[0].acc is None]
    if split == 1:
        h, body = header(name, src_args + out_args + scratch_args, False)
        if em.scratch:
            body.append(f"scratch = scratch_ptr + pid * {em.scratch}")
        body += lines_of(sch.prologue) + loop_block("0") + lines_of(sch.invariant_accums)
        body += lines_of(sch.epilogue) + savers()
        kernels.append((h, body))
        launches.append(Launch(name, nprog, [s.name for s in sources] + [o.name for o in outputs]
                               + scratch_buf, cfg.num_warps, cfg.num_stages))
    else:
        last = cfg.combine == "last"
        part_args = [f"part{j}_ptr" for j in range(len(accs_needed))]
        part_bufs = [f"{name}_part{j}" for j in range(len(accs_needed))]

        def combine_lines(blk: str, pro: list[str]) -> list[str]:
            body = list(pro)
            body.append(f"# sum the {split} partial accumulators")
            for j, op in enumerate(accs_needed):
                v = em.vals[op.outputs[0].id]
                pn = _numel(v.rshape)
                idx, m = part_index(v)
                mk = f", mask={m}, other=0.0" if m else ""
                cm = ', cache_modifier=".cg"' if last else ""
                body.append(f"{v.name} = tl.zeros({v.pshape}, dtype=tl.float32)")
                # unrolled in the fix-up, so the partials' loads issue together: one L2 round trip
                # at the kernel's tail, not `split` (H100, rms b=8 k4L 21.33 -> 20.99 μs; NOTES v5)
                body.append(f"for k in {'tl.static_range' if last else 'range'}({split}):")
                body.append(f"    {v.name} += tl.load(part{j}_ptr + (k * {nprog} + {blk}) * {pn} + {idx}{mk}{cm})")
            return body + lines_of(sch.epilogue) + savers()

        fn_p = name if last else f"{name}_partial"
        h, body = header(fn_p, src_args + part_args + (["lock_ptr"] + out_args if last else []) + scratch_args,
                         True)
        if em.scratch:
            body.append(f"scratch = scratch_ptr + pid * {em.scratch}")
        body += lines_of(sch.prologue) + loop_block(f"split * {em.iters}") + lines_of(sch.invariant_accums)
        body.append(f"# fp32 partial accumulators of this split" +
                    (" (the last program of this tile sums them)" if last else f", combined by {name}_combine"))
        body.append(f"blk = pid % {nprog}")
        for j, op in enumerate(accs_needed):
            v = em.vals[op.outputs[0].id]
            pn = _numel(v.rshape)
            idx, m = part_index(v)
            mk = f", mask={m}" if m else ""
            body.append(f"tl.store(part{j}_ptr + (split * {nprog} + blk) * {pn} + {idx}, {v.name}{mk})")
            buffers[f"{name}_part{j}"] = split * nprog * pn * 4
        if last:
            locks[f"{name}_lock"] = nprog
            body.append("tl.debug_barrier()  # every thread's partial stores precede the release below")
            body.append("done = tl.atomic_add(lock_ptr + blk, 1, sem=\"acq_rel\")")
            body.append(f"if done == {split - 1}:")
            inner = ["# the last split of this tile: reset its counter for the next run, combine, save",
                     "tl.store(lock_ptr + blk, 0)"] + combine_lines("blk", [])
            body += ["    " + ln for ln in inner]
            kernels.append((h, body))
            launches.append(Launch(name, nprog * split, [s.name for s in sources] + part_bufs + [f"{name}_lock"]
                                   + [o.name for o in outputs] + scratch_buf, cfg.num_warps, cfg.num_stages))
        else:
            kernels.append((h, body))
            launches.append(Launch(f"{name}_partial", nprog * split, [s.name for s in sources] + part_bufs
                                   + scratch_buf, cfg.num_warps, cfg.num_stages))
            h, body = header(f"{name}_combine", part_args + out_args + scratch_args, False)
            if em.scratch:
                body.append(f"scratch = scratch_ptr + pid * {em.scratch}")
            body += combine_lines("pid", lines_of(const_pro))
            kernels.append((h, body))
            launches.append(Launch(f"{name}_combine", nprog, part_bufs + [o.name for o in outputs] + scratch_buf,
                                   4, 1))

    src_lines = [f"# ---- {name}: grid={block.grid} forloop={block.forloop} config={cfg.label()}"]
    for s in sources:
        src_lines.append(f"#   reads  {s.name}: {s.shape} {s.dtype} strides {s.strides}")
    for o in outputs:
        src_lines.append(f"#   writes {o.name}: {o.shape} {o.dtype} strides {o.strides}")
    ar_lines = [f"r{p} = tl.arange(0, {p})" for p in sorted(em.aranges)]
    for h, body in kernels:
        src_lines += h
        src_lines += ["    " + ln for ln in ar_lines + body]
        src_lines.append("")
    for ln in launches:
        ln.pdl = pdl
    return BlockKernel("\n".join(src_lines) + "\n", launches, buffers, info, locks)
