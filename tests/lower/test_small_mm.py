"""Small matmuls (real m or n below 16) lowered on the CUDA cores instead of ``tl.dot``
(``KernelConfig.small_mm`` "v": broadcast multiply and ``tl.sum`` per step; "va": the
un-reduced product accumulated over the loop and summed once after it): the same
function as the float64 interpreter, tiles left unpadded, the tuner times both
lowerings, the cost model and the shared-memory estimate see the difference.
CPU only (Triton interpreter)."""

from __future__ import annotations

import random
import re
import sys

import pytest
import torch

import lower
import mugraph as mg
from lower import cost_model
from lower.config import KernelConfig
from lower.memory import lowered_shared_memory, shared_memory_estimate
from lower.profile import SMALL_MM_MENU, layout_choices, small_mm_modes
from lower.testing import check, random_graph, random_inputs
from lower.plan import plan
from lower.tiles import SMALL_MM
from mugraph.core.benchmarks import PROGRAMS, handwritten, reference
from online_graphs import decode_ugraph

TOL = {"float32": 1e-4, "float16": 2e-2}


def _blocks(g):
    return [op for op in g.ops if op.kind == "graph_defined"]


def _small_refs():
    """(name, op id, modes) for every reference μGraph (small shapes) with a small matmul."""
    out = []
    for name in sorted(PROGRAMS):
        g = reference(name, small=True)
        for op in _blocks(g):
            modes = small_mm_modes(op.attrs["block"])
            if len(modes) > 1:
                out.append((name, op.id, modes))
    return out


SMALL_REFS = _small_refs()


