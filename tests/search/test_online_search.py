"""The search finds the online softmax (docs/design.md §3.4) by its general moves: the
enumerator offers a running max and sums rescaled to it wherever a program has a free
shift, and the split-loop rewrite folds a split's partials with each accumulator's own
monoid. Nothing here names attention: the program is a safe softmax-weighted sum, and the
whole row cannot sit in one block's shared memory, so only a loop over it can match."""

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks.programs import decode_attention
from mugraph.core.ir import RESCALED, accum_monoid
from search import driver
from search.config import SearchConfig
from search.rewrite import split_loop

R, N, D = 4, 64, 8


def _program():
    p = mg.Program("safe")
    s, v = p.input("s", (R, N), "float32"), p.input("v", (N, D), "float32")
    e = mg.exp(s - mg.max(s, 1))
    p.output((e @ v) / mg.sum(e, 1))
    return p


def _online(steps=4):
    """The online form written by hand: per step its tile's max, both sums rescaled to the
    running max (tests/verify/test_online.py checks its near-misses)."""
    g = mg.KernelGraph("online")
    s, v = g.input("s", (R, N), "float32"), g.input("v", (N, D), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=steps)
    st, vt = bg.input(s, (None, None, None), 1), bg.input(v, (None, None, None), 0)
    m = mg.max(st, 1)
    e = mg.exp(st - m)
    bg.output(bg.accum(e @ vt, m) / bg.accum(mg.sum(e, 1), m), (None, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


def _monoids(g):
    return [accum_monoid(o) for op in g.ops if op.kind == "graph_defined" for o in op.attrs["block"].ops
            if o.kind == "accum"]


def test_the_search_finds_a_proven_online_softmax():
    """8 query rows against 1,024 keys of head dim 32 with a 16 KB shared-memory budget: a
    block can hold a fraction of the keys only, so every match loops over them."""
    p = decode_attention(b=1, heads=8, kv_heads=1, kv=1024, head_dim=32, safe=True, dtype="float16")
    cfg = SearchConfig(time_limit=60, workers=1, progress=False, smem_budget=16 * 1024,
                       compose=False, split_loops=False, max_results=1, verify_per_kernels=1)
    r = driver.run(p, cfg)
    assert r.graphs, r.stats
    g = r.graphs[0]
    assert RESCALED in _monoids(g)
    assert r.verdicts[0]["equivalent"] and r.verdicts[0]["bound_met"]


@pytest.mark.parametrize("chunks", [2, 4])
def test_a_split_online_loop_combines_with_rescaled_accumulators(chunks):
    g = _online()
    kernel = next(op.id for op in g.ops if op.kind == "graph_defined")
    h = split_loop(g, kernel, chunks)
    assert h is not None and h.num_kernels == 2
    assert _monoids(h).count(RESCALED) == 4  # two per kernel: numerator and denominator
    v = verify.equivalent(_program(), h, seed=3, float_check=False)
    assert v.equivalent and v.bound_met, v
