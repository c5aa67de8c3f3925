"""A search run's state record: the clock's ends, and what a piece search inherits from
the search it serves (passed explicitly, no thread-local stack)."""

import time

import mugraph as mg
from search import driver
from search.config import SearchConfig
from search.run_state import Clock, Outer, RunState


def _program():
    p = mg.Program("tiny")
    p.output(mg.exp(p.input("x", (4, 8))) * 2)
    return p


def test_a_piece_search_never_outlives_the_search_it_serves():
    cfg = SearchConfig(time_limit=100.0, verify_reserve=10.0, progress=False, executor="serial")
    top = Clock.start(cfg, None)
    assert 99.0 < top.t_end - time.monotonic() <= 100.0 and top.t_end - top.deadline == 10.0
    soon = time.monotonic() + 5.0
    piece = Clock.start(cfg, Outer(soon, None))
    # the inherited end is the nearer one; the reserve is at most 30 % of what is left
    assert piece.t_end == soon and abs(piece.t_end - piece.deadline - 1.5) < 0.01
    unlimited = Clock.start(SearchConfig(time_limit=None, progress=False), Outer(soon, None))
    assert unlimited.t_end == soon
    assert Clock.start(SearchConfig(time_limit=None, progress=False), Outer(None, None)).t_end is None


def test_the_piece_searcher_hands_on_the_end_and_the_progress(monkeypatch):
    """What the compositional search calls for each piece carries the outer end and bar;
    its searches are nested (Ctrl-C is the outer search's)."""
    cfg = SearchConfig(time_limit=60.0, progress=False, executor="serial")
    state = RunState.start(_program(), cfg)
    assert not state.nested
    seen = []
    real = RunState.start

    def spy(program, cfg, estimate=None, outer=None, checker=None):
        st = real(program, cfg, estimate, outer, checker)
        seen.append(st)
        return st

    monkeypatch.setattr(RunState, "start", staticmethod(spy))
    piece_cfg = SearchConfig(max_kernel_ops=1, max_block_ops=3, tile_sizes=(4,), forloop_ranges=(1,),
                             executor="serial", progress=False, verify=False)
    driver._piece_search(state)(_program(), piece_cfg)
    assert len(seen) == 1 and seen[0].nested and seen[0].outer == Outer(state.clock.t_end, state.bar)
    assert seen[0].clock.t_end <= state.clock.t_end
