"""The prime family: its size (recounted), the draw (members only, uniform over the
wheel's classes, reproducible, conditions met), and the hand-written field arithmetic
cross-checked with galois on drawn pairs."""

import collections
import math

import galois
import numpy as np
import pytest

import mugraph as mg
import verify
from verify.family import DEFAULT, FAMILY_SIZE, Q_HI, Q_LO, WHEEL, PrimeFamily, _wheel, count_pairs
from verify.field import (MAX_MODULUS, Field, FieldAlgebra, FieldError, PowTable, inverse, is_prime, matmul_mod,
                          pow_fixed, random_omega, uniform_residues)


def test_family_size_is_the_sieve_count():
    assert count_pairs(Q_LO, Q_HI) == FAMILY_SIZE == DEFAULT.size


def test_sieve_count_matches_miller_rabin_on_a_window():
    lo, hi = Q_LO + 123_456, Q_LO + 123_456 + 60_000
    brute = sum(1 for q in range(lo, hi) if q % 4 == 3 and is_prime(q) and is_prime(2 * q + 1))
    assert count_pairs(lo, hi) == brute > 0


def test_is_prime_agrees_with_galois():
    rng = np.random.default_rng(0)
    for n in rng.integers(Q_LO, 2 ** 31, 300).tolist() + [61, 2 ** 31 - 1, 4_759_123_141, 3215031751]:
        assert is_prime(n) == galois.is_prime(n), n


def test_draws_are_members_and_reproducible():
    rng = np.random.default_rng(1)
    drawn = [DEFAULT.draw(rng) for _ in range(300)]
    for f in drawn:
        assert Q_LO <= f.q < Q_HI and f.p == 2 * f.q + 1 and f.q % 4 == 3 and f.p < MAX_MODULUS
        assert galois.is_prime(f.p) and galois.is_prime(f.q)
    # 300 of 199,645: 300²/(2·199,645) ≈ 0.23 repeats expected (birthday); 4 would be suspicious
    assert len(drawn) - len({f.q for f in drawn}) <= 3
    again = [DEFAULT.draw(np.random.default_rng(1)) for _ in range(1)]
    assert again[0] == drawn[0]


def test_draws_spread_over_the_range_and_classes():
    """Uniform over members: halves of the range and q mod 8 (3 or 7) come up about
    equally often (the family splits 100,025 / 99,620 by q mod 8)."""
    rng = np.random.default_rng(2)
    qs = np.array([DEFAULT.draw(rng).q for _ in range(800)])
    mid = (Q_LO + Q_HI) // 2
    assert abs(int((qs < mid).sum()) - 400) < 4 * 14  # 4 standard deviations
    assert abs(int((qs % 8 == 3).sum()) - 400) < 4 * 14


