"""Constants cannot fool the verifier: the pairs a hostile user builds around fixed
primes (a multiple of p, an exponent constant ≡ 0 mod q, rationals sharing a prime,
a wrong part hidden next to a large one) are rejected with random primes, the
bound carries the term for constants, and equivalent rewrites with such constants
still pass."""

import math
from fractions import Fraction

import pytest
import torch

import mugraph as mg
import verify
from verify.equivalence import fingerprint_field
from verify.field import MIRAGE, Field
from verify.floatcheck import magnitudes

#: the primes that used to be fixed (the largest safe-prime pair below 2^31) and Mirage's
FORMER = Field(2147471759, 1073735879, "former")
FIXED_P = (FORMER.p, FORMER.q, MIRAGE.p, MIRAGE.q)


def pair(build_a, build_b, shapes=None):
    """Two programs over the same inputs (default one (4, 8) input ``x``)."""
    shapes = shapes or {"x": (4, 8)}
    out = []
    for name, build in (("ref", build_a), ("cand", build_b)):
        p = mg.Program(name)
        xs = [p.input(n, s) for n, s in shapes.items()]
        p.output(build(*xs))
        out.append(p)
    return out


def ident(x):
    return mg.scale(x, 1)


@pytest.mark.parametrize("P", FIXED_P + (None,))
def test_multiple_of_a_prime_is_rejected(P):
    """X·(P+1) vs X for the primes that used to be fixed (and the search's
    fingerprint pair): rejected on the first test."""
    P = P or fingerprint_field(0).p
    a, b = pair(lambda x: mg.scale(x, P + 1), ident)
    v = verify.equivalent(a, b, seed=0)
    assert v.equivalent is False and v.checks == {"field tests": "failed"} and not v.ok
    assert v.counterexample.p is not None and v.counterexample.p != P


def test_the_same_pair_fools_the_fixed_primes_and_the_verdict_says_so():
    a, b = pair(lambda x: mg.scale(x, FORMER.p + 1), ident)
    assert verify.field_test(a, b, rng=__import__("numpy").random.default_rng(0), fld=FORMER)[0] is None
    v = verify.equivalent(a, b, seed=0, field=FORMER, float_check=False)
    # every test passes — but the bound knows a 31-bit coefficient may be a multiple of p
    assert v.equivalent is True and not v.bound_met and v.per_test_bound == 1.0 and not v.ok
    assert v.checks["error bound"] == "not met" and "fixed primes" in str(v)


@pytest.mark.parametrize("Q", [FORMER.q, MIRAGE.q, None])
def test_exponent_constant_multiple_of_q_is_rejected(Q):
    Q = Q or fingerprint_field(0).q
    a, b = pair(lambda x: mg.exp(mg.scale(x, Q + 1)), lambda x: mg.exp(x))
    assert verify.equivalent(a, b, seed=1, float_check=False).equivalent is False
    # c + Q/2^k: finite in float64, ≡ c mod Q
    k = Q.bit_length() - 1
    a, b = pair(lambda x: mg.exp(mg.scale(x, Fraction(1, 2) + Fraction(Q, 2 ** k))),
                lambda x: mg.exp(mg.scale(x, Fraction(1, 2))))
    assert verify.equivalent(a, b, seed=2, float_check=False).equivalent is False


@pytest.mark.parametrize("P", FIXED_P)
def test_rationals_sharing_a_prime_are_rejected(P):
    k = P.bit_length() - 1
    for c in (1 + Fraction(P, 2 ** k), Fraction(P, 2 ** 20), 1 + Fraction(2 ** k, P), Fraction(3, P)):
        a, b = pair(lambda x, c=c: mg.scale(x, c), ident)
        v = verify.equivalent(a, b, seed=3, float_check=False)
        assert v.equivalent is False, c


def test_a_denominator_equal_to_a_fixed_prime_is_undecided_not_a_crash():
    a, b = pair(lambda x: mg.scale(mg.scale(x, Fraction(1, 167)), 167), ident)
    v = verify.equivalent(a, b, seed=0, field=MIRAGE)
    assert v.equivalent is None and v.checks["field tests"] == "undecided" and not v.ok
    assert "UNDECIDED" in str(v) and "167" in str(v)


