"""Views at a piece's boundary (docs/design.md §10.3): a weight's transpose, a view of an
input or of an output runs as a torch view, and the piece reads (or writes) the tensor
itself — its Program says ``X @ W``, not ``X @ permute(W)`` — with the view's strides
handed to the lowering, which loads through them (no copy)."""

import pytest
import torch
import torch.nn.functional as F

import lower
import mugraph as mg
from lower.runtime import conform
from mugraph.frontend import from_torch
from mugraph.frontend.aten import VIEW_OPS, rotate_half

aten = torch.ops.aten
g = torch.Generator().manual_seed(5)


def r(*shape, pos=False):
    x = torch.randn(*shape, generator=g)
    return x.abs() + 0.5 if pos else x


def kinds(bp):
    return [op.kind for op in bp.program.ops if op.kind != "input"]


def boundary_views(bp):
    """Member nodes that are torch views with every input outside the piece, or every user."""
    members = set(bp.piece.nodes)
    return [n for n in bp.piece.nodes if n.target in VIEW_OPS
            and (all(a not in members for a in n.all_input_nodes) or all(u not in members for u in n.users))]


def views_of_inputs(bp):
    """Program ops that are a permute or reshape of a Program input."""
    return [op for op in bp.program.ops if op.kind in ("permute", "reshape") and op.inputs[0].op.kind == "input"]


def test_a_linear_weight_is_read_transposed_in_place():
    cap = from_torch(lambda x, w: torch.exp(F.linear(x, w)) * 2, r(4, 8), r(6, 8), min_ops=0)
    (bp,) = cap.pieces
    assert kinds(bp) == ["matmul", "exp", "scale"]
    assert [n.target for n in bp.piece.views] == [aten.transpose.int] and cap.library == bp.piece.views
    # the weight (6, 8) arrives as its transpose (8, 6): strides (1, 8), which the lowering is given
    assert bp.strided == {"x1": (1, 8)} and bp.layout_key
    x, w = r(4, 8), r(6, 8)
    torch.testing.assert_close(cap.reference()(x.double(), w.double()), torch.exp(x.double() @ w.double().t()) * 2)


def test_views_of_outputs_leave_the_piece_and_equal_views_are_built_once():
    def fn(a, b, w, v):
        c = torch.bmm(a, b)                       # (2, 2, 8): a matmul, so the views stay below it
        return (c.view(4, 8) @ w).view(2, 2, 6), (c.view(4, 8) @ v).unsqueeze(0)
    xs = r(2, 2, 3), r(2, 3, 8), r(8, 6), r(8, 6)
    cap = from_torch(fn, *xs, min_ops=0, max_piece_matmuls=None)
    (bp,) = cap.pieces
    assert kinds(bp) == ["matmul", "reshape", "matmul", "matmul"]  # one reshape; the output views are torch's
    assert not boundary_views(bp)
    assert {n.target for n in bp.piece.views} == {aten.view.default, aten.unsqueeze.default}
    got = cap.reference()(*[x.double() for x in xs])
    for a, b in zip(got, fn(*[x.double() for x in xs])):
        torch.testing.assert_close(a, b)


def test_a_linear_view_moves_up_through_element_wise_ops_to_the_input():
    """``view(x·r, (b·s, h))`` is ``view(x, (b·s, h)) · view(r, (b·s, 1))`` (design §10.1): the
    views reach the inputs and fold there, so a norm feeding a ``linear`` of a 3-d
    activation is a 2-d Program without a reshape."""
    def fn(x, w):
        return F.linear(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), w)
    xs = r(2, 3, 8), r(5, 8)
    cap = from_torch(fn, *xs, max_piece_ops=None)
    (bp,) = cap.pieces
    assert "reshape" not in kinds(bp) and [tuple(t.shape) for t in bp.program.inputs] == [(6, 8), (8, 5)]
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))
    # a view of a value another op reads too stays where it is (moving it would compute the value twice)
    def other(x, w):
        h = x * 2
        return F.linear(h, w), h + 1
    cap = from_torch(other, *xs, min_ops=1)
    (bp,) = cap.pieces
    assert kinds(bp) == ["scale", "reshape", "matmul", "const", "add"]
    for a, b in zip(cap.reference()(*[x.double() for x in xs]), other(*[x.double() for x in xs])):
        torch.testing.assert_close(a, b)


