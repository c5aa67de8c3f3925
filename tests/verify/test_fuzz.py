"""No false accepts: seeded mutants of random Lax programs (with and without sqrt, and
with a 2^40-times larger part in an output), random μGraphs, random safe-softmax
programs (a max as a free shift, plain and split) and the reference μGraphs. A mutant the float64 interpreter calls different must be rejected; one it
calls equal must be accepted (no false rejections either)."""

import collections
import zlib
from fractions import Fraction

import numpy as np
import pytest

from mugraph.core.ir import graph_ops

import verify
from mugraph.core.benchmarks import REFERENCES, reference
from verify.fuzz import (EQUIVALENT_MUTATIONS, MUTATIONS, REWRITES, SOFTMAX_MUTATIONS, corpus_graph, differs, mutate,
                        random_online_softmax,
                         random_program, random_softmax, random_ugraph, rewrite)


def run_fuzz(n: int, seed: int, check=None):
    """Mutate ``n`` graphs; returns a Counter of (verdict, truth) outcomes.
    ``check(a, b, rng) -> accepted`` defaults to one field test (None: undecided)."""
    rng = np.random.default_rng(seed)
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    if check is None:
        def check(a, b, rng):
            return verify.field_test(a, b, rng=rng)[0] is None
    out = collections.Counter()
    for i in range(n):
        g = corpus_graph(i, rng, refs)
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


def _verdict(a, b, rng):
    v = verify.equivalent(a, b, seed=int(rng.integers(1 << 31)), float_check=False)
    return v.equivalent


def test_fuzz_no_false_accepts_or_rejections():
    c = run_fuzz(300, seed=2026, check=_verdict)
    assert c[("accepted", "different")] == 0, c
    assert c[("rejected", "same")] == 0, c
    assert c[("rejected", "different")] >= 180, c  # the mutants really do differ
    used = {k[3:] for k in c if isinstance(k, str) and k.startswith("by:")}
    older = set(MUTATIONS) - set(SOFTMAX_MUTATIONS)  # the softmax ones have a seventh of the corpus
    assert len(used & older) >= len(older) - 3, used ^ older  # a mix (each kind alone: below)
    assert len(used & set(SOFTMAX_MUTATIONS)) >= 3, used


def test_fuzz_tricks_fool_a_fixed_prime_test_but_not_random_primes():
    """The constant tricks are real: one test with the former fixed pair accepts
    different mutants that the random primes reject."""
    fixed = verify.Field(2147471759, 1073735879)
    rng = np.random.default_rng(3)
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    n, fooled = 0, 0
    for i in range(60):
        g = corpus_graph(i, rng, refs)
        r = mutate(g, rng, kinds=["prime_constant", "exp_prime_constant", "hidden_part"])
        if r is None or differs(g, r[0], seed=i) is not True:
            continue
        n += 1
        try:
            fooled += verify.field_test(g, r[0], rng=rng, fld=fixed)[0] is None
        except verify.FieldError:  # a denominator that is a multiple of the fixed p
            fooled += 1
        except verify.ZeroDivisorDraw:  # every draw divides by zero mod the fixed p: no usable draw
            pass  # (as the benchmark counts it)
        assert _verdict(g, r[0], rng) is False, r[1]
    assert n >= 20 and fooled >= 3, (n, fooled)


def test_fuzz_harness_catches_a_broken_verifier():
    """The harness must be able to fail: a verifier that accepts everything is caught."""
    c = run_fuzz(30, seed=5, check=lambda a, b, rng: True)
    assert c[("accepted", "different")] > 0
    c = run_fuzz(30, seed=5, check=lambda a, b, rng: False)
    assert c[("rejected", "same")] > 0


