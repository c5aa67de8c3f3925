"""Programs whose output is a concatenation (or an expression E cannot describe): the
oracle builds its e-graph from the concatenation's parts, or stops pruning, and the
search runs — a piece ending in a ``concat`` once crashed it (``cat/top terms are not
e-graph terms``)."""

import mugraph as mg
import search
import search.expr as ex
from search.config import SearchConfig
from search.oracle import SubexprOracle


def _concat_program(reshape: bool = False):
    p = mg.Program("catp")
    x, w1, w2 = p.input("X", (4, 8)), p.input("W1", (8, 4)), p.input("W2", (8, 4))
    y = mg.concat([mg.exp(x @ w1), x @ w2], 1)
    p.output(mg.reshape(y, (32,)) if reshape else y)
    return p


def test_oracle_of_a_concatenated_output_prunes_against_its_parts():
    p = _concat_program()
    (target,) = ex.output_exprs(p)
    assert ex.node(target)[0] == ex.CAT
    o = SubexprOracle([target], time_limit=20)
    x, w1, w2 = ex.var("X"), ex.var("W1"), ex.var("W2")
    xw1 = ex.reduce("sum", 8, ex.mul(x, w1))
    assert o.is_sub(xw1) and o.is_sub(ex.unary("exp", xw1))
    assert o.saturated and not o.is_sub(ex.unary("exp", ex.reduce("sum", 8, ex.mul(x, w2))))
    assert o.equivalent(xw1, 0) is None   # no single e-class to compare a part with


def test_oracle_of_an_unknown_output_never_prunes():
    (target,) = ex.output_exprs(_concat_program(reshape=True))
    assert target == ex.TOP
    o = SubexprOracle([target], time_limit=20)
    assert o.opaque and o.is_sub(ex.unary("exp", ex.var("W2")))


def test_search_of_a_program_ending_in_a_concat_runs():
    for reshape in (False, True):
        r = search.run(_concat_program(reshape), SearchConfig(time_limit=3, executor="serial", max_kernel_ops=1,
                                                                progress=False))
        assert r.stats is not None
