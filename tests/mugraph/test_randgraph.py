"""The one generator of random μGraphs: deterministic, valid, and under each profile
reaching every kind of graph that profile promises (op kinds, grids, loops, maps,
kernel chains) — the lowering's tests and the verifier's fuzz both draw from it."""

from collections import Counter
from dataclasses import replace

import numpy as np

from lower.testing import random_graph
from mugraph.core.lax import is_lax
from mugraph.core.randgraph import ALL_OPS, LOWERING, Profile, fuzz_profile, random_ugraph
from verify.fuzz import random_ugraph as fuzz_ugraph

STRUCTURAL = {"iterator", "accum"}


def _kernels(g):
    return [op for op in g.ops if op.kind == "graph_defined"]


def _features(graphs) -> Counter:
    c: Counter = Counter()
    for g in graphs:
        kernels = _kernels(g)
        c["kernels", len(kernels)] += 1
        c.update(("kernel op", op.kind) for op in g.ops if op.kind not in ("input", "graph_defined"))
        for op in kernels:
            bg = op.attrs["block"]
            c["grid", tuple(bg.grid)] += 1
            c["forloop", bg.forloop] += 1
            c.update(("block op", o.kind) for o in bg.ops if o.kind not in STRUCTURAL)
            for o in bg.ops:
                if o.kind == "iterator":
                    imap = o.attrs["imap"]
                    c["fmap", o.attrs["fmap"]] += 1
                    mapped = [d for d in imap if d is not None]
                    c["replicated" if any(bg.grid[a] > 1 and imap[a] is None for a in range(3)) else "mapped"] += 1
                    c["permuted"] += mapped != sorted(mapped)
            c["savers", len(bg.savers)] += 1
    return c


def test_deterministic_in_the_seed():
    assert str(random_ugraph(7)) == str(random_ugraph(7))
    assert str(random_ugraph(7)) != str(random_ugraph(8))
    assert str(random_graph(7)) == str(random_ugraph(7))  # the lowering's tests draw from it
    fz = fuzz_profile()
    assert str(random_ugraph(3, fz)) == str(random_ugraph(3, fz))
    a, b = fuzz_ugraph(np.random.default_rng(5)), fuzz_ugraph(np.random.default_rng(5))
    assert str(a) == str(b) and a.name == "random_ugraph"


def test_lowering_profile_reaches_everything_the_lowering_must_handle():
    f = _features(random_ugraph(s) for s in range(120))
    assert {k[1] for k in f if k[0] == "block op"} == ALL_OPS  # every block op
    assert f["kernels", 1] and f["kernels", 2]  # chains of graph-defined kernels
    assert {k[1] for k in f if k[0] == "kernel op"} >= {"scale", "sqrt", "permute", "slice"}  # pre-defined ops between them
    assert {k[1] for k in f if k[0] == "forloop"} == {1, 2, 3, 4}
    assert {k[1][0] for k in f if k[0] == "grid"} == {1, 2, 3} and any(k[1][2] == 2 for k in f if k[0] == "grid")
    assert f["replicated"] and f["mapped"] and f["permuted"] and f["fmap", None] and f["fmap", 0]
    assert f["savers", 2] or f["savers", 3]
    half = [random_ugraph(s, replace(LOWERING, dtype="float16")) for s in range(3)]
    assert all(t.dtype == "float16" for g in half for t in g.inputs)


def test_fuzz_profile_draws_one_lax_kernel_over_square_inputs():
    n = 4
    prof = fuzz_profile(n=n, max_ops=5)
    graphs = [fuzz_ugraph(np.random.default_rng(s), n=n) for s in range(150)]
    for g in graphs:
        assert len(_kernels(g)) == 1 and is_lax(g)
        assert 2 <= len(g.inputs) <= 3 and all(tuple(t.shape) == (n, n) for t in g.inputs)
    f = _features(graphs)
    assert {k[1] for k in f if k[0] == "block op"} == prof.ops  # every kind the profile allows, no other
    assert {k[1] for k in f if k[0] == "grid"} == {(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1)}
    assert {k[1] for k in f if k[0] == "forloop"} == {1, 2}
    assert f["replicated"] and f["permuted"] and f["fmap", 0] and f["fmap", 1]


def test_a_profile_narrows_the_op_kinds():
    prof = Profile(ops=frozenset({"add", "matmul"}), chain=False)
    kinds = {o.kind for s in range(30) for op in _kernels(random_ugraph(s, prof))
             for o in op.attrs["block"].ops} - STRUCTURAL
    assert kinds == {"add", "matmul"}
