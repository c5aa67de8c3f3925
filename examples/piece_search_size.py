"""How long the search takes to find a first verified μGraph, by piece size — the
measurement behind the front end's ``max_piece_ops`` / ``max_piece_matmuls``
defaults (docs/design.md §10.3).

Each case is a transformer fragment written in PyTorch at small decode-like shapes
(hidden 64, 1–4 tokens), captured with ``mugraph.from_torch`` without size limits,
so its one piece is the whole fragment; that piece is superoptimized with a fixed
time limit. Printed per case: catalog ops, matmuls, what the search returned, the
seconds to its first verified match (``first_match_seconds``; ``-`` when none),
and the search's wall time. Writes ``piece_search_size.csv`` under ``--out``.

    PYTHONPATH=$PWD python examples/piece_search_size.py --out /tmp/pss --time-limit 40
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TRITON_INTERPRET", "1")


def cases(torch, F, tokens: int, d: int, f: int):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    x, w = r(tokens, d), r(d).abs() + 0.5
    wq, _wk, _wv = r(d, d), r(d, d // 2), r(d, d // 2)  # k, v drawn too: the draws after them stay the same
    w1, w3, w2 = r(d, f), r(d, f), r(f, d)
    return {
        "rmsnorm+matmul": (lambda x, w, wq: norm(x, w) @ wq, (x, w, wq)),
        "gated_mlp": (lambda x, w1, w3: F.silu(x @ w1) * (x @ w3), (x, w1, w3)),
        "matmul+residual": (lambda x, h, w2: x + h @ w2, (x, r(tokens, f), w2)),
        "rmsnorm+gated_mlp": (lambda x, w, w1, w3: F.silu(norm(x, w) @ w1) * (norm(x, w) @ w3), (x, w, w1, w3)),
        "rmsnorm_plain+matmul": (lambda x, wq: (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True))) @ wq, (x, wq)),
        "rmsnorm": (lambda x, w: norm(x, w), (x, w)),
        "matmul+silu": (lambda x, w1: F.silu(x @ w1) * 2, (x, w1)),
        "rmsnorm+mlp+residual": (lambda x, w, w1, w3, w2: x + (F.silu(norm(x, w) @ w1) * (norm(x, w) @ w3)) @ w2,
                                 (x, w, w1, w3, w2)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-limit", type=float, default=40.0)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="case names to run")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import mugraph as mg
    from mugraph.frontend import from_torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (fn, xs) in cases(torch, F, args.tokens, 64, 128).items():
        if args.only and name not in args.only:
            continue
        cap = from_torch(fn, *xs, max_piece_ops=None, max_piece_matmuls=None)
        (bp,) = cap.pieces
        kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
        t0 = time.perf_counter()
        opt = mg.superoptimize(bp.program, {"search": {"time_limit": args.time_limit}}, device="cpu",
                               cache_dir=False, progress=False)
        wall = time.perf_counter() - t0
        stats = opt.report["search"]["stats"]
        row = {"case": name, "ops": len(kinds), "matmuls": kinds.count("matmul"),
               "returned": opt.best.origin, "kernels": opt.best.num_kernels,
               "found": sum(c.origin == "search" for c in opt.candidates),
               "first_match_s": stats.get("first_match_seconds"), "search_s": round(opt.report["search"]["wall_s"], 1),
               "total_s": round(wall, 1)}
        rows.append(row)
        print(row, flush=True)
    with open(out / "piece_search_size.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
