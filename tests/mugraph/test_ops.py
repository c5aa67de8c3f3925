"""Every catalog op: its shape rule, and its float semantics against numpy/torch,
at the kernel level and inside a block graph."""

from fractions import Fraction

import numpy as np
import pytest
import torch

import mugraph as mg
from mugraph.core.algebra import FloatAlgebra
from mugraph.core.ops import CATALOG

RNG = np.random.default_rng(1)


def rnd(*shape, positive=False):
    x = RNG.standard_normal(shape)
    return np.abs(x) + 0.5 if positive else x


# (op, builder, input shapes, expected shape, numpy reference)
CASES = [
    ("matmul", lambda a, b: a @ b, [(3, 4), (4, 5)], (3, 5), lambda a, b: a @ b),
    ("matmul", mg.matmul, [(2, 3, 4), (4, 5)], (2, 3, 5), lambda a, b: a @ b),
    ("matmul", mg.matmul, [(2, 1, 3, 4), (5, 4, 6)], (2, 5, 3, 6), lambda a, b: a @ b),
    ("add", lambda a, b: a + b, [(3, 4), (4,)], (3, 4), np.add),
    ("add", mg.add, [(3, 1), (1, 4)], (3, 4), np.add),
    ("sub", lambda a, b: a - b, [(2, 3), (2, 3)], (2, 3), np.subtract),
    ("mul", lambda a, b: a * b, [(2, 3, 4), (3, 1)], (2, 3, 4), np.multiply),
    ("div", lambda a, b: a / b, [(2, 3), (2, 1)], (2, 3), np.divide),
    ("exp", mg.exp, [(2, 3)], (2, 3), np.exp),
    ("sqrt", mg.sqrt, [(2, 3)], (2, 3), np.sqrt),
    ("square", mg.square, [(4,)], (4,), np.square),
    ("silu", mg.silu, [(3, 3)], (3, 3), lambda x: x / (1 + np.exp(-x))),
    ("scale", lambda x: mg.scale(x, Fraction(3, 7)), [(2, 2)], (2, 2), lambda x: x * 3 / 7),
    ("scale", lambda x: x * 0.25, [(2, 2)], (2, 2), lambda x: x * 0.25),
    ("scale", lambda x: x / 4, [(2, 2)], (2, 2), lambda x: x / 4),
    ("scale", lambda x: -x, [(2, 2)], (2, 2), np.negative),
    ("const", lambda x: x + 1.5, [(2, 3)], (2, 3), lambda x: x + 1.5),
    ("const", lambda x: 2 - x, [(2, 3)], (2, 3), lambda x: 2 - x),
    ("const", lambda x: 1 / x, [(2, 3)], (2, 3), lambda x: 1 / x),
    ("sum", lambda x: mg.sum(x, 1), [(2, 3, 4)], (2, 1, 4), lambda x: x.sum(1, keepdims=True)),
    ("sum", lambda x: mg.sum(x, -1), [(2, 3)], (2, 1), lambda x: x.sum(-1, keepdims=True)),
    ("max", lambda x: mg.max(x, 0), [(2, 3)], (1, 3), lambda x: x.max(0, keepdims=True)),
    ("concat", lambda a, b: mg.concat([a, b], 1), [(2, 3), (2, 5)], (2, 8), lambda a, b: np.concatenate([a, b], 1)),
    ("reshape", lambda x: mg.reshape(x, (3, 8)), [(2, 3, 4)], (3, 8), lambda x: x.reshape(3, 8)),
    ("repeat", lambda x: mg.repeat(x, (2, 1)), [(2, 3)], (4, 3), lambda x: np.tile(x, (2, 1))),
    ("permute", lambda x: mg.permute(x, (2, 0, 1)), [(2, 3, 4)], (4, 2, 3), lambda x: x.transpose(2, 0, 1)),
    ("permute", lambda x: mg.transpose(x, -1, 0), [(2, 3, 4)], (4, 3, 2), lambda x: x.transpose(2, 1, 0)),
    ("permute", lambda a, b: mg.transpose(a, 0, 1) @ b, [(5, 3), (5, 2)], (3, 2), lambda a, b: a.T @ b),
    ("slice", lambda x: mg.slice(x, 1, 1, 3), [(2, 4, 3)], (2, 2, 3), lambda x: x[:, 1:3]),
    ("slice", lambda x: mg.slice(x, -1, -5, 7, 2) * 2, [(3, 8)], (3, 2), lambda x: x[:, 3:7:2] * 2),
    ("mean", lambda x: mg.mean(x, 1), [(2, 6)], (2, 1), lambda x: x.mean(1, keepdims=True)),
    ("rms_norm", lambda x: mg.rms_norm(x), [(3, 8)], (3, 8),
     lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True))),
]
POSITIVE = {"sqrt", "div", "rms_norm"}


