"""A library matmul whose one reader is an add of a residual or bias runs as one cuBLAS
call (``addmm``/``baddbmm``): a decode step's projection plus its residual is one kernel,
as in PyTorch, instead of a product and an add (``lower.runtime.matmul_adds``)."""

import pytest
import torch

import lower
import mugraph as mg
from lower.torch_ops import matmul_adds
from mugraph.core.interpreter import evaluate


def _program(rows=3, k=32, n=16, residual=None, batch=None, also_output=False):
    p = mg.Program("proj")
    lead = (batch,) if batch else ()
    x, w = p.input("X", lead + (rows, k), "float32"), p.input("W", lead + (k, n), "float32")
    r = p.input("R", residual or lead + (rows, n), "float32")
    y = x @ w
    p.output(r + y)
    if also_output:
        p.output(y)
    return p


def _check(p):
    c = lower.compile(p, device="cpu")
    ins = {t.name: torch.randn(t.shape, dtype=torch.float32) for t in p.inputs}
    got = c(*ins.values())
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    refs = evaluate(p, {k: v.double() for k, v in ins.items()})
    for g, r in zip(got, refs):
        assert float((g.double() - r).abs().max()) < 1e-4
    return [s.name for s in c.steps]


@pytest.mark.parametrize("kw", [{}, {"residual": (1, 16)}, {"residual": (16,)}, {"batch": 2}])
def test_a_matmul_plus_residual_is_one_library_call(kw):
    p = _program(**kw)
    assert len(matmul_adds(p)) == 1
    assert _check(p) == ["add"]  # the add's step runs both


def test_a_matmul_read_elsewhere_stays_two_calls():
    p = _program(also_output=True)
    assert matmul_adds(p) == {}
    assert _check(p) == ["matmul", "add"]
