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
    """(A bias inside the sum gets its loop once moved past it: the next test.)"""
    def build(bg, t):
        if body == "square":      # (Σ partials)² is not Σ partials²
            return bg.accum(mg.square(t["X"] @ t["W"]))
        if body == "plus_bias":   # a bias added on every step would be added F times
            return bg.accum(t["X"] @ t["W"] + t["B"])
        # a max over the contracted dim is not a sum over its steps
        return bg.accum(mg.max(t["X"], 1) * (t["X"] @ t["W"]))
    g = _one_kernel(build, {"X": ((2, 256), None), "W": ((256, 512), (1,)), "B": ((2, 512), (1,))})
    assert loop_assignments(_block(g)) == []
    if body != "plus_bias":
        assert loop_variants(g) == []


def test_a_bias_summed_with_the_product_is_added_after_the_loop():
    """``accum(X @ W + B)`` over one step is ``accum(X @ W) + B``; only the second can loop (a
    loop would add B at every step). The enumeration spells a loop-free block's bias inside its
    accumulator, so the loop is introduced into the hoisted form — with both the sum and a
    scaled copy of it saved, as a projection whose pre-activation a later op reads (Phi-2's
    ``fc1``). A term that is a product's on both sides, or on neither, stays."""
    from search.loops import hoist_addends

    def build(bg, t):
        return bg.accum(t["B"] + t["X"] @ t["W"])
    g = _one_kernel(build, {"X": ((2, 256), None), "W": ((256, 512), (1,)), "B": ((2, 512), (1,))})
    h = hoist_addends(g, next(o.id for o in g.ops if o.kind == GD))
    post = [o.kind for o in _block(h).ops if o.kind != "iterator"]
    assert post == ["matmul", "accum", "add"] and verify.equivalent(g, h, seed=0).equivalent
    vs = loop_variants(g)
    assert vs and all(_block(v).forloop > 1 for v in vs)
    assert all(verify.equivalent(g, v, seed=0).equivalent for v in vs)

    kg = KernelGraph("two_saved")
    ins = {n: kg.input(n, s, "float16") for n, s in (("X", (1, 256)), ("W", (256, 512)), ("B", (512,)))}
    bg = BlockGraph(grid=(4, 1, 1), forloop=1)
    t = bg.accum(bg.input(ins["B"], imap=(0,)) + bg.input(ins["X"], imap=(None,)) @ bg.input(ins["W"], imap=(1,)))
    bg.output(mg.scale(t, 0.5), omap=(1,))
    bg.output(t, omap=(1,))
    half, whole = kg.kernel(bg)
    kg.output(whole)
    kg.output(half)
    vs = loop_variants(kg)
    assert vs and all(verify.equivalent(kg, v, seed=0).equivalent for v in vs)

    def both(bg, t):  # products on both sides: a sum of partials, looped as it is
        return bg.accum(t["X"] @ t["W"] + t["X"] @ t["V"])
    g = _one_kernel(both, {"X": ((2, 256), None), "W": ((256, 512), (1,)), "V": ((256, 512), (1,))})
    assert hoist_addends(g, next(o.id for o in g.ops if o.kind == GD)) is None


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
