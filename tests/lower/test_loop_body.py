"""Three rewrites of the generated loop body, each a ``KernelConfig`` switch:

* deferred sums (``defer_sums``, ``KernelPlan.deferred_sums``): a loop-body ``sum``
  whose only use is an accumulator adds up the un-reduced tile and reduces once after
  the loop;
* split loads (``split_loads``, ``KernelPlan.dot_operand_loads``): a loop tile that
  feeds a ``tl.dot`` operand and other ops is loaded once for each;
* staged loads (``stage_all_loads``, ``KernelPlan.unpipelined_loads``): the loop asks
  Triton to software-pipeline every load, not only those of ``tl.dot`` operands.

Same function as the float64 interpreter with and without them, split-K and
re-chunking included; found where legal, refused where not. CPU only (Triton
interpreter)."""

from __future__ import annotations

import pytest

import lower
from lower.config import KernelConfig, KernelConfigError
from lower.plan import plan
from lower.testing import check, random_graph, random_inputs
from mugraph.core.benchmarks import reference

TOL = {"float32": 1e-4, "float16": 2e-2}


def _block_op(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


def _op(block, i):
    return next(o for o in block.ops if o.id == i)


def test_rmsnorm_sum_of_squares_is_deferred():
    g = reference("rmsnorm_matmul", small=True)
    op = _block_op(g)
    block = op.attrs["block"]
    cfg = KernelConfig(num_warps=4)
    found = plan(block, cfg).deferred_sums
    assert [_op(block, i).kind for i in found] == ["sum"]  # Σx², not the matmul
    src = lower.compile(g, device="cpu", configs={op.id: cfg}).triton_source()
    assert "_k = tl.zeros" in src and "keep_dims=True)  # once" in src
    src_r = lower.compile(g, device="cpu", configs={op.id: KernelConfig(num_warps=4, defer_sums=False)}).triton_source()
    assert "_k = tl.zeros" not in src_r


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cfg", [KernelConfig(num_warps=4), KernelConfig(num_warps=4, defer_sums=False),
                                 KernelConfig(num_warps=4, split_loads=False),
                                 KernelConfig(num_warps=4, split=2, combine="last"),
                                 KernelConfig(num_warps=4, split=2, chunk=2)],
                         ids=["both", "per-step-sum", "one-load", "splitK-last", "split-chunk"])
