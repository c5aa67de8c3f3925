"""search.rewrite (fusion, loop split) and search.compose (partition, splice): every rewrite
is checked in float64 against the program, and illegal rewrites are refused."""

from fractions import Fraction

import numpy as np

import mugraph as mg
import search
from mugraph.core.benchmarks import programs
from search import SearchConfig
from search.check import Checker
from search.compose import compose, partition, pointwise_kernel, pointwise_runs
from search.rewrite import (epilogue_pairs, fusable_pairs, fuse, fuse_all, fuse_epilogue, split_loop,
                            split_variants)


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
    # inlined into the consumer (its 4 blocks), or the consumer run on the producer's 8 rows
    fused = fuse_all(g)
    assert sorted(f.ops[-1].attrs["block"].grid for f in fused) == [(4, 1, 1), (8, 1, 1)]
    for f in fused:
        assert f.num_kernels == 1 and _agree(p, f)
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


def _gated_gelu_two_kernels(tail_grid=(4, 1, 1), transpose=False):
    """``gelu_tanh(X @ Wg) · (X @ Wu)`` as a looped kernel saving both products and a
    loop-free element-wise kernel on a tiling of its own (``tail_grid``); ``transpose``: the
    tail reads one product's tiles along the other dim than it writes (square products)."""
    n = 32 if transpose else 64
    p = mg.Program("gated_gelu")
    X = p.input("X", (n, 32)); Wg = p.input("Wg", (32, n)); Wu = p.input("Wu", (32, n))
    p.output(mg.gelu_tanh(X @ Wg) * (X @ Wu))
    g = mg.KernelGraph("gated_gelu")
    x, wg, wu = g.input("X", (n, 32)), g.input("Wg", (32, n)), g.input("Wu", (32, n))
    a = mg.BlockGraph((2, 1, 1), 4)
    xt = a.input(x, (None, None, None), 1)
    a.output(a.accum(xt @ a.input(wg, (1, None, None), 0)), (1, None, None))
    a.output(a.accum(xt @ a.input(wu, (1, None, None), 0)), (1, None, None))
    gate, up = g.kernel(a)
    if transpose:  # blocks of rows × columns, the up product's read as columns × rows
        b = mg.BlockGraph((2, 2, 1), 1)
        tail = mg.gelu_tanh(b.input(gate, (0, 1, None))) * b.input(up, (1, 0, None))
        b.output(b.accum(tail), (0, 1, None))
    else:
        b = mg.BlockGraph(tail_grid, 1)
        b.output(b.accum(mg.gelu_tanh(b.input(gate, (1, None, None))) * b.input(up, (1, None, None))),
                 (1, None, None))
    (y,) = g.kernel(b)
    g.output(y)
    return p, g


def test_fuse_epilogue_runs_an_elementwise_tail_on_the_producers_tiles():
    """A GeLU-gated projection's element-wise tail, a kernel of its own on another tiling,
    runs after the products' loop in one kernel: proven equal to the program."""
    p, g = _gated_gelu_two_kernels()
    assert _agree(p, g) and fusable_pairs(g) == []  # the producer has a loop: fuse cannot inline it
    assert epilogue_pairs(g) == [(3, 4)]
    f = fuse_epilogue(g, 3, 4)
    assert f is not None and f.num_kernels == 1
    bg = f.ops[-1].attrs["block"]
    assert (bg.grid, bg.forloop) == ((2, 1, 1), 4) and [sv.omap for sv in bg.savers] == [(1, None, None)]
    assert _agree(p, f)
    assert Checker(p).check(f) == (True, True)
    assert [h.num_kernels for h in fuse_all(g)] == [1]


def test_fuse_epilogue_refuses_tails_it_cannot_run_on_the_producers_tiles():
    # the tail reads a product's columns as its rows (a transposition in its maps): refused
    p, g = _gated_gelu_two_kernels(transpose=True)
    assert not _agree(p, g)  # not the program either: what a fusion must not paper over
    assert fuse_epilogue(g, 3, 4) is None
    # a product that is also a graph output, or a tail with a loop, is no epilogue
    h = mg.KernelGraph("h")
    x, w = h.input("X", (8, 32)), h.input("W", (32, 16))
    a = mg.BlockGraph((2, 1, 1), 4)
    a.output(a.accum(a.input(x, (None, None, None), 1) @ a.input(w, (1, None, None), 0)), (1, None, None))
    (xw,) = h.kernel(a)
    c = mg.BlockGraph((2, 1, 1), 2)
    c.output(c.accum(mg.exp(c.input(xw, (1, None, None), 0))), (1, None, None))
    (e,) = h.kernel(c)
    h.output(e)
    assert epilogue_pairs(h) == []  # the consumer loops over the product's rows
    h.output(xw)
    assert epilogue_pairs(h) == []


