"""What Triton makes of the generated kernels on a GPU, checked on the CPU: each kernel is
compiled ahead of time for sm_90 (``lower.testing.gpu_ttgir``) and its Triton GPU IR read.

The loads a loop's ``tl.dot`` reads must be software-pipelined (asynchronous copies into
shared memory, a stage ahead). A decode attention's block holds one KV head: (1, rows, d)
tiles with few rows, lowered to ``mma`` rather than ``wgmma``. Loaded at rank 3 and reshaped
for the dot, Triton (3.6 and 3.9) staged none of them; its kernels waited for every load and
the large-tile variants spilled (a 128 × 256 key tile: 10 KB of spill stores a thread)."""

from __future__ import annotations

import math

import pytest
import torch

import lower
import mugraph as mg
from lower.config import KernelConfig
from lower.testing import gpu_ttgir

pytest.importorskip("triton.backends.nvidia")


def decode_block(heads: int, rows: int, d: int, kv: int, keys: int, k_rows: bool = False) -> mg.KernelGraph:
    """The online decode attention: a block per KV head, ``keys`` keys a loop step.
    ``k_rows``: K stored a key per row, as a KV cache holds it, its tile permuted in the
    block (a permute the lowering folds into the load)."""
    g = mg.KernelGraph("decode")
    Q = g.input("Q", (heads, rows, d), "float16")
    K = g.input("K", (heads, kv, d) if k_rows else (heads, d, kv), "float16")
    V = g.input("V", (heads, kv, d), "float16")
    b = mg.BlockGraph(grid=(heads, 1, 1), forloop=kv // keys)
    qt, vt = b.input(Q, (0, None, None), None), b.input(V, (0, None, None), 1)
    kt = mg.permute(b.input(K, (0, None, None), 1), (0, 2, 1)) if k_rows else b.input(K, (0, None, None), 2)
    s = mg.scale(qt @ kt, 1 / math.sqrt(d))
    m = mg.max(s, 2)
    e = mg.exp(s - m)
    b.output(b.accum(e @ vt, m) / b.accum(mg.sum(e, 2), m), (0, None, None))
    (o,) = g.kernel(b)
    g.output(o)
    return g


def _program(g: mg.KernelGraph, label: str) -> tuple[str, dict[str, tuple[int, int]]]:
    op = next(o for o in g.ops if o.kind == "graph_defined")
    prog = lower.compile(g, device="cpu", configs={op.id: KernelConfig.from_label(label)})
    launches = {ln.fn: (ln.num_warps, ln.num_stages) for s in prog.steps if s.kernel for ln in s.kernel.launches}
    return prog.triton_source(), launches


def test_decode_loop_loads_are_staged():
    """One block per KV head over 8 query rows, 128 keys a step: one kernel, split-K with a
    combine kernel, and split-K with sub-tiled columns; K a key per row; one query row per
    head at head dim 96 (a tl.dot padded to 16 rows: on the CUDA cores its loads were not
    staged, and a 128-key step spilled)."""
    g = decode_block(heads=4, rows=8, d=128, kv=4096, keys=128)
    labels = ["w4s3", "w4s3k4", "w4s2k8p4:2"]
    rows_k = decode_block(heads=4, rows=8, d=128, kv=4096, keys=128, k_rows=True)
    one_row = decode_block(heads=32, rows=1, d=96, kv=8192, keys=128, k_rows=True)
    programs = [_program(g, lab) for lab in labels] + [_program(rows_k, "w4s3"), _program(one_row, "w4s3k8")]
    for label, irs in zip(labels + ["K a key per row", "one query row per head"], gpu_ttgir(programs)):
        loop_kernel = next(ir for name, ir in irs.items() if not name.endswith("_combine"))
        # K and V each staged ahead of their dots
        assert loop_kernel.count("async_copy_global_to_local") >= 2, label


@pytest.mark.parametrize("k_rows,rows", [(False, 8), (True, 8), (True, 1)])
def test_the_staged_kernel_still_computes_attention(k_rows, rows):
    """Under the interpreter, against float64, with large logits (the running max at work);
    one query row per head too (its matmuls padded to 16 rows for tl.dot)."""
    g = decode_block(heads=2, rows=rows, d=32, kv=256, keys=64, k_rows=k_rows)
    gen = torch.Generator().manual_seed(0)
    x = {"Q": 8 * torch.randn(2, rows, 32, generator=gen), "K": torch.randn(2, 32, 256, generator=gen),
         "V": torch.randn(2, 256, 32, generator=gen)}
    xd = {k: v.half().double() for k, v in x.items()}
    ref = torch.softmax(xd["Q"] @ xd["K"] / math.sqrt(32), -1) @ xd["V"]
    if k_rows:
        x["K"] = x["K"].transpose(1, 2).contiguous()
    op = next(o for o in g.ops if o.kind == "graph_defined")
    for label in ("w4s3", "w4s3k4"):
        prog = lower.compile(g, device="cpu", configs={op.id: KernelConfig.from_label(label)})
        out = prog(**{k: v.half() for k, v in x.items()}).double()
        assert (out - ref).abs().max().item() < 2e-3 * ref.abs().max().item(), label
