"""The fused CPU loops (numba) agree with exact integer arithmetic and with the torch path."""

import numpy as np
import pytest
import torch

from verify import field, fused
from verify.field import Field, PowTable, matmul_mod, random_omega

pytestmark = pytest.mark.skipif(fused._loops() is None, reason="numba not installed")

LARGEST = Field(2147471759, 1073735879, "largest")


@pytest.fixture
def always_fused(monkeypatch):
    """Every tensor, however small, takes the fused path."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)


def test_reduce_at_the_edges_of_its_range():
    """The float64 quotient estimate is off by one either way at exact multiples and
    just below them, and for the largest inputs; the result is always r mod m."""
    m = LARGEST.p
    top = (1 << 62) - 1
    rs = [0, 1, m - 1, m, m + 1, 2 * m - 1, 2 * m, top, top - 1, (top // m) * m, (top // m) * m - 1,
          (1 << 53) - 1, 1 << 53, (1 << 53) + 1, ((1 << 53) // m) * m]
    rng = np.random.default_rng(0)
    rs += [int(x) for x in rng.integers(0, 1 << 62, 2000, dtype=np.int64)]
    k = np.array(rs, dtype=np.int64)
    for r in rs:
        c = torch.tensor([[[float(r % (1 << 53))]]], dtype=torch.float64)  # one limb: c mod m
        out = torch.empty((1, 1), dtype=torch.int64)
        fused.combine_limbs(c, 16, m, out)
        assert int(out) == (r % (1 << 53)) % m
    # two limbs of 30 bits: (hi mod m)·2^30 + lo, with lo < 2^53, reaches 2^61 + 2^53; and
    # Mirage's small primes, where the quotient r/m is largest (up to 2^53/83)
    hi = torch.tensor(k % (1 << 53), dtype=torch.float64)
    lo = torch.tensor((k >> 9) % (1 << 53), dtype=torch.float64)
    c = torch.stack([lo, hi])[None]  # (1, L=2, n)
    for mod in (m, LARGEST.q, 167, 83):
        out = torch.empty((1, len(rs)), dtype=torch.int64)
        fused.combine_limbs(c, 30, mod, out)
        want = [((int(h) % mod) * 2 ** 30 + int(l)) % mod for h, l in zip(hi.tolist(), lo.tolist())]
        assert out[0].tolist() == want


def test_matmul_mod_fused_worst_case_entries(always_fused):
    m = LARGEST.p
    for K in (64, 8192):
        a = np.full((2, 3, K), m - 1, dtype=np.int64)
        b = np.full((1, K, 40), m - 1, dtype=np.int64)
        assert (matmul_mod(a, b, m) == (K * (m - 1) ** 2) % m).all()


def test_fused_and_torch_paths_agree_on_a_large_product(monkeypatch):
    """At a size where the fused path is taken by default (an attention's QKᵀ with its
    key blocks folded into the GEMM's columns), it returns what the torch path does."""
    rng = np.random.default_rng(5)
    m = LARGEST.q
    a = torch.from_numpy(rng.integers(0, m, (2, 1, 1, 256, 64)))
    b = torch.from_numpy(rng.integers(0, m, (2, 8, 4, 64, 64)))
    assert fused.available(torch.empty(2 * 8 * 4 * 256 * 64 * 2))
    got = matmul_mod(a, b, m)
    monkeypatch.setattr(fused, "_loops", lambda: None)  # as without numba: the torch path
    assert torch.equal(got, matmul_mod(a, b, m))


def test_pow_table_fused_agrees_with_python(always_fused):
    rng = np.random.default_rng(3)
    for f in (LARGEST, Field(167, 83, "mirage")):
        w = random_omega(f, rng)
        t = PowTable(w, f.p, f.q)
        k = np.concatenate([rng.integers(0, f.q, 3000), [0, 1, f.q - 1]])
        assert t(k).tolist() == [pow(w, int(e), f.p) for e in k]


def test_small_tensors_keep_the_torch_path():
    assert not fused.available(torch.empty(10))
    assert not fused.available(torch.empty(field.SMALL_EVAL))


def test_float_check_exp_is_torch_exp_bit_for_bit(always_fused):
    """Saturated elements (0 and inf) found by the fused pass; denormal results and the
    edge of overflow still computed by torch: the same bits as torch.exp, in both
    dtypes, with and without such edge elements."""
    from verify.floatcheck import exp
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(5000, generator=g, dtype=torch.float64) * 400
        x[:8] = torch.tensor([-1e4, -746.0, -745.0, -104.0, -90.0, 88.9, 709.9, 1e4], dtype=torch.float64)
        for v in (x.to(dtype), x.clamp(-50, 50).to(dtype), (x - 2000).to(dtype)):
            assert torch.equal(exp(v), torch.exp(v))


def test_exp_results_as_floats_are_the_same_residues(always_fused):
    rng = np.random.default_rng(4)
    f = LARGEST
    w = random_omega(f, rng)
    t = PowTable(w, f.p, f.q)
    k = torch.from_numpy(rng.integers(0, f.q, 4000))
    ints, floats = t(k), t(k, floats=True)
    assert floats.dtype == torch.float64 and torch.equal(floats.long(), ints)


def test_a_numba_that_fails_here_costs_a_warning_and_the_torch_path(monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("no LLVM target for this CPU")

    monkeypatch.setattr(fused._loops(), "_combine_outer", broken)
    monkeypatch.setattr(fused._loops(), "_combine_inner", broken)
    fused._works.cache_clear()
    try:
        assert not fused.available(torch.empty(fused.MIN_ELEMENTS))
        assert "using torch ops" in caplog.text
        rng = np.random.default_rng(1)
        m = LARGEST.p
        a, b = rng.integers(0, m, (2, 600, 64)), rng.integers(0, m, (2, 64, 900))
        want = (np.matmul(a.astype(object), b.astype(object)) % m).astype(np.int64)
        assert (matmul_mod(a, b, m) == want).all()
    finally:
        fused._works.cache_clear()


def test_importing_the_verifier_does_not_import_numba():
    """numba sizes its thread pool when imported: a search worker sets NUMBA_NUM_THREADS to
    its share of the cores first (search.worker.share_cores), which only works if nothing
    imported numba before — the verifier's modules import it on first use."""
    import subprocess
    import sys

    code = ("import sys, verify.field, verify.floatcheck, search.worker; "
            "assert 'numba' not in sys.modules, 'numba imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
