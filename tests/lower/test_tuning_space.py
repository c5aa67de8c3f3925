"""lower.profile's tuning space: the sweep around a winner that stages every load (``A``)
keeps ``A`` among its choices, and config_space counts what tune may time. No GPU needed."""

import dataclasses

from lower.profile import STAGES, WARPS, config_space, first_round, neighbours
from mugraph.core.benchmarks import reference
from online_graphs import decode_ugraph


def _kernel(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


def test_sweep_around_a_staged_winner_tries_staging_again():
    g = reference("rmsnorm_matmul", 8)
    blk = _kernel(g).attrs["block"]
    staged = [c for c in first_round(blk) if c.stage_all_loads]
    assert staged, "rmsnorm_matmul b=8's matmul loop has a load Triton does not stage unasked"
    for base in staged[:3]:
        sweep = neighbours(blk, base, WARPS, STAGES)
        assert {c.stage_all_loads for c in sweep} == {False, True}
        # the flaw this guards against: w2s5 with A (found by hand) must be in the sweep
        assert any(c.num_warps == 2 and c.num_stages == 5 and c.stage_all_loads for c in sweep)
        assert len(sweep) == len(set(sweep))


def test_config_space_counts_first_round_picks_and_two_sweeps():
    g = reference("rmsnorm_matmul", 8)
    op = _kernel(g)
    sizes = config_space(g)
    assert set(sizes) == {op.id}
    blk = op.attrs["block"]
    sweep = len(neighbours(blk, first_round(blk)[0], WARPS, STAGES))
    # the first round's picks (at least one, at most all of it) and two sweeps
    assert 2 * sweep < sizes[op.id] <= 2 * sweep + len(first_round(blk))
    assert config_space(g, top=2)[op.id] < sizes[op.id]


def _fake_gpu(monkeypatch, landscape, clock=None):
    """tune() on a pretend GPU: ``landscape(config) -> seconds`` instead of compiling and
    timing; ``clock`` (a one-item list) advances a second per configuration timed."""
    import importlib
    import time as _t

    prof = importlib.import_module("lower.profile")  # the module (``lower.profile`` is also a function)

    calls = []

    def fake_time(graph, configs, inputs, ref=None, tol=2e-2, timing="graph", sets=None):
        (c,) = configs.values()
        calls.append(c)
        if clock is not None:
            clock[0] += 1.0
        return landscape(c), None, 0.0

    monkeypatch.setattr(prof.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(prof, "_time", fake_time)
    if clock is not None:
        monkeypatch.setattr(_t, "monotonic", lambda: clock[0])
    return calls


def test_tune_sweeps_the_runner_up_layout_and_keeps_staging(monkeypatch):
    """rmsnorm_matmul b=8 as measured: one staged layout wins the first round at w4s3, another
    staged layout 5 % behind it is fastest at w2s5 — tune must find the latter."""
    from lower.cost_model import H100
    from lower.profile import SMALL_MM_MENU, _layout, _space, tune

    g = reference("rmsnorm_matmul", 8)
    op = _kernel(g)
    picked = [c for _, c in _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H100).picked]
    staged = [c for c in picked if c.stage_all_loads]
    l1 = _layout(staged[0])
    l2 = next(_layout(c) for c in staged if _layout(c) != l1)

    def landscape(c):
        t = 2.0
        if _layout(c) == l1:
            t = 1.0 if (c.num_warps, c.num_stages) == (4, 3) else 1.02
        elif _layout(c) == l2:
            t = 0.9 if (c.num_warps, c.num_stages) == (2, 5) else 1.05
        return t + (0.0 if c.stage_all_loads else 0.5)

    _fake_gpu(monkeypatch, landscape)
    res = tune(g, inputs={})
    best = res.configs[op.id]
    assert _layout(best) == l2 and (best.num_warps, best.num_stages) == (2, 5) and best.stage_all_loads
    assert res.time_s == 0.9


def test_tune_budget_bounds_the_configurations_tried(monkeypatch):
    from lower.profile import tune

    g = reference("rmsnorm_matmul", 8)
    clock = [0.0]
    calls = _fake_gpu(monkeypatch, lambda c: 1.0 + 0.01 * c.num_warps, clock)
    tune(g, inputs={}, budget_s=12)
    # one configuration a pretend second: the share ends after 12, the one running then
    # finishes, and the final program is timed once more
    assert 12 <= len(calls) <= 12 + 2
    calls.clear()
    clock[0] = 0.0
    tune(g, inputs={})
    assert len(calls) > 40  # unbounded: both sweeps in full


def test_tuning_in_installments_goes_on_where_the_budget_stopped(monkeypatch):
    """A tune cut by its budget, resumed with its timings as history, ends where one unbounded
    tune ends, without timing any configuration twice (only the final re-timing repeats)."""
    from lower.profile import tune

    g = reference("rmsnorm_matmul", 8)
    clock = [0.0]

    def landscape(c):  # the best is deep in the sweep: many warps, many stages
        return 1.0 - 0.01 * c.num_warps - 0.003 * c.num_stages + (0.0 if c.stage_all_loads else 0.002)

    calls = _fake_gpu(monkeypatch, landscape, clock)
    full = tune(g, inputs={})
    assert not full.cut
    calls.clear()
    first = tune(g, inputs={}, budget_s=8)
    assert first.cut and len(first.timings) < len(full.timings)
    n_first = len(calls)
    second = tune(g, inputs={}, budget_s=1e6, history=first.timings)
    assert not second.cut and second.configs == full.configs and second.time_s == full.time_s
    new = calls[n_first:-1]  # this call's configurations, less its final re-timing
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    from lower.profile import program_key
    assert not {program_key([op], {op.id: c}) for c in new} & set(first.timings)
    assert len(new) + len(first.timings) == len(full.timings)


def test_a_failed_configuration_is_remembered_and_not_retried(monkeypatch):
    from lower.profile import tune

    g = reference("rmsnorm_matmul", 8)

    def landscape(c):
        if c.num_warps == 16:
            raise RuntimeError("out of resources")
        return 1.0 + 0.01 * c.num_stages

    calls = _fake_gpu(monkeypatch, landscape)
    first = tune(g, inputs={})
    failed = {k for k, t in first.timings.items() if t is None}
    assert failed
    calls.clear()
    again = tune(g, inputs={}, history=first.timings)
    assert len(calls) == 1 and again.configs == first.configs  # only the final re-timing ran


def test_a_short_budget_climbs_to_warps_and_stages_far_from_the_first_round(monkeypatch):
    """The first round's winner runs at 4 warps and 3 stages; the fastest configuration is two
    steps away (16 warps, 2 stages), where the cost model ranks it 71st of the 80 around the
    winner. A budget of 18 configurations past the first round reaches it by climbing; in the
    model's order alone it would not."""
    import math

    from lower.cost_model import H100
    from lower.profile import SMALL_MM_MENU, STAGES, WARPS, _space, tune

    g = reference("rmsnorm_matmul", 1)
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    n_first = len(_space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H100).picked)

    def landscape(c):
        return (1.0 - 0.02 * math.log2(c.num_warps) + 0.01 * abs(c.num_stages - 2)
                + (0.0 if c.split == 4 else 0.1) + (0.0 if c.stage_all_loads else 0.05))

    clock = [0.0]
    _fake_gpu(monkeypatch, landscape, clock)
    res = tune(g, inputs={}, budget_s=n_first + 18)
    best = res.configs[op.id]
    assert (best.num_warps, best.num_stages, best.split) == (16, 2, 4) and res.cut


