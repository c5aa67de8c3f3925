"""search.loops: a loop introduced into a loop-free kernel over its contracted dims — which
iterators step (the dim-flow analysis), the variants' grids and loop lengths, and every
variant equivalent to its source (checked by the verifier, on hand-written kernels and on
random ones)."""

from fractions import Fraction

import pytest

import mugraph.core.builder as mg
import verify
from mugraph.core.benchmarks import handwritten as hw
from mugraph.core.ir import BlockGraph, KernelGraph
from mugraph.core.randgraph import Profile, random_ugraph
from search import loops
from search.loops import introduce_loop, loop_assignments, loop_variants
from search.derive import retiles
from search.rewrite import tile_variants

GD = "graph_defined"


def _block(g: KernelGraph) -> BlockGraph:
    return next(o for o in g.ops if o.kind == GD).attrs["block"]


def _one_kernel(build, inputs: dict, grid=(4, 1, 1), name="k") -> KernelGraph:
    """One loop-free kernel: ``build(bg, tiles)`` returns its saved tile (columns over the grid)."""
    kg = KernelGraph(name)
    ins = {n: kg.input(n, s, "float16") for n, (s, _) in inputs.items()}
    bg = BlockGraph(grid=grid, forloop=1)
    tiles = {n: bg.input(ins[n], imap=imap) for n, (_, imap) in inputs.items()}
    bg.output(build(bg, tiles), omap=(1,))
    (y,) = kg.kernel(bg)
    kg.output(y)
    return kg


def test_gated_projection_steps_its_three_operands_along_k():
    g = hw.gated_mlp(hidden=512, out=1024, col_tile=16, loop=1, act="silu", rows=1)
    bg = _block(g)
    x, w1, w2 = (o.id for o in bg.ops if o.kind == "iterator")
    assert loop_assignments(bg) == [{x: 1, w1: 0, w2: 0}]
    shapes = {(_block(h).grid, _block(h).forloop) for h in loop_variants(g)}
    # steps of 32 and 128 of K = 512, on the kernel's 64 blocks and on 32 and 16
    assert shapes == {((n, 1, 1), f) for n in (64, 32, 16) for f in (16, 4)}
    assert all(verify.equivalent(g, h, seed=0).equivalent for h in loop_variants(g))
    # the retiling proposals include them (a loop-free kernel has no loop to halve)
    assert not any(_block(h).forloop > 1 for h in tile_variants(g))
    proposed = retiles([g], {}, limit=16)
    assert any(_block(p.graph).forloop > 1 for p in proposed)


def test_norm_prologue_steps_its_sum_of_squares_with_the_matmul():
    g = hw.rmsnorm_matmul(hidden=256, out=512, col_tile=64, loop=1)
    bg = _block(g)
    x, gain, w = (o.id for o in bg.ops if o.kind == "iterator")
    assert loop_assignments(bg) == [{x: 1, gain: 0, w: 0}]
    vs = loop_variants(g)
    assert vs and all(verify.equivalent(g, h, seed=0).equivalent for h in vs)


def test_residual_read_after_the_loop_does_not_step():
    def build(bg, t):
        return bg.accum(t["X"] @ t["W"]) + t["R"]
    g = _one_kernel(build, {"X": ((2, 256), None), "W": ((256, 512), (1,)), "R": ((2, 512), (1,))})
    bg = _block(g)
    x, w, r = (o.id for o in bg.ops if o.kind == "iterator")
    assert loop_assignments(bg) == [{x: 1, w: 0}]
    vs = loop_variants(g)
    assert vs and all(verify.equivalent(g, h, seed=0).equivalent for h in vs)


@pytest.mark.parametrize("body", ["square", "plus_bias", "max"])
def test_terms_that_do_not_add_up_over_steps_get_no_loop(body):
    def build(bg, t):
        if body == "square":      # (Σ partials)² is not Σ partials²
            return bg.accum(mg.square(t["X"] @ t["W"]))
        if body == "plus_bias":   # a bias added on every step would be added F times
            return bg.accum(t["X"] @ t["W"] + t["B"])
        # a max over the contracted dim is not a sum over its steps
        return bg.accum(mg.max(t["X"], 1) * (t["X"] @ t["W"]))
    g = _one_kernel(build, {"X": ((2, 256), None), "W": ((256, 512), (1,)), "B": ((2, 512), (1,))})
    assert loop_assignments(_block(g)) == []
    assert loop_variants(g) == []


def test_a_looped_kernel_is_left_to_the_retiling():
    g = hw.gated_mlp(hidden=512, out=1024, col_tile=16, loop=8, act="silu", rows=1)
    assert loop_assignments(_block(g)) == [] and loop_variants(g) == []
    assert introduce_loop(g, next(o.id for o in g.ops if o.kind == GD), {}, 2) is None


def test_a_step_that_does_not_divide_every_stepped_tile_is_not_offered():
    # K = 96: steps of 32 give 3 (offered), steps of 128 do not divide it
    g = hw.gated_mlp(hidden=96, out=256, col_tile=16, loop=1, act="silu", rows=1)
    assert {_block(h).forloop for h in loop_variants(g)} == {3}


#: small random loop-free Lax kernels: matmuls, sums, products, residuals after the loop
_RANDOM = Profile(square=8, grid=((1, 2), (1,), (1,)), forloops=(1,),
                  ops=frozenset({"matmul", "add", "sub", "mul", "div", "exp", "sum", "scale", "square", "const"}),
                  steps=("matmul", "matmul", "matmul", "binary", "unary", "reduce", "reduce", "const"),
                  unary=("scale", "exp", "square"), binary=("add", "sub", "mul", "div"),
                  exp_scale=Fraction(1, 4), chain=False, inputs=(2, 3), body_ops=(1, 4), post_ops=(0, 2),
                  invariant_post=0.5, partner=False, acc_tiles=False, savers=(1, 2), save_latest=True, lax=True,
                  name="random_loop_free")


def test_every_loop_introduced_into_a_random_kernel_is_equivalent(monkeypatch):
    # steps of 2 so that 8×8 inputs can loop; every variant the analysis admits must be
    # the source's function (the verifier decides), and the analysis must admit some
    monkeypatch.setattr(loops, "LOOP_STEPS", (2,))
    checked = 0
    for seed in range(200):
        g = random_ugraph(seed, _RANDOM)
        for h in loop_variants(g)[:1]:
            v = verify.equivalent(g, h, seed=seed, float_check=False)
            assert v.equivalent, f"seed {seed}: {v}"
            checked += 1
    assert checked >= 20
