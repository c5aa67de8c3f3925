"""The search driver: ``search.run(program, config) -> SearchResult``.

Phases, each shown on the progress with the time left: *oracle* (saturate the
program's e-graph once, here), *pieces* (compositional search of deep programs),
*search* (the enumeration: the root of the search tree split into serializable
:class:`~search.enumerate.Task` values, run by an executor — :mod:`search.executors`),
*split-loop* (variants of the cheapest matches) and *verify* (full verification of
the cheapest fingerprint matches, also on the executor). The progress
(:mod:`mugraph.core.progress`) is a bar on a terminal; written to a file, a line per
phase and at most one every 10 s.

Structure. A run is a sequence of phases over one state record
(:class:`~search.run_state.RunState`): *prepare* (:mod:`search.prepare`: oracle, tasks,
checkpoint resume, pieces), *enumerate* (:mod:`search.dispatch`), the candidates
(:mod:`search.candidates`: the matches, the split-loop variants), *verify*
(:mod:`search.verification`) and *collect* (the stats, here). A piece search is this same
search nested in the one it serves, handed what it inherits (:class:`~search.run_state.Outer`).

Determinism. Results are merged *in task order* and, within a task, in DFS order,
and verifications are committed in rank order, so the outcome depends neither on
scheduling nor on the executor: the same seed and config searched to completion give
the same graphs with ``serial``, ``processes`` and ``ray``.

Time. ``time_limit`` bounds the whole call: dispatching stops ``verify_reserve``
(at most 30 %) before the end, running tasks stop there cooperatively, and the
verifications left get the reserve. The limit is hard for the worker executors: at
``time_limit`` + :data:`GRACE` seconds every worker still running is terminated, so
``run`` returns within the limit plus a few seconds whatever the workers do.

Failures. A task whose worker dies is retried once, then reported in
``stats["failed_tasks"]`` (with every death in ``stats["worker_failures"]``); a task
that raises is reported at once, never swallowed. Both are printed with the progress
as one line each.

Ctrl-C. The workers are stopped, the checkpoint is saved, the cheapest fingerprint
matches are verified in this process until one passes (a second Ctrl-C skips that),
and the result is returned marked ``stats["interrupted"]``. A checkpoint records
finished tasks; a rerun with the same checkpoint skips them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from mugraph.core.ir import KernelGraph, Program
from mugraph.core.progress import Progress
from mugraph.core.serialize import graph_from_json, graph_to_json
from verify import shared_draws

from .candidates import collect_matches
from .check import Checker
from .config import SearchConfig
from .derive import SeedOrder, seed_order
from .compose import pointwise_runs
from .dispatch import enumerate_units
from .prepare import PieceSearch, prepare
from .records import Found, Match, Proposal
from .run_state import GRACE, Outer, RunState
from .worker import usable_cores
from .verification import (after_warm_up, graph_key, settle_warm_up, split_and_verify, start_warm_up,
                           verify_after_interrupt)

__all__ = ["GRACE", "SearchResult", "run"]


@dataclass
class SearchResult:
    """Verified μGraphs, cheapest first (``.found``: :class:`~search.records.Found`
    records; ``.graphs`` as KernelGraphs) and statistics (``.stats``)."""

    program: str
    found: list[Found] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def graph_json(self) -> list[dict]:
        return [f.graph for f in self.found]

    @property
    def graphs(self) -> list[KernelGraph]:
        return [graph_from_json(f.graph) for f in self.found]

    @property
    def origins(self) -> list[str]:
        """How each graph was found: enumeration, composed(+fused), split-loop."""
        return [f.origin for f in self.found]

    @property
    def verdicts(self) -> list[Optional[dict]]:
        """Each graph's verdict (JSON) against the program; None when not verified."""
        return [f.verdict for f in self.found]

    @property
    def interrupted(self) -> bool:
        """True when Ctrl-C stopped the search (the graphs are the best verified so far)."""
        return bool(self.stats.get("interrupted"))

    @property
    def complete(self) -> bool:
        """True when the whole space was searched (no time limit, failure or Ctrl-C cut it)."""
        return bool(self.stats.get("complete"))

    def to_json(self) -> dict:
        return {"format": "mugraph-search-result", "version": 2, "program": self.program,
                "found": [f.to_json() for f in self.found], "stats": self.stats}

    @classmethod
    def from_json(cls, d: dict) -> "SearchResult":
        return cls(d["program"], [Found.from_json(f) for f in d["found"]], dict(d["stats"]))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SearchResult":
        return cls.from_json(json.loads(Path(path).read_text()))


