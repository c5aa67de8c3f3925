"""The exponent-atom argument (verify.bound.AtomMode, docs/design.md §4.6): where every
exponent is a constant times an input element or a whole contraction of two inputs, the
per-test bound counts degrees in independent roots of unity instead of exponent terms —
so a softmax over a long row and silu inside a long reduction are proven, without the
conjecture. Equivalent rewrites must pass; near-misses must fail; where the argument's
conditions do not hold it must not be used."""

from fractions import Fraction

import pytest

import mugraph as mg
import verify
from verify.equivalence import _bound, make_plan
from verify.family import DEFAULT


def _argument(a, b):
    bd = _bound(a, b, make_plan(a, b, DEFAULT))
    return bd.per_test, bd.argument


def _vocab(n: int, m: int = 4, name: str = "vocab_softmax"):
    p = mg.Program(name)
    X = p.input("X", (m, n), "float16")
    Y = p.input("Y", (m, n), "float16")
    E = mg.exp(X)
    p.output(mg.sum(E * Y, 1) / mg.sum(E, 1))
    return p


def _vocab_loop(n: int, m: int = 4, F: int = 4, tweak=None):
    """The same sum as one kernel: rows over the grid, the row in F chunks over the loop,
    numerator and denominator accumulated and divided after it."""
    kg = mg.KernelGraph("vocab_loop")
    X = kg.input("X", (m, n), "float16")
    Y = kg.input("Y", (m, n), "float16")
    bg = mg.BlockGraph(grid=(m, 1, 1), forloop=F)
    x = bg.input(X, imap=(0,), fmap=1)
    y = bg.input(Y, imap=(0,), fmap=1)
    e = mg.exp(x) if tweak is None else tweak(x, y)
    num = bg.accum(mg.sum(e * y, 1))
    den = bg.accum(mg.sum(e, 1))
    bg.output(num / den, omap=(0,))
    (out,) = kg.kernel(bg)
    kg.output(out)
    return kg


def _silu_mlp(K: int, m: int = 4, name="silu_mlp", inner=lambda h: h):
    p = mg.Program(name)
    X = p.input("X", (m, 8), "float16")
    W1 = p.input("W1", (8, K), "float16")
    W2 = p.input("W2", (K, 8), "float16")
    p.output(mg.silu(inner(X @ W1)) @ W2)
    return p


def test_a_vocabulary_softmax_is_proven_by_atoms():
    """32,000 logits: the classic count is ~10^9 exponents (bound 1); by atoms du = 2."""
    p = _vocab(32000, m=32)
    eps, argument = _argument(p, p)
    assert argument == "exponent atoms" and eps < 1e-5


def test_silu_in_a_long_reduction_is_proven_by_atoms():
    """silu(X@W1)@W2 over 4,096 columns: the classic count is 2^4096 (bound 1); a
    contraction atom per element of X@W1, du = 4096."""
    p = _silu_mlp(4096)
    eps, argument = _argument(p, p)
    assert argument == "exponent atoms" and eps < 5e-3
    v = verify.equivalent(p, _silu_mlp(4096, name="again"), seed=0, float_check=False)
    assert v.equivalent and v.bound_met and not v.conjecture and v.tests <= 6, str(v)


def test_the_fused_loop_of_a_vocabulary_softmax_is_proven():
    v = verify.equivalent(_vocab(2048), _vocab_loop(2048), seed=1, float_check=False)
    assert v.equivalent and v.bound_met and v.argument == "exponent atoms" and v.tests <= 4, str(v)


def _half(x):
    return mg.exp(mg.scale(x, Fraction(1, 2)))


