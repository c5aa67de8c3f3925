"""What a search worker does, whatever runs it (this process, a local worker process, a Ray actor).

A worker is set up once from the *shared state* — plain Python data, shipped once per
worker — and then answers *payloads* (plain JSON values), one at a time:

* shared state (:func:`shared_state`): the program (μGraph JSON), the search config
  (JSON), the driver's saturated e-graph exported as tables
  (:meth:`search.egraph.SaturatedEGraph.to_tables`), so no worker runs equality
  saturation again, and the directory of the fingerprint's fixed draws and the
  program's outputs on them (:mod:`verify.shared_draws`), so no worker computes them again;
* ``{"kind": "search", "task": Task JSON, "deadline": wall-clock seconds or None,
  "split": seconds or None}``: run one task of the enumeration
  (:meth:`search.enumerate.Searcher.run_task`) and return its fingerprint matches,
  statistics and, when it ran past ``split`` seconds, the paths of the children it
  left unexplored (``deferred``: new tasks for the driver);
* ``{"kind": "verify", "graph": μGraph JSON}``: fully verify one candidate against the
  program (:meth:`search.check.Checker.verdict`) and return the verdict's JSON.

Deadlines travel as wall-clock times (``time.time()``) because a Ray cluster's nodes
share no monotonic clock; each worker converts one to its own monotonic clock when a
task starts.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from fractions import Fraction
from typing import Any, Optional

from mugraph.core.ir import Program
from mugraph.core.serialize import graph_from_json, graph_to_json
from verify import shared_draws

from . import expr as ex
from .config import SearchConfig
from .egraph import SaturatedEGraph
from .enumerate import Searcher, Task
from .oracle import SubexprOracle

#: oracle counters a task reports as deltas (the rest are properties of the e-graph)
_ORACLE_COUNTERS = ("queries", "cache_hits", "keeps", "prunes", "doubtful_prunes", "z3_calls", "z3_proofs",
                    "seconds")


def shared_state(program: Program, cfg: SearchConfig, searcher: Searcher) -> dict[str, Any]:
    """What every worker receives once: program, config, the oracle's e-graph tables and
    the directory of the shared fingerprint draws (None: each worker draws its own)."""
    draws = shared_draws.directory()
    return {"program": graph_to_json(program), "config": cfg.to_json(),
            "egraph": searcher.oracle.egraph.to_tables(), "draws": None if draws is None else str(draws)}


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def share_cores(workers: int) -> int:
    """Give this worker process its share of the machine's cores, in every thread pool it has.

    Each worker fingerprints complete candidates at full shapes, where torch, the BLAS
    under numpy's float64 matmuls and numba's parallel loops (:mod:`verify.fused`) would
    each run on all cores. Torch's pool in every worker made the 11-op rmsnorm_matmul
    search take 95 s instead of 18 s on 16 workers (16-core Xeon, 2026-11-23). Numba's
    must be sized before numba is imported: asked for fewer threads later, its OpenMP pool
    still has one per core, and they wake and spin at every parallel loop — 16 workers took
    55 s where one took 43 (16-core H200 machine, 2026-11-26); on 2 cores, 2 workers no
    faster than 1 (9 block ops: 13.7 s vs 13.0; sized first, 8.4). Called in process and
    Ray workers only: a serial search runs in the user's process, whose settings it leaves
    alone. Returns the thread count set."""
    threads = max(1, usable_cores() // max(1, workers))
    import torch  # the field and float algebras' arithmetic
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads)  # BLAS and OpenMP pools already loaded, for the life of the process
    if "numba" in sys.modules:  # too late to size its pool: at least use no more of it
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    else:  # read when verify.fused first imports it (verify.fused_loops)
        os.environ["NUMBA_NUM_THREADS"] = str(threads)
    return threads


class WorkerState:
    """A worker's searcher (with its oracle and checker), built once from the shared state."""

    def __init__(self, shared: dict[str, Any] | None = None, searcher: Optional[Searcher] = None) -> None:
        if searcher is None:
            assert shared is not None
            if shared.get("draws") and os.path.isdir(shared["draws"]):  # not on another machine
                shared_draws.use(shared["draws"])
            program = graph_from_json(shared["program"])
            cfg = SearchConfig.from_json(shared["config"])
            searcher = Searcher(program, cfg, oracle=_oracle(program, cfg, shared["egraph"]))
        self.searcher = searcher

    def handle(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Answer one payload (see the module docstring)."""
        if payload["kind"] == "search":
            return self._search(payload["task"], payload.get("deadline"), payload.get("split"))
        if payload["kind"] == "verify":
            v = self.searcher.checker.verdict(graph_from_json(payload["graph"]))
            return {"verdict": None if v is None else v.to_json()}
        raise ValueError(f"unknown payload kind {payload['kind']!r}")

    def _search(self, task_json: list, deadline_wall: Optional[float], split: Optional[float] = None) -> dict[str, Any]:
        s = self.searcher
        s.stats = Counter()
        s.results = []
        before = s.oracle.stats.as_dict()
        deadline = None if deadline_wall is None else time.monotonic() + (deadline_wall - time.time())
        t0 = time.perf_counter()
        s.run_task(task_from_json(task_json), deadline=deadline, split_after=split)
        seconds = round(time.perf_counter() - t0, 4)
        after = s.oracle.stats.as_dict()
        oracle = {k: after[k] - before[k] for k in _ORACLE_COUNTERS}
        timed_out = deadline is not None and time.monotonic() > deadline
        return {"results": s.results, "stats": dict(s.stats), "oracle": {**oracle, "timed_out": timed_out},
                "deferred": [list(p) for p in s.deferred], "seconds": seconds}


def _oracle(program: Program, cfg: SearchConfig, tables: dict) -> SubexprOracle:
    return SubexprOracle(ex.output_exprs(program), z3_timeout_ms=cfg.z3_timeout_ms, enabled=cfg.prune_abstract,
                         egraph=SaturatedEGraph.from_tables(tables))


def task_from_json(task_json: list) -> Task:
    """The inverse of :meth:`Task.to_json` (JSON turned tuples into lists and Fractions into strings)."""
    prefix = tuple(_prefix_op(spec) for spec in task_json[0])
    block = None if task_json[1] is None else (tuple(task_json[1][0]), task_json[1][1])
    kops = task_json[2] if len(task_json) > 2 else None
    path = tuple(task_json[3]) if len(task_json) > 3 and task_json[3] else ()
    return Task(prefix, block, kops, path)


def _prefix_op(spec: list) -> tuple:
    _, kind, inputs, attrs = spec
    attrs = tuple((k, Fraction(v) if k in ("c", "value") else _tuplify(v)) for k, v in attrs)
    return ("op", kind, tuple(inputs), attrs)


def _tuplify(x):
    return tuple(_tuplify(y) for y in x) if isinstance(x, list) else x
