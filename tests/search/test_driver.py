"""search.run: verified results, determinism, checkpoint/resume (and refusal of foreign or
corrupt checkpoints), JSON round trip, task failures, progress bar, defaults."""

import io
import json
import sys
from collections import Counter

import pytest

import mugraph as mg
import search
from search import CheckpointError, SearchConfig, SearchResult
from search import run_state as run_state_mod
from search import verification as verification_mod
from search.executors import Outcome, SerialExecutor


def _program():
    p = mg.Program("expmm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32)); V = p.input("V", (64, 32))
    p.output(mg.exp(X @ W) * (X @ V))
    return p


def _cfg(**kw):
    base = dict(max_kernel_ops=1, max_block_ops=5, tile_sizes=(16,), forloop_ranges=(4,), executor="serial",
                verify_error=1e-3, progress=False)
    base.update(kw)
    return SearchConfig(**base)


def test_finds_single_kernel_and_is_deterministic(tmp_path):
    a = search.run(_program(), _cfg())
    assert a.stats["complete"]
    assert a.graphs and any(g.num_kernels == 1 for g in a.graphs)
    for g in a.graphs[:3]:
        assert g.num_kernels >= 1
    b = search.run(_program(), _cfg(executor="processes", workers=2))
    assert a.graph_json == b.graph_json
    assert b.stats["executor"] == "processes" and not b.stats["failed_tasks"] and not b.stats["worker_failures"]
    p = a.save(tmp_path / "r.json")
    c = SearchResult.load(p)
    assert c.graph_json == a.graph_json and c.stats == json.loads(json.dumps(a.stats))


def test_worker_processes_share_the_fingerprint_draws_through_a_directory_removed_at_the_end(monkeypatch):
    from verify import shared_draws
    from search.worker import WorkerState, shared_state

    made, seen = [], []
    real = shared_draws.temporary

    def recording(*a, **k):
        ctx = real(*a, **k)
        made.append(ctx)
        return ctx

    monkeypatch.setattr(shared_draws, "temporary", recording)
    real_state = run_state_mod.shared_state

    def spy(program, cfg, root):
        state = real_state(program, cfg, root)
        seen.append(state["draws"])
        return state

    monkeypatch.setattr(run_state_mod, "shared_state", spy)
    r = search.run(_program(), _cfg(executor="processes", workers=2))
    assert r.graphs and len(made) == 1 and seen and seen[0]
    assert shared_draws.directory() is None and not __import__("os").path.exists(seen[0])
    # a worker given that state maps the driver's files (here: a directory that exists)
    with real() as d:
        root = run_state_mod.Searcher(_program(), _cfg())
        state = {**shared_state(_program(), _cfg(), root), "draws": str(d)}
        shared_draws.use(None)
        WorkerState(state)
        assert shared_draws.directory() == d
    # a serial search runs in one process: nothing to share
    search.run(_program(), _cfg())
    assert len(made) == 1


def test_checkpoint_resume_gives_same_result(tmp_path):
    # the enumeration and its verification only: the derived graphs (split and tile
    # variants) are fingerprinted in a share of the time left, which 0.3 s does not leave
    full = search.run(_program(), _cfg(split_loops=False))
    ck = str(tmp_path / "ck.json")
    part = search.run(_program(), _cfg(checkpoint=ck, time_limit=0.3, split_loops=False))
    assert not part.stats["complete"] or part.graph_json == full.graph_json
    resumed = search.run(_program(), _cfg(checkpoint=ck, split_loops=False))
    assert resumed.stats["complete"]
    assert resumed.graph_json == full.graph_json


def test_a_match_left_unverified_for_time_makes_the_search_incomplete(monkeypatch):
    """``complete`` means more time would give the same graphs: a verification skipped at the
    time limit leaves the search incomplete (its resume verifies the rest), named in
    ``cut_phases``. (A loaded machine's 0.3 s run had reported itself complete with one graph
    fewer than the unhurried run.)"""
    from search.run_state import VerifyCost

    full = search.run(_program(), _cfg(split_loops=False))
    assert full.stats["complete"] and full.stats["cut_phases"] == []
    fits = VerifyCost.fits
    monkeypatch.setattr(VerifyCost, "fits", lambda self: fits(self) and len(self.seconds) < 2)
    part = search.run(_program(), _cfg(split_loops=False, time_limit=120.0))
    assert part.stats["search"]["verify_skipped_time"] >= 1
    assert not part.stats["complete"] and part.stats["cut_phases"] == ["verify"]
    assert len(part.graph_json) < len(full.graph_json)


def test_a_derived_phase_cut_at_its_deadline_makes_the_search_incomplete(monkeypatch):
    """The split and tile variants are proposed within a share of the time: a phase that
    stopped there with sources left is noted (search.derive.note_cut), and the search is not
    complete though its enumeration is."""
    from search import derive

    monkeypatch.setattr(derive, "_past", lambda deadline: deadline is not None)
    r = search.run(_program(), _cfg(time_limit=120.0))
    assert r.stats["tasks_done"] == r.stats["tasks"]
    assert {"split", "retile"} <= set(r.stats["cut_phases"]) and not r.stats["complete"]


def test_generality_softmax_and_residual_norm():
    p = mg.Program("softmax")
    X = p.input("X", (16, 64))
    E = mg.exp(X)
    p.output(E / mg.sum(E, 1))
    r = search.run(p, _cfg(max_kernel_ops=1, max_block_ops=4))
    assert any(g.num_kernels == 1 for g in r.graphs)
    q = mg.Program("residual_rmsnorm")
    H = q.input("H", (8, 64)); R = q.input("R", (8, 64))
    q.output(mg.rms_norm(H + R))
    r = search.run(q, _cfg(max_kernel_ops=1, max_block_ops=7))
    assert any(g.num_kernels == 1 for g in r.graphs)


def test_generality_low_rank_chain():
    """``(X @ U) @ V`` (a rank-8 bottleneck): one kernel that recomputes the small X@U per block."""
    p = mg.Program("low_rank_chain")
    X = p.input("X", (16, 64)); U = p.input("U", (64, 8)); V = p.input("V", (8, 64))
    p.output((X @ U) @ V)
    r = search.run(p, _cfg(max_kernel_ops=1, max_block_ops=4))
    ones = [g for g in r.graphs if g.num_kernels == 1]
    assert ones
    assert any(g.ops[-1].attrs["block"].num_blocks > 1 for g in ones)


def test_iterative_deepening_and_verification_budget():
    """Phase 1 (one kernel op) comes first; only a bounded number of fingerprint
    matches is fully verified, cheapest first, per kernel count."""
    p = mg.Program("mm_exp")
    X = p.input("X", (8, 32)); W = p.input("W", (32, 16))
    p.output(mg.exp(X @ W))
    r = search.run(p, _cfg(max_kernel_ops=2, max_block_ops=3, max_verify=3, verify_per_kernels=1))
    st = r.stats
    assert st["search"]["verifications"] <= 3
    ks = [g.num_kernels for g in r.graphs]
    assert ks and ks[0] == 1 and ks == sorted(ks) and len(set(ks)) == len(ks)
    # the matches are the enumeration's and the derived ones (split-loop and tile variants of any match)
    derived = sum(st["derived"].get(k, 0) for k in ("split_matches", "composed_matches", "retile_matches"))
    assert st["search"]["fingerprint_matches"] + derived == sum(n for _, n in st["fingerprint_matches_by_kernels"])
    assert (st["search"]["unverified_matches"]
            == st["search"]["fingerprint_matches"] + derived - st["search"]["verifications"])
    assert set(st["phase_complete_seconds"]) == {1, 2}


def test_checkpoint_of_another_program_or_config_is_refused(tmp_path):
    ck = tmp_path / "ck.json"
    search.run(_program(), _cfg(checkpoint=str(ck), max_block_ops=3))
    before = ck.read_text()
    with pytest.raises(CheckpointError, match=r"another search config: max_block_ops=3 \(now 4\).*delete it"):
        search.run(_program(), _cfg(checkpoint=str(ck), max_block_ops=4))
    other = mg.Program("other")
    X = other.input("X", (8, 64)); W = other.input("W", (64, 32))
    other.output(mg.exp(X @ W))
    with pytest.raises(CheckpointError, match=r"written for program 'expmm', not for this 'other'"):
        search.run(other, _cfg(checkpoint=str(ck), max_block_ops=3))
    assert ck.read_text() == before  # refused, not overwritten
    # what does not change the result (workers, executor, time limit) may change on resume
    again = search.run(_program(), _cfg(checkpoint=str(ck), max_block_ops=3, time_limit=100.0))
    assert again.stats["tasks_resumed"] == again.stats["tasks"]


def test_checkpoint_of_other_code_is_refused(tmp_path, monkeypatch):
    """A checkpoint written by other mugraph code (another code fingerprint: an upgrade, a
    local edit) is not resumed — its search may split or accept work differently — and
    is left as it was; the same code resumes it."""
    from search import checkpoint as ck_mod

    ck = tmp_path / "ck.json"
    search.run(_program(), _cfg(checkpoint=str(ck), max_block_ops=3))
    before = ck.read_text()
    assert json.loads(before)["code"] == ck_mod.code_fingerprint()
    monkeypatch.setattr(ck_mod, "code_fingerprint", lambda: "c0de" * 16)
    with pytest.raises(CheckpointError, match=r"written by other mugraph code \(code fingerprint \w{12}… ≠ "
                                              r"c0dec0dec0de…\).*delete it") as e:
        search.run(_program(), _cfg(checkpoint=str(ck), max_block_ops=3))
    assert "\n" not in str(e.value) and ck.read_text() == before  # refused, not overwritten
    monkeypatch.undo()
    again = search.run(_program(), _cfg(checkpoint=str(ck), max_block_ops=3))
    assert again.stats["tasks_resumed"] == again.stats["tasks"]


@pytest.mark.parametrize("content", ["", '{"format": "mugraph-search-checkpoint", "version": 2, "done": {"0": ',
                                     "[1, 2]", '{"format": "mugraph-search-checkpoint", "version": 1}', "\xff\xfe"])
def test_corrupt_checkpoint_is_one_line_error(tmp_path, content):
    ck = tmp_path / "ck.json"
    ck.write_bytes(content.encode("latin-1"))
    with pytest.raises(CheckpointError) as e:
        search.run(_program(), _cfg(checkpoint=str(ck)))
    msg = str(e.value)
    assert "\n" not in msg and str(ck) in msg and "delete it or pass another checkpoint path" in msg
    assert isinstance(e.value, mg.MugraphError)


def test_task_errors_and_lost_workers_are_reported(monkeypatch):
    """A task that raises is reported at once; a task whose worker dies is retried once, then
    reported; the other tasks' results are kept and the search is marked incomplete."""
    full = search.run(_program(), _cfg())
    calls: Counter = Counter()

    class Faulty(SerialExecutor):
        def wait(self, timeout):
            if not self._queue:
                return []
            index, payload = self._queue[0]
            calls[index] += 1
            if index == 0:
                self._queue.popleft()
                return [Outcome(index, error="worker pid 1 killed by SIGKILL", died=True)]
            if index == 1:
                self._queue.popleft()
                return [Outcome(index, error="ValueError: bad task")]
            return super().wait(timeout)

    monkeypatch.setattr(run_state_mod, "make_executor", lambda *a, state=None, **k: Faulty(state))
    r = search.run(_program(), _cfg())
    st = r.stats
    assert calls[0] == 2 and calls[1] == 1  # died: retried once; raised: not retried
    assert [f["task"] for f in st["failed_tasks"]] == [0, 1]
    assert "SIGKILL" in st["failed_tasks"][0]["error"] and st["failed_tasks"][1]["error"] == "ValueError: bad task"
    assert [(w["task"], w["retried"]) for w in st["worker_failures"]] == [(0, True), (0, False)]
    assert not st["complete"] and st["tasks_done"] == st["tasks"] - 2
    assert full.stats["complete"] and not full.stats["failed_tasks"]


def test_progress_lines_show_phase_and_time_left(capsys):
    """Captured stderr is not a terminal: plain lines, one per phase (a short search)."""
    search.run(_program(), _cfg(progress=True, time_limit=120.0, max_block_ops=3))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and [line.split(",")[0] for line in lines] == [
        "search: oracle", "search: pieces", "search: search", "search: split-loop", "search: verify", "search: done"]
    assert lines[2].endswith("s left") and "/24 tasks, " in lines[3] and " states, " in lines[-1]


def test_progress_bar_shows_phase_and_time_left(monkeypatch):
    """On a terminal, the bar."""
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    search.run(_program(), _cfg(progress=True, time_limit=120.0, max_block_ops=3))
    err = tty.getvalue()
    assert "\r" in err and "search (" in err and "s left)" in err and "verify (" in err


def test_defaults_bound_the_search():
    cfg = SearchConfig()
    assert cfg.time_limit == 300.0 and cfg.executor == "processes"
    from mugraph.pipeline import DEFAULT_TIME_LIMIT
    assert DEFAULT_TIME_LIMIT == cfg.time_limit
    assert "executor" not in cfg.key() and "time_limit" not in cfg.key()
    with pytest.raises(mg.errors.ConfigError, match="executor='threads'"):
        search.run(_program(), _cfg(executor="threads"))


def test_gpu_path_verifies_in_the_driver_after_a_warm_up(monkeypatch):
    """With a GPU the driver verifies itself, after preparing the program's side during the
    enumeration; simulated on the CPU, the graphs are those of the serial search."""
    from search.check import Checker

    warmed = []
    real_warm = Checker.warm

    def warm(self):
        warmed.append(self.program.name)
        real_warm(self)

    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: True))
    monkeypatch.setattr(Checker, "warm", warm)
    monkeypatch.setattr(verification_mod.ExecutorVerdicts, "get", lambda *a: pytest.fail("verified on a worker"))
    a = search.run(_program(), _cfg())
    b = search.run(_program(), _cfg(executor="processes", workers=2))
    assert warmed == ["expmm"]  # the serial search verifies in this process anyway: no warm-up
    assert a.graph_json == b.graph_json and b.stats["search"]["verified"] >= 1