EQUIVALENT = {
    # exp(2x) is an atom squared; with exp(x/2) beside it, κ = 1/2 and exp(x) is its square
    "exp_double": (lambda x: mg.exp(mg.scale(x, 2)), lambda x: mg.exp(x) * mg.exp(x)),
    "exp_half_squared": (lambda x: mg.exp(x), lambda x: _half(x) * _half(x)),
    "exp_neg": (lambda x: 1 / mg.exp(x), lambda x: mg.exp(-x)),
    "silu_def": (lambda x: mg.silu(x), lambda x: x / (1 + mg.exp(-x))),
    "transposed_view": (lambda x: mg.exp(x), lambda x: mg.transpose(mg.exp(mg.transpose(x, 0, 1)), 0, 1)),
}

DIFFERENT = {
    "exp_scale": (_half, lambda x: mg.exp(mg.scale(x, Fraction(1, 3)))),
    "exp_vs_product": (lambda x: mg.exp(mg.scale(x, 2)), lambda x: mg.exp(x) * x),
    "silu_sign": (lambda x: mg.silu(x), lambda x: x / (1 + mg.exp(x))),
    # row sums against column sums: the right atoms, summed over the wrong ones
    "wrong_dim": (lambda x: mg.sum(mg.exp(x), 1), lambda x: mg.transpose(mg.sum(mg.exp(x), 0), 0, 1)),
}


def _pair(fa, fb, shape=(4, 4)):
    a, b = mg.Program("a"), mg.Program("b")
    a.output(fa(a.input("x", shape, "float32")))
    b.output(fb(b.input("x", shape, "float32")))
    return a, b


@pytest.mark.parametrize("name", sorted(EQUIVALENT))
def test_equivalent_rewrites_pass(name):
    a, b = _pair(*EQUIVALENT[name])
    v = verify.equivalent(a, b, seed=2, float_check=False)
    assert v.equivalent and v.bound_met, str(v)


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_near_misses_fail(name):
    a, b = _pair(*DIFFERENT[name])
    v = verify.equivalent(a, b, seed=2, float_check=False)
    assert v.equivalent is False, str(v)


@pytest.mark.parametrize("tweak", [
    lambda x, y: mg.exp(y),                             # the weights' exps on the wrong input
    lambda x, y: mg.exp(mg.scale(x, Fraction(1, 2))),   # a scaled exponent
    lambda x, y: mg.exp(x) * x,                         # an extra factor
])
def test_near_misses_of_the_fused_loop_fail(tweak):
    v = verify.equivalent(_vocab(256), _vocab_loop(256, tweak=tweak), seed=3, float_check=False)
    assert v.equivalent is False, str(v)


def test_a_near_miss_in_a_long_silu_reduction_fails():
    v = verify.equivalent(_silu_mlp(4096), _silu_mlp(4096, name="b", inner=lambda h: mg.scale(h, Fraction(1025, 1024))),
                          seed=4, float_check=False)
    assert v.equivalent is False, str(v)


def test_the_argument_is_not_used_where_its_conditions_fail():
    """An exponent that is a sum (a norm, a mean) is no atom; a contraction with more rows
    than its summed length on both sides has no side to condition on; a free input that
    enters another atom breaks the independence: the classic bound applies to all three."""
    p = mg.Program("mean_shift")
    x = p.input("x", (4, 64), "float32")
    p.output(mg.sum(mg.exp(x - mg.mean(x, 1)), 1))
    assert _argument(p, p)[1] == "Li–Wu conjecture"

    wide = mg.Program("wide")
    a, b = wide.input("a", (64, 4), "float32"), wide.input("b", (4, 64), "float32")
    wide.output(mg.sum(mg.exp(a @ b), 1))
    assert _argument(wide, wide)[1] == "Li–Wu conjecture"

    shared = mg.Program("shared")
    X, W = shared.input("X", (2, 8), "float32"), shared.input("W", (8, 2), "float32")
    shared.output(mg.silu(X @ W))
    shared.output(mg.exp(W))
    assert _argument(shared, shared)[1] == "exponent atoms"  # W conditioned (2 columns of 8), X free
    shared.output(mg.exp(X))  # now neither input is free
    assert _argument(shared, shared)[1] == "Li–Wu conjecture"


