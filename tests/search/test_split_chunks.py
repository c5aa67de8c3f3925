"""search.rewrite.split_chunks: the chunk counts of a split-loop follow the grid, the loop
and the SM count (not a fixed list); split_variants ranks the combine kernel in."""

import mugraph as mg
from mugraph.core.benchmarks import programs
from online_graphs import gqa_blocks
from search.enumerate import GPU_SMS, cost_key
from search.rewrite import MAX_SPLIT_BLOCKS, combine_dims, split_chunks, split_loop, split_variants


def test_chunks_fill_the_gpu_from_few_blocks():
    # 2 blocks (one per KV head), a loop of 64: 3/4 of 132 SMs is 99 blocks, which no
    # divisor reaches -> the whole loop (64), with its half and quarter
    assert split_chunks(2, 64) == [16, 32, 64]
    # 16 blocks: 8 chunks reach 128 >= 99
    assert split_chunks(16, 64) == [2, 4, 8, 16]
    # a loop too short to fill: every divisor up to the loop, none past it
    assert split_chunks(2, 4) == [2, 4]


def test_variants_not_predicted_faster_than_their_source_are_not_proposed():
    from search.derive import splits

    p, g = _attention(2, 4)  # a reduced shape: a second launch costs more than it saves
    assert split_variants(g) and splits([g], None, {}) == []


def test_chunks_follow_the_sm_count():
    assert split_chunks(2, 64, sms=16) == [2, 4, 8, 16]     # 8 chunks fill 12 of 16
    assert split_chunks(2, 64, sms=40) == [4, 8, 16, 32]    # 16 chunks fill 30 of 40


def test_enough_blocks_get_at_most_the_coarsest_split():
    assert split_chunks(100, 8) == [2]            # short of one full wave (132)
    assert split_chunks(GPU_SMS, 8) == []          # a full wave already
    assert split_chunks(96, 1) == []               # no loop
    assert split_chunks(100, 3) == []              # enough blocks, and 2 does not divide 3
    assert split_chunks(96, 3) == [3]              # just short of 3/4 of the SMs: 3 chunks
    assert all(2 * s <= MAX_SPLIT_BLOCKS for s in split_chunks(2, 4096))


def _kernel(g):
    return next(op.id for op in g.ops if op.kind == "graph_defined")


def _attention(grid0, loop):
    p = programs.program("gqa", 1, small=True)
    return p, gqa_blocks(p, grid0, loop)


def test_combine_dims_are_elementwise_free_dims_only():
    p, g = _attention(2, 4)
    # the output (per KV head: 32 query rows × 16 dims): rows may be cut (the accumulators
    # E·V and Σe both have them), dims too only when the partials lie along rows
    assert combine_dims(g, _kernel(g)) == [(1, 32)]
    assert combine_dims(g, _kernel(g), lay_first=True) == [(2, 16)]
    # a post-loop op that is not element-wise (a reduction) forbids any cut
    p2 = mg.Program("rowsum_mm")
    X = p2.input("X", (4, 64), "float32"); W = p2.input("W", (64, 8), "float32")
    p2.output(mg.sum(X @ W, 1))
    h = mg.KernelGraph("rowsum_mm")
    x = h.input("X", (4, 64), "float32"); w = h.input("W", (64, 8), "float32")
    b = mg.BlockGraph((2, 1, 1), 4)
    acc = b.accum(b.input(x, (0, None, None), 1) @ b.input(w, (None, None, None), 0))
    b.output(mg.sum(acc, 1), (0, None, None))
    h.output(h.kernel(b)[0])
    assert combine_dims(h, _kernel(h)) == []


def test_regridded_combine_is_equivalent_and_its_cost_counted():
    p, g = _attention(2, 4)
    plain = split_loop(g, 3, 4)
    cut = split_loop(g, 3, 4, combine_tiles=2)
    assert plain.ops[-1].attrs["block"].grid == (2, 1, 1) and cut.ops[-1].attrs["block"].grid == (2, 2, 1)
    x = {t.name: __import__("numpy").random.default_rng(0).uniform(0.5, 1.5, t.shape) for t in p.inputs}
    ref = mg.evaluate(p, x)[0]
    for v in (plain, cut):
        assert abs(mg.evaluate(v, x)[0] - ref).max() < 1e-9 * abs(ref).max()
    assert split_loop(g, 3, 4, combine_tiles=3) is None  # 3 does not divide the 32 rows
    assert cost_key(plain)[0] == cost_key(cut)[0] == 2
    # the cost key prices the combining kernel: at gqa b=1's shape (16 chunks of 256 rows ×
    # 64 per head) the combine on 2 blocks is slower than re-gridded over 32
    full = programs.gqa(1)
    one = gqa_blocks(full, 2, 64)
    k = _kernel(one)
    assert cost_key(split_loop(one, k, 16, combine_tiles=16))[1] < cost_key(split_loop(one, k, 16))[1]