def test_an_elementwise_piece_is_built_not_searched():
    """A piece of element-wise ops only (a GeLU's tail, its constant 1 among them) is one
    loop-free kernel applying them, on a grid of tiles of at most 256; a piece with any other
    op is searched as before."""
    p = mg.Program("tail")
    x = p.input("X", (8, 1024)); b = p.input("b", (1, 1024))
    p.output(mg.gelu_tanh(x) + b)
    g = pointwise_kernel(p)
    assert g is not None and g.num_kernels == 1
    bg = g.ops[-1].attrs["block"]
    assert (bg.grid, bg.forloop) == ((4, 1, 1), 1) and bg.savers[0].omap == (1, None, None)
    assert _agree(p, g) and Checker(p).check(g) == (True, True)
    q = mg.Program("norm")
    q.output(mg.rms_norm(q.input("X", (8, 64))))
    assert pointwise_kernel(q) is None  # a reduction
    r = mg.Program("outer")  # inputs broadcast along the dims they hold one element of
    r.output(r.input("a", (8, 1)) * r.input("b", (1, 8)))
    assert _agree(r, pointwise_kernel(r))
    # an input of lower rank broadcasts from the right (an RMSNorm's (K,) weight times its (1, K)
    # product and a (1, 1) statistic): it was searched, 2.8-3.6 s of a decoder layer's 17 s share
    n = mg.Program("normed")
    s, x, w = n.input("s", (1, 1)), n.input("X", (1, 1024)), n.input("w", (1024,))
    n.output(w * (x / mg.sqrt(s * (1 / 1024) + 1e-5)))
    h = pointwise_kernel(n)
    assert h is not None and _agree(n, h) and Checker(n).check(h) == (True, True)
    wide = mg.Program("wider")  # two leading dims missing, one grid axis over a missing dim
    wide.output(wide.input("a", (16,)) * 2 + wide.input("b", (512, 4, 16)))
    k = pointwise_kernel(wide)
    assert k.ops[-1].attrs["block"].grid[0] == 2 and _agree(wide, k)


def test_the_programs_elementwise_runs_become_one_kernel_each():
    """``pointwise_runs``: the gated MLP's GeLU-tanh written out (eleven ops, a constant among
    them) and its product become one kernel beside the two library matmuls; a run never
    takes an op whose other input depends on the run through an op outside it; a program
    without two element-wise ops in a run gives None."""
    g = pointwise_runs(programs.gated_mlp(hidden=32, out=48, act="gelu_tanh", rows=8))
    assert [op.kind for op in g.ops if op.kind != "input"] == ["matmul", "matmul", "graph_defined"]
    assert _agree(programs.gated_mlp(hidden=32, out=48, act="gelu_tanh", rows=8), g)
    p = mg.Program("around")  # a = 2·X²; b = a @ W; 3·(a + b): a + b cannot join a's run
    x, w = p.input("X", (8, 16)), p.input("W", (16, 16))
    a = mg.square(x) * 2
    p.output((a + a @ w) * 3)
    h = pointwise_runs(p)
    assert [op.kind for op in h.ops if op.kind != "input"] == ["graph_defined", "matmul", "graph_defined"]
    assert _agree(p, h) and Checker(p).check(h) == (True, True)
    m = mg.Program("merge")  # a = 2·X; b = (a @ W)²; a + b joins b's run, not a's and b's together
    x, w = m.input("X", (8, 16)), m.input("W", (16, 16))
    a = x * 2
    b = mg.square(a @ w)
    m.output((a + b) * 3)
    k = pointwise_runs(m)
    assert [op.kind for op in k.ops if op.kind != "input"] == ["scale", "matmul", "graph_defined"]
    assert _agree(m, k) and Checker(m).check(k) == (True, True)
    q = mg.Program("lone")
    q.output(q.input("X", (4, 8)) @ q.input("W", (8, 4)) + q.input("R", (4, 4)))
    assert pointwise_runs(q) is None