def test_a_budget_inside_the_first_round_measures_every_split_factor_once(monkeypatch):
    """When the budget ends inside the first round, each split-K factor has been timed once:
    a kernel whose best is a split the model ranks late (too few blocks for the SMs) gets it."""
    import math

    from lower.cost_model import H100
    from lower.profile import SMALL_MM_MENU, STAGES, WARPS, _space, tune

    g = reference("gated_mlp", 8)
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    picked = _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H100).picked
    splits = sorted({c.split for p, c in picked if p < float("inf")})
    assert len(splits) >= 4
    first = [c.split for _, c in picked[:len(splits)]]
    assert sorted(first) == splits  # the head of the order: one of each factor
    biggest = max(splits)
    by_prediction = [c.split for _, c in sorted(picked, key=lambda x: x[0])]
    assert by_prediction.index(biggest) >= len(splits)  # the model alone would time it later

    clock = [0.0]
    _fake_gpu(monkeypatch, lambda c: 1.0 - 0.01 * math.log2(c.split), clock)
    res = tune(g, inputs={}, budget_s=len(splits))
    assert res.configs[op.id].split == biggest and res.cut


def test_a_layout_the_first_round_did_not_pick_is_reached_by_climbing_from_its_neighbour(monkeypatch):
    """The first round times a subset of the layouts, chosen by the cost model; the fastest
    layout here is not among them but one step (split-K, chunk, combine, a sub-tiling or the
    small-matmul lowering) from the first round's winner: the layout climb reaches it."""
    from lower.cost_model import H100
    from lower.profile import SMALL_MM_MENU, _layout, _space, tune
    from lower.tuning_order import is_layout_step

    g = reference("rmsnorm_matmul", 1)
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    space = _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H100)
    picks = [c for _, c in space.picked]
    winner = picks[0]
    picked_layouts = {_layout(c) for c in picks}
    hidden = next(c for _, c in space.cands if _layout(c) not in picked_layouts and is_layout_step(winner, c))

    def landscape(c):
        if _layout(c) == _layout(hidden):
            return 0.5 + 0.001 * c.num_warps
        return 0.8 if c == winner else 1.0

    _fake_gpu(monkeypatch, landscape)
    res = tune(g, inputs={})
    assert _layout(res.configs[op.id]) == _layout(hidden) and res.configs[op.id].num_warps == 1


