"""search.rewrite (fusion, loop split) and search.compose (partition, splice): every rewrite
is checked in float64 against the program, and illegal rewrites are refused."""

from fractions import Fraction

import numpy as np

import mugraph as mg
import search
from mugraph.core.benchmarks import programs
from search import SearchConfig
from search.check import Checker
from search.compose import compose, partition
from search.rewrite import fuse, fusable_pairs, fuse_all, split_loop, split_variants


def _agree(program, graph, seed=0):
    rng = np.random.default_rng(seed)
    ins = {t.name: rng.uniform(0.5, 1.5, t.shape) for t in program.inputs}
    ref = mg.evaluate(program, ins)
    out = mg.evaluate(graph, ins)
    return all(np.allclose(a, b, rtol=1e-9, atol=0) for a, b in zip(out, ref))


def _two_kernels(program_fn, producer, consumer):
    """A program and a hand-written two-kernel μGraph of it: ``producer`` (loop-free) feeds ``consumer``."""
    return program_fn(), producer, consumer


def _norm_cols_then_matmul():
    """``rms_norm(X) @ W`` as a row-norm kernel and a matmul kernel that reads X's columns in chunks."""
    p = mg.Program("norm_mm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32))
    p.output(mg.rms_norm(X) @ W)
    g = mg.KernelGraph("norm_mm")
    x = g.input("X", (8, 64)); w = g.input("W", (64, 32))
    a = mg.BlockGraph((4, 1, 1), 1)
    xt = a.input(x, (0, None, None))
    a.output(a.accum(xt / mg.sqrt(mg.scale(mg.sum(mg.square(xt), 1), Fraction(1, 64)))), (0, None, None))
    (xn,) = g.kernel(a)
    b = mg.BlockGraph((2, 2, 1), 4)
    bx = b.input(xn, (0, None, None), 1)
    bw = b.input(w, (None, 1, None), 0)
    b.output(b.accum(bx @ bw), (0, 1, None))
    (y,) = g.kernel(b)
    g.output(y)
    return p, g


def _exp_cols_then_matmul():
    """``exp(X) @ W``: the exp kernel splits X's columns; the matmul kernel loops over them."""
    p = mg.Program("exp_mm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32))
    p.output(mg.exp(X) @ W)
    g = mg.KernelGraph("exp_mm")
    x = g.input("X", (8, 64)); w = g.input("W", (64, 32))
    a = mg.BlockGraph((2, 4, 1), 1)
    a.output(a.accum(mg.exp(a.input(x, (0, 1, None)))), (0, 1, None))
    (e,) = g.kernel(a)
    b = mg.BlockGraph((2, 1, 1), 4)
    b.output(b.accum(b.input(e, (0, None, None), 1) @ b.input(w, None, 0)), (0, None, None))
    (y,) = g.kernel(b)
    g.output(y)
    return p, g


def test_fuse_maps_producer_axes_onto_consumer_axes_and_loop():
    p, g = _exp_cols_then_matmul()
    assert _agree(p, g)
    assert fusable_pairs(g) == [(2, 3)]
    f = fuse(g, 2, 3)
    assert f is not None and f.num_kernels == 1
    bg = f.ops[-1].attrs["block"]
    assert (bg.grid, bg.forloop) == ((2, 1, 1), 4)
    it = [op for op in bg.ops if op.kind == "iterator" and bg.sources[op.attrs["source"]].name == "X"][0]
    assert it.attrs["imap"] == (0, None, None) and it.attrs["fmap"] == 1  # rows by x, columns by the loop
    assert _agree(p, f)
    assert Checker(p).check(f) == (True, True)


def test_fuse_refuses_when_consumer_splits_a_dim_the_producer_keeps_whole():
    # the norm needs whole rows; the consumer reads them in column chunks: no legal fusion
    p, g = _norm_cols_then_matmul()
    assert _agree(p, g)
    assert fuse(g, 2, 3) is None
    # a producer with no grid at all, read by a consumer split over rows: refused too
    h = mg.KernelGraph("h")
    x = h.input("X", (8, 64)); w = h.input("W", (64, 32))
    a = mg.BlockGraph((1, 1, 1), 1)
    xt = a.input(x)
    a.output(a.accum(mg.square(xt)))
    (sq,) = h.kernel(a)
    c = mg.BlockGraph((2, 1, 1), 1)
    c.output(c.accum(c.input(sq, (0, None, None)) @ c.input(w)), (0, None, None))
    (y,) = h.kernel(c)
    h.output(y)
    assert fuse(h, 2, 3) is None


def test_fuse_row_norm_into_row_consumer_is_equivalent():
    p = mg.Program("norm_exp")
    X = p.input("X", (8, 64))
    p.output(mg.exp(mg.rms_norm(X)))
    g = mg.KernelGraph("norm_exp")
    x = g.input("X", (8, 64))
    a = mg.BlockGraph((8, 1, 1), 1)
    xt = a.input(x, (0, None, None))
    a.output(a.accum(xt / mg.sqrt(mg.scale(mg.sum(mg.square(xt), 1), Fraction(1, 64)))), (0, None, None))
    (xn,) = g.kernel(a)
    b = mg.BlockGraph((4, 1, 1), 1)
    b.output(b.accum(mg.exp(b.input(xn, (0, None, None)))), (0, None, None))
    (y,) = g.kernel(b)
    g.output(y)
    assert _agree(p, g)
    (f,) = fuse_all(g)
    assert f.num_kernels == 1 and f.ops[-1].attrs["block"].grid == (4, 1, 1)
    assert _agree(p, f)
    assert Checker(p).check(f) == (True, True)


def test_split_loop_variants_of_attention_are_equivalent_split_kv():
    p = programs.program("gqa", 1, small=True)
    one = mg.KernelGraph("gqa")
    q, k, v = (one.input(t.name, t.shape, t.dtype) for t in p.inputs)
    b = mg.BlockGraph((2, 1, 1), 4)
    qt = b.input(q, (0, None, None)); kt = b.input(k, (0, None, None), 2); vt = b.input(v, (0, None, None), 1)
    e = mg.exp(qt @ kt)
    b.output(b.accum(e @ vt) / b.accum(mg.sum(e, 2)), (0, None, None))
    one.output(one.kernel(b)[0])
    assert _agree(p, one)
    vs = split_variants(one)
    # 2 blocks, a loop of 4 over 64-key steps: every chunk count (none fills the GPU), each
    # with the step kept (loop 4 / S) and with the loop kept (4 steps of 64 / S keys: 32, 16),
    # the combine re-gridded over the 32 query rows (2 tiles of 16) and on the kernel's own grid
    assert [v.ops[3].attrs["block"].grid[1] for v in vs] == [2, 2, 2, 2, 4, 4, 4, 4]
    assert [v.ops[3].attrs["block"].forloop for v in vs] == [2, 2, 4, 4, 1, 1, 4, 4]
    assert [v.ops[-1].attrs["block"].grid for v in vs] == [(2, 2, 1), (2, 1, 1)] * 4
    ck = Checker(p)
    for v in vs:
        assert v.num_kernels == 2 and v.ops[-1].attrs["block"].forloop == v.ops[3].attrs["block"].grid[1]
        assert _agree(p, v) and ck.fingerprint_matches(v)


def test_split_loop_refuses_loop_free_kernels_and_bad_chunks():
    p, g = _exp_cols_then_matmul()
    assert split_loop(g, 2, 2) is None          # forloop 1: nothing to split
    assert split_loop(g, 3, 3) is None          # 3 does not divide 4
    h = split_loop(g, 3, 2)                     # split-K of the matmul kernel
    assert h is not None and h.num_kernels == 3 and _agree(p, h)


def test_partition_cuts_cheapest_tensors_and_composes_back():
    p = programs.qknorm_gqa(1)
    pieces = partition(p, 6, max_inputs=4)
    assert [len(x.op_ids) for x in pieces] == [5, 5, 6]
    assert sorted(t.shape for x in pieces[:2] for t in x.outputs) == [(2, 64, 4096), (2, 256, 64)]
    assert partition(programs.gqa(1), 6) is None  # small enough already
    # splicing each piece's own program (pre-defined ops) back gives the program's function
    small = programs.qknorm_gqa(1, queries=16, head_dim=8, kv=32)
    pcs = partition(small, 6, max_inputs=4)
    whole = compose(small, pcs, [x.program for x in pcs])
    assert _agree(small, whole)
    n = partition(programs.ntrans(1), 8, max_inputs=4)
    assert all(len(x.op_ids) <= 8 for x in n) and len(n) == 2


def test_compositional_search_fuses_qknorm_attention_into_one_kernel():
    """Too deep for the enumeration (~20 block ops): pieces are searched, spliced, fused, verified."""
    p = programs.qknorm_gqa(1, queries=16, head_dim=16, kv=64)
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=8, tile_sizes=(16,), forloop_ranges=(4,), workers=1,
                       time_limit=60, verify_reserve=12, compose_share=0.9, progress=False,
                       verify_error=1e-3, max_verify=4)
    r = search.run(p, cfg)
    assert r.stats["derived"]["pieces"]
    ones = [g for g, o in zip(r.graphs, r.origins) if g.num_kernels == 1]
    assert ones and "composed+fused" in r.origins, (r.origins, r.stats["derived"])
    for g in r.graphs:
        assert _agree(p, g)


def test_split_loop_recomputes_constant_tiles_read_after_the_loop():
    """A post-loop op reading a tile of constants only (made before the loop): the
    combining kernel makes it again — the split used to fail with a KeyError, which
    is no MugraphError and stopped the whole search."""
    p = mg.Program("scaled_mm")
    X = p.input("X", (4, 64), "float32"); W = p.input("W", (64, 8), "float32")
    p.output((X @ W) * 3)
    g = mg.KernelGraph("scaled_mm")
    x = g.input("X", (4, 64), "float32"); w = g.input("W", (64, 8), "float32")
    b = mg.BlockGraph((2, 1, 1), 4)
    c = b.add_op("const", [], {"value": 3, "shape": (1, 1), "dtype": "float32"})
    acc = b.accum(b.input(x, (None, None, None), 1) @ b.input(w, (1, None, None), 0))
    b.output(acc * c, (1, None, None))
    (y,) = g.kernel(b)
    g.output(y)
    assert _agree(p, g)
    variants = split_variants(g)
    assert [v.ops[-1].attrs["block"].forloop for v in variants] == [2, 4]
    assert all(_agree(p, v) for v in variants)


def test_the_compositional_search_prices_its_pieces_with_the_estimate():
    """The composition prices every piece's matches with the estimate it is handed
    (within the piece's time; what it then offers: test_split_chunks), and what it
    composes is still the program."""
    from search.derive import composed, sequential

    p = programs.qknorm_gqa(1, queries=16, head_dim=16, kv=64)
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=8, tile_sizes=(16,), forloop_ranges=(4,), workers=1,
                       progress=False, verify_error=1e-3)
    priced = []

    def estimate(g):
        priced.append(g)
        return float(len(priced))  # the first priced is the estimate's favourite

    stats: dict = {}
    out = composed(p, cfg, 12.0, sequential(Checker(p, cfg.verify_error)), stats, search.run, estimate=estimate)
    assert out and all(_agree(p, x.graph) for x in out)
    pieces = [stats[f"piece{i}"] for i in range(len(stats["pieces"]))]
    assert len(pieces) >= 2 and all(v["priced"] == v["matches"] >= 1 for v in pieces)
    assert len(priced) == sum(v["priced"] for v in pieces)
