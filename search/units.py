"""Units of work of a search run (:class:`search.run_state.RunState`): the root tasks and
the pieces that tasks running past ``split_seconds`` handed back, their names in the
checkpoint, and what happens when one finishes — shared by the prepare phase (units
resumed from a checkpoint) and the enumerate phase (units answered by the executor)."""

from __future__ import annotations

import time

from .records import TaskDone
from .run_state import RunState


def add_unit(state: RunState, i: int, path: tuple) -> int:
    """Queue-able unit ``path`` below root task ``i``; its index."""
    state.units.append((i, path))
    state.unit_json.append(state.tasks[i].sub(path).to_json())
    return len(state.units) - 1


def unit_key(i: int, path: tuple) -> str:
    """A unit's name in the checkpoint: ``"7"`` for root task 7, ``"7:3.-1073741824.0"`` below it."""
    return str(i) if not path else f"{i}:" + ".".join(str(k) for k in path)


def describe(task_json: list) -> str:
    """A short text of a task for messages: its first kernel op or block start."""
    prefix, block, kops = (task_json + [None])[:3]
    what = ",".join(op[1] for op in prefix) if prefix else ""
    if block is not None:
        what += (" + " if what else "") + f"block{tuple(block[0])}#{block[1]}"
    if len(task_json) > 3 and task_json[3]:
        what += f" @{'.'.join(str(k) for k in task_json[3])}"
    return f"{what or 'root'} (≤{kops} kernels)" if kops else (what or "root")


def record_unit(state: RunState, u: int, res: list, st: dict, ost: dict, deferred: list,
                save: bool = True) -> None:
    """Unit ``u`` finished: keep its answer and queue the units it handed back (a unit
    stopped by the deadline is incomplete: it is redone on resume, its pieces dropped).
    ``save=False``: the answer comes from the checkpoint (resume) — nothing to save,
    time or queue yet."""
    state.done[u] = TaskDone(res, st, ost)
    state.counts.update(st)
    i, _ = state.units[u]
    ph = state.tasks[i].kops or 0
    new: list[int] = []
    if save and state.todo is not None:
        state.todo.credit(u, st.get("blocks_closed", 0))
    if not ost.get("timed_out"):
        new = [add_unit(state, i, tuple(p)) for p in sorted(deferred, key=len)]
        if save and new and state.todo is not None:
            state.todo.extendleft(reversed(new))  # shallowest (likely largest) first
            state.phase_left[ph] += len(new)
    if res and state.first_match is None and save:
        state.first_match = state.clock.since_start()
    if not ost.get("timed_out") and save:
        state.phase_left[ph] -= 1
        if state.phase_left[ph] == 0:
            state.phase_done[ph] = state.clock.since_start()
        if state.ckpt:
            state.ckpt.record(unit_key(*state.units[u]), res, {"search": st, "oracle": ost}, deferred)
            if time.monotonic() - state.last_save > 2.0:
                state.save()
    if state.bar is not None and (new or save):
        state.bar.update(1 if save else 0, total=len(state.units))
