"""superoptimize's defaults around the search: a bounded default limit, a checkpoint in the
cache folder by default, Ctrl-C returning what was verified so far (never cached), and a
rerun resuming the search from the checkpoint."""

import os
import signal
import threading
import time

import pytest

import mugraph as mg
import search
from mugraph.core.benchmarks import program
from mugraph.pipeline import DEFAULT_TIME_LIMIT, Interrupted


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _cfg(limit):
    return {"search": {"workers": 2, "time_limit": limit, "max_kernel_ops": 1, "max_block_ops": 8,
                       "max_results": 1}}


def test_default_limit_is_the_search_default():
    assert DEFAULT_TIME_LIMIT == search.SearchConfig().time_limit == 300.0
    assert "300 s" in mg.superoptimize.__doc__


def test_ctrl_c_keeps_the_checkpoint_and_a_rerun_resumes(tmp_path):
    p = program("rmsnorm_matmul", small=True, dtype="float32")
    ckdir = tmp_path / "checkpoints"
    fired = threading.Event()

    def ctrl_c_once_checkpointed():
        end = time.monotonic() + 120
        while time.monotonic() < end and not fired.is_set():
            if ckdir.exists() and any(ckdir.glob("*.ckpt.json")):
                fired.set()
                os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does to this process
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=ctrl_c_once_checkpointed, daemon=True)
    watcher.start()
    try:
        opt = mg.superoptimize(p, _cfg(120.0), device="cpu", cache_dir=tmp_path, progress=False)
    except Interrupted as e:  # nothing verified yet: a one-line error
        assert "interrupted before any μGraph of 'rmsnorm_matmul' was verified" in str(e)
        assert "\n" not in str(e)
    else:
        assert opt.report["interrupted"] and opt.best.origin == "search"
        assert "interrupted" in opt.report["why"]
    watcher.join(5)
    assert fired.is_set()
    assert not list(tmp_path.glob("*.mug.json"))  # a partial answer is never cached
    (ck,) = ckdir.glob("rmsnorm_matmul-*.ckpt.json")
    # another time limit is another cache entry but the same search: it resumes from the checkpoint
    again = mg.superoptimize(p, _cfg(6.0), device="cpu", cache_dir=tmp_path, progress=False)
    st = again.report["search"]["stats"]
    assert st["tasks_resumed"] > 0 and not again.report["interrupted"]
    assert list(tmp_path.glob("*.mug.json"))
