"""mugraph.pipeline.timing.plan_rerank: which candidates the GPU re-ranking times and how
long each is tuned follow the predicted spread and the configuration spaces, within a
documented total; top_k and tune_seconds override. Pure planning: no GPU needed."""

import pytest
import torch

import mugraph as mg
from mugraph.pipeline import timing
from mugraph.pipeline.results import Candidate
from mugraph.pipeline.timing import (MAX_TIMED, MAX_TUNE_S, MIN_TIMED, MIN_TUNE_S, SCOUT_S, SPREAD, STRUCTURE_SPREAD,
                                     plan_rerank)


def _graph(kernels: int, tag: str, blocks: int = 4) -> mg.KernelGraph:
    """``kernels`` exp kernels of ``blocks`` blocks in a row; graphs of different tags
    compute different dataflows (their inputs are named apart), so none is dropped as a
    reordering of another."""
    g = mg.KernelGraph(tag)
    x = g.input(f"X{tag}", (blocks, 8))
    for _ in range(kernels):
        b = mg.BlockGraph((blocks, 1, 1), 1)
        (x,) = g.kernel(_exp_block(b, x))
    g.output(x)
    return g


def _exp_block(b, x):
    b.output(b.accum(mg.exp(b.input(x, (0, None, None)))), (0, None, None))
    return b


def _cand(pred_us: float, kernels: int = 1, origin: str = "search", tag: str = "g", blocks: int = 4) -> Candidate:
    return Candidate(_graph(kernels, tag, blocks), origin, predicted_s=pred_us * 1e-6)


def _space(n):  # every candidate has n configurations
    return lambda g: n


def test_timed_are_those_the_model_cannot_tell_apart():
    cs = [_cand(10), _cand(10 * SPREAD * 0.99, tag="a"), _cand(10 * SPREAD * 1.01, tag="b"), _cand(50, tag="c")]
    plan = plan_rerank(cs, space=_space(10))
    assert [c for c, _ in plan.timed] == cs[:2]
    # a tight cluster is timed in full, up to MAX_TIMED
    many = [_cand(10 + 0.01 * i, tag=str(i)) for i in range(MAX_TIMED + 3)]
    assert len(plan_rerank(many, space=_space(10)).timed) == MAX_TIMED
    # a clear winner still gets MIN_TIMED candidates timed
    lone = [_cand(10), _cand(100, tag="x"), _cand(200, tag="y")]
    assert len(plan_rerank(lone, space=_space(10)).timed) == MIN_TIMED


def test_the_best_of_another_kernel_count_is_timed_within_its_spread():
    one = [_cand(10 + i, tag=str(i)) for i in range(3)]           # within SPREAD: all timed
    pair = _cand(10 * STRUCTURE_SPREAD * 0.95, kernels=2, tag="pair")
    far = _cand(10 * STRUCTURE_SPREAD * 1.05, kernels=3, tag="far")
    chosen = [c for c, _ in plan_rerank([*one, pair, far], space=_space(10)).timed]
    ids = {id(c) for c in chosen}
    assert id(pair) in ids and id(far) not in ids and {id(c) for c in one} <= ids


def test_a_tight_budget_keeps_the_best_of_each_kernel_count():
    # two variants of one single kernel predicted alike, and a split pair predicted slower:
    # with room for two, the pair is timed beside the best single kernel, not the variant
    single, variant = _cand(6.6, tag="s"), _cand(6.6, tag="v")
    pair = _cand(9.2, kernels=2, tag="pair")
    plan = plan_rerank([variant, pair, single], space=_space(10), total_s=2 * SCOUT_S)
    chosen = [c for c, _ in plan.timed]
    assert len(chosen) == 2 and pair in chosen
    assert [c.predicted_s for c in chosen] == sorted(c.predicted_s for c in chosen)  # best predicted first
    # with room for all three, all are timed
    assert len(plan_rerank([variant, pair, single], space=_space(10), total_s=3 * SCOUT_S).timed) == 3


