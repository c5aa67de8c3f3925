"""The search driver: ``search.run(program, config) -> SearchResult``.

The root of the search tree is split into serializable :class:`~search.enumerate.Task`
objects (kernel-op prefixes / block-graph starts), run by a pool of worker
processes (each builds its own oracle once). Results are merged *in task order*
and, within a task, in DFS order, so the outcome does not depend on scheduling:
the same seed and config give the same graphs. A checkpoint records finished
tasks; resuming skips them. A time limit stops dispatching and lets running tasks
stop at their deadline; the search then returns what it has verified.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mugraph.ir import KernelGraph, Program
from mugraph.serialize import graph_from_json, graph_to_json

from .checkpoint import Checkpoint, fingerprint_of
from .config import SearchConfig
from .derive import composed, splits
from .enumerate import Searcher, Task, cost_key, signature


@dataclass
class SearchResult:
    """Verified μGraphs (``.graphs``, KernelGraphs) and statistics (``.stats``)."""

    program: str
    graph_json: list[dict] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def graphs(self) -> list[KernelGraph]:
        return [graph_from_json(d) for d in self.graph_json]

    def to_json(self) -> dict:
        return {"format": "mugraph-search-result", "version": 1, "program": self.program,
                "graphs": self.graph_json, "stats": self.stats}

    @classmethod
    def from_json(cls, d: dict) -> "SearchResult":
        return cls(d["program"], list(d["graphs"]), dict(d["stats"]))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SearchResult":
        return cls.from_json(json.loads(Path(path).read_text()))


# ------------------------------------------------------------------ workers

_W: dict[str, Any] = {}


def _init_worker(program_json: dict, cfg_json: dict) -> None:
    program = graph_from_json(program_json)
    _W["searcher"] = Searcher(program, SearchConfig.from_json(cfg_json))


def _run_one(args: tuple[int, list, Optional[float]]) -> tuple[int, list[dict], dict, dict]:
    index, task_json, deadline = args
    s: Searcher = _W["searcher"]
    s.stats = Counter()
    s.results = []
    before = s.oracle.stats.as_dict()
    prefix = _fix_attrs(tuple(_tuplify(x) for x in task_json[0]))
    block = None if task_json[1] is None else (tuple(task_json[1][0]), task_json[1][1])
    kops = task_json[2] if len(task_json) > 2 else None
    s.run_task(Task(prefix, block, kops), deadline=deadline)
    after = s.oracle.stats.as_dict()
    odelta = {k: after[k] - before[k] for k in ("queries", "cache_hits", "keeps", "prunes", "doubtful_prunes",
                                                "z3_calls", "z3_proofs", "seconds")}
    timed_out = deadline is not None and time.monotonic() > deadline
    return index, s.results, dict(s.stats), {**odelta, "timed_out": timed_out}


def _tuplify(x):
    if isinstance(x, list):
        return tuple(_tuplify(y) for y in x)
    return x


def _fix_attrs(prefix: tuple) -> tuple:
    """JSON turned Fractions into strings; scale/const attrs need them back."""
    from fractions import Fraction
    out = []
    for spec in prefix:
        _, kind, inputs, attrs = spec
        attrs = tuple((k, Fraction(v) if k in ("c", "value") else v) for k, v in attrs)
        out.append(("op", kind, tuple(inputs), attrs))
    return tuple(out)


# ------------------------------------------------------------------ driver

def run(program: Program, config: Optional[SearchConfig] = None) -> SearchResult:
    """Search μGraphs equivalent to ``program``; see :class:`SearchConfig` for the knobs."""
    cfg = config or SearchConfig()
    t0 = time.perf_counter()
    t_end = None if cfg.time_limit is None else time.monotonic() + cfg.time_limit
    deadline = None if t_end is None else t_end - min(cfg.verify_reserve, 0.3 * cfg.time_limit)
    pjson = graph_to_json(program)
    root = Searcher(program, cfg)
    derived: list[tuple] = []
    dstats: dict[str, Any] = {}
    if cfg.compose:
        # deep programs: pieces first (a share of the time; 60 s without a limit), then the
        # whole-program enumeration. Piece searches stop on their time share, so with a tight
        # limit what they propose can depend on the machine's speed (not on scheduling);
        # the checkpoint covers the enumeration only — a resumed search redoes the pieces.
        budget = 60.0 if deadline is None else cfg.compose_share * (deadline - time.monotonic())
        derived += composed(program, cfg, budget, root.checker, dstats)
    if cfg.iterative_deepening:
        # phase k: graphs of exactly k kernel ops, so that few-kernel graphs come first;
        # within a phase, tasks starting with a graph-defined op (one mapping each, small)
        # before those starting with a pre-defined op (each holds a whole sub-search)
        tasks = [t for k in range(1, cfg.max_kernel_ops + 1)
                 for t in sorted(root.root_tasks(k), key=lambda t: t.block is None)]
    else:
        tasks = root.root_tasks()
    task_json = [t.to_json() for t in tasks]
    ckpt = Checkpoint(cfg.checkpoint, fingerprint_of(pjson, cfg.key())) if cfg.checkpoint else None
    done: dict[int, tuple[list, dict, dict]] = {}
    if ckpt:
        for i, rec in ckpt.done.items():
            done[i] = (rec["results"], rec["stats"].get("search", {}), rec["stats"].get("oracle", {}))
    todo = [i for i in range(len(tasks)) if i not in done]
    bar = _bar(cfg, len(tasks), len(done))
    counts: Counter = Counter()
    for r in done.values():
        counts.update(r[1])
    last_save = time.monotonic()
    interrupted = False
    first_match: list = [None]
    phase_of = [t.kops or 0 for t in tasks]
    phase_left = Counter(phase_of[i] for i in todo)
    phase_done: dict[int, float] = {}

    def finish(i: int, res: list, st: dict, ost: dict) -> None:
        nonlocal last_save
        done[i] = (res, st, ost)
        counts.update(st)
        if res and first_match[0] is None:
            first_match[0] = round(time.perf_counter() - t0, 3)
        ph = phase_of[i]
        if not ost.get("timed_out"):
            phase_left[ph] -= 1
            if phase_left[ph] == 0:
                phase_done[ph] = round(time.perf_counter() - t0, 3)
        if ckpt and not ost.get("timed_out"):
            ckpt.record(i, res, {"search": st, "oracle": ost})
            if time.monotonic() - last_save > 2.0:
                ckpt.save()
                last_save = time.monotonic()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(states=counts["block_states"] + counts["kernel_states"],
                            pruned=sum(v for k, v in counts.items() if k.startswith("pruned")),
                            cand=counts["candidates"], matches=counts["fingerprint_matches"], refresh=False)

    try:
        if cfg.workers <= 1:
            _W["searcher"] = root
            for i in todo:
                if deadline is not None and time.monotonic() > deadline:
                    break
                finish(*_run_one((i, task_json[i], deadline)))
        else:
            ctx = mp.get_context("spawn")  # fork after egglog (Rust threads) can deadlock
            with ctx.Pool(cfg.workers, initializer=_init_worker,
                          initargs=(pjson, cfg.to_json())) as pool:
                for out in pool.imap_unordered(_run_one, [(i, task_json[i], deadline) for i in todo]):
                    finish(*out)
                    if deadline is not None and time.monotonic() > deadline + 5:
                        pool.terminate()
                        break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        search_seconds = time.perf_counter() - t0
        if ckpt:
            ckpt.save()
        if bar is not None:
            bar.close()
    matches: list[tuple] = []
    ostats: Counter = Counter()
    timed_out = False
    for i in sorted(done):
        for j, m in enumerate(done[i][0]):
            matches.append((tuple(m["cost"]), i, j, m["graph"], m.get("sig", ""), "enumeration"))
        ostats.update({k: v for k, v in done[i][2].items() if isinstance(v, (int, float)) and k != "timed_out"})
        timed_out |= bool(done[i][2].get("timed_out"))

    def propose(g: KernelGraph, origin: str) -> None:  # derived graphs rank after every task's matches
        matches.append((tuple(cost_key(g)), len(tasks) + len(matches), 0, graph_to_json(g), signature(g), origin))

    for g, origin in derived:
        propose(g, origin)
    if cfg.split_loops:
        ones = [graph_from_json(m[3]) for m in sorted(matches, key=lambda m: m[:3]) if m[0][0] == 1]
        for g, origin in splits(ones[:cfg.split_sources], root.checker, dstats, t_end):
            propose(g, origin)
    if not cfg.verify:
        ranked = sorted(matches, key=lambda m: m[:3])
        graphs, origins, vstats = [m[3] for m in ranked], [m[5] for m in ranked], Counter()
        verdicts: list = [None] * len(graphs)
    else:
        graphs, origins, verdicts, vstats = _verify_best(root, program, matches, cfg, t_end)
    counts.update(vstats)
    if cfg.max_results is not None:
        graphs, origins, verdicts = graphs[:cfg.max_results], origins[:cfg.max_results], verdicts[:cfg.max_results]
    o = root.oracle
    stats = {
        "program": program.name,
        "wall_seconds": round(time.perf_counter() - t0, 3),
        "tasks": len(tasks), "tasks_done": sum(1 for r in done.values() if not r[2].get("timed_out")),
        "complete": len(done) == len(tasks) and not timed_out and not interrupted,
        "interrupted": interrupted,
        "search": dict(sorted(counts.items())),
        "search_seconds": round(search_seconds, 3),
        "first_match_seconds": first_match[0],
        #: seconds at which every task of an iterative-deepening phase (kernel ops) had finished
        "phase_complete_seconds": dict(sorted(phase_done.items())),
        "fingerprint_matches_by_kernels": sorted(Counter(m[0][0] for m in matches).items()),
        "fingerprint_matches_by_signature": dict(sorted(Counter(m[4] for m in matches).items())),
        "oracle": {**dict(ostats), "saturated": o.saturated, "egraph_nodes": o.stats.egraph_nodes,
                   "saturation_seconds": round(o.stats.saturation_seconds, 3),
                   "distinct_expressions": len(o._cache)},
        "verification": root.checker.method if cfg.verify else "fingerprint only (sub-search)",
        "num_graphs": len(graphs),
        #: how each returned graph was found: enumeration, composed(+fused), split-loop
        "origins": origins,
        #: each returned graph's Verdict (JSON) against the program, so callers need not verify again
        "verdicts": verdicts,
        "derived": dstats,
        "kernels": sorted(Counter(sum(1 for op in d["ops"] if op["op"] != "input") for d in graphs).items()),
    }
    if interrupted:
        raise KeyboardInterrupt
    return SearchResult(program.name, graphs, stats)


def _verify_best(root: Searcher, program: Program, matches: list[tuple], cfg: SearchConfig,
                 t_end: Optional[float]) -> tuple[list[dict], list[str], list[dict], Counter]:
    """Fully verify a bounded number of fingerprint-matching candidates.

    Candidates are ranked by :func:`~search.enumerate.cost_key` (kernels, device
    bytes written, block ops; ties by discovery order, so the choice is
    deterministic). For each kernel count, taking kernel signatures (``gd+gd``,
    ``matmul+gd``, …) in turn and the cheapest of each first, up to
    ``verify_per_kernels`` pass verification, with at most ``max_verify``
    verifications in all (a failure — a fingerprint false positive — lets the next
    one in). ``max_verify=None`` verifies every match.
    """
    st: Counter = Counter()
    out: list[dict] = []
    origins: list[str] = []
    verdicts: list[dict] = []
    # per kernel count: cheapest first, round-robin over kernel signatures (gd+gd, matmul+gd, …)
    by_sig: dict[tuple[int, str], list] = {}
    for m in sorted(matches, key=lambda m: m[:3]):
        by_sig.setdefault((m[0][0], m[4]), []).append(m)
    order: list[tuple] = []
    for k in sorted({k for k, _ in by_sig}):
        queues = sorted((q for (kk, _), q in by_sig.items() if kk == k), key=lambda q: q[0][:3])
        for r in range(max(len(q) for q in queues)):
            order.extend(q[r] for q in queues if r < len(q))
    passed: Counter = Counter()
    tried = 0
    for m in order:
        cost, gj = m[0], m[3]
        if cfg.max_verify is not None and tried >= cfg.max_verify:
            break
        if cfg.max_verify is not None and passed[cost[0]] >= cfg.verify_per_kernels:
            continue
        if out and t_end is not None and time.monotonic() > t_end:
            st["verify_skipped_time"] += 1
            continue
        tried += 1
        st["verifications"] += 1
        g = graph_from_json(gj)
        v = root.checker.verdict(g)
        if v is not None and v.equivalent:
            st["verified"] += 1
            if cfg.thread_graphs:
                st["thread_graphs"] += sum(len(op.attrs["block"].thread_graphs)
                                           for op in g.ops if op.kind == "graph_defined")
            passed[cost[0]] += 1
            out.append(gj)
            origins.append(m[5])
            verdicts.append(v.to_json())
        else:
            st["verify_failed"] += 1
    st["unverified_matches"] = len(matches) - st["verifications"]
    return out, origins, verdicts, st


def _bar(cfg: SearchConfig, total: int, initial: int):
    if not cfg.progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, initial=initial, desc="search", unit="task", dynamic_ncols=True)
