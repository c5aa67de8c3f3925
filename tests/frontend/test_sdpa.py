"""Attention through the front end: ``F.scaled_dot_product_attention`` captured as one
``mugraph::attention`` node whose row writes a safe softmax — the max a free shift
(design §3.3), masks additive before it (a causal one made from positions), grouped-query heads read
without repeating K and V — compared, through mugraph's float64 interpreter, with
eager torch in float64; what cannot be mapped stays a torch call and says why."""

import logging
import math

import pytest
import torch
import torch.nn.functional as F

import mugraph as mg
import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.frontend import from_torch
from mugraph.frontend.aten import attention, regroup
from mugraph.frontend.backend import recent_graphs

aten = torch.ops.aten
g = torch.Generator().manual_seed(3)


def r(*shape):
    return torch.randn(*shape, generator=g)


def sdpa(**kw):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


def attention_piece(cap):
    """The one piece holding the attention node; it is Lax and holds the softmax whole."""
    (bp,) = [bp for bp in cap.pieces if any(n.target == attention for n in bp.piece.nodes)]
    mg.check_lax(bp.program)
    kinds = [op.kind for op in bp.program.ops]
    assert kinds.count("matmul") == 2 and kinds.count("max") == 1 and kinds.count("exp") == 1, kinds
    return bp


def check(fn, *xs, atol=1e-6):
    """Capture ``fn``; its attention is one piece; the captured form (pieces in the float64
    interpreter, the rest torch) equals ``fn`` run in float64."""
    cap = from_torch(fn, *xs)
    bp = attention_piece(cap)
    got = cap.reference()(*[x.double() if x.is_floating_point() else x for x in xs])
    want = fn(*[x.double() if x.is_floating_point() else x for x in xs])
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-6)
    return cap, bp


@pytest.mark.parametrize("queries,keys", [(6, 6), (4, 7), (7, 4)])
def test_causal_is_an_additive_fill_before_the_max(queries, keys):
    """``is_causal``: an additive band (0 where key j <= query i, aligned upper-left as torch
    aligns it, the lowest finite value elsewhere) added before the max, as a piece input
    with a fill — the kernels make it from positions instead of reading it."""
    cap, bp = check(sdpa(is_causal=True), r(2, 3, queries, 8), r(2, 3, keys, 8), r(2, 3, keys, 8))
    (m,) = bp.constants
    visible = torch.ones(queries, keys, dtype=torch.bool).tril()
    assert torch.equal(m[0, 0] == 0, visible) and (m[0, 0][~visible] == torch.finfo(torch.float32).min).all()
    (filled,) = [t for t in bp.program.inputs if t.fill is not None]
    assert filled.fill == mg.causal_mask()
    (add,) = [op for op in bp.program.ops if op.kind == "add"]
    assert filled in add.inputs  # S + M, then the max
    assert "mul" not in [op.kind for op in bp.program.ops]
    assert not cap.library or all(n.target == aten.transpose.int for n in cap.library)


def test_causal_grouped_rows_repeat_the_band_per_query_head():
    """Grouped-query heads stacked as rows: row r is query r mod L, so the fill has a period."""
    _, bp = check(sdpa(is_causal=True, enable_gqa=True), r(1, 4, 3, 8), r(1, 2, 5, 8), r(1, 2, 5, 8))
    (filled,) = [t for t in bp.program.inputs if t.fill is not None]
    assert filled.fill == mg.causal_mask(period=3) and filled.shape[-2:] == (6, 5)


def test_causal_is_exact_where_a_01_factor_underflows():
    """Hidden scores far above the visible ones: the additive band keeps them out of the max
    (a 0/1 factor after the exp would take their max and leave every visible term 0)."""
    q, k, v = r(1, 1, 4, 8), r(1, 1, 4, 8), r(1, 1, 4, 8)
    q[..., 0, :] = 1.0
    k[..., 1:, :] = 400.0  # the first query scores ~1,100 on keys it may not see: exp(−1,100) is 0 even in float64
    check(sdpa(is_causal=True), q, k, v)