def run(program: Program, config: Optional[SearchConfig] = None,
        estimate: Optional[Callable[[KernelGraph], float]] = None,
        seeds: Sequence[KernelGraph] = (), checker: Optional[Checker] = None) -> SearchResult:
    """Search μGraphs equivalent to ``program``; see :class:`SearchConfig` for the knobs.

    Returns within ``config.time_limit`` (default 300 s) plus a few seconds, earlier when
    the space is exhausted. Ctrl-C returns the best verified result so far, marked
    ``result.interrupted``.

    ``estimate(graph) -> seconds`` (optional): a finer price than the search's own
    :func:`~search.enumerate.cost_key` — the pipeline passes the lowering's cost model at
    its best predicted configs. It ranks the split-loop variants' shortlist
    (:func:`search.derive.splits`); the search itself never needs it.

    ``seeds``: candidate μGraphs found elsewhere — the pipeline passes the cached winners of
    the same program at other sizes carried to these (:mod:`search.transfer`). Each is a
    proposal like the split and tile variants (origin ``"transfer"``): verified against
    ``program`` from scratch, ranked by its cost with the matches, and a source of split and
    tile variants; none is trusted. The enumeration runs as without them.

    ``checker``: the verifier of ``program`` made ahead (:func:`prepared_checker`), used when it
    serves this search's error bound and seed."""
    return _search(program, config or SearchConfig(), estimate, outer=None, seeds=seeds, checker=checker)


def prepared_checker(program: Program, config: SearchConfig) -> Optional[Checker]:
    """A verifier for a search of ``program`` under ``config`` that starts now, on a thread of
    its own, to prepare the program's side of its verifications — where they run on this
    process's GPU (else None: on a CPU the workers' cores are the ones it would take). Hand it
    to :func:`run` (``checker=``) once what runs meanwhile is done."""
    if not config.verify or not Checker.on_gpu():
        return None
    checker = Checker(program, config.verify_error, config.seed)
    checker.prepare_in_background(max(1, usable_cores() - config.workers))
    return checker


def _search(program: Program, cfg: SearchConfig, estimate: Optional[Callable[[KernelGraph], float]],
            outer: Optional[Outer], seeds: Sequence[KernelGraph] = (), checker: Optional[Checker] = None) -> SearchResult:
    """One search, whole or a piece of one (``outer``: the search it serves): its phases
    in order over one :class:`RunState`. On Ctrl-C (a whole search only: a piece's is its
    outer search's) the workers are stopped, the checkpoint saved, and the cheapest
    matches verified here until one passes. Whatever happens, the executor is stopped,
    the checkpoint saved and the progress closed."""
    state = RunState.start(program, cfg, estimate, outer, checker)
    try:
        state.bar = _progress(state)
        with _shared_draws(state):
            try:
                prepare(state, _piece_search(state))
                _verify_seeds(state, seeds)
                _propose_pointwise_runs(state)
                start_warm_up(state)
                enumerate_units(state)
                matches = collect_matches(state)
                found, vstats = after_warm_up(state, matches, split_and_verify)
            except KeyboardInterrupt:
                if state.nested:
                    raise
                state.interrupted = True
                state.stop_executor()
                state.save()
                matches = collect_matches(state)
                found, vstats = after_warm_up(state, matches, verify_after_interrupt)
            return SearchResult(program.name, *_collect(state, matches, found, vstats))
    finally:
        state.stop_executor()
        settle_warm_up(state)
        state.save()
        if state.bar is not None:
            state.bar.close(counts=state.shown_counts())


def _verify_seeds(state: RunState, seeds: Sequence[KernelGraph]) -> None:
    """The seeds as proposals (origin ``"transfer"``), verified here first, cheapest first,
    until one is proven and while a verification fits in the time (``state.known_verdicts``:
    the verify phase reads them there; a seed not verified here is verified there like any
    proposal, as its time allows); then the proven one's near ties
    (:meth:`~search.derive.SeedOrder.near_ties`), so that the GPU's timing chooses among them.
    Why before the enumeration: a seed is a μGraph proven at other sizes,
    the likeliest winner, and at large sizes one verification costs seconds (a causal
    prompt attention at 2,048 tokens on two cores: 9.6 s), which the verify phase's reserve,
    after the enumeration and the split variants' fingerprints, did not leave it."""
    state.dstats["transfer_seeds"] = len(seeds)
    order = _seed_order(state, seeds)
    proven: Optional[KernelGraph] = None
    took = 0.0
    for i, g in enumerate(order.graphs):
        # until one is proven, and past the first only while the search has time: the rest
        # stay proposals for the verify phase. Why: on a GPU nothing limited them (the first
        # verification always fits there), and an 8k-token prompt's four seeds took 51 s of a
        # 39 s search, leaving its float checks no time (H200)
        if proven is None and (i == 0 or not _late(state)) and state.verify_cost.fits():
            # not a sample of the verify phase's cost: the first verification here also
            # computes the program's side of every test, and a median of it can tell the
            # verify phase that nothing more fits (the suspected reason an H200's seeded 8k
            # decode verified no other candidate; not measured since)
            took, ok = _verify_seed(state, g)
            proven = g if ok else None
        state.derived.append(Proposal(g, "transfer"))
    if proven is None:
        return
    listed = {id(g) for g in order.graphs}  # near_ties hands back the order's own graphs
    for g in order.near_ties(proven, state.clock.t_end, state.dstats):
        # a near tie's verification reuses the program's side of every test, so it costs at
        # most what the proven one's did: started only when that much time is left
        if state.clock.t_end is not None and time.monotonic() + took > state.clock.t_end:
            break
        _verify_seed(state, g)
        state.dstats["transfer_near_ties_verified"] = state.dstats.get("transfer_near_ties_verified", 0) + 1
        if id(g) not in listed:
            state.derived.append(Proposal(g, "transfer"))


