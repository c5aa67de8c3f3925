"""Loop-invariant tiles read after the loop (docs/design.md §2.4): a residual, bias or gate
added to a loop's sum in one kernel — built, verified (equal rewrites pass, near misses fail),
lowered in every split-K mode against float64, and found by the search."""

import pytest
import torch

import mugraph as mg
import mugraph.core.builder as b
import verify
from lower import KernelConfig
from lower.runtime import compile as lower_compile
from lower.testing import rel_error
from mugraph.core.errors import InvalidGraphError
from mugraph.core.interpreter import evaluate
from mugraph.core.ir import BlockGraph, KernelGraph
from search.rewrite import split_loop


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


ROWS, K, N = 2, 256, 128


def _program(epilogue: str = "add") -> mg.Program:
    p = mg.Program("proj_res")
    x, w = p.input("X", (ROWS, K), "float32"), p.input("W", (K, N), "float32")
    r = p.input("R", (ROWS, N), "float32")
    y = x @ w
    p.output(y + r if epilogue == "add" else y * mg.silu(r))
    return p


def _ugraph(epilogue: str = "add", F: int = 4, bn: int = 32, r_fmap=None, r_imap=(1,)) -> KernelGraph:
    """``accum(X_i @ W_i)`` over K, then R's tile (read once) in the epilogue."""
    kg = KernelGraph("proj_res_fused")
    X, W = kg.input("X", (ROWS, K), "float32"), kg.input("W", (K, N), "float32")
    R = kg.input("R", (ROWS, N), "float32")
    bg = BlockGraph(grid=(N // bn, 1, 1), forloop=F)
    x, w = bg.input(X, imap=(None,), fmap=1), bg.input(W, imap=(1,), fmap=0)
    r = bg.input(R, imap=r_imap, fmap=r_fmap)
    acc = bg.accum(b.matmul(x, w))
    if epilogue == "add":
        out = acc + r
    elif epilogue == "gate":
        out = acc * b.silu(r)
    else:  # "in_loop": R added inside the loop, so F copies of it are summed
        acc2 = bg.accum(r)
        out = acc + acc2
    bg.output(out, omap=(1,))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"X": torch.randn(ROWS, K, generator=g), "W": torch.randn(K, N, generator=g),
            "R": torch.randn(ROWS, N, generator=g)}


def test_an_invariant_tile_may_be_read_after_the_loop_and_a_walked_one_may_not():
    g = _ugraph()
    blk = next(o for o in g.ops if o.kind == "graph_defined").attrs["block"]
    r = next(o.outputs[0] for o in blk.ops if o.kind == "iterator" and o.attrs["fmap"] is None)
    assert blk.loop_invariant(r) and "# invariant" in str(g)
    _ugraph("gate")  # made of an invariant tile: silu(R) after the loop too
    with pytest.raises(InvalidGraphError, match="mixes loop-body tiles .* with post-loop tiles") as e:
        # R walked by the loop (fmap on its rows' dim would not divide; use a K-walked tile: X)
        kg = KernelGraph("bad")
        X, W = kg.input("X", (ROWS, K), "float32"), kg.input("W", (K, N), "float32")
        bg = BlockGraph(grid=(N // 32, 1, 1), forloop=4)
        x, w = bg.input(X, imap=(None,), fmap=1), bg.input(W, imap=(1,), fmap=0)
        acc = bg.accum(b.matmul(x, w))
        bg.output(acc + b.sum(x, 1), omap=(1,))
    assert "loop-invariant" in str(e.value)


@pytest.mark.parametrize("epilogue", ["add", "gate"])
def test_the_verifier_proves_the_fused_epilogue(epilogue):
    v = verify.equivalent(_program(epilogue), _ugraph(epilogue), seed=0)
    assert v.equivalent and v.ok, v


def _summed_r(factor) -> KernelGraph:
    """R summed over the loop's F = 4 steps, times ``factor`` after it (1/4: R itself)."""
    kg = KernelGraph("summed_r")
    X, W = kg.input("X", (ROWS, K), "float32"), kg.input("W", (K, N), "float32")
    R = kg.input("R", (ROWS, N), "float32")
    bg = BlockGraph(grid=(N // 32, 1, 1), forloop=4)
    x, w, r = bg.input(X, imap=(None,), fmap=1), bg.input(W, imap=(1,), fmap=0), bg.input(R, imap=(1,))
    bg.output(bg.accum(b.matmul(x, w)) + b.scale(bg.accum(r), factor), omap=(1,))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def test_an_accumulated_residual_rescaled_by_one_over_f_is_the_residual():
    from fractions import Fraction
    v = verify.equivalent(_program("add"), _summed_r(Fraction(1, 4)), seed=0)
    assert v.equivalent and v.ok, v


@pytest.mark.parametrize("near_miss", ["in_loop", "half_rescaled"])
def test_the_verifier_rejects_near_misses(near_miss):
    """R summed over the loop is F·R, and F·R/2 is 2R: both wrong, both caught."""
    from fractions import Fraction
    g = _ugraph("in_loop") if near_miss == "in_loop" else _summed_r(Fraction(1, 2))
    v = verify.equivalent(_program("add"), g, seed=0, float_check=False)
    assert not v.equivalent, v


@pytest.mark.parametrize("label", ["w4s2", "w4s2c2", "w4s2k2", "w4s2k2L", "w4s2k4Lv", "w4s2k2v", "w4s2k2p0:2"])
@pytest.mark.parametrize("epilogue", ["add", "gate"])
def test_lowered_in_every_split_mode_against_float64(label, epilogue):
    g = _ugraph(epilogue)
    op = next(o.id for o in g.ops if o.kind == "graph_defined")
    x = _inputs()
    want = evaluate(g, {k: v.double() for k, v in x.items()})[0]
    ref = evaluate(_program(epilogue), {k: v.double() for k, v in x.items()})[0]
    assert rel_error(torch.as_tensor(want), torch.as_tensor(ref)) < 1e-12
    try:
        cfg = KernelConfig.from_label(label)
        prog = lower_compile(g, device="cpu", configs={op: cfg}, input_strides={"W": (1, K)}, poison=True)
    except mg.errors.ConfigError:  # a sub-tiling this block cannot take
        pytest.skip(f"{label} not available for this block")
    out = prog(X=x["X"], W=x["W"].t().contiguous().t(), R=x["R"])
    assert rel_error(out, torch.as_tensor(ref)) < 1e-5
    if cfg.split > 1 and cfg.combine == "kernel":  # the combine kernel loads R's tile itself
        assert "R_ptr" in prog.triton_source().split("_combine(")[1].split(")")[0]


def test_the_split_loop_rewrite_leaves_an_invariant_epilogue_alone():
    g = _ugraph()
    op = next(o for o in g.ops if o.kind == "graph_defined")
    assert split_loop(g, op.id, 2) is None  # its combining kernel would have no R tile


def test_the_search_finds_the_loop_with_the_residual_in_its_epilogue(tmp_path):
    p = mg.Program("proj_res")
    x, w = p.input("X", (1, 512), "float16"), p.input("W", (512, 256), "float16")
    r = p.input("R", (1, 256), "float16")
    p.output(x @ w + r)
    cfg = {"search": {"workers": 1, "time_limit": 90, "forloop_ranges": [4], "tile_sizes": [64],
                      "max_kernel_ops": 1, "max_block_ops": 3, "max_results": 4}}
    opt = mg.superoptimize(p, cfg, device="cpu", cache_dir=False, progress=False)
    fused = [c for c in opt.candidates if c.origin == "search" and c.num_kernels == 1 and not c.rejected]
    looped = [c for c in fused for o in c.graph.ops if o.kind == "graph_defined"
              and o.attrs["block"].forloop > 1]
    assert looped, opt.summary()
    blk = next(o for o in looped[0].graph.ops if o.kind == "graph_defined").attrs["block"]
    post = [o for o in blk.ops if o.outputs[0].acc == 1 and o.kind != "accum"]
    assert any(blk.loop_invariant(t) for o in post for t in o.inputs)


def test_random_ugraphs_reading_invariant_tiles_after_the_loop():
    """Random μGraphs whose post-loop ops also read loop-invariant tiles
    (``mugraph.core.randgraph.EPILOGUE_LOWERING``), lowered with random split-K (both
    combines) and sub-tilings, against the float64 interpreter."""
    import random

    from lower.profile import grid_choices
    from lower.testing import check, random_inputs
    from mugraph.core.randgraph import EPILOGUE_LOWERING, random_ugraph

    seen = 0
    for seed in range(40):
        g = random_ugraph(seed, EPILOGUE_LOWERING)
        blocks = [op for op in g.ops if op.kind == "graph_defined"]
        reads = [blk for blk in (op.attrs["block"] for op in blocks)
                 if any(blk.loop_invariant(t) for o in blk.ops
                        if o.outputs[0].acc == 1 and o.kind != "accum" for t in o.inputs)]
        if not reads:
            continue
        seen += 1
        rng = random.Random(seed)
        cfgs = {}
        for op in blocks:
            s, sub = rng.choice(grid_choices(op.attrs["block"], max_programs=64, min_tile=1))
            cfgs[op.id] = KernelConfig(split=s, sub=sub, combine=rng.choice(["kernel", "last"]) if s > 1 else "kernel")
        prog = lower_compile(g, device="cpu", configs=cfgs, poison=True)
        errs = check(prog, g, random_inputs(g, seed))
        assert max(errs) <= 1e-4, (seed, {k: c.label() for k, c in cfgs.items()}, errs, str(g))
    assert seen >= 8, seen
