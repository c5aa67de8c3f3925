"""The Lax-fragment check (paper §5): catalog ops of a Lax class, and at most one
exponentiation (an exp-like op of the catalog: ``exp``, ``silu``) on any path from an
input to an output.

The extension (docs/design.md §3.3): an op of class ``shift`` (``max``) is a *free
shift* — the verifier gives its output a fresh value per element, so its result starts
a new path (no exponentiation before it counts), as an input does."""

from __future__ import annotations

from .errors import ArgumentTypeError, NotLaxError
from .ir import KernelGraph, Op, propagate
from .ops import CATALOG

# per tensor: (exps on the worst path to it, that path as op labels)
Info = tuple[int, tuple[str, ...]]


def check_lax(graph: KernelGraph) -> None:
    """Raise :class:`NotLaxError` naming the op and the path if ``graph`` is not Lax."""
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"check_lax: expected a Program or KernelGraph, got {type(graph).__name__}")
    propagate(graph, lambda op: (0, (op.attrs["name"],)),
              lambda op, ins, kernel: _step(op, ins, f"kernel#{kernel.id}/" if kernel else ""))


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
