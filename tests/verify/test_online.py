"""Online softmax: accumulators over a monoid (docs/design.md §3.4). A block loops over
chunks of a row; each step shifts its scores by its own tile's max ``m_i``; a *rescaled*
accumulator keeps ``Σ_i x_i·exp(m_i − M)`` with ``M`` the running max, and a running-max
accumulator keeps ``M`` itself. The verifier proves the online form equal to the safe
softmax written whole, and the split (flash-decoding) form whose partials a second kernel
combines with the same accumulator; it rejects every form in which a rescale is missing,
misplaced or taken from the wrong shift."""

import numpy as np
import pytest

import mugraph as mg
import verify
from mugraph.core.errors import InvalidGraphError
from mugraph.core.serialize import graph_from_json, graph_to_json

from online_graphs import D, F, N, R
from online_graphs import online_softmax as _online
from online_graphs import whole_softmax as _program


def _split(chunks=2, rescale_combine=True):
    """Two kernels: the online kernel per chunk of the keys (one block each) writes its
    partial numerator, denominator and running max; the combine loops over the chunks
    with the same accumulators (``rescale_combine=False``: plain sums, the mistake)."""
    g = mg.KernelGraph("split")
    s, v = g.input("s", (R, N), "float32"), g.input("v", (N, D), "float32")
    steps = F // chunks
    b1 = mg.BlockGraph(grid=(chunks, 1, 1), forloop=steps)
    loop = steps > 1  # one step per block: no loop left to map
    st, vt = b1.input(s, (1, None, None), 1 if loop else None), b1.input(v, (0, None, None), 0 if loop else None)
    m = mg.max(st, 1)
    e = mg.exp(st - m)
    b1.output(b1.accum(e @ vt, m), (1, None, None))
    b1.output(b1.accum(mg.sum(e, 1), m), (1, None, None))
    b1.output(b1.accum_max(m), (1, None, None))
    num, den, mx = g.kernel(b1)  # (R, chunks·D), (R, chunks), (R, chunks)
    b2 = mg.BlockGraph(grid=(1, 1, 1), forloop=chunks)
    nt, dt, mt = (b2.input(t, (None, None, None), 1) for t in (num, den, mx))
    shift = mt if rescale_combine else None
    b2.output(b2.accum(nt, shift) / b2.accum(dt, shift), (None, None, None))
    (o,) = g.kernel(b2)
    g.output(o)
    return g


def _verdict(other):
    return verify.equivalent(_program(), other, seed=7, float_check=False)


def test_the_interpreter_runs_the_online_form_as_the_whole_softmax():
    rng = np.random.default_rng(0)
    x = {"s": rng.standard_normal((R, N)) * 30, "v": rng.standard_normal((N, D))}
    (ref,) = mg.evaluate(_program(), x)
    for g in (_online(), _split(), _split(chunks=4)):
        (got,) = mg.evaluate(g, x)
        assert np.abs(got - ref).max() < 1e-12, g.name


@pytest.mark.parametrize("name, graph", [
    ("the online form", lambda: _online()),
    ("the online form over 8 steps", lambda: _online(steps=8)),
    ("the split form, 2 chunks", lambda: _split()),
    ("the split form, 4 chunks", lambda: _split(chunks=4)),
])
def test_online_and_split_forms_are_proven(name, graph):
    g = graph()
    mg.check_lax(g)
    v = _verdict(g)
    assert v.equivalent and v.bound_met, f"{name}: {v}"


@pytest.mark.parametrize("name, graph", [
    ("a numerator accumulated without its rescale", lambda: _online(num="sum")),
    ("a denominator accumulated without its rescale", lambda: _online(den="sum")),
    ("a rescale by another tile's shift", lambda: _online(den="other")),
    ("a combine that forgets to rescale", lambda: _split(rescale_combine=False)),
])
def test_near_misses_are_rejected(name, graph):
    v = _verdict(graph())
    assert v.equivalent is False, f"{name}: {v}"


def test_a_result_that_reads_the_running_max_is_never_accepted():
    v = verify.equivalent(_program(), _online(post_max=True), seed=7)
    assert not v.equivalent


def test_the_ir_refuses_malformed_accumulators():
    g = mg.KernelGraph("bad")
    s = g.input("s", (R, N), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=F)
    st = bg.input(s, (None, None, None), 1)
    with pytest.raises(InvalidGraphError, match="does not broadcast"):
        bg.accum(mg.max(st, 1), mg.max(st, 0))
    a = bg.accum(st)
    with pytest.raises(InvalidGraphError, match="already downstream of an accumulator"):
        bg.accum(st, a)
    with pytest.raises(InvalidGraphError, match="already downstream of an accumulator"):
        bg.accum_max(a)


def test_online_graphs_round_trip_through_json():
    for g in (_online(), _split()):
        h = graph_from_json(graph_to_json(g))
        assert graph_to_json(h) == graph_to_json(g)
