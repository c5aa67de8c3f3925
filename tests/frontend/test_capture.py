"""Each mapped ATen op, captured and run through mugraph's float64 interpreter, against
torch in float64; what stays a torch call stays one."""

import pytest
import torch
import torch.nn.functional as F

import mugraph as mg
from mugraph.frontend import from_torch
from mugraph.frontend.aten import rotate_half, rotate_half_matrix

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)


def r(*shape, pos=False):
    x = torch.randn(*shape, generator=g)
    return x.abs() + 0.5 if pos else x


def check(fn, *xs, mapped=(), library=(), atol=1e-5, ref=None):
    """Capture ``fn`` (every worth-it piece kept: min_ops=0), assert which ATen ops
    mapped — inside a piece, or a view at a piece's boundary left to torch (design
    §10.3) — and which stayed library, and compare the captured form (pieces in the
    float64 interpreter) with ``fn`` in float64."""
    cap = from_torch(fn, *xs, min_ops=0, max_piece_ops=None, max_piece_matmuls=None)
    folded = {n for bp in cap.pieces for n in bp.piece.views}
    inside = {n.target for bp in cap.pieces for n in [*bp.piece.nodes, *bp.piece.views]}
    lib = {n.target for n in cap.library if n not in folded}
    for t in mapped:
        assert t in inside, f"{t} not mapped: {[(n.target, cap.info[n].why) for n in cap.library]}"
    for t in library:
        assert t in lib, f"{t} should stay a torch call"
    for bp in cap.pieces:
        mg.check_lax(bp.program)
    got = cap.reference()(*[x.double() for x in xs])
    want = (ref or fn)(*[x.double() for x in xs])
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=1e-6)
    return cap


