"""No false rejections: a corpus of equivalent pairs (each A_eq axiom of docs/design.md §5.2 on
tensors, the rewrites the search relies on, and every hand-written reference
μGraph against its program) must pass with the error bound reached."""

from fractions import Fraction

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks import REFERENCES, program, reference
from verify.fuzz import random_program, rewrite


def _pair(name, shapes, build_a, build_b):
    """Two programs over the same inputs, built by ``build_a``/``build_b``."""
    out = []
    for build in (build_a, build_b):
        p = mg.Program(name)
        xs = [p.input(n, s, "float32") for n, s in shapes.items()]
        p.output(build(*xs))
        out.append(p)
    return tuple(out)


def _loop_matmul(m=4, k=8, n=3, F=4):
    """Split reduction: X@W with the K dim walked by a 4-iteration loop."""
    kg = mg.KernelGraph("split_k")
    X = kg.input("x", (m, k), "float32")
    W = kg.input("w", (k, n), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=F)
    x, w = bg.input(X, fmap=1), bg.input(W, fmap=0)
    bg.output(bg.accum(x @ w))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def _loop_expsum(m=4, k=8, F=2):
    kg = mg.KernelGraph("split_expsum")
    X = kg.input("x", (m, k), "float32")
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=F)
    x = bg.input(X, imap=(0,), fmap=1)
    bg.output(bg.accum(mg.sum(mg.exp(x), 1)), omap=(0,))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


