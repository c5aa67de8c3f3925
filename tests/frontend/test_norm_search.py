"""A captured RMSNorm with epsilon and weight followed by a projection — the piece a
LLaMA layer's norm and Q projection make — is searched into one fused kernel on the CPU
(docs/design.md §6.1, constants; §10.4, the reciprocal rewrite), verified, lowered,
and run against eager."""

import torch

from mugraph.frontend import from_torch

g = torch.Generator().manual_seed(11)


class NormLinear(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm (eps, weight) and a bias-free ``nn.Linear``."""

    def __init__(self, d: int = 64, out: int = 64, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d, generator=g) + 0.5)
        self.eps = eps
        self.proj = torch.nn.Linear(d, out, bias=False)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.proj(self.weight * h)


def test_rmsnorm_with_eps_and_weight_then_a_projection_is_one_fused_kernel(piece_cache):
    torch.manual_seed(0)
    m = NormLinear().eval()
    x = torch.randn(1, 2, 64, generator=g)  # (batch, seq, hidden), as a LLaMA layer passes it
    with torch.no_grad():
        # its 11 catalog ops as captured (rsqrt is 1/sqrt: 3 ops) are over the default cut's
        # 8, which would make two pieces of it (the norm's core, and weight + projection)
        cap = from_torch(m, x, max_piece_ops=12)
        (bp,) = cap.pieces
        kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
        # eps and the weight are in the piece; the weight's transpose and the linear's views
        # (moved up onto the input: design §10.1) are views at its boundary, read in place
        assert {"const", "add", "sqrt", "div", "mul", "matmul"} <= set(kinds)
        assert "permute" not in kinds and "reshape" not in kinds
        compiled = cap.compile(time_limit=7.0, cache_dir=piece_cache)
        y = compiled(x)
    info = bp.info
    # the search returned a verified μGraph of one kernel, where the program is one kernel per op
    assert info["origin"] == "search" and info["kernels"] == 1 < len(kinds), info
    assert cap.kept == [bp] and bp.strided == {"x2": (1, 64)}
    assert [tuple(t.shape) for t in bp.program.inputs] == [(2, 64), (64,), (64, 64)]
    torch.testing.assert_close(y, m(x), atol=1e-5, rtol=1e-5)


def test_a_product_with_a_reciprocal_is_searched_as_a_quotient():
    """``x · (1/√v)`` becomes ``x / √v`` (an identity of reals); a reciprocal something else
    reads stays for that reader; a rewrite that would change the product's shape is not made."""
    import numpy as np

    import mugraph as mg
    from mugraph.frontend.simplify import fold_reciprocals

    p = mg.Program("p")
    x, v = p.input("x", (4, 8)), p.input("v", (4, 1))
    r = mg.div(1, mg.sqrt(v))
    p.output(x * r)
    p.output(r * x + r)                                  # r read again: kept for the add
    wide = p.add_op("const", [], {"value": 1, "shape": (1, 1, 1), "dtype": "float16"})
    p.output(x * mg.div(wide, mg.sqrt(v)))                # (1, 4, 8): x / √v would be (4, 8)
    q = fold_reciprocals(p)
    kinds = [op.kind for op in q.ops if op.kind != "input"]
    assert kinds.count("div") == 4 and kinds.count("mul") == 1
    ins = {"x": np.random.default_rng(0).standard_normal((4, 8)), "v": np.random.default_rng(1).random((4, 1)) + 0.5}
    for a, b in zip(mg.evaluate(p, ins), mg.evaluate(q, ins)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)  # (one rounding fewer)
    assert fold_reciprocals(q) is q