@pytest.mark.parametrize("P", FIXED_P)
def test_x_over_p_times_p_is_equivalent(P):
    a, b = pair(lambda x: mg.scale(mg.scale(x, Fraction(1, P)), P), ident)
    v = verify.equivalent(a, b, seed=P % 97)
    assert v.equivalent is True and v.ok and v.bound_met
    assert v.constant_bits >= P.bit_length() - 1


def test_constants_term_in_the_bound_and_the_verdict():
    """A 31-bit coefficient may be divisible by one member: the per-test bound holds
    that term (⌊31/log2 p_min⌋ / pairs), and the verdict prints it."""
    fam = verify.DEFAULT
    P = FORMER.p
    a, b = pair(lambda x: mg.scale(mg.scale(x, Fraction(1, P)), P), ident)
    v = verify.equivalent(a, b, seed=5, float_check=False)
    assert v.constant_term > 0 and v.per_test_bound >= v.constant_term
    assert v.pairs <= fam.size and v.pairs >= fam.size - 8  # P and 1/P exclude at most a few pairs
    assert v.constant_term == pytest.approx(1 / v.pairs)
    assert "constants:" in str(v) and "per test" in str(v)
    # small constants: no member can divide a coefficient, so the term is exactly 0
    a, b = pair(lambda x: mg.scale(x, Fraction(3, 7)), lambda x: mg.scale(mg.scale(x, 3), Fraction(1, 7)))
    v = verify.equivalent(a, b, seed=5, float_check=False)
    assert v.equivalent and v.constant_term == 0.0 and v.constant_bits < 29


def test_redraw_never_uses_a_prime_dividing_a_constant():
    """Force the draw to meet the constant: avoid the very pair the seed draws first."""
    import numpy as np
    first = verify.DEFAULT.draw(np.random.default_rng(11))
    again = verify.DEFAULT.draw(np.random.default_rng(11), avoid=[first.p * 3, first.q * 5])
    assert (again.p, again.q) != (first.p, first.q)
    assert (first.p * 3) % again.p and (first.p * 3) % again.q and (first.q * 5) % again.q


def _concat_trick(P):
    shapes = {"x": (4, 8), "y": (4, 8), "z": (4, 8)}
    return pair(lambda x, y, z: mg.concat([mg.scale(x, 2 ** 40), y], 0),
                lambda x, y, z: mg.concat([mg.scale(x, 2 ** 40), y + mg.scale(z, Fraction(P, 2 ** 20))], 0), shapes)


@pytest.mark.parametrize("P", [FORMER.p, FORMER.q, None])
def test_wrong_part_hidden_next_to_a_large_one(P):
    """concat([X·2^40, Y]) vs concat([X·2^40, Y + Z·P/2^20]): the field rejects it,
    and the float check alone fails it too (per element), although a norm-wise
    relative error over the whole output is far below every tolerance."""
    a, b = _concat_trick(P or fingerprint_field(0).p)
    assert verify.equivalent(a, b, seed=0, float_check=False).equivalent is False
    r = verify.float_check(a, b)
    judged = [c for c in r.cases if c.passed is not None]
    assert not r.passed and len(judged) >= 6  # fp16 cannot hold 2^40: skipped, said so
    assert all(c.passed is False and c.output == 0 and c.index[0] >= 4 for c in judged)  # the small half
    assert all("overflows" in c.note for c in r.cases if c.passed is None)
    ins = {n: torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
           for i, n in enumerate("xyz")}
    (ra,), (rb,) = mg.evaluate(a, ins), mg.evaluate(b, ins)
    assert float((ra - rb).norm() / ra.norm()) < 1e-4  # what a norm-wise check would have seen


