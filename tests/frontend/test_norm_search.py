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
    x = torch.randn(2, 64, generator=g)
    with torch.no_grad():
        # its 11 catalog ops as captured (rsqrt is 1/sqrt: 3 ops) are over the default cut's
        # 8, which would make two pieces of it (the norm's core, and weight + projection)
        cap = from_torch(m, x, max_piece_ops=12)
        (bp,) = cap.pieces
        kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
        # eps and the weight are in the piece; the weight's transpose is a view at its boundary
        assert {"const", "add", "sqrt", "div", "mul", "matmul"} <= set(kinds) and "permute" not in kinds
        compiled = cap.compile(time_limit=15.0, cache_dir=piece_cache)
        y = compiled(x)
    info = bp.info
    # the search returned a verified μGraph of one kernel, where the program is one kernel per op
    assert info["origin"] == "search" and info["kernels"] == 1 < len(kinds), info
    assert cap.kept == [bp] and bp.strided == {"x2": (1, 64)}
    torch.testing.assert_close(y, m(x), atol=1e-5, rtol=1e-5)