def test_reference_with_and_without_deferral(dtype, cfg):
    for name in ("rmsnorm_matmul", "qknorm_gqa", "gated_mlp"):
        g = reference(name, small=True, dtype=dtype)
        configs = {}
        for op in g.ops:
            if op.kind != "graph_defined":
                continue
            b = op.attrs["block"]
            c = cfg
            if b.forloop % max(1, c.split) or (b.forloop // max(1, c.split)) % c.chunk or b.forloop == 1:
                c = KernelConfig(num_warps=4, defer_sums=cfg.defer_sums, split_loads=cfg.split_loads)
            try:
                plan(b, c)
            except KernelConfigError:
                c = KernelConfig(num_warps=4, split=c.split, defer_sums=cfg.defer_sums, split_loads=cfg.split_loads)
            configs[op.id] = c
        prog = lower.compile(g, device="cpu", configs=configs, poison=True)
        errs = check(prog, g, random_inputs(g, 1))
        assert max(errs) <= TOL[dtype], (name, cfg.label(), errs)


def test_random_ugraphs_with_deferred_sums():
    """Random μGraphs whose loops hold an accumulated sum: same results both ways."""
    hit = 0
    for seed in range(200):
        g = random_graph(seed)
        ops = [op for op in g.ops if op.kind == "graph_defined"]
        if not any(plan(op.attrs["block"]).deferred_sums for op in ops):
            continue
        hit += 1
        inputs = random_inputs(g, seed)
        for defer in (True, False):
            prog = lower.compile(g, device="cpu", configs={op.id: KernelConfig(defer_sums=defer) for op in ops},
                                 poison=True)
            assert max(check(prog, g, inputs)) <= TOL["float32"], (seed, defer)
        if hit >= 6:
            break
    assert hit >= 3, "too few random μGraphs with an accumulated loop sum to exercise the deferral"


def test_a_sum_with_another_use_is_not_deferred():
    """qknorm_gqa's attention kernel sums K² in the loop for the K-norm (used by a scale,
    kept per step) and sums exp(·) into the softmax denominator (only accumulated:
    deferred); a loop-free kernel (ntrans) defers nothing."""
    g = reference("qknorm_gqa", small=True)
    b = _block_op(g).attrs["block"]
    found = plan(b).deferred_sums
    cons = b.consumers()
    loop_sums = [o for o in b.ops if o.kind == "sum" and o.id != 4]  # op 4 (Q's Σx²) is in the prologue
    kinds = {o.id: [c.kind for c in cons[o.outputs[0]]] for o in loop_sums}
    assert sorted(kinds.values()) == [["accum"], ["scale"]]
    assert set(found) == {i for i, k in kinds.items() if k == ["accum"]}
    nt = _block_op(reference("ntrans", small=True)).attrs["block"]
    assert plan(nt).deferred_sums == {}


def test_rmsnorm_x_is_loaded_once_per_layout():
    """X feeds the matmul's operand (x·g) and the Σx²: a second load for the operand; G
    and W feed the operand only and are loaded once."""
    g = reference("rmsnorm_matmul", small=True)
    op = _block_op(g)
    b = op.attrs["block"]
    dup = plan(b).dot_operand_loads
    (tid, (f32, ops)), = dup.items()
    x = next(o for o in b.ops if o.kind == "iterator" and o.attrs["source"] == 0).outputs[0]
    assert tid == x.id and f32 and [_op(b, i).kind for i in sorted(ops)] == ["mul"]
    src = lower.compile(g, device="cpu", configs={op.id: KernelConfig()}).triton_source()
    assert src.count("tl.load(X_ptr") == 2 and src.count("tl.load(W_ptr") == 1
    assert 'eviction_policy="evict_last").to(tl.float32)  # for the tl.dot operand' in src
    src_u = lower.compile(g, device="cpu", configs={op.id: KernelConfig(split_loads=False)}).triton_source()
    assert src_u.count("tl.load(X_ptr") == 1


def test_tiles_used_by_a_dot_only_are_not_split():
    """gated_mlp's X feeds two dots and nothing else; lora has no loop: no second loads."""
    for name in ("gated_mlp", "lora", "ntrans"):
        for op in reference(name, small=True).ops:
            if op.kind == "graph_defined":
                b = op.attrs["block"]
                assert plan(b).dot_operand_loads == {}, name


def test_random_ugraphs_with_split_loads():
    hit = 0
    for seed in range(300):
        g = random_graph(seed)
        ops = [op for op in g.ops if op.kind == "graph_defined"]
        if not any(plan(op.attrs["block"]).dot_operand_loads for op in ops):
            continue
        hit += 1
        inputs = random_inputs(g, seed)
        for split_loads in (True, False):
            prog = lower.compile(g, device="cpu", poison=True,
                                 configs={op.id: KernelConfig(split_loads=split_loads) for op in ops})
            assert max(check(prog, g, inputs)) <= TOL["float32"], (seed, split_loads)
        if hit >= 4:
            break
    assert hit >= 2, "too few random μGraphs with a tile shared by a dot operand and other ops"


def test_unpipelined_loads_are_the_tiles_used_outside_dot_operands():
    """rmsnorm_matmul's X is also squared for Σx²: its load waits every step unless the loop
    stages everything; gated_mlp loads only dot operands; without stages nothing is pipelined
    to miss; a dot-free loop ("v" lowering) is staged whole by the code generator."""
    rms = _block_op(reference("rmsnorm_matmul", small=True)).attrs["block"]
    x = next(o for o in rms.ops if o.kind == "iterator" and o.attrs["source"] == 0).outputs[0]
    assert [t.id for t in plan(rms, KernelConfig(num_stages=3)).unpipelined_loads] == [x.id]
    assert [t.id for t in plan(rms, KernelConfig(num_stages=3, split_loads=False)).unpipelined_loads] == [x.id]
    assert plan(rms, KernelConfig(num_stages=3, stage_all_loads=True)).unpipelined_loads == []
    assert plan(rms, KernelConfig(num_stages=1)).unpipelined_loads == []
    gated = _block_op(reference("gated_mlp", small=True)).attrs["block"]
    assert plan(gated, KernelConfig(num_stages=3)).unpipelined_loads == []
    assert plan(rms, KernelConfig(num_stages=3, small_mm="v")).unpipelined_loads == []


@pytest.mark.parametrize("label", ["w4s3A", "w4s4c2A", "w2s3k2LA", "w4s3uA", "w4s1A"])
def test_staged_loop_matches_reference(label):
    """``stage_all_loads`` changes only the loop statement (``tl.range(…, num_stages=)``, and
    not with one stage); the program still matches float64 (fp32 and fp16 inputs)."""
    cfg = KernelConfig.from_label(label)
    assert cfg.stage_all_loads and cfg.label() == label
    for dtype in ("float32", "float16"):
        g = reference("rmsnorm_matmul", small=True, dtype=dtype)
        op = _block_op(g)
        prog = lower.compile(g, device="cpu", poison=True, configs={op.id: cfg})
        src = prog.triton_source()
        staged = "for i in tl.range(" in src and f"num_stages={cfg.num_stages})" in src
        assert staged == (cfg.num_stages > 1), src
        plain = lower.compile(g, device="cpu", configs={op.id: KernelConfig.from_label(label[:-1])}).triton_source()
        assert ("tl.range(" in plain) is False
        assert max(check(prog, g, random_inputs(g, 3))) <= TOL[dtype], (label, dtype)
