"""The field algebra: primes, exact modular arithmetic, exp/sqrt maps, failed draws."""

from fractions import Fraction

import numpy as np
import pytest
import torch

import mugraph as mg
from verify.field import (MIRAGE, Field, FieldAlgebra, FieldError, FieldInput, PowTable, ZeroDivisorDraw,
                          const_mod, inverse, is_prime, limb_plan, matmul_mod, random_omega, uniform_residues)

#: the largest safe-prime pair below 2^31 (the verifier's fixed pair before primes were drawn per
#: test): the worst case for the exactness of the arithmetic, which every drawn pair stays below
DEFAULT = Field(2147471759, 1073735879, "largest")


@pytest.mark.parametrize("p,q", [(15, 7), (167, 7), (23, 11 * 2), (2 ** 31 + 11, 3)])
def test_bad_primes_rejected(p, q):
    with pytest.raises(FieldError):
        Field(p, q)


def test_is_prime_matches_trial_division():
    small = [n for n in range(2, 2000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    assert [n for n in range(2000) if is_prime(n)] == small


@pytest.mark.parametrize("m", [DEFAULT.p, DEFAULT.q, MIRAGE.p, MIRAGE.q])
@pytest.mark.parametrize("shapes", [((3, 700), (700, 5)), ((2, 3, 4096), (4096, 2)), ((2, 1, 3, 9), (4, 9, 2))])
def test_matmul_mod_is_exact(m, shapes):
    rng = np.random.default_rng(m)
    a = rng.integers(0, m, shapes[0])
    b = rng.integers(0, m, shapes[1])
    got = matmul_mod(a, b, m)
    want = np.matmul(a.astype(object), b.astype(object)) % m
    assert got.dtype == np.int64 and (got == want.astype(np.int64)).all()


def test_matmul_worst_case_entries():
    m = DEFAULT.p
    a = np.full((2, 8192), m - 1, dtype=np.int64)
    b = np.full((8192, 3), m - 1, dtype=np.int64)
    assert (matmul_mod(a, b, m) == (8192 * (m - 1) ** 2) % m).all()


def _exact(a, b, m):
    return np.asarray(np.matmul(np.asarray(a, dtype=np.int64).astype(object),
                                np.asarray(b, dtype=np.int64).astype(object)) % m).astype(np.int64)


@pytest.mark.parametrize("path", ["torch", "fused"])
@pytest.mark.parametrize("m", [DEFAULT.p, DEFAULT.q, MIRAGE.p])
def test_matmul_mod_exact_on_broadcast_batches_and_views(m, path, monkeypatch):
    """Batch axes that only one operand varies along are folded into the GEMM; the
    operands may be permuted views (iterator tiles), stride-0 broadcasts, float64. Both
    limb recombinations: torch ops, and the fused loop (verify.fused) taken at any size."""
    from verify import fused
    if path == "fused":
        if fused._loops() is None:
            pytest.skip("numba not installed")
        monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    else:
        monkeypatch.setattr(fused, "_loops", lambda: None)  # as without numba
    rng = np.random.default_rng(m % 1000)
    for _ in range(60):
        nb = int(rng.integers(0, 4))
        sa = [int(rng.choice([1, 2, 3])) for _ in range(nb)]
        sb = [s if rng.random() < 0.5 else 1 for s in sa]
        if rng.random() < 0.5:
            sa, sb = sb, sa
        M, N = (int(x) for x in rng.integers(1, 6, 2))
        K = int(rng.choice([1, 5, 64, 300, 4100]))
        a = rng.integers(0, m, tuple(sa) + (M, K))
        b = rng.integers(0, m, tuple(sb) + (K, N))
        want = _exact(a, b, m)
        if rng.random() < 0.5:  # a transposed view, as an iterator hands a weight tile
            b = np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)
        if rng.random() < 0.3 and nb and a.shape[0] > 1:
            a = np.broadcast_to(a[:1], a.shape)
            want = _exact(a, b, m)
        if rng.random() < 0.5:
            a, b = (x.astype(np.float64) if rng.random() < 0.5 else x for x in (a, b))
        got = matmul_mod(a, b, m)
        assert got.dtype == np.int64 and got.shape == want.shape and (got == want).all()


def test_matmul_mod_folds_an_iterator_view_without_copying_it():
    """The gated_mlp weight tile: W (K, N) seen as (grid, 1, 1, loop, k, n). Its GEMM
    must equal the per-block products, and the operand must reach torch as a view."""
    m = DEFAULT.p
    rng = np.random.default_rng(3)
    W = uniform_residues(rng, m, (256, 128), np.float64)
    X = uniform_residues(rng, m, (4, 256), np.float64)
    w_tiles = W.reshape(8, 32, 4, 32).transpose(2, 0, 1, 3)[:, None, None]  # (gx, 1, 1, F, 32, 32)
    x_tiles = X.reshape(4, 8, 32).transpose(1, 0, 2)[None, None, None]  # (1, 1, 1, F, 4, 32)
    got = matmul_mod(x_tiles, w_tiles, m)
    assert got.shape == (4, 1, 1, 8, 4, 32)
    for g in range(4):
        for f in range(8):
            assert (got[g, 0, 0, f] == _exact(x_tiles[0, 0, 0, f], w_tiles[g, 0, 0, f], m)).all()
    import torch
    from verify.field import _folded_matmul
    seen = []
    real = torch.matmul
    try:  # the GEMM's large operand is W itself, read in place (float64: no conversion)
        torch.matmul = lambda x, y, **kw: (seen.append((x.data_ptr(), y.data_ptr())), real(x, y, **kw))[1]
        matmul_mod(torch.from_numpy(x_tiles), torch.from_numpy(w_tiles), m)
    finally:
        torch.matmul = real
    assert seen and seen[0][1] == W.__array_interface__["data"][0]  # shared, not converted
    assert _folded_matmul  # the folding helper is the one documented


def test_limb_plan_guarantees_exactness():
    for K in (1, 64, 4096, 2 ** 16, 2 ** 20):
        L, w = limb_plan(K, DEFAULT.p)
        assert L >= 1 and K * ((1 << w) - 1) * (DEFAULT.p - 1) < 2 ** 53
    assert limb_plan(2 ** 23, DEFAULT.p) == (0, 0)  # too long even for 1-bit limbs: chunked
    assert limb_plan(4096, MIRAGE.p) == (1, 8)


def test_pow_table_and_exp_homomorphism():
    rng = np.random.default_rng(0)
    w = random_omega(DEFAULT, rng)
    assert w != 1 and pow(w, DEFAULT.q, DEFAULT.p) == 1
    t = PowTable(w, DEFAULT.p, DEFAULT.q)
    k = rng.integers(0, DEFAULT.q, 500)
    assert [int(x) for x in t(k)] == [pow(w, int(e), DEFAULT.p) for e in k]
    a, b = rng.integers(0, DEFAULT.q, 100), rng.integers(0, DEFAULT.q, 100)
    assert (t((a + b) % DEFAULT.q) == t(a) * t(b) % DEFAULT.p).all()


def test_inverse_and_constants():
    rng = np.random.default_rng(1)
    x = rng.integers(1, DEFAULT.p, 1000)
    assert (x * inverse(x, DEFAULT.p) % DEFAULT.p == 1).all()
    assert const_mod(Fraction(1, 4096), DEFAULT.p) * 4096 % DEFAULT.p == 1
    assert const_mod(Fraction(-3, 2), DEFAULT.p) * 2 % DEFAULT.p == DEFAULT.p - 3
    with pytest.raises(FieldError):
        const_mod(Fraction(1, 167), 167)


def test_uniform_residues_in_range_and_spread():
    rng = np.random.default_rng(2)
    x = uniform_residues(rng, 7, (70000,))
    assert x.dtype == np.int64 and x.min() == 0 and x.max() == 6
    counts = np.bincount(x)
    assert abs(counts - 10000).max() < 500
    y = uniform_residues(rng, DEFAULT.p, (4, 5))
    assert y.shape == (4, 5) and (y < DEFAULT.p).all()


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_large_draws_converted_by_torch_are_the_same_residues(dtype, monkeypatch):
    """A draw of LARGE_DRAW entries or more is converted by torch (huge pages): bit for bit
    the draw numpy's conversion gives, in dtype and shape; 2**32 keeps numpy's path."""
    import verify.field as F
    shape = (1 << 10, (F.LARGE_DRAW >> 10) + 3)
    for m in (DEFAULT.p, 2 ** 32):
        fast = uniform_residues(np.random.default_rng(5), m, shape, dtype)
        monkeypatch.setattr(F, "LARGE_DRAW", 1 << 62)
        slow = uniform_residues(np.random.default_rng(5), m, shape, dtype)
        monkeypatch.undo()
        assert fast.dtype == slow.dtype == np.dtype(dtype) and fast.shape == slow.shape == shape
        assert np.array_equal(fast, slow) and (fast < m).all()


@pytest.mark.parametrize("m", [2, 5, 167, 2 ** 31 - 1, DEFAULT.q, 2 ** 32])
def test_uniform_residues_rejection_is_unbiased(m):
    """Low bits of raw words, values >= m rejected: uniform on [0, m), including moduli
    where most words are rejected (m = 5: 3 of 8) and none (m = 2**32)."""
    rng = np.random.default_rng(m)
    n = 200_000
    x = uniform_residues(rng, m, (n,), np.float64)
    assert x.dtype == np.float64 and (x == np.floor(x)).all() and x.min() >= 0 and x.max() < m
    k = min(m, 50)  # equal-width buckets of [0, m) (m itself when small)
    counts = np.bincount((x.astype(np.int64) * k // m), minlength=k)
    expect = np.array([len(range(-(-i * m // k), -(-(i + 1) * m // k))) for i in range(k)]) * n / m
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < k + 6 * (2 * k) ** 0.5  # mean k-1, sd sqrt(2(k-1))
    if m > 2:
        pairs = x[:-1] < m / 2, x[1:] < m / 2  # consecutive draws independent
        assert abs(np.mean(pairs[0] & pairs[1]) - np.mean(pairs[0]) * np.mean(pairs[1])) < 0.01


def test_float64_stored_inputs_give_the_int64_results():
    """draw_inputs stores residues as float64; every op must see exact int64 values."""
    from verify.field import draw_inputs
    p = mg.Program("all_ops")
    x = p.input("x", (3, 8))
    w = p.input("w", (8, 4))
    y = x @ w
    z = (y * y - y + mg.scale(y, Fraction(1, 3))) / (mg.exp(y) + 1)
    c = mg.concat([x, mg.square(x)], 1)
    for o in (mg.sum(z, 1), mg.sqrt(y), mg.repeat(mg.reshape(c, (6, 8)), (1, 2)), mg.silu(x), c @ mg.concat([w, w], 0)):
        p.output(o)
    alg = _alg(5)
    drawn = draw_inputs([("w", (8, 4), True), ("x", (3, 8), True)], DEFAULT, np.random.default_rng(7))
    assert all(v.xp.dtype == torch.float64 for v in drawn.values())
    as_int = {k: FieldInput(v.xp.long(), v.xq.long()) for k, v in drawn.items()}
    for a, b in zip(mg.evaluate(p, drawn, alg), mg.evaluate(p, as_int, alg)):
        assert len(a) == len(b) and all(u.dtype == torch.int64 and torch.equal(u, v) for u, v in zip(a, b))


def _alg(seed=0, fld=DEFAULT):
    return FieldAlgebra(fld, random_omega(fld, np.random.default_rng(seed)))


def _val(x, fld=DEFAULT):
    x = np.asarray(x, dtype=np.int64)
    return (x % fld.p, x % fld.q)


def test_sqrt_is_multiplicative_and_fixes_small_squares():
    alg = _alg()
    a, b = _val([3, 10, 12345]), _val([7, 2, 99])
    ab = alg.apply("mul", [a, b], {})
    sa, sb, sab = (alg.apply("sqrt", [v], {}) for v in (a, b, ab))
    assert (alg.apply("mul", [sa, sb], {})[0] == sab[0]).all()
    for c in (4, 9, 25, 49, 4096, 36):
        r = alg.apply("sqrt", [_val([c])], {})
        assert int(r[0][0]) == round(c ** 0.5) and int(r[1][0]) == round(c ** 0.5)


def test_zero_divisor_is_a_failed_draw_never_a_value():
    alg = _alg()
    with pytest.raises(ZeroDivisorDraw):
        alg.apply("div", [_val([1, 2]), _val([3, 0])], {})


def test_silu_and_exp_drop_the_q_part_and_refuse_a_second_exp():
    alg = _alg()
    e = alg.apply("exp", [_val([1, 2, 3])], {})
    assert len(e) == 1
    s = alg.apply("silu", [_val([0, 5])], {})
    assert len(s) == 1 and int(s[0][0]) == 0
    with pytest.raises(mg.NotLaxError):
        alg.apply("exp", [e], {})
    with pytest.raises(mg.NotLaxError):
        alg.apply("max", [_val([1])], {"dim": 0})


def test_field_input_requires_draws():
    p = mg.Program("t")
    x = p.input("x", (2, 2))
    p.output(x + x)
    with pytest.raises(TypeError):
        mg.evaluate(p, {"x": np.zeros((2, 2))}, _alg())
    out = mg.evaluate(p, {"x": FieldInput(np.ones((2, 2), np.int64), None)}, _alg())
    assert len(out[0]) == 1 and (out[0][0] == 2).all()
