"""The float check: numerically sound candidates pass, unstable ones fail."""

from fractions import Fraction

import mugraph as mg
import verify
from mugraph.core.benchmarks import program, reference


def _prog(name, build):
    p = mg.Program(name)
    x = p.input("x", (8, 64), "float16")
    p.output(build(x))
    return p


def test_reference_passes():
    r = verify.float_check(program("gated_mlp", small=True), reference("gated_mlp", small=True))
    assert r.passed and any(c.passed for c in r.cases) and "float check: passed" in str(r)


def test_cancellation_fails_in_float16():
    ref = _prog("ref", lambda x: x * 2)
    bad = _prog("bad", lambda x: (x + 4096) * 2 - 8192)  # exact in reals and in the field
    assert verify.equivalent(ref, bad, seed=0, float_check=False).equivalent
    r = verify.float_check(ref, bad)
    assert not r.passed
    assert any(c.dtype == "float16" and c.passed is False for c in r.cases)


def test_overflow_never_passes():
    ref = _prog("ref", lambda x: x * Fraction(1, 2))
    bad = _prog("bad", lambda x: (mg.exp(x) * x) / (mg.exp(x) * 2))  # inf/inf at large x
    r = verify.float_check(ref, bad, dtypes=("float16",), scales=(16.0,))
    assert not r.passed and "NaN/Inf" in str(r)


def test_skips_are_reported():
    r = verify.float_check(program("gqa", small=True), reference("gqa", small=True))
    assert r.passed
    assert any(c.passed is None for c in r.cases) and "skipped" in str(r)


def test_verdict_includes_float_check():
    ref = _prog("ref", lambda x: x * 2)
    bad = _prog("bad", lambda x: (x + 4096) * 2 - 8192)
    v = verify.equivalent(ref, bad, seed=0)
    assert v.equivalent and not v.ok and "FAILED" in str(v)


def _scaled_kernel(name, store_large: bool):
    """``x/2`` as ``(x·4096)/8192`` in one kernel: the large product either stays in
    registers (``store_large=False``) or is written to device memory first."""
    kg = mg.KernelGraph(name)
    X = kg.input("x", (8, 64), "float16")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
    big = mg.scale(bg.input(X), 4096)
    if store_large:
        bg.output(bg.accum(big))
        (t,) = kg.kernel(bg)
        kg.output(mg.scale(t, Fraction(1, 8192)))
    else:
        bg.output(bg.accum(mg.scale(big, Fraction(1, 8192))))
        (t,) = kg.kernel(bg)
        kg.output(t)
    return kg


def test_values_in_registers_are_float32_memory_holds_the_dtype():
    """The candidate runs as the lowering computes: a block graph's intermediate values
    (here 16·4096 > the float16 range) stay float32 in registers; only what a kernel
    writes to device memory is rounded to float16 — and there overflow fails."""
    ref = _prog("ref", lambda x: x * Fraction(1, 2))
    fused, stored = _scaled_kernel("fused", False), _scaled_kernel("stored", True)
    assert verify.equivalent(ref, fused, seed=0, float_check=False).equivalent
    assert verify.equivalent(ref, stored, seed=0, float_check=False).equivalent
    assert verify.float_check(ref, fused, dtypes=("float16",), scales=(16.0,)).passed
    r = verify.float_check(ref, stored, dtypes=("float16",), scales=(16.0,))
    assert not r.passed and r.cases[0].rel_error > 100  # the overflow, saturated, is far off


def test_an_overflow_counts_as_the_largest_finite_value():
    """An element that overflowed to inf counts as float16's largest finite number of
    its sign: no error where the true value sits there, the distance to it elsewhere;
    an infinity of the wrong sign, or NaN, is not finite."""
    import torch

    from verify.floatcheck import element_errors

    fmax = float(torch.finfo(torch.float16).max)
    r = torch.tensor([[1.0, fmax]], dtype=torch.float64)
    m = r.abs()
    edge = element_errors([torch.tensor([[1.0, float("inf")]])], [(r, m)], 1e-30, fmax)
    assert edge[0] == (0.0, (0, 0)) or edge[0][0] == 0.0
    (far,) = element_errors([torch.tensor([[float("inf"), fmax]])], [(r, m)], 1e-30, fmax)
    assert far[0] > 1e4 and far[1] == (0, 0)
    assert element_errors([torch.tensor([[1.0, float("-inf")]])], [(r, m)], 1e-30, fmax) == [None]
    assert element_errors([torch.tensor([[1.0, float("nan")]])], [(r, m)], 1e-30, fmax) == [None]


def test_full_shape_rmsnorm_matmul_reference_passes_in_float16():
    """At full shapes and inputs of std 16 the product's largest elements sit at the
    float16 range's edge: the hand-written kernel is judged as it runs and passes."""
    r = verify.float_check(program("rmsnorm_matmul", b=1), reference("rmsnorm_matmul", b=1),
                           dtypes=("float16",), scales=(16.0,))
    assert r.passed


def test_inputs_outside_the_domain_are_drawn_again_non_negative():
    """A norm's per-row factor as a piece of its own takes the squares as an input: normal
    draws give sqrt of negative sums, so the draw is made non-negative; a sound candidate
    then passes and an unstable one still fails."""
    def norm_factor(name, eps):
        p = mg.Program(name)
        s = p.input("s", (4, 64), "float32")
        t = mg.scale(mg.sum(s, 1), Fraction(1, 64)) + eps
        p.output(mg.div(mg.constant(1, t), mg.sqrt(t)))
        return p

    ref = norm_factor("ref", Fraction(1, 10**6))
    r = verify.float_check(ref, norm_factor("same", Fraction(1, 10**6)), dtypes=("float32",))
    assert r.passed and all(c.passed for c in r.cases)
    wrong = norm_factor("wrong", Fraction(1, 10))
    assert not verify.float_check(ref, wrong, dtypes=("float32",)).passed