S2 = {"x": (4, 5), "y": (4, 5), "z": (4, 5)}
PAIRS = {
    # A_eq axioms
    "add_comm": (S2, lambda x, y, z: x + y, lambda x, y, z: y + x),
    "add_assoc": (S2, lambda x, y, z: (x + y) + z, lambda x, y, z: x + (y + z)),
    "mul_comm": (S2, lambda x, y, z: x * y, lambda x, y, z: y * x),
    "mul_assoc": (S2, lambda x, y, z: (x * y) * z, lambda x, y, z: x * (y * z)),
    "distrib": (S2, lambda x, y, z: x * (y + z), lambda x, y, z: x * y + x * z),
    "div_div": (S2, lambda x, y, z: (x / y) / z, lambda x, y, z: x / (y * z)),
    "mul_div": (S2, lambda x, y, z: x * (y / z), lambda x, y, z: (x * y) / z),
    "add_div": (S2, lambda x, y, z: x / z + y / z, lambda x, y, z: (x + y) / z),
    "sum_1": ({"x": (4, 1)}, lambda x: mg.sum(x, 1), lambda x: x + 0),
    "sum_sum": ({"x": (2, 3, 4)}, lambda x: mg.sum(mg.sum(x, 2), 1),
                lambda x: mg.reshape(mg.sum(mg.reshape(x, (2, 12)), 1), (2, 1, 1))),
    "sum_add": ({"x": (3, 6), "y": (3, 6)}, lambda x, y: mg.sum(x + y, 1),
                lambda x, y: mg.sum(x, 1) + mg.sum(y, 1)),
    "sum_mul": ({"x": (3, 6), "y": (3, 1)}, lambda x, y: mg.sum(x * y, 1), lambda x, y: mg.sum(x, 1) * y),
    "sum_div": ({"x": (3, 6), "y": (3, 1)}, lambda x, y: mg.sum(x / y, 1), lambda x, y: mg.sum(x, 1) / y),
    "exp_mul": ({"a": (3, 4), "b": (3, 4)}, lambda a, b: mg.exp(a) * mg.exp(b), lambda a, b: mg.exp(a + b)),
    "sqrt_mul": ({"a": (3, 4), "b": (3, 4)}, lambda a, b: mg.sqrt(a) * mg.sqrt(b), lambda a, b: mg.sqrt(a * b)),
    # attention and normalization rewrites
    "softmax_defer": ({"q": (2, 4, 3), "k": (2, 3, 8), "v": (2, 8, 3)},
                      lambda q, k, v: (mg.exp(q @ k) / mg.sum(mg.exp(q @ k), 2)) @ v,
                      lambda q, k, v: (mg.exp(q @ k) @ v) / mg.sum(mg.exp(q @ k), 2)),
    "norm_defer": ({"x": (4, 6), "r": (4, 1), "w": (6, 5)}, lambda x, r, w: (x / r) @ w,
                   lambda x, r, w: (x @ w) / r),
    "lora_concat": ({"x": (4, 6), "w": (6, 5), "a": (6, 2), "b": (2, 5)},
                    lambda x, w, a, b: x @ w + (x @ a) @ b,
                    lambda x, w, a, b: mg.concat([x, x @ a], 1) @ mg.concat([w, b], 0)),
    "split_sum": ({"x": (3, 8)}, lambda x: mg.sum(x, 1),
                  lambda x: mg.reshape(mg.sum(mg.sum(mg.reshape(x, (3, 2, 4)), 2), 1), (3, 1))),
    "matmul_assoc": ({"a": (3, 4), "b": (4, 5), "c": (5, 2)}, lambda a, b, c: (a @ b) @ c,
                     lambda a, b, c: a @ (b @ c)),
    "matmul_distrib": ({"a": (3, 4), "b": (4, 5), "c": (4, 5)}, lambda a, b, c: a @ (b + c),
                       lambda a, b, c: a @ b + a @ c),
    "sub_neg": (S2, lambda x, y, z: x - y, lambda x, y, z: x + mg.scale(y, -1)),
    "square_mul": (S2, lambda x, y, z: mg.square(x), lambda x, y, z: x * x),
    "scale_compose": (S2, lambda x, y, z: mg.scale(mg.scale(x, 2), Fraction(1, 3)),
                      lambda x, y, z: mg.scale(x, Fraction(2, 3))),
    "repeat_concat": ({"x": (2, 3)}, lambda x: mg.concat([x, x], 0), lambda x: mg.repeat(x, (2, 1))),
    "silu_expand": ({"x": (3, 4)}, lambda x: mg.silu(x), lambda x: x / (mg.exp(mg.scale(x, -1)) + 1)),
    "mean_scale": ({"x": (3, 8)}, lambda x: mg.mean(x, 1), lambda x: mg.sum(x, 1) * Fraction(1, 8)),
    "rms_inverse": ({"x": (3, 8)}, lambda x: mg.rms_norm(x, 1),
                    lambda x: x * (1 / mg.sqrt(mg.mean(mg.square(x), 1)))),
    "exp_scale_const": ({"x": (3, 4)}, lambda x: mg.exp(x * 2), lambda x: mg.exp(x) * mg.exp(x)),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_equivalent_pair(name):
    shapes, fa, fb = PAIRS[name]
    a, b = _pair(name, shapes, fa, fb)
    v = verify.equivalent(a, b, seed=7, float_check=False)
    assert v.equivalent is True and v.bound_met and v.error_bound <= 2 ** -40, str(v)


def test_split_reduction_loop_matmul():
    p = mg.Program("mm")
    x, w = p.input("x", (4, 8), "float32"), p.input("w", (8, 3), "float32")
    p.output(x @ w)
    assert verify.equivalent(p, _loop_matmul(), seed=1, float_check=False).equivalent


def test_split_reduction_loop_expsum():
    p = mg.Program("es")
    x = p.input("x", (4, 8), "float32")
    p.output(mg.sum(mg.exp(x), 1))
    v = verify.equivalent(p, _loop_expsum(), seed=1, float_check=False)
    # every exponent is an input element: the exponent-atom argument, no conjecture
    assert v.equivalent and v.bound_met and not v.conjecture and v.argument == "exponent atoms"


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_reference_ugraph_matches_its_program(name):
    v = verify.equivalent(program(name, small=True), reference(name, small=True), seed=3)
    assert v.equivalent is True and v.bound_met, str(v)
    assert v.float_check is not None and v.float_check.passed, str(v)


def test_reference_batch_8_gqa():
    v = verify.equivalent(program("gqa", b=8, small=True), reference("gqa", b=8, small=True), seed=4,
                          float_check=False)
    assert v.equivalent and v.bound_met


@pytest.mark.parametrize("seed", range(6))
def test_random_program_vs_rewrite(seed):
    p = random_program(seed, max_ops=8)
    q = rewrite(p, seed, steps=3)
    v = verify.equivalent(p, q, seed=seed, float_check=False)
    assert v.equivalent, str(v)


def test_corpus_is_large_enough():
    n = len(PAIRS) + 2 + len(REFERENCES) + 1 + 6
    assert n >= 30
