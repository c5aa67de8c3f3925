"""Builder composites — functions the catalog's ops express (sigmoid, tanh, GeLU's tanh
approximation): they match torch in float64, are Lax, and the verifier proves them against
other spellings and rejects near-misses, with no catalog entry of their own."""

from fractions import Fraction

import numpy as np
import pytest
import torch

import mugraph as mg
import verify

TORCH = {
    "sigmoid": (mg.sigmoid, torch.sigmoid),
    "tanh": (mg.tanh, torch.tanh),
    "gelu_tanh": (mg.gelu_tanh, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
}


def _program(fn, name="p"):
    p = mg.Program(name)
    p.output(fn(p.input("x", (4, 8), "float32")))
    return p


@pytest.mark.parametrize("name", sorted(TORCH))
def test_a_composite_matches_torch_in_float64_and_is_lax(name):
    ours, theirs = TORCH[name]
    p = _program(ours)
    mg.check_lax(p)
    assert {op.kind for op in p.ops} - {"input"} <= set(mg.CATALOG)  # built from catalog ops only
    x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    (got,) = mg.evaluate(p, {"x": x.numpy()})
    np.testing.assert_allclose(got, theirs(x).numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("a, b", [
    (mg.tanh, lambda x: (mg.exp(x) - mg.exp(-x)) / (mg.exp(x) + mg.exp(-x))),
    (mg.tanh, lambda x: mg.scale(mg.sigmoid(mg.scale(x, 2)), 2) - 1),
    (mg.sigmoid, lambda x: mg.silu(x) / x),
])
def test_composites_are_proven_against_other_spellings(a, b):
    v = verify.equivalent(_program(a, "a"), _program(b, "b"), seed=0)
    assert v.equivalent and v.bound_met, str(v)


@pytest.mark.parametrize("a, b", [
    (mg.tanh, lambda x: mg.scale(mg.sigmoid(x), 2) - 1),       # tanh(x) = 2σ(2x) − 1, not 2σ(x) − 1
    (mg.gelu_tanh, lambda x: x * mg.sigmoid(mg.scale(x, Fraction(8, 5)))),  # the "sigmoid GeLU": close, not equal
])
def test_near_misses_of_composites_are_rejected(a, b):
    v = verify.equivalent(_program(a, "a"), _program(b, "b"), seed=0, float_check=False)
    assert v.equivalent is False, str(v)
