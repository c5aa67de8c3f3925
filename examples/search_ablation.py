"""Search-time ablation on rmsnorm_matmul (the structure of Mirage's Table 5).

Rows: max block ops 5…11; columns: default (2 workers), one worker, no
abstract-expression pruning. Each cell runs ``search.run`` with a time cap and
records wall seconds (``>cap`` when the cap stopped it), states and verified
graphs. Writes a CSV and a PNG and prints the table beside Mirage's published
seconds (docs/design.md §6.14).

    python examples/search_ablation.py --cap 600 [--small] [--out ablation]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import search  # noqa: E402
from mugraph.benchmarks import program  # noqa: E402

MIRAGE = {  # paper Table 5, seconds: (default, no multithreading, no abstract expressions)
    5: (11, 58, 768), 6: (16, 93, 19934), 7: (22, 150, None), 8: (24, 152, None),
    9: (26, 166, None), 10: (26, 166, None), 11: (28, 183, None),
}
VARIANTS = {
    "default": {},
    "one_worker": {"workers": 1},
    "no_abstract_expr": {"prune_abstract": False},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap", type=float, default=600.0, help="seconds per cell")
    ap.add_argument("--small", action="store_true", help="reduced shapes (quick look)")
    ap.add_argument("--ops", default="5,6,7,8,9,10,11")
    ap.add_argument("--out", default="search_ablation")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--verify", type=int, default=1, help="full verifications per cell (after the search)")
    args = ap.parse_args()
    p = program("rmsnorm_matmul", small=args.small)
    rows = []
    for n in [int(x) for x in args.ops.split(",")]:
        for name, over in VARIANTS.items():
            cfg = search.SearchConfig(max_kernel_ops=1, max_block_ops=n, workers=args.workers, time_limit=args.cap,
                                      progress=False, max_verify=args.verify, verify_reserve=0.0)
            for k, v in over.items():
                setattr(cfg, k, v)
            r = search.run(p, cfg)
            st = r.stats
            states = st["search"].get("block_states", 0) + st["search"].get("kernel_states", 0)
            rows.append({"max_block_ops": n, "variant": name, "seconds": st["search_seconds"],
                         "wall": st["wall_seconds"], "first_match": st["first_match_seconds"],
                         "complete": st["complete"], "tasks": f"{st['tasks_done']}/{st['tasks']}", "states": states,
                         "matches": st["search"].get("fingerprint_matches", 0), "verified": st["num_graphs"]})
            print(rows[-1], flush=True)
    out = Path(args.out)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("\ncells: search seconds ((cap) = stopped by the cap), tasks done/all, first fingerprint match seconds")
    print(f"{'ops':>3} | " + " | ".join(f"{v:>30}" for v in VARIANTS) + " | Mirage (def, 1-thr, no-AE)")
    for n in sorted({r["max_block_ops"] for r in rows}):
        cells = []
        for v in VARIANTS:
            r = next(x for x in rows if x["max_block_ops"] == n and x["variant"] == v)
            fm = "-" if r["first_match"] is None else f"{r['first_match']:.0f}s"
            cells.append(f"{r['seconds']:>6.0f}s{'' if r['complete'] else ' (cap)':>6} {r['tasks']:>7} {fm:>5}")
        print(f"{n:>3} | " + " | ".join(f"{c:>30}" for c in cells) + f" | {MIRAGE.get(n)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for v in VARIANTS:
            xs = [r["max_block_ops"] for r in rows if r["variant"] == v]
            ys = [r["seconds"] for r in rows if r["variant"] == v]
            ax.plot(xs, ys, marker="o", label=f"mugraph {v}")
        ax.plot(list(MIRAGE), [m[0] for m in MIRAGE.values()], "k--", label="Mirage default")
        ax.plot(list(MIRAGE), [m[1] for m in MIRAGE.values()], "k:", label="Mirage 1 thread")
        ax.set_yscale("log"); ax.set_xlabel("max block ops"); ax.set_ylabel("search seconds")
        ax.legend(fontsize=7); fig.tight_layout(); fig.savefig(out.with_suffix(".png"), dpi=120)
    except ImportError:
        print("matplotlib missing: no PNG")


if __name__ == "__main__":
    main()
