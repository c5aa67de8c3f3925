"""Slices in captured code (docs/design.md §10.2): ``x[..., a:b]``, ``narrow``, ``split``,
``select`` map to the catalog's ``slice``; one inside a piece no longer cuts it, one of a
piece's input is a view at its boundary (the piece reads the window in place)."""

import torch

import mugraph as mg
from mugraph.frontend import from_torch

aten = torch.ops.aten
g = torch.Generator().manual_seed(7)


def r(*shape):
    return torch.randn(*shape, generator=g)


def fused_qkv(x, w):
    """A fused QKV projection split into its three parts (as GPT-2 or Phi-3 write it)."""
    q, k, v = (x @ w).split(16, dim=-1)
    return torch.exp(q * 0.25) * k + v


def split_exp(x, w):
    """Slices of a computed value that is not a projection's product: they stay in the piece."""
    q, k, v = torch.exp((x @ w) * 0.25).split(16, dim=-1)
    return q * k + v


def test_slices_of_a_computed_value_stay_inside_the_piece():
    xs = r(4, 16), r(16, 48)
    cap = from_torch(split_exp, *xs)
    (bp,) = cap.pieces
    kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
    assert kinds.count("slice") == 3 and kinds.count("matmul") == 1
    assert not cap.library  # nothing cut out: the slices are in the piece
    mg.check_lax(bp.program)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), split_exp(*[x.double() for x in xs]))


def test_slices_of_a_projection_are_projections_by_weight_slices():
    """``(x @ W)[..., a:b]`` is ``x @ W[:, a:b]`` (design §10.1): the fused QKV's three parts
    are three projections, each reading its columns of W in place."""
    xs = r(4, 16), r(16, 48)
    cap = from_torch(fused_qkv, *xs, max_piece_matmuls=None)
    (bp,) = cap.pieces
    kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
    assert "slice" not in kinds and kinds.count("matmul") == 3
    assert [n.target for n in cap.library] == [aten.slice.Tensor] * 3 and set(bp.strided.values()) == {(48, 1)}
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fused_qkv(*[x.double() for x in xs]))


def test_a_slice_of_an_input_is_read_in_place():
    def fn(x, w):
        return torch.exp(x[:, 4:12] @ w[2:10, ::2]) * 2
    xs = r(4, 16), r(12, 6)
    cap = from_torch(fn, *xs)
    (bp,) = cap.pieces
    assert [op.kind for op in bp.program.ops if op.kind != "input"] == ["matmul", "exp", "scale"]
    assert {n.target for n in bp.piece.views} == {aten.slice.Tensor}
    assert bp.strided == {"x0": (16, 1), "x1": (6, 2)}
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def test_a_piece_with_slices_runs_lowered_under_the_backend(piece_cache):
    import mugraph.frontend  # noqa: F401 - registers the backend
    from mugraph.frontend.backend import recent_graphs

    def fn(x, w):
        return split_exp(x[:, 1:], w)
    x, w = r(4, 17), r(16, 48)
    torch._dynamo.reset()
    with torch.no_grad():
        f = torch.compile(fn, backend="mugraph", options={
            "time_limit": 3.0, "cache_dir": piece_cache, "unfused": "lower",
            "search": {"max_kernel_ops": 1, "max_block_ops": 1}})
        y = f(x, w)
    torch.testing.assert_close(y, fn(x, w), atol=1e-5, rtol=1e-5)
    cap = list(recent_graphs()[-1].captured.values())[0]
    (bp,) = cap.kept
    assert sum(op.kind == "slice" for op in bp.program.ops) == 3 and bp.strided == {"x0": (17, 1)}


def _three_parts(x, w):
    """A fused projection whose three parts meet again, each first through its own chain."""
    q, k, v = (x @ w).split(16, dim=-1)
    return (torch.exp(q * 0.25) * 2 + 1) * (torch.sigmoid(k) * 3 - 1) + torch.tanh(v)


def _mms(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == aten.mm.default]