def test_split_variants_of_a_one_block_per_head_kernel_beat_it_in_the_cost_key():
    """The full-size gqa b=1 shape: 2 blocks loop over 4096 keys; a split-KV pair puts
    many more blocks in flight and the cost key (combine included) must see it."""
    p = programs.gqa(1)
    g = mg.KernelGraph("gqa")
    q, k, v = (g.input(t.name, t.shape, t.dtype) for t in p.inputs)
    b = mg.BlockGraph((2, 1, 1), 64)
    qt = b.input(q, (0, None, None)); kt = b.input(k, (0, None, None), 2); vt = b.input(v, (0, None, None), 1)
    e = mg.exp(qt @ kt)
    b.output(b.accum(e @ vt) / b.accum(mg.sum(e, 2)), (0, None, None))
    g.output(g.kernel(b)[0])
    vs = split_variants(g)
    chunks = sorted({v.ops[3].attrs["block"].grid[1] for v in vs})
    assert chunks == split_chunks(2, 64)
    best = min(vs, key=lambda v: cost_key(v)[1])
    assert cost_key(best)[1] < cost_key(g)[1] / 2


def test_verification_order_takes_the_cheapest_kernel_count_first():
    from search.verification import order as _order
    from search.records import Match

    def m(kernels, est, task, sig="gd"):
        return Match((kernels, est, 0, 0), task, 0, {}, sig, "x")

    ones = [m(1, 37.0, 0), m(1, 40.0, 1)]
    pairs = [m(2, 9.6, 100, "gd+gd"), m(2, 9.7, 101, "gd+gd")]
    # round-robin over kernel counts, the count with the cheapest estimate leading each round
    assert [x.cost[:2] for x in _order([*ones, *pairs])] == [(2, 9.6), (1, 37.0), (2, 9.7), (1, 40.0)]
    # a tie in the estimate: fewer kernels first
    assert [x.kernels for x in _order([m(2, 5.0, 9, "gd+gd"), m(1, 5.0, 0)])] == [1, 2]


def test_search_verifies_split_kv_pairs_of_attention():
    """The whole search on a reduced gqa with a long key loop (1024 keys, 64 steps): split-loop
    variants of its matches are proposed, fingerprinted and fully verified — split-KV pairs
    (a kernel over key chunks, then a combining kernel looping over them) among the
    verified graphs, each equal to the program in float64."""
    import numpy as np

    import search
    from search import SearchConfig

    p = programs.gqa(1, queries=16, head_dim=16, kv=1024)
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=7, tile_sizes=(16,), forloop_ranges=(64,), workers=1,
                       executor="serial", time_limit=60, verify_reserve=15, progress=False, verify_error=1e-3)
    r = search.run(p, cfg)
    pairs = [g for g, o in zip(r.graphs, r.origins) if o == "split-loop"]
    assert pairs and r.stats["derived"]["split_matches"] >= len(pairs)
    # the same phase offers the cheapest kernels on other tiles (search.derive.retiles)
    assert r.stats["derived"]["retile_variants"] > 0 and r.stats["derived"]["retile_matches"] > 0
    retiled = [g for g, o in zip(r.graphs, r.origins) if o == "retile"]
    rng = np.random.default_rng(0)
    x = {t.name: rng.uniform(0.5, 1.5, t.shape) for t in p.inputs}
    want = mg.evaluate(p, x)[0]
    for g in pairs:
        first, combine = (op.attrs["block"] for op in g.ops if op.kind == "graph_defined")
        assert combine.forloop > 1 and combine.forloop in first.grid
        assert np.allclose(mg.evaluate(g, x)[0], want, rtol=1e-9)
    for g in retiled:
        assert np.allclose(mg.evaluate(g, x)[0], want, rtol=1e-9)


def _full_attention():
    """gqa b=1 at full size, one block per KV head looping over all 4096 keys."""
    p = programs.program("gqa", 1)
    return gqa_blocks(p, 2, 64)


