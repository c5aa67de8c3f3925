"""The float check: numerically sound candidates pass, unstable ones fail."""

from fractions import Fraction

import mugraph as mg
import verify
from mugraph.benchmarks import program, reference


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