def test_outputs_are_checked_separately():
    """A second output that is wrong cannot hide behind a large first output."""
    def build(bad):
        p = mg.Program("two")
        x, y = p.input("x", (4, 8)), p.input("y", (4, 8))
        p.output(mg.scale(x, 2 ** 40))
        p.output(mg.scale(y, 3) if bad else mg.scale(y, 2))
        return p
    r = verify.float_check(build(False), build(True))
    assert not r.passed and all(c.passed is False and c.output == 1 for c in r.cases)  # fp16 too: output 1 fits
    assert all(c.errors[0] < 1e-2 for c in r.cases if c.dtype != "float16")  # fp16: output 0 overflows, skipped
    assert all("output 0" in c.note for c in r.cases if c.dtype == "float16")  # 2^40 overflows fp16: named


def test_magnitudes_bound_the_values_and_see_cancellation():
    p = mg.Program("m")
    x, y = p.input("x", (3, 4)), p.input("y", (4, 2))
    p.output((x @ y) - (x @ y))
    p.output(mg.exp(x) / (mg.square(x) + 1))
    ins = {"x": torch.randn(3, 4, dtype=torch.float64), "y": torch.randn(4, 2, dtype=torch.float64)}
    (v0, m0), (v1, m1) = magnitudes(p, ins)
    assert (v0 == 0).all() and (m0 > 0).all()  # cancelled, but the terms had a size
    assert (m1 >= v1.abs()).all()


def _softmax_of(scale):
    def build(q, k):
        e = mg.exp(mg.scale(q @ k, scale))
        return e / mg.sum(e, 1)
    return build


ATTN_SHAPES = {"q": (4, 128), "k": (128, 4096)}


def test_a_constant_shared_by_every_exponent_does_not_count_against_collisions():
    """exp(c·q@k) with c = 1/√128 as a float (a 56-bit dyadic fraction): every exponent
    carries c, whose prime factors a random pair avoids, so only the structural part of
    the collision polynomials (7 bits) can vanish mod q. Counting c's height, 2·4096
    terms gave 0.29 per test (and an attention's 2·4096² terms, 1); with fixed primes,
    which may divide c, there is no such credit."""
    c = Fraction(1 / math.sqrt(128))
    assert c.denominator.bit_length() > 50
    a, b = pair(_softmax_of(c), _softmax_of(c), ATTN_SHAPES)
    eps, heuristic = verify.per_test_bound(a, b)
    assert eps < 1e-3 and not heuristic
    assert verify.per_test_bound(a, b, FORMER)[0] == 1.0  # a 226-bit collision height, one fixed pair
    # the same pair with an exact small scale gets about the same bound
    a8, b8 = pair(_softmax_of(Fraction(1, 8)), _softmax_of(Fraction(1, 8)), ATTN_SHAPES)
    assert verify.per_test_bound(a8, b8)[0] == pytest.approx(eps, rel=0.05)


def test_different_constants_in_the_exponents_get_no_such_credit_and_are_rejected():
    """A candidate whose scale differs (1/√127 for 1/√128): the exponents share only the
    two constants' rational gcd, and the rest of each (~56 bits) counts against the
    collisions — a bound far weaker than the shared one — and the field tests reject the
    pair anyway."""
    c, d = Fraction(1 / math.sqrt(128)), Fraction(1 / math.sqrt(127))
    shared = verify.per_test_bound(*pair(_softmax_of(c), _softmax_of(c), ATTN_SHAPES))[0]
    mixed = verify.per_test_bound(*pair(_softmax_of(c), _softmax_of(d), ATTN_SHAPES))[0]
    assert mixed > 1000 * shared
    small = {"q": (2, 8), "k": (8, 16)}
    a, b = pair(_softmax_of(c), _softmax_of(d), small)
    v = verify.equivalent(a, b, seed=3, max_tests=4, float_check=False)
    assert v.equivalent is False


