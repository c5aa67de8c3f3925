"""Canonical form: no μGraph twice, none missed against brute force."""

import mugraph as mg
from mugraph.core.ops import CATALOG
from search.config import SearchConfig
from search.enumerate import Searcher
from search.mappings import mappings


def _program():
    p = mg.Program("tiny")
    X = p.input("X", (4, 8)); W = p.input("W", (8, 4))
    p.output(mg.exp(X @ W) * (X @ W) + mg.sum(X @ W, 1))
    return p


def _sig(lv, i, memo):
    if i in memo:
        return memo[i]
    for j, (spec, n) in enumerate(zip(lv.ops, lv.nout)):
        pass
    raise KeyError(i)


def _state_hash(lv, n_inputs):
    """Structural hash: the multiset of op signatures, each naming its inputs structurally."""
    sig = {i: f"in{i}" for i in range(n_inputs)}
    t = n_inputs
    ops = []
    for spec, n in zip(lv.ops, lv.nout):
        kind, ins, attrs = spec[-3], spec[-2], spec[-1]
        if spec[0] == "op":
            kind, ins, attrs = spec[1], spec[2], spec[3]
        else:
            kind, ins, attrs = spec[0], spec[1], spec[2]
        args = [sig[i] for i in ins]
        if kind in CATALOG and CATALOG[kind].commutative:
            args.sort()
        s = f"{kind}{attrs}({','.join(args)})"
        ops.append(s)
        for k in range(n):
            sig[t] = s + f"#{k}"
            t += 1
    return tuple(sorted(ops))


def _kernel_states(canonical):
    cfg = SearchConfig(max_kernel_ops=3, max_graph_defined=0, prune_abstract=False, prune_labels=False,
                       kernel_ops=("add", "mul", "exp", "sum"))
    s = Searcher(_program(), cfg)
    s.canonical = canonical
    seen = []
    orig = s.kernel_dfs

    def spy(ks, new):
        seen.append(_state_hash(ks, 2))
        return orig(ks, new)

    s.kernel_dfs = spy
    s.kernel_dfs(s.initial(), 0)
    return seen


def test_kernel_level_canonical_matches_brute_force():
    canon = _kernel_states(True)
    brute = _kernel_states(False)
    assert len(canon) == len(set(canon)), "a kernel graph was generated twice"
    assert set(canon) == set(brute)
    assert len(brute) > len(canon) > 50


def _block_states(canonical):
    p = mg.Program("blk")
    X = p.input("X", (4, 64)); W = p.input("W", (64, 32))
    p.output(mg.exp(X @ W) * (X @ W))
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=5, prune_abstract=False, tile_sizes=(16,),
                       forloop_ranges=(4,))
    s = Searcher(p, cfg)
    s.canonical = canonical
    ks = s.initial()
    mp = [m for m in mappings([(ks.shapes[0], ks.labs[0]), (ks.shapes[1], ks.labs[1])], 2, cfg, s.reduced)
          if m.forloop == 4 and m.grid == (2, 1, 1)][0]
    seen = []
    orig = s.block_dfs

    def spy(ks_, inputs, mp_, bs, pending):
        seen.append(_state_hash(bs, 2))
        return orig(ks_, inputs, mp_, bs, pending)

    s.block_dfs = spy
    s._close = lambda *a: None
    s.block_start(ks, (0, 1), mp)
    return seen


def test_block_level_canonical_matches_brute_force():
    canon = _block_states(True)
    brute = _block_states(False)
    assert len(canon) == len(set(canon)), "a block graph was generated twice"
    assert set(canon) == set(brute)
    assert len(canon) > 20


def test_outputs_of_one_shape_are_tiled_by_one_axis():
    """Two projections of one activation, two outputs nothing in the program ties: a kernel
    computing both can cut both weights' columns by one grid axis (their dims are labelled
    one class); otherwise its blocks could only hold both weights' columns whole."""
    import search
    from search.labels import program_labels

    p = mg.Program("two_projections")
    x = p.input("X", (1, 256), "float32")
    wg, wu = p.input("Wg", (256, 4096), "float32"), p.input("Wu", (256, 4096), "float32")
    p.output(x @ wg)
    p.output(x @ wu)
    ins, outs, _ = program_labels(p)
    assert ins["Wg"][1] == ins["Wu"][1] and outs[0] == outs[1]
    cfg = SearchConfig(time_limit=30, workers=1, progress=False, compose=False, split_loops=False, verify=False,
                       max_kernel_ops=1)
    r = search.run(p, cfg)
    cut = [g for g in r.graphs if max(g.ops[-1].attrs["block"].grid) > 1]
    assert cut and all(g.num_kernels == 1 for g in cut)


