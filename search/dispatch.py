"""The enumerate phase of a search run (:mod:`search.driver`): the units of work
dispatched to the executor while the deadline allows, their answers recorded (in
:func:`search.units.record_unit`), dead workers' tasks retried once, failures reported.
Fills :class:`~search.run_state.RunState`'s ``done``, ``counts`` and the failure lists."""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Optional

from .executors import Outcome
from .run_state import GRACE, RunState
from .units import describe, record_unit


class FairTodo:
    """The units waiting for a worker: fresh root tasks in order, and the pieces tasks handed
    back, kept per root task, served by priority.

    A root task running past ``split_seconds`` hands back the unexplored parts of its tree,
    and a tree whose first levels are huge keeps doing so. Served last-in first-out, those
    pieces buried the pieces of the other roots under each new hand-back: with 16 workers
    and 16 huge roots at once, the root holding a decode attention's online kernel got
    almost no time (no match in 28 s on 16 workers where 2 workers found one in 9–25 s).
    Here each dispatch goes to the root — fresh or with pieces waiting — of the least
    ``(served + 1) · (r + 1) / (1 + closed)``: ``served`` its dispatches so far, ``r`` its
    place in the search's order (earlier roots get more), ``closed`` the blocks its finished
    units closed into candidates (a tree that yields candidates is dug deeper than a barren
    one). A root's own pieces stay shallowest first. Scheduling does not change what a
    search run to completion finds (:mod:`search.driver`)."""

    def __init__(self, units: list, todo) -> None:
        self.units = units
        self.fresh: deque = deque()
        self.pieces: dict[int, deque] = {}
        self.served: Counter = Counter()
        self.closed: Counter = Counter()
        self.retry: deque = deque()
        self.waiting = 0                       # units queued, all queues together
        for u in todo:
            self._put(u)

    def _put(self, u: int, front: bool = False) -> None:
        self.waiting += 1
        root, path = self.units[u]
        if not path:
            (self.fresh.appendleft if front else self.fresh.append)(u)
            return
        q = self.pieces.setdefault(root, deque())
        (q.appendleft if front else q.append)(u)

    def extendleft(self, us) -> None:
        """Pieces handed back (given last-first, as to a deque's ``extendleft``)."""
        for u in us:
            self._put(u, front=True)

    def appendleft(self, u: int) -> None:
        """A unit to run again first (its worker died)."""
        self.waiting += 1
        self.retry.appendleft(u)

    def credit(self, u: int, closed: int) -> None:
        """Unit ``u`` finished, having closed ``closed`` blocks into candidates."""
        self.closed[self.units[u][0]] += closed

    def _priority(self, r: int) -> tuple:
        return ((self.served[r] + 1) * (r + 1) / (1 + self.closed[r]), r)

    def popleft(self) -> int:
        self.waiting -= 1
        if self.retry:
            return self.retry.popleft()
        # roots with pieces waiting (a root's queue is dropped once empty)
        best = min(self.pieces, key=self._priority, default=None)
        if self.fresh:
            r0 = self.units[self.fresh[0]][0]
            if best is None or self._priority(r0) < self._priority(best):
                self.served[r0] += 1
                return self.fresh.popleft()
        self.served[best] += 1
        q = self.pieces[best]
        u = q.popleft()
        if not q:
            del self.pieces[best]
        return u

    def __len__(self) -> int:
        return self.waiting

    def __iter__(self):
        yield from self.retry
        yield from self.fresh
        for q in self.pieces.values():
            yield from q


