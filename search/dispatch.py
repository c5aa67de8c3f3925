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


def enumerate_units(state: RunState) -> None:
    """Run every unit not done yet. Dispatching stops at the deadline; the units still
    running then are collected until its grace is over, then their workers are stopped."""
    t_start = time.perf_counter()
    todo = deque(u for u in range(len(state.units)) if u not in state.done)
    state.todo = todo
    state.phase_left = Counter((state.tasks[state.units[u][0]].kops or 0) for u in todo)
    state.set_phase("search")
    attempts: Counter = Counter()
    deadline = state.clock.deadline
    try:
        while todo or (state.executor is not None and state.executor.busy()):
            open_ = deadline is None or time.monotonic() <= deadline
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
                ex.submit(i, {"kind": "search", "task": state.unit_json[i], "deadline": state.clock.wall(deadline),
                              "split": state.cfg.split_seconds})
            for out in ex.wait(state.clock.tick()):
                take_outcome(state, out, attempts, todo if open_ else None)
            state.refresh()
    finally:
        state.search_seconds = time.perf_counter() - t_start


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
