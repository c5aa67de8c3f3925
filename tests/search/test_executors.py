"""search.executors: the local process pool's failure handling, at the executor level."""

import os
import signal
import sys
import time

import pytest

import mugraph as mg
import search
from search import SearchConfig, WorkerError
from search.enumerate import Searcher
from search.executors import ProcessExecutor, SerialExecutor, _main_module_hidden, make_executor
from search.worker import WorkerState, shared_state


def _program():
    p = mg.Program("expmm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32)); V = p.input("V", (64, 32))
    p.output(mg.exp(X @ W) * (X @ V))
    return p


def _cfg(**kw):
    base = dict(max_kernel_ops=1, max_block_ops=5, tile_sizes=(16,), forloop_ranges=(4,), verify_error=1e-3,
                progress=False, time_limit=None)
    base.update(kw)
    return SearchConfig(**base)


@pytest.fixture(scope="module")
def shared():
    p, cfg = _program(), _cfg()
    root = Searcher(p, cfg)
    return shared_state(p, cfg, root), [t.to_json() for t in root.root_tasks(1)]


def _collect(ex, n, limit=60.0):
    out, end = [], time.monotonic() + limit
    while len(out) < n and time.monotonic() < end:
        out += ex.wait(0.5)
    return out


def test_process_worker_answers_like_the_serial_one(shared):
    state, tasks = shared
    serial, procs = SerialExecutor(), ProcessExecutor(2)
    serial.start(state)
    procs.start(state)
    try:
        for i in range(3):
            payload = {"kind": "search", "task": tasks[i], "deadline": None}
            serial.submit(i, payload)
            (a,) = serial.wait(1.0)
            procs.submit(i, payload)
            (b,) = _collect(procs, 1)
            assert a.index == b.index == i
            assert a.value["results"] == b.value["results"] and a.value["stats"] == b.value["stats"]
            assert {k: v for k, v in a.value["oracle"].items() if k != "seconds"} == \
                {k: v for k, v in b.value["oracle"].items() if k != "seconds"}
    finally:
        procs.close()


def test_task_exception_is_a_one_line_error_and_the_worker_lives_on(shared):
    state, tasks = shared
    ex = ProcessExecutor(1)
    ex.start(state)
    try:
        ex.submit(7, {"kind": "nonsense"})
        (o,) = _collect(ex, 1)
        assert o.index == 7 and o.value is None and not o.died
        assert o.error == "ValueError: unknown payload kind 'nonsense'"
        ex.submit(8, {"kind": "search", "task": tasks[0], "deadline": None})
        (o,) = _collect(ex, 1)
        assert o.index == 8 and o.value is not None
        assert len(ex._procs) == 1  # the same worker answered
    finally:
        ex.close()


def test_killed_worker_gives_its_task_back_and_is_replaced(shared):
    state, tasks = shared
    ex = ProcessExecutor(1)
    ex.start(state)
    try:
        ex.submit(0, {"kind": "search", "task": tasks[0], "deadline": None})
        _collect(ex, 1)
        pid = ex._procs[0].proc.pid
        os.kill(pid, signal.SIGSTOP)  # the task below is tiny: stopped, the worker cannot answer it before the kill
        ex.submit(1, {"kind": "search", "task": tasks[1], "deadline": None})
        os.kill(pid, signal.SIGKILL)
        (o,) = _collect(ex, 1)
        assert o.index == 1 and o.died and o.error == f"worker pid {pid} killed by SIGKILL"
        assert ex.busy() == [] and ex.idle() == 1
        ex.submit(1, {"kind": "search", "task": tasks[1], "deadline": None})
        (o,) = _collect(ex, 1)
        assert o.value is not None and ex._procs[0].proc.pid != pid
    finally:
        ex.close()


def test_close_ends_a_stuck_worker_at_once(shared):
    state, tasks = shared
    ex = ProcessExecutor(1)
    ex.start(state)
    ex.submit(0, {"kind": "search", "task": tasks[0], "deadline": None})
    _collect(ex, 1)
    proc = ex._procs[0].proc
    os.kill(proc.pid, signal.SIGSTOP)  # a worker that never answers again
    t0 = time.monotonic()
    ex.close()
    assert time.monotonic() - t0 < 5.0 and not proc.is_alive()


def test_workers_that_cannot_start_are_one_error(shared):
    state, _ = shared
    ex = ProcessExecutor(1)
    ex.start({**state, "program": {"format": "not a graph"}})
    ex.submit(0, {"kind": "search", "task": [[], None, 1], "deadline": None})
    with pytest.raises(WorkerError, match="search worker failed to start: ") as e:
        _collect(ex, 1)
    assert "\n" not in str(e.value)
    assert ex._procs == []


def test_main_module_is_hidden_only_while_a_worker_starts():
    main = sys.modules["__main__"]
    with _main_module_hidden():
        hidden = sys.modules["__main__"]
        assert hidden is not main and getattr(hidden, "__file__", None) is None and hidden.__spec__ is None
    assert sys.modules["__main__"] is main


def test_make_executor_names_the_choices():
    assert make_executor("serial", 4).capacity == 1
    assert make_executor("processes", 3).capacity == 3
    with pytest.raises(mg.errors.ConfigError, match="executor='dask': use one of processes, serial, ray"):
        make_executor("dask", 2)


def test_serial_executor_reuses_the_driver_searcher():
    p, cfg = _program(), _cfg()
    root = Searcher(p, cfg)
    ex = make_executor("serial", 1, state=WorkerState(searcher=root))
    ex.start({})
    ex.submit(0, {"kind": "search", "task": root.root_tasks(1)[0].to_json(), "deadline": None})
    (o,) = ex.wait(0.1)
    assert o.value is not None and set(o.value) == {"results", "stats", "oracle", "deferred", "seconds"}
    r = search.run(p, _cfg(executor="serial"))
    assert r.stats["complete"]


def test_share_cores_gives_each_worker_its_share_of_every_thread_pool():
    """Process and Ray workers split the cores between them: torch's, the BLAS's (numpy's
    float64 matmuls) and numba's pools alike (one full-width pool of each per worker
    oversubscribed a 16-core machine 16-fold)."""
    import numba
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from search.worker import share_cores

    before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    with threadpool_limits(limits=None):  # restores the BLAS/OpenMP pools on exit
        try:
            cores = len(os.sched_getaffinity(0))
            assert share_cores(1) == cores == torch.get_num_threads()
            assert share_cores(10**6) == 1 == torch.get_num_threads() == numba.get_num_threads()
            assert all(pool["num_threads"] == 1 for pool in threadpool_info())
            assert share_cores(2) == max(1, cores // 2)
        finally:
            torch.set_num_threads(before)
            numba.set_num_threads(numba_before)


def test_the_verification_warm_up_runs_on_the_cores_the_workers_leave():
    """The driver's warm-up thread runs beside the workers: inside it torch and the
    BLAS/OpenMP pools have the given count, and the process's own settings come back after
    (also when the warm-up fails)."""
    import torch
    from threadpoolctl import threadpool_info

    from search.check import on_threads as _on_threads

    before = torch.get_num_threads()
    seen = {}

    def warm():
        seen["torch"] = torch.get_num_threads()
        seen["pools"] = [pool["num_threads"] for pool in threadpool_info()]

    _on_threads(1, warm)
    assert seen["torch"] == 1 and all(n == 1 for n in seen["pools"])
    assert torch.get_num_threads() == before

    def fails():
        raise RuntimeError("a failed warm-up")

    with pytest.raises(RuntimeError):
        _on_threads(1, fails)
    assert torch.get_num_threads() == before


def test_a_worker_sizes_numbas_pool_before_numba_is_imported():
    """In a fresh worker process numba is not imported yet when share_cores runs, so its
    OpenMP pool is made with the worker's share of the cores, not one thread per core (a
    pool sized later keeps every thread, waking at each parallel loop)."""
    import subprocess
    import sys

    code = ("import os, sys; from search.worker import share_cores; share_cores(10**6); "
            "assert 'numba' not in sys.modules; from verify import fused; assert fused._works(); "
            "import numba; assert numba.config.NUMBA_NUM_THREADS == 1, numba.config.NUMBA_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_the_next_search_takes_the_idle_workers_of_the_last(shared, monkeypatch):
    """Workers idle when a search ends wait for the process's next search: it starts them
    with its own state, without a fork, and they answer as fresh ones do."""
    import search.executors as executors

    state, tasks = shared
    payload = {"kind": "search", "task": tasks[0], "deadline": None}
    first = ProcessExecutor(2)
    first.start(state)
    first.submit(0, payload)
    (a,) = _collect(first, 1)
    pids = {w.proc.pid for w in first._procs}
    first.close()
    assert {w.proc.pid for w, _ in executors._IDLE} >= pids
    second = ProcessExecutor(2)
    second.start(state)
    try:
        assert {w.proc.pid for w in second._procs} == pids  # taken, not forked
        second.submit(0, payload)
        (b,) = _collect(second, 1)
        assert b.value["results"] == a.value["results"] and b.value["stats"] == a.value["stats"]
        assert b.index == 0 and second.startup_seconds and max(second.startup_seconds) < 5.0
    finally:
        second.close()
    # a dead idle worker is not taken: the next search forks another (the last one kept is
    # the first one taken)
    w, _ = executors._IDLE[-1]
    w.proc.kill()
    w.proc.join(5.0)
    third = ProcessExecutor(2)
    third.start(state)
    try:
        assert w.proc.pid not in {p.proc.pid for p in third._procs}
        third.submit(0, payload)
        (c,) = _collect(third, 1)
        assert c.value["results"] == a.value["results"]
        assert w.proc.pid not in {p.proc.pid for p in third._procs} and third._procs
    finally:
        third.close()
    # an idle worker exits when no search comes within the wait its stop named
    monkeypatch.setattr(executors, "IDLE_EXIT_S", 0.5)
    fourth = ProcessExecutor(1)
    fourth.start(state)
    fourth.submit(0, payload)
    _collect(fourth, 1)
    (w4,) = fourth._procs
    fourth.close()
    w4.proc.join(10.0)
    assert not w4.proc.is_alive()


def test_a_process_that_searched_exits_without_leaking_semaphores():
    """A process whose search left idle workers exits cleanly: the workers are told to exit
    before multiprocessing's own exit handler would terminate them, so numba's lock in each
    (a named semaphore under the spawn context, made when a worker's fingerprint first runs
    the fused loops: inputs of a million elements) is unlinked, and Python's resource tracker
    prints no "leaked semaphore" warning."""
    import subprocess

    code = ("import mugraph as mg; p = mg.Program('expmm'); "
            "X = p.input('X', (16, 1024)); W = p.input('W', (1024, 1024)); V = p.input('V', (1024, 1024)); "
            "p.output(mg.exp(X @ W) * (X @ V)); "
            "mg.superoptimize(p, {'search': {'time_limit': 8.0, 'workers': 2}}, device='cpu', cache_dir=False, "
            "progress=False); import search.executors as e; assert e._IDLE, 'no idle worker to end'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaked semaphore" not in done.stderr, done.stderr[-2000:]
