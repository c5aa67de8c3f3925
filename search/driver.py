"""The search driver: ``search.run(program, config) -> SearchResult``.

Phases, each shown on the progress with the time left: *oracle* (saturate the
program's e-graph once, here), *pieces* (compositional search of deep programs),
*search* (the enumeration: the root of the search tree split into serializable
:class:`~search.enumerate.Task` values, run by an executor — :mod:`search.executors`),
*split-loop* (variants of the cheapest matches) and *verify* (full verification of
the cheapest fingerprint matches, also on the executor). The progress
(:mod:`mugraph.core.progress`) is a bar on a terminal; written to a file, a line per
phase and at most one every 10 s.

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
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from mugraph.core.errors import ConfigError
from mugraph.core.ir import KernelGraph, Program
from mugraph.core.progress import Progress
from mugraph.core.serialize import graph_from_json, graph_to_json
from verify import shared_draws

from .check import Checker
from .checkpoint import Checkpoint
from .config import SearchConfig
from .derive import MAX_SPLIT_SOURCES, composed, kernel_shape, one_per_shape, sequential, splits
from .enumerate import Searcher, cost_key, signature
from .executors import EXECUTORS, Executor, Outcome, make_executor
from .records import Found, Match, Proposal, TaskDone
from .worker import WorkerState, shared_state, usable_cores

#: seconds past ``time_limit`` after which running workers are terminated
GRACE = 4.0
#: share of ``time_limit`` the e-graph saturation may take (its own limit applies too)
ORACLE_SHARE = 0.25
#: share of the time left that the split-loop phase's fingerprints may take (the rest verifies)
SPLIT_SHARE = 0.25


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
        estimate: Optional[Callable[[KernelGraph], float]] = None) -> SearchResult:
    """Search μGraphs equivalent to ``program``; see :class:`SearchConfig` for the knobs.

    Returns within ``config.time_limit`` (default 300 s) plus a few seconds, earlier when
    the space is exhausted. Ctrl-C returns the best verified result so far, marked
    ``result.interrupted``.

    ``estimate(graph) -> seconds`` (optional): a finer price than the search's own
    :func:`~search.enumerate.cost_key` — the pipeline passes the lowering's cost model at
    its best predicted configs. It ranks the split-loop variants' shortlist
    (:func:`search.derive.splits`); the search itself never needs it."""
    return _Run(program, config or SearchConfig(), estimate).execute()


def _on_threads(threads: int, fn) -> None:
    """``fn()`` with this process's torch, BLAS and OpenMP pools at ``threads`` threads, as
    they were after. The verification warm-up runs while the workers enumerate: at full
    width its pools would take the cores the workers were given (each worker has its share,
    :func:`search.worker.share_cores`); it gets those the workers leave, at least one."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            fn()
    finally:
        torch.set_num_threads(before)


class _Active(threading.local):
    """The searches running in this thread, outermost first (piece searches nest in a whole one)."""

    def __init__(self) -> None:
        self.runs: list[_Run] = []


_ACTIVE = _Active()


