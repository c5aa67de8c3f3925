"""``graph_budget``: a compiled graph's pieces share one budget of search and tuning, so a
model's cold compile is bounded whatever its size; the share depends only on the graph's
distinct pieces and their weights (one, and one per matmul or reduction), so a warm compile
looks up the keys the cold one stored."""

import time

import pytest
import torch

import mugraph.frontend.run as run
from mugraph.core.errors import ConfigError
from mugraph.frontend import FrontendOptions, from_torch
from mugraph.frontend.options import (MIN_PIECE_S, TUNE_PER_SEARCH, piece_seconds, piece_weight, repeat_weights,
                                      search_weight, share_limits)


def _two_pieces():
    """A captured graph of two pieces of different shapes (each moves ≥ 256 KB) and a
    cosine after them (a small piece)."""
    def f(x, w1, w2):
        a = torch.exp(x @ w1) * 2
        b = torch.exp(a[:, :256] @ w2) * 3
        return torch.cos(b)

    g = torch.Generator().manual_seed(0)
    return from_torch(f, torch.randn(4, 512, generator=g), torch.randn(512, 512, generator=g),
                      torch.randn(256, 512, generator=g))


def test_each_distinct_piece_gets_its_share_of_the_budget():
    o = FrontendOptions()
    assert o.graph_budget == 128.0 and o.time_limit == 30.0 and TUNE_PER_SEARCH == 0.6
    assert piece_seconds(10.0) == 16.0 and piece_seconds(MIN_PIECE_S) == 2 * MIN_PIECE_S
    two = o.for_pieces({"a": 1, "b": 1})
    assert two["a"] is o and two["b"] is o            # 128 / 1.6 / 2 = 40 s: the piece's own 30 s is less
    # a LLaMA decode step's searched pieces: attention 5, projections 2, the rest 3 (weights sum to 16)
    shares = o.for_pieces({"attn": 5, "o": 2, "gate_up": 3, "down": 2, "qkv": 4})
    assert shares["o"].time_limit == pytest.approx(10.0) and shares["attn"].time_limit == pytest.approx(25.0)
    assert shares["o"].key() != o.key()               # another limit is another result
    assert FrontendOptions(graph_budget=None).for_pieces({"a": 1})["a"].time_limit == 30.0
    for bad in (0, -1, True, "60"):
        with pytest.raises(ConfigError, match="graph_budget"):
            FrontendOptions(graph_budget=bad)


def test_the_least_shares_are_paid_out_of_the_budget_first():
    """Pieces that weigh nothing (small, or a reshape of a computed value under
    ``unfused="lower"``) get :data:`MIN_PIECE_S` each, and the weighed ones share what those
    leave: the searches and tuning add up to the budget, not past it."""
    o = FrontendOptions()
    weights = {"attn": 5, "o": 2, "gate_up": 3, "down": 2, "qkv": 4, **{f"rope{i}": 0 for i in range(5)}}
    shares = o.for_pieces(weights, 112.0)
    limits = {k: v.time_limit for k, v in shares.items()}
    assert all(limits[f"rope{i}"] == MIN_PIECE_S for i in range(5))
    assert sum(piece_seconds(t) for t in limits.values()) == pytest.approx(112.0, rel=1e-6)
    assert limits["o"] == pytest.approx((112 - 5 * 2 * MIN_PIECE_S) / (1 + TUNE_PER_SEARCH) * 2 / 16, rel=1e-6)
    # shares stay in proportion above the least, and at most time_limit
    assert limits["attn"] / limits["o"] == pytest.approx(2.5)
    assert o.for_pieces({"a": 1, "b": 100}, 1000.0)["b"].time_limit == 30.0
    # a budget below the least shares leaves every piece at the least (the compile warns)
    assert {v.time_limit for v in o.for_pieces(weights, 20.0).values()} == {MIN_PIECE_S}
    assert share_limits([0, 0], 100.0, 30.0) == [MIN_PIECE_S, MIN_PIECE_S]


def test_a_piece_weighs_one_and_one_per_folded_dim():
    assert piece_weight(["input", "matmul", "scale", "add", "max", "sub", "exp", "matmul", "sum", "div"]) == 5
    assert piece_weight(["input", "input", "matmul", "add"]) == 2
    assert piece_weight(["input", "mul", "tanh", "add"]) == 1


