"""mugraph.core.ir.dataflow_key: equal for graphs that differ only in the order of independent ops,
tensor numbering or a kernel's source order; different for any change of what is computed."""

import mugraph as mg
from mugraph.core.benchmarks import REFERENCES, reference
from mugraph.core.ir import dataflow_key


def _rmsnorm_matmul(sum_first=False, sources=("X", "G", "W"), c=1 / 4096, omap=(1,), loop=64, gx=False):
    kg = mg.KernelGraph("rmsnorm_matmul")
    X = kg.input("X", (2, 4096)); G = kg.input("G", (4096,)); W = kg.input("W", (4096, 6144))
    by_name = {"X": X, "G": G, "W": W}
    bg = mg.BlockGraph(grid=(96, 1, 1), forloop=loop)
    its = {}
    for name in sources:  # the order iterators (and so the kernel's sources) are added in
        its[name] = bg.input(by_name[name], imap={"X": (None,), "G": None, "W": (1,)}[name],
                             fmap={"X": 1, "G": 0, "W": 0}[name])
    x, g, w = its["X"], its["G"], its["W"]
    xg = g * x if gx else x * g
    if sum_first:
        ss = bg.accum(mg.sum(mg.square(x), 1)); acc = bg.accum(mg.matmul(xg, w))
    else:
        acc = bg.accum(mg.matmul(xg, w)); ss = bg.accum(mg.sum(mg.square(x), 1))
    bg.output(acc / mg.sqrt(ss * c), omap=omap)
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def test_orderings_and_numbering_do_not_change_the_key():
    base = dataflow_key(_rmsnorm_matmul())
    assert dataflow_key(_rmsnorm_matmul(sum_first=True)) == base
    assert dataflow_key(_rmsnorm_matmul(sources=("W", "X", "G"))) == base
    assert dataflow_key(_rmsnorm_matmul(gx=True, sum_first=True)) == base  # g*x: mul commutes
    assert dataflow_key(reference("rmsnorm_matmul", 1)) == base


def test_what_is_computed_changes_the_key():
    base = dataflow_key(_rmsnorm_matmul())
    assert dataflow_key(_rmsnorm_matmul(c=1 / 2048)) != base
    assert dataflow_key(_rmsnorm_matmul(loop=32)) != base
    assert dataflow_key(reference("rmsnorm_matmul", 8)) != dataflow_key(reference("rmsnorm_matmul", 1))
    keys = {dataflow_key(reference(n, 1)) for n in REFERENCES}
    assert len(keys) == len(REFERENCES)