def test_wheel_keeps_every_member_class():
    """No member's residue mod WHEEL is missing from the wheel (else the draw could
    never pick it): every member in a window lies in an admissible class."""
    res = set(_wheel(frozenset()).tolist())
    members = [q for q in range(Q_LO, Q_LO + 200_000) if q % 4 == 3 and is_prime(q) and is_prime(2 * q + 1)]
    assert members and all(q % WHEEL in res for q in members)
    sq = set(_wheel(frozenset({2, 3, 5})).tolist())
    for q in members:
        p = 2 * q + 1
        good = all(pow(s, (m - 1) // 2, m) == 1 for s in (2, 3, 5) for m in (p, q))
        assert (q % WHEEL in sq) == good


def test_square_conditions_beyond_the_wheel():
    rng = np.random.default_rng(5)
    for _ in range(10):
        f = DEFAULT.draw(rng, squares=(2, 3, 17, 1021))
        for s in (2, 3, 17, 1021):
            assert pow(s, (f.p - 1) // 2, f.p) == 1 and pow(s, (f.q - 1) // 2, f.q) == 1
    assert 0.01 < DEFAULT.square_fraction((2, 3, 17)) < 0.05


def test_conditions_no_member_meets_are_an_error_not_a_hang():
    fam = PrimeFamily(17, 24, 1)  # q in [17, 24): q = 23 (p = 47) is the only member
    f = fam.draw(np.random.default_rng(0))
    assert (f.p, f.q) == (47, 23)
    with pytest.raises(FieldError, match="no prime pair"):
        fam.draw(np.random.default_rng(0), avoid=[47])
    with pytest.raises(FieldError, match="too many square conditions"):
        DEFAULT.draw(np.random.default_rng(0), squares=(17, 19, 23, 29))


@pytest.mark.parametrize("args", [(0, 10, 1), (30, 30, 1), (17, 2 ** 30 + 1, 1), (17, 20, 0), ("17", 20, 1),
                                  (17.0, 20, 1), (True, 20, 1), (7, 20, 1)])
def test_family_arguments_are_checked(args):
    with pytest.raises(FieldError) as e:
        PrimeFamily(*args)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- galois cross-checks


def _gf(f: Field):
    """galois' GF(p) for a drawn p (the primitive root is passed: p − 1 = 2q is known)."""
    g = next(a for a in range(2, 100) if pow(a, 2, f.p) != 1 and pow(a, f.q, f.p) != 1)
    assert galois.is_primitive_root(g, f.p)
    return galois.GF(f.p, primitive_element=g, verify=False), g


@pytest.fixture(scope="module")
def drawn():
    rng = np.random.default_rng(7)
    f = DEFAULT.draw(rng)
    GF, g = _gf(f)
    return f, GF, g, rng


def test_matmul_inverse_and_powers_agree_with_galois(drawn):
    f, GF, g, rng = drawn
    for K in (1, 64, 700, 4100):
        a = uniform_residues(rng, f.p, (3, K))
        b = uniform_residues(rng, f.p, (K, 5))
        assert (matmul_mod(a, b, f.p) == np.asarray(GF(a) @ GF(b), dtype=np.int64)).all()
    x = uniform_residues(rng, f.p, (500,))
    x[x == 0] = 1
    assert (inverse(x, f.p) == np.asarray(GF(x) ** -1, dtype=np.int64)).all()
    assert (pow_fixed(x, 12345, f.p) == np.asarray(GF(x) ** 12345, dtype=np.int64)).all()


def test_sqrt_map_agrees_with_galois(drawn):
    """x^((p+1)/4) is a square root of every square (the one that is itself a square),
    and of −x for a non-square — the sign the verifier's sqrt semantics rests on."""
    f, GF, g, rng = drawn
    alg = FieldAlgebra(f, random_omega(f, rng))
    x = uniform_residues(rng, f.p, (400,))
    x[x == 0] = 1
    r = alg.apply("sqrt", [(x, x % f.q)], {})[0]
    gx, gr = GF(x), GF(r)
    sq = gx.is_square()
    assert (gr ** 2 == np.where(sq, gx, -gx)).all()
    assert gr.is_square().all()  # the principal root: itself a square ("positive")
    assert not GF(f.p - 1).is_square()  # −1 is not: χ(−1) = −1, like a negative real


def test_omega_and_exp_tables_agree_with_galois(drawn):
    f, GF, g, rng = drawn
    w = random_omega(f, rng)
    assert GF(w).multiplicative_order() == f.q
    omega_from_root = pow(g, (f.p - 1) // f.q, f.p)  # galois' primitive root gives an order-q element too
    assert GF(omega_from_root).multiplicative_order() == f.q
    k = rng.integers(0, f.q, 300)
    assert (PowTable(w, f.p, f.q)(k) == np.asarray(GF(w) ** k, dtype=np.int64)).all()


def test_every_test_draws_fresh_primes():
    """Two tests of one verification use different pairs (seeded: reproducible)."""
    p = mg.Program("p")
    x = p.input("x", (3, 4))
    p.output(mg.exp(x) * 2)
    seen = collections.Counter()
    rng = np.random.default_rng(9)
    from verify.equivalence import _field_test, make_plan
    plan = make_plan(p, p, DEFAULT)
    for _ in range(5):
        _, _, f = _field_test(p, p, rng, DEFAULT, {"x"}, 4, plan)
        seen[(f.p, f.q)] += 1
    assert len(seen) == 5
    v1, v2 = (verify.equivalent(p, p, seed=3, float_check=False) for _ in range(2))
    assert (v1.p, v1.q, v1.tests) == (v2.p, v2.q, v2.tests)
    assert math.isclose(v1.per_test_bound, v2.per_test_bound)
