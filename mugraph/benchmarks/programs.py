"""The benchmark programs (DESIGN §7), fp16, Mirage's shapes at ``b`` = 1 or 8.

``gated_mlp`` and ``lora`` scale their token count with ``b`` (8·b and 16·b rows),
so b=1 gives exactly DESIGN's table.
"""

from __future__ import annotations

from typing import Callable

from .. import builder as mg
from ..ir import Program


def rmsnorm_matmul(b: int = 1, hidden: int = 4096, out: int = 6144, dtype: str = "float16") -> Program:
    p = Program("rmsnorm_matmul")
    X = p.input("X", (2 * b, hidden), dtype)
    G = p.input("G", (hidden,), dtype)
    W = p.input("W", (hidden, out), dtype)
    p.output(mg.matmul(X * G / mg.sqrt(mg.mean(mg.square(X), -1)), W))
    return p


def gated_mlp(b: int = 1, hidden: int = 4096, out: int = 4096, dtype: str = "float16") -> Program:
    p = Program("gated_mlp")
    X = p.input("X", (8 * b, hidden), dtype)
    W1 = p.input("W1", (hidden, out), dtype)
    W2 = p.input("W2", (hidden, out), dtype)
    p.output(mg.silu(X @ W1) * (X @ W2))
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
    """Build benchmark ``name``; ``small=True`` uses the reduced sizes of :data:`SMALL`."""
    if name not in PROGRAMS:
        raise KeyError(f"unknown benchmark {name!r}; choose from {sorted(PROGRAMS)}")
    kw = {**(SMALL[name] if small else {}), **sizes}
    return PROGRAMS[name](b=b, **kw)
