"""The lowering's free choices for one block graph (:class:`KernelConfig`), and the
error a choice the block cannot take raises (:class:`KernelConfigError`).

A config is plain data: :func:`lower.plan.plan` checks it against a block and turns
it into decisions; the code generator, the cost model and the tuner read those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mugraph.errors import ConfigError


class KernelConfigError(ConfigError, ValueError):
    """A :class:`KernelConfig` that a block graph cannot take (a split that does not
    divide its loop, an unknown combine mode, a class that cannot be sub-tiled …).
    A ``ValueError`` too, as these were before they had a class of their own."""


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
    un-reduced tile and reduces once after the loop (:attr:`lower.plan.KernelPlan.deferred_sums`);
    ``False`` reduces every step (label suffix ``r``). ``split_loads``: a loop tile that
    feeds a ``tl.dot`` operand and other ops is loaded once for each
    (:attr:`lower.plan.KernelPlan.dot_operand_loads`); ``False`` loads it once (label
    suffix ``u``). ``stage_all_loads``: ask Triton to software-pipeline *every* load of
    the loop (``tl.range(…, num_stages=)``); unasked it stages only loads that feed a
    ``tl.dot`` operand, so a loop that also loads a tile for other ops (rmsnorm_matmul's
    X for Σx²) waits for that load every step (:attr:`lower.plan.KernelPlan.unpipelined_loads`;
    H100 rmsnorm_matmul b=8, no split-K, chunk 4: 28.8 → 20.2 μs; label suffix ``A``).
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
