"""A kernel that saves three tiles — an activation's q, k and v projections in one pass, as
the search makes it since a block may save as many tiles as its program has outputs — lowers
and matches float64 under the interpreter, each output written where the grid cuts it."""

from __future__ import annotations

import lower
import mugraph as mg
from lower.testing import check, random_inputs
from search import SearchConfig, run


def test_three_projections_of_one_activation_in_one_kernel_match_float64():
    p = mg.Program("three_projections")
    x = p.input("X", (2, 256), "float32")
    for name in ("Wq", "Wk", "Wv"):
        p.output(x @ p.input(name, (256, 64), "float32"))
    cfg = SearchConfig(time_limit=20, workers=1, progress=False, compose=False, split_loops=False, max_kernel_ops=1,
                       verify=False)
    graphs = [g for g in run(p, cfg).graphs if g.num_kernels == 1 and len(g.outputs) == 3]
    # blocks that each hold a slice of all three outputs' columns and loop over the activation
    sliced = [g for g in graphs if g.ops[-1].attrs["block"].grid[1] > 1 and g.ops[-1].attrs["block"].forloop > 1]
    assert len(sliced) >= 2
    for g in sliced[:2]:
        prog = lower.compile(g, device="cpu", poison=True)
        for seed in (0, 1):
            errs = check(prog, g, random_inputs(g, seed))
            assert max(errs) <= 1e-5, (g.ops[-1].attrs["block"].grid, seed, errs)