def test_the_graph_passes_the_share_to_its_pieces(monkeypatch):
    cap = _two_pieces()
    seen = []
    monkeypatch.setattr(run, "optimize_piece", lambda bp, opts, dev, **kw: seen.append(opts.time_limit))
    cap.compile(time_limit=30, graph_budget=16, device="cpu")
    w = {(bp.name, bp.layout_key): search_weight(bp.program) for bp in cap.pieces}
    assert sorted(w.values()) == [0, 3]  # the cosine alone moves 16 KB: a small piece
    # the small piece's least share (its search and tuning: 2 × MIN_PIECE_S) is paid first
    expect = {0: MIN_PIECE_S, 3: (16 - 2 * MIN_PIECE_S) / (1 + TUNE_PER_SEARCH)}
    assert seen == [pytest.approx(expect[w[(bp.name, bp.layout_key)]]) for bp in cap.pieces]


def test_a_piece_the_search_cannot_match_gets_the_least_share(monkeypatch):
    """A piece whose program reshapes a computed value (a projection's head split before its
    RoPE) has no μGraph in the search's space but itself: weight 0 — unsearched under the
    default ``unfused="torch"``, the least share under ``"lower"`` — and the budget goes to
    the pieces that can match (search.proposals.ungenerated_on_computed)."""
    import mugraph as mg
    from search.proposals import ungenerated_on_computed

    p = mg.Program("head_split")
    x, w, c = p.input("x", (1, 64)), p.input("w", (64, 32)), p.input("c", (1, 2, 1, 16))
    p.output(mg.reshape(x @ w, (1, 2, 1, 16)) * c)
    assert ungenerated_on_computed(p) == "reshape of matmul" and search_weight(p) == 0
    q = mg.Program("input_view")                      # a reshape of an input is an iterator's view
    x, w = q.input("x", (1, 1024)), q.input("w", (256, 1024))
    q.output(w @ mg.reshape(x, (1024, 1)))
    assert ungenerated_on_computed(q) is None and search_weight(q) == 2

    c = torch.randn(2, 1, 128)

    def f(x, w1, w2):
        a = torch.exp(x @ w1) * 2                     # a piece that can match
        h = (x @ w2).view(4, 2, 128).transpose(0, 1)  # heads split, then moved: RoPE's layout
        return a, torch.exp(h) * c                    # (a piece that holds the split cannot match)

    g = torch.Generator().manual_seed(0)
    cap = from_torch(f, torch.randn(4, 256, generator=g), torch.randn(256, 256, generator=g),
                     torch.randn(256, 256, generator=g))
    seen = {}
    monkeypatch.setattr(run, "optimize_piece", lambda bp, opts, dev, **kw: seen.__setitem__(bp.name, opts.time_limit))
    weights = {bp.name: search_weight(bp.program) for bp in cap.pieces}
    assert sorted(weights.values()) == [0, 2], weights
    matchable = next(n for n, w in weights.items() if w)
    # unfused="torch" (the default): the other piece is not searched, the matchable one gets it all
    cap.compile(time_limit=30, graph_budget=16, device="cpu")
    assert seen[matchable] == pytest.approx(16 / (1 + TUNE_PER_SEARCH))
    # unfused="lower": it is searched at the least share, paid first
    cap.compile(time_limit=30, graph_budget=16, device="cpu", unfused="lower")
    for bp in cap.pieces:
        want = MIN_PIECE_S if weights[bp.name] == 0 else (16 - 2 * MIN_PIECE_S) / (1 + TUNE_PER_SEARCH)
        assert seen[bp.name] == pytest.approx(want), (bp.describe(), seen)


def test_a_piece_the_search_cannot_match_is_not_searched(monkeypatch, caplog):
    """Under ``unfused="torch"`` (the default) a piece whose program reshapes a computed
    value stays torch code without a search — its only μGraph, the program op by op, would
    stay torch code anyway — reserves nothing on the graph's clock and says why in one log
    line and in ``bp.info``; under ``unfused="lower"`` it is searched, for that lowering."""
    import logging

    c = torch.randn(2, 1, 128)

    def f(x, w1, w2):
        a = torch.exp(x @ w1) * 2
        h = (x @ w2).view(4, 2, 128).transpose(0, 1)
        return a, torch.exp(h) * c

    g = torch.Generator().manual_seed(0)
    cap = from_torch(f, torch.randn(4, 256, generator=g), torch.randn(256, 256, generator=g),
                     torch.randn(256, 256, generator=g))
    (split,) = [bp for bp in cap.pieces if search_weight(bp.program) == 0]
    searched = []
    monkeypatch.setattr(run, "_search", lambda bp, *a, **kw: searched.append(bp.name) or False)
    run.forget()
    opts = FrontendOptions(time_limit=30, graph_budget=16)
    assert run.new_search_s(split, opts, "cpu") == 0.0
    with caplog.at_level(logging.INFO, logger="mugraph"):
        cap.compile(opts, device="cpu")
    assert split.name not in searched and len(searched) == 1
    assert split.info["runs"] == "torch" and "not searched" in split.info["why"] and "reshape of" in split.info["why"]
    assert sum("not searched" in m for m in caplog.messages) == 1
    run.forget()
    searched.clear()
    cap.compile(FrontendOptions(time_limit=30, graph_budget=16, unfused="lower"), device="cpu")
    assert split.name in searched
    run.forget()