def test_a_fixed_pair_takes_no_scaled_atoms():
    """With fixed primes κ might vanish mod q: only κ = 1 is accepted."""
    from verify.field import Field

    fld = Field(2147471759, 1073735879)
    a, b = _pair(_half, _half)
    assert _bound(a, b, make_plan(a, b, fld)).argument != "exponent atoms"
    a, b = _pair(mg.exp, mg.exp)
    assert _bound(a, b, make_plan(a, b, fld)).argument == "exponent atoms"


def _batched_scores(H: int, R: int, K: int, N: int, name: str = "heads", flat: bool = False, roll: bool = False):
    """``Σ_j exp(q_h·k_h)`` per row of each of ``H`` heads: ``q`` (H, R, K) against ``k``
    (H, K, N), a batched contraction (``flat``: the heads' rows stacked into one 2-D matmul
    against one key block, so every row meets every column; ``roll``: each head's rows
    against the next head's keys — a near-miss)."""
    p = mg.Program(name)
    q = p.input("q", (H, R, K), "float32")
    k = p.input("k", (H, K, N), "float32")
    v = p.input("v", (H, N, 4), "float32")
    if flat:
        s = mg.reshape(q, (H * R, K)) @ mg.reshape(mg.permute(k, (1, 0, 2)), (K, H * N))
        p.output(mg.sum(mg.exp(s), 1))
        return p
    if roll:
        k = mg.concat([mg.slice(k, 0, 1, H), mg.slice(k, 0, 0, 1)], 0)
    e = mg.exp(q @ k)
    p.output((e @ v) / mg.sum(e, 2))
    return p


def test_a_batched_contraction_is_conditioned_per_batch_slice():
    """Heads of R ≤ K rows each, H·R > K in all: a batched matmul pairs each head's rows with
    its own keys only, so each head's rows need to be independent, not all H·R of them
    (grouped-query attention over 8 tokens: 4 KV heads × 56 rows against d = 128). Stacked
    into one 2-D matmul every row meets every key: the classic bound applies there."""
    p = _batched_scores(4, 8, 16, 32)
    eps, argument = _argument(p, p)
    assert argument == "exponent atoms" and eps < 1e-6
    flat = _batched_scores(4, 8, 16, 32, flat=True)
    assert _argument(flat, flat)[1] == "Li–Wu conjecture"
    # a single head of more rows than K is still no atom
    tall = _batched_scores(1, 32, 16, 32)
    assert _argument(tall, tall)[1] == "Li–Wu conjecture"


def test_batched_attention_rewrites_are_proven_and_a_head_mismatch_is_rejected():
    """The scale moved onto q, and the softmax's division moved after the value matmul, are
    proven by atoms; pairing each head with the next head's keys is rejected."""
    H, R, K, N = 4, 8, 16, 32

    def attention(name, scale_first=False):
        p = mg.Program(name)
        q = p.input("q", (H, R, K), "float32")
        k = p.input("k", (H, K, N), "float32")
        v = p.input("v", (H, N, 4), "float32")
        mask = p.input("mask", (1, R, N), "float32")
        s = (mg.scale(q, 0.25) @ k) if scale_first else mg.scale(q @ k, 0.25)
        s = s + mask
        e = mg.exp(s - mg.max(s, 2))
        p.output((e / mg.sum(e, 2)) @ v if scale_first else (e @ v) / mg.sum(e, 2))
        return p

    v = verify.equivalent(attention("a"), attention("b", scale_first=True), seed=3, float_check=False)
    assert v.equivalent and v.bound_met and v.argument == "exponent atoms", str(v)
    bad = _batched_scores(H, R, K, N, roll=True)
    assert not verify.equivalent(_batched_scores(H, R, K, N), bad, seed=3, float_check=False).equivalent