@pytest.mark.parametrize("name,build,shapes,expected,ref", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_kernel_level_shape_and_value(name, build, shapes, expected, ref):
    p = mg.Program(name)
    ins = [p.input(f"x{i}", s) for i, s in enumerate(shapes)]
    out = build(*ins)
    assert out.shape == expected
    p.output(out)
    vals = {f"x{i}": rnd(*s, positive=name in POSITIVE or name == "const") for i, s in enumerate(shapes)}
    (got,) = mg.evaluate(p, vals)
    np.testing.assert_allclose(got, ref(*vals.values()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,build,shapes,expected,ref", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_block_level_matches_kernel_level(name, build, shapes, expected, ref):
    """The same op inside a block graph, with a grid of 2 over a new leading dim of
    every input: each block computes the op on its slice (a single block where that
    dim would exceed rank 4). Ops of the kernel level only (a slice) are refused there."""
    if name in CATALOG and "B" not in CATALOG[name].levels:
        p = mg.KernelGraph(name)
        bg = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
        tiles = [bg.input(p.input(f"x{i}", s)) for i, s in enumerate(shapes)]
        with pytest.raises(mg.UnsupportedOpError, match=f"{name} .*not available in a BlockGraph"):
            build(*tiles)
        return
    g = 2 if max(map(len, shapes + [expected])) < 4 else 1
    kg = mg.KernelGraph(name)
    ins = [kg.input(f"x{i}", (g,) + s if g > 1 else s) for i, s in enumerate(shapes)]
    bg = mg.BlockGraph(grid=(g, 1, 1), forloop=1)
    if g > 1:
        tiles = [mg.reshape(bg.input(t, imap=(0,)), s) for t, s in zip(ins, shapes)]
    else:
        tiles = [bg.input(t) for t in ins]
    out = build(*tiles)
    assert out.shape == expected
    if g > 1:
        out = mg.reshape(out, (1,) + expected)
    bg.output(bg.accum(out), omap=(0 if g > 1 else None,))
    (y,) = kg.kernel(bg)
    kg.output(y)
    vals = {f"x{i}": rnd(*(((g,) if g > 1 else ()) + s), positive=name in POSITIVE or name == "const")
            for i, s in enumerate(shapes)}
    (got,) = mg.evaluate(kg, vals)
    if g > 1:
        want = np.stack([ref(*(v[j] for v in vals.values())) for j in range(g)])
    else:
        want = ref(*vals.values())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_every_catalog_op_is_tested():
    """(every facet row of every op: tests/mugraph/test_catalog.py)"""
    tested = {c[0] for c in CASES}
    assert set(CATALOG) <= tested


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("float16", 2e-3), ("bfloat16", 1.6e-2)])
def test_low_precision_storage(dtype, tol):
    """Lower-precision algebras store in the dtype and compute in fp32."""
    p = mg.Program("mm")
    a, b = p.input("a", (16, 64)), p.input("b", (64, 8))
    p.output(mg.silu(a @ b))
    vals = {"a": rnd(16, 64), "b": rnd(64, 8)}
    (ref,) = mg.evaluate(p, vals)
    (got,) = mg.evaluate(p, vals, algebra=FloatAlgebra(dtype))
    assert got.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    rel = np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert 0 < rel < tol


def test_torch_inputs_give_torch_outputs():
    p = mg.Program("t")
    a = p.input("a", (2, 3))
    p.output(mg.exp(a))
    x = torch.randn(2, 3, dtype=torch.float64)
    (y,) = mg.evaluate(p, {"a": x})
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.exp(x))


def test_scalars_are_exact_rationals():
    p = mg.Program("s")
    a = p.input("a", (2,))
    y = a * 0.1
    assert y.op.kind == "scale" and y.op.attrs["c"] == Fraction(1, 10)
    z = mg.rms_norm(mg.reshape(a, (1, 2)))
    sc = [op for op in p.ops if op.kind == "scale"][-1]
    assert sc.attrs["c"] == Fraction(1, 2)
    assert z.shape == (1, 2)