def test_a_budget_below_the_searches_least_time_is_said_at_the_start(monkeypatch, caplog):
    """Each new search takes at least its time limit (never cut; at least ``MIN_PIECE_S``):
    a ``graph_budget`` below their sum cannot hold, and one warning says so before they
    start, not only the overrun after."""
    import logging

    def f(x, w, y):
        return torch.exp(x @ w) * 2, torch.exp(y * 3) + 1

    g = torch.Generator().manual_seed(0)
    cap = from_torch(f, torch.randn(4, 512, generator=g), torch.randn(512, 512, generator=g),
                     torch.randn(4, 8, generator=g))
    monkeypatch.setattr(run, "optimize_piece", lambda bp, opts, dev, **kw: None)
    monkeypatch.setattr(run, "_is_cached", lambda *a: False)
    run.forget()
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        cap.compile(time_limit=30, graph_budget=3, device="cpu")   # two searches of at least 2 s each
    said = [m for m in caplog.messages if "graph_budget=3" in m and "least" in m]
    assert len(said) == 1 and "2 new searches" in said[0], caplog.messages
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        cap.compile(time_limit=30, graph_budget=16, device="cpu")  # 10 s and 2 s fit in 16
    assert not [m for m in caplog.messages if "least" in m]


def test_a_small_piece_gets_the_least_share(monkeypatch):
    """A piece that moves less than ``SMALL_PIECE_BYTES`` is bound by its launches: weight 0,
    the least share, the budget to the pieces that move data; a graph of small pieces only
    shares its budget equally."""
    from mugraph.frontend.options import SMALL_PIECE_BYTES

    def f(x, w, y):
        return torch.exp(x @ w) * 2, torch.exp(y * 3) + 1  # a projection of 1 MB, a small element-wise piece

    g = torch.Generator().manual_seed(0)
    big = from_torch(f, torch.randn(4, 512, generator=g), torch.randn(512, 512, generator=g),
                     torch.randn(4, 8, generator=g))
    moved = {bp.name: sum(t.nbytes for t in (*bp.program.inputs, *bp.program.outputs)) for bp in big.pieces}
    weights = {bp.name: search_weight(bp.program) for bp in big.pieces}
    assert sorted(weights.values()) == [0, 2] and all((weights[n] == 0) == (moved[n] < SMALL_PIECE_BYTES)
                                                      for n in weights), (weights, moved)
    seen = {}
    monkeypatch.setattr(run, "optimize_piece", lambda bp, opts, dev, **kw: seen.__setitem__(bp.name, opts.time_limit))
    big.compile(time_limit=30, graph_budget=16, device="cpu")
    assert sorted(seen.values()) == [MIN_PIECE_S, pytest.approx((16 - 2 * MIN_PIECE_S) / (1 + TUNE_PER_SEARCH))], seen
    small = from_torch(f, torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g),
                       torch.randn(4, 8, generator=g))
    seen.clear()
    small.compile(time_limit=30, graph_budget=16, device="cpu")
    assert len(seen) == 2 and set(seen.values()) == {5.0}, seen


def test_a_piece_left_to_torch_when_nothing_is_verified_skips_the_programs_checks():
    """With ``unfused="torch"`` a piece whose search verified nothing runs torch's ops, so
    its program is neither float-checked nor timed (``time_program``); with
    ``unfused="lower"`` the lowered program runs and is checked as before. The choice is part
    of the result's key."""
    torch_opts, lower_opts = FrontendOptions(), FrontendOptions(unfused="lower")
    assert torch_opts.optimize_config()["time_program"] is False
    assert lower_opts.optimize_config()["time_program"] is True
    assert torch_opts.key() != lower_opts.key()