def test_scale_default_and_explicit():
    q, k, v = r(1, 2, 5, 16), r(1, 2, 5, 16), r(1, 2, 5, 16)
    for kw, c in (({}, 1 / math.sqrt(16)), ({"scale": 0.3}, 0.3)):
        _, bp = check(sdpa(**kw), q, k, v)
        (op,) = [op for op in bp.program.ops if op.kind == "scale"]
        assert float(op.attrs["c"]) == c


def test_boolean_mask_with_a_row_that_sees_nothing():
    """A boolean mask becomes an additive one (torch code before the piece); a query row with no visible key is 0, as
    in SDPA (not 0/0): torch gives it every key and zeroes it after the piece."""
    m = torch.rand(2, 1, 5, 6, generator=g) > 0.4
    m[:, :, :, 0] = True
    m[1, 0, 3] = False
    check(sdpa(attn_mask=m), r(2, 3, 5, 8), r(2, 3, 6, 8), r(2, 3, 6, 8))


def test_additive_mask_with_inf_and_a_scale():
    """A float mask is added before the max; its ``-inf`` become the dtype's lowest value
    (exp still gives 0, and no value in the piece is infinite), a row all ``-inf`` is 0."""
    m = r(5, 6)
    m[1, 2] = m[2, :3] = m[4] = float("-inf")
    cap, bp = check(sdpa(attn_mask=m, scale=0.2), r(2, 3, 5, 8), r(2, 3, 6, 8), r(2, 3, 6, 8))
    assert [op.kind for op in bp.program.ops].count("add") == 1


@pytest.mark.parametrize("mask", ["causal", "bool", "per_head_float", "none"])
def test_grouped_query_heads(mask):
    """``enable_gqa``: Q's heads that share a KV head become rows, ``(b, kv, groups·L, d)``;
    K and V are read once per KV head, never repeated."""
    q, k, v = r(2, 6, 4, 8), r(2, 2, 5, 8), r(2, 2, 5, 8)
    kw = {"causal": {"is_causal": True}, "none": {},
          "bool": {"attn_mask": torch.rand(2, 1, 4, 5, generator=g) > 0.3},
          "per_head_float": {"attn_mask": r(2, 6, 4, 5)}}[mask]
    _, bp = check(sdpa(enable_gqa=True, **kw), q, k, v)
    assert [t.shape for t in bp.program.inputs[1:3]] == [(2, 2, 8, 5), (2, 2, 5, 8)]
    assert "repeat" not in [op.kind for op in bp.program.ops]  # (a shared mask's rows are tiled by torch)


def test_shared_mask_over_several_rows_is_tiled_outside_the_piece():
    """Eight new tokens over a cache, the mask shared by the query heads (a static cache's
    decode step): torch tiles its rows to the grouped layout before the piece, so the piece's
    mask input has groups · L rows and its Program holds no ``repeat`` — the same Program as
    one new token, more rows — and the captured graph still equals eager."""
    q, k, v, m = r(1, 8, 3, 16), r(1, 2, 6, 16), r(1, 2, 6, 16), r(1, 1, 3, 6)
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)  # noqa: E731
    cap, bp = check(fn, q, k, v, m)
    assert "repeat" not in [op.kind for op in bp.program.ops]
    assert bp.program.inputs[-1].shape == (1, 1, 4 * 3, 6)


def test_hugging_face_repeat_kv_becomes_grouped_heads():
    """``repeat_kv`` (``x[:, :, None].expand(…).reshape(…)``) of the keys and values read by an
    attention is folded into grouped-query heads: no repeated K or V is computed."""
    def repeat_kv(x, n):
        b, h, s, d = x.shape
        return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), is_causal=True)
    cap, bp = check(fn, r(1, 6, 5, 8), r(1, 2, 5, 8), r(1, 2, 5, 8))
    assert not [n for n in cap.library if n.target in (aten.expand.default, aten.clone.default)]
    assert [t.shape for t in bp.program.inputs[1:3]] == [(1, 2, 8, 5), (1, 2, 5, 8)]


