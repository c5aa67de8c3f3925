"""The search finds the online softmax (docs/design.md §3.4) by its general moves: the
enumerator offers a running max and sums rescaled to it wherever a program has a free
shift, and the split-loop rewrite folds a split's partials with each accumulator's own
monoid. Nothing here names attention: the program is a safe softmax-weighted sum, and the
whole row cannot sit in one block's shared memory, so only a loop over it can match."""

import pytest

import verify
from mugraph.core.benchmarks.programs import decode_attention
from mugraph.core.ir import RESCALED, accum_monoid
from search import driver
from search.config import SearchConfig
from search.rewrite import split_loop

from online_graphs import online_softmax as _online
from online_graphs import whole_softmax as _program


def _monoids(g):
    return [accum_monoid(o) for op in g.ops if op.kind == "graph_defined" for o in op.attrs["block"].ops
            if o.kind == "accum"]


def _first_proven(p, smem_kb: int, time_limit: float, **more):
    """The first μGraph one worker's search verifies for ``p`` under ``smem_kb`` KB of shared
    memory (no composition, no split loops), asserted proven; with the search's config
    (``more``: other config fields)."""
    cfg = SearchConfig(time_limit=time_limit, workers=1, progress=False, smem_budget=smem_kb * 1024,
                       compose=False, split_loops=False, max_results=1, verify_per_kernels=1, **more)
    r = driver.run(p, cfg)
    assert r.graphs, r.stats
    assert r.verdicts[0]["equivalent"] and r.verdicts[0]["bound_met"]
    return r.graphs[0], cfg


def test_the_search_finds_a_proven_online_softmax():
    """8 query rows against 1,024 keys of head dim 32 with a 16 KB shared-memory budget: a
    block can hold a fraction of the keys only, so every match loops over them."""
    g, _ = _first_proven(decode_attention(b=1, heads=8, kv_heads=1, kv=1024, head_dim=32, safe=True,
                                          dtype="float16"), smem_kb=16, time_limit=15)
    assert RESCALED in _monoids(g)


@pytest.mark.parametrize("chunks", [2, 4])
def test_a_split_online_loop_combines_with_rescaled_accumulators(chunks):
    g = _online()
    kernel = next(op.id for op in g.ops if op.kind == "graph_defined")
    h = split_loop(g, kernel, chunks)
    assert h is not None and h.num_kernels == 2
    assert _monoids(h).count(RESCALED) == 4  # two per kernel: numerator and denominator
    v = verify.equivalent(_program(), h, seed=3, float_check=False)
    assert v.equivalent and v.bound_met, v


def test_a_row_too_long_for_the_listed_loop_ranges_gets_a_longer_loop():
    """2,048 keys at head dim 16 under a 2 KB budget, loop ranges listed up to 16: 16 steps
    of 128 keys hold 8 KB of K and V tiles at any grid, so no listed range fits; the mapping
    doubles the longest (up to 256 steps) and the search still finds the online softmax."""
    g, cfg = _first_proven(decode_attention(b=1, heads=8, kv_heads=1, kv=2048, head_dim=16, safe=True,
                                            dtype="float16"), smem_kb=2, time_limit=16, forloop_ranges=(8, 16))
    loops = [op.attrs["block"].forloop for op in g.ops if op.kind == "graph_defined"]
    assert max(loops) > max(cfg.forloop_ranges) and RESCALED in _monoids(g)


def test_tile_variants_of_an_online_kernel_are_proven_equal():
    """``search.rewrite.tile_variants``: the online kernel on twice and half the steps (its
    value does not depend on where the steps cut the keys) — each proven equal to the
    whole-row program, not merely fingerprinted."""
    from search.rewrite import tile_variants

    for steps, want in ((4, {2}), (2, {4})):  # 64 keys: steps of 16 are the least, one block
        shapes = set()
        for h in tile_variants(_online(steps=steps)):
            (b,) = [op.attrs["block"] for op in h.ops if op.kind == "graph_defined"]
            shapes.add(b.forloop)
            v = verify.equivalent(_program(), h, seed=4, float_check=False)
            assert v.equivalent and v.bound_met, (b.grid, b.forloop, v)
        assert shapes == want, (steps, shapes)
    # halving the 4 steps doubles the K and V tiles (32 × 8 fp32: 1 KB each): not within 512 bytes
    assert tile_variants(_online(steps=4), smem_budget=512) == []


def test_a_retiled_grid_keeps_the_function_and_an_illegal_one_is_refused():
    """Rows re-gridded: twice and half the blocks, each proven equal; a loop cut below the
    least tile, or to no loop at all, is not offered or is refused."""
    from mugraph.core.benchmarks import program, reference
    from search.rewrite import MIN_RETILE, retile, tile_variants

    p, g = program("rmsnorm_matmul", small=True), reference("rmsnorm_matmul", small=True)
    k = next(op for op in g.ops if op.kind == "graph_defined")
    b = k.attrs["block"]
    assert retile(g, k.id, b.grid, 1 if b.forloop > 1 else 2) is None  # a loop added or removed: refused
    variants = tile_variants(g)
    assert variants
    for h in variants:
        hb = next(op for op in h.ops if op.kind == "graph_defined").attrs["block"]
        assert (hb.grid, hb.forloop) != (b.grid, b.forloop)
        if hb.forloop > b.forloop:  # the cut steps keep the least tile
            assert min(o.outputs[0].shape[o.attrs["fmap"]] for o in hb.ops
                       if o.kind == "iterator" and o.attrs["fmap"] is not None) >= MIN_RETILE
        v = verify.equivalent(p, h, seed=5, float_check=False)
        assert v.equivalent and v.bound_met, (hb.grid, hb.forloop, v)


def test_the_proposer_pairs_a_max_only_with_its_own_tile():
    """The rule itself, on a level holding x, y = scale(x) and m = max(x): ``x − m`` is
    offered; ``y − m`` (the shape of the graphs the float check rejected: the scaled scores
    minus the unscaled scores' max) and ``m − x`` are not; subtractions without a max are
    untouched."""
    from search.proposals import OpProposer
    from search.walk import _Level

    lv = _Level({})
    lv.add_tensor((4, 8), 0, (), producer="input")
    lv.push(("op",), (0,), (0,), [((4, 8), 1, (), None, True, "scale")])
    lv.push(("op",), (1,), (0,), [((4, 1), 2, (), None, False, "max")])
    ok = OpProposer._shifts_its_own
    assert ok(lv, 0, 2) and not ok(lv, 1, 2) and not ok(lv, 2, 0) and ok(lv, 0, 1) and ok(lv, 1, 0)