def test_tuning_time_follows_the_configuration_space_within_the_total():
    a, b = _cand(10, tag="a"), _cand(11, tag="b")
    sizes = {id(a.graph): 8, id(b.graph): 40}
    plan = plan_rerank([a, b], space=lambda g: sizes[id(g)])
    secs = dict((id(c), s) for c, s in plan.timed)
    assert secs[id(a)] == pytest.approx(max(MIN_TUNE_S, 8 * timing.SECONDS_PER_CONFIG))
    assert secs[id(b)] == pytest.approx(min(MAX_TUNE_S, 40 * timing.SECONDS_PER_CONFIG))
    # a huge space is capped per candidate, and the sum never exceeds the total
    big = [_cand(10 + 0.1 * i, tag=str(i)) for i in range(MAX_TIMED)]
    plan = plan_rerank(big, space=_space(10_000), total_s=200)
    assert sum(s for _, s in plan.timed) <= 200 + 1e-9
    assert all(s >= MIN_TUNE_S for _, s in plan.timed)
    # a short total cuts every share down to SCOUT_S before it drops a candidate …
    plan = plan_rerank(big, space=_space(10_000), total_s=MAX_TIMED * SCOUT_S)
    assert [c for c, _ in plan.timed] == big and all(s == pytest.approx(SCOUT_S) for _, s in plan.timed)
    # … and a total below SCOUT_S per candidate drops the worst predicted
    plan = plan_rerank(big, space=_space(10_000), total_s=3 * SCOUT_S)
    assert [c for c, _ in plan.timed] == big[:3]


def test_a_pair_of_another_wave_count_is_timed_beside_the_best_pair():
    """qknorm_gqa b=8 (H200): the best single kernel predicted 12.6 μs, split pairs of 128
    blocks (one wave) 15.6 and of 256 blocks (two waves) 17.1 — past SPREAD of the best and
    not the best pair, so the 256-block pair was never timed, while the 128-block pair
    measured 37.2 and the hand-written 256-block pair 28.5. A pair of another wave count is
    another structure: its best is timed too."""
    single = _cand(12.6, tag="s", blocks=64)
    one_wave = _cand(15.6, kernels=2, tag="p", blocks=128)
    one_wave_b = _cand(16.0, kernels=2, tag="q", blocks=128)
    two_waves = _cand(17.1, kernels=2, tag="w", blocks=256)
    assert timing.structure(one_wave) == (2, 1) and timing.structure(two_waves) == (2, 2)
    plan = plan_rerank([single, one_wave, one_wave_b, two_waves], space=_space(10))
    timed = [c for c, _ in plan.timed]
    assert single in timed and one_wave in timed and two_waves in timed
    assert one_wave_b in timed  # within SPREAD of the best: the model cannot tell it apart
    beyond = _cand(12.6 * STRUCTURE_SPREAD * 1.01, kernels=2, tag="x", blocks=512)  # too far even so
    assert beyond not in [c for c, _ in plan_rerank([single, one_wave, beyond], space=_space(10)).timed]


def test_overrides_and_the_unfused_program():
    cs = [_cand(10 + i, tag=str(i)) for i in range(5)]
    prog = _cand(500, origin="program", tag="p")
    plan = plan_rerank([prog, *cs], top_k=2, tune_seconds=7, space=_space(10))
    assert [c for c, _ in plan.timed] == [*cs[:2], prog]
    assert [s for _, s in plan.timed][:2] == [7.0, 7.0]
    assert "top_k=2" in plan.why and "tune_seconds" in plan.why
    assert plan_rerank([prog]).timed == [(prog, None)]
    assert plan.to_json()["timed"][0]["tune_s"] == 7.0


def test_the_unfused_programs_tuning_is_inside_the_total():
    """The unfused program's share is inside the total: MIN_TUNE_S, but at most a third of
    a short total, so a short re-ranking still scouts several candidates; a total with
    room for the program and one scout times one candidate beside it, not two."""
    assert timing.program_share(timing.TOTAL_TUNE_S) == MIN_TUNE_S
    assert timing.program_share(12.0) == pytest.approx(4.0)
    assert timing.program_share(1.0) == SCOUT_S
    cs = [_cand(10, tag="a"), _cand(11, kernels=2, tag="b")]
    prog = _cand(500, origin="program", tag="p")
    total = 2 * SCOUT_S + 1
    plan = plan_rerank([prog, *cs], space=_space(10), total_s=total)
    assert sum(s for _, s in plan.timed) <= total + 1e-9
    assert [c for c, _ in plan.timed] == [cs[0], prog]
    assert len(plan_rerank(cs, space=_space(10), total_s=2 * SCOUT_S).timed) == 2  # no program: both
    # a piece's 12 s: the program at 4 s and both candidates scouted in the other 8
    plan = plan_rerank([prog, *cs], space=_space(10), total_s=12.0)
    assert [c for c, _ in plan.timed] == [*cs, prog] and sum(s for _, s in plan.timed) <= 12.0 + 1e-9