def test_a_budget_is_not_spent_on_a_layout_family_measured_far_slower_than_predicted(monkeypatch):
    """Every re-chunked loop measures 30x its prediction (as decode attention's did on an
    H200): after a few such measurements the tuner defers the first round's other chunked
    picks and spends a short budget on the sweep around the winner instead, where 8 warps
    are faster. In the cost model's order alone the budget ends among the chunked picks."""
    from lower.cost_model import H100, estimate
    from lower.profile import SMALL_MM_MENU, _space, tune

    g = reference("gated_mlp", 8)
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    picked = _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H100).picked
    head = len({c.split for p, c in picked})
    chunked = [c for _, c in picked[head:] if c.chunk > 1]
    budget = head + 13
    # the uncorrected order would spend most of the budget on chunked picks
    assert sum(c.chunk > 1 for _, c in picked[:budget]) > budget // 2

    def landscape(c):
        t = estimate(g, H100, {op.id: c}) * (30.0 if c.chunk > 1 else 1.0)
        return t * (0.9 if c.num_warps == 8 else 1.0)

    clock = [0.0]
    calls = _fake_gpu(monkeypatch, landscape, clock)
    res = tune(g, inputs={}, budget_s=budget)
    assert res.cut and res.configs[op.id].num_warps == 8 and res.configs[op.id].chunk == 1
    assert sum(c.chunk > 1 for c in calls) < len(chunked) // 2