def _propose_pointwise_runs(state: RunState) -> None:
    """With ``cfg.pointwise_runs``, a whole search (not a piece of one) proposes the program
    with each run of its element-wise ops as one kernel (:func:`search.compose.pointwise_runs`),
    to be verified with the other candidates."""
    if not state.cfg.pointwise_runs or state.nested:
        return
    g = pointwise_runs(state.program)
    state.dstats["pointwise_runs"] = g is not None
    if g is not None:
        state.derived.append(Proposal(g, "pointwise runs"))


def _late(state: RunState) -> bool:
    """Whether the search's time limit has passed."""
    return state.clock.t_end is not None and time.monotonic() >= state.clock.t_end


def _verify_seed(state: RunState, g: KernelGraph) -> tuple[float, bool]:
    """Verify one seed (or a near tie of one), its verdict kept for the verify phase:
    ``(seconds, proven)`` — the verification's own seconds, not the wait for a preparation
    still running (:meth:`~search.check.Checker.prepare_in_background`)."""
    t0 = time.monotonic()
    v = state.checker.verdict(g)
    waited = time.monotonic() - t0
    took = waited if v is None else min(waited, v.seconds)
    state.dstats["transfer_verify_s"] = round(state.dstats.get("transfer_verify_s", 0.0) + waited, 3)
    state.known_verdicts[graph_key(graph_to_json(g))] = None if v is None else v.to_json()
    proven = bool(v and v.equivalent)
    state.dstats["transfer_verified"] = state.dstats.get("transfer_verified", 0) + proven
    return took, proven


#: the share of the search's time limit spent pricing its seeds and their tile variants
SEED_PRICE_SHARE = 0.1


def _seed_order(state: RunState, seeds: Sequence[KernelGraph]) -> SeedOrder:
    """The order seeds are verified in (:func:`search.derive.seed_order`), pricing for at most
    :data:`SEED_PRICE_SHARE` of the time limit and not past the search's end."""
    limit = state.cfg.time_limit
    end = None if limit is None else time.monotonic() + SEED_PRICE_SHARE * float(limit)
    if state.clock.t_end is not None:
        end = state.clock.t_end if end is None else min(end, state.clock.t_end)
    return seed_order(seeds, state.estimate, end, state.cfg.smem_budget, state.dstats)


def _piece_search(state: RunState) -> PieceSearch:
    """How ``state``'s search searches a piece of its program: an ordinary search, nested —
    it ends by ``state``'s end at the latest and its progress nests in ``state``'s."""
    outer = Outer(state.clock.t_end, state.bar)

    def search_piece(program: Program, cfg: SearchConfig) -> SearchResult:
        return _search(program, cfg, None, outer)
    return search_piece


def _shared_draws(state: RunState) -> contextlib.AbstractContextManager:
    """Where this search's processes share the fingerprint's draws and the program's
    outputs on them (:mod:`verify.shared_draws`): a directory of its own for the whole
    search, piece searches included, when tasks run in worker processes; a search
    nested in another uses the outer one's."""
    if state.cfg.executor == "serial" or shared_draws.directory() is not None:
        return contextlib.nullcontext()
    return shared_draws.temporary()


def _progress(state: RunState) -> Optional[Progress]:
    """The progress (None when ``progress=False``); a piece search's is nested in its
    outer search's, so its plain lines share the outer one's every-10-s budget."""
    if not state.cfg.progress:
        return None
    parent = state.outer.bar if state.outer is not None else None
    return Progress("search" if parent is None else f"search {state.program.name}", unit="task",
                    end=state.clock.t_end, parent=parent)