CASES = {
    "mm": (lambda a, b: a @ b, (r(4, 8), r(8, 6)), [aten.mm.default]),
    "bmm": (torch.bmm, (r(2, 4, 8), r(2, 8, 3)), [aten.bmm.default]),
    "matmul4d": (torch.matmul, (r(1, 2, 4, 8), r(1, 2, 8, 3)), [aten.bmm.default]),
    "linear": (lambda x, w, b: F.linear(x, w, b), (r(4, 8), r(6, 8), r(6)), [aten.addmm.default, aten.transpose.int]),
    "linear3d": (lambda x, w: F.linear(x, w), (r(2, 4, 8), r(6, 8)), [aten.mm.default, aten.transpose.int]),
    "transpose": (lambda a, b: (a * 2).transpose(0, 1) @ b, (r(8, 4), r(8, 3)), [aten.transpose.int]),
    "t": (lambda a, b: a.t() @ (b + 1), (r(8, 4), r(8, 3)), [aten.transpose.int]),
    "permute": (lambda a: (a * 2).permute(2, 0, 1) + 1, (r(2, 3, 4),), [aten.permute.default]),
    "attention_transposes": (lambda q, k: (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) * 0.5,
                             (r(1, 4, 2, 8), r(1, 4, 2, 8)), [aten.transpose.int]),
    "add": (lambda a, b: a + b * 2 + 1.5, (r(4, 8), r(1, 8)), [aten.add.Tensor, aten.mul.Tensor]),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=3), (r(4, 8), r(4, 8)), [aten.add.Tensor]),
    "sub": (lambda a, b: a - b - 0.25, (r(4, 8), r(4, 1)), [aten.sub.Tensor]),
    "rsub": (lambda a: 1 - a, (r(4, 8),), [aten.rsub.Scalar]),
    "mul": (lambda a, b: a * b * 0.5, (r(4, 8), r(4, 8)), [aten.mul.Tensor]),
    "div": (lambda a, b: a / b / 4, (r(4, 8), r(4, 8, pos=True)), [aten.div.Tensor]),
    "neg": (lambda a, b: -a * b, (r(4, 8), r(4, 8)), [aten.neg.default]),
    "exp": (lambda a: torch.exp(a) * 2, (r(4, 8),), [aten.exp.default]),
    "sqrt": (lambda a: torch.sqrt(a) + 1, (r(4, 8, pos=True),), [aten.sqrt.default]),
    "rsqrt": (lambda a: torch.rsqrt(a) + 1, (r(4, 8, pos=True),), [aten.rsqrt.default]),
    "reciprocal": (lambda a: torch.reciprocal(a) + 1, (r(4, 8, pos=True),), [aten.reciprocal.default]),
    "pow2": (lambda a: a.pow(2) + 1, (r(4, 8),), [aten.pow.Tensor_Scalar]),
    "pow_half": (lambda a: a ** 0.5 + a ** -0.5 + a ** -1, (r(4, 8, pos=True),), [aten.pow.Tensor_Scalar]),
    "mean": (lambda a: a.mean(-1, keepdim=True) + a.mean(0), (r(4, 8),), [aten.mean.dim]),
    "mean_all": (lambda a: a.mean((0, 1), keepdim=True) * a, (r(4, 8),), [aten.mean.dim]),
    "sum": (lambda a: a.sum((0, 2)) * 2, (r(3, 4, 5),), [aten.sum.dim_IntList]),
    "silu": (lambda a: F.silu(a) * a, (r(4, 8),), [aten.silu.default]),
    "sigmoid": (lambda a: torch.sigmoid(a) * a, (r(4, 8),), [aten.sigmoid.default]),
    "tanh": (lambda a: torch.tanh(a) * a, (r(4, 8),), [aten.tanh.default]),
    "gelu_tanh": (lambda a, w: F.gelu(a @ w, approximate="tanh"), (r(4, 8), r(8, 6)), [aten.gelu.default]),
    "view": (lambda a: (a * 2).view(2, 16) + 1, (r(4, 8),), [aten.view.default]),
    "reshape": (lambda a: (a * 2).reshape(8, -1) + 1, (r(4, 8),), [aten.view.default]),
    "unsqueeze_expand": (lambda a: (a * 2).unsqueeze(0).expand(3, 4, 8) * 1.5, (r(4, 8),),
                         [aten.unsqueeze.default, aten.expand.default]),
    "contiguous": (lambda a: (a * 2).contiguous().clone() + 1, (r(4, 8),), [aten.clone.default]),
    "cat": (lambda a, b: torch.cat([a * 2, b + 1], dim=1) * 3, (r(4, 8), r(4, 2)), [aten.cat.default]),
    "slice": (lambda a, b: (a * 2)[:, 1:7:2] @ (b + 1)[2:], (r(4, 8), r(5, 3)), [aten.slice.Tensor]),
    "narrow_split": (lambda a: (a * 2).narrow(1, 2, 3) + (a + 1).split(3, dim=1)[1], (r(4, 9),), [aten.slice.Tensor]),
    "select_unbind": (lambda a: (a * 2)[:, 3] + (a - 1).unbind(0)[2] * (a * 3)[-1], (r(4, 4),),
                      [aten.select.int, aten.slice.Tensor]),
    "rotate_half": (lambda q, c, s: q * c + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * s,
                    (r(1, 2, 3, 8), r(1, 1, 3, 8), r(1, 1, 3, 8)), [rotate_half]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mapped_op_against_float64(name):
    fn, xs, targets = CASES[name]
    check(fn, *xs, mapped=targets)


def test_softmax_with_its_max_inside_a_piece():
    cap = check(lambda x: torch.softmax(x * 0.5, dim=-1), r(4, 8),
                mapped=[aten.amax.default, aten.exp.default, aten.div.Tensor])
    assert any({"max", "exp"} <= {op.kind for op in bp.program.ops} for bp in cap.pieces)


def test_unmapped_ops_stay_torch_calls():
    def fn(x, y):
        z = x.transpose(0, 1) * 2          # a permute: mapped
        return torch.where(z > 0, z, y.t()) + x.cumsum(0)[1:3].sum(0) * 2  # comparison, select, a scan
    check(fn, r(4, 4), r(4, 4), mapped=[aten.transpose.int, aten.slice.Tensor],
          library=[aten.where.self, aten.gt.Scalar, aten.cumsum.default])


def test_probe_refuses_what_the_catalog_cannot_say():
    cap = from_torch(lambda x: (x.pow(3) + x.to(torch.int32).float() + torch.div(x, 3, rounding_mode="floor")),
                     r(4, 8), min_ops=0)
    why = {str(n.target): cap.info[n].why for n in cap.library}
    assert "exponent 3" in why["aten.pow.Tensor_Scalar"]
    assert "rounding_mode" in why["aten.div.Tensor_mode"]
    assert any("cast from float32 to int32" in cap.info[n].why for n in cap.library)
    cap = from_torch(lambda x: x.mean() * x, r(4, 8), min_ops=0)  # a 0-dim result: the IR's tensors have 1-4 dims
    assert "0-dim" in cap.info[next(n for n in cap.library if n.target == aten.mean.default)].why


def test_rotate_half_matrix():
    x = r(2, 3, 6)
    torch.testing.assert_close(x @ rotate_half_matrix(6, torch.float32), rotate_half(x))


def test_module_weights_are_constants():
    lin = torch.nn.Linear(8, 4)
    import copy

    cap = check(lin, r(3, 8), mapped=[aten.addmm.default], ref=copy.deepcopy(lin).double())
    assert [n.op for n in cap.graph_module.graph.nodes].count("placeholder") == 1


def test_bad_input_is_one_line():
    with pytest.raises(mg.ArgumentTypeError, match="example input 0"):
        from_torch(lambda x: x, "not a tensor")
    with pytest.raises(mg.ArgumentTypeError, match="function or nn.Module"):
        from_torch(3, r(2))


def test_attention_transposes_stay_inside_one_piece():
    """``q.transpose(1, 2)`` and ``k.transpose(-1, -2)`` are permutes: the scores matmul and
    everything around it are one piece, no torch call between them; the transposes of
    its inputs are views at its boundary, read through their strides; so is the bmm's view
    back to 4-d, moved below the element-wise ops to the piece's output."""
    def fn(q, k):
        s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)
        return torch.exp(s * 0.25) * 2
    cap = check(fn, r(1, 4, 2, 8), r(1, 4, 2, 8), mapped=[aten.transpose.int])
    (bp,) = cap.pieces
    assert cap.library == bp.piece.views
    assert {n.target for n in cap.library} == {aten.transpose.int, aten.view.default}
    assert not any(op.kind == "permute" for op in bp.program.ops)
    # the bmm's batch flattening of its inputs stays; nothing computed is reshaped
    assert all(op.inputs[0].op.kind == "input" for op in bp.program.ops if op.kind == "reshape")
    assert bp.strided  # q^T and k^T^T as strided views of q and k
    # a transpose between two computed values stays inside
    cap = check(lambda q, k: torch.exp((q * 2).transpose(1, 2) @ k) * 2, r(1, 4, 2, 8), r(1, 2, 8, 3),
                mapped=[aten.transpose.int])
    # k's batch flattening (its expand to its own shape is the view it is) read in place at the
    # input, and the bmm's view back to 4-d at the output
    assert [n.target for n in cap.library] == [aten.view.default, aten.view.default]
    assert [tuple(n.meta["val"].shape) for n in cap.library] == [(2, 8, 3), (1, 2, 4, 3)]
    assert any(op.kind == "permute" for op in cap.pieces[0].program.ops)