def test_the_first_round_starts_large_tiles_at_eight_warps():
    """``first_round_warps``: an online attention kernel with 128-row tiles (a 128 × 128 fp32
    accumulator: 128 registers a thread at 4 warps) is first timed at 8 warps; with 64-row
    tiles at 4 — as measured on an H200 at head dim 128 (w4s3 vs w8s3: 328 vs 176 μs at 128
    rows, 177 vs 333 at 64)."""
    import math as _math

    import mugraph as mg
    from lower.profile import FIRST_ROUND_REGS

    def block(rows: int):
        g = mg.KernelGraph("attn")
        q, k, v = (g.input(n, s, "float16") for n, s in (("q", (4, 256, 128)), ("k", (4, 128, 256)),
                                                            ("v", (4, 256, 128))))
        b = mg.BlockGraph(grid=(256 // rows, 4, 1), forloop=4)
        qt, kt, vt = b.input(q, (1, 0, None), None), b.input(k, (None, 0, None), 2), b.input(v, (None, 0, None), 1)
        s = mg.scale(qt @ kt, 1 / _math.sqrt(128))
        m = mg.max(s, 2)
        e = mg.exp(s - m)
        b.output(b.accum(e @ vt, m) / b.accum(mg.sum(e, 2), m), (1, 0, None))
        (o,) = g.kernel(b)
        g.output(o)
        return b

    assert 128 * 128 > FIRST_ROUND_REGS * 32 * 4 >= 64 * 128
    for rows, warps in ((128, 8), (64, 4)):
        plain = [c for c in first_round(block(rows)) if c.split == 1 and not c.sub]
        assert plain and {c.num_warps for c in plain} == {warps}, (rows, [c.label() for c in plain])


def _gemv(k: int, n: int, cols: int, steps: int):
    """One row times a (k, n) weight plus a residual row, ``n / cols`` programs, ``k / steps``
    loop steps (loop-free at ``steps == k``)."""
    from mugraph.core.benchmarks.handwritten import gemv

    return gemv(1, k, n, cols, steps, "residual", "bfloat16")


def test_a_loop_free_product_on_the_cuda_cores_holds_its_operands_in_registers():
    """One row times Phi-2's 2560 × 2560 projection: 80 programs of one 2,560-deep step, the
    product on the CUDA cores, ran 27.1 μs on an H200, 80 programs of 512-deep steps on
    ``tl.dot`` 6.38. The model priced the loop-free form 7.11 μs, below the looped one (7.32),
    counting none of its tiles in registers; a short tuning timed it first and nothing else.
    Now its 2,560 × 32 operand tile spills at 4 warps and is first timed at 8 (Mistral-7B's v
    projection in that form: 7.88 μs at 4 warps, 5.70 at 8), still dearer than the loop."""
    from lower.config import KernelConfig
    from lower.cost_model import estimate, for_timing, params_for

    dev = for_timing(params_for("NVIDIA H200"), "dram")
    flat, looped = _gemv(2560, 2560, 32, 2560), _gemv(2560, 2560, 32, 512)
    op = _kernel(flat)
    cores = [c for c in first_round(op.attrs["block"]) if c.small_mm == "v"]
    assert cores and {c.num_warps for c in cores} == {8}, [c.label() for c in cores]
    at = {w: estimate(flat, dev, {op.id: KernelConfig(num_warps=w, num_stages=3, small_mm="v")}) for w in (4, 8)}
    loop = estimate(looped, dev, {_kernel(looped).id: KernelConfig(num_warps=4, num_stages=3)})
    assert at[4] > 2 * at[8] * 0.8 and at[8] > loop, (at, loop)
    # a loop's tiles are counted as before: the looped form's price does not move with the warps
    assert loop == estimate(looped, dev, {_kernel(looped).id: KernelConfig(num_warps=8, num_stages=3)})


def test_kernels_wait_their_turn_at_configs_that_fit(monkeypatch):
    """Each kernel is timed inside the whole program, the kernels not yet tuned at their best
    predicted configs. At the default (w4s3, whole tiles) the projection below stages
    16 × 4096 + 16 × 1024 bf16 tiles twice, 328 KB of shared memory: on an H200 no launch of
    the program succeeded, every configuration of the kernel tuned first failed, and tune
    raised for it (``kernel k…: none of … configurations compiles and runs``)."""
    import mugraph as mg
    from lower.config import KernelConfig
    from lower.cost_model import H100
    from lower.memory import lowered_shared_memory
    from lower.profile import tune

    g = mg.KernelGraph("norm_then_two_projections")
    X = g.input("X", (8, 4096), "bfloat16")
    Wq, Wk = g.input("Wq", (4096, 4096), "bfloat16"), g.input("Wk", (4096, 1024), "bfloat16")
    first = mg.BlockGraph((8, 1, 1), 1)
    first.output(first.accum(mg.scale(first.input(X, (0, None, None)), 2)), (0, None, None))
    (T,) = g.kernel(first)
    proj = mg.BlockGraph((8, 1, 1), 256)
    t = proj.input(T, (0, None, None), 1)
    wq, wk = proj.input(Wq, fmap=0), proj.input(Wk, fmap=0)
    proj.output(proj.accum(t @ wq), (0, None, None))
    proj.output(proj.accum(t @ wk), (0, None, None))
    for y in g.kernel(proj):
        g.output(y)
    smem = H100.smem
    assert lowered_shared_memory(proj, KernelConfig(num_stages=3)) > smem  # the default does not fit

    import importlib
    prof = importlib.import_module("lower.profile")
    blocks = {op.id: op.attrs["block"] for op in g.ops if op.kind == "graph_defined"}

    def fake_time(graph, configs, inputs, ref=None, tol=2e-2, timing="graph", sets=None):
        for k, c in configs.items():  # the launch of any kernel whose tiles do not fit fails
            if lowered_shared_memory(blocks[k], c) > smem:
                raise RuntimeError("out of resource: shared memory")
        return 1.0 + 0.01 * sum(c.num_warps for c in configs.values()), None, 0.0

    monkeypatch.setattr(prof.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(prof, "_time", fake_time)
    res = tune(g, inputs={}, device_params=H100, budget_s=None)
    assert set(res.configs) == set(blocks)
    assert all(lowered_shared_memory(blocks[k], c) <= smem for k, c in res.configs.items())


def test_a_waiting_kernel_whose_predicted_config_fails_falls_back_to_the_default(monkeypatch):
    """The other way round: a waiting kernel's best predicted config is one Triton does not
    compile. Nothing runs while the kernel before it is tuned; tune tries that kernel once more
    with the waiting ones at the default, and the waiting kernel then tunes to a config that
    runs."""
    import importlib

    import mugraph as mg
    from lower.profile import DEFAULT_WAITING, tune

    g = mg.KernelGraph("norm_then_projection")
    X, W = g.input("X", (8, 256), "bfloat16"), g.input("W", (256, 256), "bfloat16")
    first = mg.BlockGraph((8, 1, 1), 1)
    first.output(first.accum(mg.scale(first.input(X, (0, None, None)), 2)), (0, None, None))
    (T,) = g.kernel(first)
    proj = mg.BlockGraph((8, 1, 1), 16)
    proj.output(proj.accum(proj.input(T, (0, None, None), 1) @ proj.input(W, fmap=0)), (0, None, None))
    for y in g.kernel(proj):
        g.output(y)
    k_first, k_proj = (op.id for op in g.ops if op.kind == "graph_defined")
    broken = tune(g, predict_only=True).configs[k_proj]  # the projection's best predicted config
    assert broken != DEFAULT_WAITING

    prof = importlib.import_module("lower.profile")

    def fake_time(graph, configs, inputs, ref=None, tol=2e-2, timing="graph", sets=None):
        if configs[k_proj] == broken:
            raise RuntimeError("compile failed")
        return 1.0 + 0.01 * sum(c.num_warps for c in configs.values()), None, 0.0

    monkeypatch.setattr(prof.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(prof, "_time", fake_time)
    res = tune(g, inputs={})
    assert set(res.configs) == {k_first, k_proj} and res.configs[k_proj] != broken


def test_split_factors_are_the_loops_divisors_not_only_powers_of_two():
    """A static cache of 8,192 + 256 slots is 132 steps of 64 keys: its power-of-two splits
    stop at 4. Every divisor up to MAX_SPLIT is a split factor; none leaves a step over."""
    from lower.profile import MAX_SPLIT, split_factors

    assert split_factors(64) == [1, 2, 4, 8, 16]
    assert split_factors(36) == [1, 2, 3, 4, 6, 9, 12, 18]
    assert split_factors(132) == [1, 2, 3, 4, 6, 11, 12, 22]
    assert split_factors(1) == [1] and split_factors(7) == [1, 7]
    assert all(48 % s == 0 and s <= MAX_SPLIT for s in split_factors(48)) and 24 in split_factors(48)


def test_a_one_row_decode_over_36_steps_is_timed_split_12_ways_early():
    """The first round leads with the best predicted config of every split factor: a
    one-row decode over 2,304 keys (36 steps, Kᵀ read key-major, so tl.dot only) times a
    12-way split among them — 384 programs for 32 heads, where 4 ways give 128 on 132 SMs —
    and before the 2-way split and the single pass."""
    from lower.cost_model import H200
    from lower.profile import _space

    g = decode_ugraph(heads=32, rows=1, d=96, kv=2304, keys=64, k_rows=True)
    op = _kernel(g)
    space = _space(g, op, {}, 6, WARPS, STAGES, ("dot",), H200)
    head = [c for _, c in space.picked[:space.head]]
    assert {c.split for c in head} == {1, 2, 3, 4, 6, 9, 12, 18}
    order = [c.split for c in head]
    assert order.index(12) < min(order.index(2), order.index(1)), [c.label() for c in head]


def test_a_mispriced_combine_mode_is_learned_once_in_the_first_round(monkeypatch):
    """Combining split-K partials in the last program is faster here than the cost model says
    (decode attention on an H200: 2-2.5 us faster than a combine kernel priced 0.5 us cheaper).
    The first split factor is timed in both combine modes; every later factor of the first
    round is then timed combined by the last program, and a budget that ends with the first
    round ships that mode."""
    import math

    from lower.cost_model import H100
    from lower.profile import SMALL_MM_MENU, _space, tune

    g = reference("gated_mlp", 8)
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    space = _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H100)
    splits = [c.split for _, c in space.picked[:space.head]]
    assert len([s for s in splits if s > 1]) >= 3

    def landscape(c):
        return 1.0 - 0.01 * math.log2(c.split) - (0.2 if c.combine == "last" else 0.0)

    clock = [0.0]
    calls = _fake_gpu(monkeypatch, landscape, clock)
    res = tune(g, inputs={}, budget_s=len(splits) + 1)
    first_split = next(i for i, c in enumerate(calls) if c.split > 1)
    assert {calls[first_split].combine, calls[first_split + 1].combine} == {"kernel", "last"}
    assert calls[first_split].split == calls[first_split + 1].split
    later = [c for c in calls[first_split + 2:len(splits) + 1] if c.split > 1]
    assert later and all(c.combine == "last" for c in later)
    assert sorted({c.split for c in calls}) == sorted(splits)  # still one of each factor
    assert res.configs[op.id].combine == "last"


def test_a_combine_pair_within_the_noise_leaves_the_model_its_modes(monkeypatch):
    """When the first split factor's two combine modes time within COMBINE_MARGIN of each
    other, the later factors are timed in the modes the model picked for them (rmsnorm_matmul
    b=1 priced for the H200: combined by the last program at split 2, 4 and 8, by a kernel at
    16): one pair of timings that close does not overrule it."""
    from lower.cost_model import H200
    from lower.profile import COMBINE_MARGIN, SMALL_MM_MENU, _space, tune

    g = reference("rmsnorm_matmul", 1)
    (op,) = [o for o in g.ops if o.kind == "graph_defined"]
    head = [c for _, c in _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, H200).picked]
    head = head[:len({c.split for c in head})]
    assert {c.combine for c in head if c.split > 1} == {"kernel", "last"}

    def landscape(c):  # the combine kernel faster, by half the margin
        return 1.0 - (0.5 * (COMBINE_MARGIN - 1) if c.combine == "kernel" else 0.0)

    clock = [0.0]
    calls = _fake_gpu(monkeypatch, landscape, clock)
    tune(g, inputs={}, budget_s=len(head) + 3, device_params=H200)  # the head, and the first pick's siblings
    first_timed: dict[int, object] = {}
    for c in calls:
        first_timed.setdefault(c.split, c)
    later = [s for s in first_timed if s > 1][1:]
    assert later and all(first_timed[s] == next(c for c in head if c.split == s) for s in later)


def test_a_mispriced_small_matmul_lowering_is_learned_once_in_the_first_round(monkeypatch):
    """Phi-3-mini's decode attention (32 heads of one query row, 8,448 keys in 32-key steps):
    the model prices the CUDA-core product (``v``) of most split factors below every tl.dot
    config, so the first round's head begins with ``v`` picks. Where ``v`` measures slower,
    the first pick is timed in every lowering and each later split factor in tl.dot — so a
    budget the size of the head reaches tl.dot's split-K 12, not one factor of it."""
    import sys
    from pathlib import Path

    from lower.cost_model import H200
    from lower.profile import SMALL_MM_MENU, _space, tune

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from decode_attention_sweep import decode_attention

    g = decode_attention(32, 1, 8448, 96, 32, mask=True)
    op = _kernel(g)
    # the model that mispriced it: CUDA-core steps at the memory's step latency alone
    mispriced = dataclasses.replace(H200, fma_step_latency=0.0)
    space = _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, mispriced)
    head = [c for _, c in space.picked[:space.head]]
    assert sum(c.small_mm != "dot" for c in head[:5]) >= 3  # the model's premise

    def landscape(c):  # tl.dot twice as fast; its valley at split-K 12
        return (1.0 if c.small_mm == "dot" else 2.0) * (1.0 + abs(c.split - 12) / 100)

    clock = [0.0]
    calls = _fake_gpu(monkeypatch, landscape, clock)
    res = tune(g, inputs={}, budget_s=len(head) + 2, device_params=mispriced)
    n_sibs = len({c.small_mm for _, c in space.cands}) - 1
    first = calls[0]
    assert {c.small_mm for c in calls[:1 + n_sibs + 1]} >= {first.small_mm, "dot"}
    later = calls[len(head) // 2:len(head)]
    assert later and all(c.small_mm == "dot" for c in later), [c.label() for c in calls]
    assert res.configs[op.id].small_mm == "dot" and res.configs[op.id].split == 12


def test_near_tied_split_factors_are_timed_fullest_wave_first():
    """Phi-3-mini's decode attention, Kᵀ read key-major (tl.dot only): the model prices split-K
    8, 11 and 12 within 7 % of each other; the card ran them 33.6, 32.4 and 30.6 μs (256, 352
    and 384 programs, five an SM). The head times the fullest single wave first, and the
    factors that need a second wave (22, 24: 704, 768 programs) after every near tie."""
    import sys
    from pathlib import Path

    from lower.cost_model import H200
    from lower.profile import NEAR_TIE, _space

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from decode_attention_sweep import decode_attention

    g = decode_attention(32, 1, 8448, 96, 32, mask=True)
    op = _kernel(g)
    space = _space(g, op, {}, 6, WARPS, STAGES, ("dot",), H200)
    head = space.picked[:space.head]
    best = min(p for p, _ in head)
    near = [c.split for p, c in head if p <= best * NEAR_TIE]
    assert {8, 11, 12} <= set(near)
    assert [c.split for _, c in head][:3] == [12, 11, 8]
    order = [c.split for _, c in head]
    assert all(order.index(s) > order.index(8) for s in (22, 24) if s in order)


def test_near_tied_split_factors_leave_each_program_a_pipelines_worth_of_steps():
    """The same kernel over 2,304 keys (72 steps): split-K 18 fills more of the wave than 12
    but leaves a program four steps, under twice its three stages; the card ran it 14.5 μs
    against split-K 12's 12.4 (six steps). It is not promoted over the near ties."""
    import sys
    from pathlib import Path

    from lower.cost_model import H200
    from lower.profile import _space

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from decode_attention_sweep import decode_attention

    g = decode_attention(32, 1, 2304, 96, 32, mask=True)
    space = _space(g, _kernel(g), {}, 6, WARPS, STAGES, ("dot",), H200)
    order = [c.split for _, c in space.picked[:space.head]]
    assert order.index(12) < order.index(18) and order.index(8) < order.index(18), order


def test_a_lowering_faster_at_the_first_pick_is_not_imposed_where_the_model_prices_it_far_dearer(monkeypatch):
    """The first pick's siblings decide a mode for the later split factors only where the model
    prices that mode within CONFORM_SPREAD of their own pick: Phi-3-mini's down projection (one
    row, 8192 → 3072, H200) ran the CUDA-core product of 16-column programs at split-K 2 in
    17.1 μs against tl.dot's 18.1, and of 32-column programs at split-K 4 and 8 in 23.2 and 38.2
    against 15.5 and 15.7. Here the CUDA-core lowering is faster at the first pick's layout
    only: the later factors are still timed in tl.dot."""

    from lower.cost_model import H200, for_timing
    from lower.profile import CONFORM_SPREAD, SMALL_MM_MENU, _space, tune

    from mugraph.core.benchmarks.handwritten import gemv

    g = gemv(1, 8192, 3072, 32, 128, "residual", "bfloat16")
    op = _kernel(g)
    dev = for_timing(H200, "dram")
    space = _space(g, op, {}, 6, WARPS, STAGES, SMALL_MM_MENU, dev)
    head = [c for _, c in space.picked[:space.head]]
    first = head[0]
    pred = {c.label(): p for p, c in space.cands}

    def layout(c):
        return (c.split, c.sub, c.chunk)

    def landscape(c):  # the CUDA-core product wins at the first pick's layout, loses twice over elsewhere
        if c.small_mm == "dot":
            return 1.0
        return 0.9 if layout(c) == layout(first) else 2.0

    calls = _fake_gpu(monkeypatch, landscape, [0.0])
    tune(g, inputs={}, budget_s=len(head) + 3, device_params=dev)
    assert calls[0] == first and any(c.small_mm != "dot" and layout(c) == layout(first) for c in calls[1:3])
    later = {}
    for c in calls[3:]:
        later.setdefault(c.split, c)
    dear = [c for s, c in later.items() if s != first.split
            and pred.get(dataclasses.replace(c, small_mm="v").label(), float("inf")) > CONFORM_SPREAD * pred[c.label()]]
    assert dear and all(c.small_mm == "dot" for c in dear), [c.label() for c in calls]


def test_the_best_priced_split_factor_leads_unless_held_back():
    """Among split factors priced within NEAR_TIE, the best priced is timed first, then the
    fullest single wave: where splitting buys nothing the fullest wave is a split (Phi-3-mini's
    gated projection ran 25.4 μs unsplit, the model's pick, and 27.0–29.2 split 2–6 ways, which
    the fullest-wave order timed first). A best-priced factor that needs a second wave, or runs
    too few steps a program, does not lead: the best priced of the others does."""
    from lower import KernelConfig
    from lower.profile import _split_factors_first

    def pick(split: int, price: float) -> tuple[float, KernelConfig]:
        return price, KernelConfig(split=split)

    fill = {1: (0.3, 48), 3: (0.6, 16), 6: (0.97, 8), 12: (1.9, 4)}   # split -> (waves, steps a program)
    waves = lambda c: fill[c.split]  # noqa: E731
    order = [c.split for _, c in _split_factors_first([pick(1, 26.6), pick(3, 27.0), pick(6, 27.4), pick(12, 27.5)],
                                                      waves)]
    assert order == [1, 6, 3, 12]
    # the best priced needs a second wave: the next best priced leads instead
    order = [c.split for _, c in _split_factors_first([pick(12, 26.0), pick(1, 26.6), pick(3, 27.0), pick(6, 27.4)],
                                                      waves)]
    assert order == [1, 6, 3, 12]
