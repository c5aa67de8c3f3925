"""Float casts inside pieces (the cast rule) and pieces cut to a searchable size
(docs/design.md §10.3)."""

import pytest
import torch
import torch.nn.functional as F

import mugraph as mg
from mugraph.frontend import from_torch
from mugraph.frontend.partition import _size, piece_dtype

aten = torch.ops.aten
g = torch.Generator().manual_seed(3)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def bf16_rmsnorm(x, w):
    """A bf16 model's RMSNorm, as Hugging Face's LlamaRMSNorm writes it."""
    h = x.to(torch.float32)
    v = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(v + 1e-5)
    return w * h.to(torch.bfloat16)


def casts_inside(cap):
    return [n for bp in cap.pieces for n in bp.piece.nodes if n.target == aten._to_copy.default]


def test_bf16_rmsnorm_is_one_piece_at_bf16():
    x, w = r(4, 64, dtype=torch.bfloat16), (r(64).abs() + 0.5).to(torch.bfloat16)
    # with a size limit below the whole norm (6 as the limit counts it: the add and rsqrt of
    # the mean are one function of it) the float32 region (upcast … downcast) stays whole and
    # the weight's product is cut off (a lone element-wise op: left to torch)
    cut = from_torch(bf16_rmsnorm, x, w, max_piece_ops=5)
    assert len(cut.pieces) == 1 and len(casts_inside(cut)) == 2
    assert [n.target for n in cut.library] == [aten.mul.Tensor]
    # the default limit holds the whole norm, epsilon and weight included: constants do
    # not count (the search takes them as operands)
    assert from_torch(bf16_rmsnorm, x, w).library == []
    cap = from_torch(bf16_rmsnorm, x, w, max_piece_ops=None)
    (bp,) = cap.pieces
    assert cap.library == [] and len(casts_inside(cap)) == 2
    assert {t.dtype for t in bp.program.tensors} == {"bfloat16"}
    mg.check_lax(bp.program)
    # the piece's meaning (float64) is the exact RMSNorm: within bf16 rounding of eager's result
    exact = bf16_rmsnorm(x.double(), w.double())
    got = cap.reference()(x, w)
    torch.testing.assert_close(got, exact, atol=0, rtol=2 ** -8)
    torch.testing.assert_close(got.to(torch.bfloat16), bf16_rmsnorm(x, w), atol=0, rtol=2 ** -7)


@pytest.mark.parametrize("to", [torch.int32, torch.float8_e4m3fn, torch.bool])
def test_a_cast_beyond_the_tolerance_cuts_the_piece(to):
    def fn(x, w):
        h = (x * 2 + 1).to(to).to(torch.float32)
        return (h * x + 1) @ w
    cap = from_torch(fn, r(4, 8), r(8, 8))
    assert casts_inside(cap) == []
    assert sum(n.target == aten._to_copy.default for n in cap.library) == 2
    assert len(cap.pieces) == 2


def test_a_wide_value_leaving_the_piece_refuses_its_casts():
    # the float32 value is an output: running the piece at bf16 would round what the user asked in float32
    def fn(x):
        h = x.to(torch.float32) * 3 + 1
        return h, (h * h).to(torch.bfloat16) * x
    cap = from_torch(fn, r(4, 8, dtype=torch.bfloat16), min_ops=1)
    assert casts_inside(cap) == []
    for bp in cap.pieces:
        assert piece_dtype(set(bp.piece.nodes)) is not None
        assert len({t.dtype for t in bp.program.tensors}) == 1
    # and a float32 input met at bf16 would be rounded: refused too
    cap = from_torch(lambda x, y: (x.to(torch.bfloat16) * y * 2).to(torch.float32) + x,
                     r(4, 8), r(4, 8, dtype=torch.bfloat16), min_ops=1)
    assert casts_inside(cap) == []


def test_only_the_culprit_cast_is_refused():
    # a float32 table scaled and narrowed (a rotary embedding's cosine, shared by every layer)
    # meets a normed projection: the table's cast breaks the rule and goes to torch; the
    # norm's casts stay with the product that reads it (refusing them all cut the norm off)
    def fn(x, w, W, cos):
        return (bf16_rmsnorm(x, w) @ W) * (cos * 2.0).to(torch.bfloat16)
    x, w = r(4, 64, dtype=torch.bfloat16), (r(64).abs() + 0.5).to(torch.bfloat16)
    cap = from_torch(fn, x, w, r(64, 32, dtype=torch.bfloat16), r(4, 32), min_ops=1)
    with_norm = [bp for bp in cap.pieces if any(n.target == aten.rsqrt.default for n in bp.piece.nodes)]
    assert len(with_norm) == 1
    targets = [n.target for n in with_norm[0].piece.nodes]
    assert aten.mm.default in targets and targets.count(aten._to_copy.default) == 2
    assert [n.target for n in cap.library].count(aten._to_copy.default) == 1