class _Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t


def _fake_tuning(clock, landscape: dict):
    """A pretend card: candidate tag -> its configurations' times, best last; a tuning runs
    configurations in that order, one pretend second each, until its budget ends; it goes
    on from a history's length."""
    from lower.profile import ProfileResult

    calls = []

    def tune(c, secs, history):
        times = landscape[c.graph.name]
        start = len(history or {})
        n = len(times) - start if secs is None else min(len(times) - start, max(1, int(secs)))
        clock.t += n
        calls.append((c.graph.name, start, n))
        seen = {**(history or {}), **{str(i): times[i] for i in range(start, start + n)}}
        best = min(seen.values())
        return ProfileResult(c.graph, {}, best, 0.0, True, timings=seen, cut=start + n < len(times))

    return tune, calls


def test_rerank_gives_the_rest_of_the_budget_to_the_leaders(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    a, b, c = _cand(10, tag="a"), _cand(10.5, tag="b"), _cand(11, tag="c")
    # a and b keep improving with tuning; c is 2x slower whatever it is given
    land = {"a": [2.0 - 0.01 * i for i in range(200)], "b": [2.1 - 0.01 * i for i in range(200)],
            "c": [4.0] * 200}
    tune, calls = _fake_tuning(clock, land)
    monkeypatch.setattr(timing, "config_space", lambda g: {1: 200})
    why = timing.rerank([a, b, c], tune, total_s=120)
    first = {name: n for name, start, n in calls if start == 0}
    resumed = {name: (start, n) for name, start, n in calls if start > 0}
    assert set(first) == {"a", "b", "c"} and sum(first.values()) <= 60 + 3
    assert set(resumed) == {"a", "b"}  # c is not within LEADER_SPREAD of the fastest
    assert clock.t <= 120 + 3  # the whole re-ranking within its budget (+ one config per tuning)
    assert a.measured_s < 2.0 - 0.01 * first["a"] and "leader" in why
    assert c.measured_s == 4.0


def test_the_leaders_share_the_rest_by_successive_halving(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    a, b, d = _cand(10, tag="a"), _cand(10.2, tag="b"), _cand(10.4, tag="d")
    # three leaders, all improving with tuning, a ahead of b ahead of d all along
    land = {name: [base - 0.001 * i for i in range(400)] for name, base in (("a", 2.0), ("b", 2.05), ("d", 2.1))}
    tune, calls = _fake_tuning(clock, land)
    monkeypatch.setattr(timing, "config_space", lambda g: {1: 400})
    timing.rerank([a, b, d], tune, total_s=120)
    resumed: dict[str, int] = {}
    for name, start, n in calls:
        if start > 0:
            resumed[name] = resumed.get(name, 0) + n
    rest = sum(resumed.values())
    assert 55 <= rest <= 63 and clock.t <= 120 + 4
    # three rounds: all three, the faster two, the fastest; an equal split would give each a third
    assert resumed["a"] >= 0.55 * rest and resumed["d"] <= 0.15 * rest and resumed["a"] > resumed["b"] > resumed["d"]
    assert [name for name, start, _ in calls if start > 0][-1] == "a"


def test_rerank_with_tune_seconds_is_one_installment(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    a, b = _cand(10, tag="a"), _cand(10.5, tag="b")
    tune, calls = _fake_tuning(clock, {"a": [1.0 - 0.01 * i for i in range(50)],
                                       "b": [1.0 - 0.01 * i for i in range(50)]})
    timing.rerank([a, b], tune, tune_seconds=5, total_s=120)
    assert [(n, s) for n, s, _ in calls] == [("a", 0), ("b", 0)]


def test_a_finished_tuning_is_not_resumed_and_a_rejected_one_stays_rejected(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    a, b = _cand(10, tag="a"), _cand(10.5, tag="b")
    tune, calls = _fake_tuning(clock, {"a": [1.0, 0.9, 0.8]})

    def tune_or_reject(c, secs, history):
        if c.graph.name == "b":
            raise RuntimeError("out of resources: shared memory")
        return tune(c, secs, history)

    timing.rerank([a, b], tune_or_reject, total_s=120)
    assert calls == [("a", 0, 3)] and a.measured_s == 0.8
    assert b.measured_s is None and "does not run on this GPU" in b.rejected


def test_orderings_of_one_dataflow_are_timed_once():
    """Graphs that differ only in the order of independent ops lower to the same kernels:
    the re-ranking times the best predicted of them, and its tuning time is not split."""
    def two_sums(first_sq: bool, tag: str) -> mg.KernelGraph:
        g = mg.KernelGraph(tag)
        x = g.input("X", (4, 64))
        b = mg.BlockGraph((4, 1, 1), 4)
        t = b.input(x, (0, None, None), 1)
        if first_sq:
            sq = b.accum(mg.sum(mg.square(t), 1)); s1 = b.accum(mg.sum(t, 1))
        else:
            s1 = b.accum(mg.sum(t, 1)); sq = b.accum(mg.sum(mg.square(t), 1))
        b.output(sq / s1, (0, None, None))
        (y,) = g.kernel(b)
        g.output(y)
        return g

    a = Candidate(two_sums(True, "a"), "search", predicted_s=10e-6)
    b = Candidate(two_sums(False, "b"), "search", predicted_s=10e-6)
    other = _cand(11, tag="c")
    chosen = [c for c, _ in plan_rerank([b, a, other], space=_space(10)).timed]
    assert len([c for c in chosen if c in (a, b)]) == 1 and other in chosen


def test_a_tight_budget_keeps_the_plans_breadth_in_the_first_installment(monkeypatch):
    """The plan is made with the whole budget: with room for two candidates at the scouts'
    share, both kernel counts are timed, each at that share (not one of them at twice it)."""
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    single, pair = _cand(10, 1, tag="s"), _cand(12, 2, tag="p")
    land = {"s": [1.0 - 0.01 * i for i in range(100)], "p": [0.9 - 0.01 * i for i in range(100)]}
    tune, calls = _fake_tuning(clock, land)
    monkeypatch.setattr(timing, "config_space", lambda g: {1: 100})
    timing.rerank([single, pair], tune, total_s=2 * SCOUT_S)
    assert {name for name, start, _ in calls if start == 0} == {"s", "p"}
    assert all(n == SCOUT_S for name, start, n in calls if start == 0)


def test_near_ties_are_timed_in_turns_across_structures():
    """gqa b=1 on an H200: five single kernels predicted 6.2–6.6 μs and split pairs predicted
    8.7 and 8.8 — within SPREAD of each other, not of the best single kernel. The second
    pair (the hand-written reference's structure, the fastest when timed) is timed before a
    third single kernel: the model cannot tell near-ties apart within either structure."""
    singles = [_cand(6.2 + 0.1 * i, tag=f"s{i}") for i in range(5)]
    pairs = [_cand(8.7, kernels=2, tag="p"), _cand(8.8, kernels=2, tag="q"), _cand(11.5, kernels=2, tag="r")]
    timed = [c for c, _ in plan_rerank([*singles, *pairs], space=_space(10)).timed]
    assert len(timed) == MAX_TIMED
    assert pairs[0] in timed and pairs[1] in timed and pairs[2] not in timed  # 11.5 > SPREAD x 8.7
    assert timed == sorted(timed, key=lambda c: c.predicted_s)
    assert set(map(id, timed)) == set(map(id, [*singles[:4], *pairs[:2]]))


def test_each_grid_family_is_timed_before_a_second_loop_length_of_one():
    """gqa b=1 on an H200 (2026-11-27): three split pairs of the same grids (64 + 8 blocks)
    that differ only in their loop lengths, which the lowering re-chunks, ran 6.17–6.36 μs;
    the pair of 128 + 8 blocks predicted 3 % behind them was not timed. Every grid family of
    a structure is now timed before a second spelling of any."""
    pairs_a = [_cand(6.82, kernels=2, tag=f"a{i}", blocks=64) for i in range(3)]
    pair_b = _cand(7.04, kernels=2, tag="b", blocks=128)
    singles_f = [_cand(6.96, tag=f"f{i}", blocks=8) for i in range(2)]
    singles_g = [_cand(7.5, tag=f"g{i}", blocks=16) for i in range(2)]
    timed = [c for c, _ in plan_rerank([*pairs_a, pair_b, *singles_f, *singles_g], space=_space(10)).timed]
    assert len(timed) == MAX_TIMED == 6
    ids = set(map(id, timed))
    assert {id(pair_b), id(pairs_a[0]), id(singles_f[0]), id(singles_g[0])} <= ids
    assert id(pairs_a[2]) not in ids  # a third spelling of one family waits for the others
    assert timing.grids(pairs_a[0]) == timing.grids(pairs_a[1]) != timing.grids(pair_b)


def _online_attention(steps: int) -> Candidate:
    """One online-softmax kernel of 4 blocks over 128 keys in ``steps`` steps."""
    g = mg.KernelGraph(f"online{steps}")
    s, v = g.input("s", (64, 128), "float16"), g.input("v", (128, 16), "float16")
    b = mg.BlockGraph((4, 1, 1), steps)
    st, vt = b.input(s, (0, None, None), 1), b.input(v, (None, None, None), 0)
    m = mg.max(st, 1)
    e = mg.exp(st - m)
    b.output(b.accum(e @ vt, m) / b.accum(mg.sum(e, 1), m), (0, None, None))
    (o,) = g.kernel(b)
    g.output(o)
    return Candidate(g, "search", predicted_s=1e-5)


def test_an_online_kernels_loop_length_is_part_of_its_family():
    """The lowering cannot re-chunk a loop whose sums are rescaled step by step, so its key
    tile is the graph's own: a prompt attention at head dim 128 ran 177 μs with 64-key steps
    and 212 μs with 128-key steps (H200, 2026-11-29). Two loop lengths are two families;
    a plain loop's lengths stay one."""
    a, b = _online_attention(2), _online_attention(4)
    assert timing.grids(a) != timing.grids(b)
    assert timing.grids(a)[0] == ((4, 1, 1), 2)


def test_a_tuning_past_its_share_says_which_candidate_holds_the_rerank(caplog):
    """Neither a Triton compile nor a kernel has a bound of its own: a tuning that runs long
    past its share logs a line naming the candidate (and goes on), one per interval."""
    import logging
    import time as real_time

    with caplog.at_level(logging.WARNING, logger="mugraph"):
        with timing.overrun_log("the tuning of search candidate X", 0.05, every_s=0.1):
            real_time.sleep(0.42)
        with timing.overrun_log("the tuning of search candidate Y", 5.0, every_s=0.1):
            real_time.sleep(0.2)  # within its share: nothing said
    lines = [r.getMessage() for r in caplog.records if "candidate X" in r.getMessage()]
    assert 2 <= len(lines) <= 4 and "its share: 0 s" in lines[0]
    assert not [r for r in caplog.records if "candidate Y" in r.getMessage()]
    real_time.sleep(0.25)  # the watcher stopped with its block
    assert len([r for r in caplog.records if "candidate X" in r.getMessage()]) == len(lines)


def test_a_small_tuning_request_is_not_raised_to_ten_seconds():
    """The tuning gets what the call's budget has left (less the re-timing's reserve), at
    most what it asked, and at least MIN_TUNE_S — unless it asked for less: a backend piece
    with a 2 s share tunes 2 s, not 10."""
    from mugraph.pipeline.timing import (MIN_RETIME_RESERVE_S, MIN_TUNE_S, RETIME_RESERVE_S, retime_reserve,
                                         tuning_seconds)

    assert tuning_seconds(20.0, 100.0) == 20.0
    assert tuning_seconds(60.0, 55.0) == 55.0 - RETIME_RESERVE_S  # a long call keeps the whole reserve
    assert tuning_seconds(20.0, 16.0) == pytest.approx(16.0 * 0.8)  # a short one a fifth of what is left
    assert tuning_seconds(20.0, 3.0) == MIN_TUNE_S          # the program and the best are always timed
    assert tuning_seconds(2.0, 3.0) == 2.0 and tuning_seconds(2.0, 100.0) == 2.0
    assert retime_reserve(1.0) == MIN_RETIME_RESERVE_S and retime_reserve(1e4) == RETIME_RESERVE_S
    assert all(retime_reserve(a) <= retime_reserve(b) for a, b in [(5, 10), (10, 30), (30, 60), (60, 600)])


def test_check_inputs_are_drawn_on_the_device_in_each_inputs_dtype():
    """The re-ranking's check inputs: drawn by the device's generator, rounded to the
    program's dtype, and the reference the program's float64 outputs on exactly those values."""
    p = mg.Program("mm")
    a, b = p.input("A", (4, 8), "float16"), p.input("B", (8, 3), "float16")
    p.output(a @ b)
    inputs, ref = timing._check_inputs(p, device="cpu")
    assert {str(v.dtype) for v in inputs.values()} == {"torch.float16"}
    want = inputs["A"].double() @ inputs["B"].double()
    assert ref[0].dtype == want.dtype and bool((ref[0] == want).all())
    again, _ = timing._check_inputs(p, device="cpu")
    assert all(bool((again[k] == v).all()) for k, v in inputs.items())  # seed 0 each time
    assert 0.15 < float(inputs["A"].float().std()) < 0.35


def test_check_inputs_fall_back_to_non_negative_draws_where_normal_ones_cancel():
    """x / Σx over rows of four signed draws nearly cancels in some of 4,096 rows; the same
    draws made non-negative do not."""
    p = mg.Program("ratio")
    x = p.input("X", (4096, 4), "float32")
    p.output(x / mg.sum(x, 1))
    inputs, ref = timing._check_inputs(p, device="cpu")
    assert bool((inputs["X"] >= 0).all())
    assert all(bool(r.isfinite().all()) for r in ref)


def test_the_float64_reference_is_the_float_facets_bit_for_bit_with_a_causal_mask():
    """The re-ranking's reference (timing.float64_reference: the float check's algebra at
    float64, computed where the inputs are) equals the interpreter's default float64
    evaluation bit for bit — on a causal prompt attention, whose hidden scores underflow
    in exp (the case whose CPU slow path it skips)."""
    from mugraph.core.benchmarks import prefill_attention

    p = prefill_attention(heads=2, q=64, kv=64, head_dim=16, causal=True)
    inputs, ref = timing._check_inputs(p, device="cpu")
    want = mg.evaluate(p, {k: v.double() for k, v in inputs.items()})
    assert len(ref) == len(want) and all(torch.equal(r, w) for r, w in zip(ref, want))
    assert ref[0].device.type == "cpu" and ref[0].dtype == torch.float64


def test_the_reason_counts_what_was_timed_and_compiled_ahead(monkeypatch):
    """The re-ranking's reason says how many configurations its tunings timed, and how many
    of those a worker process had compiled ahead (lower.precompile)."""
    from lower.profile import ProfileResult

    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    a, b = _cand(10, tag="a"), _cand(10.5, tag="b")
    monkeypatch.setattr(timing, "config_space", lambda g: {1: 4})

    def tune(c, secs, history):
        clock.t += 1
        trials = [(f"c{i}", 1e-6 * (i + 1), 1e-6) for i in range(3)] + [("bad", None, 1e-6)]
        return ProfileResult(c.graph, {}, 1e-6, 1e-6, True, trials, timings={"x": 1e-6}, compiled_ahead=2)

    why = timing.rerank([a, b], tune, tune_seconds=5, total_s=120)
    assert why.endswith("; 6 configurations timed, 4 of them compiled ahead"), why


def test_each_configuration_a_tuning_times_is_logged_at_debug(caplog):
    """With the ``mugraph`` logger at DEBUG a candidate's tuning says every configuration it
    times, naming the candidate's grids; below DEBUG it is given no log at all."""
    import logging
    from types import SimpleNamespace

    c = SimpleNamespace(graph=_graph(1, "a", blocks=4))
    with caplog.at_level(logging.INFO, logger="mugraph"):
        assert timing._trial_log(c) is None
    with caplog.at_level(logging.DEBUG, logger="mugraph"):
        say = timing._trial_log(c)
        say("  k1 w4s3  2.00 us  (pred 3.00, err 1e-06)")
    assert "mugraph: tuning 4x1:  k1 w4s3  2.00 us" in caplog.text