def _match_all(graphs, end):
    return [True] * len(graphs)


def test_an_estimate_ranks_the_split_shortlist():
    """With ``estimate`` the shortlist (the best by cost_key) is ranked by it: an estimate
    that prefers the most blocks fingerprints the widest splits, not the key's favourites;
    the chosen are still one per kernel shape, and each is one of the key's shortlist."""
    from search.derive import SHORTLIST, kernel_shape, splits

    g = _full_attention()
    by_key = splits([g], _match_all, {}, limit=4)
    widest = lambda h: -h.ops[3].attrs["block"].num_blocks  # noqa: E731 - one-line price
    stats: dict = {}
    by_est = splits([g], _match_all, stats, limit=4, estimate=widest)
    assert len(by_est) == 4 and stats["split_priced"] > 4
    blocks = [p.graph.ops[3].attrs["block"].num_blocks for p in by_est]
    assert blocks == sorted(blocks, reverse=True) and blocks[0] > min(
        p.graph.ops[3].attrs["block"].num_blocks for p in by_key)
    assert len({kernel_shape(p.graph) for p in by_est}) == 4
    shortlist = {kernel_shape(p.graph) for p in splits([g], _match_all, {}, limit=4 * SHORTLIST)}
    assert {kernel_shape(p.graph) for p in by_est} <= shortlist


def test_an_estimate_that_fails_or_runs_out_of_time_keeps_the_key_order():
    import time

    from search.derive import splits
    from search.rewrite import graph_key

    g = _full_attention()
    by_key = [graph_key(p.graph) for p in splits([g], _match_all, {}, limit=4)]

    def broken(h):
        raise ValueError("outside what the lowering prices")

    stats: dict = {}
    assert [graph_key(p.graph) for p in splits([g], _match_all, stats, limit=4, estimate=broken)] == by_key
    assert stats["split_priced"] == 0
    stats = {}
    slow = lambda h: time.sleep(0.2) or 0.0  # noqa: E731 - one-line price
    late = splits([g], _match_all, stats, time.monotonic() + 0.2, limit=4, estimate=slow)
    assert stats["split_priced"] == 1 and [graph_key(p.graph) for p in late] == by_key
    # a phase that starts past its deadline makes no variants at all
    stats = {}
    assert splits([g], _match_all, stats, time.monotonic() - 1, limit=4) == [] and stats["split_variants"] == 0


def test_derived_candidates_take_turns_with_the_enumeration_in_their_own_order():
    """Within a kernel count the enumeration's matches and each kind of derived graph take
    turns; split proposals come in the order their derivation ranked them (the lowering's
    price), not by cost_key, so 3,616 enumerated pairs do not crowd out 8 split proposals."""
    from search.candidates import DERIVED as _DERIVED
    from search.verification import order as _order
    from search.records import Match

    def m(est, task, origin):
        return Match((2, est, 0, 0), task, 0, {"name": f"{origin}{est}"}, "gd+gd", origin)

    enum = [m(10.0 + i, i, "enumeration") for i in range(4)]
    # the derivation ranked the 12.7 proposal first (the lowering prices it best)
    split = [m(12.7, _DERIVED + 0, "split-loop"), m(9.0, _DERIVED + 1, "split-loop")]
    order = [x.graph["name"] for x in _order([*enum, *split])]
    assert order == ["split-loop12.7", "enumeration10.0", "split-loop9.0", "enumeration11.0",
                     "enumeration12.0", "enumeration13.0"]
    # composed graphs keep the key order, credit included: qknorm_gqa b=8's composition with
    # a 64-block attention kernel (key 34.1, credited 26.2 for its split) was proposed after
    # the 128-block ones (30.9) and ran 26 μs against their 49–57
    composed = [m(30.9, _DERIVED + 0, "composed"), m(26.2, _DERIVED + 1, "composed")]
    assert [x.cost[1] for x in _order(composed)] == [26.2, 30.9]


