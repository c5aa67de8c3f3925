"""Time a grid of kernel configurations of one reference μGraph on a CUDA GPU.

``lower.tune`` times only the cost model's best layouts and sweeps warps × stages
around the winner; this script times a whole cross product you name — to see what
the tuner skipped, or to check the cost model. Every variant is checked against the
float64 interpreter first (a wrong one is reported, not timed).

    python examples/sweep_configs.py --name rmsnorm_matmul --b 1 8 --splits 4 8 16 \\
        --warps 1 2 --stages 2 3 4 --out out/sweep.csv

``--sizes col_tile=128`` sweeps a variant μGraph of the same function (the reference
builder's sizes: here a coarser grid); ``--subs 2:2 2:4`` sub-tiles a parallel tile class.

Prints one line per variant as it runs (measured and predicted μs), then the ten
fastest per batch size; writes every row to ``--out`` (CSV). Without CUDA it exits 0.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="reference benchmark (docs/design.md §8.5)")
    ap.add_argument("--b", type=int, nargs="+", default=[1])
    ap.add_argument("--kernel", type=int, help="op id of the kernel to sweep (default: the first graph-defined op)")
    ap.add_argument("--splits", type=int, nargs="+", default=[1])
    ap.add_argument("--combine", nargs="+", default=["last"], choices=["last", "kernel"])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--stages", type=int, nargs="+", default=[3])
    ap.add_argument("--subs", nargs="+", default=["-"], metavar="CLS:R[xCLS:R]",
                    help="sub-tile splits of parallel tile classes (as in a label's p…; '-' for none)")
    ap.add_argument("--small-mm", nargs="+", default=["dot"], choices=["dot", "v", "va"])
    ap.add_argument("--defer-sums", nargs="+", default=["on"], choices=["on", "off"])
    ap.add_argument("--split-loads", nargs="+", default=["on"], choices=["on", "off"])
    ap.add_argument("--stage-all", nargs="+", default=["off"], choices=["on", "off"],
                    help="KernelConfig.stage_all_loads: ask Triton to stage every load of the loop (label suffix A)")
    ap.add_argument("--timing", default="graph", choices=["graph", "cold", "warm"])
    ap.add_argument("--sizes", nargs="*", default=[], metavar="KEY=INT",
                    help="reference builder sizes, e.g. col_tile=128 (a μGraph with a coarser grid)")
    ap.add_argument("--out", default="out/sweep.csv")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("sweep_configs: no CUDA device — nothing to time. Skipping.")
        return 0

    import mugraph as mg
    from lower import KernelConfig
    from lower.codegen import parse_sub
    from lower.cost_model import estimate
    from lower.profile import _time
    from lower.testing import bench_inputs
    from mugraph.core.benchmarks import reference

    rows = []
    sizes = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.sizes)}
    for b in args.b:
        g = reference(args.name, b=b, **sizes)
        op = args.kernel if args.kernel is not None else next(o.id for o in g.ops if o.kind == "graph_defined")
        ins = bench_inputs(g)
        ref = mg.evaluate(g, {k: v.double().cpu() for k, v in ins.items()})
        space = itertools.product(args.splits, args.combine, args.chunks, args.small_mm, args.warps, args.stages,
                                  args.defer_sums, args.split_loads, args.subs, args.stage_all)
        for split, comb, chunk, mm, w, st, ds, sl, sub, sa in space:
            if split == 1 and comb == "last":
                comb = "kernel"
            c = KernelConfig(num_warps=w, num_stages=st, split=split, chunk=chunk, combine=comb, small_mm=mm,
                             defer_sums=ds == "on", split_loads=sl == "on", stage_all_loads=sa == "on",
                             sub=parse_sub("" if sub == "-" else sub))
            row = {"b": b, "config": c.label(), "predicted_us": estimate(g, configs={op: c}) * 1e6}
            try:
                t, _, err = _time(g, {op: c}, ins, ref, 2e-2, args.timing)
                row.update(measured_us=t * 1e6, rel_err=err)
            except Exception as e:  # noqa: BLE001  (resources, or a wrong result: say which)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
            print(f"b={b} {row['config']:18s} " + (f"{row['measured_us']:8.2f} us" if "measured_us" in row
                                                    else row["error"]) + f"  (pred {row['predicted_us']:.2f})",
                  flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["b", "config", "measured_us", "predicted_us", "rel_err", "error"])
        w.writeheader()
        w.writerows(rows)
    for b in args.b:
        ok = sorted((r for r in rows if r["b"] == b and "measured_us" in r), key=lambda r: r["measured_us"])
        print(f"\nfastest of {len(ok)} ({args.name} b={b}, {args.timing} timing):")
        for r in ok[:10]:
            print(f"  {r['config']:18s} {r['measured_us']:8.2f} us  (pred {r['predicted_us']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
