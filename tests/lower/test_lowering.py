"""Lowered kernels compute what the float64 interpreter computes: reference μGraphs,
kernel-graph programs, random μGraphs, every tuning freedom."""

from __future__ import annotations

import random

import pytest

import lower
from lower.torch_ops import matmul_adds
import mugraph as mg
from lower.config import KernelConfig
from lower.profile import grid_choices
from lower.testing import check, random_graph, random_inputs
from mugraph.core.benchmarks import PROGRAMS, program, reference

NAMES = sorted(PROGRAMS)
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}


def _inputs(graph, seed, scale=1.0):
    return {k: (v.double() * scale).to(v.dtype) for k, v in random_inputs(graph, seed).items()}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", NAMES)
def test_reference_ugraphs(name, dtype):
    g = reference(name, small=True, dtype=dtype)
    prog = lower.compile(g, device="cpu", poison=True)
    errs = check(prog, g, _inputs(g, 0))
    assert max(errs) <= TOL[dtype], (name, dtype, errs)


@pytest.mark.parametrize("name", NAMES)
def test_reference_with_tuned_configs(name):
    """Split-K, sub-tiles, warps and stages never change the function."""
    g = reference(name, small=True, dtype="float32")
    rng = random.Random(name)
    cfgs = {}
    for op in g.ops:
        if op.kind == "graph_defined":
            blk = op.attrs["block"]  # keep the interpreter's work small: at most 64 programs
            ch = [c for c in grid_choices(blk, max_programs=64, min_tile=1) if c != (1, ())]
            if ch:
                s, sub = rng.choice(ch)
                cfgs[op.id] = KernelConfig(num_warps=rng.choice([2, 8]), num_stages=3, split=s, sub=sub)
    assert cfgs or name == "ntrans"
    prog = lower.compile(g, device="cpu", configs=cfgs, poison=True)
    assert max(check(prog, g, _inputs(g, 3))) <= 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_programs_of_predefined_ops(name):
    """A plain Program (pre-defined kernel ops only) lowers to torch calls, one per op but
    for each matmul whose one reader adds a residual (one ``addmm``: lower.torch_ops.matmul_adds)."""
    p = program(name, small=True, dtype="float32")
    prog = lower.compile(p, device="cpu", poison=True)
    calls = len([o for o in p.ops if o.kind != "input"]) - len(matmul_adds(p))
    assert not prog.kernels and prog.num_launches == calls
    assert max(check(prog, p, _inputs(p, 0))) <= 1e-4


N_RANDOM = 60


def test_random_ugraphs_float32():
    kinds, kernel_kinds = set(), set()
    worst = []
    for seed in range(N_RANDOM):
        g = random_graph(seed)
        kinds |= {b.kind for op in g.ops if op.kind == "graph_defined" for b in op.attrs["block"].ops}
        kernel_kinds |= {op.kind for op in g.ops}
        prog = lower.compile(g, device="cpu", poison=True)
        errs = check(prog, g, random_inputs(g, seed))
        worst.append((max(errs), seed))
        assert max(errs) <= 1e-4, (seed, errs, str(g))
    # the generator exercises every block op of the catalog, and the strided views between kernels
    block_ops = {k for k, d in mg.CATALOG.items() if "B" in d.levels}
    assert block_ops | {"iterator", "accum"} <= kinds, sorted(block_ops - kinds)
    assert {"permute", "slice"} <= kernel_kinds


def test_random_ugraphs_float16():
    n = 0
    for seed in range(1000, 1100):
        g = random_graph(seed, dtype="float16")
        ins = random_inputs(g, seed)
        refs = mg.evaluate(g, {k: v.double() for k, v in ins.items()})
        if max(r.abs().max().item() for r in refs) > 1e3:  # keep clear of fp16 overflow
            continue
        prog = lower.compile(g, device="cpu", poison=True)
        errs = check(prog, g, ins)
        assert max(errs) <= 2e-2, (seed, errs, str(g))
        n += 1
        if n == 12:
            break
    assert n == 12


def test_random_ugraphs_with_random_configs():
    for seed in range(200, 215):
        g = random_graph(seed)
        rng = random.Random(seed)
        cfgs = {}
        for op in g.ops:
            if op.kind == "graph_defined":
                s, sub = rng.choice(grid_choices(op.attrs["block"], max_programs=64, min_tile=1))
                cfgs[op.id] = KernelConfig(split=s, sub=sub)
        prog = lower.compile(g, device="cpu", configs=cfgs, poison=True)
        errs = check(prog, g, random_inputs(g, seed))
        assert max(errs) <= 1e-4, (seed, {k: c.label() for k, c in cfgs.items()}, errs)