def test_a_linear_view_back_moves_down_to_the_output():
    """``view(x @ Wᵀ, (b, s, o)) + h`` is ``view(x @ Wᵀ + view(h, (b·s, o)), (b, s, o))`` (design
    §10.1): the view back to 3-d passes the residual add and the norm after it and cancels
    against the next ``linear``'s view, so projection, residual, norm, projection and
    residual are one 2-d Program without a reshape; its output's view is left to torch."""
    def fn(x, h, w, w2):
        y = h + F.linear(x, w)
        n = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return F.linear(n, w2) + y
    xs = r(2, 3, 8), r(2, 3, 5), r(5, 8), r(5, 5)
    cap = from_torch(fn, *xs, max_piece_ops=None, max_piece_matmuls=None)
    (bp,) = cap.pieces
    assert "reshape" not in kinds(bp) and kinds(bp).count("matmul") == 2
    assert [tuple(t.shape) for t in bp.program.inputs] == [(6, 8), (8, 5), (6, 5), (5, 5)]
    assert all(n.target in VIEW_OPS for n in cap.library)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))
    # a residual of another batch shape (broadcast over the tokens) goes along as its own view
    def bias(x, w, b):
        return F.linear(x, w) * b
    xs = r(2, 3, 8), r(5, 8), r(2, 1, 5)
    cap = from_torch(bias, *xs, min_ops=1)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), bias(*[x.double() for x in xs]))


def test_a_linear_view_moves_through_a_type_as_cast():
    """``type_as`` traces as a cast that spells out its layout and device (Gemma's RMSNorm
    ends with one, in float32 until then): the next ``linear``'s view passes it as it passes
    a plain dtype cast, and cancels against the view back the norm's input brought, so the
    norm and the projection are one 2-d Program without a reshape (before, the norm's piece
    kept a ``reshape`` and was not searched)."""
    def fn(x, h, w, w2, g):
        y = (h + F.linear(x, w)).float()
        n = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + g.float())).type_as(h)
        return F.linear(n, w2)
    xs = r(1, 1, 8), r(1, 1, 5), r(5, 8), r(5, 5), r(5)
    cap = from_torch(fn, *xs, max_piece_ops=None, max_piece_matmuls=None)
    assert not any("reshape" in kinds(bp) for bp in cap.pieces), [kinds(bp) for bp in cap.pieces]
    assert sum(kinds(bp).count("matmul") for bp in cap.pieces) == 2
    # (``fn`` computes its norm in float32 whatever its inputs: float32's tolerance, else the
    # comparison passes or fails with the draws the tests run before it left)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]),
                               rtol=1e-5, atol=1e-6)
    # a cast to another device is no element-wise op: nothing moves through it
    from mugraph.frontend.hoist import pointwise
    gm = torch.fx.symbolic_trace(lambda t: t)
    node = next(n for n in gm.graph.nodes if n.op == "placeholder")
    node.meta["val"] = torch.zeros(2)
    cast = gm.graph.call_function(aten._to_copy.default, (node,), {"dtype": torch.float16, "device": torch.device("meta")})
    assert not pointwise(cast)
    cast.kwargs = {"dtype": torch.float16, "layout": torch.strided, "device": torch.device("cpu")}
    assert pointwise(cast)
    from mugraph.frontend.hoist import _same_device
    assert _same_device(torch.device("cuda"), torch.device("cuda:0"))
    assert not _same_device(torch.device("cuda:1"), torch.device("cuda:0"))
    assert not _same_device(torch.device("cpu"), torch.device("cuda:0"))


def test_a_fold_that_disconnects_a_piece_makes_two():
    def fn(x):
        v = x.t()
        return torch.exp(v * 2) + 1, v.sum(0) * 3
    cap = from_torch(fn, r(4, 8), min_ops=1)
    assert len(cap.pieces) == 2
    assert all(not views_of_inputs(bp) for bp in cap.pieces)
    got = cap.reference()(r(4, 8).double())
    assert got[0].shape == (8, 4) and got[1].shape == (4,)


