"""Search scaling: rmsnorm_matmul (b=1, one kernel op) with 1, 2, 4, … workers per executor.

For each executor (``processes``, ``ray``) and worker count, one ``search.run`` with
``time_limit=--timeout``; prints a table — wall seconds, enumeration seconds, speedup
of the enumeration over the same executor's first worker count, where the rest of the
wall time goes (e-graph saturation ``oracle``; ``rest``: set-up, worker start-up and
verification), block states, candidates, tasks after splitting (root tasks in
parentheses) and the longest task's seconds — and writes it as CSV to ``--out``. A run stopped by the
timeout is marked ``cut`` (its speedup compares unequal work: read the states column).

    python examples/search_scaling.py --workers 1 2 4 8 16 --executors processes ray --out scaling.csv
    python examples/search_scaling.py --max-block-ops 6 --workers 1 2 --small      # a quick look

Ray: the local cluster is started once with ``num_cpus`` = the largest worker count (or
``--ray-address`` joins a running one); each run starts its own actors (one per
worker), so actor start-up is part of every Ray row, as the forkserver's start is part
of the first ``processes`` row unless ``--warmup`` (default) ran a tiny search first.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import search  # noqa: E402
from mugraph.core.benchmarks import program  # noqa: E402

FIELDS = ["executor", "workers", "wall_s", "oracle_s", "search_s", "rest_s", "speedup", "block_states", "candidates",
          "tasks_done", "tasks", "root_tasks", "longest_task_s", "complete", "failed_tasks", "worker_startup_s"]


def run_one(p, executor: str, workers: int, args) -> dict:
    cfg = search.SearchConfig(max_kernel_ops=1, max_block_ops=args.max_block_ops, workers=workers,
                              executor=executor, ray_address=args.ray_address, time_limit=args.timeout,
                              progress=False, max_verify=args.verify, split_seconds=args.split_seconds)
    t0 = time.perf_counter()
    r = search.run(p, cfg)
    wall = time.perf_counter() - t0
    st = r.stats
    startup = st.get("worker_startup_seconds") or []
    oracle_s = st["oracle"].get("saturation_seconds") or 0.0
    return {"executor": executor, "workers": workers, "wall_s": round(wall, 2), "oracle_s": oracle_s,
            "search_s": st["search_seconds"],
            # what is neither saturation nor enumeration: set-up, worker start-up, verification
            "rest_s": round(wall - oracle_s - st["search_seconds"], 2),
            "speedup": None, "root_tasks": st.get("root_tasks"), "longest_task_s": st.get("longest_task_seconds"), "block_states": st["search"].get("block_states", 0),
            "candidates": st["search"].get("candidates", 0), "tasks_done": st["tasks_done"], "tasks": st["tasks"],
            "complete": st["complete"], "failed_tasks": len(st["failed_tasks"]),
            "worker_startup_s": round(max(startup), 3) if startup else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--executors", nargs="+", default=["processes", "ray"], choices=["processes", "ray", "serial"])
    ap.add_argument("--max-block-ops", type=int, default=11)
    ap.add_argument("--timeout", type=float, default=900.0, help="time limit of each run (seconds)")
    ap.add_argument("--verify", type=int, default=2, help="full verifications per run (max_verify)")
    ap.add_argument("--small", action="store_true", help="reduced shapes (quick look)")
    ap.add_argument("--split-seconds", type=float, default=1.0,
                    help="a task running this long hands its unexplored children back (SearchConfig.split_seconds)")
    ap.add_argument("--ray-address", default=None, help="a running Ray cluster (default: start a local one)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--out", default="search_scaling.csv")
    args = ap.parse_args()

    p = program("rmsnorm_matmul", b=1, small=args.small)
    if "ray" in args.executors:
        import ray

        if args.ray_address:
            ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        else:
            ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
    if args.warmup:
        for ex in args.executors:
            search.run(p, search.SearchConfig(max_kernel_ops=1, max_block_ops=2, workers=1, executor=ex,
                                              ray_address=args.ray_address, progress=False, time_limit=120.0))
    rows: list[dict] = []
    for ex in args.executors:
        base = None
        for w in args.workers:
            row = run_one(p, ex, w, args)
            base = base or row["search_s"]
            row["speedup"] = round(base / row["search_s"], 2) if row["search_s"] else None
            rows.append(row)
            print(" ".join(f"{k}={row[k]}" for k in FIELDS), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    shape = "small" if args.small else "full"
    print(f"\nrmsnorm_matmul b=1 ({shape} shapes), one kernel op, max_block_ops={args.max_block_ops}, "
          f"timeout {args.timeout:.0f} s; speedup = enumeration seconds vs the first worker count")
    print("| executor | workers | wall s | oracle s | search s | rest s | speedup | block states | candidates "
          "| tasks done/all (root) | longest task s | worker start s | complete |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['workers']} | {r['wall_s']} | {r['oracle_s']} | {r['search_s']} | "
              f"{r['rest_s']} | {r['speedup']} | {r['block_states']:,} | {r['candidates']:,} | "
              f"{r['tasks_done']}/{r['tasks']} ({r['root_tasks']}) | {r['longest_task_s']} | "
              f"{r['worker_startup_s']} | {'yes' if r['complete'] else 'cut'} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