def test_from_torch_is_a_public_name_of_mugraph():
    """``mg.from_torch`` is the front door's capture, served lazily like the product's names."""
    import mugraph.frontend

    assert mg.from_torch is mugraph.frontend.from_torch
    assert "from_torch" in mg.__all__ and "from_torch" in dir(mg)
    cap = mg.from_torch(lambda x, w: torch.exp(x @ w.t()) * 2, r(4, 8), r(6, 8), min_ops=0)
    assert len(cap.pieces) == 1 and cap.library == cap.pieces[0].piece.views


def test_halves_of_a_window_are_not_the_rotate_half_of_the_whole():
    """``cat([-x[..., 4:8], x[..., :4]])`` of a 16-wide ``x`` rotates its first 8 columns, not
    ``x``: it is not replaced by ``rotate_half(x)`` (which had made the capture's product
    (2, 16) @ (8, 8))."""
    def fn(x, w):
        return torch.cat([-x[..., 4:8], x[..., :4]], -1) @ w
    xs = torch.randn(2, 16), torch.randn(8, 8)
    cap = from_torch(fn, *xs)
    assert not any(n.target is rotate_half for n in cap.graph_module.graph.nodes)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def test_a_concat_with_an_empty_part_is_a_contiguous_copy_of_the_other():
    """A partial RoPE rotating every column concatenates its rotated part with an empty one
    (a tiny Phi-3's ``partial_rotary_factor``). The capture drops the empty input, and a
    ``cat`` left with one is a contiguous copy of it — what ``cat`` returns; Inductor, dropping
    the empty input itself, kept the other's transposed strides and refused the views read
    after it."""
    from mugraph.frontend.capture import trace

    def fn(x, cos):
        q = x.view(2, 8, 4, 16).transpose(1, 2)
        rot, passed = q[..., :16], q[..., 16:]
        return torch.cat((rot * cos, passed), dim=-1).view(2, 2, 16, 16)
    x, cos = torch.randn(2, 8, 64), torch.randn(16)
    gm = trace(fn, (x, cos))
    cats = [n for n in gm.graph.nodes if n.target is torch.ops.aten.cat.default]
    clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert not cats and len(clones) == 1
    assert clones[0].kwargs["memory_format"] is torch.contiguous_format
    torch.testing.assert_close(gm(x, cos), fn(x, cos))


