"""Operator scheduling: which phase each block op runs in, and in which order.

A block graph's ops fall into three phases:

* **prologue** — loop-invariant work: iterators without an fmap, constants and
  every op whose inputs are all invariant. It runs once before the loop instead
  of ``F`` times (the Q tile of attention, its RMS norm, …).
* **loop** — the body, everything that depends on an fmapped iterator, and the
  ``acc += x`` updates of the accumulators.
* **epilogue** — everything downstream of an accumulator, then the savers.

Inside a phase ops are ordered by depth (longest path from a phase input; the
paper's §6 rule): ops of equal depth are independent, so a depth-ordered schedule
groups them and needs a barrier only between depth levels — in Triton the compiler
places the barriers, but the order also keeps independent loads next to each other
so they are in flight together.
"""

from __future__ import annotations

from dataclasses import dataclass

from mugraph.core.ir import BlockGraph, KernelGraph, Op


@dataclass
class BlockSchedule:
    prologue: list[Op]
    loop: list[Op]
    epilogue: list[Op]
    invariant_accums: list[Op]   # accumulators of loop-invariant values: acc = F · x (a max: x)


def depths(ops: list[Op]) -> dict[int, int]:
    made = {t.id: op for op in ops for t in op.outputs}
    depth: dict[int, int] = {}
    for op in ops:  # ops are in topological (insertion) order
        depth[op.id] = 1 + max((depth[made[t.id].id] for t in op.inputs if t.id in made), default=-1)
    return depth


def schedule_block(block: BlockGraph) -> BlockSchedule:
    invariant: set[int] = set()  # tensor ids constant across loop iterations
    pro, loop, epi, inv_acc = [], [], [], []
    for op in block.ops:
        out = op.outputs[0]
        if op.kind == "accum":
            # a running max or a rescaled sum is invariant when everything it folds is
            if all(x.id in invariant for x in op.inputs):
                inv_acc.append(op)
            else:
                loop.append(op)
            continue
        if out.acc == 1:
            epi.append(op)
        elif op.kind == "iterator":
            if op.attrs["fmap"] is None or block.forloop == 1:
                invariant.add(out.id)
                pro.append(op)
            else:
                loop.append(op)
        elif all(t.id in invariant for t in op.inputs):  # constants and invariant ops
            invariant.add(out.id)
            pro.append(op)
        else:
            loop.append(op)
    depth = depths(block.ops)

    def order(ops):
        return sorted(ops, key=lambda o: (depth[o.id], o.id))

    return BlockSchedule(order(pro), order(loop), order(epi), inv_acc)


def kernel_order(graph: KernelGraph) -> list[Op]:
    """Kernel-graph ops (inputs excluded) in launch order: by depth, then id."""
    ops = [op for op in graph.ops if op.kind != "input"]
    d = depths(ops)
    return sorted(ops, key=lambda o: (d[o.id], o.id))
