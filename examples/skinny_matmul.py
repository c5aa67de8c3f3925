"""Skinny projections as a decode step runs them: ``rows`` new tokens (1–64) times a weight
of a real model's projection shape, with its RMSNorm prologue and its residual, bias or
activation epilogue — superoptimized, and timed against cuBLAS, against the same program as
torch calls and as ``torch.compile`` compiles them, with the copy floor of the weight.

    python examples/skinny_matmul.py --families llama qwen2 phi3 gemma   # a GPU machine
    python examples/skinny_matmul.py --rows 1 8 --shapes 4096x4096 --plain
    python examples/skinny_matmul.py --gated gelu_tanh --rows 1 --shapes 2048x16384   # Gemma-2B's MLP

``--families`` takes the four projections of each named decoder layer at its public sizes
(``examples/_layers.FAMILIES``; a shape two families share is run once):

* ``norm+qkv``: ``rms_norm(X)·g @ Wqkv`` (``+ b`` where the family biases q, k and v);
* ``o+res``: ``X @ Wo + R``;
* ``gate·up``: ``ACT(X @ Wg) · (X @ Wu)`` (the family's activation);
* ``down+res``: ``X @ Wd + R``.

``--shapes`` instead runs ``X @ W + R`` and ``rms_norm(X)·g @ W + R`` (``--plain``: the first
only) or, with ``--gated ACT``, the gated projection. ``W`` is handed in as a model holds it
(``--weight-layout linear``, the default: ``nn.Linear``'s (N, K) weight, transposed —
``OptimizeConfig.input_strides`` tunes for that layout) or row-major.

Columns: ours; **cuBLAS**, the projection's one library call on the same layout (``addmm``
with the residual or bias, else ``mm``; the gated pair as one ``mm`` over both weights side by
side, as a fused ``gate_up_proj`` runs it) — the norm and the activation not counted; the
program op by op in torch; the program under ``torch.compile``; the floor (every input and
the output moved once at the measured copy bandwidth). Prints a Markdown table as rows finish
and, with ``--json``, rewrites the file after each row, so a stopped run keeps what it timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import _layers as L  # noqa: E402
import mugraph as mg  # noqa: E402
from lower import KernelConfig  # noqa: E402
from lower.profile import measure  # noqa: E402
from mugraph.core.benchmarks.programs import gated_mlp  # noqa: E402
from mugraph.core.benchmarks.torch_versions import activation  # noqa: E402
from mugraph.pipeline.bench import copy_bandwidth  # noqa: E402

#: (K, N) of the projections of LLaMA-3-8B (q/o, gate/up, down), Qwen2-7B (gate/up) and Phi-3 (qkv)
SHAPES = ("4096x4096", "4096x14336", "14336x4096", "3584x18944", "3072x9216")


@dataclass(frozen=True)
class Projection:
    """One skinny projection: ``X (rows×k) @ W (k×n)`` with what a decoder layer fuses around it."""

    name: str
    k: int
    n: int
    norm: bool = False       # rms_norm(X)·g before the product
    epilogue: str = "none"   # "residual" (+ R), "bias" (+ b), "none"
    gated: str | None = None  # ACT(X @ W1) · (X @ W2) with this activation

    def program(self, rows: int, dtype: str) -> mg.Program:
        if self.gated:
            return gated_mlp(hidden=self.k, out=self.n, dtype=dtype, act=self.gated, rows=rows)
        p = mg.Program(f"{self.name.replace('+', '_').replace('·', '_')}_{rows}x{self.k}x{self.n}")
        x, w = p.input("X", (rows, self.k), dtype), p.input("W", (self.k, self.n), dtype)
        if self.norm:
            x = mg.rms_norm(x, 1) * p.input("g", (1, self.k), dtype)
        y = x @ w
        if self.epilogue == "residual":
            y = y + p.input("R", (rows, self.n), dtype)
        elif self.epilogue == "bias":
            y = y + p.input("b", (1, self.n), dtype)
        p.output(y)
        return p

    def weights(self) -> tuple[str, ...]:
        return ("W1", "W2") if self.gated else ("W",)

    def torch_ops(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        """The program as torch calls (what eager code runs)."""
        if self.gated:
            return activation(self.gated)(torch.mm(x["X"], x["W1"])) * torch.mm(x["X"], x["W2"])
        a = x["X"]
        if self.norm:
            a = a * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True)).to(a.dtype) * x["g"]
        extra = x.get("R", x.get("b"))
        return torch.mm(a, x["W"]) if extra is None else torch.addmm(extra, a, x["W"])

    def cublas(self, x: dict[str, torch.Tensor]):
        """The projection's single library call, on the weight's own layout (norm and activation left out)."""
        if self.gated:
            both = torch.cat([x["W1"].t(), x["W2"].t()]).t()  # one (2N, K) weight, as a fused gate_up_proj
            return lambda: torch.mm(x["X"], both)
        extra = x.get("R", x.get("b"))
        if extra is None:
            return lambda: torch.mm(x["X"], x["W"])
        return lambda: torch.addmm(extra, x["X"], x["W"])


def family_projections(families: list[str]) -> dict[Projection, list[str]]:
    """The four projections of each family's decoder layer, each with the families that share it."""
    found: dict[Projection, list[str]] = {}
    for name in families:
        f = L.FAMILIES[name]
        d = f.dims
        h, heads, kv = d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"]
        hd = d.get("head_dim") or h // heads
        act = "gelu_tanh" if "gelu" in f.extra.get("hidden_activation", "silu") else "silu"
        biased = "biased" in f.note
        for p in (Projection("norm+qkv", h, (heads + 2 * kv) * hd, norm=True, epilogue="bias" if biased else "none"),
                  Projection("o+res", heads * hd, h, epilogue="residual"),
                  Projection("gate·up", h, d["intermediate_size"], gated=act),
                  Projection("down+res", d["intermediate_size"], h, epilogue="residual")):
            found.setdefault(p, []).append(f.name)
    return found


