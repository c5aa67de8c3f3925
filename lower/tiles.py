"""Tile-dimension analysis of a block graph: which tile dims must share a register
extent, how far each is padded, and which may be split further.

Triton register tensors need power-of-two extents, and ``tl.dot`` needs every
operand dim ≥ 16, but μGraph tiles can be any size (80, 5, 2 …). So every tile
dim is padded, and the padding must agree wherever two tiles meet in one op
(element-wise operands of equal size, a matmul's k on both sides, …). We group
tile dims into *dim classes* with a union-find: two dims join when an op forces
them to be the same axis of the same size. A class gets one padded extent:
the next power of two, raised to 16 when the class feeds ``tl.dot``. A size-1
dim that broadcasts against a larger one is *not* joined (it stays 1 and Triton
broadcasts it), so broadcasting keeps numpy semantics.

Which dims an op joins comes from the catalog (:func:`mugraph.core.ops.dim_map`): the
dims it keeps as the same axis, the axes it contracts, the dims it reduces or whose
elements it moves.

The same classes tell which dims are *parallel*: a class that no op reduces over
(a reduction's dim, a matmul's k), that no rearrangement (concat/reshape/repeat)
moves, and that reaches an output saver can be cut into ``r`` sub-tiles, each run
by its own Triton program. That is the freedom the profiler tunes on top of the μGraph's own grid (a μGraph
fixes its grid; the lowering may refine it along such dims without changing the
function: each output element still depends on exactly the same inputs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, TypeVar
from weakref import WeakKeyDictionary

from mugraph.core.ir import RUNNING_MAX, SUM, BlockGraph, Op, Tensor, accum_monoid
from mugraph.core.ops import adds_up, dim_map, folds, is_contraction, is_pointwise, is_rearrangement, joins
from mugraph.core.unionfind import UnionFind

from .config import SMALL_MM, KernelConfigError

T = TypeVar("T")

DOT_MIN = 16
"""Smallest extent ``tl.dot`` accepts on each of m, n, k."""

# ``SMALL_MM`` (defined with the config's other vocabularies in :mod:`lower.config`): how a *small* matmul (real m or n below :data:`DOT_MIN`, e.g. the M = 2 rows of
# rmsnorm_matmul at b = 1) is lowered (``KernelConfig.small_mm``):
#
# * ``"dot"`` — ``tl.dot`` like every other matmul: m and n are padded to 16, and
#   the A operand (with every element-wise op that makes it) is computed at the
#   padded size, in the dot-operand layout, i.e. once per warp (docs/history/lowering.md, balanced grids);
# * ``"v"`` — a broadcast multiply and ``tl.sum`` over k in fp32 on the CUDA
#   cores, each loop step: tiles keep their power-of-two extents (2 stays 2);
# * ``"va"`` — as ``"v"``, but when the matmul feeds an accumulator directly the
#   un-reduced product ``a[m, k, None] * b[None, k, n]`` is accumulated and summed
#   over k once after the loop (no per-step reduction; ``m·k·n`` fp32 registers,
#   so only offered while that stays under :data:`DEFER_MAX`).
#

CORE_PRODUCT_MAX = 4 * 32 * 256
"""Most fp32 elements the broadcast products ``a[m, k, None] * b[None, k, n]`` of a block's
small matmuls on the CUDA cores (``"v"``/``"va"``, :func:`core_product`: all of them
together, as one loop step holds them) may hold per program for the tuner to try them where
the same tiling runs on ``tl.dot``: 256 values a thread at the first round's 4 warps, the
most registers (255) a thread has. Measured on the H200: the recorded one-row sweeps
(``lower/data/h200_sweeps.jsonl.gz``) reach 32,768 elements and run 0.46–2.8× their ``tl.dot``
twins (the tuner times both); past it the compiler spills. Eight decode rows times LLaMA-3-8B's
projections: its gate·up at 64-column tiles, two products of 32,768 (65,536 together), ran
1,491 μs against 60.4 on ``tl.dot``; products of 131,072 ran 4.4–110× slower (v 23.5 against
5.4 μs, o 80.6 against 11.1, down 275 against 31, gate·up 5,720–6,987 against 64); each such
trial took 2.4–13.9 s of its piece's tuning to compile and time, where one on ``tl.dot`` took
0.1–1.1 s. Where ``tl.dot`` does not fit (its padded tiles pass shared memory) a larger product
is still offered: it runs, slowly — one row times a 2,560-deep loop-free step of 32 columns
(81,920 elements) ran 27.1 μs (H200)."""

DEFER_MAX = 16384
"""Most fp32 elements (64 KB of registers per program) the un-reduced ``"va"``
accumulators of one block may hold."""


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass
class TileInfo:
    """Result of :func:`analyze` for one block graph under one split choice."""

    block: BlockGraph
    cls: dict[tuple[int, int], int]          # (tensor id, dim) -> class id
    size: dict[int, int]                     # class -> real (per-program) size
    ext: dict[int, int]                      # class -> padded register extent
    split: dict[int, int]                    # class -> sub-tile factor r (1: not split)
    dot_ops: set[int] = field(default_factory=set)   # matmul op ids lowered to tl.dot
    deferred: set[int] = field(default_factory=set)  # matmul ids whose un-reduced product is accumulated
    small_mm: str = "dot"                    # how small matmuls are lowered (SMALL_MM)
    chunk: int = 1                           # μGraph loop iterations per generated-loop step
    pairs: dict[int, list] = field(default_factory=dict)  # matmul id -> [(a_i, b_i)] of split concats
    parallel: list[int] = field(default_factory=list)  # splittable classes, stable order

    def key(self, t: Tensor, d: int) -> int:
        return self.cls[(t.id, d)]

    def shape(self, t: Tensor) -> tuple[int, ...]:
        """The per-program (possibly sub-split) real shape of tile ``t``."""
        return tuple(self.size[self.cls[(t.id, d)]] for d in range(t.ndim))

    def padded(self, t: Tensor) -> tuple[int, ...]:
        return tuple(self.ext[self.cls[(t.id, d)]] for d in range(t.ndim))

    def factor(self, t: Tensor, d: int) -> int:
        return self.split.get(self.cls[(t.id, d)], 1)




#: while :func:`shared_analyses` is active: (the results by (what, block id, arguments), the blocks
#: by id — kept with them, so no id is reused while the memo lives)
_SHARED: ContextVar[tuple[dict, dict] | None] = ContextVar("lower_tiles_shared_analyses", default=None)


@dataclass(frozen=True)
class _Refused:
    """What a memo keeps of a KernelConfigError: its message, raised again at every ask."""

    message: str


def recall(memo: dict, key: object, make: Callable[[], T]) -> T:
    """``memo[key]``, made by ``make()`` at the first ask; a KernelConfigError it raised is
    kept too, and raised again at every later ask."""
    hit = memo.get(key)
    if hit is None:
        try:
            hit = make()
        except KernelConfigError as e:
            hit = _Refused(str(e))
        memo[key] = hit
    if isinstance(hit, _Refused):
        raise KernelConfigError(hit.message)
    return hit


def per_frozen_block(store: "WeakKeyDictionary[BlockGraph, dict]", block: BlockGraph, key: object,
                     make: Callable[[], T]) -> T:
    """:func:`recall` in ``store``'s memo of ``block``, kept as long as the block lives (by
    weak reference: what is kept must hold no reference to the block); a block not frozen
    yet may still change, so its answers are made anew."""
    if not block.frozen:
        return make()
    return recall(store.setdefault(block, {}), key, make)


@contextmanager
def shared_analyses() -> Iterator[None]:
    """Within this context the tile analysis (:func:`analyze`) and the plan
    (:func:`lower.plan.plan`) of a frozen block are made once per block and arguments. The
    tuner and the cost model rank hundreds of configurations of one block, which share a few
    (sub-tiles, chunk, small-matmul lowering) — the only arguments an analysis depends on —
    and the same configurations come back in every sweep; making each anew was most of a
    ranking's time (a one-kernel GEMV's 880 configurations: 0.8 s on a CPU). A block
    attached to a kernel is frozen, so nothing made for it can go stale, and neither an
    analysis nor a plan is changed after it is made, so those who share one cannot disturb
    each other. The memo lives as long as the context, so it keeps no block alive after
    it (an analysis refers to its block: a memo by weak reference would keep it for ever);
    nested contexts share the outermost one's."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set(({}, {}))
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared(what: str, block: BlockGraph, args: tuple, make: Callable[[], T]) -> T:
    """``make()``, or what it returned (or raised, a KernelConfigError) for the same ``what``,
    frozen ``block`` and hashable ``args`` within :func:`shared_analyses`."""
    memo = _SHARED.get()
    if memo is None or not block.frozen:
        return make()
    results, blocks = memo
    blocks[id(block)] = block
    return recall(results, (what, id(block), args), make)


