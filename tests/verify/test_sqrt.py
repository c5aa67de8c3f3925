"""sqrt: positive scaling accepted, sign flips rejected, what the field cannot decide
reported as undecided (after the float64 fallback), never a crash."""

from fractions import Fraction

import numpy as np
import pytest

import mugraph as mg
import verify
from verify.equivalence import BASE_SQUARES, fingerprint_field, make_plan
from verify.field import MIRAGE


def pair(build_a, build_b, shape=(4, 8)):
    out = []
    for name, build in (("ref", build_a), ("cand", build_b)):
        p = mg.Program(name)
        p.output(build(p.input("x", shape)))
        out.append(p)
    return out


@pytest.mark.parametrize("c", [11, 13, Fraction(13, 7), Fraction(1, 3), 4096, 1021])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_positive_scaling_under_rms_norm_is_accepted(c, seed):
    """rms_norm(c·X) = rms_norm(X) for c > 0 (the field's sqrt(121) used to be −11)."""
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, c)), lambda x: mg.rms_norm(x))
    v = verify.equivalent(a, b, seed=seed)
    assert v.equivalent is True and v.ok and v.heuristic, str(v)


@pytest.mark.parametrize("c", [-11, -1, Fraction(-13, 7), -4096])
def test_sign_flip_under_sqrt_is_rejected(c):
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, c)), lambda x: mg.rms_norm(x))
    v = verify.equivalent(a, b, seed=0)
    assert v.equivalent is False and v.checks == {"field tests": "failed", "sqrt fallback (float64)": "differs"}
    assert "float64 confirms" in str(v)


def test_negated_root_is_rejected_and_squares_inside_are_accepted():
    a, b = pair(lambda x: mg.div(x, mg.sqrt(mg.mean(mg.square(x), 1))),
                lambda x: mg.div(x, mg.scale(mg.sqrt(mg.mean(mg.square(x), 1)), -1)))
    assert verify.equivalent(a, b, seed=3).equivalent is False
    # (−3x)² under the root: the same function
    a, b = pair(lambda x: mg.sqrt(mg.mean(mg.square(mg.scale(x, -3)), 1)),
                lambda x: mg.scale(mg.sqrt(mg.mean(mg.square(x), 1)), 3))
    assert verify.equivalent(a, b, seed=3).ok


def test_an_identity_the_field_cannot_decide_is_undecided():
    """sqrt(m)·sqrt(m) = m needs m > 0 — true in reals (m = mean(x²) + 1), but the
    field's sqrt(m)² is ±m: the mismatch is not taken as proof; float64 agrees, and the
    verdict says UNDECIDED, naming the fallback."""
    def m(x):
        return mg.add(mg.mean(mg.square(x), 1), 1)
    a, b = pair(lambda x: mg.mul(mg.sqrt(m(x)), mg.sqrt(m(x))), m)
    v = verify.equivalent(a, b, seed=0)
    assert v.equivalent is None and not v.ok
    assert v.checks["field tests"] == "undecided" and v.checks["sqrt fallback (float64)"] == "agrees"
    assert "UNDECIDED" in str(v) and "not a proof" in str(v)


def test_sqrt_conditions_follow_the_constants():
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, Fraction(13, 7))), lambda x: mg.rms_norm(x), shape=(4, 6))
    plan = make_plan(a, b, verify.DEFAULT)
    assert set(BASE_SQUARES) | {13} <= set(plan.squares) and 7 in plan.squares and not plan.unconditioned
    rng = np.random.default_rng(4)
    for _ in range(20):
        f = verify.DEFAULT.draw(rng, avoid=plan.avoid, squares=plan.squares)
        for ell in plan.squares:
            assert pow(ell, (f.p - 1) // 2, f.p) == 1 and pow(ell, (f.q - 1) // 2, f.q) == 1
    # a prime factor too large to condition on: said so, and the bound pays for it
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, 1031 * 1033)), lambda x: mg.rms_norm(x))
    plan = make_plan(a, b, verify.DEFAULT)
    assert plan.unconditioned == [1031 * 1033]
    # more primes beyond the wheel than the draw conditions on: the largest are left out
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, 17 * 19 * 23 * 29)), lambda x: mg.rms_norm(x))
    plan = make_plan(a, b, verify.DEFAULT)
    assert {17, 19, 23} <= set(plan.squares) and plan.unconditioned == [29]
    eps, heuristic = verify.per_test_bound(a, b)
    assert heuristic and eps >= 0.5


def test_fingerprint_primes_make_small_constants_squares():
    f = fingerprint_field(0)
    for ell in BASE_SQUARES:
        assert pow(ell, (f.p - 1) // 2, f.p) == 1 and pow(ell, (f.q - 1) // 2, f.q) == 1
    assert fingerprint_field(0) == fingerprint_field(0) and fingerprint_field(1) != fingerprint_field(0)


def test_mirage_primes_with_a_non_square_constant():
    """Under fixed primes the signs of constants cannot be chosen: 13 is not a square
    mod 167, so rms_norm(13·X) vs rms_norm(X) mismatches in the field — the fallback
    makes it undecided, never a false rejection."""
    assert pow(13, 83, 167) != 1
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, 13)), lambda x: mg.rms_norm(x))
    v = verify.equivalent(a, b, seed=0, field=MIRAGE)
    assert v.equivalent is None and "13" in str(v)


def test_fixed_primes_give_no_bound_for_an_uncontrolled_sign():
    """Under the former fixed pair 11 is not a square: rms_norm(−11·X) and rms_norm(X)
    agree on every test (the sign flip is invisible), so the verdict must not claim a
    bound — only the float check can catch it."""
    former = verify.Field(2147471759, 1073735879)
    assert pow(11, (former.p - 1) // 2, former.p) != 1
    a, b = pair(lambda x: mg.rms_norm(mg.scale(x, -11)), lambda x: mg.rms_norm(x))
    v = verify.equivalent(a, b, seed=0, field=former, float_check=False)
    assert v.equivalent is True and v.per_test_bound == 1.0 and not v.bound_met and not v.ok
    assert verify.equivalent(a, b, seed=0).equivalent is False  # random primes: rejected
