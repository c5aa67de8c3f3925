"""How much a tuning budget buys with Triton's compiles run ahead in worker processes
(``lower.precompile``) and without: each hand-written reference μGraph at full shapes tuned
twice with the same budget, the pool off then on, each time with an empty Triton compile
cache, and a table of the configurations timed, the tuned time and the pool's counts
(docs/results.md, "Compiles ahead of the tuner").

    python examples/tuning_speed.py --budget 10                     # a GPU machine
    python examples/tuning_speed.py --names gqa rmsnorm_matmul --b 1 8 --budget 20 --json out.json

The pool's workers are started (and their CUDA contexts made) before the first tuning, as a
process that tunes many pieces has them; ``MUGRAPH_PRECOMPILE_WORKERS`` sets how many.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from lower import precompile  # noqa: E402
from mugraph.core.benchmarks import reference  # noqa: E402
from mugraph.core.benchmarks.handwritten import REFERENCES  # noqa: E402

prof = importlib.import_module("lower.profile")
runtime = importlib.import_module("lower.runtime")


def tune_once(g, budget: float, pool: bool, timing: str) -> dict:
    """One tuning of ``g`` from nothing compiled: a fresh Triton cache folder, no generated
    module kept from before (a kept module holds its compiled kernels)."""
    runtime.forget_modules()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-")
    pre = precompile.shared()
    before = dict(pre.stats) if pre else {}
    t0 = time.monotonic()
    r = prof.tune(g, budget_s=budget, timing=timing, precompile=pool)
    wall = time.monotonic() - t0
    timed = [t for _, t, _ in r.trials if t is not None]
    row = {"pool": pool, "wall_s": round(wall, 1), "trials": len(r.trials), "timed": len(timed),
           "final_us": None if r.time_s is None else r.time_s * 1e6, "best_trial_us": min(timed) * 1e6 if timed else None,
           "configs": {k: c.label() for k, c in r.configs.items()}}
    if pool and pre:
        row["pool_counts"] = {k: v - before.get(k, 0) for k, v in pre.stats.items()}
    return row


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--names", nargs="+", default=list(REFERENCES), choices=list(REFERENCES))
    ap.add_argument("--b", nargs="+", type=int, default=[1])
    ap.add_argument("--budget", type=float, default=10.0, help="tuning seconds a program")
    ap.add_argument("--timing", default="graph", choices=list(prof.TIMINGS))
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tuning_speed: needs a CUDA GPU (the pool compiles for one)")
        return 2
    pre = precompile.shared()
    if pre is None:
        print("tuning_speed: no worker processes (MUGRAPH_PRECOMPILE_WORKERS=0 or too few cores)")
        return 2
    t0 = time.monotonic()
    pre.start(wait=True)
    print(f"{pre.workers} workers started in {time.monotonic() - t0:.1f} s; {torch.cuda.get_device_name()}, "
          f"budget {a.budget:g} s a tuning, {a.timing} timing", flush=True)
    rows = []
    print("| program | b | kernels | pool | configurations timed | tuned μs | best trial μs | wall s | compiled ahead (used / handed over) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in a.names:
        for b in a.b:
            g = reference(name, b)
            kernels = sum(op.kind == "graph_defined" for op in g.ops)
            for pool in (False, True):
                try:
                    row = tune_once(g, a.budget, pool, a.timing)
                except Exception as e:  # noqa: BLE001 - a row's failure is a row
                    row = {"pool": pool, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                row.update(program=name, b=b, kernels=kernels)
                rows.append(row)
                if "error" in row:
                    print(f"| {name} | {b} | {kernels} | {'on' if pool else 'off'} | {row['error']} |||||")
                    continue
                pc = row.get("pool_counts")
                used = f"{pc['compiled']} / {pc['submitted']}" if pc else "-"
                print(f"| {name} | {b} | {kernels} | {'on' if pool else 'off'} | {row['timed']} | {_us(row['final_us'])} "
                      f"| {_us(row['best_trial_us'])} | {row['wall_s']} | {used} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "budget_s": a.budget, "workers": pre.workers,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