def enumerate_units(state: RunState) -> None:
    """Run every unit not done yet. Dispatching stops at the deadline; the units still
    running then are collected until its grace is over, then their workers are stopped.

    A deadline reached with no fingerprint match yet moves to the clock's late deadline
    (a third of the verification's reserve before the end): the reserve would otherwise
    go to verifying nothing. The units the old deadline stopped are run again from their
    start (their partial answers dropped, their subtrees kept). Seen: a decode attention
    over 8 KV heads × 32 rows, 20 s on 15 workers, ended its enumeration at 14 s with no
    match and returned with 6 s unspent; on 2 CPU workers its first match came at 26 s."""
    t_start = time.perf_counter()
    todo = FairTodo(state.units, (u for u in range(len(state.units)) if u not in state.done))
    state.todo = todo
    state.phase_left = Counter((state.tasks[state.units[u][0]].kops or 0) for u in todo)
    state.set_phase("search")
    attempts: Counter = Counter()
    deadline = state.clock.deadline
    #: the deadline each running unit was given (a unit stopped by an older one runs again)
    given: dict[int, Optional[float]] = {}
    try:
        while todo or (state.executor is not None and state.executor.busy()):
            deadline = _moved(state, deadline)
            open_ = _open(deadline)
            if not open_ and state.executor is None:
                break
            ex = state.running_executor()
            if not open_:  # no more dispatch: collect what runs, until the deadline's grace is over
                if not ex.busy():
                    break
                if state.clock.past(deadline, GRACE):
                    state.tasks_cut += len(ex.busy())
                    state.stop_executor()
                    break
            while open_ and todo and ex.idle() > 0:
                i = todo.popleft()
                attempts[i] += 1
                given[i] = deadline
                ex.submit(i, {"kind": "search", "task": state.unit_json[i], "deadline": state.clock.wall(deadline),
                              "split": state.cfg.split_seconds})
            for out in ex.wait(state.clock.tick()):
                # a unit its deadline stopped may answer before the loop comes round again (one
                # that brings a match is recorded first: the deadline then stays)
                if not (out.value and out.value.get("results")):
                    deadline = _moved(state, deadline)
                    open_ = _open(deadline)
                if open_ and _stopped_early(out, given.get(out.index), deadline):
                    attempts[out.index] -= 1
                    todo.appendleft(out.index)  # its deadline moved on since it was dispatched
                    continue
                take_outcome(state, out, attempts, todo if open_ else None)
            state.refresh()
    finally:
        state.search_seconds = time.perf_counter() - t_start


def _open(deadline: Optional[float]) -> bool:
    """Whether units may still be dispatched."""
    return deadline is None or time.monotonic() <= deadline


def _moved(state: RunState, deadline: Optional[float]) -> Optional[float]:
    """``deadline``, or the clock's late deadline once ``deadline`` has passed with no
    fingerprint match yet and nothing derived to verify (counted once in
    ``enumeration_extended``). A composition's graphs, fingerprinted before the enumeration
    (or a carried seed), are candidates the reserve is for: an RMSNorm feeding a q and a k
    projection composed 8 matching graphs in 6.7 s of a 30 s search, the enumeration matched
    nothing and ran on to 27.0 s, and the 2.3 s left verified 2 of them on a 2-core machine."""
    late = state.clock.late_deadline
    if (deadline is not None and late is not None and deadline < late and time.monotonic() > deadline
            and state.first_match is None and not state.derived):
        state.counts["enumeration_extended"] += 1
        return late
    return deadline


def _stopped_early(out: Outcome, given: Optional[float], deadline: Optional[float]) -> bool:
    """Whether ``out`` is a unit its own deadline stopped while the run's deadline has
    moved on since (nothing had matched): it is run again, not recorded incomplete."""
    v = out.value
    return (v is not None and bool(v.get("oracle", {}).get("timed_out")) and given is not None
            and deadline is not None and given < deadline)


def take_outcome(state: RunState, out: Outcome, attempts: Counter, todo: Optional[deque]) -> None:
    """One unit's answer: recorded, or its failure reported — a unit whose worker died is
    queued again once (``todo``: None when nothing may be dispatched any more)."""
    i = out.index
    if out.value is not None:
        v = out.value
        if "seconds" in v:
            state.unit_seconds.append(v["seconds"])
        record_unit(state, i, v["results"], v["stats"], v["oracle"], v.get("deferred", []))
        return
    spec = describe(state.unit_json[i])
    if out.died:
        retry = attempts[i] < 2 and todo is not None
        state.worker_failures.append({"task": i, "spec": spec, "error": out.error, "retried": retry})
        if retry:
            todo.appendleft(i)
            state.note(f"task {i} ({spec}): {out.error}; retrying it")
            return
    state.failed.append({"task": i, "spec": spec, "error": out.error})
    state.note(f"task {i} ({spec}) failed: {out.error}")
