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
extra copies of every fmapped tile), checked against the budget
(:func:`check_shared_memory`). :func:`padded_shared_memory` is the estimate at the
padded extents of a kernel plan (what the cost model uses).
"""

from __future__ import annotations

from dataclasses import dataclass

from mugraph.core.errors import ResourceError
from mugraph.core.ir import DTYPES, BlockGraph

from .config import KernelConfig
from .plan import KernelPlan
from .plan import plan as plan_kernel

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


def padded_shared_memory(p: KernelPlan) -> int:
    """Bytes of shared memory the generated kernel of plan ``p`` is expected to take, at
    *padded* tile extents.

    :func:`shared_memory_estimate` is the IR's view (real tile sizes); Triton's is
    different: tiles are padded (to 16 on every dim of a ``tl.dot``), and what lands
    in shared memory is (calibrated on sm_90 compiles with Triton 3.9, docs/history/lowering.md, small-M matmuls)

    * the software-pipelining buffers of a loop's loads: ``num_stages − 1`` copies of
      every fmapped tile (in its storage dtype) — in loops Triton pipelines
      (:attr:`lower.plan.KernelPlan.pipelined`: loops with a ``tl.dot``, and loops the
      code generator asks to stage with ``tl.range``; asked in the attention combine
      loops it measured slower, L2-resident partials, docs/history/lowering.md, rmsnorm_matmul b=8 probed);
    * the operands of a ``tl.dot`` outside a pipelined loop (a block without a loop,
      or loop-invariant operands), staged whole at padded size;
    * the operands of a ``tl.dot`` inside a pipelined loop that are loaded once, before the
      loop (a decode step's query rows), or computed from another ``tl.dot``'s result (the
      exponentials before ``e @ V``) — once each, at padded size: they reach the tensor
      cores through shared memory. An operand computed from the staged loads alone (a
      normalized row, ``x · g``) is converted in registers and takes none (rmsnorm_matmul on
      the H100: the first two terms were exactly what Triton 3.6 allocated).

    The last term was measured on Phi-3-mini's decode attention (one query row per head, 96
    columns, 32 or 64 keys a step; H200, Triton 3.6): the compiled kernels took exactly
    5,120 and 6,144 bytes more than the pipelining buffers at every stage count — the query
    rows padded to 16 × 128 (4,096) and the exponentials padded to 16 rows (1,024 or 2,048).
    Without it the model held six of its programs per SM where the card holds five, and
    priced split-K 22 and 24 (704 and 768 programs) as one wave; they run 1.44× slower than
    split-K 12 (``examples/decode_attention_sweep.py``).
    """
    info = p.info

    def padded_bytes(t) -> int:
        n = DTYPES[t.dtype]
        for e in info.padded(t):
            n *= e
        return n

    total = 0
    staged = set()
    if p.pipelined:
        for t in p.loop_tiles:
            total += (p.config.num_stages - 1) * padded_bytes(t)
            staged.add(t.id)
    def after_dot(t, seen: set[int]) -> bool:
        """``t`` is computed from a ``tl.dot``'s result (walking back to the block's inputs)."""
        if t.id in seen or t.op.kind == "iterator":
            return False
        seen.add(t.id)
        return t.op.id in info.dot_ops or any(after_dot(x, seen) for x in t.op.inputs)

    in_loop: set[int] = set()  # operands counted of the dots in a pipelined loop
    for op in p.block.ops:
        if op.id not in info.dot_ops:
            continue
        if not (p.pipelined and op.id in p.loop_ops):
            total += sum(padded_bytes(x) for x in op.inputs if x.id not in staged)
            continue
        for x in op.inputs:
            invariant = x.op.kind == "iterator" and x.id not in staged
            if x.id not in in_loop and (invariant or after_dot(x, set())):
                total += padded_bytes(x)
                in_loop.add(x.id)
    return total


def lowered_shared_memory(block: BlockGraph, cfg: KernelConfig | None = None) -> int:
    """:func:`padded_shared_memory` of ``block`` planned under ``cfg`` (default config)."""
    return padded_shared_memory(plan_kernel(block, cfg))


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
