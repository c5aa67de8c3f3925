"""search.grids: a one-block kernel spread over a grid — which iterators and savers the new
axis cuts (the dim-flow analysis), the block counts offered, and every variant equivalent to
its source (checked by the verifier, on hand-written kernels and on random ones)."""

from fractions import Fraction

import pytest

import mugraph.core.builder as mg
import verify
from mugraph.core.benchmarks import handwritten as hw
from mugraph.core.ir import BlockGraph, KernelGraph
from mugraph.core.randgraph import Profile, random_ugraph
from search.derive import retiles
from search.grids import grid_assignments, grid_variants, rereads_dominate
from search.rewrite import tile_variants

GD = "graph_defined"


def _block(g: KernelGraph) -> BlockGraph:
    return next(o for o in g.ops if o.kind == GD).attrs["block"]


def _its(bg: BlockGraph) -> list[int]:
    return [o.id for o in bg.ops if o.kind == "iterator"]


def _one_block(build, inputs: dict, forloop: int = 1, outputs: int = 1) -> KernelGraph:
    """One one-block kernel: ``build(bg, tiles)`` returns its saved tiles (``fmaps`` given
    per input as the second item of ``inputs``' values)."""
    kg = KernelGraph("k")
    ins = {n: kg.input(n, s, "float16") for n, (s, _) in inputs.items()}
    bg = BlockGraph(grid=(1, 1, 1), forloop=forloop)
    tiles = {n: bg.input(ins[n], fmap=fm) for n, (_, fm) in inputs.items()}
    outs = build(bg, tiles)
    for t in outs:
        bg.output(t)
    for y in kg.kernel(bg):
        kg.output(y)
    return kg


def test_norm_and_projection_spread_over_the_columns():
    g = hw.rmsnorm_matmul(hidden=256, out=512, col_tile=512, loop=4)  # one block, a loop of 4
    bg = _block(g)
    x, gain, w = _its(bg)
    assert grid_assignments(bg) == [({w: 1}, [1])]
    vs = grid_variants(g)
    # the finest keeps 16 columns a block (512 / 32), and a quarter and a sixteenth of it
    assert [_block(h).grid for h in vs] == [(32, 1, 1), (8, 1, 1), (2, 1, 1)]
    assert all(_block(h).forloop == 4 for h in vs)
    assert all(verify.equivalent(g, h, seed=0).equivalent for h in vs)
    # offered among the retiling proposals; the halving and doubling leave the one block alone
    assert all(_block(h).num_blocks == 1 for h in tile_variants(g))
    assert any(_block(p.graph).num_blocks > 1 for p in retiles([g], {}, limit=8))


def test_two_projections_of_one_row_cut_both():
    # one row times two weights of different widths (a q and a k projection): both weights
    # and both outputs cut along their columns; the narrower one sets the block count
    g = _one_block(lambda bg, t: [bg.accum(t["X"] @ t["Wq"]), bg.accum(t["X"] @ t["Wk"])],
                   {"X": ((1, 256), 1), "Wq": ((256, 512), 0), "Wk": ((256, 128), 0)}, forloop=4)
    bg = _block(g)
    x, wq, wk = _its(bg)
    assert grid_assignments(bg) == [({wq: 1, wk: 1}, [1, 1])]
    vs = grid_variants(g)
    assert [_block(h).grid for h in vs] == [(8, 1, 1), (2, 1, 1)]  # 128 / 8 = 16 columns a block
    assert all(verify.equivalent(g, h, seed=0).equivalent for h in vs)


@pytest.mark.parametrize("body", ["row_sum", "contracted", "invariant_saved"])
def test_slices_that_need_each_other_get_no_grid(body):
    if body == "row_sum":        # a sum over the columns the new axis would cut
        g = _one_block(lambda bg, t: [bg.accum(mg.sum(t["X"] @ t["W"], 1))],
                       {"X": ((2, 256), None), "W": ((256, 128), None)})
    elif body == "contracted":   # only K is long enough to cut, and K is summed by the matmul
        g = _one_block(lambda bg, t: [bg.accum(t["X"] @ t["W"])],
                       {"X": ((2, 256), None), "W": ((256, 16), None)})
    else:                        # a saver of a tile every block would compute alike
        g = _one_block(lambda bg, t: [bg.accum(t["X"] @ t["W"]), bg.accum(mg.sum(t["X"], 1))],
                       {"X": ((2, 256), None), "W": ((256, 128), None)})
    assert grid_assignments(_block(g)) == [] and grid_variants(g) == []


def test_a_kernel_on_a_grid_is_left_to_the_retiling():
    g = hw.rmsnorm_matmul(hidden=256, out=512, col_tile=64, loop=4)  # 8 blocks
    assert grid_variants(g) == []


