"""Matmuls of rank 4 inside a block lower to one batched ``tl.dot`` (batch dims flattened):
a grouped-query attention's block holds several heads, its tiles (1, heads, rows, d). On the
CUDA cores the same product held (heads, rows, d, keys) values at once and spilled (0.9–7 ms
where the op-by-op program ran 30–36 μs, H200). Checked against float64 under the
interpreter, with the online softmax's rescaled accumulators and a split over the keys."""

import pytest
import torch

import mugraph.core.builder as b
from lower import KernelConfig
from lower.runtime import compile as lower_compile
from lower.testing import rel_error
from mugraph.core.ir import BlockGraph, KernelGraph
from search.rewrite import split_loop


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


HEADS, ROWS, D, KEYS = 4, 3, 32, 96  # rows and key steps off the powers of two, as in real decode


def _attention(F: int = 3) -> KernelGraph:
    """One block over every head; a loop over the keys with a running max (online softmax)."""
    kg = KernelGraph("gqa_block")
    Q = kg.input("Q", (1, HEADS, ROWS, D), "float32")
    K = kg.input("K", (1, HEADS, D, KEYS), "float32")
    V = kg.input("V", (1, HEADS, KEYS, D), "float32")
    bg = BlockGraph(grid=(1, 1, 1), forloop=F)
    q = bg.input(Q, imap=(None,), fmap=None)
    k = bg.input(K, imap=(None,), fmap=3)
    v = bg.input(V, imap=(None,), fmap=2)
    s = q @ k
    m = b.max(s, 3)
    e = b.exp(s - m)
    num = bg.accum(e @ v, m)
    den = bg.accum(b.sum(e, 3), m)
    bg.output(num / den, omap=(None,))
    (y,) = kg.kernel(bg)
    kg.output(y)
    return kg


def _reference(ins):
    q, k, v = (ins[n].double() for n in ("Q", "K", "V"))
    return torch.softmax(q @ k, -1) @ v


@pytest.mark.parametrize("split", [None, 3])
def test_a_block_of_several_heads_multiplies_on_tensor_cores(split):
    g = _attention()
    if split:
        g = split_loop(g, next(op.id for op in g.ops if op.kind == "graph_defined"), split)
        assert g is not None
    gen = torch.Generator().manual_seed(1)
    ins = {t.name: torch.randn(t.shape, generator=gen) for t in g.inputs}
    prog = lower_compile(g, device="cpu", configs={op.id: KernelConfig(num_warps=4) for op in g.ops
                                                   if op.kind == "graph_defined"})
    src = prog.triton_source()
    assert "tl.dot(tl.reshape(" in src and "on the CUDA cores" not in src
    out = prog(*[ins[t.name] for t in g.inputs])
    out = out[0] if isinstance(out, (list, tuple)) else out
    assert rel_error(out, _reference(ins)) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rank", [2, 4])
def test_heads_times_one_shared_matrix_is_one_2d_dot(dtype, rank):
    """RoPE's rotation in a block of several heads: (1, heads, 1, d) @ (d, d) — or the same
    matrix as (1, 1, d, d) — multiplies the heads' rows in one 2-D dot, with no broadcast
    copy of the matrix per head; checked against float64 under the interpreter."""
    heads, d = 4, 32
    kg = KernelGraph("rope_block")
    Q = kg.input("Q", (1, heads, 1, d), dtype)
    C = kg.input("C", (1, 1, 1, d), dtype)
    S = kg.input("S", (1, 1, 1, d), dtype)
    R = kg.input("R", (d, d) if rank == 2 else (1, 1, d, d), dtype)
    bg = BlockGraph(grid=(1, 1, 1), forloop=1)
    q, c, s, rot = (bg.input(t) for t in (Q, C, S, R))
    bg.output(bg.accum(q * c + (q @ rot) * s))
    (y,) = kg.kernel(bg)
    kg.output(y)
    prog = lower_compile(kg, device="cpu")
    src = prog.triton_source()
    assert "tl.dot(tl.reshape(" in src and "broadcast_to" not in src.split("tl.dot(")[1].split("out_dtype")[0]
    gen = torch.Generator().manual_seed(2)
    tdt = getattr(torch, dtype)
    ins = {t.name: torch.randn(t.shape, generator=gen).to(tdt) for t in kg.inputs}
    out = prog(*[ins[t.name] for t in kg.inputs])
    out = out[0] if isinstance(out, (list, tuple)) else out
    q64, c64, s64, r64 = (ins[n].double() for n in ("Q", "C", "S", "R"))
    want = q64 * c64 + (q64 @ r64.reshape(d, d)) * s64
    assert rel_error(out.double(), want) < (1e-5 if dtype == "float32" else 1e-2)
