"""The Lax-fragment check (paper §5): catalog ops of a Lax class, and at most one
exponentiation (an exp-like op of the catalog: ``exp``, ``silu``) on any path from an
input to an output.

The extension (docs/design.md §3.3): an op of class ``shift`` (``max``) is a *free
shift* — the verifier gives its output a fresh value per element, so its result starts
a new path (no exponentiation before it counts), as an input does."""

from __future__ import annotations

from .errors import ArgumentTypeError, NotLaxError
from .ir import RESCALED, RUNNING_MAX, BlockGraph, KernelGraph, Op, accum_monoid, propagate
from .ops import CATALOG

# per tensor: (exps on the worst path to it, that path as op labels)
Info = tuple[int, tuple[str, ...]]


def check_lax(graph: KernelGraph) -> None:
    """Raise :class:`NotLaxError` naming the op and the path if ``graph`` is not Lax."""
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"check_lax: expected a Program or KernelGraph, got {type(graph).__name__}")
    propagate(graph, lambda op: (0, (op.attrs["name"],)),
              lambda op, ins, kernel: _step(op, ins, f"kernel#{kernel.id}/" if kernel else ""), _accum_step)


def is_lax(graph: KernelGraph) -> bool:
    try:
        check_lax(graph)
    except NotLaxError:
        return False
    return True


def _step(op: Op, ins: list[Info], prefix: str) -> Info:
    label = prefix + op.label()
    worst = max(ins, key=lambda i: i[0], default=(0, ()))
    path = worst[1] + (label,)
    lax = CATALOG[op.kind].lax
    if lax == "none":
        raise NotLaxError(f"{label}: op {op.kind!r} is outside the Lax fragment (path: {' -> '.join(path)})")
    if lax == "shift":  # a fresh variable to the verifier: nothing before it counts
        return 0, path
    n = worst[0] + CATALOG[op.kind].exp_like
    if n > 1:
        raise NotLaxError(
            f"{label}: second exponentiation on a path (Lax allows one exp/silu per path): {' -> '.join(path)}")
    return n, path


def _accum_step(op: Op, ins: list[Info], block: BlockGraph) -> Info:
    """A sum passes its tile's path on; a running max is a free shift (a fresh variable,
    like ``max``); a rescaled sum multiplies by ``exp(m_i − M)`` — an exponentiation on
    the path from its shift ``m``, which must have none before it."""
    monoid = accum_monoid(op)
    label = f"{op.label()} ({monoid})"
    if monoid == RUNNING_MAX:
        return 0, ins[0][1] + (label,)
    if monoid == RESCALED:
        x, m = ins
        if m[0] + 1 > 1:
            raise NotLaxError(f"{label}: its rescale exp(m − M) is a second exponentiation on the path "
                              f"of its shift: {' -> '.join(m[1] + (label,))}")
        return max(x[0], 1), x[1] + (label,)
    return ins[0]
