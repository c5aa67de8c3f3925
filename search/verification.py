"""The verify phase of a search run (:mod:`search.driver`): the fingerprint matches
fully verified, cheapest first and round-robin over kernel counts, while the time
limit lasts — in this process (serial search, or a GPU here, after a warm-up that ran
during the enumeration) or on the executor's workers."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Optional

from mugraph.core.serialize import graph_from_json

from .candidates import split_loops
from .check import on_threads
from .config import SearchConfig
from .derive import kernel_shape, one_per_shape
from .records import Found, Match
from .run_state import GRACE, RunState, VerifyCost
from .worker import usable_cores

Verified = tuple[list[Found], Counter]

log = logging.getLogger("mugraph")

#: the longest a search waits past its end for its verification warm-up (:func:`settle_warm_up`)
SETTLE_MAX_S = 60.0


# ----------------------------------------------------------------- warm-up
def start_warm_up(state: RunState) -> None:
    """With a GPU (verifications run in this process), prepare the program's side of
    every field test and of the float check while the workers enumerate: this process
    only waits on them then, and the first verification would otherwise pay for it
    (a decode attention on an H200 machine: 20 s of a 60 s search's 16 s left)."""
    if not state.cfg.verify or state.cfg.executor == "serial" or not state.verify_here:
        return
    # Checker.verdict turns any failure into a warning and no verdict: a failed
    # warm-up costs only the time it took
    spare = max(1, usable_cores() - state.cfg.workers)

    def warm() -> None:
        t0 = time.monotonic()
        on_threads(spare, state.checker.warm)
        state.warm_up_seconds = round(time.monotonic() - t0, 3)
    state.warming = threading.Thread(target=warm, name="mugraph-verify-warm-up", daemon=True)
    state.warming.start()


def after_warm_up(state: RunState, matches: list[Match],
                  then: Callable[[RunState, list[Match]], Verified]) -> Verified:
    """``then(state, matches)`` once the warm-up is done. When it is not by the time limit,
    no new verification starts (the matches are counted as skipped), but the verdicts
    already known — the seeds', verified before the enumeration — still count: a seed
    proven equivalent ships. Why: an 8k-token prompt attention's four seeds, carried up
    from its scout, were proven in 51.5 s of a 60 s search, and the warm-up that started
    after them was not done by the end — the search returned none of them, and the program
    shipped at 0.21× SDPA (H200)."""
    if not warmed(state):
        found, st = known_only(state, matches)
        st["verify_skipped_warm_up"] = len(matches) - st["verifications"]
        return found, st
    return then(state, matches)


class _NoTimeLeft:
    """A verdict source with no time for any verification (every answer ``"time"``)."""

    def get(self, order: list[Match], pos: int, ahead: list[int]) -> Any:
        return "time"


def known_only(state: RunState, matches: list[Match]) -> Verified:
    """The verify phase with no time for a new verification: the matches whose verdict is
    already known (``state.known_verdicts``), taken in verification order with its caps."""
    if not state.cfg.verify or not state.known_verdicts:
        return [], Counter()
    found, st = verify_best(order(matches), state.cfg, len(matches), with_known(state, _NoTimeLeft()))
    st.pop("verify_skipped_time", None)  # counted as skipped for the warm-up by the caller
    return found, st


def warmed(state: RunState) -> bool:
    """Wait for the warm-up, which holds the checker the split phase and the
    verification use, at most until the time limit. False when it is still running then:
    there is no time left to verify anyway (:func:`settle_warm_up` waits for it before the
    search returns)."""
    return _join_warm_up(state, state.clock.t_end)


def settle_warm_up(state: RunState, at_most: Optional[float] = None) -> None:
    """Wait until the warm-up thread has ended, at most ``at_most`` seconds (default
    :data:`SETTLE_MAX_S`). A search must not return while it runs: its GPU work would
    overlap the caller's, and the GPU re-ranking captures CUDA graphs — an allocation or
    synchronization on another thread during a capture invalidates it ("operation not
    permitted when stream is capturing", then "operation failed due to a previous error
    during capture"). Seen on the first piece of every cold compile of a Gemma layer: its
    5 s search ended while the warm-up still paid for the process's first CUDA and numba
    work, and the piece stayed torch code. The wait is that first warm-up's remainder,
    seconds; one still running after ``at_most`` is left to finish on its own (a daemon),
    with one warning line, so a stuck warm-up cannot hang the caller."""
    at_most = SETTLE_MAX_S if at_most is None else at_most
    if not _join_warm_up(state, time.monotonic() + at_most):
        log.warning("mugraph search: the verification warm-up of %r still runs %.0f s after the search "
                    "ended; returning without it (GPU work may overlap the caller's)", state.program.name, at_most)


def _join_warm_up(state: RunState, until: Optional[float]) -> bool:
    """Wait for the warm-up thread until monotonic time ``until`` (None: as long as it
    runs), in short waits so Ctrl-C still interrupts; True (and the thread forgotten) once
    it has ended, False when it still runs at ``until``."""
    t = state.warming
    while t is not None and t.is_alive():
        if until is not None and time.monotonic() > until:
            return False
        t.join(0.5)
    state.warming = None
    return True


# ------------------------------------------------------------------ phases
def split_and_verify(state: RunState, matches: list[Match]) -> Verified:
    """The split-loop phase, then the verification of all the candidates."""
    split_loops(state, matches)
    return verify(state, matches)


def verify(state: RunState, matches: list[Match]) -> Verified:
    """The verify phase (a sub-search, which does not verify: its matches ranked for the caller)."""
    if not state.cfg.verify:
        # a sub-search's matches (a piece of a composition): cheapest first, but one per
        # kernel shape (grids and loop lengths) before a second spelling of any, so that
        # the few the caller keeps (max_results) offer the grids its fusion needs — the
        # cheapest few alone can all be one shape, or all loop, and fuse with nothing
        ranked = sorted(matches, key=lambda m: m.key)
        first, rest = one_per_shape(ranked, key=lambda m: kernel_shape(graph_from_json(m.graph)))
        return [Found(m.graph, m.origin) for m in first + rest], Counter()
    state.set_phase("verify")
    return verify_best(order(matches), state.cfg, len(matches), with_known(state, verdict_source(state)),
                       seen=state.verdict_seen)


def verify_after_interrupt(state: RunState, matches: list[Match]) -> Verified:
    """After Ctrl-C: the cheapest matches, in this process, until one passes (Ctrl-C again: none)."""
    if not state.cfg.verify:
        return [], Counter()
    state.set_phase("verify (interrupted)")
    try:
        source = with_known(state, LocalVerdicts(state.checker, state.verify_cost))
        return verify_best(order(matches), state.cfg, len(matches), source, stop_after=1, seen=state.verdict_seen)
    except KeyboardInterrupt:
        return [], Counter({"verify_skipped_interrupt": 1})


def with_known(state: RunState, source: Any) -> Any:
    """``source``, its answers preceded by the verdicts already known (the seeds', computed
    before the enumeration: :class:`KnownVerdicts`) — never computed twice."""
    return KnownVerdicts(source, state.known_verdicts) if state.known_verdicts else source


def verdict_source(state: RunState) -> "LocalVerdicts | ExecutorVerdicts":
    # With a GPU, verifications run here, one after another: the GPU is one device
    # whatever the number of workers, this process's Reference already holds the
    # program's side of every test, and a worker would first start a CUDA context and
    # compute that side again. On the workers, 16 at once on an H200 machine, qknorm_gqa
    # b=8 and two decode attentions finished no verification in the 14–17 s a 60 s
    # search left them (2026-11-26); here one takes about 2 s.
    return LocalVerdicts(state.checker, state.verify_cost) if state.verify_here else ExecutorVerdicts(state)


# --------------------------------------------------------- verdict sources
def graph_key(graph_json: dict) -> str:
    """A candidate's graph JSON as a key of verdicts already known."""
    return json.dumps(graph_json, sort_keys=True)


class KnownVerdicts:
    """``source``'s verdicts, but those already computed (``known``: by :func:`graph_key`;
    the seeds', so only candidates of origin ``"transfer"`` are looked up — a key is a JSON
    dump of the whole graph, and the verify phase asks about thousands of matches) answered
    at once."""

    def __init__(self, source: Any, known: dict[str, Any]) -> None:
        self.source, self.known = source, known

    def _key(self, m: Match) -> str | None:
        """``m``'s key where its verdict is known, else None."""
        if m.origin != "transfer":
            return None
        k = graph_key(m.graph)
        return k if k in self.known else None

    def get(self, order: list[Match], pos: int, ahead: list[int]) -> Any:
        k = self._key(order[pos])
        if k is not None:
            return self.known[k]
        return self.source.get(order, pos, [q for q in ahead if self._key(order[q]) is None])


class LocalVerdicts:
    """Verdicts computed in this process, one at a time, while the time limit lasts."""

    def __init__(self, checker: Any, cost: VerifyCost) -> None:
        self.checker, self.cost = checker, cost

    def get(self, order: list[Match], pos: int, ahead: list[int]) -> Any:
        if not self.cost.fits():
            return "time"
        t0 = time.monotonic()
        v = self.checker.verdict(graph_from_json(order[pos].graph))
        self.cost.seconds.append(time.monotonic() - t0)
        return None if v is None else v.to_json()


class ExecutorVerdicts:
    """Verdicts from the executor's workers: the candidates a sequential pass may verify
    next are dispatched ahead (as many as there are idle workers) and committed in rank
    order by :func:`verify_best`, so the outcome is the sequential one. Nothing is
    dispatched after the time limit; workers still verifying :data:`GRACE` seconds
    after it are terminated."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.answers: dict[int, Any] = {}
        self.sent: dict[int, float] = {}

    def get(self, order: list[Match], pos: int, ahead: list[int]) -> Any:
        state, cost = self.state, self.state.verify_cost
        while pos not in self.answers:
            if pos not in self.sent and not cost.fits():
                return "time"
            if state.clock.past(state.clock.t_end, GRACE):
                state.stop_executor()
                return "time"
            ex = state.running_executor()
            for q in ahead:
                if ex.idle() <= 0:
                    break
                if q not in self.sent and cost.fits():
                    self.sent[q] = time.monotonic()
                    ex.submit(q, {"kind": "verify", "graph": order[q].graph})
            for out in ex.wait(state.clock.tick()):
                if out.value is None:
                    state.note(f"verification of candidate {out.index} failed: {out.error}")
                    if out.died:
                        state.worker_failures.append({"verify": out.index, "error": out.error, "retried": False})
                else:
                    cost.seconds.append(time.monotonic() - self.sent[out.index])
                self.answers[out.index] = None if out.value is None else out.value["verdict"]
            state.refresh()
        return self.answers.pop(pos)


# ------------------------------------------------------------ rank and pass
def order(matches: list[Match]) -> list[Match]:
    """Matches in verification order: round-robin over kernel counts — the cheapest
    candidate of each count, then the second cheapest of each, … — with the counts in
    the order of their cheapest match's estimated time (fewer kernels first on a tie),
    so a split-loop pair predicted faster than every single kernel is verified before
    them; within a count, round-robin over kernel signatures (``gd+gd``, ``matmul+gd``,
    …) and over where the candidates came from (the enumeration, composed, composed+fused,
    split-loop): cheapest first by key (a split source credited with its best split,
    :func:`search.candidates.split_loops`), the split proposals in the order :func:`search.derive.splits`
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
        if origin in ("split-loop", "retile", "transfer"):
            q.sort(key=lambda m: m.task)  # a derived proposal's task is its rank among the proposals
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


def verify_best(order: list[Match], cfg: SearchConfig, n_matches: int, verdicts_of,
                 stop_after: Optional[int] = None,
                 seen: Optional[Callable[[Counter], None]] = None) -> tuple[list[Found], Counter]:
    """Fully verify fingerprint-matching candidates while the budget lasts.

    Candidates come in :func:`order` (ranked by :func:`~search.enumerate.cost_key`:
    kernels, estimated time, shared memory, block ops; ties by discovery order, so the
    choice is deterministic; round-robin over kernel counts). For each kernel count, up
    to ``verify_per_kernels`` pass verification (None: no cap; a graph whose float check
    failed is returned but takes no place, :func:`_float_failed`), with at most
    ``max_verify`` verifications in all (None: no count — the time decides; a failure,
    a fingerprint false positive, lets the next one in). The time: a verification is
    started only while it can finish before the search's end at the cost measured so
    far (:meth:`search.run_state.VerifyCost.fits`), so the number verified scales with what one costs
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
                st["thread_graphs"] += thread_graphs(m.graph)
            if _float_failed(v):
                st["verified_float_failed"] += 1  # kept (and reported), but it takes no place of the cap
            else:
                passed[m.kernels] += 1
            out.append((m.kernels, pos, Found(m.graph, m.origin, v)))
        elif v is None:  # the verifier could not evaluate it (a value past the evaluator's limit, ...)
            st["verify_unevaluated"] += 1
        else:
            st["verify_failed"] += 1
        if seen is not None:
            seen(st)
    st["unverified_matches"] = n_matches - st["verifications"]
    out.sort(key=lambda r: r[:2])  # by kernel count, each count's in rank order
    return [r[2] for r in out], st


def _float_failed(v: dict) -> bool:
    """The verdict proves the graph equal but its float check failed: equal in exact
    arithmetic, unusable in floats — a shift that is not the max of what it shifts (the max of
    the unscaled scores taken from the scaled ones) makes every exponential underflow. Such
    graphs do not count toward ``verify_per_kernels``: a 2k-key prompt attention (H200, 60 s)
    verified 7 graphs, 3 of them of that kind, and no derived tile variant after them."""
    fc = v.get("float_check")
    return isinstance(fc, dict) and fc.get("passed") is False


def thread_graphs(gj: dict) -> int:
    g = graph_from_json(gj)
    return sum(len(op.attrs["block"].thread_graphs) for op in g.ops if op.kind == "graph_defined")