def test_a_warm_up_past_the_time_limit_verifies_nothing_and_ends_before_the_search_returns(monkeypatch):
    """A warm-up still running at the time limit leaves no time to verify: the matches stay
    unverified and counted. The search returns only once the warm-up thread has ended — its
    GPU work must not overlap the caller's CUDA-graph captures (search.verification.settle_warm_up)."""
    import threading
    import time

    from search.check import Checker

    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: True))
    monkeypatch.setattr(Checker, "warm", lambda self: time.sleep(7))
    t0 = time.monotonic()
    r = search.run(_program(), _cfg(executor="processes", workers=2, time_limit=4.0))
    assert 7.0 <= time.monotonic() - t0 < 7.0 + 3.0
    assert not any(t.name == "mugraph-verify-warm-up" for t in threading.enumerate())
    assert not r.graphs and r.stats["search"]["verify_skipped_warm_up"] >= 1


def test_a_deadline_with_nothing_matched_moves_to_the_late_deadline(monkeypatch):
    """The verification's reserve is for matches: with none by the dispatch deadline the
    enumeration goes on until a third of the reserve before the end (the units the first
    deadline stopped run again whole), and finds what the full search finds."""
    import time

    from search.run_state import Clock

    real_start = Clock.start

    def start_at_once(cfg, outer):  # the dispatch deadline has passed before any unit runs
        c = real_start(cfg, outer)
        return Clock(c.t0, c.t_end, time.monotonic() - 1.0, c.late_deadline)

    monkeypatch.setattr(Clock, "start", staticmethod(start_at_once))
    r = search.run(_program(), _cfg(time_limit=120.0))
    assert r.stats["search"]["enumeration_extended"] == 1
    assert r.graphs and r.stats["complete"]
    assert r.graph_json == search.run(_program(), _cfg()).graph_json


