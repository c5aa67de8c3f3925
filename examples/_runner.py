"""Shared driver of the six benchmark examples (``examples/<name>.py``).

Builds the benchmark program, superoptimizes it, prints the μGraph found, checks
the result against PyTorch in float64, and prints a timing table: on a GPU ours
beside eager, torch.compile, SDPA and the memory floor (``mugraph.pipeline.bench``);
on the CPU the cost model's prediction and a correctness run of the generated
Triton kernels under the interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(name: str) -> int:
    ap = argparse.ArgumentParser(description=f"superoptimize the {name} benchmark (docs/design.md §8.5)")
    ap.add_argument("--batch", "-b", type=int, default=1, help="batch size b (1 or 8 in the paper)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--small", action="store_true", help="reduced shapes (fast on a CPU)")
    ap.add_argument("--time-limit", type=float, default=None, help="search time limit, seconds")
    ap.add_argument("--max-kernel-ops", type=int, default=None, help="most kernels in a μGraph (search limit)")
    ap.add_argument("--max-results", type=int, default=None, help="stop the search after this many verified μGraphs")
    ap.add_argument("--no-cache", action="store_true", help="search again even if a cached result exists")
    ap.add_argument("--out", default=None, help="save the result as JSON here")
    args = ap.parse_args()
    dev = args.device
    if dev == "cpu" or (dev == "auto" and not _cuda()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

    import torch

    import mugraph as mg
    from mugraph.core.benchmarks import program
    from mugraph.core.benchmarks.torch_versions import TORCH

    p = program(name, b=args.batch, small=args.small)
    limits = {"time_limit": args.time_limit, "max_kernel_ops": args.max_kernel_ops, "max_results": args.max_results}
    cfg = mg.OptimizeConfig(search={k: v for k, v in limits.items() if v is not None})
    t0 = time.perf_counter()
    opt = mg.superoptimize(p, cfg, device=dev, cache_dir=False if args.no_cache else None)
    print(f"superoptimize: {time.perf_counter() - t0:.1f} s (a cached result returns at once)\n")
    print(opt.graph)
    print(opt.summary())
    if args.out:
        print(f"saved {opt.save(args.out)}")

    device = "cuda" if opt.device == "cuda" else "cpu"
    dtype = getattr(torch, p.inputs[0].dtype)  # the program's dtype (the interpreter runs fp16 too)
    gen = torch.Generator(device=device).manual_seed(1)
    inputs = [torch.randn(t.shape, generator=gen, device=device, dtype=dtype) * 0.5 for t in p.inputs]
    got = opt(*inputs)
    ref = TORCH[name](*[x.double() for x in inputs])
    err = float((got.double() - ref).norm() / ref.norm())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    print(f"\ncheck against PyTorch (float64): rel. error {err:.2e} ({'ok' if err <= tol else 'FAILED'}, tol {tol:g})")
    if device == "cuda":
        from mugraph.pipeline.bench import format_table, run_bench

        rows, head = run_bench([name], (args.batch,), None, cfg)
        print(format_table(rows, head))
    else:
        print(f"no GPU: predicted H100 time {opt.best.predicted_s * 1e6:.1f} μs (cost model); "
              "the kernels above ran under the Triton interpreter")
    return 0 if err <= tol else 1


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
