"""The whole-graph rule's outputs check (:mod:`mugraph.frontend.agreement`): a form of the graph
whose outputs are not torch.compile's — a NaN where it has a number, or far off — is refused
and the graph runs without its pieces, with one warning line."""

import math

import pytest
import torch

import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.frontend import kernels, recent_graphs, run
from mugraph.frontend.agreement import MAX_RELATIVE_ERROR, FormsDisagree, agreeing, disagreement

g = torch.Generator().manual_seed(11)
W = torch.randn(8, 8, generator=g)
#: a search that cannot fuse anything, the program lowered op by op anyway: the piece runs
#: lowered kernels (under the Triton interpreter)
QUICK = {"time_limit": 3.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower"}


def block(x):
    return torch.exp(x @ W) * 2


def test_outputs_within_rounding_agree():
    b = torch.randn(4, 8, generator=g)
    assert disagreement([b * (1 + 1e-3), (b.sum(), 3)], [b, (b.sum(), 3)]) is None


def test_a_nan_where_torch_has_a_number_disagrees_and_one_in_both_does_not():
    b = torch.randn(4, 8, generator=g)
    a = b.clone()
    a[1, 2] = math.nan
    assert "1 NaN or infinite values" in disagreement((b, a), (b, b))
    assert disagreement(a, a.clone()) is None  # torch's form has the NaN too: the model's own


def test_far_off_outputs_disagree_and_the_bound_is_relative():
    b = torch.randn(4, 8, generator=g, dtype=torch.float64) * 1e6
    assert disagreement(b * (1 + MAX_RELATIVE_ERROR / 2), b) is None
    why = disagreement(b * (1 + 2 * MAX_RELATIVE_ERROR), b)
    assert why is not None and "output 0 (4, 8) differs" in why


def test_other_shapes_or_counts_disagree():
    b = torch.randn(4, 8, generator=g)
    assert "shape (8, 4)" in disagreement(b.t(), b)
    assert "1 outputs where torch.compile's form gives 2" in disagreement([b], [b, b])


def test_the_timer_is_not_called_for_a_form_that_disagrees():
    calls = []
    timed = agreeing(lambda cap, launches: calls.append(cap) or {"mugraph": 1.0, "torch": 2.0})
    x = torch.ones(3)
    assert timed("c", {"mugraph": lambda: x, "torch": lambda: x}) == {"mugraph": 1.0, "torch": 2.0}
    with pytest.raises(FormsDisagree, match="NaN"):
        timed("d", {"mugraph": lambda: x * math.nan, "torch": lambda: x})
    assert calls == ["c"]


def _faster(piece, launches):
    """Reports every μGraph form faster, without looking at what the forms compute."""
    return {"mugraph": 1e-6, "torch": 3e-6}


@pytest.mark.parametrize("wrong, said", [(lambda o: o * math.nan, "NaN or infinite"),
                                         (lambda o: o * 3, "differs from torch.compile's")])
def test_a_graph_whose_pieces_compute_wrong_values_runs_without_them(piece_cache, mugraph_log, monkeypatch,
                                                                    wrong, said):
    """A piece's operator that returns wrong values (standing for a fault between the proven
    piece and the graph around it): the graph runs as torch.compile compiles it."""
    made = run.make_op

    def faulty(name, prog, kind, keep_counters=True):
        real = made(name, prog, kind, keep_counters)
        return kernels.register(f"{name}_wrong{len(said)}", prog.graph,
                                lambda xs: [wrong(o) for o in kernels.call(real, xs)], False, prog.output_strides)
    monkeypatch.setattr(run, "make_op", faulty)
    run.forget()  # no operator made by an earlier compile in this process, and none of these kept
    try:
        x = torch.randn(4, 8, generator=g)
        torch._dynamo.reset()
        f = torch.compile(block, backend="mugraph", options={**QUICK, "cache_dir": piece_cache, "timer": _faster,
                                                             "inductor": False})
        with torch.no_grad():
            y = f(x)
    finally:
        run.forget()
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    torch.testing.assert_close(y, block(x), rtol=1e-3, atol=1e-3)
    assert cap.kept and cap.whole["runs"] == "torch" and said in cap.whole["why"], cap.whole
    assert any("graph runs without its μGraph pieces: with them output 0" in m and said in m
               for m in mugraph_log.messages)
