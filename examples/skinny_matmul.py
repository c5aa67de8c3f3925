"""Skinny projections as a decode step runs them: ``rows`` new tokens (1–64) times a weight
of a real model's projection shape, with a fused RMSNorm prologue and a residual epilogue —
superoptimized, and timed against cuBLAS (``torch.addmm``) and against the same program as
torch calls, with the copy floor of the weight.

    python examples/skinny_matmul.py --time-limit 20 --tune-s 10           # a GPU machine
    python examples/skinny_matmul.py --rows 1 8 --shapes 4096x4096 --plain

    python examples/skinny_matmul.py --gated gelu_tanh --rows 1 --shapes 2048x16384   # Gemma-2B's MLP

Two programs per shape: ``plain`` is ``X @ W + R``; ``fused`` is ``rms_norm(X)·g @ W + R``
(the norm of the activation the projection reads, its weight ``g`` one row). ``W`` is handed
in as a model holds it (``--weight-layout linear``, the default: ``nn.Linear``'s (N, K)
weight, transposed — ``OptimizeConfig.input_strides`` tunes for that layout) or row-major. Prints a
Markdown table, one row per (program, rows, K×N): ours, cuBLAS's addmm on the plain
product, the program op by op in torch, the floor (W, X, R and the output moved once) and
the ratios; JSON with ``--json``. ``--gated ACT`` runs the gated projection of an MLP instead,
``ACT(X @ W1) · (X @ W2)`` (GeLU-tanh as Gemma's, SiLU as LLaMA's): "cuBLAS" is then torch's
two ``mm`` and its element-wise ops, the floor both weights once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import mugraph as mg  # noqa: E402
from lower import KernelConfig  # noqa: E402
from lower.profile import measure  # noqa: E402
from mugraph.core.benchmarks.programs import gated_mlp  # noqa: E402
from mugraph.core.benchmarks.torch_versions import activation  # noqa: E402
from mugraph.pipeline.bench import copy_bandwidth  # noqa: E402

#: (K, N) of the projections of LLaMA-3-8B (q/o, gate/up, down), Qwen2-7B (gate/up) and Phi-3 (qkv)
SHAPES = ("4096x4096", "4096x14336", "14336x4096", "3584x18944", "3072x9216")


def program(rows: int, k: int, n: int, fused: bool, dtype: str = "float16") -> mg.Program:
    """``X @ W + R``, or with the RMSNorm of X (times its weight g) before the product."""
    p = mg.Program(f"{'rmsnorm_' if fused else ''}proj_{rows}x{k}x{n}")
    x, w = p.input("X", (rows, k), dtype), p.input("W", (k, n), dtype)
    r = p.input("R", (rows, n), dtype)
    if fused:
        x = mg.rms_norm(x, 1) * p.input("g", (1, k), dtype)
    p.output(x @ w + r)
    return p


def gated_torch(x: dict[str, torch.Tensor], act: str) -> torch.Tensor:
    """The gated projection (``programs.gated_mlp``) as torch calls."""
    return activation(act)(torch.mm(x["X"], x["W1"])) * torch.mm(x["X"], x["W2"])


def torch_version(x: dict[str, torch.Tensor], fused: bool) -> torch.Tensor:
    """The program as torch calls (what eager code would run)."""
    a = x["X"]
    if fused:
        a = a * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True)).to(a.dtype) * x["g"]
    return torch.addmm(x["R"], a, x["W"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="KxN")
    ap.add_argument("--plain", action="store_true", help="only X @ W + R (no RMSNorm prologue)")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--tune-s", type=float, default=10.0)
    ap.add_argument("--weight-layout", choices=("linear", "row"), default="linear",
                    help="W as nn.Linear stores it (transposed, the default) or row-major")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--gated", default=None, choices=("gelu_tanh", "silu"),
                    help="ACT(X @ W1) * (X @ W2) instead of the residual projections")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}, {args.dtype}; μs, median, CUDA-graph replay; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s; W {args.weight_layout} layout (cuBLAS on the same)")
    print("| program | rows | K×N | ours μs | structure | cuBLAS addmm μs | torch ops μs | floor μs | "
          "× cuBLAS | × torch ops | ours / floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for fused in ([False] if args.plain or args.gated else [False, True]):
        for shape in args.shapes:
            k, n = (int(v) for v in shape.split("x"))
            for rows in args.rows:
                p = (gated_mlp(hidden=k, out=n, dtype=args.dtype, act=args.gated, rows=rows) if args.gated
                     else program(rows, k, n, fused, args.dtype))
                weights = ("W1", "W2") if args.gated else ("W",)
                strided = {w: (1, k) for w in weights} if args.weight_layout == "linear" else None
                opt = mg.superoptimize(p, {"search": {"time_limit": args.time_limit}, "tune_s": args.tune_s,
                                           "input_strides": strided}, device="cuda", cache_dir=False, progress=False)
                g = torch.Generator(device="cuda").manual_seed(0)
                x = {t.name: torch.randn(t.shape, generator=g, device="cuda", dtype=getattr(torch, args.dtype)) * 0.1
                     for t in p.inputs}
                for w in (strided or {}):
                    x[w] = x[w].t().contiguous().t()  # the same values, stored as nn.Linear's (N, K)
                fn = opt.compiled("cuda")
                ours = measure(fn.launcher(*x.values()))
                if args.gated:
                    cublas = ops = measure(lambda: gated_torch(x, args.gated))
                else:
                    cublas = measure(lambda: torch.addmm(x["R"], x["X"], x["W"]))
                    ops = measure(lambda: torch_version(x, fused))
                floor = (sum(t.nbytes for t in p.inputs) + rows * n * 2) / bw
                labels = {int(i): KernelConfig.of(c).label() for i, c in opt.best.configs.items()}
                kernels = " + ".join(f"{op.attrs['block'].num_blocks}x{op.attrs['block'].forloop} {labels.get(op.id, '')}"
                                     for op in opt.graph.ops if op.kind == "graph_defined") or "library ops"
                name = f"gated {args.gated}" if args.gated else "rmsnorm+proj+res" if fused else "proj+res"
                row = dict(program=name, rows=rows, k=k, n=n,
                           ours_us=ours * 1e6, cublas_us=cublas * 1e6, torch_us=ops * 1e6, floor_us=floor * 1e6,
                           structure=f"{opt.best.origin}; {kernels}", proven=opt.best.proven)
                out.append(row)
                print(f"| {row['program']} | {rows} | {k}×{n} | {ours * 1e6:.1f} | {row['structure']} | "
                      f"{cublas * 1e6:.1f} | {ops * 1e6:.1f} | {floor * 1e6:.1f} | {cublas / ours:.2f} | "
                      f"{ops / ours:.2f} | {ours / floor:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