def test_a_mask_read_by_every_attention_is_converted_once():
    """Two SDPA calls under one boolean mask: the capture writes the mask as a bias and a row
    factor at each call, and the second call's conversion is merged into the first's — the
    mask is converted once, the outputs unchanged. Random draws are never merged (two
    dropouts of one value are two draws), nor buffers written in place (the draws' own)."""
    from mugraph.frontend.capture import merge_repeated_values, trace

    def fn(q1, q2, k, v, mask):
        a = F.scaled_dot_product_attention(q1, k, v, attn_mask=mask)
        b = F.scaled_dot_product_attention(q2, k, v, attn_mask=mask)
        return a + b

    q1, q2, k, v = (torch.randn(1, 2, 3, 8, generator=g) for _ in range(4))
    mask = torch.rand(1, 1, 3, 3, generator=g) > 0.4
    mask[..., 0, :] = False  # a row no key may see
    gm = trace(fn, (q1, q2, k, v, mask))
    anys = [n for n in gm.graph.nodes if n.target == aten.any.dim]
    assert len(anys) == 1 and len(anys[0].users) >= 1
    got = gm(q1, q2, k, v, mask)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got, torch.nan_to_num(fn(q1, q2, k, v, mask)), atol=1e-5, rtol=1e-5)

    def draws(x):
        return F.dropout(x, 0.5, training=True) + F.dropout(x, 0.5, training=True)
    drawn = torch.fx.experimental.proxy_tensor.make_fx(draws)(torch.randn(4))
    before = sum(n.op == "call_function" for n in drawn.graph.nodes)
    assert merge_repeated_values(drawn) == 0
    assert sum(n.op == "call_function" for n in drawn.graph.nodes) == before

    def twice(x):
        return x * 2 + x * 2
    plain = torch.fx.experimental.proxy_tensor.make_fx(twice)(torch.randn(4))
    assert merge_repeated_values(plain) == 1
    torch.testing.assert_close(plain(torch.ones(4)), torch.full((4,), 4.0))