def test_projections_left_to_torch_join_again():
    """Where no piece reading a weight slice runs a μGraph, the stitched graph runs the fused
    projection once and cuts its product (one library matmul, not one per slice); where a
    kept piece reads the middle slice, the two outer ones are not joined (a gap: joined, they
    would read the middle columns again). Both equal the function."""
    from mugraph.frontend.pieces import torch_module

    xs = r(4, 16), r(16, 48)
    cap = from_torch(_three_parts, *xs, max_piece_matmuls=1)
    assert len(_mms(cap.graph_module)) == 3  # the capture's fold: one projection per slice
    plain = cap.stitched(lambda bp: None, [])
    (mm,) = _mms(plain)
    assert mm.args[1].op == "placeholder"  # the whole weight, not a slice of it
    want = _three_parts(*xs)
    torch.testing.assert_close(plain(*xs), want)
    middle = [bp for bp in cap.pieces if any(n.target == aten.sigmoid.default for n in bp.piece.nodes)]
    assert len(middle) == 1 and sum(n.target == aten.mm.default for n in middle[0].piece.nodes) == 1
    own = torch_module(middle[0])
    kept = cap.stitched(lambda bp: lambda xs: list(own(*xs)), middle)
    assert len(_mms(kept)) == 2  # q's and v's projections stay apart
    torch.testing.assert_close(kept(*xs), want)


def test_parts_of_a_product_that_meet_again_stay_in_its_piece():
    """Row halves of a product multiplied together meet again: their slices stay inside the
    piece (run as its program, as any slice of a computed value), not cut out as views."""
    def fn(x, w):
        a, b = (x @ w).chunk(2, 0)
        return a * b + 1
    xs = r(4, 16), r(16, 8)
    cap = from_torch(fn, *xs)
    (bp,) = cap.pieces
    kinds = [op.kind for op in bp.program.ops]
    assert kinds.count("slice") == 2 and kinds.count("matmul") == 1
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def _read_apart(x, w):
    """A fused projection's parts read apart (q, k, v: one each to its own use), cut by
    slicing as Phi-3 writes it."""
    y = x @ w
    q, k, v = y[..., :16], y[..., 16:32], y[..., 32:]
    return q * 0.25 + 1, k * 3 - 1, v.cumsum(0)


def test_parts_read_apart_stay_slices_of_one_product():
    """Parts that never meet again stay slices of the one product (no projection per part),
    and the slices, covering it, are torch views outside every piece: the RMSNorm's piece
    writes the whole product (Phi-3-mini's fused q, k, v behind its norm) — even where no
    size limit cuts the piece, which would otherwise grow through the slices."""
    def fn(x, g, w):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
        return _read_apart(h, w)
    xs = r(4, 16), r(16), r(16, 48)
    cap = from_torch(fn, *xs, max_piece_ops=None)
    assert len(_mms(cap.graph_module)) == 1
    (norm,) = [bp for bp in cap.pieces if any(n.target == aten.mm.default for n in bp.piece.nodes)]
    kinds = [op.kind for op in norm.program.ops]
    assert "slice" not in kinds and kinds.count("matmul") == 1 and "square" in kinds
    assert [tuple(o.shape) for o in norm.program.outputs] == [(4, 48)]
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def _two_parts_read_by_a_piece(rows):
    """x @ W[:, :16] and x @ W[:, 16:] as torch code, both read by a piece's call."""
    from mugraph.frontend.capture import PIECE_CALL

    x, w = r(rows, 8), r(8, 32)
    gr = torch.fx.Graph()
    px, pw = gr.placeholder("x"), gr.placeholder("w")
    px.meta["val"], pw.meta["val"] = x, w
    parts = []
    for a, b in ((0, 16), (16, 32)):
        ws = gr.call_function(aten.slice.Tensor, (pw, 1, a, b))
        ws.meta["val"] = w[:, a:b]
        m = gr.call_function(aten.mm.default, (px, ws))
        m.meta["val"] = x @ w[:, a:b]
        parts.append(m)
    call = gr.call_function(torch.add, tuple(parts))
    call.meta[PIECE_CALL] = "piece_test"
    gr.output(call)
    return torch.fx.GraphModule(torch.nn.Module(), gr), x, w


def test_parts_a_kept_piece_reads_stay_apart_unless_one_row():
    """A kept piece reading the parts of a product of several rows would get column slices
    of the joined product — not the layout it was compiled for, copied before each call —
    so those projections stay apart; with one row a slice is laid out as the part was."""
    from mugraph.frontend.capture import unfold_column_slices

    gm, x, w = _two_parts_read_by_a_piece(8)
    assert unfold_column_slices(gm) == 0 and len(_mms(gm)) == 2
    gm, x, w = _two_parts_read_by_a_piece(1)
    assert unfold_column_slices(gm) == 2 and len(_mms(gm)) == 1
    torch.testing.assert_close(gm(x, w), x @ w[:, :16] + x @ w[:, 16:])
