"""mugraph.core.rewrite: replaying a graph with edits at sites, and dead-code elimination."""

from fractions import Fraction

import numpy as np
import pytest

import mugraph as mg
from mugraph.core.benchmarks import REFERENCES, reference
from mugraph.core.rewrite import DROP, live_graph, rebuild
from mugraph.core.serialize import graph_to_json


def _ins(g, seed=0):
    rng = np.random.default_rng(seed)
    return {t.name: rng.uniform(0.5, 1.5, t.shape) for t in g.inputs}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_rebuild_without_edits_is_the_same_graph(name):
    g = reference(name, small=True)
    h = rebuild(g)
    assert h is not g and graph_to_json(h) == graph_to_json(g)


def test_rebuild_keeps_the_class_and_const_dtype():
    p = mg.Program("p")
    X = p.input("X", (2, 3), "float32")
    p.output(X + 1)
    q = rebuild(p)
    assert type(q) is mg.Program and graph_to_json(q) == graph_to_json(p)


def test_replace_drop_and_reads_at_both_levels():
    g = reference("rmsnorm_matmul", small=True)
    gd = next(op for op in g.ops if op.kind == "graph_defined")
    block = gd.attrs["block"]
    sqrt = next(op for op in block.ops if op.kind == "sqrt")

    def double(rb, op):  # sqrt(u) -> 2 * sqrt(u): the output doubles
        return [mg.scale(rb.add(op, rb.inputs(op)), 2)]

    h = rebuild(g, replace={(gd.id, sqrt.id): double})
    a, b = mg.evaluate(g, _ins(g))[0], mg.evaluate(h, _ins(g))[0]
    assert np.allclose(b, a / 2)
    # reads: the saver reads the accumulator of the matmul, not the normalized value
    acc = next(op for op in block.ops if op.kind == "accum")
    k = rebuild(g, reads={block.savers[0].tensor: acc.outputs[0]})
    assert k.ops[-1].attrs["block"].savers[0].tensor.op.kind == "accum"


def test_saver_edits():
    kg = mg.KernelGraph("two")
    X = kg.input("X", (4, 8))
    b = mg.BlockGraph((2, 1, 1), 1)
    x = b.input(X, (0, None, None))
    b.output(b.accum(mg.exp(x)), (0, None, None))
    b.output(b.accum(mg.square(x)), (0, None, None))
    e, s = kg.kernel(b)
    kg.output(s)
    h = rebuild(kg, savers={(1, 0): DROP})
    assert len(h.ops[1].attrs["block"].savers) == 1 and len(h.ops[1].outputs) == 1
    assert np.allclose(mg.evaluate(h, _ins(kg))[0], mg.evaluate(kg, _ins(kg))[0])
    with pytest.raises(mg.InvalidGraphError):  # a new omap is checked like any other
        rebuild(kg, savers={(1, 1): (None, None, None)})


def test_live_graph_drops_dead_ops_savers_and_iterators():
    kg = mg.KernelGraph("dead")
    X = kg.input("X", (4, 8)); W = kg.input("W", (8, 8))
    kg.add_op("scale", [X], {"c": Fraction(1, 2)})  # dead kernel op
    b = mg.BlockGraph((2, 1, 1), 1)
    x = b.input(X, (0, None, None))
    b.input(W, (None, None, None))  # dead iterator
    b.output(b.accum(mg.exp(x)), (0, None, None))  # dead saver
    b.output(b.accum(mg.square(x)), (0, None, None))
    _, s = kg.kernel(b)
    kg.output(s)
    h = live_graph(kg)
    assert [op.kind for op in h.ops] == ["input", "input", "graph_defined"]
    blk = h.ops[2].attrs["block"]
    assert [op.kind for op in blk.ops] == ["iterator", "square", "accum"] and len(blk.savers) == 1
    assert np.allclose(mg.evaluate(h, _ins(kg))[0], mg.evaluate(kg, _ins(kg))[0])
    assert live_graph(h) is h  # nothing dead: the graph itself