def test_safe_softmax_rows_all_inf_are_zero():
    x = r(4, 6)
    x[2] = float("-inf")
    fn = lambda x, w: torch._safe_softmax(x, -1) @ w  # noqa: E731
    cap = from_torch(fn, x, r(6, 3))
    assert any(op.kind == "max" for bp in cap.pieces for op in bp.program.ops)
    got = cap.reference()(x.double(), torch.ones(6, 3, dtype=torch.float64))
    assert torch.equal(got[2], torch.zeros(3)) and not got.isnan().any()


@pytest.mark.parametrize("case", ["dropout", "float64"])
def test_unmappable_attention_stays_torch_with_a_reason(case):
    q, k, v = r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8)
    fn, xs, why = {"dropout": (sdpa(dropout_p=0.5), (q, k, v), "dropout_p=0.5"),
                   "float64": (sdpa(is_causal=True), (q.double(), k.double(), v.double()), "float64")}[case]
    cap = from_torch(fn, *xs)
    (n,) = [n for n in cap.library if n.target == attention]
    assert why in cap.info[n].why and "\n" not in cap.info[n].why
    assert not cap.pieces
    if case == "float64":  # the torch call it stays is SDPA itself
        torch.testing.assert_close(cap.reference()(*xs), fn(*xs))


def _llama_attention(impl: str, heads: int = 4, kv_heads: int = 2):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=32, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   intermediate_size=64, num_hidden_layers=1, vocab_size=16,
                                   max_position_embeddings=32)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    return LlamaAttention(cfg, layer_idx=0).eval(), LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("mask", [None, "padding"])
def test_hugging_face_sdpa_attention_is_one_piece(mask):
    """A LlamaAttention with the ``sdpa`` implementation: causal without a mask (SDPA's GQA),
    or with a padding mask (boolean, ``repeat_kv`` folded into GQA): the attention is one piece."""
    att, rope = _llama_attention("sdpa")
    x = r(2, 5, 32)
    cos, sin = rope(x, torch.arange(5)[None])
    bmask = None
    if mask:
        keep = torch.ones(2, 5, dtype=torch.bool)
        keep[1, :2] = False  # left padding: two query rows of sequence 1 see no key at all
        bmask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]

    def run(h, cos, sin, *m):
        return att(h, attention_mask=m[0] if m else None, position_embeddings=(cos, sin))[0]
    xs = (x, cos, sin) + ((bmask,) if mask else ())
    cap = from_torch(run, *xs)
    bp = attention_piece(cap)
    assert bp.program.inputs[1].shape[1] == 2  # K read at its 2 KV heads
    assert "reshape" not in [op.kind for op in bp.program.ops]  # Q's regrouping is torch code outside it
    with torch.no_grad():
        att.double()
        want = run(*[t.double() if t.is_floating_point() else t for t in xs])
        att.float()
    got = cap.reference()(*[t.double() if t.is_floating_point() else t for t in xs])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_hugging_face_eager_attention_is_one_piece():
    """The ``eager`` implementation writes the attention out (matmul, softmax, matmul): the
    size cut never cuts a softmax from the matmuls around it (partition.softmax_cores), so
    it is one piece under the default limits, as the SDPA call is."""
    att, rope = _llama_attention("eager")
    x = r(1, 5, 32)
    cos, sin = rope(x, torch.arange(5)[None])
    mask = torch.full((5, 5), torch.finfo(torch.float32).min).triu(1)[None, None]

    def run(h, cos, sin, m):
        return att(h, attention_mask=m, position_embeddings=(cos, sin))[0]
    cap = from_torch(run, x, cos, sin, mask)
    (bp,) = [bp for bp in cap.pieces if any(op.kind == "max" for op in bp.program.ops)]
    kinds = [op.kind for op in bp.program.ops]
    assert kinds.count("matmul") == 2 and {"exp", "sum", "div"} <= set(kinds)
    with torch.no_grad():
        att.double()
        want = run(*[t.double() for t in (x, cos, sin, mask)])
        att.float()
    got = cap.reference()(*[t.double() for t in (x, cos, sin, mask)])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_causal_gqa_attention_under_the_backend(piece_cache, caplog):
    """The real path on a tiny causal GQA attention: captured, searched (limits that keep the
    search to seconds), verified, lowered to Triton (the interpreter on a CPU), run."""
    caplog.set_level(logging.INFO, logger="mugraph")

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    q, k, v = r(1, 8, 4, 16).transpose(1, 2), r(1, 2, 8, 16), r(1, 2, 8, 16)  # q a strided view, as after a projection
    torch._dynamo.reset()
    with torch.no_grad():
        f = torch.compile(attn, backend="mugraph", options={
            "time_limit": 3.0, "cache_dir": piece_cache, "unfused": "lower",
            "search": {"max_kernel_ops": 1, "max_block_ops": 1}})
        y = f(q, k, v)
    torch.testing.assert_close(y, attn(q, k, v), atol=1e-5, rtol=1e-5)
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    bp = attention_piece(cap)
    assert bp.info.get("origin") in ("search", "program") and bp.info.get("runs") == "mugraph", bp.info
    assert bp.info["kernels"] >= 1


