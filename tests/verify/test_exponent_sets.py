"""Exponent sets in the bound (verify.exponent_sets.Support): an attention's numerator and
denominator draw their exponents from one set per row, which halves the term count of
the compared function — and nothing else gets that credit."""

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks import program, reference
from verify import bound
from verify.exponent_sets import FREE, Support
from verify.equivalence import make_plan, summarize
from verify.family import DEFAULT


def _outs(g, plan):
    return summarize(g, plan.primes, "x")[0]


def _terms(a, b):
    """The compared function's term count, and what the product of the summaries gives."""
    plan = make_plan(a, b, DEFAULT)
    (oa,), (ob,) = _outs(a, plan), _outs(b, plan)
    plain = oa.num * ob.den_poly() + ob.num * oa.den_poly()
    return bound.compared(oa, ob).k, plain.k


def _attention(norm):
    p = mg.Program("attn")
    q, k, v = p.input("q", (4, 8)), p.input("k", (8, 32)), p.input("v", (32, 8))
    p.output(norm(q, k, v))
    return p


def softmax_v(q, k, v):
    e = mg.exp(mg.scale(q @ k, 0.125))
    return (e @ v) / mg.sum(e, 1)


def test_an_attention_compared_with_itself_counts_each_exponent_pair_once():
    a, b = _attention(softmax_v), _attention(softmax_v)
    k, plain = _terms(a, b)
    assert plain == 2 * 32 * 32 and k == 32 * 32


def test_split_kv_reference_keeps_the_credit_through_its_kernels():
    """gqa's hand-written split-KV μGraph: exps in blocks of a grid and a loop, partial
    sums saved, a second kernel summing the splits — the numerator's and denominator's
    sets are still the same 4096 keys per row, and the bound halves."""
    for b in (1, 8):
        p, g = program("gqa", b=b), reference("gqa", b=b)
        k, plain = _terms(p, g)
        assert k == plain / 2
        eps = verify.per_test_bound(p, g)[0]
        assert 0.04 < eps < 0.07  # was 0.11-0.12 per test: 10 tests for 2^-40 instead of 14


def _no_credit(build):
    k, plain = _terms(_attention(softmax_v), _attention(build))
    assert k == plain


def test_two_exp_ops_of_one_expression_get_no_credit():
    def two_exps(q, k, v):
        s = mg.scale(q @ k, 0.125)
        return (mg.exp(s) @ v) / mg.sum(mg.exp(s), 1)
    _no_credit(two_exps)


def test_a_denominator_over_other_keys_gets_no_credit():
    def fewer_keys(q, k, v):
        e = mg.exp(mg.scale(q @ k, 0.125))
        head = mg.slice(e, 1, 0, 16)
        return (e @ v) / mg.sum(head, 1)
    _no_credit(fewer_keys)


def test_a_squared_numerator_gets_no_credit():
    def squared(q, k, v):
        e = mg.exp(mg.scale(q @ k, 0.125))
        return ((e * e) @ v) / mg.sum(e, 1)
    _no_credit(squared)


def test_an_exp_free_term_in_the_numerator_gets_no_credit():
    def plus_v(q, k, v):
        e = mg.exp(mg.scale(q @ k, 0.125))
        return (e @ v + mg.sum(v, 0)) / mg.sum(e, 1)
    _no_credit(plus_v)


def test_near_misses_with_the_credited_shape_are_still_rejected():
    """Mutants whose summaries look like an attention's (one exp set over num and den)
    but which compute something else are rejected by the tests themselves."""
    def wrong_scale(q, k, v):
        e = mg.exp(mg.scale(q @ k, 0.25))
        return (e @ v) / mg.sum(e, 1)

    def other_rows(q, k, v):  # normalized by the sum over the queries, not the keys
        e = mg.exp(mg.scale(q @ k, 0.125))
        return (e @ v) / mg.sum(mg.sum(e, 1), 0)

    for build in (wrong_scale, other_rows):
        v = verify.equivalent(_attention(softmax_v), _attention(build), seed=1, float_check=False)
        assert v.equivalent is False


