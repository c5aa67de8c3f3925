"""The search on programs it was never tuned for: a softmax, a residual + RMSNorm, a low-rank
chain, and decode-shaped grouped-query attention (one query row per head, a 2k–8k-key cache:
``mugraph.benchmarks.DECODE``).

Nothing in ``search/`` knows these programs; this prints, for each, the wall time to
the first fingerprint match, the verified μGraphs (kernel counts and how each was
found), where the best verified split-loop μGraph (split-KV / split-K: a kernel whose
loop runs across blocks, then a combining kernel) ranks by the search's cost model
(``search.enumerate.cost_key``), and the single-kernel μGraph if there is one. On a GPU,
``python -m mugraph bench --name decode_…`` times the decode programs against SDPA.

    python examples/generality.py [--time-limit 120] [--small] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def programs(small: bool):
    import mugraph as mg

    rows, hidden, rank = (8, 256, 8) if small else (64, 4096, 16)
    sm = mg.Program("softmax")
    X = sm.input("X", (rows, hidden), "float16")
    E = mg.exp(X)
    sm.output(E / mg.sum(E, 1))

    rn = mg.Program("residual_rmsnorm")
    H = rn.input("H", (rows, hidden), "float16")
    R = rn.input("R", (rows, hidden), "float16")
    rn.output(mg.rms_norm(H + R))

    lr = mg.Program("low_rank_chain")
    X = lr.input("X", (rows, hidden), "float16")
    U = lr.input("U", (hidden, rank), "float16")
    V = lr.input("V", (rank, hidden), "float16")
    lr.output((X @ U) @ V)
    from mugraph.benchmarks import DECODE, program

    return [sm, rn, lr] + [program(name, 1, small=small) for name in DECODE]


def _kernels(g) -> str:
    """blocks×loop of each graph-defined kernel (e.g. ``64x4 + 8x16``: a split-KV pair)."""
    return " + ".join(f"{op.attrs['block'].num_blocks}x{op.attrs['block'].forloop}"
                      for op in g.ops if op.kind == "graph_defined")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0, help="search time limit per program, seconds")
    ap.add_argument("--small", action="store_true", help="reduced shapes")
    ap.add_argument("--only", nargs="*", default=None, help="run only these programs (by name)")
    args = ap.parse_args()
    import search
    from search.enumerate import cost_key

    print("| program | shapes | wall s | first match s | verified (kernels: count) | found by | "
          "split-loop (rank by cost) | complete |")
    print("|---|---|---|---|---|---|---|---|")
    singles = []
    for p in programs(args.small):
        if args.only and p.name not in args.only:
            continue
        t0 = time.perf_counter()
        r = search.run(p, search.SearchConfig(time_limit=args.time_limit, progress=False))
        wall = time.perf_counter() - t0
        st = r.stats
        shapes = " ".join(f"{t.name}{list(t.shape)}" for t in p.inputs)
        kernels = ", ".join(f"{k}: {n}" for k, n in st["kernels"])
        ranked = sorted(zip(r.graphs, r.origins), key=lambda x: cost_key(x[0]))
        split = next((f"{i + 1} of {len(ranked)}: {_kernels(g)}" for i, (g, o) in enumerate(ranked)
                      if o == "split-loop"), "-")
        print(f"| {p.name} | {shapes} | {wall:.1f} | {st['first_match_seconds']} | {kernels or '-'} | "
              f"{', '.join(sorted(set(r.origins))) or '-'} | {split} | {st['complete']} |", flush=True)
        one = [g for g in r.graphs if g.num_kernels == 1]
        if one:
            singles.append(one[0])
    for g in singles:
        print()
        print(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
