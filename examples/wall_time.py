"""``superoptimize``'s wall time against its budget, phase by phase.

The budget is ``time_limit + tune_s + 30 s`` (``mugraph.pipeline.optimize.SLACK_S``) on a
GPU, ``time_limit + 30 s`` on a CPU; ``report["phases"]`` says where the time went. Each
program is superoptimized once, without the cache, with the default workers.

    python examples/wall_time.py --time-limit 60 --tune-s 30 --out out/wall    # GPU machine
    python examples/wall_time.py --only swiglu_16 rmsnorm_proj_16 --time-limit 20 --tune-s 10

Prints a Markdown table (program, weights MB, wall s, budget s, each phase's seconds, what
shipped and whether its proof met the target) and writes ``wall.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mugraph as mg
from mugraph.core.benchmarks import decode_attention, program
from proof_bounds import vocab_softmax  # the same program the bounds table proves

PHASES = ("search", "check", "gpu_reference", "gpu_tuning")


def swiglu(m: int = 16, hidden: int = 4096, inter: int = 11008) -> mg.Program:
    """A SwiGLU MLP: silu(x@W1)·(x@W3)@W2 (268 MB of fp16 weights at these sizes)."""
    p = mg.Program(f"swiglu_{m}")
    x = p.input("x", (m, hidden), "float16")
    W1, W3 = p.input("W1", (hidden, inter), "float16"), p.input("W3", (hidden, inter), "float16")
    W2 = p.input("W2", (inter, hidden), "float16")
    p.output((mg.silu(x @ W1) * (x @ W3)) @ W2)
    return p


def rmsnorm_proj(m: int = 16, hidden: int = 4096) -> mg.Program:
    """RMSNorm (with its weight) and a square projection."""
    p = mg.Program(f"rmsnorm_proj_{m}")
    x, g = p.input("x", (m, hidden), "float16"), p.input("g", (1, hidden), "float16")
    W = p.input("W", (hidden, hidden), "float16")
    p.output((mg.rms_norm(x) * g) @ W)
    return p


def router(m: int = 16, hidden: int = 4096, experts: int = 64) -> mg.Program:
    """A softmax router: each token's weights over the experts (without the max; the logits
    scaled by 1/√hidden so that fp16 does not overflow)."""
    p = mg.Program(f"router_{m}")
    x, W = p.input("x", (m, hidden), "float16"), p.input("W", (hidden, experts), "float16")
    e = mg.exp(mg.scale(x @ W, 1 / 64))
    p.output(e / mg.sum(e, 1))
    return p


PROGRAMS = {
    "swiglu_16": swiglu, "rmsnorm_proj_16": rmsnorm_proj, "router_16": router, "vocab_softmax": vocab_softmax,
    "rmsnorm_matmul": lambda: program("rmsnorm_matmul", b=1), "gated_mlp": lambda: program("gated_mlp", b=1),
    "lora": lambda: program("lora", b=1), "gqa": lambda: program("gqa", b=1),
    "decode_h32": lambda: decode_attention(heads=32, kv_heads=8, kv=4096, head_dim=128),
}


def inputs_mb(p: mg.Program) -> float:
    """The program's inputs (weights and activations), MB."""
    return sum(t.nbytes for t in p.inputs) / 2 ** 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--tune-s", type=float, default=30.0)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(PROGRAMS))
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--out", default="out/wall")
    ap.add_argument("--progress", action="store_true", help="the search's progress lines on stderr")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| program | inputs MB | wall s | budget s | " + " | ".join(PHASES) + " | shipped | proven |")
    print("|---|---|---|---|" + "---|" * len(PHASES) + "---|---|")
    for name in args.only or PROGRAMS:
        p = PROGRAMS[name]()
        t0 = time.perf_counter()
        opt = mg.superoptimize(p, {"search": {"time_limit": args.time_limit}, "tune_s": args.tune_s},
                               device=args.device, cache_dir=False, progress=args.progress)
        wall = time.perf_counter() - t0
        r = opt.report
        ph = r.get("phases", {})
        shipped = f"{opt.best.origin}, {opt.best.num_kernels} kernel(s)"
        row = {"program": name, "inputs_mb": inputs_mb(p), "wall_s": wall, "budget_s": r.get("budget_s"),
               "phases": ph, "overran": r.get("overran"), "shipped": shipped, "proven": opt.best.proven,
               "set_aside": len(r.get("set_aside", [])), "device": r.get("device"),
               "search_stats": (r.get("search") or {}).get("stats"),
               "date": time.strftime("%Y-%m-%d")}
        rows.append(row)
        print(f"| {name} | {row['inputs_mb']:.0f} | {wall:.1f} | {row['budget_s']:.0f} | "
              + " | ".join(f"{ph.get(k, 0.0):.1f}" for k in PHASES)
              + f" | {shipped} | {'yes' if opt.best.proven else 'NO'} |", flush=True)
        (out / "wall.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