class _Run:
    def __init__(self, program: Program, cfg: SearchConfig,
                 estimate: Optional[Callable[[KernelGraph], float]] = None) -> None:
        self.program, self.cfg, self.estimate = program, cfg, estimate
        self.t0 = time.perf_counter()
        now = time.monotonic()
        t_end = None if cfg.time_limit is None else now + cfg.time_limit
        outer = _ACTIVE.runs[-1].t_end if _ACTIVE.runs else None
        if outer is not None:  # a piece search never outlives the search it serves
            t_end = outer if t_end is None else min(t_end, outer)
        self.t_end = t_end
        self.deadline = None if t_end is None else t_end - min(cfg.verify_reserve, 0.3 * (t_end - now))
        self.nested = bool(_ACTIVE.runs)
        if cfg.executor not in EXECUTORS:
            raise ConfigError(f"executor={cfg.executor!r}: use one of {', '.join(EXECUTORS)}")
        self.checker = Checker(program, cfg.verify_error, cfg.seed)
        self.root: Optional[Searcher] = None
        self.tasks: list = []
        #: units of work: (root task index, path below it) — the root tasks, then the pieces
        #: that tasks running past ``split_seconds`` handed back — and their payload JSON
        self.units: list[tuple[int, tuple]] = []
        self.unit_json: list[list] = []
        self._todo: Optional[deque] = None
        #: seconds each finished unit took in its worker
        self.unit_seconds: list[float] = []
        self.done: dict[int, TaskDone] = {}
        self.counts: Counter = Counter()
        self.ckpt: Optional[Checkpoint] = None
        self.executor: Optional[Executor] = None
        self.bar: Optional[Progress] = None
        #: the running verification's counts (verified, verifications), for the progress
        self.vcounts: Counter = Counter()
        self.interrupted = False
        self.derived: list[Proposal] = []
        self.dstats: dict[str, Any] = {}
        self.first_match: Optional[float] = None
        self.phase_done: dict[int, float] = {}
        self.failed: list[dict] = []
        self.worker_failures: list[dict] = []
        self.tasks_cut = 0
        self.resumed = 0
        self.search_seconds = 0.0
        self.last_save = time.monotonic()
        #: seconds each full verification took (dispatch to answer): the measured cost
        self.verify_seconds: list[float] = []
        #: full verifications run in this process (serial search, or a GPU here: _verdicts)
        self.verify_here = cfg.executor == "serial" or self.checker.on_gpu()
        #: the thread preparing the program's side of the verification (GPU only)
        self.warming: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ flow
    def execute(self) -> SearchResult:
        _ACTIVE.runs.append(self)
        try:
            self.bar = self._progress()
            with self._shared_draws():
                try:
                    self._prepare()
                    self._compose()
                    self._warm()
                    self._enumerate()
                    matches = self._matches()
                    found, vstats = self._after_warm_up(matches, self._split_and_verify)
                except KeyboardInterrupt:
                    if self.nested:
                        raise
                    self.interrupted = True
                    self._stop_executor()
                    self._save()
                    matches = self._matches()
                    found, vstats = self._after_warm_up(matches, self._verify_after_interrupt)
                return self._result(matches, found, vstats)
        finally:
            _ACTIVE.runs.pop()
            self._stop_executor()
            self._save()
            if self.bar is not None:
                self.bar.close(counts=self._shown_counts())

    def _shared_draws(self):
        """Where this search's processes share the fingerprint's draws and the program's
        outputs on them (:mod:`verify.shared_draws`): a directory of its own for the whole
        search, piece searches included, when tasks run in worker processes; a search
        nested in another uses the outer one's."""
        if self.cfg.executor == "serial" or shared_draws.directory() is not None:
            return contextlib.nullcontext()
        return shared_draws.temporary()

    def _progress(self) -> Optional[Progress]:
        """The progress (None when ``progress=False``); a piece search's is nested in its
        outer search's, so its plain lines share the outer one's every-10-s budget."""
        if not self.cfg.progress:
            return None
        outer = _ACTIVE.runs[-2].bar if len(_ACTIVE.runs) > 1 else None
        return Progress("search" if outer is None else f"search {self.program.name}", unit="task",
                        end=self.t_end, parent=outer)

    def _set_phase(self, phase: str) -> None:
        if self.bar is not None:
            self.bar.phase(phase, counts=self._shown_counts())

    # --------------------------------------------------------------- prepare
    def _prepare(self) -> None:
        cfg = self.cfg
        self._set_phase("oracle")
        ocfg = cfg
        if cfg.time_limit is not None:  # saturation may not eat the whole limit
            ocfg = replace(cfg, egraph_time_limit=min(cfg.egraph_time_limit, ORACLE_SHARE * cfg.time_limit))
        self.root = Searcher(self.program, ocfg, checker=self.checker)
        if cfg.iterative_deepening:
            # phase k: graphs of exactly k kernel ops, so that few-kernel graphs come first;
            # within a phase, tasks starting with a graph-defined op (one mapping each, small)
            # before those starting with a pre-defined op (each holds a whole sub-search)
            self.tasks = [t for k in range(1, cfg.max_kernel_ops + 1)
                          for t in sorted(self.root.root_tasks(k), key=lambda t: t.block is None)]
        else:
            self.tasks = self.root.root_tasks()
        for i in range(len(self.tasks)):
            self._add_unit(i, ())
        if cfg.checkpoint:
            self.ckpt = Checkpoint.open(cfg.checkpoint, graph_to_json(self.program), cfg.key())
            u = 0
            while u < len(self.units):  # a resumed unit brings back the units it handed back
                rec = self.ckpt.done.get(_unit_key(*self.units[u]))
                if rec is not None:
                    self.resumed += 1
                    self._record(u, rec["results"], rec["stats"].get("search", {}), rec["stats"].get("oracle", {}),
                                 rec.get("deferred", []), save=False)
                u += 1
        if self.bar is not None:
            self.bar.reset(total=len(self.units), n=len(self.done))

    def _add_unit(self, i: int, path: tuple) -> int:
        self.units.append((i, path))
        self.unit_json.append(self.tasks[i].sub(path).to_json())
        return len(self.units) - 1

    def _compose(self) -> None:
        if not self.cfg.compose:
            return
        # deep programs: pieces first (a share of the time; 60 s without a limit), then the
        # whole-program enumeration. Piece searches stop on their time share, so with a tight
        # limit what they propose can depend on the machine's speed (not on scheduling);
        # the checkpoint covers the enumeration only — a resumed search redoes the pieces.
        self._set_phase("pieces")
        budget = 60.0 if self.deadline is None else self.cfg.compose_share * (self.deadline - time.monotonic())
        self.derived += composed(self.program, self.cfg, budget, sequential(self.checker), self.dstats, run,
                                 self.deadline, self.estimate)

    # ----------------------------------------------------------- warm-up
    def _warm(self) -> None:
        """With a GPU (verifications run in this process), prepare the program's side of
        every field test and of the float check while the workers enumerate: this process
        only waits on them then, and the first verification would otherwise pay for it
        (a decode attention on an H200 machine: 20 s of a 60 s search's 16 s left)."""
        if not self.cfg.verify or self.cfg.executor == "serial" or not self.verify_here:
            return
        # Checker.verdict turns any failure into a warning and no verdict: a failed
        # warm-up costs only the time it took
        spare = max(1, usable_cores() - self.cfg.workers)
        self.warming = threading.Thread(target=_on_threads, args=(spare, self.checker.warm),
                                        name="mugraph-verify-warm-up", daemon=True)
        self.warming.start()

    def _split_and_verify(self, matches: list[Match]) -> tuple[list[Found], Counter]:
        self._split(matches)
        return self._verify(matches)

    def _after_warm_up(self, matches: list[Match], then) -> tuple[list[Found], Counter]:
        """``then(matches)`` once the warm-up is done; no verification when it is not by
        the time limit (the matches are counted as skipped)."""
        if not self._warmed():
            return [], Counter({"verify_skipped_warm_up": len(matches)})
        return then(matches)

    def _warmed(self) -> bool:
        """Wait for the warm-up, which holds the checker the split phase and the
        verification use, at most until the time limit (in short waits, so Ctrl-C still
        interrupts). False when it is still running then: there is no time left to verify
        anyway, and the thread finishes on its own (a daemon, it holds nothing else)."""
        t = self.warming
        while t is not None and t.is_alive():
            if self.t_end is not None and time.monotonic() > self.t_end:
                return False
            t.join(0.5)
        self.warming = None
        return True

    # ------------------------------------------------------------- enumerate
    def _executor(self) -> Executor:
        if self.executor is None:
            cfg = self.cfg
            assert self.root is not None
            ex = make_executor(cfg.executor, cfg.workers, ray_address=cfg.ray_address,
                               state=WorkerState(searcher=self.root))
            if cfg.executor != "serial":  # once here, not once per worker (verify.shared_draws)
                self.checker.prepare_fingerprints()
            ex.start(shared_state(self.program, cfg, self.root))
            self.executor = ex
        return self.executor

    def _stop_executor(self) -> None:
        if self.executor is not None:
            ex, self.executor = self.executor, None
            ex.close()

    def _enumerate(self) -> None:
        t_start = time.perf_counter()
        todo = deque(u for u in range(len(self.units)) if u not in self.done)
        self._todo = todo
        self._phase_left = Counter((self.tasks[self.units[u][0]].kops or 0) for u in todo)
        self._set_phase("search")
        attempts: Counter = Counter()
        try:
            while todo or (self.executor is not None and self.executor.busy()):
                open_ = self.deadline is None or time.monotonic() <= self.deadline
                if not open_ and self.executor is None:
                    break
                ex = self._executor()
                if not open_:  # no more dispatch: collect what runs, until the deadline's grace is over
                    if not ex.busy():
                        break
                    if self._past(self.deadline, GRACE):
                        self.tasks_cut += len(ex.busy())
                        self._stop_executor()
                        break
                while open_ and todo and ex.idle() > 0:
                    i = todo.popleft()
                    attempts[i] += 1
                    ex.submit(i, {"kind": "search", "task": self.unit_json[i], "deadline": self._wall(self.deadline),
                                  "split": self.cfg.split_seconds})
                for out in ex.wait(self._tick()):
                    self._search_outcome(out, attempts, todo if open_ else None)
                self._refresh()
        finally:
            self.search_seconds = time.perf_counter() - t_start

    def _search_outcome(self, out: Outcome, attempts: Counter, todo: Optional[deque]) -> None:
        i = out.index
        if out.value is not None:
            v = out.value
            if "seconds" in v:
                self.unit_seconds.append(v["seconds"])
            self._record(i, v["results"], v["stats"], v["oracle"], v.get("deferred", []))
            return
        spec = _describe(self.unit_json[i])
        if out.died:
            retry = attempts[i] < 2 and todo is not None
            self.worker_failures.append({"task": i, "spec": spec, "error": out.error, "retried": retry})
            if retry:
                todo.appendleft(i)
                self._note(f"task {i} ({spec}): {out.error}; retrying it")
                return
        self.failed.append({"task": i, "spec": spec, "error": out.error})
        self._note(f"task {i} ({spec}) failed: {out.error}")

    def _record(self, u: int, res: list, st: dict, ost: dict, deferred: list, save: bool = True) -> None:
        """Unit ``u`` finished: keep its answer and queue the units it handed back (a unit
        stopped by the deadline is incomplete: it is redone on resume, its pieces dropped)."""
        self.done[u] = TaskDone(res, st, ost)
        self.counts.update(st)
        i, _ = self.units[u]
        ph = self.tasks[i].kops or 0
        new: list[int] = []
        if not ost.get("timed_out"):
            new = [self._add_unit(i, tuple(p)) for p in sorted(deferred, key=len)]
            if save and new and self._todo is not None:
                self._todo.extendleft(reversed(new))  # shallowest (likely largest) first
                self._phase_left[ph] += len(new)
        if res and self.first_match is None and save:
            self.first_match = round(time.perf_counter() - self.t0, 3)
        if not ost.get("timed_out") and save:
            self._phase_left[ph] -= 1
            if self._phase_left[ph] == 0:
                self.phase_done[ph] = round(time.perf_counter() - self.t0, 3)
            if self.ckpt:
                self.ckpt.record(_unit_key(*self.units[u]), res, {"search": st, "oracle": ost}, deferred)
                if time.monotonic() - self.last_save > 2.0:
                    self._save()
        if self.bar is not None and (new or save):
            self.bar.update(1 if save else 0, total=len(self.units))

    def _save(self) -> None:
        if self.ckpt:
            self.ckpt.save()
            self.last_save = time.monotonic()

    # ------------------------------------------------------------- candidates
    def _matches(self) -> list[Match]:
        # in DFS order whatever the splitting: by root task, then by the path of the node
        # that found it (a node's own results before its children's)
        found = sorted(((self.units[u][0], tuple(m.get("path", ())), u, j), m)
                       for u, d in self.done.items() for j, m in enumerate(d.results))
        matches: list[Match] = [Match(tuple(m["cost"]), n, 0, m["graph"], m.get("sig", ""), "enumeration")
                                for n, (_, m) in enumerate(found)]
        for p in self.derived:  # derived graphs rank after every task's matches
            self._propose(matches, p)
        return matches

    def _propose(self, matches: list[Match], p: Proposal) -> None:
        matches.append(Match(tuple(cost_key(p.graph)), _DERIVED + len(matches), 0, graph_to_json(p.graph),
                             signature(p.graph), p.origin))

    def _split(self, matches: list[Match]) -> None:
        if not self.cfg.split_loops:
            return
        self._set_phase("split-loop")
        # every match may be split (a one-block-per-head kernel ranks low alone, yet splits
        # best); derive.splits ranks the variants and fingerprints 4 per split_sources
        top = sorted(range(len(matches)), key=lambda k: matches[k].key)[:MAX_SPLIT_SOURCES]
        srcs = [graph_from_json(matches[k].graph) for k in top]
        # fingerprints take seconds each at full shapes, a verification about ten times one
        # (qknorm_gqa b=8 on two cores: 2.9 s and 37 s, 30 field tests): at most a quarter of
        # what is left, so the verification, which every proposal needs, keeps room for one
        end = None if self.t_end is None else time.monotonic() + max(0.0, self.t_end - time.monotonic()) * SPLIT_SHARE
        best: dict[int, float] = {}
        proposals = splits(srcs, sequential(self.checker), self.dstats, end, limit=4 * self.cfg.split_sources, best=best,
                           estimate=self.estimate)
        # the lowering splits a kernel's loop itself (split-K, its partials summed by the last
        # block of each tile, no second launch): a kernel of few blocks and a long loop is worth
        # what its best split is, and verified in that rank (decode_h32 on two cores: the
        # lowering's best, 16 blocks looping 16 times, 7.3 μs, ranked behind split pairs of
        # 10.3 and was never verified)
        for i, est in best.items():
            m = matches[top[i]]
            if est < m.cost[1]:
                matches[top[i]] = replace(m, cost=(m.cost[0], est, *m.cost[2:]))
        self.dstats["split_credited"] = len(best)
        for p in proposals:
            self._propose(matches, p)

    # ----------------------------------------------------------------- verify
    def _verify(self, matches: list[Match]) -> tuple[list[Found], Counter]:
        if not self.cfg.verify:
            # a sub-search's matches (a piece of a composition): cheapest first, but one per
            # kernel shape (grids and loop lengths) before a second spelling of any, so that
            # the few the caller keeps (max_results) offer the grids its fusion needs — the
            # cheapest few alone can all be one shape, or all loop, and fuse with nothing
            ranked = sorted(matches, key=lambda m: m.key)
            first, rest = one_per_shape(ranked, key=lambda m: kernel_shape(graph_from_json(m.graph)))
            return [Found(m.graph, m.origin) for m in first + rest], Counter()
        self._set_phase("verify")
        return _verify_best(_order(matches), self.cfg, len(matches), self._verdicts(), seen=self._verdict_seen)

    def _verify_after_interrupt(self, matches: list[Match]) -> tuple[list[Found], Counter]:
        """After Ctrl-C: the cheapest matches, in this process, until one passes (Ctrl-C again: none)."""
        if not self.cfg.verify:
            return [], Counter()
        self._set_phase("verify (interrupted)")
        try:
            return _verify_best(_order(matches), self.cfg, len(matches), _LocalVerdicts(self), stop_after=1,
                                seen=self._verdict_seen)
        except KeyboardInterrupt:
            return [], Counter({"verify_skipped_interrupt": 1})

    def _verdicts(self) -> "_LocalVerdicts | _ExecutorVerdicts":
        # With a GPU, verifications run here, one after another: the GPU is one device
        # whatever the number of workers, this process's Reference already holds the
        # program's side of every test, and a worker would first start a CUDA context and
        # compute that side again. On the workers, 16 at once on an H200 machine, qknorm_gqa
        # b=8 and two decode attentions finished no verification in the 14–17 s a 60 s
        # search left them (2026-11-26); here one takes about 2 s.
        return _LocalVerdicts(self) if self.verify_here else _ExecutorVerdicts(self)

    # ---------------------------------------------------------------- result
    def _result(self, matches: list[Match], found: list[Found], vstats: Counter) -> SearchResult:
        cfg = self.cfg
        self.counts.update(vstats)
        if cfg.max_results is not None:
            found = found[:cfg.max_results]
        ostats: Counter = Counter()
        timed_out = False
        for u in sorted(self.done):
            ostats.update({k: v for k, v in self.done[u].oracle.items()
                           if isinstance(v, (int, float)) and k != "timed_out"})
            timed_out |= self.done[u].timed_out
        tasks_done = sum(1 for r in self.done.values() if not r.timed_out)
        o = self.root.oracle if self.root is not None else None
        stats = {
            "program": self.program.name,
            "wall_seconds": round(time.perf_counter() - self.t0, 3),
            "executor": cfg.executor, "workers": cfg.workers, "time_limit": cfg.time_limit,
            #: units of work: the root tasks and the pieces split off them (``tasks_done`` counts units)
            "tasks": len(self.units), "root_tasks": len(self.tasks), "tasks_done": tasks_done,
            #: seconds the longest unit took in its worker (what bounds the tail)
            "longest_task_seconds": round(max(self.unit_seconds), 3) if self.unit_seconds else None,
            #: tasks whose results came from the checkpoint
            "tasks_resumed": self.resumed,
            "complete": (self.root is not None and tasks_done == len(self.units) and not timed_out
                         and not self.interrupted),
            "interrupted": self.interrupted,
            #: tasks whose worker died twice or that raised: [{"task", "spec", "error"}]
            "failed_tasks": self.failed,
            #: every worker lost while holding a task: [{"task", "spec", "error", "retried"}], or
            #: a verification: [{"verify": candidate rank, "error", "retried": False}]
            "worker_failures": self.worker_failures,
            #: tasks still running when the time limit's grace ran out (their workers terminated)
            "tasks_cut": self.tasks_cut,
            "search": dict(sorted(self.counts.items())),
            "search_seconds": round(self.search_seconds, 3),
            "first_match_seconds": self.first_match,
            #: seconds at which every task of an iterative-deepening phase (kernel ops) had finished
            "phase_complete_seconds": dict(sorted(self.phase_done.items())),
            "fingerprint_matches_by_kernels": sorted(Counter(m.kernels for m in matches).items()),
            "fingerprint_matches_by_signature": dict(sorted(Counter(m.signature for m in matches).items())),
            "oracle": {**dict(ostats),
                       "saturated": None if o is None else o.saturated,
                       "egraph_nodes": None if o is None else o.stats.egraph_nodes,
                       "saturation_seconds": None if o is None else round(o.stats.saturation_seconds, 3),
                       "distinct_expressions": None if o is None else len(o._cache)},
            "verification": self.checker.method if cfg.verify else "fingerprint only (sub-search)",
            #: median seconds of one full verification in this run (what the budget scaled with)
            "verify_seconds_median": (round(sorted(self.verify_seconds)[len(self.verify_seconds) // 2], 3)
                                      if self.verify_seconds else None),
            "num_graphs": len(found),
            "derived": self.dstats,
            "kernels": sorted(Counter(sum(1 for op in f.graph["ops"] if op["op"] != "input")
                                      for f in found).items()),
        }
        startup = getattr(self.executor, "startup_seconds", None)
        if startup:
            stats["worker_startup_seconds"] = startup
        return SearchResult(self.program.name, found, stats)

    # ------------------------------------------------------------------ misc
    def _past(self, t: Optional[float], extra: float) -> bool:
        return t is not None and time.monotonic() > t + extra

    def _verify_fits(self) -> bool:
        """Whether a verification started now ends before the time limit, at the median
        cost measured so far (before the first answer: whether any time is left)."""
        if self.t_end is None:
            return True
        cost = sorted(self.verify_seconds)[len(self.verify_seconds) // 2] if self.verify_seconds else 0.0
        return time.monotonic() + cost <= self.t_end

    def _tick(self) -> float:
        """How long one wait may block: short, so the bar's clock and the deadlines stay live."""
        return 0.5

    @staticmethod
    def _wall(t: Optional[float]) -> Optional[float]:
        return None if t is None else time.time() + (t - time.monotonic())

    def _note(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)

    def _verdict_seen(self, st: Counter) -> None:
        """One more verdict committed (``st``: the verification's counts so far)."""
        self.vcounts = Counter(st)
        self._refresh()

    def _shown_counts(self) -> dict[str, int]:
        """What the progress shows besides the tasks: states, candidates, fingerprint
        matches, and once there are any, verified graphs, failed tasks, lost workers."""
        c = self.counts
        post = {"states": c["block_states"] + c["kernel_states"], "cand": c["candidates"],
                "matches": c["fingerprint_matches"]}
        if self.vcounts["verifications"]:
            post["verified"] = self.vcounts["verified"]
        if self.failed:
            post["failed"] = len(self.failed)
        if self.worker_failures:
            post["lost_workers"] = len(self.worker_failures)
        return post

    def _refresh(self) -> None:
        """Show the counts now (a plain line only when one is due: :mod:`mugraph.core.progress`)."""
        if self.bar is not None:
            self.bar.update(counts=self._shown_counts())


#: derived graphs rank after every enumerated match
_DERIVED = 1 << 40


def _unit_key(i: int, path: tuple) -> str:
    """A unit's name in the checkpoint: ``"7"`` for root task 7, ``"7:3.-1073741824.0"`` below it."""
    return str(i) if not path else f"{i}:" + ".".join(str(k) for k in path)


def _describe(task_json: list) -> str:
    """A short text of a task for messages: its first kernel op or block start."""
    prefix, block, kops = (task_json + [None])[:3]
    what = ",".join(op[1] for op in prefix) if prefix else ""
    if block is not None:
        what += (" + " if what else "") + f"block{tuple(block[0])}#{block[1]}"
    if len(task_json) > 3 and task_json[3]:
        what += f" @{'.'.join(str(k) for k in task_json[3])}"
    return f"{what or 'root'} (≤{kops} kernels)" if kops else (what or "root")


def _order(matches: list[Match]) -> list[Match]:
    """Matches in verification order: round-robin over kernel counts — the cheapest
    candidate of each count, then the second cheapest of each, … — with the counts in
    the order of their cheapest match's estimated time (fewer kernels first on a tie),
    so a split-loop pair predicted faster than every single kernel is verified before
    them; within a count, round-robin over kernel signatures (``gd+gd``, ``matmul+gd``,
    …) and over where the candidates came from (the enumeration, composed, composed+fused,
    split-loop): cheapest first by key (a split source credited with its best split,
    :meth:`_Run._split`), the split proposals in the order :func:`search.derive.splits`
    ranked them (by the lowering's model when the caller gave one, which ``cost_key`` does
    not agree with). However early the time runs out, every kernel count has had its best
    verified first, and every kind of candidate its best within each count: gqa b=1 had
    3,616 enumerated pairs and 8 split proposals for the 8 pairs verified, and the
    proposals the lowering ranks first were priced behind enumerated pairs by ``cost_key``.
    (Composed graphs keep the credited key: in their proposal order — uncredited —
    qknorm_gqa b=8's three-kernel graphs with a 64-block attention kernel, 26 μs on an
    H200, came after the 128-block ones, 49–57 μs, and were not verified.)"""
    lanes: dict[tuple[int, str, str], list[Match]] = {}
    for m in sorted(matches, key=lambda m: m.key):
        lanes.setdefault((m.kernels, m.signature, m.origin), []).append(m)
    for (_, _, origin), q in lanes.items():
        if origin == "split-loop":
            q.sort(key=lambda m: m.task)  # a split proposal's task is its rank among the proposals
    cheapest = {lane: min(m.cost[1] for m in q) for lane, q in lanes.items()}
    best: dict[int, float] = {}
    for (k, _, _), c in cheapest.items():
        best[k] = min(best.get(k, float("inf")), c)
    per_count: list[list[Match]] = []
    for k in sorted(best, key=lambda k: (best[k], k)):
        # the lane holding the count's cheapest estimate first
        queues = [lanes[lane] for lane in sorted((lane for lane in lanes if lane[0] == k),
                                                 key=lambda lane: (cheapest[lane], lanes[lane][0].key))]
        per_count.append([q[r] for r in range(max(len(q) for q in queues)) for q in queues if r < len(q)])
    return [c[r] for r in range(max((len(c) for c in per_count), default=0)) for c in per_count if r < len(c)]


class _LocalVerdicts:
    """Verdicts computed in this process, one at a time, while the time limit lasts."""

    def __init__(self, run: _Run) -> None:
        self.run = run

    def get(self, order: list[Match], pos: int, ahead: list[int]) -> Any:
        if not self.run._verify_fits():
            return "time"
        t0 = time.monotonic()
        v = self.run.checker.verdict(graph_from_json(order[pos].graph))
        self.run.verify_seconds.append(time.monotonic() - t0)
        return None if v is None else v.to_json()


class _ExecutorVerdicts:
    """Verdicts from the executor's workers: the candidates a sequential pass may verify
    next are dispatched ahead (as many as there are idle workers) and committed in rank
    order by :func:`_verify_best`, so the outcome is the sequential one. Nothing is
    dispatched after the time limit; workers still verifying :data:`GRACE` seconds
    after it are terminated."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.answers: dict[int, Any] = {}
        self.sent: dict[int, float] = {}

    def get(self, order: list[Match], pos: int, ahead: list[int]) -> Any:
        run = self.run
        while pos not in self.answers:
            if pos not in self.sent and not run._verify_fits():
                return "time"
            if run._past(run.t_end, GRACE):
                run._stop_executor()
                return "time"
            ex = run._executor()
            for q in ahead:
                if ex.idle() <= 0:
                    break
                if q not in self.sent and run._verify_fits():
                    self.sent[q] = time.monotonic()
                    ex.submit(q, {"kind": "verify", "graph": order[q].graph})
            for out in ex.wait(run._tick()):
                if out.value is None:
                    run._note(f"verification of candidate {out.index} failed: {out.error}")
                    if out.died:
                        run.worker_failures.append({"verify": out.index, "error": out.error, "retried": False})
                else:
                    run.verify_seconds.append(time.monotonic() - self.sent[out.index])
                self.answers[out.index] = None if out.value is None else out.value["verdict"]
            run._refresh()
        return self.answers.pop(pos)


def _verify_best(order: list[Match], cfg: SearchConfig, n_matches: int, verdicts_of,
                 stop_after: Optional[int] = None,
                 seen: Optional[Callable[[Counter], None]] = None) -> tuple[list[Found], Counter]:
    """Fully verify fingerprint-matching candidates while the budget lasts.

    Candidates come in :func:`_order` (ranked by :func:`~search.enumerate.cost_key`:
    kernels, estimated time, shared memory, block ops; ties by discovery order, so the
    choice is deterministic; round-robin over kernel counts). For each kernel count, up
    to ``verify_per_kernels`` pass verification (None: no cap), with at most
    ``max_verify`` verifications in all (None: no count — the time decides; a failure,
    a fingerprint false positive, lets the next one in). The time: a verification is
    started only while it can finish before the search's end at the cost measured so
    far (:meth:`_Run._verify_fits`), so the number verified scales with what one costs
    on this machine. ``verdicts_of.get(order, pos, ahead)`` answers position ``pos``
    (the verdict's JSON, None when the verifier could not evaluate it, or ``"time"``
    when the time ran out first); ``ahead`` lists the positions this pass may verify
    next, ``pos`` first, for sources that work on several at once. ``stop_after``: stop
    once that many passed. ``seen(counts)`` is called after each verdict (the progress).
    The verified graphs come back by kernel count, each count's in rank order.
    """
    st: Counter = Counter()
    out: list[tuple[int, int, Found]] = []
    passed: Counter = Counter()
    tried = 0

    def needed(q: int) -> bool:
        return cfg.verify_per_kernels is None or passed[order[q].kernels] < cfg.verify_per_kernels

    for pos in range(len(order)):
        if stop_after is not None and len(out) >= stop_after:
            break
        if cfg.max_verify is not None and tried >= cfg.max_verify:
            break
        if not needed(pos):
            continue
        budget = None if cfg.max_verify is None else cfg.max_verify - tried
        ahead = [q for q in range(pos, len(order)) if needed(q)][:budget]
        v = verdicts_of.get(order, pos, ahead)
        if v == "time":
            st["verify_skipped_time"] += 1
            continue
        tried += 1
        st["verifications"] += 1
        if v is not None and v.get("equivalent"):
            m = order[pos]
            st["verified"] += 1
            if cfg.thread_graphs:
                st["thread_graphs"] += _thread_graphs(m.graph)
            passed[m.kernels] += 1
            out.append((m.kernels, pos, Found(m.graph, m.origin, v)))
        else:
            st["verify_failed"] += 1
        if seen is not None:
            seen(st)
    st["unverified_matches"] = n_matches - st["verifications"]
    out.sort(key=lambda r: r[:2])  # by kernel count, each count's in rank order
    return [r[2] for r in out], st


def _thread_graphs(gj: dict) -> int:
    g = graph_from_json(gj)
    return sum(len(op.attrs["block"].thread_graphs) for op in g.ops if op.kind == "graph_defined")