@pytest.mark.parametrize("name", ["gated_mlp", "ntrans"])
def test_bfloat16_reference(name):
    g = reference(name, small=True, dtype="bfloat16")
    prog = lower.compile(g, device="cpu", poison=True)
    assert max(check(prog, g, _inputs(g, 0))) <= TOL["bfloat16"]


def test_hand_written_edge_cases():
    """A dim both imapped and fmapped, a replicated input, two savers, post-loop
    ops, odd sizes, 3 grid axes, a constant, max and a rank-3 broadcast."""
    kg = mg.KernelGraph("edge")
    X = kg.input("X", (6, 20, 5), "float32")
    Y = kg.input("Y", (5, 3), "float32")
    bg = mg.BlockGraph(grid=(2, 2, 3), forloop=5)
    x = bg.input(X, imap=(0, 1, None), fmap=1)     # dim 1: 20 / 2 blocks = 10, / 5 iterations = 2
    y = bg.input(Y, imap=(None, None, 1))           # replicated along x, y
    xy = mg.matmul(x, y)                            # (3, 2, 5) @ (5, 1) -> (3, 2, 1)
    m = mg.max(x, 2)
    a1 = bg.accum(xy * 2 + m)
    a2 = bg.accum(mg.sum(mg.square(x), 1))
    bg.output(mg.exp(a1 * 0.1), omap=(0, 1, 2))
    bg.output(mg.sqrt(a2 + 1), omap=(0, 2, 1))
    out1, out2 = kg.kernel(bg)
    kg.output(out1)
    kg.output(out2)
    prog = lower.compile(kg, device="cpu", poison=True)
    assert max(check(prog, kg, random_inputs(kg, 0))) <= 1e-4


# ---------------------------------------------------------------- re-chunked loops, split-K combines
from lower.config import KernelConfigError  # noqa: E402
from lower.plan import plan  # noqa: E402
from lower.tiles import loop_chunks  # noqa: E402


@pytest.mark.parametrize("name, split, combine", [
    ("rmsnorm_matmul", 1, "kernel"), ("rmsnorm_matmul", 2, "last"), ("gated_mlp", 2, "kernel"),
    ("gqa", 1, "kernel"), ("qknorm_gqa", 2, "last")])
def test_rechunked_loops(name, split, combine):
    """Several μGraph iterations per generated-loop step (and split-K with either
    combine) compute the same function: poisoned outputs, fresh inputs, fp32."""
    g = reference(name, small=True, dtype="float32")
    op = next(o for o in g.ops if o.kind == "graph_defined")
    blk = op.attrs["block"]
    chunks = [c for c in loop_chunks(plan(blk).info) if c > 1 and (blk.forloop // split) % c == 0]
    assert chunks, (name, blk.forloop)
    cfg = KernelConfig(split=split, chunk=max(chunks), combine=combine)
    prog = lower.compile(g, device="cpu", configs={op.id: cfg}, poison=True)
    assert f"c{cfg.chunk}" in cfg.label() and "for i in range(" in prog.triton_source()
    for seed in (5, 6):  # twice: the "last" combine's counters must be left at zero
        assert max(check(prog, g, _inputs(g, seed))) <= 1e-4, (name, cfg.label())


def test_rechunk_is_refused_where_it_changes_the_function():
    """max over the loop's dim, the loop's dim reaching an accumulator, a C-sum used
    by another op: R = 1 only (and an explicit chunk is an error)."""
    for build in ("max", "elementwise_acc", "exp_of_sum"):
        kg = mg.KernelGraph("r")
        X = kg.input("X", (4, 32), "float32")
        bg = mg.BlockGraph(grid=(1, 1, 1), forloop=4)
        x = bg.input(X, fmap=1)
        if build == "max":
            y = bg.accum(mg.max(x, 1))
        elif build == "elementwise_acc":
            y = bg.accum(mg.square(x))
        else:
            y = bg.accum(mg.exp(mg.sum(x, 1)))
        bg.output(y, omap=(None, None, None))
        (o,) = kg.kernel(bg)
        kg.output(o)
        assert loop_chunks(plan(bg).info) == [1], build
        with pytest.raises(KernelConfigError, match="re-chunked"):
            lower.compile(kg, device="cpu", configs={kg.ops[1].id: KernelConfig(chunk=2)})


def test_rechunked_random_ugraphs():
    n = 0
    for seed in (303, 356):
        g = random_graph(seed)
        cfgs = {}
        for op in g.ops:
            if op.kind == "graph_defined" and len(loop_chunks(plan(op.attrs["block"]).info)) > 1:
                cfgs[op.id] = KernelConfig(chunk=loop_chunks(plan(op.attrs["block"]).info)[-1])
        assert cfgs, seed
        prog = lower.compile(g, device="cpu", configs=cfgs, poison=True)
        assert max(check(prog, g, random_inputs(g, seed))) <= 1e-4, (seed, str(g))
        n += 1
    assert n == 2
