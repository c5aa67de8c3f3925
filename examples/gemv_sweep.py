"""Sweep hand-written GEMV μGraphs (``X @ W``, a few rows) over tiles, split-K and kernel
configs, with W stored as ``nn.Linear`` stores it (transposed), against cuBLAS's ``mm`` on
the same layout: what the lowering can reach for a decode step's projections, whatever the
search and the tuner find.

    python examples/gemv_sweep.py                                   # a GPU machine
    python examples/gemv_sweep.py --shapes 1x4096x4096 --cols 32 64 --steps 128 256
    python examples/gemv_sweep.py --gated gelu_tanh --shapes 1x2048x16384    # act(X@W1) * (X@W2)

Each μGraph: a grid over W's columns (``--cols`` per block), a loop over K (``--steps``
deep); every variant is checked against float64 first (a wrong one is reported, not timed).
Prints the fastest variants per shape with their ratio to ``mm`` and to the copy floor of W,
and the cost model's price of each (H100 parameters: the ranking is what it is for);
``--json`` writes every row. ``--gated ACT`` sweeps the gated projection of an MLP instead —
``ACT(X @ W1) * (X @ W2)`` in one kernel, both weights walked by one loop and the gate in its
epilogue — against torch's two ``mm`` and its element-wise ops. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import mugraph as mg  # noqa: E402
from lower import KernelConfig  # noqa: E402
from lower.cost_model import estimate  # noqa: E402
from lower.profile import measure_on  # noqa: E402
from lower.runtime import compile as lower_compile  # noqa: E402
from lower.testing import rel_error  # noqa: E402
from mugraph.core.benchmarks.handwritten import gated_mlp  # noqa: E402
from mugraph.core.benchmarks.torch_versions import activation  # noqa: E402


def gemv(rows: int, k: int, n: int, cols: int, steps: int) -> mg.KernelGraph:
    """``X @ W``: ``n / cols`` blocks, each a ``cols``-wide column slice of W, its loop
    walking K ``steps`` rows at a time."""
    kg = mg.KernelGraph(f"gemv_{rows}x{k}x{n}")
    X, W = kg.input("X", (rows, k), "float16"), kg.input("W", (k, n), "float16")
    bg = mg.BlockGraph(grid=(n // cols, 1, 1), forloop=k // steps)
    x, w = bg.input(X, imap=(None,), fmap=1), bg.input(W, imap=(1,), fmap=0)
    bg.output(bg.accum(x @ w), omap=(1,))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def configs(forloop: int, splits, warps, stages, small_mm) -> list[KernelConfig]:
    """Split-K factors that divide the loop (combined by the last program), times the rest."""
    return [KernelConfig(num_warps=w, num_stages=s, split=k, combine="last" if k > 1 else "kernel", small_mm=mm)
            for k, mm, w, s in itertools.product(splits, small_mm, warps, stages) if forloop % k == 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1x4096x4096", "1x14336x4096", "1x4096x14336", "8x4096x4096"],
                    help="ROWSxKxN")
    ap.add_argument("--cols", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--steps", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--small-mm", nargs="+", default=["dot", "v"], choices=["dot", "v", "va"])
    ap.add_argument("--top", type=int, default=8, help="rows printed per shape")
    ap.add_argument("--json", default=None, help="write every row here")
    ap.add_argument("--timing", default="graph", choices=["graph", "dram"],
                    help="lower.profile.TIMINGS: graph (weights warm in L2 when they fit) or dram (each call on its "
                         "own copy of the weights, read from DRAM as in a model's step)")
    ap.add_argument("--gated", default=None, choices=["silu", "gelu_tanh"],
                    help="sweep ACT(X @ W1) * (X @ W2) in one kernel instead of X @ W")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gemv_sweep: no CUDA device — nothing to time. Skipping.")
        return 0
    from mugraph.pipeline.bench import copy_bandwidth

    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; μs, median, CUDA-graph replay, {args.timing} timing; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s; W in nn.Linear's layout")
    rows_out = []
    for shape in args.shapes:
        rows, k, n = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, k, device="cuda", generator=g).half() * 0.1
        weights = {name: (torch.randn(n, k, device="cuda", generator=g).half() * 0.1).t()  # (K, N), strides (1, K)
                   for name in (("W1", "W2") if args.gated else ("W",))}
        if args.gated:
            act = activation(args.gated)
            ref = act(x.double() @ weights["W1"].double()) * (x.double() @ weights["W2"].double())
            mm_s = measure_on(lambda s: lambda: act(torch.mm(s["X"], s["W1"])) * torch.mm(s["X"], s["W2"]),
                              {"X": x, **weights}, args.timing)
        else:
            ref = x.double() @ weights["W"].double()
            mm_s = measure_on(lambda s: lambda: torch.mm(s["X"], s["W"]), {"X": x, **weights}, args.timing)
        floor_s = k * n * 2 * len(weights) / bw
        timed = []
        for cols, steps in itertools.product(args.cols, args.steps):
            if n % cols or k % steps:
                continue
            try:
                kg = (gated_mlp(rows=rows, hidden=k, out=n, col_tile=cols, loop=k // steps, act=args.gated)
                      if args.gated else gemv(rows, k, n, cols, steps))
            except Exception as e:  # noqa: BLE001 - tiles too large for shared memory: say which
                print(f"  skipped: {cols} cols, {steps}-deep steps: {str(e).splitlines()[0][:100]}", flush=True)
                continue
            op = next(o.id for o in kg.ops if o.kind == "graph_defined")
            strides = {name: tuple(w.stride()) for name, w in weights.items()}
            for c in configs(k // steps, args.splits, args.warps, args.stages, args.small_mm):
                label = f"{n // cols} blocks of {cols} cols, {steps}-deep steps, {c.label()}"
                try:
                    model_s = estimate(kg, configs={op: c})
                    prog = lower_compile(kg, device="cuda", configs={op: c}, input_strides=strides)
                    err = rel_error(prog(X=x, **weights), ref)
                    if not err <= 1e-2:
                        print(f"  wrong: {label}: relative error {err:.2e}", flush=True)
                        continue
                    t = measure_on(lambda s: prog.launcher(**s), {"X": x, **weights}, args.timing)
                except Exception as e:  # noqa: BLE001 - a variant the card cannot run (shared memory): say which
                    print(f"  skipped: {label}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                    continue
                timed.append((t, model_s, label))
                rows_out.append(dict(shape=shape, gated=args.gated, cols=cols, steps=steps, config=c.label(),
                                     us=t * 1e6, model_us=model_s * 1e6, mm_us=mm_s * 1e6, floor_us=floor_s * 1e6))
        timed.sort()
        base = "torch (mm, mm, element-wise)" if args.gated else "cuBLAS mm"
        print(f"\n{shape}: {base} {mm_s * 1e6:.2f} μs, floor {floor_s * 1e6:.2f} μs; fastest of {len(timed)}:")
        for t, model_s, label in timed[:args.top]:
            print(f"  {t * 1e6:7.2f} μs  {mm_s / t:5.2f}× torch  {t / floor_s:5.2f}× floor  "
                  f"model {model_s * 1e6:6.1f}  {label}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
