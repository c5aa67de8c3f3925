"""The Ray executor on a local cluster (``ray.init(num_cpus=2)``, shared by this module's tests):
the same graphs as the serial and process executors, and a lost actor reported as a death."""

import time

import pytest

ray = pytest.importorskip("ray")

import mugraph as mg  # noqa: E402
import search  # noqa: E402
from search import SearchConfig  # noqa: E402
from search.enumerate import Searcher  # noqa: E402
from search.executors import RayExecutor  # noqa: E402
from search.worker import shared_state  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _program():
    p = mg.Program("expmm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32)); V = p.input("V", (64, 32))
    p.output(mg.exp(X @ W) * (X @ V))
    return p


def _cfg(**kw):
    base = dict(max_kernel_ops=1, max_block_ops=5, tile_sizes=(16,), forloop_ranges=(4,), verify_error=1e-3,
                progress=False, time_limit=None, workers=2)
    base.update(kw)
    return SearchConfig(**base)


def test_serial_processes_and_ray_return_identical_graphs(cluster):
    runs = {ex: search.run(_program(), _cfg(executor=ex)) for ex in ("serial", "processes", "ray")}
    for ex, r in runs.items():
        assert r.stats["complete"], ex
        assert r.stats["executor"] == ex and not r.stats["failed_tasks"] and not r.stats["worker_failures"]
    assert runs["serial"].graph_json  # something to compare
    assert runs["serial"].graph_json == runs["processes"].graph_json == runs["ray"].graph_json
    assert runs["serial"].origins == runs["ray"].origins
    assert runs["serial"].stats["search"] == runs["ray"].stats["search"]


def _wait_until_dead(actor, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_lost_actor_is_a_death_not_an_error(cluster):
    p, cfg = _program(), _cfg()
    root = Searcher(p, cfg)
    tasks = [t.to_json() for t in root.root_tasks(1)]
    ex = RayExecutor(1)
    ex.start(shared_state(p, cfg, root))
    try:
        ex.submit(0, {"kind": "search", "task": tasks[0], "deadline": None})
        out, end = [], time.monotonic() + 60
        while not out and time.monotonic() < end:
            out = ex.wait(0.5)
        assert out[0].value is not None
        (actor,) = ex._idle
        ray.kill(actor, no_restart=True)
        _wait_until_dead(actor)  # ray.kill is asynchronous: a call sent at once may still be served
        ex.submit(1, {"kind": "search", "task": tasks[1], "deadline": None})
        out, end = [], time.monotonic() + 60
        while not out and time.monotonic() < end:
            out = ex.wait(0.5)
        assert out[0].index == 1 and out[0].died and out[0].error.startswith("Ray actor lost")
        assert ex.busy() == [] and ex.idle() == 1
        ex.submit(1, {"kind": "search", "task": tasks[1], "deadline": None})  # a new actor takes it
        out, end = [], time.monotonic() + 60
        while not out and time.monotonic() < end:
            out = ex.wait(0.5)
        assert out[0].value is not None
    finally:
        ex.close()


def test_more_workers_than_cluster_cpus_still_finish(cluster):
    """Actors beyond the cluster's CPUs would never be scheduled: the executor uses at most that many."""
    r = search.run(_program(), _cfg(executor="ray", workers=5, time_limit=60.0))
    assert r.stats["complete"] and r.graph_json
