"""Search configuration: every knob of docs/design.md §6.14 in one dataclass, so the paper's
ablations (Table 5) are config changes, not code changes."""

from __future__ import annotations

import difflib
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from mugraph.core.errors import ConfigError
from mugraph.core.ir import DEFAULT_SMEM_BUDGET, short
from mugraph.core.ops import CATALOG


def default_workers() -> int:
    """Search workers when the config names none: the cores this process may use
    (its CPU affinity), less one for the driver, which verifies the candidates while the
    workers enumerate (on a 16-core GPU machine: 15). With two cores or fewer, one
    worker per core: the driver mostly waits there, and a single worker would halve the
    enumeration."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 2
    return n if n <= 2 else n - 1


@dataclass
class SearchConfig:
    """Limits and mapping candidates of the μGraph search.

    Op counts: ``max_kernel_ops`` counts kernel ops (pre-defined and graph-defined);
    ``max_block_ops`` counts block ops *including accumulators* but not input
    iterators (fixed by the kernel's inputs) or output savers (fixed by the frontier).
    """

    max_kernel_ops: int = 2
    max_graph_defined: int = 2
    max_block_ops: int = 11
    max_block_inputs: int = 4
    #: tiles a block saves; a program with more outputs gets as many (``Searcher.max_outputs``)
    max_block_outputs: int = 2
    #: op kinds the search may use; None = the program's own kinds (+ ``sum`` at kernel level)
    kernel_ops: Optional[tuple[str, ...]] = None
    block_ops: Optional[tuple[str, ...]] = None
    #: grid axis sizes: each splits a dim into tiles of one of these sizes …
    tile_sizes: tuple[int, ...] = (16, 32, 64, 128, 256)
    #: … or into single rows when the dim is at most this long (a batch/row axis)
    full_split_max: int = 64
    max_grid_axes: int = 2
    min_blocks: int = 1
    max_blocks: int = 4096
    forloop_ranges: tuple[int, ...] = (4, 16, 64)
    smem_budget: int = DEFAULT_SMEM_BUDGET
    #: pruning switches (ablations)
    prune_abstract: bool = True
    prune_labels: bool = True
    thread_graphs: bool = True
    #: oracle
    egraph_max_nodes: int = 2_000_000
    egraph_time_limit: float = 60.0
    z3_timeout_ms: int = 200
    distribute: str = "factor"
    #: driver: ``workers`` tasks at once on ``executor`` — "processes" (local worker
    #: processes), "serial" (in this process) or "ray" (a Ray cluster: ``ray_address``, or
    #: the one ``ray.init()`` finds or starts); the choice never changes the result.
    #: Default: :func:`default_workers` (the usable cores less one for the driver)
    workers: int = field(default_factory=default_workers)
    executor: str = "processes"
    ray_address: Optional[str] = None
    #: seconds for the whole search (it stops earlier when the space is exhausted); None: no limit
    time_limit: Optional[float] = 300.0
    seed: int = 0
    checkpoint: Optional[str] = None
    progress: bool = True
    #: verification of candidates
    verify_error: float = 2.0 ** -40
    max_results: Optional[int] = None
    #: every complete candidate is fingerprinted; the matches are fully verified cheapest
    #: first (by :func:`search.enumerate.cost_key`, round-robin over kernel counts) while a
    #: verification still fits in the time left at its measured cost: up to
    #: ``verify_per_kernels`` passing per kernel count (None: no cap) and ``max_verify``
    #: verifications in all (None: as many as the time allows)
    max_verify: Optional[int] = None
    verify_per_kernels: Optional[int] = 8
    #: seconds of ``time_limit`` held back for verification (at most 30% of it)
    verify_reserve: float = 60.0
    #: search graphs of 1, 2, … kernel ops in turn (each phase reports only its own size)
    iterative_deepening: bool = True
    #: False: skip full verification and return fingerprint matches, cheapest first (for
    #: sub-searches whose results are verified again as part of a whole; never for users)
    verify: bool = True
    #: compositional search (:mod:`search.compose`): programs of more than ``compose_above``
    #: ops are cut into pieces of at most ``piece_ops`` ops, each searched alone
    #: (``compose_share`` of ``time_limit`` in all), composed, and fused
    #: (:func:`search.rewrite.fuse`) into fewer kernels
    compose: bool = True
    compose_above: int = 9
    piece_ops: int = 6
    compose_share: float = 0.5
    #: the share for a program with parallel contractions (``compose.parallel_contractions``:
    #: neither reads the other's result), where the whole program's enumeration finds
    #: nothing: LLaMA-3-8B's RMSNorm with its q and k projections
    #: (H200, 2026-12-03) enumerated none in 8 s after its composition's projections part had
    #: 4.0 s of a 5 s share and found none (one core finds their first kernel at 3.9–4.0 s)
    compose_share_parallel: float = 0.75
    #: piece candidates combined (cheapest combinations first)
    compose_combinations: int = 16
    #: also propose the program with each run of its element-wise ops as one kernel and every
    #: other op as it is (:func:`search.compose.pointwise_runs`), verified like any candidate:
    #: what the search offers where it finds nothing better than the program. ``superoptimize``
    #: sets it when the program itself would run (``OptimizeConfig.time_program``)
    pointwise_runs: bool = False
    #: propose split-loop variants (split-K / split-KV) of the matches; the variants of
    #: every match are ranked by cost and the ``4 * split_sources`` cheapest fingerprinted
    split_loops: bool = True
    split_sources: int = 2
    #: a search task that has run this many seconds hands its unexplored children back to
    #: the driver as new tasks, so idle workers share a large subtree (None: never split);
    #: the result does not depend on it
    split_seconds: Optional[float] = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Types and ranges of every field (:data:`RULES`); lists become tuples."""
        for k, v in check_fields(self.__dict__, "SearchConfig.").items():
            setattr(self, k, v)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "SearchConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"SearchConfig.from_json: expected an object, got {type(d).__name__}")
        check_keys(d, "SearchConfig.from_json: ")
        return cls(**d)

    def key(self) -> dict:
        """The fields that change the search's result (checkpoints must match them)."""
        d = self.to_json()
        for k in ("workers", "executor", "ray_address", "time_limit", "checkpoint", "progress", "verify_reserve",
                  "split_seconds"):
            d.pop(k)
        return d


# --------------------------------------------------------------- validation
# One rule per field: (accepted types, test, what the test asks). Lists are taken for
# tuples (JSON has no tuples); bools are never numbers; a field with no rule here is
# checked where it is used.

def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _int(v) -> bool:
    return type(v) is int


def _ints(v) -> bool:
    return isinstance(v, (tuple, list)) and all(_int(x) and x >= 1 for x in v)


def _ops(v) -> bool:
    return v is None or (isinstance(v, (tuple, list)) and all(isinstance(x, str) and x in CATALOG for x in v))


_POS = (lambda v: _int(v) and v >= 1, "a positive int")
_NONNEG = (lambda v: _int(v) and v >= 0, "an int >= 0")
_OPT_POS = (lambda v: v is None or (_int(v) and v >= 1), "a positive int or None")
_BOOL = (lambda v: isinstance(v, bool), "True or False")
_SECONDS = (lambda v: _num(v) and v > 0, "a number of seconds > 0")
RULES: dict[str, tuple] = {
    **dict.fromkeys(("max_kernel_ops", "max_block_ops", "max_block_inputs", "max_block_outputs", "min_blocks",
                     "max_blocks", "smem_budget", "egraph_max_nodes", "z3_timeout_ms", "workers",
                     "compose_above", "piece_ops", "compose_combinations"), _POS),
    **dict.fromkeys(("max_graph_defined", "full_split_max", "split_sources", "seed"), _NONNEG),
    **dict.fromkeys(("max_results", "max_verify", "verify_per_kernels"), _OPT_POS),
    **dict.fromkeys(("prune_abstract", "prune_labels", "thread_graphs", "progress", "iterative_deepening", "verify",
                     "compose", "split_loops", "pointwise_runs"), _BOOL),
    "max_grid_axes": (lambda v: _int(v) and 1 <= v <= 3, "1, 2 or 3"),
    "tile_sizes": (_ints, "a list of positive ints"),
    "forloop_ranges": (_ints, "a list of positive ints"),
    "kernel_ops": (_ops, "None or a list of catalog op names"),
    "block_ops": (_ops, "None or a list of catalog op names"),
    "egraph_time_limit": _SECONDS,
    "time_limit": (lambda v: v is None or (_num(v) and v > 0), "a number of seconds > 0, or None"),
    "split_seconds": (lambda v: v is None or (_num(v) and v >= 0), "a number of seconds >= 0, or None"),
    "verify_reserve": (lambda v: _num(v) and v >= 0, "a number of seconds >= 0"),
    "compose_share": (lambda v: _num(v) and 0 < v <= 1, "a fraction in (0, 1]"),
    "compose_share_parallel": (lambda v: _num(v) and 0 < v <= 1, "a fraction in (0, 1]"),
    "verify_error": (lambda v: _num(v) and 0 < v < 1, "a probability in (0, 1)"),
    "distribute": (lambda v: v in ("factor", "both"), "'factor' or 'both'"),
    "executor": (lambda v: v in ("processes", "serial", "ray"), "'processes', 'serial' or 'ray'"),
    "ray_address": (lambda v: v is None or (isinstance(v, str) and v != ""), "None or a Ray address such as 'auto'"),
    "checkpoint": (lambda v: v is None or (isinstance(v, (str, os.PathLike)) and str(v) != ""), "a file path or None"),
}


def check_keys(d: dict, prefix: str, exclude: tuple[str, ...] = ()) -> None:
    """Refuse keys that are not fields (a misspelt ``max_blok_ops`` must not be ignored)."""
    names = [f.name for f in fields(SearchConfig) if f.name not in exclude]
    for k in d:
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; fields: {', '.join(names)}"
            raise ConfigError(f"{prefix}unknown key {short(k, 40)}{hint}")


def check_fields(values: dict, prefix: str) -> dict:
    """Check each value against its rule; returns the values with lists made tuples."""
    out = {}
    for k, v in values.items():
        rule = RULES.get(k)
        if rule is not None and not rule[0](v):
            raise ConfigError(f"{prefix}{k}={short(v, 40)}: must be {rule[1]}")
        out[k] = tuple(v) if isinstance(v, list) else v
    if _int(out.get("min_blocks")) and _int(out.get("max_blocks")) and out["min_blocks"] > out["max_blocks"]:
        raise ConfigError(f"{prefix}min_blocks={out['min_blocks']} > max_blocks={out['max_blocks']}")
    return out


_ = field  # re-exported for callers building configs programmatically
