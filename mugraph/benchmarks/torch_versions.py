"""The six benchmarks written directly in PyTorch: the baselines every timing
table compares with (eager, ``torch.compile``) and, for attention, the same
function through ``scaled_dot_product_attention``."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


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

SDPA: dict[str, Callable[..., torch.Tensor]] = {
    "gqa": lambda Q, K, V: F.scaled_dot_product_attention(Q, K.transpose(1, 2), V, scale=1.0),
    "qknorm_gqa": lambda Q, K, V: F.scaled_dot_product_attention(
        _rms(Q, -1), _rms(K, 1).transpose(1, 2), V, scale=1 / 8),
}
"""Attention through SDPA (its softmax subtracts the max: same function, safer numerics)."""
