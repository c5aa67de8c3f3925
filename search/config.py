"""Search configuration: every knob of DESIGN §5 in one dataclass, so the paper's
ablations (Table 5) are config changes, not code changes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from mugraph.ir import DEFAULT_SMEM_BUDGET


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
    #: the one ``ray.init()`` finds or starts); the choice never changes the result
    workers: int = 2
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
    #: every complete candidate is fingerprinted; of the matches, the cheapest (by
    #: :func:`search.enumerate.cost_key`) are fully verified: up to ``verify_per_kernels``
    #: per kernel count, ``max_verify`` verifications in all (None: verify every match)
    max_verify: Optional[int] = 6
    verify_per_kernels: int = 2
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
    #: piece candidates combined (cheapest combinations first)
    compose_combinations: int = 16
    #: propose split-loop variants (split-K / split-KV) of the cheapest matches
    split_loops: bool = True
    split_sources: int = 2

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "SearchConfig":
        kw = dict(d)
        for k, v in list(kw.items()):
            if isinstance(v, list):
                kw[k] = tuple(v)
        return cls(**kw)

    def key(self) -> dict:
        """The fields that change the search's result (checkpoints must match them)."""
        d = self.to_json()
        for k in ("workers", "executor", "ray_address", "time_limit", "checkpoint", "progress", "verify_reserve"):
            d.pop(k)
        return d


def default_config(**kw) -> SearchConfig:
    return SearchConfig(**kw)


_ = field  # re-exported for callers building configs programmatically