def test_the_graph_clock_keeps_the_later_pieces_time():
    """A piece must be done by the graph's end less the nominal seconds of the new searches
    after it, so its slack never eats into theirs; cached pieces reserve nothing."""
    from mugraph.frontend.options import GraphClock

    c = GraphClock(100.0, [20.0, 0.0, 40.0])
    assert [c.stop_by(i) - c.t0 for i in range(3)] == [pytest.approx(60.0), pytest.approx(60.0),
                                                       pytest.approx(100.0)]
    assert c.overrun_s() == 0.0
    assert GraphClock(None, [20.0]).stop_by(0) is None


def test_the_graph_clock_reserves_each_pieces_work_after_its_search():
    """The work after a search (lowering, timing: ``after_s`` a distinct piece) comes after
    each piece's stop, and the pieces from it on keep theirs."""
    from mugraph.frontend.options import GraphClock

    c = GraphClock(100.0, [20.0, 0.0, 40.0], after_s=1.0)
    assert [c.stop_by(i) - c.t0 for i in range(3)] == [pytest.approx(60.0), pytest.approx(61.0),
                                                       pytest.approx(102.0)]


def test_the_graph_clock_ends_earlier_when_told_never_later():
    """``end_hint`` (the compile ahead's measure of Inductor): asked at each piece's start
    until it knows; an earlier end moves every later stop by as much, a later one is ignored."""
    from mugraph.frontend.options import GraphClock

    answers = [None, "early"]
    c = GraphClock(100.0, [20.0, 20.0, 20.0], end_hint=lambda: (lambda a: None if a is None else c.t0 + 70.0)(
        answers.pop(0)))
    assert c.stop_by(0) - c.t0 == pytest.approx(60.0)  # not known yet
    assert c.stop_by(1) - c.t0 == pytest.approx(50.0) and c.moved_s == pytest.approx(30.0)
    assert c.stop_by(2) - c.t0 == pytest.approx(70.0) and not answers  # learnt once
    late = GraphClock(100.0, [20.0], end_hint=lambda: late.t0 + 500.0)
    assert late.stop_by(0) - late.t0 == pytest.approx(100.0) and late.moved_s == 0.0
    assert GraphClock(None, [20.0], end_hint=lambda: 0.0).stop_by(0) is None


def test_the_graph_hands_each_piece_its_stop(monkeypatch):
    cap = _two_pieces()
    seen = []
    monkeypatch.setattr(run, "optimize_piece",
                        lambda bp, opts, dev, stop_by=None: seen.append((opts.time_limit, stop_by - time.time())))
    cap.compile(time_limit=30, graph_budget=16, device="cpu", cache_dir=False)
    limits = [s for s, _ in seen]
    assert sorted(limits) == [MIN_PIECE_S, pytest.approx(7.5)]
    # on the CPU a piece asks for its search's limit alone: the first is done 2 s before the end;
    # the second, later by the work the first did after its search (none here) and kept its own
    from mugraph.frontend.options import PIECE_AFTER_SEARCH_S

    assert seen[0][1] == pytest.approx(16 - limits[1], abs=1.0)
    assert seen[1][1] == pytest.approx(16 + PIECE_AFTER_SEARCH_S, abs=1.0)


def test_the_compile_budget_cuts_a_large_graphs_searches():
    """``compile_budget``: the searches get ``graph_budget`` cut to what the rest of the
    compile is predicted to leave — capture and Inductor by the graph's ATen ops, lowering
    and timing by its distinct pieces. A decoder layer keeps its 128 s; a whole 7-8B model's
    searches get about 100 s."""
    from mugraph.frontend.options import COMPILE_S_PER_OP, PIECE_AFTER_SEARCH_S

    o = FrontendOptions()
    assert o.compile_budget == 160.0
    assert o.search_budget(65, 8) == 128.0                          # a decoder layer
    whole = o.search_budget(2285, 13)                               # a whole LLaMA-3-8B
    assert whole == pytest.approx(160 - 2285 * COMPILE_S_PER_OP - 13 * PIECE_AFTER_SEARCH_S) and 90 < whole < 110
    assert FrontendOptions(compile_budget=None).search_budget(2285, 13) == 128.0
    assert FrontendOptions(graph_budget=None).search_budget(2285, 13) is None
    assert FrontendOptions(compile_budget=10).search_budget(2285, 13) == MIN_PIECE_S
    layer = {"attn": 5, "o": 2, "gate_up": 3, "down": 2, "qkv": 4}
    assert o.for_pieces(layer, whole)["o"].time_limit == pytest.approx(whole / (1 + TUNE_PER_SEARCH) * 2 / 16)
    for bad in (0, -1, True, "60"):
        with pytest.raises(ConfigError, match="compile_budget"):
            FrontendOptions(compile_budget=bad)
    # a graph_budget the caller names is taken as given, unless they name a compile_budget too
    assert FrontendOptions.of({"graph_budget": 600}).search_budget(2285, 13) == 600
    assert FrontendOptions.of({"graph_budget": 600, "compile_budget": 160}).search_budget(2285, 13) == whole


