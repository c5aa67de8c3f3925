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
from online_graphs import decode_ugraph

pytest.importorskip("triton.backends.nvidia")


def _program(g: mg.KernelGraph, label: str) -> lower.CompiledProgram:
    op = next(o for o in g.ops if o.kind == "graph_defined")
    return lower.compile(g, device="cpu", configs={op.id: KernelConfig.from_label(label)})


def test_decode_loop_loads_are_staged():
    """One block per KV head over 8 query rows, 128 keys a step: one kernel, split-K with a
    combine kernel, and split-K with sub-tiled columns; K a key per row; one query row per
    head at head dim 96 (a tl.dot padded to 16 rows: on the CUDA cores its loads were not
    staged, and a 128-key step spilled)."""
    g = decode_ugraph(heads=4, rows=8, d=128, kv=4096, keys=128)
    labels = ["w4s3", "w4s3k4", "w4s2k8p4:2"]
    rows_k = decode_ugraph(heads=4, rows=8, d=128, kv=4096, keys=128, k_rows=True)
    one_row = decode_ugraph(heads=32, rows=1, d=96, kv=8192, keys=128, k_rows=True)
    programs = [_program(g, lab) for lab in labels] + [_program(rows_k, "w4s3"), _program(one_row, "w4s3k8")]
    for label, irs in zip(labels + ["K a key per row", "one query row per head"], gpu_ttgir(programs)):
        loop_kernel = next(ir for name, ir in irs.items() if not name.endswith("_combine"))
        # K and V each staged ahead of their dots
        assert loop_kernel.count("async_copy_global_to_local") >= 2, label


@pytest.mark.parametrize("k_rows,rows", [(False, 8), (True, 8), (True, 1)])
def test_the_staged_kernel_still_computes_attention(k_rows, rows):
    """Under the interpreter, against float64, with large logits (the running max at work);
    one query row per head too (its matmuls padded to 16 rows for tl.dot)."""
    g = decode_ugraph(heads=2, rows=rows, d=32, kv=256, keys=64, k_rows=k_rows)
    gen = torch.Generator().manual_seed(0)
    x = {"Q": 8 * torch.randn(2, rows, 32, generator=gen), "K": torch.randn(2, 32, 256, generator=gen),
         "V": torch.randn(2, 256, 32, generator=gen)}
    xd = {k: v.half().double() for k, v in x.items()}
    ref = torch.softmax(xd["Q"] @ xd["K"] / math.sqrt(32), -1) @ xd["V"]
    if k_rows:
        x["K"] = x["K"].transpose(1, 2).contiguous()
    for label in ("w4s3", "w4s3k4"):
        out = _program(g, label)(**{k: v.half() for k, v in x.items()}).double()
        assert (out - ref).abs().max().item() < 2e-3 * ref.abs().max().item(), label


def test_a_bf16_program_compiled_for_the_cpu_is_refused_ahead_of_time():
    """Its kernels multiply in fp32 (the interpreter has no bf16 tl.dot): their IR would not
    be the GPU's, so gpu_ttgir says so in one line instead of answering for the wrong code."""
    g = mg.KernelGraph("bf16_mm")
    x, w = g.input("X", (16, 64), "bfloat16"), g.input("W", (64, 64), "bfloat16")
    b = mg.BlockGraph((1, 1, 1), 1)
    b.output(b.accum(b.input(x) @ b.input(w)))
    for y in g.kernel(b):
        g.output(y)
    with pytest.raises(mg.InputError, match="bf16_mm is a bfloat16 program compiled for the CPU"):
        gpu_ttgir([lower.compile(g, device="cpu")])