def test_a_block_saves_as_many_tiles_as_the_program_has_outputs():
    """Three projections of one activation (a layer's q, k and v): one kernel of them saves
    three tiles, one more than ``max_block_outputs`` allows; below the program's output count
    no one-kernel μGraph of it exists, and the search found none (an RMSNorm with its q, k
    and v projections stayed three kernels' worth of pieces)."""
    import search

    p = mg.Program("three_projections")
    x = p.input("X", (1, 64), "float32")
    ws = [p.input(n, (64, c), "float32") for n, c in (("Wq", 256), ("Wk", 64), ("Wv", 64))]
    for w in ws:
        p.output(x @ w)
    cfg = SearchConfig(time_limit=30, workers=1, progress=False, compose=False, split_loops=False, verify=False,
                       max_kernel_ops=1)
    assert cfg.max_block_outputs == 2
    r = search.run(p, cfg)
    assert r.graphs and all(g.num_kernels == 1 and len(g.outputs) == 3 for g in r.graphs)


def _projection_and_its_half(first: str) -> mg.Program:
    """``t = X @ W + b`` and ``t / 2``, both outputs: the program reads its output ``t`` again
    (a projection whose pre-activation a later piece reads, and which is scaled here)."""
    p = mg.Program("projection_and_half")
    b, x, w = p.input("b", (256,), "float32"), p.input("X", (1, 64), "float32"), p.input("W", (64, 256), "float32")
    t = x @ w + b
    half = mg.scale(t, 0.5)
    for out in ((t, half) if first == "t" else (half, t)):
        p.output(out)
    return p


def test_an_output_the_program_reads_again_is_saved_by_the_block_that_reads_it():
    """A block saves the tile ``t`` and goes on to scale it: one kernel, both outputs. Before,
    only tiles nothing read could be saved, and a graph's outputs were its unused tensors —
    no μGraph of this program existed for the enumeration (Phi-2's ``fc1`` with its bias and
    the GeLU's first halving: no candidate in 30 s at 2560 × 10240). And the two outputs
    have one abstract expression (constant factors are abstracted away): fingerprinted in
    one order only, half the graphs were lost — both orders of the outputs are found."""
    import search

    cfg = SearchConfig(time_limit=20, workers=1, progress=False, compose=False, split_loops=False,
                       max_kernel_ops=1)
    for first in ("t", "half"):
        p = _projection_and_its_half(first)
        r = search.run(p, cfg)
        assert r.graphs, first
        g = r.graphs[0]
        (block,) = [op.attrs["block"] for op in g.ops if op.kind == "graph_defined"]
        assert g.num_kernels == 1 and len(block.savers) == 2
        readers = block.consumers()
        assert any(readers[s.tensor] for s in block.savers), "one saved tile is read on by the block"
        assert r.verdicts[0] and r.verdicts[0]["equivalent"], r.verdicts[0]


def test_an_input_no_output_reads_leaves_the_space_as_it_was():
    """A graph ends only when every tensor is used; an input no output depends on counts as
    used from the start (search.enumerate.read_inputs). Without that, the space was empty
    and the search reported itself complete with no μGraph."""
    import search
    from search.enumerate import read_inputs

    def prog(unread: bool):
        p = mg.Program("unread")
        if unread:
            p.input("bias", (16,))
        X = p.input("X", (8, 64)); W = p.input("W", (64, 32))
        p.output(mg.exp(X @ W))
        return p

    assert read_inputs(prog(True)) == {"X", "W"}
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=4, tile_sizes=(16,), forloop_ranges=(4,),
                       executor="serial", progress=False, split_loops=False)
    with_it, without = search.run(prog(True), cfg), search.run(prog(False), cfg)
    assert without.graphs and len(with_it.graphs) == len(without.graphs)
    assert with_it.stats["complete"] and all(f.verdict["equivalent"] for f in with_it.found)