def analyze(block: BlockGraph, loop: frozenset[int], split: dict[int, int] | None = None, chunk: int = 1,
            small_mm: str = "dot") -> TileInfo:
    """:func:`_analyze`, made once per block and arguments within :func:`shared_analyses`."""
    return shared("analysis", block, (loop, tuple(sorted((split or {}).items())), chunk, small_mm),
                  lambda: _analyze(block, loop, split, chunk, small_mm))


def _analyze(block: BlockGraph, loop: frozenset[int], split: dict[int, int] | None = None, chunk: int = 1,
             small_mm: str = "dot") -> TileInfo:
    """Group tile dims into classes, pad them, find parallel (splittable) classes.

    ``loop``: the ids of the loop body's ops (:func:`lower.schedule.schedule_block`;
    the ``"va"`` lowering accumulates only loop matmuls un-reduced). ``split`` maps a
    parallel class id (as listed in ``TileInfo.parallel`` of an unsplit analysis —
    class ids are stable for a given graph) to a factor ``r`` dividing its size.
    ``chunk`` re-chunks the loop: one generated-loop step runs ``chunk`` μGraph
    iterations at once, so the class of the fmapped dims is ``chunk`` times larger
    (only where :func:`loop_chunks` allows it). ``small_mm`` (:data:`SMALL_MM`):
    ``"v"``/``"va"`` keep matmuls whose real m or n is below :data:`DOT_MIN` off
    ``tl.dot``, so their dims are not padded to 16. Called by :func:`lower.plan.plan`
    (once per block and config).
    """
    if small_mm not in SMALL_MM:
        raise KernelConfigError(f"small_mm must be one of {SMALL_MM}, got {small_mm!r}")
    cls, fixed, unit, matmuls, pairs = _classes(block)
    size0: dict[int, int] = {}
    for t in block.tensors:
        for d in range(t.ndim):
            size0[cls[(t.id, d)]] = t.shape[d]
    parallel = _parallel(block, cls, size0, fixed)
    split = dict(split or {})
    for c, r in split.items():
        if c not in parallel or size0[c] % r:
            raise KernelConfigError(f"class {c} cannot be split by {r} (parallel: {parallel}, sizes {size0})")
    size = {c: s // split.get(c, 1) for c, s in size0.items()}
    lc = None
    if chunk > 1:
        odd = non_sum_accumulator(block)
        if odd is not None:
            what = "a running max" if accum_monoid(odd) == RUNNING_MAX else "a sum rescaled to a running max"
            raise KernelConfigError(f"the loop cannot be re-chunked by {chunk}: accumulator {odd.outputs[0].label()} "
                                    f"(block op {odd.id}) is {what}, and a chunk's max is not each iteration's")
        lc = _loop_class(block, cls, size0)
        if lc is None or block.forloop % chunk:
            raise KernelConfigError(f"the loop cannot be re-chunked by {chunk} (forloop {block.forloop}, "
                                    f"re-chunkable: {lc is not None})")
        size[lc] *= chunk
    ext = {c: next_pow2(s) for c, s in size.items()}
    info = TileInfo(block, cls, size, ext, {c: r for c, r in split.items() if r > 1}, dot_ops=set(),
                    parallel=parallel, pairs=pairs, chunk=chunk, small_mm=small_mm)
    _pick_dots(info, matmuls, {cls[k] for k in unit})
    if small_mm == "va":
        info.deferred = _deferrable(block, info, matmuls, loop)
    return info


def _classes(block: BlockGraph) -> tuple[dict[tuple[int, int], int], set, set, list, dict[int, list]]:
    """The dim classes of ``block``: (tensor id, dim) -> class id (numbered in order of the
    smallest key of each class), the keys whose class may not be split (rearranged or
    reduced), the size-1 keys whose class must stay of size 1 (:func:`_join`), the matmuls,
    and the split concat-matmul pairs (:func:`_concat_matmuls`)."""
    uf: UnionFind[tuple[int, int]] = UnionFind()
    for t in block.tensors:
        for d in range(t.ndim):
            uf.add((t.id, d))
    fixed: set = set()
    unit: set = set()
    matmuls = [op for op in block.ops if is_contraction(op.kind)]
    for op in block.ops:
        f, u = _join(uf, op)
        fixed |= f
        unit |= u
    pairs = _concat_matmuls(block)
    for pieces in pairs.values():
        for x, y in pieces:
            uf.union((x.id, x.ndim - 1), (y.id, y.ndim - 2))
    roots = {k: uf.find(k) for k in uf}
    ids = {r: i for i, r in enumerate(sorted(set(roots.values())))}
    return {k: ids[r] for k, r in roots.items()}, fixed, unit, matmuls, pairs


def _join(uf: UnionFind, op) -> tuple[set, set]:
    """Join the dims ``op`` forces to be the same axis of the same size; return the keys
    it reduces over or rearranges (their classes cannot be split) and the size-1 keys that
    must stay size 1 — a size-1 dim that broadcasts against a longer one (not joined: an
    element-wise operand, a rescale's per-row shift) or that a rearrangement reads or makes
    (a repeat of a unit dim, a concat, a reshape): padded, they would no longer line up."""
    if op.kind == "iterator":
        return set(), set()
    out = op.outputs[0]
    unit: set = set()
    if op.kind == "accum":
        x = op.inputs[0]
        for d in range(out.ndim):
            uf.union((x.id, d), (out.id, d))
        for m in op.inputs[1:]:  # a rescale's shift: its per-row scale lines up with x's rows
            for d in range(1, m.ndim + 1):
                if m.shape[-d] == x.shape[-d]:
                    uf.union((m.id, m.ndim - d), (x.id, x.ndim - d))
                elif m.shape[-d] == 1:
                    unit.add((m.id, m.ndim - d))
        return set(), unit
    ins = op.inputs
    if is_rearrangement(op.kind):
        unit = {(t.id, d) for t in (*ins, out) for d in range(t.ndim) if t.shape[d] == 1}
    dm = dim_map(op.kind, [t.shape for t in ins], op.attrs, out.shape)
    fixed: set = set()
    for i, dx, do in dm.same:
        if ins[i].shape[dx] == out.shape[do]:
            uf.union((ins[i].id, dx), (out.id, do))
        elif ins[i].shape[dx] == 1:
            unit.add((ins[i].id, dx))
    for group in dm.contracted:
        for i, d in group:
            uf.union((ins[group[0][0]].id, group[0][1]), (ins[i].id, d))
            fixed.add((ins[i].id, d))
    fixed.update((ins[i].id, d) for i, d in dm.reduced + dm.moved_in)
    fixed.update((out.id, d) for d in dm.moved_out)
    return fixed, unit


def _parallel(block: BlockGraph, cls: dict, size0: dict[int, int], fixed: set) -> list[int]:
    """Classes that may be cut into sub-tiles: longer than 1, neither reduced nor
    rearranged, reaching an output saver and fed by an input iterator."""
    bad = {cls[k] for k in fixed}
    saved = {cls[(sv.tensor.id, d)] for sv in block.savers for d in range(sv.tensor.ndim)}
    fed = {cls[(t.id, d)] for t in block.tensors if t.op.kind == "iterator" for d in range(t.ndim)}
    return sorted(c for c in size0 if size0[c] > 1 and c not in bad and c in saved and c in fed)


def _pick_dots(info: TileInfo, matmuls: list, unit: set[int] = frozenset()) -> None:
    """Mark the matmuls lowered to ``tl.dot`` and pad their m, n, k classes to :data:`DOT_MIN`:
    every k above 1, m and n not both 1, an m or n of 1 only where its class may be padded
    (``unit``: the classes that must stay of size 1, :func:`_join`), and — under ``"v"``/``"va"`` — m and n at
    least :data:`DOT_MIN`. One query row per head (a decode attention without grouped heads,
    a GEMV) is a dot padded to 16 rows: on the CUDA cores its loads were not staged (a loop
    without a dot) and a 128-key step of a head-dim-96 attention spilled. Any rank: batch
    dims are flattened into one 3-D dot (:func:`lower.emit.matmul._dot`). Before, a rank-4 tile — a block holding several heads
    of a grouped-query attention, (1, heads, rows, d) — was multiplied on the CUDA cores
    as a broadcast product of (heads, rows, d, keys) values, which spilled: 0.9–7 ms where
    the op-by-op program ran 30–36 μs (decode attention of 2,304 and 8,448 keys, H200)."""
    size, ext = info.size, info.ext
    for op in matmuls:
        mnk = _mnk(info, op)
        if info.small_mm != "dot" and min(size[mnk[0]], size[mnk[1]]) < DOT_MIN:
            continue  # a small matmul: broadcast multiply-and-sum, no padding to 16
        m, n = size[mnk[0]], size[mnk[1]]
        unit_ok = all(size[c] > 1 or c not in unit for c in mnk[:2])
        if all(size[c] > 1 for c in mnk[2:]) and max(m, n) > 1 and unit_ok:
            info.dot_ops.add(op.id)
            for c in mnk:
                ext[c] = max(ext[c], DOT_MIN)


def _mnk(info: TileInfo, op: Op) -> list[int]:
    """The dim classes of matmul ``op``: its m, its n, then every contracted k (one per
    piece of a split concat's product, :func:`_concat_matmuls`)."""
    a, b = op.inputs
    ks = ([info.cls[(x.id, x.ndim - 1)] for x, _ in info.pairs[op.id]] if op.id in info.pairs
          else [info.cls[(a.id, a.ndim - 1)]])
    return [info.cls[(a.id, a.ndim - 2)], info.cls[(b.id, b.ndim - 1)], *ks]


def core_product(info: TileInfo) -> int:
    """fp32 elements of the broadcast products one program of ``info``'s block makes for its
    matmuls on the CUDA cores (not in ``info.dot_ops``), all of them together: batch dims × m ×
    n × k each, at the tiles' unpadded power-of-two extents; 0 when every matmul is a
    ``tl.dot``. Together, because a gated MLP's two products are live in the same loop step."""
    out = 0
    for op in info.block.ops:
        if is_contraction(op.kind) and op.id not in info.dot_ops:
            a = op.inputs[0]
            batch = [info.cls[(a.id, d)] for d in range(a.ndim - 2)]
            out += math.prod(info.ext[c] for c in (*batch, *_mnk(info, op)))
    return out


def _deferrable(block: BlockGraph, info: TileInfo, matmuls: list, loop: frozenset[int]) -> set[int]:
    """Matmuls lowered off ``tl.dot`` whose product may be accumulated un-reduced: in
    the loop body (``loop``: its op ids), the only consumer an accumulator updated every
    step, rank ≤ 3 (the product has rank ≤ 4), and all of them together within
    :data:`DEFER_MAX` elements."""
    if block.forloop <= 1:
        return set()
    cons = block.consumers()
    out, total = set(), 0
    for op in matmuls:
        t = op.outputs[0]
        users = cons.get(t, [])
        if (op.id in info.dot_ops or op.id not in loop or t.ndim > 3 or len(users) != 1
                or not sums_up(users[0], t) or users[0].id not in loop):
            continue
        n = math.prod(info.padded(t)) * info.padded(op.inputs[0])[-1]
        if total + n > DEFER_MAX:
            continue
        total += n
        out.add(op.id)
    return out


def sums_up(acc: Op, t: Tensor) -> bool:
    """Does accumulator ``acc`` add ``t`` up over the loop — a sum, or the summed side of a
    rescaled sum (each step's term times a per-row scale)? Then ``t`` may be accumulated
    un-reduced and reduced once after the loop: a sum over the reduced dim commutes with
    both. Not a running max, and not the shift of a rescale (its values, not their sum,
    are folded)."""
    return (acc.kind == "accum" and accum_monoid(acc) != RUNNING_MAX and acc.inputs[0] is t
            and all(m is not t for m in acc.inputs[1:]))


def non_sum_accumulator(block: BlockGraph) -> Op | None:
    """The first accumulator of ``block`` that is not a plain sum (a running max or a
    rescaled sum), if any: re-chunking the loop would fold a chunk's max, not each
    iteration's."""
    return next((op for op in block.ops if op.kind == "accum" and accum_monoid(op) != SUM), None)


def _loop_class(block: BlockGraph, cls: dict, size0: dict) -> int | None:
    """The dim class ``C`` of the fmapped iterator dims, if the loop can be re-chunked.

    Running ``R`` iterations as one step (tiles ``R`` times longer along ``C``) adds
    ``Σ_j body(slice_j)`` to each accumulator exactly when every op of the body acts
    on the elements of ``C`` independently (element-wise ops; reductions and matmuls
    over other dims), except ops that *sum* over ``C`` (``sum`` along it, a matmul
    contracting it) whose results go straight into accumulators: a sum over the
    ``R``-chunk is the sum of ``R`` per-iteration sums. Anything else (``max`` over
    ``C``, ``C`` reaching an accumulator, concat/reshape/repeat along ``C``, a
    ``C``-sum used by another op) keeps ``R = 1`` — as does a running max or a rescaled
    sum anywhere in the block: a chunk would fold one shift for ``R`` iterations.
    """
    if block.forloop <= 1 or non_sum_accumulator(block) is not None:
        return None
    fm = [(op.outputs[0], op.attrs["fmap"]) for op in block.ops
          if op.kind == "iterator" and op.attrs["fmap"] is not None]
    cs = {cls[(t.id, d)] for t, d in fm}
    if len(cs) != 1:
        return None
    (c,) = cs
    if size0[c] <= 1:
        return None

    def dims_in_c(t: Tensor) -> list[int]:
        return [d for d in range(t.ndim) if cls[(t.id, d)] == c]

    consumers: dict[int, list] = {}
    for op in block.ops:
        for x in op.inputs:
            consumers.setdefault(x.id, []).append(op)
    for op in block.ops:
        out = op.outputs[0]
        if op.kind == "iterator":
            if dims_in_c(out) != ([op.attrs["fmap"]] if op.attrs["fmap"] is not None else []):
                return None               # an invariant tile (or another dim) joined to C: it would repeat
            continue
        ins = [dims_in_c(x) for x in op.inputs]
        if any(len(d) > 1 for d in ins) or len(dims_in_c(out)) > 1:
            return None
        has_in, has_out = any(ins), bool(dims_in_c(out))
        if not has_in:
            continue                      # constants, invariant work, post-loop ops
        if op.kind == "accum":
            return None                   # C reaches an accumulator un-reduced
        if is_rearrangement(op.kind):
            return None
        if has_out:
            if is_pointwise(op.kind) or folds(op.kind):
                continue                  # per element of C (reduction/contraction over another dim)
            return None
        # C is reduced here: only sums (over C itself), feeding accumulators only
        if adds_up(op.kind) and _sums_over(op, dims_in_c):
            if all(u.kind == "accum" for u in consumers.get(out.id, [])):
                continue
        return None
    return c


def _sums_over(op, dims_in_c) -> bool:
    """Every dim of class C among ``op``'s inputs is one it adds up along, and each of its
    contracted axes lies in C on every side or on none."""
    dm = dim_map(op.kind, [t.shape for t in op.inputs], op.attrs, op.outputs[0].shape)
    summed = set(dm.reduced) | {k for g in dm.contracted for k in g}
    inside = {(i, d) for i, t in enumerate(op.inputs) for d in dims_in_c(t)}
    return inside <= summed and all(len({k in inside for k in g}) == 1 for g in dm.contracted)


def loop_chunks(info: TileInfo) -> list[int]:
    """Re-chunk factors the lowering may use for ``info.block`` (1 always); ``info`` is the
    block's unsplit, unchunked analysis (the plan of the default config)."""
    block = info.block
    if info.split or info.chunk != 1:
        raise ValueError("loop_chunks needs the unsplit, unchunked analysis of the block")
    if block.forloop <= 1:
        return [1]
    if _loop_class(block, info.cls, {c: s for c, s in info.size.items()}) is None:
        return [1]
    return [r for r in (1, 2, 4, 8, 16) if block.forloop % r == 0]


def _concat_matmuls(block: BlockGraph) -> dict[int, list]:
    """matmul(concat(a…, dim=-1), concat(b…, dim=-2)) with matching pieces: the
    lowering computes Σᵢ aᵢ @ bᵢ instead (no data movement, every piece a tl.dot)."""
    pairs: dict[int, list] = {}
    for op in block.ops:
        if not is_contraction(op.kind):
            continue
        a, b = op.inputs
        ca, cb = a.op, b.op
        if (joins(ca.kind) and joins(cb.kind) and ca.attrs["dim"] == a.ndim - 1
                and cb.attrs["dim"] == b.ndim - 2 and len(ca.inputs) == len(cb.inputs)
                and all(x.shape[-1] == y.shape[-2] for x, y in zip(ca.inputs, cb.inputs))
                and all(x.shape[-1] > 1 and x.shape[-2] > 1 and y.shape[-1] > 1
                        for x, y in zip(ca.inputs, cb.inputs))):
            pairs[op.id] = list(zip(ca.inputs, cb.inputs))
    return pairs
