"""No false accepts: seeded mutants of random Lax programs, random μGraphs and the
reference μGraphs. A mutant the float64 interpreter calls different must be
rejected; one it calls equal must be accepted (no false rejections either)."""

import collections
import zlib

import numpy as np
import pytest

import verify
from mugraph.benchmarks import REFERENCES, reference
from verify.fuzz import MUTATIONS, REWRITES, differs, mutate, random_program, random_ugraph, rewrite


def run_fuzz(n: int, seed: int, check=None):
    """Mutate ``n`` graphs; returns a Counter of (verdict, truth) outcomes.
    ``check(a, b, rng) -> accepted`` defaults to one field test."""
    rng = np.random.default_rng(seed)
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    if check is None:
        def check(a, b, rng):
            return verify.field_test(a, b, rng=rng)[0] is None
    out = collections.Counter()
    for i in range(n):
        kind = i % 3
        g = refs[i % len(refs)] if kind == 0 else random_program(rng) if kind == 1 else random_ugraph(rng)
        r = mutate(g, rng)
        if r is None:
            out["no mutant"] += 1
            continue
        m, name = r
        truth = differs(g, m, seed=i)
        if truth is None:
            out["undecided"] += 1
            continue
        acc = check(g, m, rng)
        out[("accepted" if acc else "rejected", "different" if truth else "same")] += 1
        out["by:" + name] += 1
    return out


def test_fuzz_no_false_accepts_or_rejections():
    c = run_fuzz(300, seed=2026)
    assert c[("accepted", "different")] == 0, c
    assert c[("rejected", "same")] == 0, c
    assert c[("rejected", "different")] >= 120, c  # the mutants really do differ
    used = {k[3:] for k in c if isinstance(k, str) and k.startswith("by:")}
    assert used == set(MUTATIONS), used ^ set(MUTATIONS)


def test_fuzz_harness_catches_a_broken_verifier():
    """The harness must be able to fail: a verifier that accepts everything is caught."""
    c = run_fuzz(30, seed=5, check=lambda a, b, rng: True)
    assert c[("accepted", "different")] > 0


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_yields_rejected_mutants(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    rejected = 0
    for i in range(120):
        g = [random_program, random_ugraph][i % 2](rng)
        if i % 4 == 0:
            g = reference(sorted(REFERENCES)[i % 6], small=True)
        r = mutate(g, rng, kinds=[name])
        if r is None or not differs(g, r[0]):
            continue
        assert verify.field_test(g, r[0], rng=rng)[0] is not None
        rejected += 1
        if rejected >= 2:
            break
    assert rejected >= 1, name


def test_random_program_is_deterministic_and_lax():
    a, b = random_program(11), random_program(11)
    assert str(a) == str(b)
    import mugraph as mg
    for s in range(20):
        mg.check_lax(random_program(s))
        mg.check_lax(random_ugraph(s))


@pytest.mark.parametrize("seed", range(4))
def test_rewrites_are_equivalent(seed):
    g = random_ugraph(seed) if seed % 2 else random_program(seed)
    h = rewrite(g, seed, steps=4)
    assert differs(g, h) is False
    assert verify.field_test(g, h, rng=np.random.default_rng(seed))[0] is None
    assert set(REWRITES) == {"commute", "square", "sub", "scale"}


def test_differs_ignores_rounding_noise_of_a_zero_function():
    """Regression (found by the 10,000-mutant benchmark): b0 − (b1 + (b0 − b1)) is
    identically zero; float64 leaves ~1e-17 noise, doubled by a doubled
    accumulator. The oracle must call the two equal (the verifier accepted them)."""
    import mugraph as mg

    def build(double):
        kg = mg.KernelGraph("zero")
        X, Y = kg.input("x0", (4, 4), "float32"), kg.input("x1", (4, 4), "float32")
        bg = mg.BlockGraph(grid=(2, 1, 1), forloop=1)
        b0, b1 = bg.input(X, imap=(0,)), bg.input(Y, imap=(0,))
        b5 = b0 - (b1 + (b0 - b1))
        acc = bg.accum(b5)
        bg.output(acc + bg.accum(b5) if double else acc, omap=(1,))
        (t,) = kg.kernel(bg)
        kg.output(t)
        return kg

    a, b = build(False), build(True)
    assert differs(a, b, seed=8181) is False
    assert verify.equivalent(a, b, seed=8181, float_check=False).equivalent
