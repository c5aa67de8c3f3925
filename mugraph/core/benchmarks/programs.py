"""The benchmark programs (docs/design.md §8.5), fp16, Mirage's shapes at ``b`` = 1 or 8.

``gated_mlp`` and ``lora`` scale their token count with ``b`` (8·b and 16·b rows),
so b=1 gives exactly the table of docs/design.md §8.5.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

from .. import builder as mg
from ..fills import causal_mask
from ..ir import Program


def rmsnorm_matmul(b: int = 1, hidden: int = 4096, out: int = 6144, dtype: str = "float16") -> Program:
    p = Program("rmsnorm_matmul")
    X = p.input("X", (2 * b, hidden), dtype)
    G = p.input("G", (hidden,), dtype)
    W = p.input("W", (hidden, out), dtype)
    p.output(mg.matmul(X * G / mg.sqrt(mg.mean(mg.square(X), -1)), W))
    return p


def gated_mlp(b: int = 1, hidden: int = 4096, out: int = 4096, dtype: str = "float16", act: str = "silu",
              rows: int | None = None) -> Program:
    """``act(X @ W1) · (X @ W2)``: an MLP's gate and up projections with the gate applied
    (``act``: ``silu``, or ``gelu_tanh`` as Gemma's). ``rows``: X's rows (default ``8·b``)."""
    p = Program("gated_mlp")
    X = p.input("X", (8 * b if rows is None else rows, hidden), dtype)
    W1 = p.input("W1", (hidden, out), dtype)
    W2 = p.input("W2", (hidden, out), dtype)
    p.output(getattr(mg, act)(X @ W1) * (X @ W2))
    return p


def lora(b: int = 1, hidden: int = 256, out: int = 4096, rank: int = 16, dtype: str = "float16") -> Program:
    p = Program("lora")
    X = p.input("X", (16 * b, hidden), dtype)
    W = p.input("W", (hidden, out), dtype)
    A = p.input("A", (hidden, rank), dtype)
    B = p.input("B", (rank, out), dtype)
    p.output(X @ W + (X @ A) @ B)
    return p


def _attention_inputs(p: Program, b: int, queries: int, head_dim: int, kv: int, dtype: str):
    Q = p.input("Q", (2 * b, queries, head_dim), dtype)
    K = p.input("K", (2 * b, head_dim, kv), dtype)
    V = p.input("V", (2 * b, kv, head_dim), dtype)
    return Q, K, V


def gqa(b: int = 1, queries: int = 256, head_dim: int = 64, kv: int = 4096, dtype: str = "float16") -> Program:
    p = Program("gqa")
    Q, K, V = _attention_inputs(p, b, queries, head_dim, kv, dtype)
    E = mg.exp(Q @ K)
    p.output((E / mg.sum(E, 2)) @ V)
    return p


def qknorm_gqa(b: int = 1, queries: int = 256, head_dim: int = 64, kv: int = 4096,
               dtype: str = "float16") -> Program:
    p = Program("qknorm_gqa")
    Q, K, V = _attention_inputs(p, b, queries, head_dim, kv, dtype)
    Qn = mg.rms_norm(Q, -1)
    Kn = mg.rms_norm(K, 1)
    E = mg.exp((Qn @ Kn) / 8)
    p.output((E / mg.sum(E, 2)) @ V)
    return p


def ntrans(b: int = 1, hidden: int = 4096, dtype: str = "float16") -> Program:
    p = Program("ntrans")
    H = p.input("H", (8 * b, hidden), dtype)
    X = p.input("X", (8 * b, hidden), dtype)
    A = p.input("A", (8 * b, hidden), dtype)
    p.output(mg.rms_norm(H + A * (mg.rms_norm(X) - H)))
    return p


def decode_scale(head_dim: int) -> Fraction:
    """``1/√head_dim`` as the rational the decode programs multiply by (a Lax constant is
    rational: 1/8 for 64, 1/√128 to 6 digits for 128); SDPA is given the same number."""
    return Fraction(1 / math.sqrt(head_dim)).limit_denominator(10**6)


def decode_attention(b: int = 1, heads: int = 32, kv_heads: int = 8, kv: int = 4096, head_dim: int = 128,
                     dtype: str = "float16", safe: bool = False) -> Program:
    """One decoding step of grouped-query attention: one query row per head, ``kv`` cached keys.

    ``b`` sequences × ``kv_heads`` KV heads; the ``heads / kv_heads`` query heads that share a
    KV head are the rows of its Q (as :func:`gqa` puts a head's query rows): Q ``(b·kv_heads,
    heads/kv_heads, head_dim)``, K ``(b·kv_heads, head_dim, kv)`` (transposed, as in
    :func:`gqa`), V ``(b·kv_heads, kv, head_dim)``; softmax without the max subtraction, as
    the benchmarks write it: ``exp(Q·K·scale) / Σ · V``. ``safe=True``: as real code writes
    it, with the row max subtracted (``exp(S − max S)``, a free shift: docs/design.md §3.3)."""
    if heads % kv_heads:
        raise ValueError(f"decode_attention: heads={heads} is not a multiple of kv_heads={kv_heads}")
    p = Program(f"decode_h{heads}_kv{kv_heads}_n{kv}_d{head_dim}" + ("_safe" if safe else ""))
    Q = p.input("Q", (b * kv_heads, heads // kv_heads, head_dim), dtype)
    K = p.input("K", (b * kv_heads, head_dim, kv), dtype)
    V = p.input("V", (b * kv_heads, kv, head_dim), dtype)
    S = mg.scale(Q @ K, decode_scale(head_dim))
    E = mg.exp(S - mg.max(S, 2) if safe else S)
    p.output((E / mg.sum(E, 2)) @ V)
    return p


def prefill_attention(heads: int = 16, q: int = 1024, kv: int = 1024, head_dim: int = 64, causal: bool = False,
                      dtype: str = "float16", safe: bool = True) -> Program:
    """Attention over a prompt: ``q`` query rows per head against ``kv`` keys, the layouts of
    :func:`decode_attention` (Q ``(heads, q, head_dim)``, K ``(heads, head_dim, kv)``, V
    ``(heads, kv, head_dim)``), with the row max subtracted unless ``safe=False``.
    ``causal``: an additive input ``bias`` ``(q, kv)`` joins the scores before the max, 0
    where query ``i`` sees key ``j`` (SDPA's ``is_causal``: ``j ≤ i``) and the dtype's
    lowest value elsewhere: a fill (:func:`mugraph.causal_mask`), so kernels make it from
    positions and the caller passes nothing. Added before the max, not multiplied after the
    exp: a max over masked scores far above the visible ones would leave the visible
    exponentials underflowing (measured: 4.5e-2 relative error at logits ×30 with a 0/1
    factor)."""
    p = Program(f"prefill_h{heads}_q{q}_n{kv}_d{head_dim}" + ("_causal" if causal else "") + ("_safe" if safe else ""))
    Q = p.input("Q", (heads, q, head_dim), dtype)
    K = p.input("K", (heads, head_dim, kv), dtype)
    V = p.input("V", (heads, kv, head_dim), dtype)
    S = mg.scale(Q @ K, decode_scale(head_dim))
    if causal:
        S = S + p.input("bias", (q, kv), dtype, fill=causal_mask())
    E = mg.exp(S - mg.max(S, 2) if safe else S)
    p.output((E @ V) / mg.sum(E, 2))
    return p


#: prompt-shaped attention programs (:func:`prefill_attention`), name -> sizes
PREFILL: dict[str, dict] = {
    "prefill_h16_q1024_n1024_d64": dict(heads=16, q=1024, kv=1024, head_dim=64),
    "prefill_h32_q2048_n2048_d128": dict(heads=32, q=2048, kv=2048, head_dim=128),
    "prefill_h16_q1024_n1024_d64_causal": dict(heads=16, q=1024, kv=1024, head_dim=64, causal=True),
    "prefill_h32_q2048_n2048_d128_causal": dict(heads=32, q=2048, kv=2048, head_dim=128, causal=True),
    # long prompts: the programs' scores (2^30 elements) are evaluated in slices of query rows
    "prefill_h16_q8192_n8192_d128": dict(heads=16, q=8192, kv=8192, head_dim=128),
    "prefill_h16_q8192_n8192_d128_causal": dict(heads=16, q=8192, kv=8192, head_dim=128, causal=True),
}


#: decode-shaped attention programs (not among the six benchmarks: no hand-written reference),
#: name -> :func:`decode_attention` sizes: LLaMA-3-8B-like (32 heads over 8 KV heads, d 128),
#: a 2k-token MHA-ish cache at d 64, an 8k-token cache with 16 heads over 4 KV heads, one
#: query row per KV head over 32k keys, eight per KV head over 16k
DECODE: dict[str, dict] = {
    "decode_h32_kv8_n4096_d128": dict(heads=32, kv_heads=8, kv=4096, head_dim=128),
    "decode_h8_kv2_n2048_d64": dict(heads=8, kv_heads=2, kv=2048, head_dim=64),
    "decode_h16_kv4_n8192_d128": dict(heads=16, kv_heads=4, kv=8192, head_dim=128),
    "decode_h8_kv8_n32768_d128": dict(heads=8, kv_heads=8, kv=32768, head_dim=128),
    "decode_h64_kv8_n16384_d128": dict(heads=64, kv_heads=8, kv=16384, head_dim=128),
}


PROGRAMS: dict[str, Callable[..., Program]] = {
    "rmsnorm_matmul": rmsnorm_matmul, "gated_mlp": gated_mlp, "lora": lora,
    "gqa": gqa, "qknorm_gqa": qknorm_gqa, "ntrans": ntrans,
}

#: reduced sizes (same structure) for fast tests and CPU runs
SMALL: dict[str, dict] = {
    "rmsnorm_matmul": {"hidden": 256, "out": 512},
    "gated_mlp": {"hidden": 256, "out": 256},
    "lora": {"hidden": 64, "out": 256},
    "gqa": {"queries": 32, "head_dim": 16, "kv": 256},
    "qknorm_gqa": {"queries": 32, "head_dim": 16, "kv": 256},
    "ntrans": {"hidden": 256},
}


def program(name: str, b: int = 1, small: bool = False, **sizes) -> Program:
    """Build benchmark ``name`` (one of :data:`PROGRAMS` or :data:`DECODE`); ``small=True``
    uses the reduced sizes of :data:`SMALL` (the decode programs: a 256-key cache, d 16)."""
    if name in DECODE:
        kw = {**DECODE[name], **({"kv": 256, "head_dim": 16} if small else {}), **sizes}
        return decode_attention(b=b, **kw)
    if name not in PROGRAMS:
        raise KeyError(f"unknown benchmark {name!r}; choose from {sorted(PROGRAMS) + sorted(DECODE)}")
    kw = {**(SMALL[name] if small else {}), **sizes}
    return PROGRAMS[name](b=b, **kw)