def _collect(state: RunState, matches: list[Match], found: list[Found],
             vstats: Counter) -> tuple[list[Found], dict[str, Any]]:
    """The collect phase: the verified graphs the caller keeps and the run's stats."""
    cfg = state.cfg
    state.counts.update(vstats)
    if cfg.max_results is not None:
        found = found[:cfg.max_results]
    timed_out = any(d.timed_out for d in state.done.values())
    tasks_done = sum(1 for r in state.done.values() if not r.timed_out)
    cut = _cut_phases(state)
    median = state.verify_cost.median()
    stats = {
        "program": state.program.name,
        "wall_seconds": state.clock.since_start(),
        "executor": cfg.executor, "workers": cfg.workers, "time_limit": cfg.time_limit,
        #: units of work: the root tasks and the pieces split off them (``tasks_done`` counts units)
        "tasks": len(state.units), "root_tasks": len(state.tasks), "tasks_done": tasks_done,
        #: seconds the longest unit took in its worker (what bounds the tail)
        "longest_task_seconds": round(max(state.unit_seconds), 3) if state.unit_seconds else None,
        #: tasks whose results came from the checkpoint
        "tasks_resumed": state.resumed,
        #: the enumeration finished and no later phase stopped at its deadline with work left:
        #: more time (or a resume) would give the same graphs
        "complete": (state.root is not None and tasks_done == len(state.units) and not timed_out
                     and not state.interrupted and not cut),
        #: the phases after the enumeration that stopped at their deadline with work left
        #: (:func:`search.derive.note_cut`; "verify": a match left unverified for time)
        "cut_phases": cut,
        "interrupted": state.interrupted,
        #: tasks whose worker died twice or that raised: [{"task", "spec", "error"}]
        "failed_tasks": state.failed,
        #: every worker lost while holding a task: [{"task", "spec", "error", "retried"}], or
        #: a verification: [{"verify": candidate rank, "error", "retried": False}]
        "worker_failures": state.worker_failures,
        #: tasks still running when the time limit's grace ran out (their workers terminated)
        "tasks_cut": state.tasks_cut,
        "search": dict(sorted(state.counts.items())),
        "search_seconds": round(state.search_seconds, 3),
        "first_match_seconds": state.first_match,
        #: seconds at which every task of an iterative-deepening phase (kernel ops) had finished
        "phase_complete_seconds": dict(sorted(state.phase_done.items())),
        "fingerprint_matches_by_kernels": sorted(Counter(m.kernels for m in matches).items()),
        "fingerprint_matches_by_signature": dict(sorted(Counter(m.signature for m in matches).items())),
        "oracle": _oracle_stats(state),
        "verification": state.checker.method if cfg.verify else "fingerprint only (sub-search)",
        #: median seconds of one full verification in this run (what the budget scaled with)
        "verify_seconds_median": None if median is None else round(median, 3),
        #: seconds of each full verification, in the order they ran
        "verify_seconds": [round(s, 3) for s in state.verify_cost.seconds],
        #: seconds the program's side of the verification took to prepare (GPU: beside the
        #: enumeration); None when none was prepared or it had not finished by the time limit
        "warm_up_seconds": state.warm_up_seconds,
        #: seconds from the start at which each phase began: where a short limit went
        "phase_started": dict(state.phase_started),
        "num_graphs": len(found),
        "derived": state.dstats,
        "kernels": sorted(Counter(sum(1 for op in f.graph["ops"] if op["op"] != "input")
                                  for f in found).items()),
    }
    startup = getattr(state.executor, "startup_seconds", None)
    if startup:
        stats["worker_startup_seconds"] = startup
    return found, stats



def _cut_phases(state: RunState) -> list[str]:
    """The phases whose deadline left work undone (derived proposals, their pricing, the
    verification), in the order they were cut."""
    cut = list(state.dstats.get("cut", []))
    if state.counts.get("verify_skipped_time"):
        cut.append("verify")
    return cut


def _oracle_stats(state: RunState) -> dict[str, Any]:
    """The fingerprint oracle's counts summed over the units (in unit order), and its e-graph's."""
    ostats: Counter = Counter()
    for u in sorted(state.done):
        ostats.update({k: v for k, v in state.done[u].oracle.items()
                       if isinstance(v, (int, float)) and k != "timed_out"})
    o = state.root.oracle if state.root is not None else None
    return {**dict(ostats),
            "saturated": None if o is None else o.saturated,
            "egraph_nodes": None if o is None else o.stats.egraph_nodes,
            "saturation_seconds": None if o is None else round(o.stats.saturation_seconds, 3),
            "distinct_expressions": None if o is None else len(o._cache)}
