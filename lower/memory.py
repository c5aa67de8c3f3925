"""Memory planning: one device workspace for every buffer the lowering owns, and a
shared-memory check per block graph.

Device workspace. Intermediate device tensors (between kernels), split-K partial
accumulators and staging scratch all live in one arena allocated once by the
runtime. Each buffer is live from the launch step that first writes it to the
last step that reads it; buffers whose lifetimes do not overlap share bytes.
Offsets are found greedily (largest buffer first, lowest offset that clashes with
no overlapping buffer), the classic interval-packing heuristic; the result is
checked, not trusted: :func:`plan` asserts no two live buffers overlap.

Shared memory. Triton decides what goes to shared memory, but a μGraph whose
tiles would not fit on the chip is one the profiler should never time; the
estimate is the IR's lifetime-based peak (``BlockGraph.shared_memory_bytes``)
plus the software-pipelining copies of the loop's loads (``num_stages`` − 1
extra copies of every fmapped tile), checked against the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from mugraph.errors import ResourceError
from mugraph.ir import DTYPES, BlockGraph

ALIGN = 256


@dataclass
class Buffer:
    name: str
    nbytes: int
    first: int   # launch step that writes it first
    last: int    # last launch step that reads it


@dataclass
class MemoryPlan:
    offsets: dict[str, int]
    size: int
    naive: int  # bytes without reuse (for the report)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(buffers: list[Buffer]) -> MemoryPlan:
    placed: list[tuple[Buffer, int]] = []
    offsets: dict[str, int] = {}
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.name)):
        size = _align(max(b.nbytes, 1))
        clashes = sorted((o, o + _align(p.nbytes)) for p, o in placed if not (p.last < b.first or b.last < p.first))
        off = 0
        for lo, hi in clashes:
            if off + size <= lo:
                break
            off = max(off, hi)
        offsets[b.name] = off
        placed.append((b, off))
    for i, (a, oa) in enumerate(placed):  # verify
        for c, oc in placed[i + 1:]:
            live = not (a.last < c.first or c.last < a.first)
            if live and oa < oc + c.nbytes and oc < oa + a.nbytes and a.nbytes and c.nbytes:
                raise AssertionError(f"memory plan overlaps {a.name} and {c.name}")
    total = max((o + _align(b.nbytes) for b, o in placed), default=0)
    return MemoryPlan(offsets, total, sum(_align(b.nbytes) for b in buffers))


def shared_memory_estimate(block: BlockGraph, num_stages: int = 1) -> int:
    peak, _ = block.shared_memory_bytes()
    pipelined = sum(t.nbytes for t in block.tensors
                    if t.op.kind == "iterator" and t.op.attrs["fmap"] is not None)
    return peak + max(0, num_stages - 1) * pipelined


def loop_is_pipelined(block: BlockGraph, info, cfg) -> bool:
    """Whether Triton software-pipelines the generated loop of ``block`` (loads issued
    ``num_stages − 1`` steps ahead). Triton (3.6, 3.9) does so unasked only in loops
    with a ``tl.dot``; :mod:`lower.codegen` asks for it (``tl.range(…, num_stages=)``)
    where :func:`lower.codegen.loop_asks_staging` says (``stage_all_loads``, and the
    dot-free loops of the ``"v"``/``"va"`` lowerings) — asked in the attention combine loops it
    measured slower (L2-resident partials; NOTES.md v5). Elsewhere ``num_stages``
    changes nothing. (Which loads of a pipelined loop wait anyway:
    :func:`lower.codegen.unpipelined_loads`.)"""
    from .codegen import loop_asks_staging, loop_has_dot

    if block.forloop <= 1 or cfg.num_stages <= 1:
        return False
    return loop_has_dot(block, info) or loop_asks_staging(block, info, cfg)


def lowered_shared_memory(block: BlockGraph, cfg=None) -> int:
    """Bytes of shared memory the generated kernel of ``block`` is expected to take
    under ``cfg`` (a :class:`lower.codegen.KernelConfig`), at *padded* tile extents.

    :func:`shared_memory_estimate` is the IR's view (real tile sizes); Triton's is
    different: tiles are padded (to 16 on every dim of a ``tl.dot``), and what lands
    in shared memory is (calibrated on sm_90 compiles with Triton 3.9, NOTES.md v3)

    * the software-pipelining buffers of a loop's loads: ``num_stages − 1`` copies of
      every fmapped tile (in its storage dtype) — in loops with a ``tl.dot``, and in
      dot-free loops that the ``"v"``/``"va"`` lowerings pipeline with ``tl.range``;
    * the operands of a ``tl.dot`` outside a pipelined loop (a block without a loop,
      or loop-invariant operands), staged whole at padded size.

    Layout-conversion scratch (a few KB) is not counted.
    """
    from .codegen import KernelConfig
    from .schedule import schedule_block
    from .tiles import analyze

    cfg = cfg or KernelConfig()
    chunk = cfg.chunk if block.forloop > 1 else 1
    info = analyze(block, dict(cfg.sub), chunk=chunk, small_mm=cfg.small_mm)
    sch = schedule_block(block)
    loop = {o.id for o in sch.loop}
    pipelined = loop_is_pipelined(block, info, cfg)

    def padded_bytes(t) -> int:
        n = DTYPES[t.dtype]
        for e in info.padded(t):
            n *= e
        return n

    total = 0
    staged = set()
    if pipelined:
        for op in sch.loop:
            if op.kind == "iterator" and op.attrs["fmap"] is not None:
                total += (cfg.num_stages - 1) * padded_bytes(op.outputs[0])
                staged.add(op.outputs[0].id)
    for op in block.ops:
        if op.kind == "matmul" and op.id in info.dot_ops and not (pipelined and op.id in loop):
            total += sum(padded_bytes(x) for x in op.inputs if x.id not in staged)
    return total


def check_shared_memory(block: BlockGraph, num_stages: int, budget: int, where: str) -> int:
    need = shared_memory_estimate(block, num_stages)
    if need > budget:
        raise ResourceError(f"{where}: needs about {need} bytes of shared memory with num_stages={num_stages} "
                            f"> budget {budget}")
    return need


def nbytes(shape, dtype: str) -> int:
    n = DTYPES[dtype]
    for s in shape:
        n *= s
    return n
