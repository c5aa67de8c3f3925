"""Real model families under ``torch.compile(backend="mugraph")``, against eager (docs/models.md).

Tiny random-weight configurations (hidden 64, 4 query and 2 key/value heads, intermediate
128, float32, CPU) of the decoder layers of five Hugging Face families — LLaMA, Qwen2
(biased q/k/v projections), Mistral, Phi-3 (fused qkv and gate_up projections), Gemma
(GeLU-tanh MLP, ``1 + weight`` norms) — and of four more — Qwen3 (per-head q/k norms),
OLMo-2 (norms after attention and MLP), StarCoder2 and Phi-2 (LayerNorm, biases, a GeLU
MLP; Phi-2's attention and MLP in parallel, RoPE on part of each head) — and a two-layer
LLaMA that generates greedily.

What these tests check is the front end on real code: capture, partition, every piece a
Lax Program, lowered, stitched back, and the result equal to eager's. The search is kept
minimal (one kernel op, one block op: it returns the program itself, in well under a
second) and ``unfused="lower"`` runs each piece's lowered kernels anyway, under Triton's
interpreter; Inductor is off, its C++ compile being most of a CPU compile's time. Real
searches are tested in test_backend.py and test_norm_search.py.
"""

import importlib

import pytest
import torch

import mugraph as mg
import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.frontend import recent_graphs

transformers = pytest.importorskip("transformers")  # the 'torch' extra: pip install 'mugraph[torch]'

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, SEQ = 64, 4, 2, 128, 4
HEAD_DIM = HIDDEN // HEADS

#: the backend's options: the shortest search, and every piece run lowered
QUICK = {"time_limit": 1.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower",
         "inductor": False}

