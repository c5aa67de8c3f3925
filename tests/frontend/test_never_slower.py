"""The never-slower rule (``FrontendOptions.never_slower``, docs/models.md): a piece runs its
μGraph only if it times faster than the piece's own torch ops, and a graph runs with its
μGraph pieces only if it times faster than without them. On a GPU the backend times
both forms itself; on the CPU nothing is timed unless a ``timer`` option is given, which is
how these tests reach the decision: a timer that calls both forms (so the launches it is
handed are real and agree) and reports the times the test wants."""

import logging

import pytest
import torch

import mugraph as mg
import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.frontend import FrontendOptions, recent_graphs
from mugraph.frontend.graph import Captured

g = torch.Generator().manual_seed(5)
W = torch.randn(8, 8, generator=g)

#: a search that cannot fuse anything, and the program lowered op by op anyway: every piece
#: runs lowered kernels (under the Triton interpreter) unless the rule says otherwise (10 s:
#: the space is small and exhausted early; 3 s ran out on a loaded 2-core machine)
QUICK = {"time_limit": 10.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower"}


def block(x):
    return torch.exp(x @ W) * 2


def two_blocks(x):
    """Two pieces of one structure and shape (a cosine has no row: torch code between them)."""
    return block(torch.cos(block(x)))


def close(a, b) -> None:
    """Equal up to float32 rounding through an ``exp``: ``exp(x @ W)`` reaches ~30 here, where the
    lowered kernel's and Inductor's sums in another order differ by ~1e-5 relative — and in
    ``two_blocks`` the cosine of the first block's outputs (some in the hundreds, where a float32
    ulp is ~6e-5) carries those roundings into the second block's exponent: the two forms then
    differ by up to ~2e-4 relative (seen once in a full run: 2.03e-4)."""
    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


class FixedTimer:
    """Runs each form once, checks they agree, and reports fixed times — ``graph_s`` (the
    μGraph form's, the torch form's) for the whole graph, when given; counts its calls."""

    def __init__(self, mugraph_s: float, torch_s: float, graph_s: tuple[float, float] | None = None) -> None:
        self.times = {"mugraph": mugraph_s, "torch": torch_s}
        self.graph_times = dict(zip(("mugraph", "torch"), graph_s)) if graph_s else self.times
        self.calls: list[str] = []

    def __call__(self, piece, launches):
        outs = {form: launch() for form, launch in launches.items()}
        mine, theirs = outs["mugraph"], outs["torch"]
        if isinstance(piece, Captured):  # the whole graph, with and without its μGraph pieces
            close(mine, theirs)
            self.calls.append("graph")
            return dict(self.graph_times)
        for k, t in zip(piece.output_index, theirs):  # the μGraph writes each distinct output once
            close(mine[k], t)
        self.calls.append(piece.name)
        return dict(self.times)


def compiled_pieces(fn, x, piece_cache, **options):
    torch._dynamo.reset()
    f = torch.compile(fn, backend="mugraph", options={**QUICK, "cache_dir": piece_cache, **options})
    with torch.no_grad():
        y = f(x)
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    return y, cap


def test_a_piece_whose_mugraph_is_slower_stays_torch_code(piece_cache, mugraph_log):
    timer = FixedTimer(mugraph_s=2e-6, torch_s=1e-6)
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(two_blocks, x, piece_cache, inductor=False, timer=timer)
    close(y, two_blocks(x))
    assert len(cap.pieces) == 2 and cap.pieces[0].name == cap.pieces[1].name
    assert cap.kept == []
    for bp in cap.pieces:
        assert bp.info["runs"] == "torch"
        assert (bp.info["mugraph_s"], bp.info["torch_s"]) == (2e-6, 1e-6)
        assert "not faster" in bp.info["why"] and "2 μs" in bp.info["why"], bp.info["why"]
    assert timer.calls == [cap.pieces[0].name, "graph"]  # identical pieces: timed once; then the trace
    assert cap.whole["runs"] == "torch" and "no piece runs a μGraph" in cap.whole["why"]  # torch.compile's
    assert "as traced it takes 2 μs" in cap.whole["why"]
    said = [m for m in mugraph_log.messages if "stays torch code" in m and "never-slower" in m]
    assert len(said) == 1 and cap.pieces[0].name in said[0]
    # the piece's program with its element-wise runs fused, lowered, is what was timed
    assert "torch (search, " in cap.report() and "not faster" in cap.report()


def test_a_faster_mugraph_runs_and_the_torch_form_is_what_inductor_makes(piece_cache, mugraph_log):
    timer = FixedTimer(mugraph_s=1e-6, torch_s=3e-6)
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(block, x, piece_cache, timer=timer)  # inductor on: the torch form compiled
    close(y, block(x))
    (bp,) = cap.pieces
    assert cap.kept == [bp] and bp.info["runs"] == "mugraph"
    assert (bp.info["mugraph_s"], bp.info["torch_s"]) == (1e-6, 3e-6)
    assert "the μGraph is faster" in bp.info["why"]
    assert any("runs its μGraph" in m for m in mugraph_log.messages)
    assert timer.calls == [bp.name, "graph"] and cap.whole["runs"] == "mugraph"
    assert "the graph: with its μGraph pieces" in cap.report()


@pytest.mark.parametrize("inductor", [False, True])
def test_a_graph_slower_with_its_pieces_runs_without_them(piece_cache, mugraph_log, inductor):
    """Each piece beats its torch ops, the graph with them loses to the graph without them
    (the fusions the cuts cost): the graph runs as torch.compile would run it."""
    timer = FixedTimer(mugraph_s=1e-6, torch_s=3e-6, graph_s=(5e-6, 4e-6))
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(two_blocks, x, piece_cache, timer=timer, inductor=inductor)
    close(y, two_blocks(x))
    assert cap.kept == cap.pieces and timer.calls[-1] == "graph"
    assert cap.whole == {"runs": "torch", "mugraph_s": 5e-6, "torch_s": 4e-6, "why": cap.whole["why"]}
    assert "runs without them (never-slower rule)" in cap.whole["why"]
    assert any("graph runs without its μGraph pieces: with its 2 μGraph pieces it takes 5 μs, without them 4 μs" in m for m in mugraph_log.messages)


def test_a_graph_that_writes_its_inputs_is_timed_on_copies_of_them(piece_cache):
    """A static KV cache is written in place every decode step: the whole-graph rule times
    such a graph on copies of the written inputs (one set per form, so both forms compute
    the same thing), and the caller's tensor sees exactly the one write of its call."""
    def grows(x, acc):
        acc.add_(block(x))  # an in-place update of an input, as a KV cache's
        return acc * 2

    timer = FixedTimer(mugraph_s=1e-6, torch_s=3e-6, graph_s=(5e-6, 4e-6))
    x, acc = torch.randn(4, 8, generator=g), torch.zeros(4, 8)
    torch._dynamo.reset()
    f = torch.compile(grows, backend="mugraph", options={**QUICK, "cache_dir": piece_cache, "timer": timer})
    with torch.no_grad():
        y = f(x, acc)
    close(acc, block(x))  # written once, not once per timing run
    close(y, 2 * block(x))
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    assert timer.calls[-1] == "graph" and cap.whole["runs"] == "torch"  # 5 μs with the pieces, 4 without
    with torch.no_grad():  # the graph chosen runs on: the next call writes the cache once more
        f(x, acc)
    close(acc, 2 * block(x))


def test_a_graph_that_advances_its_write_position_is_timed_at_the_same_position(piece_cache):
    """A cache that counts the tokens written advances its write position at every call; a
    timer runs a graph hundreds of times, and without its counter put back before each call
    the writes ran past the buffer (on a GPU: a device-side assert that ends the process)."""
    def step(x, cache, pos):
        cache.index_copy_(0, pos, block(x)[:1])  # write one row at the cache's position
        pos.add_(1)                              # and advance it, as a static cache's counter
        return block(x) + cache.sum(0)

    class ManyCalls(FixedTimer):
        def __call__(self, piece, launches):
            if isinstance(piece, Captured):
                for _ in range(40):  # past the cache's 16 slots, if nothing put the position back
                    for launch in launches.values():
                        launch()
            return super().__call__(piece, launches)

    timer = ManyCalls(mugraph_s=1e-6, torch_s=3e-6, graph_s=(4e-6, 5e-6))
    x, cache, pos = torch.randn(4, 8, generator=g), torch.zeros(16, 8), torch.tensor([3])
    torch._dynamo.reset()
    f = torch.compile(step, backend="mugraph", options={**QUICK, "cache_dir": piece_cache, "timer": timer})
    with torch.no_grad():
        y = f(x, cache, pos)
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    assert cap.whole["runs"] == "mugraph" and cap.whole["mugraph_s"] == 4e-6, cap.whole  # timed, not failed
    assert pos.item() == 4                               # the caller's position advanced once
    close(cache[3], block(x)[0])
    close(y, block(x) + block(x)[0])


def test_written_inputs_are_found_by_position():
    from mugraph.frontend.run import _copies, written_inputs

    def step(cache, x):
        cache.copy_(x)
        return x * 2

    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.func import functionalize

    # functionalized, the in-place write becomes a copy_ back into the placeholder
    gm = make_fx(functionalize(step, remove="mutations_and_views"))(torch.zeros(3), torch.ones(3))
    assert written_inputs(gm, 2) == frozenset({0})
    assert written_inputs(gm, 3) is None  # placeholders that do not line up with the arguments
    a, b = torch.zeros(2, 3).t(), torch.ones(3)
    ca, cb = _copies((a, b, 5), frozenset({0}))[:2]
    assert ca is not a and ca.stride() == a.stride() and cb is b


def test_without_a_gpu_or_a_timer_nothing_is_timed(piece_cache):
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(block, x, piece_cache, inductor=False)
    close(y, block(x))
    (bp,) = cap.pieces
    assert cap.kept == [bp] and bp.info["runs"] == "mugraph"
    assert bp.info["mugraph_s"] is None and "not timed" in bp.info["why"]
    _, cap = compiled_pieces(block, x, piece_cache, inductor=False, never_slower=False,
                             timer=FixedTimer(2e-6, 1e-6))
    assert cap.kept == cap.pieces and "never_slower=False" in cap.pieces[0].info["why"]


def test_a_timer_that_fails_leaves_the_piece_to_torch(piece_cache, caplog):
    caplog.set_level(logging.WARNING, logger="mugraph")

    def broken(piece, launches):
        return {"mugraph": 1e-6}  # no torch time

    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(block, x, piece_cache, inductor=False, timer=broken)
    close(y, block(x))
    (bp,) = cap.pieces
    assert cap.kept == [] and bp.info["runs"] == "torch"
    assert bp.info["why"].startswith("timing failed: ValueError: timer returned"), bp.info["why"]
    assert any("timing failed" in m for m in caplog.messages)


def test_the_options_are_checked():
    with pytest.raises(mg.ConfigError, match="timer=.*callable"):
        FrontendOptions.of({"timer": 3})
    with pytest.raises(mg.ConfigError, match="never_slower"):
        FrontendOptions.of({"never_slower": "yes"})
    with pytest.raises(mg.ConfigError, match="did you mean 'never_slower'"):
        FrontendOptions.of({"never_slowr": True})


#: any graph: program_won reads a candidate's origin, verdicts and times, not its graph
W_GRAPH = mg.KernelGraph("any")


def _fake_result(candidates, stats):
    from types import SimpleNamespace as NS
    best = next(c for c in candidates if c.origin == "program")
    return NS(best=best, candidates=candidates, report={"search": {"stats": stats}})


def test_program_won_says_whether_anything_was_proven():
    """The log line of a piece that stays torch code says why the program won: nothing
    proven in the time (a longer search may help), or proven μGraphs that timed slower."""
    from mugraph.frontend.run import program_won
    from mugraph.pipeline.results import Candidate

    prog = Candidate(W_GRAPH, "program", float_ok=True, measured_s=34.3e-6)
    nothing = program_won(_fake_result([prog], {"wall_seconds": 12.4, "first_match_seconds": 9.8}))
    assert nothing == "no μGraph proven in 12 s; its first fingerprint match came at 10 s"
    assert "no candidate matched" in program_won(_fake_result([prog], {"wall_seconds": 12.0}))
    slow = Candidate(W_GRAPH, "search", float_ok=True, measured_s=35.3e-6)
    bad = Candidate(W_GRAPH, "search", rejected="float check failed", float_ok=False, measured_s=1e-6)
    said = program_won(_fake_result([prog, slow, bad], {"wall_seconds": 12.0}))
    assert said == "1 μGraph(s) proven in 12 s; the fastest timed 35.3 μs, the program 34.3 μs"
    untimed = Candidate(W_GRAPH, "search", float_ok=True, measured_s=None)
    prog.measured_s = None
    assert program_won(_fake_result([prog, untimed], {})) == "1 μGraph(s) proven; the program ranked first"


def test_program_won_says_what_became_of_the_matches():
    """Matches that were not verified (the verification's preparation or the time ran out),
    or passed every field test with a bound above the target, are named: a search that
    found nothing and one whose matches were all unproven must not read alike."""
    from mugraph.frontend.run import program_won
    from mugraph.pipeline.results import Candidate

    prog = Candidate(W_GRAPH, "program", float_ok=True, measured_s=34.3e-6)
    unproven = Candidate(W_GRAPH, "search", rejected="not proven: bound 1 after 16 passing field tests (target "
                         "9.09e-13; per-test bound 1); OptimizeConfig(allow_unproven=True) would ship it")
    said = program_won(_fake_result([prog, unproven], {"wall_seconds": 18.0, "first_match_seconds": 9.1,
                                                        "search": {"verifications": 1, "verified": 1}}))
    assert said == ("no μGraph proven in 18 s; its first fingerprint match came at 9 s; of the matches, 1 passed "
                    "every field test but were not proven (not proven: bound 1 after 16 passing field tests "
                    "(target 9.09e-13; per-test bound 1))")
    late = program_won(_fake_result([prog], {"wall_seconds": 21.0, "first_match_seconds": 12.0,
                                             "search": {"verify_skipped_warm_up": 3}}))
    assert late.endswith("of the matches, 3 not verified: the program's side of the verification was not "
                         "ready by the limit")


def test_a_near_tie_stays_torch_code(piece_cache, mugraph_log):
    """A μGraph 1 % faster is within the replays' noise (run.TIE_MARGIN): the piece stays torch
    code, so a cold and a warm compile cannot decide it differently."""
    timer = FixedTimer(mugraph_s=0.99e-6, torch_s=1e-6)
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(block, x, piece_cache, inductor=False, timer=timer)
    close(y, block(x))
    assert not cap.kept and all(bp.info["runs"] == "torch" for bp in cap.pieces)
    assert any("not faster by more than 2% (never-slower rule)" in m for m in mugraph_log.messages)


class KeptTimer(FixedTimer):
    """A timer that says what it measures (``cache_key``), as the default GPU timer does: its
    verdicts are kept on disk beside the result cache."""

    cache_key = "fixed times for the tests"


def _forget_memo():
    from mugraph.frontend import run
    run.forget()


def test_a_warm_compile_reuses_the_verdicts_its_cold_compile_timed(piece_cache, mugraph_log):
    """The verdicts of the pieces and of the whole graph are kept in the cache directory
    (frontend.verdicts): a fresh process (the memo forgotten) compiling the same graph on the
    same device decides as the cold compile did without timing anything, and compiles only
    the graph form that runs. A timer without a ``cache_key`` is asked every time."""
    timer = KeptTimer(mugraph_s=1e-6, torch_s=3e-6, graph_s=(5e-6, 4e-6))
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(two_blocks, x, piece_cache, timer=timer, inductor=False)
    assert timer.calls and cap.whole["runs"] == "torch"
    first = [bp.info["runs"] for bp in cap.pieces], dict(cap.whole)
    _forget_memo()
    mugraph_log.clear()
    again = KeptTimer(mugraph_s=9e-6, torch_s=1e-6, graph_s=(1e-6, 9e-6))  # would decide otherwise
    y2, cap2 = compiled_pieces(two_blocks, x, piece_cache, timer=again, inductor=False)
    close(y2, two_blocks(x))
    assert again.calls == [] and ([bp.info["runs"] for bp in cap2.pieces], cap2.whole) == first
    assert any("timed at an earlier compile" in m for m in mugraph_log.messages)
    _forget_memo()
    plain = FixedTimer(mugraph_s=9e-6, torch_s=1e-6, graph_s=(1e-6, 9e-6))  # no cache_key: timed again
    compiled_pieces(two_blocks, x, piece_cache, timer=plain, inductor=False)
    assert plain.calls


@pytest.mark.parametrize("inductor", [False, True])
def test_the_compile_says_where_its_seconds_went(piece_cache, mugraph_log, inductor):
    """``Captured.timings`` and one log line: the capture, the pieces (their searches counted
    once for identical pieces), Inductor's compiles of the forms the whole-graph rule times,
    the rule's own timing — parts of the total, none negative."""
    timer = FixedTimer(mugraph_s=1e-6, torch_s=3e-6, graph_s=(5e-6, 4e-6))
    _, cap = compiled_pieces(two_blocks, torch.randn(4, 8, generator=g), piece_cache, timer=timer,
                             inductor=inductor)
    t = cap.timings
    assert {"capture_s", "pieces_s", "graph_rule_s", "total_s", "inductor_with_pieces_s",
            "inductor_without_s"} <= set(t) and all(v >= 0 for v in t.values())
    assert t["capture_s"] + t["pieces_s"] + t["graph_rule_s"] <= t["total_s"] + 1e-6
    assert t["inductor_with_pieces_s"] + t["inductor_without_s"] <= t["graph_rule_s"] + 1e-6
    searched, new = cap.search_seconds()
    assert new in (0, 1) and searched <= t["pieces_s"] + 1e-6  # two identical pieces: one search
    said = [m for m in mugraph_log.messages if m.startswith("mugraph: graph compiled in")]
    assert len(said) == 1 and "capture" in said[0] and "Inductor" in said[0] and "whole-graph timing" in said[0]


def test_a_piece_left_to_torch_is_announced_once_per_search(piece_cache, mugraph_log):
    """Identical pieces (a model's layers) share one search, and its verdict — the program
    op by op is best — is one log line, not one per piece."""
    _, cap = compiled_pieces(two_blocks, torch.randn(4, 8, generator=g), piece_cache, unfused="torch",
                             seed=11)  # a key of its own: no earlier test's search in this process
    assert len(cap.pieces) == 2 and cap.kept == []
    said = [m for m in mugraph_log.messages if "stays torch code: the search found nothing better" in m]
    assert len(said) == 1, said


W2 = torch.randn(8, 8, generator=g)


def mixed(x):
    """Two pieces of different structures (a cosine between them stays torch code)."""
    return torch.sigmoid(torch.cos(block(x)) @ W2) + 1.0


class SubsetTimer(KeptTimer):
    """Whole-graph times by which pieces the form being timed runs as μGraphs
    (``Captured.trial``: None for all of them): ``by_kept[frozenset of names]``; torch's 4 μs."""

    def __init__(self, by_kept) -> None:
        super().__init__(mugraph_s=1e-6, torch_s=3e-6)
        self.by_kept = by_kept
        self.forms: list = []

    def __call__(self, piece, launches):
        times = super().__call__(piece, launches)
        if not isinstance(piece, Captured):
            return times
        names = frozenset(bp.name for bp in piece.kept) if piece.trial is None else frozenset(piece.trial)
        self.forms.append(names)
        return {"mugraph": self.by_kept(names), "torch": 4e-6}


def test_a_graph_slower_with_all_its_pieces_runs_with_those_that_win_in_it(piece_cache, mugraph_log):
    """Each piece beats its torch ops; the graph with both loses (5 μs against 4), with only the
    first it wins (3 μs): it runs the first piece as its μGraph and leaves the second to torch
    (whose fusions across its boundary it needed), and a warm compile decides the same
    without timing. With neither form winning, the graph runs without its pieces."""
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(mixed, x, piece_cache, timer=SubsetTimer(lambda k: 1e-6), inductor=False)
    first, second = [bp.name for bp in cap.pieces]
    assert first != second
    _forget_memo()
    times = {frozenset({first, second}): 5e-6, frozenset({first}): 3e-6, frozenset({second}): 6e-6}
    timer = SubsetTimer(times.__getitem__)
    y, cap = compiled_pieces(mixed, x, piece_cache + "2", timer=timer, inductor=False)
    close(y, mixed(x))
    assert [bp.name for bp in cap.kept] == [first] and cap.whole["runs"] == "mugraph"
    assert cap.whole["dropped"] == [second] and cap.whole["mugraph_s"] == 3e-6
    (dropped,) = [bp for bp in cap.pieces if bp.name == second]
    assert dropped.info["runs"] == "torch" and "whole-graph rule" in dropped.info["why"]
    assert timer.forms[0] == frozenset({first, second}) and set(timer.forms[1:]) == {frozenset({first}), frozenset({second})}
    assert any(f"leaving {second} to torch" in m for m in mugraph_log.messages)
    _forget_memo()
    again = SubsetTimer(lambda k: 9e-6)  # would keep nothing; the kept verdict decides
    y2, cap2 = compiled_pieces(mixed, x, piece_cache + "2", timer=again, inductor=False)
    close(y2, mixed(x))
    assert [bp.name for bp in cap2.kept] == [first] and not again.forms
    assert any("runs with 1 of its μGraph pieces" in m and "earlier compile" in m for m in mugraph_log.messages)
    _forget_memo()
    lose = SubsetTimer(lambda k: 5e-6)
    _, cap3 = compiled_pieces(mixed, x, piece_cache + "3", timer=lose, inductor=False)
    # all, each alone, then none (the backend's trace): every form loses to torch.compile's
    assert cap3.whole["runs"] == "torch" and len(lose.forms) == 4 and lose.forms[-1] == frozenset()


def test_the_graph_runs_as_traced_where_that_beats_torch_compiles_graph(piece_cache, mugraph_log):
    """The last form: the backend's trace with no μGraph (its attention read in place, say)
    against dynamo's graph under Inductor. With no piece kept it is the only other form; after
    the graph lost with its pieces and with fewer, it is tried last. It runs only if faster
    (by the tie margin), its verdict is kept on disk, and a warm compile runs it untimed."""
    x = torch.randn(4, 8, generator=g)
    _, cap = compiled_pieces(mixed, x, piece_cache, timer=SubsetTimer(lambda k: 1e-6), inductor=False)
    first, second = [bp.name for bp in cap.pieces]
    _forget_memo()
    times = {frozenset({first, second}): 5e-6, frozenset({first}): 6e-6, frozenset({second}): 6e-6,
             frozenset(): 3e-6}
    timer = SubsetTimer(times.__getitem__)
    y, cap = compiled_pieces(mixed, x, piece_cache + "-trace", timer=timer, inductor=False)
    close(y, mixed(x))
    assert cap.whole["runs"] == "trace" and cap.kept == [] and timer.forms[-1] == frozenset()
    assert (cap.whole["mugraph_s"], cap.whole["torch_s"]) == (3e-6, 4e-6)
    assert all(bp.info["runs"] == "torch" for bp in cap.pieces)
    assert "as traced, without μGraph pieces" in cap.report()
    assert any("runs as the backend traces it" in m for m in mugraph_log.messages)
    _forget_memo()
    again = SubsetTimer(lambda k: 9e-6)  # the kept verdict decides, nothing is timed
    y2, cap2 = compiled_pieces(mixed, x, piece_cache + "-trace", timer=again, inductor=False)
    close(y2, mixed(x))
    assert cap2.whole["runs"] == "trace" and not again.forms and cap2.kept == []

    # no piece kept at all (each slower than its torch ops): the trace is timed against torch's
    _forget_memo()
    slow = FixedTimer(mugraph_s=2e-6, torch_s=1e-6, graph_s=(3e-6, 4e-6))
    y3, cap3 = compiled_pieces(two_blocks, x, piece_cache + "-none", timer=slow, inductor=False)
    close(y3, two_blocks(x))
    assert cap3.kept == [] and cap3.whole["runs"] == "trace" and slow.calls[-1] == "graph"
    assert cap3.whole["why"].startswith("no piece runs a μGraph; as traced it takes 3 μs")


class SlowFormsTimer(SubsetTimer):
    """A :class:`SubsetTimer` whose every whole-graph timing costs ``form_s`` seconds on the
    clock the rule reads (a whole model's Inductor compile and timing: 30–40 s a form)."""

    def __init__(self, by_kept, clock: list, form_s: float) -> None:
        super().__init__(by_kept)
        self.clock, self.form_s = clock, form_s

    def __call__(self, piece, launches):
        if isinstance(piece, Captured):
            self.clock[0] += self.form_s
        return super().__call__(piece, launches)


@pytest.mark.parametrize("second_alone_s, runs", [(3e-6, "mugraph"), (6e-6, "torch")])
def test_forms_with_fewer_pieces_stop_at_the_rules_seconds(piece_cache, mugraph_log, monkeypatch,
                                                           second_alone_s, runs):
    """Each form costs 12 s and the rule gives them 20: after the graph with all its pieces
    lost, one form with fewer is timed, not the second. If it wins it runs; if not, the graph
    runs without its pieces — never a compile that spends minutes on forms (six of them took
    270 s of a whole Phi-3-mini's cold compile)."""
    import time as real_time
    from types import SimpleNamespace

    from mugraph.frontend import run

    x = torch.randn(4, 8, generator=g)
    _, cap = compiled_pieces(mixed, x, piece_cache, timer=SubsetTimer(lambda k: 1e-6), inductor=False)
    first, second = [bp.name for bp in cap.pieces]
    _forget_memo()
    clock = [0.0]
    monkeypatch.setattr(run, "time", SimpleNamespace(perf_counter=lambda: real_time.perf_counter() + clock[0],
                                                     time=real_time.time))
    monkeypatch.setattr(run, "MAX_GRAPH_TRIALS_S", 20.0)
    times = {frozenset({first, second}): 5e-6, frozenset({second}): second_alone_s, frozenset({first}): 3e-6}
    timer = SlowFormsTimer(times.__getitem__, clock, 12.0)
    y, cap = compiled_pieces(mixed, x, piece_cache + f"-{runs}", timer=timer, inductor=False)
    close(y, mixed(x))
    assert timer.forms == [frozenset({first, second}), frozenset({second})]  # {first} alone is never tried
    assert cap.whole["runs"] == runs
    assert [bp.name for bp in cap.kept] == ([second] if runs == "mugraph" else [first, second])
    said = [m for m in mugraph_log.messages if "not tried with fewer pieces than that" in m]
    assert len(said) == 1 and "past the rule's 20 s" in said[0]


def test_no_form_with_fewer_pieces_when_one_costs_more_than_the_rules_seconds(piece_cache, mugraph_log,
                                                                             monkeypatch):
    """A graph whose one compile and timing already pass the rule's seconds (a whole model's)
    is not tried with fewer pieces at all: it runs without them."""
    from mugraph.frontend import run

    x = torch.randn(4, 8, generator=g)
    monkeypatch.setattr(run, "MAX_GRAPH_TRIALS_S", 0.0)
    _forget_memo()
    timer = SubsetTimer(lambda k: 5e-6)
    _, cap = compiled_pieces(mixed, x, piece_cache + "-costly", timer=timer, inductor=False)
    assert cap.whole["runs"] == "torch" and len(timer.forms) == 1
    assert any("the graph is not tried with fewer pieces: a form costs" in m for m in mugraph_log.messages)


def test_a_warm_compile_without_its_pieces_is_served_by_the_cold_compiles_caches(piece_cache, mugraph_log,
                                                                                 monkeypatch):
    """The cold compile compiles the graph without its pieces ahead, in a child (as on a GPU),
    from a pickled copy of dynamo's graph; the graph loses with its pieces. A warm compile (the
    verdict on disk, no search, no child) compiles only the graph without them — from the same
    copy (``ahead.compile_copy``), so Inductor's FX cache serves it; compiled from dynamo's own
    graph it missed (27.4 s for a whole Phi-3-mini on an H200)."""
    from torch._dynamo.utils import counters

    from mugraph.frontend import backend

    lin = torch.nn.Linear(8, 8, bias=False)  # a parameter: dynamo marks it static, a pickled copy does not

    def layers(x):
        return torch.exp(lin(torch.cos(torch.exp(lin(x))))) * 2

    x = torch.randn(4, 8, generator=g)
    timer = KeptTimer(1e-6, 3e-6, graph_s=(5e-6, 4e-6))
    with monkeypatch.context() as m:
        m.setattr(backend, "compiles_ahead", lambda *a: True)
        y, cap = compiled_pieces(layers, x, piece_cache + "-plain", timer=timer)
    assert cap.whole["runs"] == "torch" and "ahead_wait_s" in cap.timings
    with torch.no_grad():
        close(y, layers(x))
    _forget_memo()
    before = counters["inductor"]["fxgraph_cache_hit"]
    again = KeptTimer(1e-6, 3e-6, graph_s=(1e-6, 4e-6))  # would keep the pieces; the kept verdict decides
    y2, cap2 = compiled_pieces(layers, x, piece_cache + "-plain", timer=again)
    assert cap2.whole["runs"] == "torch" and "graph" not in again.calls
    assert counters["inductor"]["fxgraph_cache_hit"] == before + 1
    with torch.no_grad():
        close(y2, layers(x))


def test_a_piece_served_by_an_earlier_search_in_the_process_counts_no_search(piece_cache):
    """A second compile in the same process finds its pieces in the in-process memo: its
    summary counts no search and no search seconds (it used to count the first compile's
    search again, with its seconds, as a new one of its own)."""
    _forget_memo()
    x = torch.randn(4, 8, generator=g)
    _, first = compiled_pieces(two_blocks, x, piece_cache, inductor=False, timer=FixedTimer(1e-6, 3e-6))
    _, again = compiled_pieces(two_blocks, x, piece_cache, inductor=False, timer=FixedTimer(1e-6, 3e-6))
    assert again.search_seconds() == (0.0, 0)
    assert {bp.info["cached"] for bp in again.pieces} == {"memo"}
    assert {bp.info["cached"] for bp in first.pieces} <= {True, False, "memo"}
    assert "(searches 0.0 s, 0 new)" in again.timing_summary()


def test_a_graph_whose_compile_with_its_pieces_fails_runs_as_torch_compile_would(piece_cache, mugraph_log,
                                                                                  monkeypatch):
    """Inductor refusing the graph with its pieces (a view the backend's trace wrote that
    Inductor's decompositions make impossible, say) leaves the model running: the graph runs
    as torch.compile compiles it, every piece torch code, and one warning line names the error
    — not a traceback out of ``torch.compile``."""
    import mugraph.frontend.backend as backend
    from mugraph.frontend import run

    def refuse(gm, args, repeats_once=False, config=None):
        raise ValueError("Cannot view a tensor with shape [2, 4, 8, 16]\nWhile executing %view")
    monkeypatch.setattr(backend, "compile_graph", refuse)
    monkeypatch.setattr(backend, "compile_copy", lambda gm, args: gm)  # the plain graph, uncompiled here
    monkeypatch.setattr(run, "compile_graph", lambda gm, args: gm)  # the pieces' torch forms, likewise
    x = torch.randn(4, 8, generator=g)
    y, cap = compiled_pieces(two_blocks, x, piece_cache, inductor=True, compile_ahead=False,
                             timer=FixedTimer(mugraph_s=1e-6, torch_s=2e-6))
    close(y, two_blocks(x))
    assert cap.whole["runs"] == "torch" and "ValueError: Cannot view a tensor" in cap.whole["why"]
    assert not cap.kept and all(bp.info["runs"] == "torch" for bp in cap.pieces)
    said = [m for m in mugraph_log.messages if "runs without its μGraph pieces" in m]
    assert len(said) == 1 and "\n" not in said[0]
