"""Void draws (a divisor zero under the draw) counted against the bound instead of
conditioned on (docs/design.md §4.5): the rule, its arithmetic and its trials."""

import math

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks import prefill_attention
from verify.bound import counted_bound, tests_needed as n_tests, tests_needed_counting_voids as n_tests_counting
from verify.equivalence import DEFAULT_ERROR, _bound, make_plan, trial_rule
from verify.family import DEFAULT
from verify.field import MIRAGE


def test_the_counted_bound_pays_for_every_order_of_the_voids():
    eps = 0.25
    assert counted_bound(eps, 10, 0) == pytest.approx(2 * eps ** 10)
    assert counted_bound(eps, 10, 3) == pytest.approx(math.comb(13, 3) * eps ** 10 * 2 ** 4)
    assert counted_bound(1.0, 5, 0) == 1.0 and counted_bound(0.0, 5, 2) == 0.0
    needed = [n_tests_counting(eps, DEFAULT_ERROR, v) for v in range(6)]
    assert needed == sorted(needed) and needed[0] < needed[-1]
    for v, n in enumerate(needed):  # the fewest tests that reach the target after v voids
        assert counted_bound(eps, n, v) <= DEFAULT_ERROR < counted_bound(eps, n - 1, v)
    # the weights 2^-(v+1) keep the sum over every number of voids within the target
    assert sum(counted_bound(eps, n, v) * 2.0 ** -(v + 1) for v, n in enumerate(needed)) <= DEFAULT_ERROR
    assert n_tests_counting(1.0, DEFAULT_ERROR, 0) is None


def test_an_attention_over_8192_keys_is_provable_by_counting_its_voids():
    """Conditioning on no zero divisor among 8,192 row sums per head gives no bound; each
    row's own risk is small, and the counting rule needs no union over the rows."""
    p = prefill_attention(16, 8192, 8192, 128, safe=True)
    bd = _bound(p, p, make_plan(p, p, DEFAULT))
    assert bd.per_test == 1.0 and bd.unconditioned < 0.25
    rule = trial_rule(bd, DEFAULT_ERROR)
    assert rule.counts_voids and rule.per_test == bd.unconditioned
    assert rule.needed(0) <= 20 and rule.needed(1) > rule.needed(0)


def test_a_pair_without_division_keeps_the_conditioned_rule():
    p = mg.Program("mm")
    X, W = p.input("X", (4, 8), "float16"), p.input("W", (8, 8), "float16")
    p.output(X @ W)
    bd = _bound(p, p, make_plan(p, p, DEFAULT))
    assert bd.per_test == bd.unconditioned
    rule = trial_rule(bd, DEFAULT_ERROR)
    assert not rule.counts_voids and rule.needed(3) == n_tests(bd.per_test, DEFAULT_ERROR)


def _ratio(name: str, shift: bool = False) -> mg.Program:
    """``X / Y`` over 64 divisors: with Mirage's p = 167 a third of the draws meet a zero."""
    p = mg.Program(name)
    X, Y = p.input("X", (4, 64), "float16"), p.input("Y", (1, 64), "float16")
    p.output((X + 1 if shift else X) / Y)
    return p


def test_a_trial_that_meets_voids_runs_the_tests_they_cost():
    a, b = _ratio("a"), _ratio("b")
    seen = []
    for seed in range(6):
        v = verify.equivalent(a, b, seed=seed, field=MIRAGE, float_check=False)
        rule = trial_rule(_bound(a, b, make_plan(a, b, MIRAGE)), DEFAULT_ERROR)
        assert rule.counts_voids and v.voids_counted and v.equivalent and v.bound_met
        assert v.tests == rule.needed(v.failed_draws)
        assert v.error_bound == pytest.approx(counted_bound(rule.per_test, v.tests, v.failed_draws))
        assert v.error_bound <= DEFAULT_ERROR and "void draws counted" in str(v)
        seen.append(v.failed_draws)
    assert max(seen) > 0  # some trial met voids and paid for them


def test_a_near_miss_is_still_rejected_under_the_counting_rule():
    v = verify.equivalent(_ratio("a"), _ratio("b", shift=True), seed=0, field=MIRAGE, float_check=False)
    assert v.equivalent is False and v.voids_counted and v.counterexample is not None