#: family -> (config class, class-name prefix, config fields beyond the shared ones)
FAMILIES = {
    "llama": ("LlamaConfig", "Llama", {}),
    "qwen2": ("Qwen2Config", "Qwen2", {}),
    "mistral": ("MistralConfig", "Mistral", {}),
    "phi3": ("Phi3Config", "Phi3", {}),
    "gemma": ("GemmaConfig", "Gemma", {"head_dim": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh"}),
    # beyond the five the benchmarks report: other norms and their places
    "qwen3": ("Qwen3Config", "Qwen3", {"head_dim": HEAD_DIM}),
    "olmo2": ("Olmo2Config", "Olmo2", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2", {}),
    "phi": ("PhiConfig", "Phi", {"partial_rotary_factor": 0.5}),
}
#: the fewest pieces each family's layer is cut into (a fused product is one piece; an
#: activation's q, k and v projections are one piece with its norm)
MIN_PIECES = {"phi3": 7, "qwen3": 10, "olmo2": 9, "starcoder2": 9, "phi": 8}


def config(family: str, layers: int = 1, **extra):
    name, _, fields = FAMILIES[family]
    cfg = getattr(transformers, name)(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, **fields, **extra)
    cfg._attn_implementation = "eager"  # matmul, softmax, matmul in ATen (SDPA would be one library op)
    return cfg


def decoder_layer(family: str):
    """The family's decoder layer and rotary embedding, weights random; norm weights and
    biases too (their initial ones and zeros would hide a misplaced one)."""
    cfg = config(family)
    prefix = FAMILIES[family][1]
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    torch.manual_seed(0)
    layer = getattr(mod, f"{prefix}DecoderLayer")(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return layer, getattr(mod, f"{prefix}RotaryEmbedding")(cfg)


def library_targets(cap) -> set[str]:
    return {getattr(n.target, "__name__", str(n.target)) for n in cap.library}


def input_shapes(cap) -> set[tuple]:
    return {tuple(t.shape) for bp in cap.pieces for t in bp.program.inputs}


#: what each family adds to LLaMA's layer, seen in its capture
FEATURES = {
    # the k and v projections' biases are read inside pieces
    "qwen2": lambda cap: (KV_HEADS * HEAD_DIM,) in input_shapes(cap),
    # gate and up, which meet again in SiLU·mul, are cut by slices of their weight (design
    # §10.1), read in place at the pieces' boundary: two projections, as in LLaMA; q, k and
    # v, read apart, are slices of the one product outside every piece
    "phi3": lambda cap: (HIDDEN, INTERMEDIATE) in input_shapes(cap)
    and sum(n.target == torch.ops.aten.slice.Tensor for n in cap.library) >= 5
    and not any(op.kind == "slice" for bp in cap.pieces for op in bp.program.ops),
    # the GeLU-tanh is inside a piece, not a library call
    "gemma": lambda cap: not any("gelu" in t or "tanh" in t for t in library_targets(cap)),
    # LayerNorm is traced op by op into pieces, not one library call
    "starcoder2": lambda cap: not any("layer_norm" in t for t in library_targets(cap)),
    "phi": lambda cap: not any("layer_norm" in t for t in library_targets(cap)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoder_layer_matches_eager(family, piece_cache):
    layer, rope = decoder_layer(family)
    x = torch.randn(1, SEQ, HIDDEN, generator=torch.Generator().manual_seed(1))
    cos, sin = rope(x, torch.arange(SEQ)[None])
    mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)[None, None]

    def run(h, cos, sin, mask):
        out = layer(h, attention_mask=mask, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out

    torch._dynamo.reset()
    with torch.no_grad():
        want = run(x, cos, sin, mask)
        got = torch.compile(run, backend="mugraph", options={**QUICK, "cache_dir": piece_cache})(x, cos, sin, mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    (compiled,) = [c for c in recent_graphs() if c.captured][-1:]
    (cap,) = compiled.captured.values()
    # Phi-3's fused q, k and v stay one product, which its norm's piece writes whole
    assert len(cap.pieces) >= MIN_PIECES.get(family, 8), cap.summary()
    for bp in cap.pieces:
        mg.check_lax(bp.program)
        assert bp.info.get("runs") == "mugraph", (bp.name, bp.info)  # searched, lowered, run
    assert cap.kept == cap.pieces
    assert FEATURES.get(family, lambda cap: True)(cap), cap.summary()


def test_llama_generates_eagers_tokens(tmp_path, mugraph_log):
    """Greedy generation of 16 tokens by a two-layer LLaMA, its forward compiled by the backend.

    The KV cache is transformers' static cache (``cache_implementation="static"``, what
    transformers recommends with ``torch.compile``): its tensors have the full length from
    the start, so every decode step has the same shapes — the backend compiles two graphs
    (the prefill and one decode step) and searches each piece once, instead of meeting a
    new cache length, a new signature to trace and new pieces to search, at every step.
    ``disable_compile=True`` stops ``generate`` from compiling the forward again with its
    own backend (it does so on a GPU with a static cache).

    Searches are counted: with a fresh cache and a seed of its own, each distinct piece
    (structure and shapes) is announced once, and the two layers' identical pieces share it."""
    cfg = config("llama", layers=2, initializer_range=0.2)  # larger weights: varied tokens, not a cycle
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=16, do_sample=False, cache_implementation="static", disable_compile=True)
    torch._dynamo.reset()
    before = {id(c) for c in recent_graphs()}
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="mugraph",
                                      options={**QUICK, "cache_dir": str(tmp_path), "seed": 97})
        got = model.generate(ids, **kw)
    assert want.shape == (1, 5 + 16) and len(set(want[0, 5:].tolist())) > 8  # not a cycle of two tokens
    assert got.tolist() == want.tolist()
    graphs = [c for c in recent_graphs() if id(c) not in before]
    # two dynamo graphs (prefill, decode), each traced at one signature: nothing per decode step
    assert sorted(len(c.variants) for c in graphs) == [1, 1], [len(c.variants) for c in graphs]
    caps = [cap for c in graphs for cap in c.captured.values()]
    names = [bp.name for cap in caps for bp in cap.pieces]
    searches = [m for m in mugraph_log.messages if "new search" in m]
    assert len(searches) == len(set(names)) < len(names), (len(searches), len(set(names)), len(names))
    assert all(cap.kept == cap.pieces for cap in caps)