def _random_program(seed: int) -> mg.Program:
    """A random program of element-wise ops, matmuls and row sums over (4, 8) values, its
    values read by later ops at random (paths around a matmul or a sum and back)."""
    import random

    rnd = random.Random(seed)
    p = mg.Program(f"random{seed}")
    vals = [p.input("X", (4, 8)), p.input("Y", (4, 8))]
    w = p.input("W", (8, 8))
    for _ in range(rnd.randint(3, 12)):
        a, b = rnd.choice(vals), rnd.choice(vals)
        kind = rnd.choice(["add", "mul", "square", "scale", "matmul", "rowsum", "add", "mul"])
        vals.append({"add": lambda: a + b, "mul": lambda: a * b, "square": lambda: mg.square(a),
                     "scale": lambda: a * 0.5, "matmul": lambda: a @ w,
                     "rowsum": lambda: a * mg.sum(b, 1)}[kind]())
    used = {t for op in p.ops for t in op.inputs}
    outs = [t for t in vals[2:] if t not in used] or [vals[-1]]
    for t in outs:
        p.output(t)
    return p


def test_random_programs_keep_their_meaning_with_their_runs_fused():
    """Any order of element-wise ops, products and sums: the fused program, where there is
    one, computes what the program does (a run that was not closed, or pieces out of order,
    would fail to splice or compute something else)."""
    fused = 0
    for seed in range(120):
        p = _random_program(seed)
        g = pointwise_runs(p)
        if g is not None:
            fused += 1
            assert _agree(p, g), seed
    assert fused > 40


def test_the_composition_fuses_a_projection_with_its_gelu_written_out():
    """``gelu_tanh(X @ W)``: ten ops, past one enumeration. The composition searches the
    product, builds the GeLU's element-wise pieces and runs them in the product's epilogue:
    one proven kernel."""
    p = mg.Program("mm_gelu")
    p.output(mg.gelu_tanh(p.input("X", (8, 64), "float32") @ p.input("W", (64, 128), "float32")))
    cfg = SearchConfig(workers=1, time_limit=6, verify_reserve=6, progress=False, verify_error=1e-3,
                       max_verify=2, split_loops=False)
    r = search.run(p, cfg)
    assert any(r.stats["derived"][f"piece{i}"].get("constructed") for i in range(len(r.stats["derived"]["pieces"])))
    fused = [g for g, o in zip(r.graphs, r.origins) if o == "composed+fused" and g.num_kernels == 1]
    assert fused, (r.origins, r.stats["derived"])
    assert all(_agree(p, g) for g in fused)


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
                       time_limit=30, verify_reserve=12, compose_share=0.9, progress=False,
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


def test_partition_keeps_projections_of_one_activation_together():
    """``gelu_tanh(X @ Wg) · (X @ Wu)``: cutting by bytes alone put the two products in
    different pieces (every cut tensor has the same size), where no fusion could merge their
    loops; they now share a piece, and the GeLU's pieces are element-wise."""
    p = mg.Program("gated_gelu")
    x = p.input("X", (1, 64)); wg, wu = p.input("Wg", (64, 256)), p.input("Wu", (64, 256))
    p.output(mg.gelu_tanh(x @ wg) * (x @ wu))
    pieces = partition(p, 6, max_inputs=4)
    assert [op.kind for op in pieces[0].program.ops if op.kind != "input"] == ["matmul", "matmul"]
    assert all(pointwise_kernel(pc.program) is not None for pc in pieces[1:])
    whole = compose(p, pieces, [pc.program for pc in pieces])
    assert _agree(p, whole)


def test_partition_cuts_at_an_output_the_program_reads_again():
    """An RMSNorm's product is an output (the layer's v projection reads it outside) and the
    q and k projections read it here: left in their piece, the kernel that loops over its
    dim would have to save it per step, and that piece had no one-kernel μGraph. It is a
    cut point now, free of the bytes an inner cut writes (it is written anyway): the
    projections get a piece of their own, reading it, and the pieces compose back."""
    p = mg.Program("norm_qk")
    x, g = p.input("X", (1, 64)), p.input("g", (64,))
    wq, wk = p.input("Wq", (64, 64)), p.input("Wk", (64, 16))
    y = g * mg.rms_norm(x, 1)
    p.output(y); p.output(y @ wq); p.output(y @ wk)
    pieces = partition(p, 6, max_inputs=4)
    last = pieces[-1]
    assert [op.kind for op in last.program.ops if op.kind != "input"] == ["matmul", "matmul"]
    assert y in last.inputs and y in pieces[-2].outputs
    assert _agree(p, compose(p, pieces, [pc.program for pc in pieces]))
    # one projection (Gemma-2B's norm with its q projection): a cut at the statistics alone
    # is as cheap in bytes and makes fewer pieces, but leaves the product to the kernel
    # contracting it; the product left uncut counts its bytes, so the cut takes it
    q = mg.Program("norm_q")
    x, g, wq = q.input("X", (1, 64)), q.input("g", (64,)), q.input("Wq", (64, 64))
    y = (g + 1.0) * (x / mg.sqrt(mg.sum(mg.square(x), 1) * (1 / 64) + 1e-6))
    q.output(y); q.output(y @ wq)
    pieces = partition(q, 6, max_inputs=4)
    assert [op.kind for op in pieces[-1].program.ops if op.kind != "input"] == ["matmul"]
    assert _agree(q, compose(q, pieces, [pc.program for pc in pieces]))