class LlamaLike(torch.nn.Module):
    """A Llama-style block written out in torch (RMSNorm with eps and weight, Q/K/V
    projections of a (batch, seq, hidden) input, RoPE's rotate-half, GQA by
    repeat-interleave, causal softmax attention, output projection, residual, RMSNorm
    and the gated MLP), the shape of Hugging Face's without depending on it."""

    def __init__(self, d=32, heads=4, kv_heads=2, f=64):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.n1, self.n2 = torch.nn.Parameter(torch.rand(d) + 0.5), torch.nn.Parameter(torch.rand(d) + 0.5)
        self.q, self.k = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v, self.o = torch.nn.Linear(d, kv_heads * self.hd, bias=False), torch.nn.Linear(d, d, bias=False)
        self.gate, self.up = torch.nn.Linear(d, f, bias=False), torch.nn.Linear(d, f, bias=False)
        self.down = torch.nn.Linear(f, d, bias=False)

    @staticmethod
    def norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, x, cos, sin, mask):
        b, s, d = x.shape
        h = self.norm(x, self.n1)
        q = self.q(h).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.h // self.kv
        k = k[:, :, None].expand(b, self.kv, rep, s, self.hd).reshape(b, self.h, s, self.hd)
        v = v[:, :, None].expand(b, self.kv, rep, s, self.hd).reshape(b, self.h, s, self.hd)
        a = torch.softmax(q @ k.transpose(2, 3) / self.hd ** 0.5 + mask, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.norm(x, self.n2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def llama_inputs(b=2, s=4, d=32, hd=8):
    pos = torch.arange(s, dtype=torch.float32)[:, None] / 10 ** (torch.arange(hd // 2) / (hd // 2))
    emb = torch.cat([pos, pos], -1)
    return r(b, s, d), emb.cos()[None, None], emb.sin()[None, None], torch.full((s, s), float("-inf")).triu(1)


def test_llama_like_block_pieces_have_no_views_of_their_inputs():
    import copy

    torch.manual_seed(0)
    m = LlamaLike().eval()
    xs = llama_inputs()
    for limits in ({}, {"max_piece_ops": None, "max_piece_matmuls": None}):
        with torch.no_grad():
            cap = from_torch(m, *xs, **limits)
        assert len(cap.pieces) >= 3
        for bp in cap.pieces:
            assert not boundary_views(bp), (bp.name, boundary_views(bp))
            # what views of inputs remain are not torch views: a copy (clone) or an expand's reshape
            for op in views_of_inputs(bp):
                assert op.kind == "reshape", (bp.name, str(bp.program))
            mg.check_lax(bp.program)
        # every weight transpose was folded: no piece permutes a weight
        weights = {n for n in cap.graph_module.graph.nodes if n.op == "get_attr"}
        for bp in cap.pieces:
            for n in bp.piece.nodes:
                assert not (n.target == aten.transpose.int and n.args[0] in weights)
        assert any(bp.strided for bp in cap.pieces)
        # the stitched graph (pieces in the float64 interpreter, the rest torch) is the block in float64
        with torch.no_grad():
            got = cap.reference()(*[x.double() for x in xs])
            want = copy.deepcopy(m).double()(*[x.double() for x in xs])
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


# ------------------------------------------------------------------ lowering with strided inputs


def _xw_kernel():
    """``exp(X @ W)`` as one graph-defined kernel: a Triton kernel loading X and W."""
    kg = mg.KernelGraph("xw")
    x, w = kg.input("X", (8, 6), "float32"), kg.input("W", (6, 4), "float32")
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=2)
    xt = bg.input(x, imap=(0, None, None), fmap=1)
    wt = bg.input(w, imap=(None, None, None), fmap=0)
    bg.output(mg.exp(bg.accum(xt @ wt)), omap=(0, None, None))
    (out,) = kg.kernel(bg)
    kg.output(out)
    return kg


def test_lowering_reads_a_strided_input_and_writes_a_strided_output():
    kg = _xw_kernel()
    prog = lower.compile(kg, device="cpu", input_strides={"W": (1, 6)}, output_strides={0: (1, 8)}, poison=True)
    assert prog.input_strides[1] == (1, 6) and prog.output_strides[0] == (1, 8)
    src = prog.triton_source()
    assert "reads  W: (6, 4) float32 strides (1, 6)" in src and "strides (1, 8)" in src
    xv, w_rows = r(8, 6), r(4, 6)
    w_view = w_rows.t()                              # (6, 4), strides (1, 6): passed as is
    assert conform(w_view, (1, 6)) is w_view
    want = torch.exp(xv.double() @ w_view.double())
    y = prog(xv, w_view)
    assert y.stride() == (1, 8)                      # written in the layout asked for
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    # a row-major tensor for an input compiled strided is copied into that layout first
    torch.testing.assert_close(prog(xv, w_view.contiguous()).double(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(mg.InputError, match=r"out\[0\] must be a strides-\(1, 8\)"):
        prog(xv, w_view, out=[torch.empty(8, 4)])


def test_bad_strides_are_one_line_errors():
    kg = _xw_kernel()
    for kw, match in (({"input_strides": {"W": (1,)}}, "one int >= 0 per dim"),
                      ({"input_strides": {"W": (1, 1)}}, "would overlap"),
                      ({"input_strides": {"V": (1, 8)}}, "input_strides must map input names"),
                      ({"input_strides": {"W": (0, 1)}}, "would overlap"),
                      ({"output_strides": {1: (1, 8)}}, "output_strides must map output indices"),
                      ({"output_strides": {0: (2, 8)}}, r"output_strides \(t\d+\)=\(2, 8\): elements .* would overlap")):
        with pytest.raises(mg.InputError, match=match) as e:
            lower.compile(kg, device="cpu", **kw)
        assert "\n" not in str(e.value)


def test_a_piece_with_a_transposed_weight_runs_lowered(piece_cache):
    """The compiled piece takes the weight's transpose as a strided view and matches torch."""
    w = r(6, 8)
    fn = lambda x: torch.exp(F.linear(x, w)) * 2  # noqa: E731
    x = r(4, 8)
    cap = from_torch(fn, x)
    (bp,) = cap.pieces
    assert bp.strided == {"x1": (1, 8)}
    compiled = cap.compile(time_limit=3.0, cache_dir=piece_cache, unfused="lower",
                           search={"max_kernel_ops": 1, "max_block_ops": 1})
    assert cap.kept == [bp]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x), atol=1e-5, rtol=1e-5)


def test_two_regrouping_views_in_a_row_are_one():
    """A linear's view back to (b, s, out), scaled, read by the next linear's view to
    (b·s, out): the second view moves up through the product and meets the first, and the
    pair is the identity — the two projections and the product are one 2-d Program."""
    def fn(x, w1, w2):
        return F.linear(F.linear(x, w1) * 2, w2)
    xs = r(2, 3, 8), r(6, 8), r(5, 6)
    cap = from_torch(fn, *xs)
    (bp,) = cap.pieces
    assert kinds(bp) == ["matmul", "scale", "matmul"]
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


@pytest.mark.parametrize("contiguous", [True, False])
def test_a_one_token_head_merge_is_a_view_and_the_projection_reads_the_activation(contiguous):
    """A decode step's ``attn.transpose(1, 2).reshape(b, 1, heads·d)`` moves only a dim of size
    1: spelled as the view it is (design §10.1), it leaves the piece with the reshapes, and the
    output projection + residual is ``X @ W + R`` — the Program a fused GEMV kernel is found
    for — whether the linear traced as ``mm`` or, on the transposed strides, as a ``bmm`` of
    one batch of expanded views."""
    def fn(attn, res, w):
        a = attn.transpose(1, 2)
        a = a.contiguous().reshape(1, 1, -1).contiguous() if contiguous else a.reshape(1, 1, -1)
        return res + F.linear(a, w)
    xs = r(1, 4, 1, 16), r(1, 1, 64), r(64, 64)
    cap = from_torch(fn, *xs, min_ops=0, max_piece_ops=None)
    (bp,) = cap.pieces
    assert kinds(bp) == ["matmul", "add"] and [tuple(t.shape) for t in bp.program.inputs] == [(1, 64), (64, 64),
                                                                                          (1, 64)]
    assert bp.strided == {"x1": (1, 64)}  # the weight, read transposed in place
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def test_a_transpose_of_two_long_dims_stays_a_permute():
    def fn(x, w):
        return torch.exp(x.transpose(1, 2).reshape(2, 12) @ w)
    xs = r(2, 3, 4), r(12, 5)
    cap = from_torch(fn, *xs, min_ops=0, max_piece_ops=None)
    assert any("permute" in kinds(bp) for bp in cap.pieces) or cap.library
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def test_slices_of_a_fused_projection_become_projections_by_weight_slices():
    """Phi-3's ``gate_up_proj``: one ``linear`` whose columns are cut into gate and up. As
    projections by slices of the weight (views of an input, read in place) the piece is the
    separate projections' — no slice of a computed value is left in it."""
    def fn(x, w, w2):
        y = F.linear(x, w)
        gate, up = y[..., :16], y[..., 16:]
        return F.linear(F.silu(gate) * up, w2) + x
    xs = r(1, 1, 8), r(32, 8), r(8, 16)
    cap = from_torch(fn, *xs, min_ops=0, max_piece_ops=None, max_piece_matmuls=None)
    (bp,) = cap.pieces
    assert "slice" not in kinds(bp) and kinds(bp).count("matmul") == 3
    assert [tuple(t.shape) for t in bp.program.inputs][:3] == [(1, 8), (8, 16), (8, 16)]
    assert [n.target for n in cap.library].count(aten.slice.Tensor) == 2  # the weight's halves, in place
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))
    # a product read whole as well keeps its slices (moving them would read those columns twice)
    def both(x, w):
        y = F.linear(x, w)
        return y[..., :16] * 2, y + 1
    xs = r(1, 1, 8), r(32, 8)
    cap = from_torch(both, *xs, min_ops=0, max_piece_ops=None)
    assert any("slice" in kinds(bp) for bp in cap.pieces) or aten.slice.Tensor in [n.target for n in cap.library]
    for a, b in zip(cap.reference()(*[x.double() for x in xs]), both(*[x.double() for x in xs])):
        torch.testing.assert_close(a, b)


def test_the_all_masked_row_factor_joins_the_output_projection():
    """SDPA with an additive float mask zeroes the rows no key may see: the capture multiplies
    its output by a 0/1 factor per row (``aten.sdpa``'s ``rows``), one element for one query
    row over heads sharing a mask. The heads' merge for the output projection is hoisted
    above that product and the factor is viewed to ``(1,)``, not to a 0-d scalar (no catalog
    tensor has 0 dims): so the product joins the projection's piece, ``(A · s) @ W + R``,
    where it had been torch code of its own between the attention and the projection (one
    more kernel in a decode step: ``all``, ``mul`` and the heads' transpose, H200)."""
    def fn(q, k, v, mask, res, w):
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return res + F.linear(a.transpose(1, 2).reshape(1, 1, -1), w)
    mask = torch.zeros(1, 1, 1, 32)
    mask[..., 20:] = float("-inf")
    xs = r(1, 4, 1, 16), r(1, 4, 32, 16), r(1, 4, 32, 16), mask, r(1, 1, 64), r(64, 64)
    cap = from_torch(fn, *xs)
    proj = [bp for bp in cap.pieces if "matmul" in kinds(bp) and "exp" not in kinds(bp)]
    assert [kinds(bp) for bp in proj] == [["mul", "matmul", "add"]]
    assert sorted(tuple(t.shape) for t in proj[0].program.inputs) == [(1,), (1, 64), (1, 64), (64, 64)]
    assert not any(n.target == aten.mul.Tensor for n in cap.library)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))
    hidden = mask.clone()
    hidden[...] = float("-inf")  # no key visible: SDPA's row is 0, and so is the projection's input
    ys = (*xs[:3], hidden, *xs[4:])
    torch.testing.assert_close(cap.reference()(*[x.double() for x in ys]), xs[4].double() + 0 * xs[5].double()[0])