#: small random one-block Lax kernels over 64 × 64 inputs (so that a dim can be cut)
_RANDOM = Profile(square=64, grid=((1,), (1,), (1,)), forloops=(1, 2),
                  ops=frozenset({"matmul", "add", "sub", "mul", "div", "exp", "sum", "scale", "square", "const"}),
                  steps=("matmul", "binary", "binary", "unary", "reduce", "const", "posify"),
                  unary=("scale", "exp", "square"), binary=("add", "sub", "mul", "div"),
                  exp_scale=Fraction(1, 64), chain=False, inputs=(2, 3), body_ops=(1, 4), post_ops=(0, 2),
                  invariant_post=0.5, partner=False, acc_tiles=False, savers=(1, 2), save_latest=True, lax=True,
                  max_magnitude=None, exp_arg=None, name="random_one_block")


def _all_equivalent(pairs) -> int:
    """How many (seed, source, variant) triples were checked, each asserted equivalent."""
    checked = 0
    for seed, g, h in pairs:
        v = verify.equivalent(g, h, seed=seed, float_check=False)
        assert v.equivalent, f"seed {seed}: {v}"
        checked += 1
    return checked


def test_every_grid_introduced_into_a_random_kernel_is_equivalent():
    randoms = ((seed, random_ugraph(seed, _RANDOM)) for seed in range(120))
    assert _all_equivalent((seed, g, h) for seed, g in randoms for h in grid_variants(g)[:1]) >= 20


def test_a_grid_over_rows_that_rereads_the_weights_is_joined_and_spread_over_columns():
    # eight rows (new tokens), a block each, every block reading both weights whole: the
    # re-reads dominate, so the kernel is joined into one block and spread over the columns
    kg = KernelGraph("k")
    X, Wq, Wk = (kg.input(n, s, "float16") for n, s in (("X", (8, 256)), ("Wq", (256, 512)), ("Wk", (256, 128))))
    bg = BlockGraph(grid=(8, 1, 1), forloop=4)
    x = bg.input(X, (0, None, None), 1)
    wq, wk = bg.input(Wq, fmap=0), bg.input(Wk, fmap=0)
    bg.output(bg.accum(x @ wq), (0, None, None))
    bg.output(bg.accum(x @ wk), (0, None, None))
    for y in kg.kernel(bg):
        kg.output(y)
    assert rereads_dominate(bg)
    vs = grid_variants(kg)
    assert [_block(h).grid for h in vs] == [(8, 1, 1), (2, 1, 1)]  # 128 / 8 = 16 columns a block
    for h in vs:
        hb = _block(h)
        maps = [o.attrs["imap"] for o in hb.ops if o.kind == "iterator"]
        assert maps == [(None, None, None), (1, None, None), (1, None, None)]  # X whole, the weights cut
        assert hb.forloop == 4 and verify.equivalent(kg, h, seed=0).equivalent
    # a grid over the columns already reads the weights once: X (one row) is all it re-reads
    g = hw.rmsnorm_matmul(hidden=256, out=512, col_tile=64, loop=4)
    assert not rereads_dominate(_block(g)) and grid_variants(g) == []


def test_every_grid_a_joined_random_kernel_is_spread_over_is_equivalent():
    # random kernels put on a grid by one variant, then joined and spread again by another
    # wherever that grid makes them re-read more than they cut
    randoms = ((seed, random_ugraph(seed, _RANDOM)) for seed in range(120))
    on_grids = ((seed, g, h) for seed, g in randoms
                for h in grid_variants(g)[-1:]  # the coarsest grid: the most re-read per block cut
                if rereads_dominate(_block(h)))
    assert _all_equivalent((seed, g, j) for seed, g, h in on_grids for j in grid_variants(h)[:1]) >= 5


def test_a_block_whose_ops_do_not_take_the_joined_tiles_gets_no_joined_grid():
    # a block-level reshape to its own tile's shape (1 × 256 → 16 × 16) cannot replay on
    # the joined tile (8 × 256): no variant, and no error (the search goes on without it)
    kg = KernelGraph("k")
    X, W = kg.input("X", (8, 256), "float16"), kg.input("W", (16, 512), "float16")
    bg = BlockGraph(grid=(8, 1, 1), forloop=1)
    x = mg.reshape(bg.input(X, (0, None, None)), (16, 16))
    bg.output(bg.accum(mg.sum(x @ bg.input(W), 0)), (0, None, None))
    for y in kg.kernel(bg):
        kg.output(y)
    assert rereads_dominate(bg)
    assert grid_variants(kg) == []
