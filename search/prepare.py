"""The prepare phase of a search run (:mod:`search.driver`): the program's e-graph
saturated once (*oracle*), the root of the search tree split into tasks, the units a
checkpoint already holds taken from it, and for deep programs the pieces searched
separately (*pieces*). Fills :class:`~search.run_state.RunState`'s ``root``, ``tasks``,
``units``, ``ckpt`` (with what it resumed) and ``derived``."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from mugraph.core.ir import Program
from mugraph.core.serialize import graph_to_json

from .checkpoint import Checkpoint
from .compose import parallel_contractions
from .config import SearchConfig
from .derive import composed, sequential
from .enumerate import Searcher
from .run_state import RunState
from .units import add_unit, record_unit, unit_key

if TYPE_CHECKING:
    from .driver import SearchResult

#: share of ``time_limit`` the e-graph saturation may take (its own limit applies too)
ORACLE_SHARE = 0.25

#: searches one piece of a deep program (the driver's search, nested in this one)
PieceSearch = Callable[[Program, SearchConfig], "SearchResult"]


def prepare(state: RunState, search_piece: PieceSearch) -> None:
    """Everything before the enumeration: oracle, tasks, resume, then the pieces."""
    build_tasks(state)
    resume(state)
    if state.bar is not None:
        state.bar.reset(total=len(state.units), n=len(state.done))
    search_pieces(state, search_piece)


def build_tasks(state: RunState) -> None:
    """Saturate the program's e-graph (the fingerprint oracle) and split the search tree's
    root into tasks, each a unit of work."""
    cfg = state.cfg
    state.set_phase("oracle")
    ocfg = cfg
    if cfg.time_limit is not None:  # saturation may not eat the whole limit
        ocfg = replace(cfg, egraph_time_limit=min(cfg.egraph_time_limit, ORACLE_SHARE * cfg.time_limit))
    state.root = Searcher(state.program, ocfg, checker=state.checker)
    if cfg.iterative_deepening:
        # phase k: graphs of exactly k kernel ops, so that few-kernel graphs come first;
        # within a phase, tasks starting with a graph-defined op (one mapping each, small)
        # before those starting with a pre-defined op (each holds a whole sub-search)
        state.tasks = [t for k in range(1, cfg.max_kernel_ops + 1)
                       for t in sorted(state.root.root_tasks(k), key=lambda t: t.block is None)]
    else:
        state.tasks = state.root.root_tasks()
    for i in range(len(state.tasks)):
        add_unit(state, i, ())


def resume(state: RunState) -> None:
    """Open the checkpoint, if any, and take the units it finished from it (a resumed
    unit brings back the units it handed back, which may be finished there too)."""
    cfg = state.cfg
    if not cfg.checkpoint:
        return
    state.ckpt = Checkpoint.open(cfg.checkpoint, graph_to_json(state.program), cfg.key())
    u = 0
    while u < len(state.units):  # a resumed unit brings back the units it handed back
        rec = state.ckpt.done.get(unit_key(*state.units[u]))
        if rec is not None:
            state.resumed += 1
            record_unit(state, u, rec["results"], rec["stats"].get("search", {}), rec["stats"].get("oracle", {}),
                        rec.get("deferred", []), save=False)
        u += 1


def search_pieces(state: RunState, search_piece: PieceSearch) -> None:
    """Deep programs: pieces first (a share of the time, a larger one where two contractions
    are parallel and the enumeration finds nothing; 60 s without a limit), then the
    whole-program enumeration. Piece searches stop on their time share, so with a tight
    limit what they propose can depend on the machine's speed (not on scheduling); the
    checkpoint covers the enumeration only — a resumed search redoes the pieces."""
    if not state.cfg.compose:
        return
    state.set_phase("pieces")
    deadline = state.clock.deadline
    share = state.cfg.compose_share_parallel if parallel_contractions(state.program) else state.cfg.compose_share
    budget = 60.0 if deadline is None else share * (deadline - time.monotonic())
    state.derived += composed(state.program, state.cfg, budget, sequential(state.checker), state.dstats,
                              search_piece, deadline, state.estimate)