def test_bf16_rmsnorm_under_the_backend_runs_lowered(piece_cache):
    import mugraph.frontend  # noqa: F401 - registers the backend
    from mugraph.frontend.backend import recent_graphs

    x, w = r(2, 32, dtype=torch.bfloat16), (r(32).abs() + 0.5).to(torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        f = torch.compile(bf16_rmsnorm, backend="mugraph",
                          options={"time_limit": 2.0, "cache_dir": piece_cache, "unfused": "lower"})
        y = f(x, w)
    cap = list(recent_graphs()[-1].captured.values())[0]
    assert len(cap.kept) == 1 and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), bf16_rmsnorm(x.double(), w.double()), atol=0, rtol=2 ** -6)


def norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def kinds(bp):
    """A piece's catalog ops as the size limit counts them (constants are operands, not ops)."""
    return [op.kind for op in bp.program.ops if op.kind not in ("input", "const")]


def test_a_piece_over_the_matmul_limit_is_cut_keeping_each_matmul_with_its_neighbours():
    def fn(x, w, wq, wk, w2):
        h = norm(x, w)
        return x + (F.silu(h @ wq) * (h @ wk)) @ w2
    xs = r(1, 16), r(16).abs() + 0.5, r(16, 32), r(16, 32), r(32, 16)
    # (whole, the verifier could prove none of its μGraphs — the SiLU of a normed row summed
    # by w2 — and the partition would cut it there; this test is about the size limits)
    whole = from_torch(fn, *xs, max_piece_ops=None, max_piece_matmuls=None, proven_only=False)
    assert len(whole.pieces) == 1 and kinds(whole.pieces[0]).count("matmul") == 3
    cap = from_torch(fn, *xs, max_piece_ops=None, max_piece_matmuls=1)
    assert len(cap.pieces) >= 2
    for bp in cap.pieces:
        assert kinds(bp).count("matmul") <= 1
        mg.check_lax(bp.program)
    # the norm's reduction stays with the first projection, the residual add with the last
    first = next(bp for bp in cap.pieces if "sum" in kinds(bp))
    assert "matmul" in kinds(first) and "sqrt" in kinds(first)
    last = next(bp for bp in cap.pieces if any(u.op == "output" for n in bp.piece.nodes for u in n.users))
    assert kinds(last).count("matmul") == 1 and "add" in kinds(last)
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))
    # two matmuls per piece: silu(h @ wq) * (h @ wk) together
    cap2 = from_torch(fn, *xs, max_piece_ops=None, max_piece_matmuls=2)
    assert any(kinds(bp).count("matmul") == 2 and "silu" in kinds(bp) and "mul" in kinds(bp) for bp in cap2.pieces)


def test_the_op_limit_cuts_and_no_piece_exceeds_it():
    def fn(x, w):
        return norm(norm(norm(x, w) * 2, w) + 1, w)
    xs = r(4, 16), r(16).abs() + 0.5
    cap = from_torch(fn, *xs, max_piece_ops=12, min_ops=1)
    assert len(cap.pieces) >= 2
    for bp in cap.pieces:  # as the limit counts ops: an element-wise function of one value is one
        assert _size(bp.piece.nodes, cap.info)[0] <= 12
    torch.testing.assert_close(cap.reference()(*[x.double() for x in xs]), fn(*[x.double() for x in xs]))


def test_a_lone_matmul_is_not_worth_a_search():
    cap = from_torch(lambda x, w: F.linear(x, w), r(4, 8), r(6, 8))
    assert cap.pieces == []
    assert len(from_torch(lambda x, w: F.linear(x, w), r(4, 8), r(6, 8), min_ops=1).pieces) == 1


def test_size_limits_are_checked():
    with pytest.raises(mg.ConfigError, match="max_piece_matmuls"):
        from_torch(lambda x: x * 2, r(2), max_piece_matmuls=0)
    with pytest.raises(mg.ConfigError, match="max_piece_ops"):
        mugraph_backend = __import__("mugraph.frontend", fromlist=["x"]).mugraph_backend
        mugraph_backend(None, [], options={"max_piece_ops": "many"})