@pytest.mark.parametrize("name", sorted(set(MUTATIONS) - set(SOFTMAX_MUTATIONS)))
def test_each_mutation_yields_rejected_mutants(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    rejected = 0
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    for i in range(120):
        if name in ("sqrt_sign", "hidden_part", "exp_prime_constant"):  # need sqrt, a large part, an exp
            g = corpus_graph(i, rng, refs)
        else:
            g = [random_program, random_ugraph][i % 2](rng)
            if i % 4 == 0:
                g = refs[i % 6]
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


@pytest.mark.parametrize("seed", range(6))
def test_rewrites_are_equivalent(seed):
    g = [random_program(seed), random_ugraph(seed), random_program(seed, sqrt=True)][seed % 3]
    h = rewrite(g, seed, steps=4)
    assert differs(g, h) is False
    v = verify.equivalent(g, h, seed=seed, float_check=False)
    assert v.equivalent is True and v.ok, str(v)
    assert set(REWRITES) == {"commute", "square", "sub", "scale", "sqrt_scale", "prime_roundtrip"}


@pytest.mark.parametrize("name", ["sqrt_scale", "prime_roundtrip"])
def test_each_new_rewrite_applies_and_keeps_the_meaning(name):
    from mugraph.core.rewrite import rebuild
    changed = 0
    for seed in range(12):
        g = random_program(seed, sqrt=True)
        edits = REWRITES[name](g, np.random.default_rng(seed))
        if edits is None:
            continue
        h = rebuild(g, **edits)
        changed += str(h) != str(g)
        assert differs(g, h, seed=seed) is False
        assert verify.equivalent(g, h, seed=seed, float_check=False).equivalent is True
    assert changed >= 3


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


# ---------------------------------------------------------------------------- safe softmax


def test_random_softmax_is_deterministic_lax_and_in_the_corpus():
    import mugraph as mg
    assert str(random_softmax(4)) == str(random_softmax(4))
    kinds = set()
    for s in range(30):
        g = random_softmax(s)
        mg.check_lax(g)
        kinds.add(sum(op.kind == "max" for op in g.ops) > 1)
    assert kinds == {False, True}  # plain and split forms
    rng = np.random.default_rng(0)
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    has_max = [any(op.kind == "max" for op, _ in graph_ops(corpus_graph(i, rng, refs))) for i in range(42)]
    assert not any(has_max[:18])  # a max-free prefix: a field evaluation without free draws still runs
    assert sum(has_max) == 6  # a seventh of the corpus (its online μGraphs keep their max in a block)


#: the mutations of an online μGraph's accumulators (their prey: :func:`random_online_softmax`)
ONLINE_MUTATIONS = ("unrescaled_accum", "rescale_by_other")


@pytest.mark.parametrize("name", sorted(set(SOFTMAX_MUTATIONS) - set(EQUIVALENT_MUTATIONS)))
def test_each_softmax_mutation_yields_rejected_mutants(name):
    """Each mistake of a safe softmax finds sites in the random softmax programs, and the
    mutants that float64 calls different are rejected by the verifier."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    rejected = 0
    for i in range(40):
        g = (random_online_softmax if name in ONLINE_MUTATIONS else random_softmax)(rng)
        r = mutate(g, rng, kinds=[name])
        if r is None or not differs(g, r[0], seed=i):
            continue
        v = verify.equivalent(g, r[0], seed=i, float_check=False)
        assert v.equivalent is False, f"{name}: {v}"
        rejected += 1
        if rejected >= 3:
            break
    assert rejected >= 3, name


def test_another_shift_is_equivalent_and_accepted():
    """``shift_value`` (twice the max, the mean, a constant in place of a max) keeps the
    meaning: float64 calls every mutant the same and the verifier accepts it."""
    rng = np.random.default_rng(9)
    n = 0
    for i in range(24):
        g = random_online_softmax(rng) if i % 4 == 3 else random_softmax(rng)
        r = mutate(g, rng, kinds=["shift_value"])
        assert r is not None  # every softmax program has a max
        assert differs(g, r[0], seed=i) is False
        v = verify.equivalent(g, r[0], seed=i, float_check=False)
        assert v.equivalent is True and v.bound_met, str(v)
        n += 1
    assert n == 24


def test_softmax_fuzz_no_false_accepts_or_rejections():
    """Every mutation (the softmax ones and the older ones that find a site) on safe-softmax
    programs: the verifier's verdict agrees with float64 wherever it decides."""
    rng = np.random.default_rng(2027)
    c = collections.Counter()
    for i in range(80):
        g = random_softmax(rng)
        r = mutate(g, rng)
        if r is None:
            continue
        m, name = r
        truth = differs(g, m, seed=i)
        if truth is None:
            continue
        v = verify.equivalent(g, m, seed=i, float_check=False)
        if v.equivalent is None:  # undecided: neither a false accept nor a false rejection
            c["undecided"] += 1
            continue
        c[("accepted" if v.equivalent else "rejected", "different" if truth else "same")] += 1
        c["by:" + name] += 1
    assert c[("accepted", "different")] == 0, c
    assert c[("rejected", "same")] == 0, c
    assert c[("rejected", "different")] >= 40 and c[("accepted", "same")] >= 3, c
    assert sum(c["by:" + k] for k in SOFTMAX_MUTATIONS) >= 15, c


def test_differs_sees_a_hard_max():
    """A safe-softmax attention with scores scaled by a constant near 2^29 is a hard max.
    At input std 0.5 its exponents' magnitudes (~1e9) make float64's tolerance larger
    than the elements, and the comparison alone calls it the same as the softmax; the
    ground truth looks again at smaller inputs and sees the difference."""
    import mugraph as mg
    from verify.floatcheck import compare_float64

    def build(c):
        p = mg.Program("hard" if c > 1 else "soft")
        s = mg.scale(p.input("s", (6, 4), "float32"), c)
        e = mg.exp(s - mg.max(s, 1))
        p.output((e @ p.input("v", (4, 2), "float32")) / mg.sum(e, 1))
        return p

    a, b = build(Fraction(1, 2)), build(Fraction(536867940))
    assert compare_float64(a, b, seed=3) is False  # blind at std 0.5
    assert differs(a, b, seed=3) is True
    assert differs(a, build(Fraction(1, 2)), seed=3) is False