def shape_projections(args) -> dict[Projection, list[str]]:
    out: dict[Projection, list[str]] = {}
    for shape in args.shapes:
        k, n = (int(v) for v in shape.split("x"))
        if args.gated:
            out[Projection("gate·up", k, n, gated=args.gated)] = []
            continue
        out[Projection("proj+res", k, n, epilogue="residual")] = []
        if not args.plain:
            out[Projection("rmsnorm+proj+res", k, n, norm=True, epilogue="residual")] = []
    return out


def run_row(proj: Projection, rows: int, args, bw: float) -> dict:
    p = proj.program(rows, args.dtype)
    strided = {w: (1, proj.k) for w in proj.weights()} if args.weight_layout == "linear" else None
    t0 = time.perf_counter()
    opt = mg.superoptimize(p, {"search": {"time_limit": args.time_limit}, "tune_s": args.tune_s,
                               "input_strides": strided}, device="cuda", cache_dir=False, progress=False)
    compile_s = time.perf_counter() - t0
    g = torch.Generator(device="cuda").manual_seed(0)
    x = {t.name: torch.randn(t.shape, generator=g, device="cuda", dtype=getattr(torch, args.dtype)) * 0.1
         for t in p.inputs}
    for w in (strided or {}):
        x[w] = x[w].t().contiguous().t()  # the same values, stored as nn.Linear's (N, K)
    fn = opt.compiled("cuda")
    ours = measure(fn.launcher(*x.values()))
    cublas = measure(proj.cublas(x))
    ops = measure(lambda: proj.torch_ops(x))
    torch._dynamo.reset()  # each row its own compile: dynamo's recompile limit would fall back to eager
    compiled = torch.compile(proj.torch_ops, dynamic=False)
    inductor = measure(lambda: compiled(x))
    floor = (sum(t.nbytes for t in p.inputs) + rows * proj.n * 2) / bw
    labels = {int(i): KernelConfig.of(c).label() for i, c in opt.best.configs.items()}
    kernels = " + ".join(f"{op.attrs['block'].num_blocks}x{op.attrs['block'].forloop} {labels.get(op.id, '')}"
                         for op in opt.graph.ops if op.kind == "graph_defined") or "library ops"
    return dict(program=proj.name, rows=rows, k=proj.k, n=proj.n, ours_us=ours * 1e6, cublas_us=cublas * 1e6,
                torch_us=ops * 1e6, inductor_us=inductor * 1e6, floor_us=floor * 1e6,
                structure=f"{opt.best.origin}; {kernels}", proven=opt.best.proven, compile_s=compile_s)


def table_line(r: dict, families: list[str]) -> str:
    if "error" in r:
        return f"| {r['program']} | {', '.join(families)} | {r['rows']} | {r['k']}×{r['n']} | failed: {r['error']} |"
    best = min(r["cublas_us"], r["inductor_us"])
    return (f"| {r['program']} | {', '.join(families)} | {r['rows']} | {r['k']}×{r['n']} | {r['ours_us']:.1f} | "
            f"{r['structure']}{'' if r['proven'] else ' (unproven)'} | {r['cublas_us']:.1f} | {r['torch_us']:.1f} | "
            f"{r['inductor_us']:.1f} | {r['floor_us']:.1f} | {r['cublas_us'] / r['ours_us']:.2f} | "
            f"{best / r['ours_us']:.2f} | {r['ours_us'] / r['floor_us']:.2f} | {r['compile_s']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--families", nargs="+", choices=list(L.FAMILIES), default=None,
                    help="the four projections of these decoder layers (instead of --shapes)")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="KxN")
    ap.add_argument("--plain", action="store_true", help="with --shapes: only X @ W + R (no RMSNorm prologue)")
    ap.add_argument("--gated", default=None, choices=("gelu_tanh", "silu"),
                    help="with --shapes: ACT(X @ W1) * (X @ W2) instead of the residual projections")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--tune-s", type=float, default=10.0)
    ap.add_argument("--weight-layout", choices=("linear", "row"), default="linear",
                    help="W as nn.Linear stores it (transposed, the default) or row-major")
    ap.add_argument("--json", default=None, help="write the rows here (rewritten after each row)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    args = ap.parse_args()
    projections = family_projections(args.families) if args.families else shape_projections(args)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}, {args.dtype}; μs, median, CUDA-graph replay; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s; W {args.weight_layout} layout (cuBLAS on the same); "
          f"search {args.time_limit:g} s, tuning {args.tune_s:g} s")
    print("| program | families | rows | K×N | ours μs | shipped | cuBLAS μs | torch ops μs | torch.compile μs | "
          "floor μs | × cuBLAS | × best of cuBLAS, torch.compile | ours / floor | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for proj, families in projections.items():
        for rows in args.rows:
            try:
                row = run_row(proj, rows, args, bw)
            except Exception as e:  # a row that fails is reported and the others still run
                row = dict(program=proj.name, rows=rows, k=proj.k, n=proj.n, error=L.one_line(e))
            row["families"] = families
            row["projection"] = asdict(proj)
            out.append(row)
            print(table_line(row, families), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
