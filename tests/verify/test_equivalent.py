"""verify.equivalent: verdicts, counterexamples, errors, bounds, fingerprints."""

import importlib.util
import json
from pathlib import Path

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks import program, reference
from verify.bound import tests_needed as n_tests
from verify.field import MIRAGE

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("verify_handwritten", ROOT / "examples" / "verify_handwritten.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EX = _example()
GQA = program("gqa", **{k: EX.SMALL[k] for k in ("queries", "head_dim", "kv")})


def test_verdict_for_equivalent_pair():
    v = verify.equivalent(GQA, EX.gqa_kernel(**EX.SMALL), seed=0, float_check=False)
    assert v.equivalent is True and v.ok and v.bound_met and v.conjecture and not v.heuristic
    assert v.tests == n_tests(v.per_test_bound, 2 ** -40) and v.tests >= 2
    assert v.error_bound == pytest.approx(v.per_test_bound ** v.tests) and not v.voids_counted
    fam = verify.DEFAULT
    assert fam.q_lo <= v.q < fam.q_hi and v.p == 2 * v.q + 1 and v.pairs == fam.size
    assert v.checks == {"field tests": "passed", "error bound": "met"} and v.failed_checks == []
    text = str(v)
    assert "EQUIVALENT" in text and f"p={v.p}" in text and "Li–Wu" in text and "199645 pairs" in text


@pytest.mark.parametrize("bug", ["omap", "no_division", "off_by_one"])
def test_broken_kernels_get_a_counterexample(bug):
    sizes = dict(EX.SMALL, row_tile=EX.SMALL["queries"] // 2) if bug == "omap" else EX.SMALL
    v = verify.equivalent(GQA, EX.gqa_kernel(bug=bug, **sizes), seed=0)
    assert v.equivalent is False and not v.ok
    ce = v.counterexample
    assert ce.output == 0 and len(ce.index) == 3 and ce.reference_value != ce.candidate_value
    assert ce.reference_float is not None and ce.reference_float != ce.candidate_float
    assert "NOT EQUIVALENT" in str(v) and "counterexample" in str(v)


def test_verdict_json_round_trip():
    v = verify.equivalent(GQA, EX.gqa_kernel(bug="no_division", **EX.SMALL), seed=0)
    d = json.loads(json.dumps(v.to_json()))
    assert d["equivalent"] is False and d["counterexample"]["index"] == list(v.counterexample.index)
    w = verify.Verdict.from_json(d)
    assert w == v
    v2 = verify.equivalent(program("lora", small=True), reference("lora", small=True), seed=1)
    d2 = json.loads(v2.dumps())
    assert d2["ok"] is True and d2["float_check"]["passed"] is True
    assert verify.Verdict.from_json(d2).float_check.passed


def test_same_seed_same_verdict():
    a = verify.equivalent(GQA, EX.gqa_kernel(bug="omap", **dict(EX.SMALL, row_tile=16)), seed=42, float_check=False)
    b = verify.equivalent(GQA, EX.gqa_kernel(bug="omap", **dict(EX.SMALL, row_tile=16)), seed=42, float_check=False)
    assert a.counterexample == b.counterexample and a.seed == 42
    c = verify.equivalent(GQA, GQA, float_check=False)
    assert isinstance(c.seed, int)  # a random seed is recorded, so the run can be replayed


def _two_exps():
    p = mg.Program("two_exps")
    x = p.input("x", (2, 3))
    p.output(mg.exp(mg.exp(x)))
    return p


def _with_max():
    p = mg.Program("with_max")
    x = p.input("x", (2, 3))
    p.output(mg.max(x, 1) + mg.sum(x, 1))
    return p


def test_non_lax_raises_naming_the_op():
    with pytest.raises(mg.NotLaxError, match="exp"):
        verify.equivalent(_two_exps(), _two_exps())


def test_non_lax_float_only_says_unproven():
    v = verify.equivalent(_two_exps(), _two_exps(), non_lax="float", seed=0)
    assert v.equivalent is None and v.method == "float-only" and not v.ok


def test_a_max_whose_value_does_not_cancel_is_undecided_not_rejected():
    """A max is a free shift to the field tests: an output that *is* a max differs between
    two copies of one graph for their independent shifts, and float64 says they agree —
    undecided (never a false rejection, never a proof)."""
    v = verify.equivalent(_with_max(), _with_max(), seed=0)
    assert v.equivalent is None and not v.ok and "free shift" in str(v)


def test_mismatched_graphs_one_line_errors():
    p = mg.Program("a")
    x = p.input("x", (2, 3))
    p.output(x + x)
    q = mg.Program("b")
    y = q.input("y", (2, 3))
    q.output(y + y)
    r = mg.Program("c")
    z = r.input("x", (3, 2))
    r.output(z + z)
    s = mg.Program("d")
    w = s.input("x", (2, 3))
    s.output(mg.sum(w, 1))
    for other, pat in ((q, "inputs differ"), (r, "shape"), (s, "output 0")):
        with pytest.raises(mg.InputError, match=pat) as e:
            verify.equivalent(p, other)
        assert "\n" not in str(e.value)


def test_identically_zero_divisor_is_reported():
    p = mg.Program("z")
    x, y = p.input("x", (2, 2)), p.input("y", (2, 2))
    p.output(x / (y - y))
    with pytest.raises(verify.ZeroDivisorDraw, match="identically zero"):
        verify.equivalent(p, p, seed=0, float_check=False)


def test_fingerprint():
    a = verify.fingerprint(program("gated_mlp", small=True))
    b = verify.fingerprint(reference("gated_mlp", small=True))
    assert a == b and len(a) == 32
    c = verify.fingerprint(EX.gqa_kernel(bug="no_division", **EX.SMALL))
    assert c != verify.fingerprint(GQA) == verify.fingerprint(EX.gqa_kernel(**EX.SMALL))
    assert verify.fingerprint(GQA, seed=1) != verify.fingerprint(GQA, seed=0)
    with pytest.raises(mg.NotLaxError):
        verify.fingerprint(_two_exps())


def test_mirage_primes_configurable_and_weaker():
    v = verify.equivalent(program("lora", small=True), reference("lora", small=True), field=MIRAGE, seed=0,
                          float_check=False)
    assert v.equivalent and (v.p, v.q) == (167, 83)
    strong = verify.per_test_bound(program("lora", small=True), reference("lora", small=True))[0]
    assert v.per_test_bound > 1000 * strong


def test_bound_values():
    eps, heur = verify.per_test_bound(program("gqa"), reference("gqa"))
    assert 0.01 < eps < 0.2 and not heur  # full-size gqa: k = 2·4096² exp terms vs q ≈ 2^30
    eps, heur = verify.per_test_bound(program("lora"), reference("lora"))
    assert eps < 1e-8 and not heur
    assert verify.per_test_bound(program("ntrans", small=True), reference("ntrans", small=True))[1]
    assert n_tests(0.5, 2 ** -40) == 40 and n_tests(1.0, 0.1) is None


def test_weak_bound_is_reported_not_hidden():
    v = verify.equivalent(GQA, EX.gqa_kernel(**EX.SMALL), field=MIRAGE, seed=0, max_tests=3, float_check=False)
    assert v.equivalent and not v.bound_met and v.tests == 3
    assert "not reached" in str(v)


def test_silu_inside_a_long_reduction_is_proven_by_atoms_not_overflowed():
    """silu(X @ W1) @ W2 with a 4096-long second reduction: for the classic analysis the
    common denominator has 2^4096 exp terms — past the float range — so its bound is 1 (it
    used to raise OverflowError from inside the analysis); every exponent is an element of
    the contraction X@W1, so the exponent-atom argument proves it (verify.bound.AtomMode)."""
    from verify.bound import pair_bound
    from verify.equivalence import make_plan, summarize
    from verify.family import DEFAULT

    p = mg.Program("silu_mlp")
    X = p.input("X", (16, 64), "float16")
    W1 = p.input("W1", (64, 4096), "float16")
    W2 = p.input("W2", (4096, 64), "float16")
    p.output(mg.silu(X @ W1) @ W2)
    plan = make_plan(p, p, DEFAULT)
    (o,), s = summarize(p, plan.primes)
    assert pair_bound(plan.primes, [o], [o], 2 * s.z) == 1.0
    eps, heur = verify.per_test_bound(p, p)
    assert eps < 2e-3 and not heur
    v = verify.equivalent(p, p, seed=0, float_check=False)
    assert v.equivalent and v.bound_met and v.argument == "exponent atoms" and not v.conjecture


def test_zero_divisor_in_dead_code_is_not_a_rejection():
    """x/(y−y) computed but unused: the real functions agree, so must the verdict."""
    p = mg.Program("p")
    x, y = p.input("x", (2, 2)), p.input("y", (2, 2))
    p.output(x + y)
    q = mg.Program("q")
    x, y = q.input("x", (2, 2)), q.input("y", (2, 2))
    _dead = x / (y - y)
    q.output(y + x)
    assert verify.equivalent(p, q, seed=0, float_check=False).equivalent
    assert verify.fingerprint(p) == verify.fingerprint(q)
    kg = mg.KernelGraph("k")
    X, Y = kg.input("x", (2, 2)), kg.input("y", (2, 2))
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=1)
    bx, by = bg.input(X, imap=(0,)), bg.input(Y, imap=(0,))
    _dead_tile = bx / (by - by)
    bg.output(bg.accum(bx + by), omap=(0,))
    bg.output(bg.accum(bx / (by - by)), omap=(0,))  # a dead saver of a live kernel
    out, _unused = kg.kernel(bg)
    kg.output(out)
    assert verify.equivalent(p, kg, seed=0, float_check=False).equivalent