def test_derived_candidates_keep_the_verification_reserve(monkeypatch):
    """A deadline passed with no enumeration match stays where it is when the search has
    derived candidates to verify (a composition's, a seed's): the reserve is theirs."""
    import time

    from search.dispatch import _moved
    from search.records import Proposal
    from search.run_state import Clock, RunState

    state = RunState.start(_program(), _cfg(time_limit=60.0))
    passed = time.monotonic() - 1.0
    state.clock = Clock(state.clock.t0, state.clock.t_end, passed, state.clock.late_deadline)
    assert _moved(state, passed) == state.clock.late_deadline  # nothing to verify: moved on
    state.derived.append(Proposal(mg.Program("any"), "composed"))
    assert _moved(state, passed) == passed


def test_a_stuck_warm_up_does_not_hang_the_search(monkeypatch, caplog):
    """The wait for the warm-up is bounded (verification.SETTLE_MAX_S): past it the search
    returns with one warning line and the thread finishes on its own."""
    import logging
    import time

    from search.check import Checker

    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: True))
    monkeypatch.setattr(Checker, "warm", lambda self: time.sleep(20))
    monkeypatch.setattr(verification_mod, "SETTLE_MAX_S", 2.0)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        r = search.run(_program(), _cfg(executor="processes", workers=2, time_limit=4.0))
    assert time.monotonic() - t0 < 4.0 + 2.0 + 3.0
    assert not r.graphs and any("warm-up" in m and "still runs" in m for m in caplog.messages)


