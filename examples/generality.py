"""The search on programs it was never tuned for: a softmax, a residual + RMSNorm, a low-rank
chain, a two-layer SiLU MLP, a matmul with a residual, and decode-shaped grouped-query
attention (one query row per head, a 2k–8k-key cache: ``mugraph.core.benchmarks.DECODE``).

Nothing in ``search/`` knows these programs. Without ``--gpu`` this prints, for each, the
search's wall time, the time to the first fingerprint match, the verified μGraphs
(kernel counts and how each was found) and where the best verified split-loop μGraph
(split-KV / split-K: a kernel whose loop runs across blocks, then a combining kernel)
ranks by the search's cost model (``search.enumerate.cost_key``).

With ``--gpu`` (CUDA) each program is superoptimized end to end — the search on this
machine's cores, the GPU re-ranking of the verified candidates (at most
``--tune-seconds`` of autotuning in all) — and timed against the program written in
PyTorch (its ops one torch call each, the way a user writes it: eager and
``torch.compile``), SDPA for the decode attention, and the memory floor, all under
CUDA-graph replay (``lower.profile.measure``); the output is checked against the
float64 program. Writes ``generality.csv`` under ``--out``.

    python examples/generality.py [--time-limit 120] [--small] [--only NAME ...]
    python examples/generality.py --gpu --workers 16 --time-limit 60 --tune-seconds 40 --out out/generality
    python examples/generality.py --gpu --gpus all --time-limit 60 --tune-seconds 40   # side by side
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def programs(small: bool):
    import mugraph as mg
    from mugraph.core.benchmarks import DECODE, program

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

    tokens, d, ff = (4, 64, 256) if small else (16, 1024, 4096)
    mlp = mg.Program("silu_mlp")
    X = mlp.input("X", (tokens, d), "float16")
    W1 = mlp.input("W1", (d, ff), "float16")
    W2 = mlp.input("W2", (ff, d), "float16")
    mlp.output(mg.silu(X @ W1) @ W2)

    d = 256 if small else 4096
    res = mg.Program("matmul_residual")
    X = res.input("X", (tokens, d), "float16")
    W = res.input("W", (d, d), "float16")
    res.output(X @ W + X)

    return [sm, rn, lr, mlp, res] + [program(name, 1, small=small) for name in DECODE]


def selected(args):
    """The programs to run: all of :func:`programs`, or those ``--only`` names."""
    return [p for p in programs(args.small) if not args.only or p.name in args.only]


def _shapes(p) -> str:
    return " ".join(f"{t.name}{list(t.shape)}" for t in p.inputs)


def _kernels(g) -> str:
    """blocks×loop of each graph-defined kernel (e.g. ``64x4 + 8x16``: a split-KV pair)."""
    return " + ".join(f"{op.attrs['block'].num_blocks}x{op.attrs['block'].forloop}"
                      for op in g.ops if op.kind == "graph_defined") or "library ops"


def in_torch(p):
    """``p`` as PyTorch code: each op one torch call on the inputs' dtype (the catalog's
    float rows, :data:`mugraph.core.algebra.FLOAT_OPS`) — the program as a user writes it."""
    from mugraph.core.algebra import FLOAT_OPS

    def run(*xs):
        env = dict(zip(p.inputs, xs))
        for op in p.ops:
            if op.kind != "input":
                env[op.outputs[0]] = FLOAT_OPS[op.kind](None, [env[t] for t in op.inputs], op.attrs)
        outs = [env[t] for t in p.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def search_only(args) -> int:
    import search
    from search.enumerate import cost_key

    print("| program | shapes | wall s | first match s | verified (kernels: count) | proven | found by | "
          "split-loop (rank by cost) | complete |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in selected(args):
        t0 = time.perf_counter()
        r = search.run(p, search.SearchConfig(time_limit=args.time_limit, progress=False,
                                              **({"workers": args.workers} if args.workers else {})))
        wall = time.perf_counter() - t0
        st = r.stats
        shapes = _shapes(p)
        kernels = ", ".join(f"{k}: {n}" for k, n in st["kernels"])
        ranked = sorted(zip(r.graphs, r.origins), key=lambda x: cost_key(x[0]))
        split = next((f"{i + 1} of {len(ranked)}: {_kernels(g)}" for i, (g, o) in enumerate(ranked)
                      if o == "split-loop"), "-")
        # what superoptimize may ship by default: a verdict whose bound met the target
        proven = sum(1 for v in r.verdicts if v and v.get("bound_met"))
        print(f"| {p.name} | {shapes} | {wall:.1f} | {st['first_match_seconds']} | {kernels or '-'} | "
              f"{proven} of {len(r.found)} | {', '.join(sorted(set(r.origins))) or '-'} | {split} | "
              f"{st['complete']} |", flush=True)
    return 0


def on_gpu(args) -> int:
    import torch

    import mugraph as mg
    from lower.cost_model import memory_floor_bytes
    from lower.profile import measure
    from mugraph.core.benchmarks.torch_versions import SDPA, sdpa_call
    from mugraph.pipeline.bench import copy_bandwidth

    bw = copy_bandwidth()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cols = ["program", "shapes", "search_s", "verified", "kernels", "found_by", "structure", "ours_us", "eager_us",
            "compile_us", "sdpa_us", "floor_us", "x_best_torch", "rel_error"]
    rows = []
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}; μs, median, CUDA-graph replay", flush=True)
    print("| program | shapes | search s | verified | kernels | found by; structure | ours | eager | "
          "torch.compile | SDPA | floor | × best torch | rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in selected(args):
        cfg = mg.OptimizeConfig(search={"time_limit": args.time_limit,
                                        **({"workers": args.workers} if args.workers else {})},
                                allow_unproven=args.allow_unproven)
        opt = mg.superoptimize(p, cfg, device="cpu", cache_dir=False, progress=False)
        opt.profile_on_gpu(tune_total_s=args.tune_seconds, allow_unproven=args.allow_unproven)
        verified = [c for c in opt.candidates if c.origin == "search" and not c.rejected]
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float16) * 0.25 for t in p.inputs]
        eager = in_torch(p)
        comp = opt.compiled("cuda")
        y = comp(*xs)
        y = y[0] if isinstance(y, (tuple, list)) else y
        ref = eager(*[x.double() for x in xs])
        ref = ref[0] if isinstance(ref, tuple) else ref
        r = {"program": p.name, "shapes": _shapes(p),
             "search_s": (opt.report.get("search") or {}).get("wall_s"), "verified": len(verified),
             "kernels": opt.best.num_kernels, "found_by": opt.best.found_by or opt.best.origin,
             "structure": _kernels(opt.graph),
             "rel_error": float((y.double() - ref).norm() / ref.norm()),
             "ours_us": measure(comp.launcher(*xs), "graph") * 1e6,
             "eager_us": measure(lambda: eager(*xs), "graph") * 1e6}
        compiled = torch.compile(eager)
        r["compile_us"] = measure(lambda: compiled(*xs), "graph") * 1e6
        r["sdpa_us"] = measure(sdpa_call(p.name, *xs), "graph") * 1e6 if p.name in SDPA else None
        r["floor_us"] = memory_floor_bytes(p) / bw * 1e6
        best = min(v for v in (r["eager_us"], r["compile_us"], r["sdpa_us"]) if v)
        r["x_best_torch"] = best / r["ours_us"]
        rows.append(r)
        with open(out / "generality.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)

        def f(v):
            return "–" if v is None else f"{v:.1f}"

        print(f"| {p.name} | {r['shapes']} | {f(r['search_s'])} | {r['verified']} | {r['kernels']} | "
              f"{r['found_by']}; {r['structure']} | {f(r['ours_us'])} | {f(r['eager_us'])} | {f(r['compile_us'])} | "
              f"{f(r['sdpa_us'])} | {f(r['floor_us'])} | {r['x_best_torch']:.2f} | {r['rel_error']:.1e} |", flush=True)
    if rows:
        geo = math.exp(sum(math.log(r["x_best_torch"]) for r in rows) / len(rows))
        print(f"\ngeomean × best torch: {geo:.2f} over {len(rows)} programs; wrote {out / 'generality.csv'}")
    return 0


def on_gpus(args) -> int:
    """``--gpu --gpus``: each program in a process of its own, dealt to the GPUs in turn
    (:mod:`mugraph.pipeline.parallel`); the rows merged into ``--out``/generality.csv."""
    import torch

    from mugraph.core.errors import MugraphError
    from mugraph.pipeline import parallel

    try:
        gpus = parallel.parse_gpus(args.gpus, torch.cuda.device_count())
        groups = parallel.core_groups(len(gpus))
    except MugraphError as e:
        print(f"generality: {e}", file=sys.stderr)
        return 2
    names = [p.name for p in selected(args)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def command(name, share, where):
        return [sys.executable, os.path.abspath(__file__), "--gpu", "--only", name, "--out", str(where),
                "--time-limit", str(args.time_limit), "--tune-seconds", str(args.tune_seconds),
                "--workers", str(args.workers or share)] + (["--small"] if args.small else []) \
            + (["--allow-unproven"] if args.allow_unproven else [])

    codes = parallel.run_queues(parallel.assign(names, len(gpus)), gpus, groups, command, out,
                                timeout=2 * (args.time_limit + args.tune_seconds) + 600)
    rows = parallel.merge_csv(out, lambda r: names.index(r["program"]), "generality.csv")
    if rows:
        geo = math.exp(sum(math.log(float(r["x_best_torch"])) for r in rows) / len(rows))
        print(f"\ngeomean × best torch: {geo:.2f} over {len(rows)} programs; wrote {out / 'generality.csv'}")
    return 0 if all(c == 0 for c in codes) and len(rows) == len(names) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0, help="search time limit per program, seconds")
    ap.add_argument("--workers", type=int, default=None,
                    help="search workers (default: the usable cores less one; with --gpus, the cores of each GPU's share)")
    ap.add_argument("--small", action="store_true", help="reduced shapes")
    ap.add_argument("--allow-unproven", action="store_true",
                    help="ship a searched μGraph whose verification did not reach the target bound (a warning each)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these programs (by name)")
    ap.add_argument("--gpu", action="store_true", help="superoptimize and time each program on the GPU")
    ap.add_argument("--tune-seconds", type=float, default=60.0, help="--gpu: autotuning seconds per program")
    ap.add_argument("--out", default="out/generality", help="--gpu: folder for generality.csv")
    ap.add_argument("--gpus", default=None, help="--gpu: programs side by side on these GPUs ('all' or 0,1,...), "
                    "each with its own share of the cores (as python -m mugraph bench --gpus)")
    args = ap.parse_args()
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("generality: --gpu needs a CUDA GPU (torch sees none)", file=sys.stderr)
            return 2
        return on_gpus(args) if args.gpus else on_gpu(args)
    return search_only(args)


if __name__ == "__main__":
    sys.exit(main())
