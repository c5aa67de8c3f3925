"""The verifier's fast paths: shared draws (Reference), parts computed on demand,
devices, the float check's reused reference side and its exp, memory and thread scopes.
Each fast path must give exactly the answers of the plain one."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import mugraph as mg
import verify
import verify.field as F
from mugraph.core.benchmarks import program, reference
from mugraph.core.errors import ConfigError
from verify.equivalence import Reference, evaluate_field
from verify.family import DEFAULT
from verify.floatcheck import FloatReference, exp as fast_exp


def _pair(build, name="p"):
    p = mg.Program(name)
    x = p.input("x", (4, 16))
    w = p.input("w", (16, 8))
    p.output(build(x, w))
    return p


GQA_P, GQA_G = program("gqa", small=True), reference("gqa", small=True)


def _same_verdict(a: verify.Verdict, b: verify.Verdict) -> None:
    assert (a.equivalent, a.tests, a.p, a.q, a.failed_draws, a.error_bound, a.bound_met) == \
        (b.equivalent, b.tests, b.p, b.q, b.failed_draws, b.error_bound, b.bound_met)
    assert (a.counterexample is None) == (b.counterexample is None)
    if a.counterexample is not None:
        ca, cb = a.counterexample, b.counterexample
        assert (ca.output, ca.index, ca.reference_value, ca.candidate_value, ca.test) == \
            (cb.output, cb.index, cb.reference_value, cb.candidate_value, cb.test)


def test_reference_gives_the_verdicts_of_equivalent():
    """One Reference, several candidates (equivalent, wrong, wrong in the q-part only
    reachable through exp): the verdicts of one equivalent() call each, with the
    reference evaluated once per draw, not once per candidate."""
    p = _pair(lambda x, w: mg.exp(x @ w) * 2)
    good = _pair(lambda x, w: (mg.exp(x @ w) + mg.exp(x @ w)) * 2 / 2, "good")
    bad = _pair(lambda x, w: mg.exp(x @ w) * 2 + 2, "bad")
    bad_q = _pair(lambda x, w: mg.exp(x @ w + x @ w) * 2, "bad_q")  # same constants: one plan, one draw sequence
    ref = Reference(p, seed=11)
    many = ref.equivalent_many([good, bad, bad_q], float_check=False)
    for c, v in zip((good, bad, bad_q), many):
        _same_verdict(v, verify.equivalent(p, c, seed=11, float_check=False))
    assert [v.equivalent for v in many] == [True, False, False]
    assert ref.evaluations == many[0].tests  # shared by all three, one per draw
    again = ref.equivalent(good, float_check=False)
    _same_verdict(again, many[0])
    assert ref.evaluations == many[0].tests  # kept: the second pass evaluates nothing of the program


def test_reference_on_a_benchmark_with_the_float_check():
    ref = Reference(GQA_P, seed=3)
    v1 = ref.equivalent(GQA_G)
    v2 = verify.equivalent(GQA_P, GQA_G, seed=3)
    _same_verdict(v1, v2)
    assert v1.ok and v2.ok
    assert [c.rel_error for c in v1.float_check.cases] == [c.rel_error for c in v2.float_check.cases]
    assert [c.reference_rel_error for c in v1.float_check.cases] == \
        [c.reference_rel_error for c in v2.float_check.cases]


def test_draws_do_not_depend_on_the_candidate():
    """Draw k's primes, ω and residues are a function of (seed, k, plan): the same for a
    candidate that needs q-parts of more inputs, and the same drawn again."""
    p = _pair(lambda x, w: x @ w)
    c = _pair(lambda x, w: mg.exp(x) @ w * 0 + x @ w, "c")
    ref = Reference(p, seed=5, cache_bytes=0)  # nothing kept: drawn again each time
    plan = verify.equivalence.make_plan(p, c, DEFAULT)
    d = ref._draws_for(plan)
    a = d.inputs(2, p, frozenset())
    b = d.inputs(2, c, frozenset({"x"}))
    assert torch.equal(a["x"].xp, b["x"].xp) and torch.equal(a["w"].xp, b["w"].xp)
    assert a["x"].xq is None and callable(b["x"].xq)
    f, omega = d.field(2)
    assert d.field(2) == (f, omega) and d.field(3) != (f, omega)
    assert b["x"].xq().max() < f.q and a["x"].xp.max() < f.p


def test_identically_zero_divisor_raises_in_a_reference_too():
    p = _pair(lambda x, w: x @ w)
    c = _pair(lambda x, w: (x @ w) / (x @ w - x @ w) * 0 + x @ w, "c")
    with pytest.raises(verify.ZeroDivisorDraw, match="draws in a row"):
        Reference(p, seed=0).equivalent(c, float_check=False, max_failed_draws=4)


def test_the_p_part_under_an_exp_is_never_computed(monkeypatch):
    """exp reads only the q-part of its argument: the matmul's p-part is described,
    never computed (one GEMM per test instead of two); a fingerprint computes p-parts
    only, plus the q-parts an exp reads."""
    calls = []
    real = F.matmul_mod
    monkeypatch.setattr(F, "matmul_mod", lambda a, b, m: (calls.append(m), real(a, b, m))[1])
    p = _pair(lambda x, w: mg.exp(x @ w))
    f = F.MIRAGE
    ins = F.draw_inputs([("w", (16, 8), True), ("x", (4, 16), True)], f, np.random.default_rng(0))
    (out,) = evaluate_field(p, ins, f, F.random_omega(f, np.random.default_rng(1)), torch.device("cpu"))
    assert calls == [f.q] and len(out) == 1
    calls.clear()
    q = _pair(lambda x, w: x @ w + x @ w)
    verify.fingerprint(q)
    assert calls == [verify.equivalence.fingerprint_field(0).p] * 2  # the q-parts are not read by the hash


def test_realize_releases_intermediates_and_keeps_outputs():
    p = _pair(lambda x, w: mg.square(x @ w) + 1 * (x @ w))
    f = F.MIRAGE
    alg = F.FieldAlgebra(f, F.random_omega(f, np.random.default_rng(1)), deferred=True)
    ins = F.draw_inputs([("w", (16, 8), False), ("x", (4, 16), False)], f, np.random.default_rng(0))
    outs = mg.evaluate(p, ins, alg)
    (got,) = alg.realize(outs, release=True)
    computed = [x for x in alg.parts if x.order >= 0 and x.fn is None]
    assert computed and all(x.val is None for x in computed if x not in outs[0])
    want = mg.evaluate(p, ins, F.FieldAlgebra(f, alg.omega))[0]
    assert torch.equal(got[0], want[0])


def test_same_results_on_every_device_torch_has():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    verdicts = [verify.equivalent(GQA_P, GQA_G, seed=2, float_check=False, device=d) for d in devices]
    fps = [verify.fingerprint(GQA_G, device=d) for d in devices]
    for v in verdicts[1:]:
        _same_verdict(v, verdicts[0])
    assert len(set(fps)) == 1
    assert F.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", 3, "mps"])
def test_bad_devices_are_one_line_errors(bad):
    with pytest.raises(ConfigError) as e:
        verify.equivalent(GQA_P, GQA_G, device=bad)
    assert "\n" not in str(e.value) and "device" in str(e.value)


def test_missing_cuda_is_a_config_error():
    if torch.cuda.is_available():
        assert F.resolve_device("cuda").type == "cuda"
        return
    with pytest.raises(ConfigError, match="no CUDA device"):
        Reference(GQA_P, device="cuda")


def test_fast_exp_is_torch_exp_bit_for_bit():
    for dt in (torch.float32, torch.float64):
        pts = [torch.linspace(-900, 900, 300_001, dtype=torch.float64)]
        for c in (-746.0, -745.13, -708.4, -700.0, 700.0, 709.78, 710.0, -104.0, -103.97, -87.33, -80.0, 80.0,
                  88.72, 89.0):
            pts.append(torch.linspace(c - 1e-2, c + 1e-2, 2001, dtype=torch.float64))
        pts.append(torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0], dtype=torch.float64))
        x = torch.cat(pts).to(dt)
        a, b = torch.exp(x), fast_exp(x)
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))


def test_float_reference_draws_once_per_scale_and_keeps_case_results_without_draws(monkeypatch):
    import verify.floatcheck as FC

    drawn = []
    orig = FC.normal_inputs
    monkeypatch.setattr(FC, "normal_inputs",
                        lambda g, scale, seed, *dt: drawn.append(scale) or orig(g, scale, seed, *dt))
    fresh = [(c.rel_error, c.passed) for c in verify.float_check(GQA_P, GQA_G, seed=4).cases]
    assert drawn == [0.25, 1.0, 16.0]  # one draw per scale, rounded per dtype
    fr = FloatReference(GQA_P, seed=4)
    fr.budget = 0  # weights too large to keep: the draws are redone, the case results kept
    drawn.clear()
    for _ in range(2):
        got = verify.float_check(GQA_P, GQA_G, seed=4, prepared=fr)
        assert [(c.rel_error, c.passed) for c in got.cases] == fresh
    assert len(fr._cases) == 9 and not fr._draws and len(drawn) == 6
    kept = FloatReference(GQA_P, seed=4)
    drawn.clear()
    for _ in range(2):
        verify.float_check(GQA_P, GQA_G, seed=4, prepared=kept)
    assert len(kept._draws) == 3 and len(drawn) == 3  # within the budget: drawn once
    # no room for case results either: each case's program side is computed once per check
    evals = []
    orig_mag = FC.magnitudes
    monkeypatch.setattr(FC, "magnitudes", lambda *a, **k: evals.append(1) or orig_mag(*a, **k))
    verify.float_check(GQA_P, GQA_G, seed=4, prepared=FloatReference(GQA_P, seed=4))
    once = len(evals)  # 9 cases, and the non-negative retry of those whose reference overflows
    evals.clear()
    bare = FloatReference(GQA_P, seed=4, cache_bytes=0)
    got = verify.float_check(GQA_P, GQA_G, seed=4, prepared=bare)
    assert [(c.rel_error, c.passed) for c in got.cases] == fresh and len(evals) == once


def test_reference_gives_its_float_check_its_cache_budget():
    ref = Reference(GQA_P, seed=4, device="cpu", cache_bytes=12345)
    ref.equivalent(GQA_G)
    (fr,) = ref._float.values()
    assert fr.budget + sum(x.numel() * x.element_size() for d in fr._draws.values() for x in d.values()) == 12345


def test_float_reference_is_reused_and_gives_the_same_report():
    fr = FloatReference(GQA_P, seed=4)
    a = verify.float_check(GQA_P, GQA_G, seed=4, prepared=fr)
    b = verify.float_check(GQA_P, GQA_G, seed=4)
    key = [(c.rel_error, c.reference_rel_error, c.passed) for c in a.cases]
    assert key == [(c.rel_error, c.reference_rel_error, c.passed) for c in b.cases]
    assert len(fr._cases) == 9
    first = fr.case(0, "float16")
    verify.float_check(GQA_P, GQA_G, seed=4, prepared=fr)
    assert fr.case(0, "float16") is first  # kept, not recomputed
    # a prepared reference of another graph or seed is not used
    other = verify.float_check(GQA_P, GQA_G, seed=5, prepared=fr)
    assert [c.rel_error for c in other.cases] == [c.rel_error for c in verify.float_check(GQA_P, GQA_G, seed=5).cases]


def test_memory_and_thread_scopes_nest_and_restore():
    threads = torch.get_num_threads()
    with F.reuse_memory():
        with F.reuse_memory():
            x = torch.ones(1 << 23) * 2
        assert F._heap_depth == (1 if F._glibc() else 0)
    assert F._heap_depth == 0 and float(x.sum()) == 2 * (1 << 23)
    small = _pair(lambda x, w: x @ w)
    with F.eval_threads(small):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    big = mg.Program("big")
    big.output(big.input("x", (1024, 1024)) * 2)
    with F.eval_threads(small, big):
        assert torch.get_num_threads() == threads


def test_numpy_and_torch_helpers_agree():
    rng = np.random.default_rng(3)
    m = F.MAX_MODULUS - 1 if F.is_prime(F.MAX_MODULUS - 1) else 2147483629
    a, b = rng.integers(0, m, (2, 5, 300)), rng.integers(0, m, (300, 7))
    got_np = F.matmul_mod(a, b, m)
    got_t = F.matmul_mod(torch.from_numpy(a), torch.from_numpy(b), m)
    assert isinstance(got_np, np.ndarray) and torch.equal(torch.from_numpy(got_np), got_t)
    x = torch.from_numpy(rng.integers(1, m, 100))
    assert torch.equal(F.mulmod(x, F.inverse(x, m), m), torch.ones_like(x))
    assert F.const_mod(Fraction(3, 7), m) * 7 % m == 3


@pytest.mark.parametrize("name", ["gated_mlp", "gqa", "qknorm_gqa"])
def test_chunked_kernels_give_the_same_residues(name):
    """A μGraph whose kernel is evaluated in chunks of blocks (its whole grid past
    ``max_elements``) gets the residues of one whole evaluation, exactly, in the deferred
    algebra the verifier uses: how a 32-head, 2,048-row attention with 128×128 tiles is
    verified at all."""
    from mugraph.core.benchmarks import reference
    from mugraph.core.sizing import chunking, largest_value
    g = reference(name, small=True)
    limit = max(max(t.numel for op in g.ops for t in op.outputs), (largest_value(g)[0] + 1) // 2)
    assert chunking(g, limit)
    f = verify.equivalence.fingerprint_field(0)  # large enough that no divisor is 0 under this draw
    omega = F.random_omega(f, np.random.default_rng(1))
    ins = F.draw_inputs([(t.name, t.shape, True) for t in g.inputs], f, np.random.default_rng(0))
    outs = []
    for m in (limit, None):
        alg = F.FieldAlgebra(f, omega, deferred=True)
        vals = mg.evaluate(g, ins, alg, **({} if m is None else {"max_elements": m}))
        outs.append(alg.realize(vals))
    for a, b in zip(*outs):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_sliced_programs_give_the_same_residues():
    """A program evaluated in slices of its query rows (its score matrix past
    ``max_elements``) gets the residues of one whole evaluation, exactly: how an 8k-token
    prompt's program is verified and float-checked."""
    from mugraph.core.benchmarks import prefill_attention
    from mugraph.core.sizing import slicing
    p = prefill_attention(heads=4, q=64, kv=64, head_dim=8, causal=True, safe=False)
    limit = 64 * 64  # the mask (64, 64) whole, the (4, 64, 64) scores in slices
    assert slicing(p, limit).step < 64
    f = verify.equivalence.fingerprint_field(0)
    omega = F.random_omega(f, np.random.default_rng(1))
    ins = F.draw_inputs([(t.name, t.shape, True) for t in p.inputs], f, np.random.default_rng(0))
    outs = []
    for m in (limit, None):
        alg = F.FieldAlgebra(f, omega, deferred=True)
        outs.append(alg.realize(mg.evaluate(p, ins, alg, **({} if m is None else {"max_elements": m}))))
    for a, b in zip(*outs):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_sliced_programs_give_the_same_float_check_values():
    """The float check's algebras in slices: the magnitude algebra's (value, magnitude)
    pairs and the kernels' rounding (fp16 stores between ops) as in one evaluation."""
    from mugraph.core.benchmarks import prefill_attention
    from verify.floatcheck import KernelFloatAlgebra, MagnitudeAlgebra
    p = prefill_attention(heads=4, q=64, kv=64, head_dim=8, causal=True)
    limit = 64 * 64
    ins = {t.name: torch.randn(t.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
           for t in p.inputs}  # the mask drawn too, as the float check draws it
    for make in (MagnitudeAlgebra, lambda: KernelFloatAlgebra("float16")):
        whole = mg.evaluate(p, ins, make())
        sliced = mg.evaluate(p, ins, make(), max_elements=limit)
        for a, b in zip(whole, sliced):
            for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