def test_support_moves():
    s = Support.source(1, (64,))
    # split-KV: summing a (blocks, inner) split of the keys, in either order, is summing them all
    whole = s.reduce(0)
    split = s.reshape((64,), (4, 16))
    assert split.dims == (((0, 4, 16),), ((0, 16, 1),))
    for summed in (split.reduce(1).reduce(0), split.reduce(0).reduce(1)):
        assert summed.reduced == whole.reduced == ((0, 64, 1),) and summed.size == 64
    # a dim split and merged back is the same support
    t = Support.source(2, (8, 12))
    assert t.reshape((8, 12), (2, 4, 3, 4)).reshape((2, 4, 3, 4), (8, 12)) == t
    assert t.permute((1, 0)).permute((1, 0)) == t
    # a reshape that cuts a component unevenly forgets the support
    assert Support.source(3, (6, 5)).reshape((6, 5), (5, 6)) is None
    # broadcast components do not change the set; summing over them adds nothing
    b = t.broadcast((8, 12), (3, 8, 12))
    assert b.dims[0] == ((FREE, 3, 0),) and b.reduce(0).size == 1
    assert b.reduce(0).dims[1:] == t.dims
    # partial sums: the inner part of a split only
    part = t.reshape((8, 12), (8, 3, 4)).reduce(2)
    assert part.size == 4 and part != t.reduce(1)


def test_supports_through_exp_poly_rules():
    from verify.bound import ExpPoly
    s, o = Support.source(1, (4,)), Support.source(2, (4,))
    e, f, c = ExpPoly(x=True, k=1.0, support=s), ExpPoly(x=True, k=1.0, support=o), ExpPoly(d=2)
    assert (e * c).support == s and (c * e).support == s and e.scaled(3.0).support == s
    assert (e + e).support == s and e.times(5).support == s and e.power(1).support == s
    assert e.power(2).support is None
    assert (e + f).support is None and (e + c).support is None
    # a single-term factor shifts a set, keeping its size: one set per factor
    assert (e * f).support == s.shifted(o) and (e * f).support not in (s, o, s.shifted(s))
    assert (e * f).support.size == s.size and (e * e).support == s.shifted(s)
    many = ExpPoly(x=True, k=3.0, support=s)
    assert (many * f).support == (f * many).support == s.shifted(o)  # the many-term side is the source
    assert (many * many).support is None


def test_a_shift_that_varies_where_the_set_is_free_forgets_it():
    """``x`` broadcast along rows (one set for every row) times a factor that varies by row:
    a sum over the rows would meet a new exponent per row, more than the set's size."""
    row_free = Support.source(1, (4,)).broadcast((4,), (3, 4))
    by_row = Support.source(2, (3, 1)).broadcast((3, 1), (3, 4))
    by_col = Support.source(2, (4,)).broadcast((4,), (3, 4))
    assert row_free.shifted(by_row) is None
    assert row_free.shifted(by_col) is not None and row_free.shifted(by_col).size == row_free.size


@pytest.mark.parametrize("name", ["qknorm_gqa"])
def test_other_references_keep_their_credit(name):
    p, g = program(name, b=1), reference(name, b=1)
    k, plain = _terms(p, g)
    assert k == plain / 2


def _prompt_attention(rows: int, keys: int, d: int):
    """One head's attention, the program: more query rows than its head dim, so the classic
    argument (exponent collisions) bounds it, not the exponent atoms."""
    import math
    p = mg.Program("prompt")
    q, kt, v = p.input("q", (rows, d), "float16"), p.input("kt", (d, keys), "float16"), p.input("v", (keys, d), "float16")
    s = mg.scale(q @ kt, 1 / math.sqrt(d))
    e = mg.exp(s - mg.max(s, 1))
    p.output((e @ v) / mg.sum(e, 1))
    return p


@pytest.mark.parametrize("keys", [512, 4096])
def test_an_online_attention_keeps_one_exponent_set_per_row(keys):
    """The online form's numerator and denominator are sums of per-step partial sums, each
    times the step's rescale ``exp(m_i − M)``: one shifted set per row for both, so its
    compared function has the program's term count and its bound is the program's (it
    had twice the terms: at 8,192 keys 34 tests where the program needs 19)."""
    from online_graphs import attention_ugraph
    from verify.equivalence import _bound
    p = _prompt_attention(512, keys, 16)
    g = attention_ugraph(8, 64, keys, 16, keys // 64, "float16")
    mine, own = _bound(p, g, make_plan(p, g, DEFAULT)), _bound(p, p, make_plan(p, p, DEFAULT))
    assert mine.argument == own.argument == "Li–Wu conjecture"
    assert mine.unconditioned == pytest.approx(own.unconditioned, rel=1e-6)
    k, plain = _terms(p, g)
    assert k == keys * keys and plain == 2 * keys * keys
