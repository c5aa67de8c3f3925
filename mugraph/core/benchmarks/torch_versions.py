"""The six benchmarks (and the decode-shaped attention programs) written directly in PyTorch: the baselines every timing
table compares with (eager, ``torch.compile``) and, for attention, the same
function through ``scaled_dot_product_attention``."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .programs import DECODE, decode_scale


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The torch function of a builder activation: ``silu``, or ``gelu_tanh`` (GeLU's tanh
    form, ``F.gelu(x, approximate="tanh")``)."""
    return (lambda t: F.gelu(t, approximate="tanh")) if name == "gelu_tanh" else getattr(F, name)


def _rms(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x / torch.sqrt(torch.mean(x * x, dim=dim, keepdim=True))


def _softmax_v(E: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return (E / E.sum(2, keepdim=True)) @ V


TORCH: dict[str, Callable[..., torch.Tensor]] = {
    "rmsnorm_matmul": lambda X, G, W: (X * G / torch.sqrt(torch.mean(X * X, -1, keepdim=True))) @ W,
    "gated_mlp": lambda X, W1, W2: F.silu(X @ W1) * (X @ W2),
    "lora": lambda X, W, A, B: X @ W + (X @ A) @ B,
    "gqa": lambda Q, K, V: _softmax_v(torch.exp(Q @ K), V),
    "qknorm_gqa": lambda Q, K, V: _softmax_v(torch.exp((_rms(Q, -1) @ _rms(K, 1)) / 8), V),
    "ntrans": lambda H, X, A: _rms(H + A * (_rms(X, -1) - H), -1),
}
"""Positional arguments in the order of the program's inputs."""


def _decode(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """A decode program (``programs.decode_attention``); its scale follows the head dim."""
    return _softmax_v(torch.exp((Q @ K) * float(decode_scale(Q.shape[-1]))), V)


TORCH.update({name: _decode for name in DECODE})

def _sdpa(q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA on the benchmarks' 3-D (heads, rows, dim) tensors. Its fused kernels (flash,
    memory-efficient) take only 4-D inputs whose last dim is contiguous; 3-D inputs or
    K given as a strided transpose fall back to the unfused math path (~10× slower on
    the H100: gqa b=8 480 μs). So: one leading batch dim, and K^T copied contiguous
    (that copy — 0.5 MB at b=1 — is part of this function; the timed baselines use
    :func:`sdpa_call`, which makes it once beforehand)."""
    return F.scaled_dot_product_attention(q[None], k_t.contiguous()[None], v[None], scale=scale)[0]


SDPA: dict[str, Callable[..., torch.Tensor]] = {
    "gqa": lambda Q, K, V: _sdpa(Q, K.transpose(1, 2), V, 1.0),
    "qknorm_gqa": lambda Q, K, V: _sdpa(_rms(Q, -1), _rms(K, 1).transpose(1, 2), V, 1 / 8),
}
"""Attention through SDPA (its softmax subtracts the max: same function, safer numerics).
The decode programs' rows (the query heads sharing a KV head) are SDPA's query rows of
that KV head — a form that leaves most of the GPU idle when the KV heads are few (H200,
16 heads over 4 KV heads, 8k keys: 97.6 μs, where one row per query head with
``enable_gqa`` runs 10.3); :func:`sdpa_forms` also gives the forms a decoding model calls."""

SDPA.update({name: lambda Q, K, V: _sdpa(Q, K.transpose(1, 2), V, float(decode_scale(Q.shape[-1])))
             for name in DECODE})


def _sdpa_nd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale)[0]


_SDPA_KEYS_ROWS: dict[str, Callable[..., torch.Tensor]] = {
    "gqa": lambda Q, K, V: _sdpa_nd(Q, K, V, 1.0),
    "qknorm_gqa": lambda Q, K, V: _sdpa_nd(_rms(Q, -1), _rms(K, -1), V, 1 / 8),
}
_SDPA_KEYS_ROWS.update({name: lambda Q, K, V: _sdpa_nd(Q, K, V, float(decode_scale(Q.shape[-1]))) for name in DECODE})


def sdpa_call(name: str, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The timed SDPA baseline: K laid out once as SDPA and a KV cache keep it — (heads,
    keys, dim), contiguous — before the call, not inside it. The programs take K as
    (heads, dim, keys); :data:`SDPA` copies that transpose on every call, which at decode
    shapes (8 MB for ``decode_h32_kv8_n4096_d128``) costs more than the attention."""
    K_rows = K.transpose(1, 2).contiguous()
    fn = _SDPA_KEYS_ROWS[name]
    return lambda: fn(Q, K_rows, V)


def sdpa_forms(name: str, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Every form of the SDPA baseline a caller writes, K laid out once beforehand (as
    :func:`sdpa_call`): ``rows`` (:func:`sdpa_call`) and, for a decode program, one row per
    query head as a decoding model calls it — against the KV heads with ``enable_gqa``
    (``gqa``), or with K and V repeated per query head inside the call, as transformers'
    ``repeat_kv`` does (``repeat_kv``). Time them all and compare with the fastest: the rows
    form alone flatters a decode kernel."""
    forms = {"rows": sdpa_call(name, Q, K, V)}
    if name in DECODE:
        K_rows = K.transpose(1, 2).contiguous()
        kv_heads, group, d = Q.shape
        q = Q.reshape(1, kv_heads * group, 1, d)
        scale = float(decode_scale(d))
        forms["gqa"] = lambda: F.scaled_dot_product_attention(q, K_rows[None], V[None], scale=scale,
                                                               enable_gqa=True)
        forms["repeat_kv"] = lambda: F.scaled_dot_product_attention(
            q, K_rows.repeat_interleave(group, 0)[None], V.repeat_interleave(group, 0)[None], scale=scale)
    return forms
