"""Small CPU tensors take numpy paths (exponentiation, the ω tables) to cut per-op cost;
the residues must be the same whichever path runs."""

import numpy as np
import pytest
import torch

import verify.field as F
from mugraph.core.benchmarks import REFERENCES, reference
from verify.analysis import inputs_needing_q, live_graph
from verify.equivalence import evaluate_field
from verify.family import DEFAULT
from mugraph.core.errors import ShapeError
from mugraph.core.oprules import broadcast_shapes
from verify.field import Field, PowTable, draw_inputs, pow_fixed, random_omega
from verify.fuzz import corpus_graph

LARGEST = Field(2147471759, 1073735879, "largest")


@pytest.mark.parametrize("e", [0, 1, 2, 3, LARGEST.p - 2, (LARGEST.p + 1) // 4, (1 << 40) + 12345])
def test_pow_fixed_numpy_and_torch_paths_agree(e, monkeypatch):
    rng = np.random.default_rng(e % 1000)
    x = torch.from_numpy(rng.integers(0, LARGEST.p, 3000))
    x[:3] = torch.tensor([0, 1, LARGEST.p - 1])
    small = pow_fixed(x, e, LARGEST.p)  # 3000 < SMALL_POW: numpy
    monkeypatch.setattr(F, "SMALL_POW", 0)
    large = pow_fixed(x, e, LARGEST.p)  # torch
    assert small.dtype == large.dtype == torch.int64
    assert torch.equal(small, large)
    assert [int(v) for v in small[:50]] == [pow(int(v), e, LARGEST.p) for v in x[:50]]
    monkeypatch.undo()
    assert int(pow_fixed(x[5], e, LARGEST.p)) == pow(int(x[5]), e, LARGEST.p)  # a 0-d tensor
    t = x[:12].view(3, 4).t()  # a strided view
    assert torch.equal(pow_fixed(t, e, LARGEST.p), small[:12].view(3, 4).t())


def test_pow_table_built_in_numpy_is_the_powers_of_omega():
    w = random_omega(LARGEST, np.random.default_rng(3))
    t = PowTable(w, LARGEST.p, LARGEST.q)
    assert all(tab.dtype == torch.int64 for tab in t.tables)
    for j in (0, 1, 2, 12345, (1 << 15) - 1):
        assert int(t.tables[0][j]) == pow(w, j, LARGEST.p)
        assert int(t.tables[1][j]) == pow(w, j << 15, LARGEST.p)


def test_the_field_arithmetics_broadcast_is_numpys():
    for a, b in [((2, 1, 3), (4, 3)), ((), (5,)), ((1,), (1, 1)), ((7, 1), (1, 6))]:
        assert broadcast_shapes(a, b) == np.broadcast_shapes(a, b)
    with pytest.raises(ShapeError):
        broadcast_shapes((2, 3), (4, 3))


def _outputs(g, seed):
    fld = DEFAULT.draw(np.random.default_rng(seed))
    omega = random_omega(fld, np.random.default_rng(seed + 1))
    need_q = inputs_needing_q(g)
    specs = [(t.name, tuple(t.shape), t.name in need_q) for t in sorted(g.inputs, key=lambda t: t.name)]
    ins = draw_inputs(specs, fld, np.random.default_rng(seed + 2))
    return evaluate_field(live_graph(g), ins, fld, omega, torch.device("cpu"))


def test_random_graphs_give_the_same_residues_on_both_paths(monkeypatch):
    """The fuzz corpus (references, random programs and μGraphs, sqrt, large parts)
    evaluated with the numpy paths and with torch everywhere: identical residues."""
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    rng = np.random.default_rng(17)
    graphs = [corpus_graph(i, rng, refs) for i in range(18)]
    first = []
    for i, g in enumerate(graphs):
        try:
            first.append(_outputs(g, i))
        except F.ZeroDivisorDraw:
            first.append(None)
    monkeypatch.setattr(F, "SMALL_POW", 0)
    compared = 0
    for i, g in enumerate(graphs):
        try:
            second = _outputs(g, i)
        except F.ZeroDivisorDraw:
            assert first[i] is None
            continue
        for x, y in zip(first[i], second):
            assert all(torch.equal(u, v) for u, v in zip(x, y))
        compared += 1
    assert compared >= 12