def test_units_the_first_deadline_stopped_run_again_on_workers(monkeypatch):
    """On worker processes the units running when the dispatch deadline passes with nothing
    matched stop on their own deadline; they are queued again whole, not recorded as cut
    (dispatch._stopped_early), and the search still runs its space to the end."""
    import time

    from search.dispatch import _stopped_early
    from search.executors import Outcome
    from search.run_state import Clock

    stopped = Outcome(3, {"results": [], "stats": {}, "oracle": {"timed_out": True}})
    finished = Outcome(3, {"results": [], "stats": {}, "oracle": {"timed_out": False}})
    assert _stopped_early(stopped, given=10.0, deadline=20.0)
    assert not _stopped_early(stopped, given=20.0, deadline=20.0)   # stopped by the deadline in force
    assert not _stopped_early(finished, given=10.0, deadline=20.0)

    # a program with no μGraph in the space but itself: nothing ever matches, so the first
    # deadline (50 ms in: the workers' start alone takes longer) always moves, and every unit
    # dispatched before it stops on it and must run again for the search to complete
    p = mg.Program("head_split")
    x, w, c = p.input("x", (2, 16)), p.input("w", (16, 8)), p.input("c", (2, 2, 4))
    p.output(mg.reshape(x @ w, (2, 2, 4)) * c)
    real_start = Clock.start

    def early(cfg, outer):
        c = real_start(cfg, outer)
        return Clock(c.t0, c.t_end, time.monotonic() + 0.05, c.late_deadline)

    monkeypatch.setattr(Clock, "start", staticmethod(early))
    # workers an earlier search left idle would answer within the 50 ms: start from none
    from search import executors

    for w in executors._take_idle(1 << 10):
        executors._end(w)
    r = search.run(p, _cfg(time_limit=60.0, executor="processes", workers=2, max_block_ops=3))
    assert r.stats["search"]["enumeration_extended"] == 1 and r.stats["complete"] and r.stats["tasks_cut"] == 0
    assert r.stats["tasks_done"] == r.stats["tasks"]