def test_an_elementwise_kernel_with_a_lower_rank_input_lowers_and_matches_float64(monkeypatch):
    """The built kernel reads a (K,) weight beside (1, K) and (1, 1) tiles: lowered under the
    interpreter, it matches the program in float64 (bf16 storage, as a decoder layer's)."""
    import torch

    from lower.runtime import compile as lower_compile
    from lower.testing import check

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    n = mg.Program("normed")
    s, x = n.input("s", (1, 1), "bfloat16"), n.input("X", (1, 1024), "bfloat16")
    w = n.input("w", (1024,), "bfloat16")
    n.output(w * (x / mg.sqrt(s * (1 / 1024) + 1e-5)))
    h = pointwise_kernel(n)
    gen = torch.Generator().manual_seed(3)
    ins = {"s": torch.rand((1, 1), generator=gen) * 900 + 100, "X": torch.randn((1, 1024), generator=gen),
           "w": torch.randn((1024,), generator=gen)}
    ins = {k: v.to(torch.bfloat16) for k, v in ins.items()}
    (err,) = check(lower_compile(h, device="cpu"), h, ins)
    assert err < 2e-2


def test_what_the_serial_start_found_stands_when_the_workers_find_nothing():
    from types import SimpleNamespace

    from search.derive import _search_piece

    def run(program, cfg):
        found = ["g"] if cfg.executor == "serial" else []
        return SimpleNamespace(graphs=found, stats={"complete": False, "executor": cfg.executor})
    cfg = SearchConfig(executor="processes", time_limit=9.0, progress=False)
    res, _, serial_s = _search_piece(run, mg.Program("p"), cfg)
    assert res.graphs == ["g"] and res.stats["executor"] == "serial" and serial_s is not None


def test_a_share_too_short_to_start_the_workers_is_searched_serially_whole():
    from types import SimpleNamespace

    from search.derive import _search_piece

    calls = []

    def run(program, cfg):
        calls.append((cfg.executor, cfg.time_limit))
        return SimpleNamespace(graphs=[], stats={"complete": False, "executor": cfg.executor})
    _search_piece(run, mg.Program("p"), SearchConfig(executor="processes", time_limit=5.0, progress=False))
    assert calls == [("serial", 5.0)]
    calls.clear()
    _search_piece(run, mg.Program("p"), SearchConfig(executor="processes", time_limit=9.0, progress=False))
    assert [c[0] for c in calls] == ["serial", "processes"] and calls[0][1] == 3.0


def test_a_composition_searches_its_small_pieces_in_this_process_first(monkeypatch):
    """A piece whose space a short serial search exhausts never starts the worker processes
    (their start cost more than the search: 1.5-3.8 s a piece on an H200 machine's 15 workers,
    0.03-1.5 s on one core); one it does not exhaust is searched on the workers, for the rest
    of its time. Either way the pieces compose back to the program."""
    from search import derive
    from search.derive import composed, sequential

    p = mg.Program("norm_qk")
    x, g = p.input("X", (1, 64)), p.input("g", (64,))
    wq, wk = p.input("Wq", (64, 64)), p.input("Wk", (64, 16))
    y = g * (x / mg.sqrt(mg.sum(mg.square(x), 1) * (1 / 64) + 1e-5))  # ten ops: past compose_above
    p.output(y); p.output(y @ wq); p.output(y @ wk)
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=6, tile_sizes=(16,), forloop_ranges=(4,),
                       executor="processes", workers=2, progress=False, verify_error=1e-3)
    for first, want in ((2.0, "serial"), (1e-4, "processes")):
        monkeypatch.setattr(derive, "SERIAL_FIRST_S", first)
        stats: dict = {}
        out = composed(p, cfg, 30.0, sequential(Checker(p, cfg.verify_error)), stats, search.run)
        searched = [stats[f"piece{i}"] for i in range(len(stats["pieces"])) if not stats[f"piece{i}"].get("constructed")]
        assert searched and all(v["executor"] == want for v in searched), stats
        assert out and all(_agree(p, o.graph) for o in out)