def test_shared_exponent_constant_is_tracked_through_the_ops():
    from verify.bound import ONE, ExpPoly

    k = Fraction(3, 1 << 40)
    e1 = ExpPoly(0, 1.0, 1, 0, True, 0.0, 45.0, 40.0, k, 5.0, 0.0)
    e2 = ExpPoly(0, 1.0, 1, 0, True, 0.0, 45.0, 40.0, k, 3.0, 0.0)
    other = ExpPoly(0, 1.0, 1, 0, True, 0.0, 45.0, 40.0, Fraction(5, 1 << 40), 3.0, 0.0)
    assert (e1 * e2).kappa == k and (e1 + e2).kappa == k and (e1 * ONE).kappa == k
    assert e1.power(4).kappa == k and e1.times(7).kappa == k and e1.scaled(9.0).kappa == k
    # different factors share their rational gcd, 1/2^40; the multiples 3 and 5 join P's height
    g = Fraction(1, 1 << 40)
    assert (e1 * other).kappa == g and (e1 + other).kappa == g
    assert (e1 + other).sg == pytest.approx(max(5.0 + math.log2(3), 3.0 + math.log2(5)))
    assert (e1 * other).sg == pytest.approx(math.log2(2 ** (5.0 + math.log2(3)) + 2 ** (3.0 + math.log2(5))))
    unknown = ExpPoly(0, 1.0, 1, 0, True, 0.0, 45.0, 40.0, None, 3.0, 0.0)
    assert (e1 * unknown).kappa is None and (e1 + unknown).kappa is None
    assert (e1 * e2).sg == pytest.approx(max(5.0, 3.0) + 0.0 + 1.0, abs=1.0)


def _normed_attention(pre: Fraction, scale: Fraction):
    """softmax(scale · q̂ @ k̂) with q̂ = q'/√mean(q'²), q' = pre·q (k̂ likewise, over its
    rows): ``pre`` cancels in the norm, so every ``pre`` gives the same function — but
    ``sqrt`` is summarized as a fresh variable, so the exponents' constant factor carries
    ``pre²`` in the summary (qknorm attention as the search rewrites it)."""
    def build(q, k):
        qs, ks = mg.scale(q, pre), mg.scale(k, pre)
        qn = qs / mg.sqrt(mg.scale(mg.sum(mg.square(qs), 1), Fraction(1, q.shape[1])))
        kn = ks / mg.sqrt(mg.scale(mg.sum(mg.square(ks), 0), Fraction(1, k.shape[0])))
        e = mg.exp(mg.scale(qn @ kn, scale))
        return e / mg.sum(e, 1)
    return build


def test_exponent_constants_that_differ_by_a_factor_share_the_rest():
    """A search's qknorm attention that scales q and k by 1/64 before their norms: the
    exponents carry c = 1/√128 (a 56-bit dyadic float) in the program and c/4096 in the
    candidate's summary. They share c/4096; the program's multiple, 4096, adds 12 bits to
    the collision polynomials — where counting both constants' whole height against every
    one of the 2·4096² collisions gave 1 per test (no proof at any number of tests)."""
    c = Fraction(1 / math.sqrt(128))
    a, b = pair(_normed_attention(Fraction(1), c), _normed_attention(Fraction(1, 64), c), ATTN_SHAPES)
    eps, heuristic = verify.per_test_bound(a, b)
    same = verify.per_test_bound(*pair(_normed_attention(Fraction(1), c), _normed_attention(Fraction(1), c),
                                       ATTN_SHAPES))[0]
    assert heuristic and eps < 0.51 and eps == pytest.approx(same, rel=1e-6)  # sqrt: a coin flip per test
    exact = pair(_normed_attention(Fraction(1), Fraction(1, 8)), _normed_attention(Fraction(1, 64), Fraction(1, 8)),
                 ATTN_SHAPES)
    assert verify.per_test_bound(*exact)[0] < 1e-3  # (1.0 before: the program's 1/8 against the candidate's 1/32768)
    small = {"q": (2, 8), "k": (8, 16)}
    v = verify.equivalent(*pair(_normed_attention(Fraction(1), c), _normed_attention(Fraction(1, 64), c), small),
                          seed=3, float_check=False)
    assert v.equivalent is True


def test_normed_attention_with_another_scale_is_still_rejected():
    """The near miss: the candidate's scale 1/√127 for 1/√128, with the operands prescaled."""
    small = {"q": (2, 8), "k": (8, 16)}
    a, b = pair(_normed_attention(Fraction(1), Fraction(1 / math.sqrt(128))),
                _normed_attention(Fraction(1, 64), Fraction(1 / math.sqrt(127))), small)
    v = verify.equivalent(a, b, seed=3, max_tests=4, float_check=False)
    assert v.equivalent is False