def test_a_piece_called_more_often_gets_more_of_the_budget():
    """Shares grow with how often the graph calls a piece (``repeat_weights``): three identical
    projections and one of another shape, equal in weight, share the budget 3 : 1; a graph
    whose pieces are each called once keeps the shares its weights give."""
    assert repeat_weights({"layer": 3, "first": 3, "small": 0}, {"layer": 32, "first": 1, "small": 32}) == \
        {"layer": 3.0, "first": 3 / 32, "small": 0.0}
    assert repeat_weights({"a": 5, "b": 2}, {"a": 1, "b": 1}) == {"a": 5, "b": 2}

    def f(x, w1, w2, w3, w4):
        return tuple(torch.exp(x @ w) * 2 for w in (w1, w2, w3)) + (torch.exp(x[:, :256] @ w4) * 3,)

    g = torch.Generator().manual_seed(0)
    cap = from_torch(f, torch.randn(4, 512, generator=g), *[torch.randn(512, 512, generator=g) for _ in range(3)],
                     torch.randn(256, 512, generator=g))
    calls = {k: sum((bp.name, bp.layout_key) == k for bp in cap.pieces) for k in cap.distinct()}
    assert sorted(calls.values()) == [1, 3]
    (once,), (thrice,) = [k for k, n in calls.items() if n == 1], [k for k, n in calls.items() if n == 3]
    assert search_weight(cap.distinct()[once].program) == search_weight(cap.distinct()[thrice].program)
    shares = cap.plan(FrontendOptions(time_limit=30, graph_budget=30, cache_dir=False), "cpu").shares
    assert shares[thrice].time_limit == pytest.approx(3 * shares[once].time_limit)
    assert sum(piece_seconds(o.time_limit) for o in shares.values()) == pytest.approx(30)
    # a share never drops below the least a search gets
    tight = cap.plan(FrontendOptions(time_limit=30, graph_budget=10, cache_dir=False), "cpu").shares
    assert tight[once].time_limit == MIN_PIECE_S and tight[thrice].time_limit > MIN_PIECE_S


def test_the_graph_plans_its_searches_within_the_compile_budget(monkeypatch):
    """The plan's budget, the pieces' shares and the clock's stops follow the cut budget;
    the plan depends on the graph only, so a warm compile asks for the cold one's shares."""
    from mugraph.frontend.options import COMPILE_S_PER_OP, PIECE_AFTER_SEARCH_S

    cap = _two_pieces()
    rest = len(cap.info) * COMPILE_S_PER_OP + len({(bp.name, bp.layout_key) for bp in cap.pieces}) * PIECE_AFTER_SEARCH_S
    uncut = FrontendOptions(time_limit=30, graph_budget=16, compile_budget=None, cache_dir=False)
    cut = FrontendOptions(time_limit=30, graph_budget=16, compile_budget=rest + 12, cache_dir=False)
    assert cap.plan(uncut, "cpu").budget_s == 16 and cap.plan(cut, "cpu").budget_s == pytest.approx(12)
    assert cap.plan(cut, "cpu").shares == cap.plan(cut, "cpu").shares
    seen = []
    monkeypatch.setattr(run, "optimize_piece",
                        lambda bp, opts, dev, stop_by=None: seen.append((opts.time_limit, stop_by - time.time())))
    cap.compile(cut, device="cpu")
    limits = sorted(s for s, _ in seen)
    assert limits == [MIN_PIECE_S, pytest.approx(5.0)]   # (12 - 2 × 2) / 1.6: what the small piece leaves
    # the last piece's stop: the cut budget's end, and the first piece's work after its search
    # (reserved, none here) passed on
    assert seen[-1][1] == pytest.approx(12 + PIECE_AFTER_SEARCH_S, abs=1.0)