def test_a_fingerprint_running_past_the_deadline_is_cut_mid_evaluation(monkeypatch):
    """A candidate's fingerprint stops at the walk's deadline between the parts it computes
    (at a 14336 × 4096 weight one took 2 s on a core and tasks ran 4 s past their deadline,
    into the verification's reserve): the enumeration ends at its deadline, the cut
    fingerprint counted and not taken for a match."""
    import time

    from verify.field import Part

    real = Part.compute

    def slow(self):  # every part of every evaluation a tenth of a second
        time.sleep(0.1)
        real(self)

    monkeypatch.setattr(Part, "compute", slow)
    limit = 4.0
    r = search.run(_program(), _cfg(time_limit=limit, verify=False))
    st = r.stats
    assert st["search"]["fingerprints_stopped"] >= 1
    deadline = limit - min(SearchConfig().verify_reserve, 0.3 * limit)
    assert st["phase_started"]["split-loop"] < deadline + 0.6
    assert st["search"]["fingerprint_matches"] <= st["search"]["fingerprints"] - st["search"]["fingerprints_stopped"]


def test_two_projections_of_different_operands_are_composed_below_the_op_count():
    """A parallel block's output (Phi-2, GPT-J): the attention's output projection and the
    MLP's second projection, each with its bias, summed with the residual — 8 ops, below
    ``compose_above``, but two loops over different operands that no kernel holds as one: the
    compositional search cuts it (an H200's 16 cores enumerated nothing in 16 s at Phi-2's
    sizes). The same program with one projection reading the other's result is not cut."""
    from search.compose import separate_contractions

    p = mg.Program("parallel_block_output")
    a, f = p.input("A", (1, 64), "float32"), p.input("f", (1, 1), "float32")
    wo, bo = p.input("Wo", (64, 64), "float32"), p.input("Bo", (64,), "float32")
    h, g = p.input("H", (1, 256), "float32"), p.input("G", (1, 256), "float32")
    w2, b2 = p.input("W2", (256, 64), "float32"), p.input("Bm", (64,), "float32")
    r = p.input("R", (1, 64), "float32")
    p.output(((a * f) @ wo + bo) + ((h * g) @ w2 + b2) + r)
    assert separate_contractions(p) and sum(op.kind != "input" for op in p.ops) == 8
    res = search.run(p, SearchConfig(time_limit=20, workers=2, progress=False))
    assert res.graphs and any(o.startswith("composed") or o == "retile" for o in res.origins), res.origins
    assert all(v and v["equivalent"] for v in res.verdicts[:1])

    chained = mg.Program("chained")
    x, w, v = (chained.input(n, s, "float32") for n, s in (("X", (1, 64)), ("W", (64, 64)), ("V", (64, 64))))
    chained.output((x @ w) @ v)
    assert not separate_contractions(chained)

    # parallel: separate, or siblings reading one activation (two projections of it); a chain is neither
    from search.compose import parallel_contractions
    siblings = mg.Program("siblings")
    x, w, v = (siblings.input(n, s, "float32") for n, s in (("X", (1, 64)), ("W", (64, 64)), ("V", (64, 32))))
    siblings.output(x @ w)
    siblings.output(x @ v)
    assert parallel_contractions(p) and parallel_contractions(siblings) and not separate_contractions(siblings)
    assert not parallel_contractions(chained)