def test_the_references_with_small_matmuls_are_found():
    # rmsnorm_matmul (m = 2), gated_mlp (m = 8), gqa / qknorm_gqa (n = 4) at the test shapes
    assert {n for n, _, _ in SMALL_REFS} >= {"rmsnorm_matmul", "gated_mlp", "gqa", "qknorm_gqa"}
    assert not small_mm_modes(_blocks(reference("ntrans", small=True))[0].attrs["block"])[1:]
    # at the benchmark shapes: rmsnorm_matmul b=1 (m = 2), not b=8 (16); gated_mlp b=1 (m = 8)
    # has a small matmul but its two products pass CORE_PRODUCT_MAX together (the next test)
    assert "v" in small_mm_modes(_blocks(reference("rmsnorm_matmul", b=1))[0].attrs["block"])
    assert small_mm_modes(_blocks(reference("gated_mlp", b=1))[0].attrs["block"]) == ["dot"]
    assert small_mm_modes(_blocks(reference("rmsnorm_matmul", b=8))[0].attrs["block"]) == ["dot"]
    assert small_mm_modes(_blocks(reference("gated_mlp", b=8))[0].attrs["block"]) == ["dot"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name, op_id, modes", SMALL_REFS, ids=[f"{n}-k{i}" for n, i, _ in SMALL_REFS])
def test_reference_ugraphs_on_cuda_cores(name, op_id, modes, dtype):
    """Every reference μGraph with a small matmul, in every CUDA-core lowering that
    applies to it, against float64 (poisoned outputs and workspace, fresh inputs)."""
    g = reference(name, small=True, dtype=dtype)
    for mm in [m for m in modes if m != "dot"]:
        cfg = KernelConfig(num_stages=3, small_mm=mm)
        prog = lower.compile(g, device="cpu", configs={op_id: cfg}, poison=True)
        src = prog.triton_source()
        blk = next(o for o in _blocks(g) if o.id == op_id).attrs["block"]
        info = plan(blk, KernelConfig(small_mm=mm)).info
        assert info.dot_ops < plan(blk).info.dot_ops      # some matmul did leave tl.dot
        assert "tl.sum(" in src and f"config={cfg.label()}" in src
        if mm == "va":
            assert info.deferred and "_k += " in src and "the k-reduction, once" in src
        for seed in ((0, 1) if dtype == "float32" else (0,)):
            errs = check(prog, g, random_inputs(g, seed))
            assert max(errs) <= TOL[dtype], (name, mm, dtype, seed, errs)


def test_small_m_is_not_padded_to_16():
    """rmsnorm_matmul (m = 2): "dot" pads the rows to 16 and calls tl.dot; "v" keeps
    2 rows and has no tl.dot at all; "va" accumulates a (2, k, 64) product."""
    g = reference("rmsnorm_matmul", small=True)
    (op,) = _blocks(g)
    srcs = {mm: lower.compile(g, device="cpu", configs={op.id: KernelConfig(num_stages=3, small_mm=mm)}
                              ).triton_source() for mm in SMALL_MM}
    assert "tl.dot(" in srcs["dot"] and "r16 < 2" in srcs["dot"]
    for mm in ("v", "va"):
        assert "tl.dot(" not in srcs[mm] and "r16" not in srcs[mm] and "tl.arange(0, 2)" in srcs[mm]
    assert re.search(r"acc_b5_k = tl.zeros\(\(2, \d+, 64\)", srcs["va"])
    # the dot-free loop asks Triton to pipeline its loads; the tl.dot loop is pipelined anyway
    assert "tl.range(" in srcs["v"] and "num_stages=3" in srcs["v"] and "tl.range(" not in srcs["dot"]
    info = {mm: plan(op.attrs["block"], KernelConfig(small_mm=mm)).info for mm in SMALL_MM}
    b3 = next(t for t in op.attrs["block"].tensors if t.label() == "b3")
    assert info["dot"].padded(b3)[0] == 16 and info["v"].padded(b3)[0] == 2


def _gemv(rows: int, k: int = 2048, n: int = 128, cols: int = 64, steps: int = 256) -> mg.KernelGraph:
    """``X(rows × k) @ W(k × n)`` in fp32: blocks of ``cols`` columns, loops of ``steps``-deep steps."""
    return handwritten.gemv(rows, k, n, cols, steps, "plain", "float32")


def test_a_product_beyond_the_register_file_is_not_tried_on_the_cuda_cores():
    """The tuner offers no CUDA-core lowering whose broadcast products per program, all of
    them together, would pass 256 values a thread at 4 warps (CORE_PRODUCT_MAX elements)
    where the same tiling fits on tl.dot: 8 rows × a 256-deep step × 64 columns is 131,072
    elements (2 rows: 32,768, and 8 rows of 64-deep steps, at the bound, are offered); a
    gated MLP's two products of 32,768 each are 65,536 together. Where tl.dot does not fit
    shared memory the CUDA cores stay on offer (test_search_candidates_fit_with_cuda_core_matmuls)."""
    import dataclasses

    from lower.memory import padded_shared_memory
    from lower.profile import first_round
    from lower.tiles import CORE_PRODUCT_MAX, core_product
    from mugraph.core.ir import DEFAULT_SMEM_BUDGET

    def block(g):
        return _blocks(g)[0].attrs["block"]

    wide, narrow, at_bound = _gemv(8), _gemv(2), _gemv(8, steps=64)
    gated = reference("gated_mlp", b=1, dtype="float32")
    assert core_product(plan(block(wide), KernelConfig(small_mm="v")).info) == 131072
    assert core_product(plan(block(at_bound), KernelConfig(small_mm="v")).info) == CORE_PRODUCT_MAX
    assert core_product(plan(block(gated), KernelConfig(small_mm="v")).info) == 2 * 8 * 64 * 64
    assert small_mm_modes(block(wide)) == ["dot"] and small_mm_modes(block(gated)) == ["dot"]
    assert "v" in small_mm_modes(block(narrow)) and "v" in small_mm_modes(block(at_bound))

    def dot_fits(g, c) -> bool:
        return padded_shared_memory(plan(block(g), dataclasses.replace(c, small_mm="dot"))) <= DEFAULT_SMEM_BUDGET

    for g in (wide, narrow, at_bound, gated):
        cores = [c for c in first_round(block(g)) if c.small_mm != "dot"]
        assert cores and all(core_product(plan(block(g), c).info) <= CORE_PRODUCT_MAX or not dot_fits(g, c)
                             for c in cores)
    # what "v" lowers is unchanged: the product on the CUDA cores, right against float64
    prog = lower.compile(wide, device="cpu", configs={_blocks(wide)[0].id: KernelConfig(num_stages=2, small_mm="v")})
    assert "tl.dot(" not in prog.triton_source()
    assert max(check(prog, wide, random_inputs(wide, 0))) <= 1e-4


def test_split_chunk_and_subtiles_with_cuda_core_matmuls():
    """The CUDA-core lowerings compose with every other freedom of the tuner."""
    for name in ("rmsnorm_matmul", "gated_mlp", "gqa"):
        g = reference(name, small=True, dtype="float32")
        rng = random.Random(name)
        ops = [o for o in _blocks(g) if len(small_mm_modes(o.attrs["block"], menu=SMALL_MM)) > 1]
        assert ops, name
        for op in ops:
            ch = [c for c in layout_choices(op.attrs["block"], max_programs=64, min_tile=1, small_mm=SMALL_MM)
                  if c[4] != "dot"]
            assert {c[4] for c in ch} >= {"v"}, name
            for s, sub, c, comb, mm in rng.sample(ch, min(2, len(ch))):
                cfg = KernelConfig(num_warps=2, num_stages=2, split=s, sub=sub, chunk=c, combine=comb, small_mm=mm)
                prog = lower.compile(g, device="cpu", configs={op.id: cfg}, poison=True)
                for seed in (3, 4):  # twice: the "last" combine's counters must be left at zero
                    assert max(check(prog, g, random_inputs(g, seed))) <= 1e-4, (name, cfg.label())


N_RANDOM = 30


@pytest.mark.parametrize("mm", ["v", "va"])
def test_random_ugraphs_forced_through_cuda_core_matmuls(mm):
    """Random μGraphs (tiles of 1–16: nearly every matmul is small) with every block
    in the CUDA-core lowering; counts that the path is really taken."""
    n_small = n_deferred = 0
    for seed in range(N_RANDOM):
        g = random_graph(500 + seed)
        cfgs = {}
        for op in _blocks(g):
            blk = op.attrs["block"]
            info = plan(blk, KernelConfig(small_mm=mm)).info
            n_small += len([b for b in blk.ops if b.kind == "matmul"]) - len(info.dot_ops)
            n_deferred += len(info.deferred)
            cfgs[op.id] = KernelConfig(num_stages=3, small_mm=mm)
        prog = lower.compile(g, device="cpu", configs=cfgs, poison=True)
        errs = check(prog, g, random_inputs(g, seed))
        assert max(errs) <= 1e-4, (seed, mm, errs, str(g))
    assert n_small >= 10, n_small
    if mm == "va":
        assert n_deferred >= 3, n_deferred


def test_random_ugraphs_float16_cuda_core_matmuls():
    n = 0
    for seed in range(1200, 1300):
        g = random_graph(seed, dtype="float16")
        if not any(len(small_mm_modes(op.attrs["block"])) > 1 for op in _blocks(g)):
            continue
        ins = random_inputs(g, seed)
        refs = mg.evaluate(g, {k: v.double() for k, v in ins.items()})
        if max(r.abs().max().item() for r in refs) > 1e3:  # keep clear of fp16 overflow
            continue
        prog = lower.compile(g, device="cpu", poison=True,
                             configs={op.id: KernelConfig(num_stages=3, small_mm="v") for op in _blocks(g)})
        assert max(check(prog, g, ins)) <= 2e-2, (seed, str(g))
        n += 1
        if n == 6:
            break
    assert n == 6


def test_tuner_times_dot_and_cuda_core_lowerings(monkeypatch):
    """With a (faked) GPU the tuner times both lowerings of rmsnorm_matmul b=1's M = 2
    matmul — every split factor in each — and sweeps warps around the best of each;
    the faster one is chosen whichever it is. gated_mlp b=8 (M = 64) offers only tl.dot."""
    prof = sys.modules["lower.profile"]
    monkeypatch.setattr(prof.torch.cuda, "is_available", lambda: True)
    g = reference("rmsnorm_matmul", b=1)
    splits = {s for s, *_ in layout_choices(_blocks(g)[0].attrs["block"])}
    for fast in ("v", "dot"):
        seen = []

        def fake_time(graph, configs, inputs, ref=None, tol=0.0, timing="graph", sets=None):
            c = list(configs.values())[-1]
            seen.append(c)
            return 1e-5 * (0.8 if c.small_mm == fast else 1.0) * (0.9 if c.num_warps == 2 else 1.0), None, 0.0

        monkeypatch.setattr(prof, "_time", fake_time)
        r = prof.tune(g, inputs={}, top=3)
        (cfg,) = r.configs.values()
        assert cfg.small_mm == fast and cfg.num_warps == 2
        assert {c.small_mm for c in seen} == set(SMALL_MM_MENU) == {"dot", "v"}
        for mm in SMALL_MM_MENU:
            assert {c.split for c in seen if c.small_mm == mm} == splits
            assert {c.num_warps for c in seen if c.small_mm == mm} == {1, 2, 4, 8, 16}
    # "va" only on request; M = 64 only tl.dot
    seen.clear()
    prof.tune(g, inputs={}, top=3, small_mm=SMALL_MM)
    assert {c.small_mm for c in seen} == {"dot", "v", "va"}
    seen.clear()
    prof.tune(reference("gated_mlp", b=8), inputs={}, top=2)
    assert {c.small_mm for c in seen} == {"dot"}


def test_cost_model_sees_cuda_core_matmuls():
    """More multiply-adds on the CUDA cores cost more: M = 8 (gated_mlp b=1) on the CUDA
    cores is predicted well above tl.dot (measured 35 vs 28 μs), M = 2 (rmsnorm_matmul b=1)
    a little (23.7 vs 23.3); the A operand's element-wise work counts once per warp in
    the tl.dot lowering."""
    def est(name, **kw):
        g = reference(name, b=1)
        return cost_model.estimate(g, configs={_blocks(g)[0].id: KernelConfig(num_stages=3, split=4, combine="last",
                                                                               **kw)})

    gd, gv = est("gated_mlp"), est("gated_mlp", small_mm="v")
    rd, rv = est("rmsnorm_matmul"), est("rmsnorm_matmul", small_mm="v")
    assert gv - gd > 5e-6 and 0 < rv - rd < gv - gd
    g = reference("rmsnorm_matmul", b=1)
    bd = cost_model.breakdown(g, configs={_blocks(g)[0].id: KernelConfig(num_warps=4)})
    b1 = cost_model.breakdown(g, configs={_blocks(g)[0].id: KernelConfig(num_warps=1)})
    assert bd.launches[0].flops > b1.launches[0].flops  # x·g replicated over 4 warps
    assert bd.launches[0].t_fma == 0 and cost_model.breakdown(g, configs={_blocks(g)[0].id: KernelConfig(
        small_mm="v")}).launches[0].t_fma > 0


def test_shared_memory_estimate_at_padded_extents():
    """lower.memory.lowered_shared_memory: pipelining buffers and staged tl.dot operands
    at padded extents (the first two equal what Triton 3.6 allocated on the H100)."""
    g = reference("rmsnorm_matmul", b=1)
    blk = _blocks(g)[0].attrs["block"]
    assert lowered_shared_memory(blk, KernelConfig(num_warps=1, num_stages=3, split=4, combine="last")) == 20736
    assert lowered_shared_memory(blk, KernelConfig(num_warps=1, num_stages=3, split=4, combine="last",
                                                   small_mm="v")) == 17152
    assert lowered_shared_memory(blk, KernelConfig(num_stages=5, small_mm="v")) == 4 * 17152 // 2
    # "dot" without a dot in the loop is not pipelined: nothing staged
    assert lowered_shared_memory(_blocks(reference("gqa"))[1].attrs["block"], KernelConfig(num_stages=3)) == 0


def _rms_search_candidate(name="rmsnorm_matmul", k=4096, n=6144, grid=384, dtype="float16"):
    """The shape of the μGraphs the search found for rmsnorm_matmul b=1 (out/results/
    rmsnorm_matmul-b1.mug.json): grid 384, no loop, (4096, 16) tiles of W, M = 2."""
    kg = mg.KernelGraph(name)
    X = kg.input("X", (2, k), dtype)
    G = kg.input("G", (k,), dtype)
    W = kg.input("W", (k, n), dtype)
    bg = mg.BlockGraph(grid=(grid, 1, 1), forloop=1)
    x, gg, w = bg.input(X, imap=(None,)), bg.input(G, imap=(None,)), bg.input(W, imap=(1,))
    sq = mg.sum(mg.square(x), 1)
    y = mg.matmul(x * gg, w) / mg.sqrt(sq * (1 / k))
    bg.output(bg.accum(y), omap=(1,))
    (o,) = kg.kernel(bg)
    kg.output(o)
    return kg


def test_search_candidates_fit_with_cuda_core_matmuls():
    """tl.dot pads M = 2 to 16 and stages both operands whole: 262144 B of shared memory,
    over the H100's 232448 (Triton refused it on the device). On the CUDA cores nothing is
    staged; the cost model says so, and the tuner's menu offers it."""
    g = _rms_search_candidate()
    (op,) = _blocks(g)
    blk = op.attrs["block"]
    assert shared_memory_estimate(blk, 3) < 232448                 # the IR's view: fits
    assert lowered_shared_memory(blk, KernelConfig(num_stages=3)) == 262144
    assert lowered_shared_memory(blk, KernelConfig(num_stages=3, small_mm="v")) == 0
    assert cost_model.estimate(g, configs={op.id: KernelConfig()}) == float("inf")
    assert cost_model.estimate(g, configs={op.id: KernelConfig(small_mm="v")}) < 40e-6
    assert [c[4] for c in layout_choices(blk)] == ["dot", "v"]
    r = lower.profile(g)                                            # no GPU: the model's choice
    assert r.configs[op.id].small_mm == "v" and not r.measured
    prog = lower.compile(g, device="cpu", configs={op.id: KernelConfig(num_warps=16, small_mm="v")})
    assert "tl.dot(" not in prog.triton_source()


def test_search_candidate_runs_on_cuda_cores_scaled_down():
    """The same block structure at a size the interpreter runs quickly (grid 8, k = 256)."""
    kg = _rms_search_candidate("cand_small", k=256, n=128, grid=8, dtype="float32")
    (op,) = _blocks(kg)
    for mm in ("dot", "v"):
        prog = lower.compile(kg, device="cpu", configs={op.id: KernelConfig(small_mm=mm)}, poison=True)
        assert max(check(prog, kg, random_inputs(kg, 7))) <= 1e-4, mm


@pytest.mark.parametrize("mm", SMALL_MM)
def test_dirty_padding_never_reaches_the_contraction(mm):
    """k = 5 (padded to 8) with both operands non-zero in their padding (exp, + 1):
    the product must mask it, in every lowering (the random μGraphs rarely hit this)."""
    kg = mg.KernelGraph("pad")
    X = kg.input("X", (3, 20), "float32")
    W = kg.input("W", (20, 6), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=4)
    x, w = bg.input(X, fmap=1), bg.input(W, fmap=0)      # tiles (3, 5) and (5, 6)
    bg.output(bg.accum(mg.matmul(mg.exp(x), w + 1)), omap=(None, None, None))
    (o,) = kg.kernel(bg)
    kg.output(o)
    (op,) = _blocks(kg)
    info = plan(bg, KernelConfig(small_mm=mm)).info
    mmop = next(b for b in bg.ops if b.kind == "matmul")
    assert (mmop.id in info.deferred) == (mm == "va") and (mmop.id in info.dot_ops) == (mm == "dot")
    prog = lower.compile(kg, device="cpu", configs={op.id: KernelConfig(num_stages=2, small_mm=mm)}, poison=True)
    assert ("tl.dot(" in prog.triton_source()) == (mm == "dot")
    assert max(check(prog, kg, random_inputs(kg, 11))) <= 1e-4, mm


@pytest.mark.parametrize("how", ["permute in the block", "strided input"])
def test_a_key_major_right_operand_multiplies_over_m_n_k(how):
    """K held a key per row (a KV cache), read as Kᵀ for q @ kᵀ: the CUDA-core product runs
    over (m, n, k), the lanes along k as it lies in memory (over (m, k, n) every lane of a
    warp read one shared-memory bank: 4.5× slower on an H200). Whether Kᵀ comes from a
    permute in the block or arrives as a strided view, the result matches float64 with
    logits large enough to overflow without the running max; the V product, n-major, keeps
    (m, k, n). K stored key-minor keeps (m, k, n) for both."""

    heads, d, kv = 2, 32, 256
    g = decode_ugraph(heads=heads, rows=1, d=d, kv=kv, keys=64, k_rows=how == "permute in the block")
    op = next(o for o in g.ops if o.kind == "graph_defined")
    gen = torch.Generator().manual_seed(0)
    q, k, v = 40 * torch.randn(heads, 1, d, generator=gen), torch.randn(heads, kv, d, generator=gen), \
        torch.randn(heads, kv, d, generator=gen)
    qd, kd, vd = (x.half().double() for x in (q, k, v))
    ref = torch.softmax(qd @ kd.transpose(1, 2) / d ** 0.5, -1) @ vd
    assert torch.isfinite(ref).all() and (qd @ kd.transpose(1, 2) / d ** 0.5).max() > 12  # exp overflows fp16
    kt = k.half() if how == "permute in the block" else k.half().transpose(1, 2)   # (heads, d, kv) view
    strides = None if how == "permute in the block" else {"K": tuple(kt.stride())}
    for label in ("w4s3v", "w4s3k4Lv"):
        prog = lower.compile(g, device="cpu", configs={op.id: KernelConfig.from_label(label)}, input_strides=strides)
        src = prog.triton_source()
        assert src.count("over (m, n, k), b read k-major") == 1 and src.count("over (m, k, n)") == 1, label
        out = prog(Q=q.half(), K=kt, V=v.half()).double()
        assert (out - ref).abs().max().item() < 2e-3 * ref.abs().max().item(), label
    plain = decode_ugraph(heads=heads, rows=1, d=d, kv=kv, keys=64)
    src = lower.compile(plain, device="cpu", configs={next(o for o in plain.ops if o.kind == "graph_defined").id:
                                                      KernelConfig.from_label("w4s3v")}).triton_source()
    assert "k-major" not in src and src.count("over (m, k, n)") == 2


def test_the_tuner_leaves_the_cuda_cores_out_for_a_key_major_right_operand():
    """The cost model sees no strides, so the tuner's menu does: a one-row decode whose Kᵀ
    lies key-major (a permute of a key-per-row cache, or a transposed view handed in) is
    tuned on ``tl.dot`` only; stored key-minor, the CUDA-core lowering stays on the menu,
    and so it does for a GEMV whose weight is a transposed view (its activation steps along
    k with it). A menu the caller gave without ``"dot"`` is kept."""
    from lower.profile import small_mm_menu

    def kernel(g):
        return next(o for o in g.ops if o.kind == "graph_defined")

    rows, plain = decode_ugraph(heads=2, rows=1, d=32, kv=256, keys=64, k_rows=True), \
        decode_ugraph(heads=2, rows=1, d=32, kv=256, keys=64)
    row_major = [lower.layout.strides_for(t.shape, t.ndim - 1) for t in kernel(plain).inputs]
    assert small_mm_menu(kernel(plain), row_major) == ("dot", "v")
    assert small_mm_menu(kernel(rows), [lower.layout.strides_for(t.shape, t.ndim - 1) for t in kernel(rows).inputs]) \
        == ("dot",)
    kt = torch.randn(2, 256, 32).half().transpose(1, 2)           # Kᵀ (heads, d, kv), a view
    viewed = [tuple(kt.stride()) if t.name == "K" else st for t, st in zip(kernel(plain).inputs, row_major)]
    assert small_mm_menu(kernel(plain), viewed) == ("dot",)
    assert small_mm_menu(kernel(plain), viewed, ("v",)) == ("v",)
    labels = {lab for lab, _, _ in lower.tune(plain, predict_only=True).trials}
    assert any(lab.endswith("v") for lab in labels)
    gemv = mg.KernelGraph("gemv")
    X, W = gemv.input("X", (1, 256), "float16"), gemv.input("W", (256, 64), "float16")
    b = mg.BlockGraph((4, 1, 1), 4)
    b.output(b.accum(b.input(X, (None, None, None), 1) @ b.input(W, (1, None, None), 0)), (1, None, None))
    (y,) = gemv.kernel(b)
    gemv.output(y)
    assert small_mm_menu(kernel(gemv), [(256, 1), (1, 256)]) == ("dot", "v")     # W = linear weightᵀ
    one = mg.KernelGraph("one_step")                                              # no loop: nothing per step
    X, W = one.input("X", (1, 256), "float16"), one.input("W", (256, 64), "float16")
    b = mg.BlockGraph((4, 1, 1), 1)
    b.output(b.accum(b.input(X, (None, None, None)) @ b.input(W, (1, None, None))), (1, None, None))
    (y,) = one.kernel(b)
    one.output(y)
    assert small_mm_menu(kernel(one), [(256, 1), (1, 256)]) == ("dot", "v")
    x = {"Q": torch.randn(2, 1, 32).half(), "K": kt, "V": torch.randn(2, 256, 32).half()}
    labels = {lab for lab, _, _ in lower.tune(plain, inputs=x, predict_only=True).trials}
    assert labels and not any("v" in lab for lab in labels)


def test_a_prediction_prices_the_layout_the_inputs_come_in():
    """The search ranks its candidates, and the pipeline its verified ones, by predictions
    (``predict_tuned``) that see the inputs' strides (``OptimizeConfig.input_strides``): a
    decode over a key-major Kᵀ is priced at its ``tl.dot`` configurations, which the tuner
    times, not at the CUDA-core ones it never runs for it; row-major, the CUDA cores stay
    in the space. The search's estimate carries the strides to its workers (picklable)."""
    import pickle

    from mugraph.pipeline import optimize
    from mugraph.pipeline.timing import predict_tuned

    g = decode_ugraph(heads=2, rows=1, d=32, kv=256, keys=64)
    kt = {"K": tuple(torch.randn(2, 256, 32).half().transpose(1, 2).stride())}
    plain, viewed = predict_tuned(g), predict_tuned(g, kt)
    assert any(lab.endswith("v") for lab, _, _ in plain.trials)
    assert viewed.trials and not any("v" in lab for lab, _, _ in viewed.trials)
    assert all(c.small_mm == "dot" for c in viewed.configs.values())
    est = optimize._estimator(mg.OptimizeConfig(input_strides=kt))
    assert pickle.loads(pickle.dumps(est))(g) == viewed.predicted_s
    assert optimize._estimator(mg.OptimizeConfig()) is optimize._lowered_estimate


def test_the_fast_dim_of_a_tile_is_read_back_to_its_source():
    """``lower.layout.loaded_fast_dim``: the stride-1 dim of the iterator's source, through a
    permute (dim o of it is its input's perm[o]) and one-input element-wise ops; a tile made
    by another op, or loaded from a source with no stride-1 dim longer than 1, has none."""
    from lower.layout import k_major, loaded_fast_dim

    g = mg.KernelGraph("fast")
    x = g.input("X", (4, 32, 8), "float16")
    b = mg.BlockGraph((4, 1, 1), 1)
    t = b.input(x, (0, None, None))                        # tile (1, 32, 8)
    p = mg.permute(mg.scale(t, 2), (0, 2, 1))              # (1, 8, 32)
    s = mg.sum(t, 2)
    row_major, transposed = [(256, 8, 1)], [(256, 1, 32)]
    assert loaded_fast_dim(t, row_major) == 2 and loaded_fast_dim(t, transposed) == 1
    assert loaded_fast_dim(p, row_major) == 1 and loaded_fast_dim(p, transposed) == 2
    assert loaded_fast_dim(s, row_major) is None                # a reduction makes its tile
    assert loaded_fast_dim(t, [(256, 0, 0)]) is None            # no stride-1 dim
    assert k_major(t, row_major) is False and k_major(t, transposed) is True   # t as (.., k=32, n=8)