def test_a_rope_piece_whose_only_product_permutes_is_not_searched():
    """RoPE's rotate-half is captured as ``x @ R``, ``R`` a signed permutation the capture
    makes: a piece whose only products are such is not searched under ``unfused="torch"``
    (a μGraph would multiply by ``R``, its torch ops index), and says so. Near misses are
    searched: the same rotation after a projection in one piece, and any piece under
    ``unfused="lower"``."""
    def rope(q, cos, sin):
        return q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin

    def projected(x, w, cos, sin):
        return rope(x @ w, cos, sin)

    g = torch.Generator().manual_seed(0)
    q, cos, sin = (torch.randn(1, 4, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g),
                   torch.randn(1, 1, 1, 16, generator=g))
    (bp,) = from_torch(rope, q, cos, sin).pieces
    assert "matmul" in {op.kind for op in bp.program.ops}
    why = run.unsearched(bp, FrontendOptions())
    assert why is not None and "signed permutation" in why
    assert run.unsearched(bp, FrontendOptions(unfused="lower")) is None
    (both,) = from_torch(projected, torch.randn(1, 16, generator=g), torch.randn(16, 16, generator=g),
                         cos[0, 0], sin[0, 0]).pieces
    assert [op.kind for op in both.program.ops].count("matmul") == 2
    assert run.unsearched(both, FrontendOptions()) is None
    assert not run._signed_permutation(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    assert run._signed_permutation(torch.tensor([[0.0, -1.0], [1.0, 0.0]]))


def test_the_pieces_end_is_learnt_from_the_compile_ahead():
    """Once the child has compiled the graph without its pieces, the pieces must be done by
    ``compile_budget`` from the compile's start less what Inductor is then expected to take
    on the graph with them and the whole-graph rule's timing; nothing is learnt before, or
    without a compile ahead or a ``compile_budget``."""
    from mugraph.frontend.backend import pieces_end
    from mugraph.frontend.options import GRAPH_RULE_TIMING_S, INDUCTOR_PER_AHEAD_OUTLINED_S, INDUCTOR_PER_AHEAD_S

    class Ahead:
        took = None

        def compile_s(self):
            return self.took

    job = Ahead()
    end = pieces_end(job, FrontendOptions(), started=1000.0)
    assert end() is None
    job.took = 40.0
    assert end() == pytest.approx(1000.0 + 160.0 - 40.0 * INDUCTOR_PER_AHEAD_S - GRAPH_RULE_TIMING_S)
    once = pieces_end(job, FrontendOptions(), started=1000.0, outlined=True)  # identical layers compiled once
    assert once() == pytest.approx(1000.0 + 160.0 - 40.0 * INDUCTOR_PER_AHEAD_OUTLINED_S - GRAPH_RULE_TIMING_S)
    assert once() > end()
    assert pieces_end(None, FrontendOptions(), 0.0) is None
    assert pieces_end(job, FrontendOptions(compile_budget=None), 0.0) is None


def test_a_piece_too_large_to_verify_is_not_searched_and_takes_no_share(monkeypatch):
    """A piece whose program the verifier cannot evaluate even in slices (a large
    vocabulary's LM head) is refused by ``superoptimize`` at once: it is not searched, in
    either ``unfused`` mode, takes no share of the graph's budget and is no new search of a
    warm compile."""
    from mugraph.core import limits

    cap = _two_pieces()
    small, large = sorted(cap.distinct().values(), key=lambda bp: max(t.numel for op in bp.program.ops
                                                                       for t in op.outputs))
    biggest = max(t.numel for op in large.program.ops for t in op.outputs)
    assert run.unsearched(large, FrontendOptions()) is None
    monkeypatch.setattr(limits, "MAX_EVAL_ELEMENTS", biggest - 1)
    if max(t.numel for op in small.program.ops for t in op.outputs) >= biggest:
        pytest.skip("the two pieces hold values of one size")
    for opts in (FrontendOptions(), FrontendOptions(unfused="lower")):
        why = run.unsearched(large, opts)
        assert why is not None and "too large to verify" in why and "MAX_EVAL_ELEMENTS" in why
    plan = cap.plan(FrontendOptions(time_limit=30, graph_budget=16, cache_dir=False), "cpu")
    assert plan.nominal_s[plan.position[(large.name, large.layout_key)]] == 0.0
    assert plan.nominal_s[plan.position[(small.name, small.layout_key)]] > 0.0
