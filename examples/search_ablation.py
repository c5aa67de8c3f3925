"""Search-time ablation on rmsnorm_matmul (the structure of Mirage's Table 5).

Rows: max block ops 5…11; columns: ``default`` (``--workers`` workers), ``onewkr``
(one worker) and ``noae`` (no abstract-expression pruning, ``--workers`` workers). Each
cell runs ``search.run`` to completion unless it exceeds its column's cap (``--cap`` for
``default``, generous; ``--cell-cap`` for the others), and records search seconds
(``>cap`` when the cap stopped it), states, tasks (after splitting) and verified graphs.
Writes ``<out>.csv`` and ``<out>.md`` (the table beside Mirage's published seconds,
docs/design.md §6.14). The columns can run as separate commands (each appends to
nothing: give each its own ``--out``), e.g. on a 16-core machine:

    python examples/search_ablation.py --columns default noae --workers 16 --cap 120 --cell-cap 30 --out table5_a
    python examples/search_ablation.py --columns onewkr --cell-cap 75 --out table5_b
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

MIRAGE = {  # paper Table 5, seconds: (default, no multithreading, no abstract expressions)
    5: (11, 58, 768), 6: (16, 93, 19934), 7: (22, 150, None), 8: (24, 152, None),
    9: (26, 166, None), 10: (26, 166, None), 11: (28, 183, None),
}
COLUMNS = {"default": {}, "onewkr": {"workers": 1}, "noae": {"prune_abstract": False}}
MIRAGE_COL = {"default": 0, "onewkr": 1, "noae": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=list(COLUMNS))
    ap.add_argument("--cap", type=float, default=600.0, help="seconds per default-column cell (generous)")
    ap.add_argument("--cell-cap", type=float, default=None,
                    help="seconds per cell of the other columns (default: --cap)")
    ap.add_argument("--small", action="store_true", help="reduced shapes (quick look)")
    ap.add_argument("--ops", default="5,6,7,8,9,10,11")
    ap.add_argument("--out", default="search_ablation")
    ap.add_argument("--workers", type=int, default=2, help="workers of the default and noae columns")
    ap.add_argument("--verify", type=int, default=1, help="full verifications per cell (after the search)")
    args = ap.parse_args()
    cell_cap = args.cell_cap or args.cap
    print(f"caps: default column {args.cap:.0f} s per cell, others {cell_cap:.0f} s per cell", flush=True)
    p = program("rmsnorm_matmul", small=args.small)
    rows = []
    t_all = time.perf_counter()
    for n in [int(x) for x in args.ops.split(",")]:
        for name in args.columns:
            cap = args.cap if name == "default" else cell_cap
            kw = {"max_kernel_ops": 1, "max_block_ops": n, "workers": args.workers, "time_limit": cap,
                  "progress": False, "max_verify": args.verify, "verify_reserve": 0.0}
            cfg = search.SearchConfig(**{**kw, **COLUMNS[name]})
            r = search.run(p, cfg)
            st = r.stats
            rows.append({"max_block_ops": n, "column": name, "workers": cfg.workers, "cap": cap,
                         "seconds": st["search_seconds"], "wall": st["wall_seconds"],
                         "first_match": st["first_match_seconds"], "complete": st["complete"],
                         "tasks": f"{st['tasks_done']}/{st['tasks']}", "root_tasks": st.get("root_tasks"),
                         "block_states": st["search"].get("block_states", 0),
                         "candidates": st["search"].get("candidates", 0),
                         "matches": st["search"].get("fingerprint_matches", 0), "verified": st["num_graphs"]})
            print(rows[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    shape = "small" if args.small else "full"
    lines = [f"rmsnorm_matmul b=1 ({shape} shapes), one kernel op; search seconds (`>cap` = stopped by the cap), "
             f"block states; Mirage's published seconds beside each column",
             "", "| max block ops | " + " | ".join(f"{c} s | {c} states | Mirage {c} s" for c in args.columns) + " |",
             "|---|" + "---|---|---|" * len(args.columns)]
    for n in sorted({r["max_block_ops"] for r in rows}):
        cells = []
        for c in args.columns:
            r = next(x for x in rows if x["max_block_ops"] == n and x["column"] == c)
            secs = f"{r['seconds']:.1f}" if r["complete"] else f">{r['cap']:.0f}"
            m = MIRAGE.get(n, (None,) * 3)[MIRAGE_COL[c]]
            cells.append(f"{secs} | {r['block_states']:,} | {'-' if m is None else m}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    out.with_suffix(".md").write_text(text + "\n")
    print("\n" + text)
    print(f"\nwrote {out.with_suffix('.csv')} and {out.with_suffix('.md')} ({time.perf_counter() - t_all:.0f} s)")


if __name__ == "__main__":
    main()
