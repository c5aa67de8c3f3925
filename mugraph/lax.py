"""The Lax-fragment check (paper §5): catalog ops of a Lax class, and at most one
exponentiation (``exp`` or ``silu``) on any path from an input to an output."""

from __future__ import annotations

from .errors import NotLaxError
from .ir import BlockGraph, KernelGraph, Op, Tensor
from .ops import CATALOG, EXP_LIKE

# per tensor: (exps on the worst path to it, that path as op labels)
Info = tuple[int, tuple[str, ...]]


def check_lax(graph: KernelGraph) -> None:
    """Raise :class:`NotLaxError` naming the op and the path if ``graph`` is not Lax."""
    info: dict[Tensor, Info] = {}
    for op in graph.ops:
        if op.kind == "input":
            info[op.outputs[0]] = (0, (op.attrs["name"],))
        elif op.kind == "graph_defined":
            block: BlockGraph = op.attrs["block"]
            outs = _check_block(block, [info[t] for t in block.sources], f"kernel#{op.id}/")
            for t, i in zip(op.outputs, outs):
                info[t] = i
        else:
            info[op.outputs[0]] = _step(op, [info[t] for t in op.inputs], "")


def is_lax(graph: KernelGraph) -> bool:
    try:
        check_lax(graph)
    except NotLaxError:
        return False
    return True


def _check_block(block: BlockGraph, sources: list[Info], prefix: str) -> list[Info]:
    info: dict[Tensor, Info] = {}
    for op in block.ops:
        if op.kind == "iterator":
            info[op.outputs[0]] = sources[op.attrs["source"]]
        elif op.kind == "accum":
            info[op.outputs[0]] = info[op.inputs[0]]
        else:
            info[op.outputs[0]] = _step(op, [info[t] for t in op.inputs], prefix)
    return [info[sv.tensor] for sv in block.savers]


def _step(op: Op, ins: list[Info], prefix: str) -> Info:
    label = prefix + op.label()
    worst = max(ins, key=lambda i: i[0], default=(0, ()))
    path = worst[1] + (label,)
    lax = CATALOG[op.kind].lax
    if lax == "none":
        raise NotLaxError(f"{label}: op {op.kind!r} is outside the Lax fragment (path: {' -> '.join(path)})")
    n = worst[0] + (op.kind in EXP_LIKE)
    if n > 1:
        raise NotLaxError(
            f"{label}: second exponentiation on a path (Lax allows one exp/silu per path): {' -> '.join(path)}")
    return n, path
