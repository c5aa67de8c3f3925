"""What more search and tuning time buys each piece of a decoder layer: the layer's step
captured as the ``"mugraph"`` backend captures it, each distinct piece superoptimized alone
with the given search and GPU-tuning seconds, and a table of what it ships beside its own
torch ops (docs/results.md, "Where a Phi-3-mini decode step's last microseconds are").

    python examples/piece_headroom.py --family phi3 --kv 8192 --search 25 --tune 80       # a GPU machine
    python examples/piece_headroom.py --family phi3 --kv 8192 --only max sqrt               # two pieces
    python examples/piece_headroom.py --family llama --small --device cpu --kv 64 --search 2 --only silu

A layer's compile gives each piece a share of one graph budget (seconds each); run here with
longer limits, the difference between this table's μGraph time and the one a layer row
shipped is what the budget costs that piece. The torch time is the piece's own ops (what the
never-slower rule compares), CUDA-graph medians from DRAM (``lower.profile.measure``, the
``"dram"`` timing: weights and caches read cold, as in a step). On the CPU nothing is timed:
the table gives the cost model's prices (Triton's interpreter says nothing of a GPU's speed).
``--json`` writes every row with each piece's candidates (``run.candidates_digest``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import _layers as L  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=list(L.FAMILIES), default="phi3")
    ap.add_argument("--tokens", type=int, default=1, help="new tokens of the decode step")
    ap.add_argument("--kv", type=int, default=8192, help="cached tokens (a static cache, as the layer rows)")
    ap.add_argument("--search", type=float, default=25.0, help="search seconds a piece")
    ap.add_argument("--tune", type=float, default=80.0, help="GPU tuning seconds a piece")
    ap.add_argument("--workers", type=int, default=None, help="search workers (default: the search's)")
    ap.add_argument("--only", nargs="+", default=None, metavar="KIND",
                    help="only the pieces holding one of these catalog ops (max, sqrt, silu, ...)")
    ap.add_argument("--match", default=None, metavar="TEXT",
                    help="only the pieces whose description holds TEXT (e.g. '2 ops (add×1, matmul×1)')")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--small", action="store_true", help="the family's tiny config (a CPU smoke run)")
    ap.add_argument("--json", default=None, help="write every row here")
    ap.add_argument("-v", "--verbose", action="store_true", help="the search's log lines")
    args = ap.parse_args(argv)
    if args.device == "cpu" or (args.device == "auto" and not L.cuda_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import logging

    import torch

    import mugraph.frontend  # noqa: F401 - registers the backend (the capture is its)

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("mugraph").setLevel(logging.INFO if args.verbose else logging.WARNING)
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    captured = capture(args.family, args.small, args.tokens, args.kv, device, dtype)
    rows = []
    for bp in captured.distinct().values():  # identical layers share one search
        if args.only and not {op.kind for op in bp.program.ops} & set(args.only):
            continue
        if args.match and args.match not in bp.describe():
            continue
        rows.append(headroom(bp, args.search, args.tune, args.workers, device))
        print(format_row(rows[-1]), flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"\n# {L.FAMILIES[args.family].name}, {args.tokens} token(s) over {args.kv} cached, {name}; "
          f"search {args.search:g} s, tuning {args.tune:g} s a piece; μs"
          + ("" if device == "cuda" else " (CPU: the cost model's prices, nothing timed)"))
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"family": args.family, "tokens": args.tokens, "kv": args.kv, "device": name,
                       "search_s": args.search, "tune_s": args.tune, "rows": rows}, f, indent=1, default=str)
    return 0


def capture(family: str, small: bool, tokens: int, kv: int, device: str, dtype):
    """The layer's decode step over a static cache, traced and cut as the backend does it
    (``Captured``, its default size limits)."""
    import torch

    from mugraph.frontend.capture import trace
    from mugraph.frontend.graph import Captured

    cfg, layer, rope = L.build_layer(family, small, device, dtype, "sdpa", kv + tokens + 16)
    ins, _ = L.static_inputs(cfg, rope, tokens, kv, device, dtype)
    step = L.make_static_step(layer)
    got: dict = {}

    def grab(gm, example_inputs):  # dynamo's graph and inputs, as the backend gets them
        got["gm"], got["inputs"] = gm, example_inputs
        return gm

    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(step, backend=grab)(*ins)
        return Captured(trace(got["gm"], tuple(got["inputs"])))


def headroom(bp, search_s: float, tune_s: float, workers: int | None, device: str) -> dict:
    """``bp`` superoptimized alone with these limits (the backend's config otherwise, no result
    cache), and its torch ops timed on a GPU: one row."""
    from mugraph.core.text import kernel_structure
    from mugraph.frontend import run
    from mugraph.frontend.options import FrontendOptions
    from mugraph.pipeline.optimize import superoptimize

    conf = {**run.optimize_config(bp, FrontendOptions(time_limit=search_s)), "tune_s": tune_s}
    if workers is not None:
        conf["search"] = {**conf["search"], "workers": workers}
    row = {"piece": bp.describe()}
    t0 = time.perf_counter()
    try:
        opt = superoptimize(bp.program, conf, device=device, cache_dir=False, progress=False)
    except Exception as e:  # noqa: BLE001 - a piece that fails says why; the table goes on
        row["error"] = L.one_line(e)
        return row
    best = opt.best
    row.update(seconds=time.perf_counter() - t0, origin=best.found_by or best.origin,
               structure=kernel_structure(best.graph) if best.origin == "search" else f"{best.num_kernels} kernels",
               configs=run.config_labels(best.configs) if best.configs else "",
               mugraph_us=None if best.measured_s is None else best.measured_s * 1e6,
               predicted_us=None if best.predicted_s is None else best.predicted_s * 1e6,
               candidates=run.candidates_digest(opt.candidates, best, most=30))
    row["torch_us"] = torch_us(bp) if device == "cuda" else None
    return row


def torch_us(bp) -> float | None:
    """The piece's own torch ops as the never-slower rule runs them (compiled by Inductor), a
    CUDA-graph median with the large inputs read from DRAM, μs (None where that fails)."""
    import torch

    from lower.profile import measure_on
    from mugraph.frontend.options import PIECE_TIMING
    from mugraph.frontend.pieces import example_inputs
    from mugraph.frontend.run import torch_form

    try:
        xs = example_inputs(bp, "cuda")[:len(bp.inputs)]
        fn = torch_form(bp, xs, inductor=True)
        with torch.no_grad():
            return measure_on(lambda s: (lambda: fn(*s)), xs, PIECE_TIMING) * 1e6
    except Exception:  # noqa: BLE001 - a row without the torch time
        return None


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['piece'][:70]}: {r['error']}"
    return (f"{r['piece'][:70]}: {r['origin']} {r['structure']} [{r['configs']}] "
            f"{L.fmt(r['mugraph_us'], '.2f')} μs (predicted {L.fmt(r['predicted_us'], '.2f')}), "
            f"torch {L.fmt(r['torch_us'], '.2f')} μs, {r['seconds']:.0f} s")


def format_table(rows: list[dict]) -> str:
    lines = L.table_head(["piece", "shipped (found by; structure; configs)", "μGraph μs", "predicted μs",
                          "torch ops μs", "× torch", "s"])
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['piece'][:60]} | {r['error']} | | | | | |")
            continue
        ratio = r["torch_us"] / r["mugraph_us"] if r["torch_us"] and r["mugraph_us"] else None
        lines.append(f"| {r['piece'][:60]} | {r['origin']}; {r['structure']}; {r['configs'] or '-'} "
                     f"| {L.fmt(r['mugraph_us'], '.2f')} | {L.fmt(r['predicted_us'], '.2f')} "
                     f"| {L.fmt(r['torch_us'], '.2f')} | {L.fmt(ratio, '.2f')} | {r['seconds']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
