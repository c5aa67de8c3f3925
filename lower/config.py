"""The lowering's free choices for one block graph (:class:`KernelConfig`), and the
error a choice the block cannot take raises (:class:`KernelConfigError`).

A config is plain data: :func:`lower.plan.plan` checks it against a block and turns
it into decisions; the code generator, the cost model and the tuner read those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mugraph.core.checks import _is_sequence, short, strict_int
from mugraph.core.errors import ArgumentTypeError, ConfigError, MugraphError
from mugraph.core.ir import KernelGraph


class KernelConfigError(ConfigError, ValueError):
    """A :class:`KernelConfig` that a block graph cannot take (a split that does not
    divide its loop, an unknown combine mode, a class that cannot be sub-tiled …).
    A ``ValueError`` too, as these were before they had a class of their own."""


#: ``num_warps``: a power of two (Triton's rule) up to 32 warps, 1024 threads, a CUDA block's most
MAX_WARPS = 32
#: ``num_stages``: Triton's software-pipelining depth; more than this never fits shared memory
MAX_STAGES = 16
#: ``split``, ``chunk`` and a sub-tile factor: at most this (a saved result's configs are capped alike,
#: :func:`mugraph.pipeline.results._check_kernel_config`)
MAX_FACTOR = 1024
#: ``fp32_dot``: the ``input_precision`` of a float32 ``tl.dot`` — the word is written into the
#: generated source, so only the precisions Triton names on every supported version pass
FP32_DOTS = ("ieee", "tf32", "tf32x3")
#: ``combine``: how split-K partial accumulators are summed — by a second kernel, or by the
#: last program to finish (:mod:`lower.plan`)
COMBINES = ("kernel", "last")
#: ``small_mm``: how a small matmul (m or n below ``tl.dot``'s 16) is lowered
#: (:data:`lower.tiles.SMALL_MM` describes each mode)
SMALL_MM = ("dot", "v", "va")
#: the label grammar, for messages
LABEL_FORM = "w<warps>s<stages>[c<chunk>][k<split>[L]][p<class>:<r>x…][v|va][r][u][A][F][N], e.g. 'w4s3' or 'w4s3c2k4Lp1:2v'"


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
    ``skip_masked``: loop steps whose band-mask tile hides every key from the program's
    rows are not run where :mod:`lower.skipping` shows they add nothing (a causal
    prompt's upper triangle); ``False`` runs every step (label suffix ``F``).
    ``fold_shifts``: an online softmax whose sums are linear in its exponentials takes them
    against the running maximum itself (:attr:`lower.plan.RunningMax.folded`); ``False``
    keeps the per-step factor ``beta`` (label suffix ``N``) — for measuring the fold.
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
    skip_masked: bool = True
    fold_shifts: bool = True

    def __post_init__(self) -> None:
        """Every field checked at construction — type, then range — so a bad config is one
        line naming the field, the value and what is allowed, here, and not a ``TypeError``
        deep in the planner or a word pasted into generated source. What depends on a block
        (a split that divides its loop, a class that can be sub-tiled) is checked by
        :func:`lower.plan.plan`. Integers may be numpy's; ``sub`` may be lists (JSON's)."""
        set_ = object.__setattr__  # frozen: normalized values are set once, here
        for name in ("num_warps", "num_stages", "split", "chunk"):
            set_(self, name, strict_int(getattr(self, name), f"KernelConfig: {name}"))
        if not (1 <= self.num_warps <= MAX_WARPS and self.num_warps & (self.num_warps - 1) == 0):
            raise KernelConfigError(f"KernelConfig: num_warps={self.num_warps}: must be a power of two from 1 "
                                    f"to {MAX_WARPS}")
        if not 1 <= self.num_stages <= MAX_STAGES:
            raise KernelConfigError(f"KernelConfig: num_stages={self.num_stages}: must be from 1 to {MAX_STAGES}")
        for name in ("split", "chunk"):
            if not 1 <= getattr(self, name) <= MAX_FACTOR:
                raise KernelConfigError(f"KernelConfig: {name}={getattr(self, name)}: must be from 1 to {MAX_FACTOR}")
        set_(self, "sub", _check_sub(self.sub))
        for name, allowed in (("fp32_dot", FP32_DOTS), ("combine", COMBINES), ("small_mm", SMALL_MM)):
            v = getattr(self, name)
            if not isinstance(v, str):
                raise ArgumentTypeError(f"KernelConfig: {name}={short(v)}: must be one of {allowed}, "
                                        f"got {type(v).__name__}")
            if v not in allowed:
                raise KernelConfigError(f"KernelConfig: {name}={short(v)}: must be one of {allowed}")
        for name in ("defer_sums", "split_loads", "stage_all_loads", "skip_masked", "fold_shifts"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ArgumentTypeError(f"KernelConfig: {name}={short(v)}: must be True or False, "
                                        f"got {type(v).__name__}")

    @classmethod
    def from_dict(cls, d: Mapping) -> "KernelConfig":
        """The config ``dataclasses.asdict`` wrote (JSON turns ``sub``'s tuples into lists);
        fields left out keep their defaults, an unknown field is refused by name."""
        if not isinstance(d, Mapping):
            raise ArgumentTypeError(f"KernelConfig.from_dict: expected a dict of fields, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        for k in d:
            if k not in names:
                raise KernelConfigError(f"KernelConfig: unknown field {short(k, 30)}; the fields are {names}")
        return cls(**d)

    @classmethod
    def from_label(cls, label: str) -> "KernelConfig":
        """The config :meth:`label` names (``"w4s3c2k4Lp1:2x3:4va"``); a :class:`KernelConfigError`
        (a ``ValueError``) naming the label and the grammar if it names none."""
        if not isinstance(label, str):
            raise ArgumentTypeError(f"KernelConfig.from_label: expected a label string, got {type(label).__name__}")
        m = re.fullmatch(r"w(\d+)s(\d+)(?:c(\d+))?(?:k(\d+)(L?))?(?:p(\d+:\d+(?:x\d+:\d+)*))?(va|v)?(r)?(u)?(A)?(F)?(N)?",
                         label)
        if not m:
            raise KernelConfigError(f"not a KernelConfig label: {short(label, 40)}; labels read {LABEL_FORM}")
        w, st, c, k, last, sub, mm, r, u, a, f, n = m.groups()
        try:
            return cls(num_warps=int(w), num_stages=int(st), chunk=int(c or 1), split=int(k or 1),
                       combine="last" if last else "kernel", sub=parse_sub(sub or ""), small_mm=mm or "dot",
                       defer_sums=not r, split_loads=not u, stage_all_loads=bool(a), skip_masked=not f,
                       fold_shifts=not n)
        except KernelConfigError as e:
            raise KernelConfigError(f"label {short(label, 40)}: {e}") from None

    @classmethod
    def of(cls, value: Any) -> "KernelConfig":
        """``value`` as a config: a :class:`KernelConfig`, a dict of its fields
        (:meth:`from_dict`) or a label (:meth:`from_label`) — every form a user or a
        saved result holds a config in."""
        if isinstance(value, KernelConfig):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        if isinstance(value, str):
            return cls.from_label(value)
        raise ArgumentTypeError(f"expected a KernelConfig, a dict of its fields or a label such as 'w4s3', "
                                f"got {type(value).__name__} {short(value, 40)}")

    def label(self) -> str:
        s = f"w{self.num_warps}s{self.num_stages}"
        if self.chunk > 1:
            s += f"c{self.chunk}"
        if self.split > 1:
            s += f"k{self.split}" + ("L" if self.combine == "last" else "")
        if self.sub:
            s += "p" + sub_text(self.sub)
        if self.small_mm != "dot":
            s += self.small_mm
        if not self.defer_sums:
            s += "r"
        if not self.split_loads:
            s += "u"
        if self.stage_all_loads:
            s += "A"
        if not self.skip_masked:
            s += "F"
        if not self.fold_shifts:
            s += "N"
        return s


def _check_sub(sub: Any) -> tuple[tuple[int, int], ...]:
    """``KernelConfig.sub`` as a tuple of ``(class id, r)`` int pairs: ids >= 0 and
    distinct (a second pair for one class would be dropped by the planner), ``r`` from
    1 to :data:`MAX_FACTOR`."""
    if not _is_sequence(sub) or not all(_is_sequence(p) and len(p) == 2 for p in sub):
        raise ArgumentTypeError(f"KernelConfig: sub={short(sub)} must be (class id, r) pairs, e.g. ((1, 2),)")
    out = tuple((strict_int(c, "KernelConfig: sub class id"), strict_int(r, "KernelConfig: sub factor"))
                for c, r in sub)
    for c, r in out:
        if c < 0 or not 1 <= r <= MAX_FACTOR:
            raise KernelConfigError(f"KernelConfig: sub pair ({c}, {r}): the class id must be >= 0 and r from 1 "
                                    f"to {MAX_FACTOR}")
    ids = [c for c, _ in out]
    if len(set(ids)) != len(ids):
        raise KernelConfigError(f"KernelConfig: sub={short(out)} names a class twice")
    return out


def configs_for(graph: KernelGraph, configs: Any, where: str) -> dict[int, KernelConfig]:
    """``configs`` checked against ``graph``: a mapping (or ``None``) from the int op id of
    each graph-defined op to its config in any form :meth:`KernelConfig.of` takes. A key
    that is no graph-defined op of ``graph`` is refused, not ignored (a config keyed by the
    op ids of another graph would silently fall back to defaults); an error names the op
    id and the value. ``where`` (``"lower.compile"``) starts each message."""
    if configs is None:
        return {}
    ids = [op.id for op in graph.ops if op.kind == "graph_defined"]
    if not isinstance(configs, Mapping):
        raise ArgumentTypeError(f"{where}: configs must map op ids of graph-defined ops to KernelConfigs, "
                                f"got {type(configs).__name__}")
    out: dict[int, KernelConfig] = {}
    for k, v in configs.items():
        try:
            op_id = strict_int(k, "configs key")
        except ArgumentTypeError as e:
            raise ArgumentTypeError(f"{where}: {e} (keys are op ids of graph-defined ops: {ids})") from None
        if op_id not in ids:
            raise ConfigError(f"{where}: configs[{op_id}]: op {op_id} is not a graph-defined op of "
                              f"{short(graph.name, 40)}; those are {ids}")
        try:
            out[op_id] = KernelConfig.of(v)
        except MugraphError as e:
            raise type(e)(f"{where}: configs[{op_id}]: {e}") from None
    return out


def parse_sub(text: str) -> tuple[tuple[int, int], ...]:
    """``KernelConfig.sub`` from its label form ``"1:2x3:4"`` (``""``: none)."""
    return tuple(tuple(int(x) for x in p.split(":")) for p in text.split("x")) if text else ()


def sub_text(sub: tuple[tuple[int, int], ...]) -> str:
    """``KernelConfig.sub`` in its label form (``"1:2x3:4"``; ``""``: none): :func:`parse_sub` inverted."""
    return "x".join(f"{c}:{r}" for c, r in sub)