def test_a_piece_offers_the_keys_and_the_estimates_favourites_in_turns():
    """A piece of a composition offers its six best by cost_key; with an estimate, those
    take turns with the six the estimate prices best — the key's first at 0, the
    estimate's at 1 — without repeats; an estimate that fails changes nothing."""
    from search.derive import PIECE_RESULTS, _piece_graphs
    from search.rewrite import graph_key, split_variants

    gqa = programs.program("gqa", 1)
    graphs = [h for loop in (64, 128) for h in split_variants(gqa_blocks(gqa, 2, loop))]
    assert len(graphs) > 2 * PIECE_RESULTS
    keys = [graph_key(g) for g in graphs]
    far = {k: i for i, k in enumerate(keys)}
    assert [graph_key(g) for g in _piece_graphs(graphs, None, 0.0, {})] == keys[:PIECE_RESULTS]

    stats: dict = {}
    turns = [graph_key(g) for g in _piece_graphs(graphs, lambda g: -far[graph_key(g)], float("inf"), stats)]
    assert stats["priced"] == len(graphs)
    assert len(turns) == len(set(turns)) == 2 * PIECE_RESULTS
    assert turns[0::2] == keys[:PIECE_RESULTS]
    assert turns[1::2] == keys[::-1][:PIECE_RESULTS]

    def broken(g):
        raise ValueError("outside what the lowering prices")

    assert [graph_key(g) for g in _piece_graphs(graphs, broken, float("inf"), {})] == keys[:PIECE_RESULTS]
    # priced by the estimate, the key's favourite also first: it is offered once
    same = [graph_key(g) for g in _piece_graphs(graphs, lambda g: far[graph_key(g)], float("inf"), {})]
    assert same == keys[:PIECE_RESULTS]


def test_the_retile_phase_climbs_to_a_tiling_further_away():
    """With an estimate, the tile variants go on from the cheapest one while the price
    falls (search.derive.climb): a price that prefers 256 loop steps reaches them from a
    source of 32 through the near tilings' 128 — the near tilings alone stop there — and
    proposes them first; without an estimate nothing is climbed."""
    from search.derive import CLIMB_STEPS, kernel_shape, retiles

    g = gqa_blocks(programs.program("gqa", 1), 2, 32)
    loop = lambda h: h.ops[3].attrs["block"].forloop  # noqa: E731 - one-line reading
    price = lambda h: abs(loop(h) - 256)  # noqa: E731 - one-line price
    stats: dict = {}
    out = retiles([g], stats, limit=4, estimate=price)
    assert stats["retile_climbed"] == 1 and loop(out[0].graph) == 256
    assert all(o.origin == "retile" for o in out)
    # the near tilings alone offer a loop's step up to two doublings or halvings away, never three
    plain: dict = {}
    offered = {loop(p.graph) for p in retiles([g], plain, limit=16)}
    assert offered == {64, 128} and "retile_climbed" not in plain
    # the climb stops where no variant is cheaper, and after CLIMB_STEPS steps
    far = lambda h: -loop(h)  # noqa: E731 - always one more doubling
    stats = {}
    climbed = retiles([g], stats, limit=4, estimate=far)
    assert stats["retile_climbed"] <= CLIMB_STEPS
    assert loop(climbed[0].graph) == 128 * 2 ** stats["retile_climbed"]
    assert len({kernel_shape(p.graph) for p in climbed}) == len(climbed)


def test_near_tilings_go_two_steps_along_a_loop_and_one_along_a_grid():
    """A loop's step is the one tile the lowering never changes, so the near tilings of a
    graph reach steps two doublings or halvings away; a grid axis moves one step."""
    from search.derive import kernel_shape, near_tilings
    from search.rewrite import tile_variants

    g = _full_attention()
    (grid0, loop0), = [s for s in kernel_shape(g) if isinstance(s, tuple) and s[1] > 1]
    shapes = [s for h in near_tilings(g, None) for s in kernel_shape(h) if isinstance(s, tuple) and s[1] > 1]
    loops = {loop for grid, loop in shapes if grid == grid0}
    assert {loop0 // 2, 2 * loop0, 4 * loop0} <= loops and loop0 not in loops
    one_step = {s for h in tile_variants(g, None) for s in kernel_shape(h) if isinstance(s, tuple)}
    assert {grid for grid, _ in shapes} == {grid for grid, _ in one_step}


def test_a_climb_keeps_to_its_time_and_survives_a_failing_price():
    import time

    from search.derive import climb

    g = _full_attention()

    def broken(h):
        raise ValueError("outside what the lowering prices")

    stats: dict = {}
    assert climb([g], broken, None, None, stats) == [] and stats["retile_climbed"] == 0
    stats = {}
    assert climb([g], lambda h: 0.0, time.monotonic() - 1, None, stats) == [] and stats["retile_climbed"] == 0
