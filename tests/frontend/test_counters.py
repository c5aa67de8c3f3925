"""Split-K counters kept by the caller: a piece whose kernels combine their partials in the
last program to finish takes an int32 ``counters`` argument it mutates and leaves zero, so
no call launches a kernel to zero them (``frontend.kernels.counter_slots``); the stitched
graph holds one buffer per operator, and eager calls keep one per operator and device."""

import numpy as np
import pytest
import torch

import lower
from lower import KernelConfig
from lower.runtime import TORCH_DTYPE
from mugraph.core.benchmarks import reference
from mugraph.core.interpreter import evaluate
from mugraph.frontend import from_torch
from mugraph.frontend import kernels
from mugraph.frontend.kernels import call, counter_slots, counters_of, make_op


def _program(split: int, combine: str):
    g = reference("rmsnorm_matmul", small=True)
    op = next(o for o in g.ops if o.kind == "graph_defined")
    return g, lower.compile(g, device="cpu", configs={op.id: KernelConfig(split=split, combine=combine)})


def _inputs(g, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen).to(TORCH_DTYPE[t.dtype]) for t in g.inputs]


def _expected(g, xs):
    outs = evaluate(g, {t.name: x.double().numpy() for t, x in zip(g.inputs, xs)})
    return [torch.from_numpy(np.asarray(o, dtype=np.float64)) for o in outs]


def test_a_last_combine_takes_counters_and_leaves_them_zero():
    g, prog = _program(2, "last")
    slots = counter_slots(prog)
    assert slots > 0
    op = make_op("test_counters_last", prog, "custom_op")
    assert counters_of(op) == slots
    for seed in range(3):  # the same counters serve every call
        xs = _inputs(g, seed)
        got = call(op, xs)
        want = _expected(g, xs)
        assert all(torch.allclose(a.double(), b, rtol=2e-2, atol=2e-2) for a, b in zip(got, want))
        kept = kernels._EAGER_COUNTERS[(op, xs[0].device)]
        assert kept.dtype == torch.int32 and kept.numel() == slots and not kept.any()
    # a kernel pair (combine="kernel") and a kernel without split-K need none: the plain signature
    for split, combine, name in ((2, "kernel", "test_counters_pair"), (1, "kernel", "test_counters_none")):
        g2, prog2 = _program(split, combine)
        assert counter_slots(prog2) == 0
        op2 = make_op(name, prog2, "custom_op")
        assert counters_of(op2) == 0 and len(op2(_inputs(g2, 0))) == len(g2.outputs)


def test_inductor_runs_the_operator_on_a_buffer_it_mutates():
    """Under ``torch.compile`` the counters are a module buffer the operator mutates:
    Inductor keeps the mutation, every call sees zeros, and the results are right."""
    g, prog = _program(2, "last")
    op = make_op("test_counters_inductor", prog, "custom_op")
    slots = counters_of(op)

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("counters", torch.zeros(slots, dtype=torch.int32))

        def forward(self, *xs):
            return op(list(xs), self.counters) * 2  # one output: a tensor, not a list

    m = M()
    f = torch.compile(m, backend="inductor", fullgraph=True)
    for seed in range(3):
        xs = _inputs(g, seed)
        assert torch.allclose(f(*xs).double(), _expected(g, xs)[0] * 2, rtol=2e-2, atol=2e-2)
        assert not m.counters.any()


def test_the_stitched_graph_passes_one_buffer_per_operator(monkeypatch):
    """``rewrite`` gives an operator that takes counters a zero buffer of the graph (one per
    operator, whichever pieces call it) as its second argument."""
    def f(x, w1, w2):  # two pieces of one program, a library op (cumsum) between them
        return torch.exp(torch.cumsum(torch.exp(x @ w1) * 2, dim=-1) @ w2) * 2

    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(4, 256, generator=gen), torch.randn(256, 256, generator=gen),
            torch.randn(256, 256, generator=gen)]
    cap = from_torch(f, *args)
    assert len(cap.pieces) == 2 and cap.pieces[0].name == cap.pieces[1].name
    seen = []

    def target(xs, counters):
        seen.append(counters)
        return [torch.exp(xs[0] @ xs[1]) * 2]

    monkeypatch.setitem(kernels._TAKES_COUNTERS, target, (8, False))  # 8 slots, outputs in a list
    gm = cap.stitched(lambda bp: target)
    out = gm(*args)
    assert torch.allclose(out[0] if isinstance(out, (list, tuple)) else out, f(*args), rtol=1e-5)
    assert len(seen) == 2 and seen[0] is seen[1]
    assert seen[0].dtype == torch.int32 and seen[0].shape == (8,) and not seen[0].any()
    assert sum(1 for n, _ in gm.named_buffers() if n.startswith("_mugraph_counters_")) == 1


@pytest.mark.parametrize("bad", [None, 3])
def test_counters_of_anything_else_is_zero(bad):
    assert counters_of(bad) == 0 and counters_of(lambda xs: xs) == 0 and counters_of([1]) == 0


def test_an_operator_of_two_outputs_returns_them_as_a_tuple_under_inductor():
    """A mutating operator cannot return a list: one of two outputs returns a tuple, which
    ``call`` hands back as a list and Inductor indexes; the counters stay the caller's."""
    import mugraph as mg
    from mugraph.frontend.kernels import register, returns_one

    p = mg.Program("two_outputs")
    x = p.input("x", (4, 8), dtype="float32")
    p.output(x * 2)
    p.output(x + 1)
    seen = []

    def run(xs, counters=None):
        seen.append(int(counters.sum()))  # the kernels would count up and reset; zero on entry
        return [xs[0] * 2, xs[0] + 1]

    op = register("test_counters_two_outputs", p, run, False, None, 4)
    assert counters_of(op) == 4 and not returns_one(op)
    a, b = call(op, [torch.ones(4, 8)])
    assert torch.equal(a, torch.full((4, 8), 2.0)) and torch.equal(b, torch.full((4, 8), 2.0))

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("counters", torch.zeros(4, dtype=torch.int32))

        def forward(self, x):
            two, one = op([x], self.counters)
            return two - one

    f = torch.compile(M(), backend="inductor", fullgraph=True)
    assert torch.equal(f(torch.ones(4, 8)), torch.zeros(4, 8)) and seen == [0, 0]


def test_an_operator_that_keeps_no_counters_mutates_nothing():
    """``make_op(..., keep_counters=False)`` (the backend's ``repeats_once``): the same
    last-combine kernels, their counters held by the operator itself, an operator whose schema
    mutates nothing — so a call of it can go into a subgraph of repeated layers — and the
    same results over repeated calls, so the kernels leave the operator's counters zero."""
    from mugraph.frontend.repeats import _writes

    g, prog = _program(2, "last")
    assert counter_slots(prog) > 0
    op = make_op("test_counters_zeroed", prog, "custom_op", keep_counters=False)
    assert counters_of(op) == 0 and not op._schema.is_mutable
    node = torch.fx.Graph().call_function(op, ([],))
    assert not _writes(node)
    for seed in range(2):
        xs = _inputs(g, seed)
        got, want = call(op, xs), _expected(g, xs)
        assert all(torch.allclose(a.double(), b, rtol=2e-2, atol=2e-2) for a, b in zip(got, want))