def _repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


@pytest.mark.parametrize("layout", ["decode", "strided"])
@pytest.mark.parametrize("form", ["enable_gqa", "repeat_kv"])
def test_grouped_query_regrouping_is_outside_the_piece(form, layout):
    """A grouped-query attention (a LLaMA decode step: one query row, an additive mask over
    the keys): Q's regrouping to ``(b, Hkv, groups·L, d)`` and the result's back are torch
    views at the piece's boundary (a copy by torch where Q's strides allow no view), so the
    piece is the attention alone — no ``reshape`` — and still equals eager."""
    queries = 1 if layout == "decode" else 3
    q = r(1, 8, queries, 16) if layout == "decode" else r(1, queries, 8, 16).transpose(1, 2)
    k, v, m = r(1, 2, 6, 16), r(1, 2, 6, 16), r(1, 1, 1, 6)
    if form == "enable_gqa":
        fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)  # noqa: E731
    else:
        fn = lambda q, k, v, m: F.scaled_dot_product_attention(  # noqa: E731
            q, _repeat_kv(k, 4), _repeat_kv(v, 4), attn_mask=m)
    cap, bp = check(fn, q, k, v, m)
    kinds = sorted(op.kind for op in bp.program.ops if op.kind != "input")
    assert kinds == sorted(["matmul", "scale", "add", "max", "sub", "exp", "matmul", "sum", "div"]), kinds
    assert [t.shape for t in bp.program.inputs] == [(1, 2, 4 * queries, 16), (1, 2, 16, 6), (1, 2, 6, 16),
                                                    (1, 1, 1, 6)]
    regroups = [n for n in cap.library if n.target in (aten.view.default, regroup)]
    assert len(regroups) == 2 and (layout == "strided") == any(n.target == regroup for n in regroups)


@pytest.mark.parametrize("mask", ["causal", "per_head_bool", "none"])
def test_grouped_query_form_runs_as_torch_where_unmapped(mask):
    """The grouped form the capture writes is the same attention as torch code too: in float64
    (no piece) the captured graph runs ``mugraph::attention`` with its groups, equal to SDPA."""
    kw = {"causal": {"is_causal": True}, "none": {},
          "per_head_bool": {"attn_mask": torch.rand(2, 6, 4, 5, generator=g) > 0.3}}[mask]
    fn = sdpa(enable_gqa=True, **kw)
    xs = (r(2, 6, 4, 8).double(), r(2, 2, 5, 8).double(), r(2, 2, 5, 8).double())
    cap = from_torch(fn, *xs)
    (n,) = [n for n in cap.library if n.target == attention]
    assert n.args[-1] == 3 and not cap.pieces
    torch.testing.assert_close(cap.reference()(*xs), fn(*xs))
