"""Sweep hand-written GEMV μGraphs (``X @ W``, a few rows) over tiles, split-K and kernel
configs, with W stored as ``nn.Linear`` stores it (transposed), against cuBLAS's ``mm`` on
the same layout: what the lowering can reach for a decode step's projections, whatever the
search and the tuner find.

    python examples/gemv_sweep.py                                   # a GPU machine
    python examples/gemv_sweep.py --shapes 1x4096x4096 --cols 32 64 --steps 128 256
    python examples/gemv_sweep.py --gated gelu_tanh --shapes 1x2048x16384    # act(X@W1) * (X@W2)
    python examples/gemv_sweep.py --form residual --timing dram --dtype bfloat16 --shapes 1x3072x3072 \
        --cols 32 64 128 --steps 64 128 256 --splits 1 2 3 4 6 8 12 --warps 4 --stages 3 4
    python examples/gemv_sweep.py --form norm --timing dram --dtype bfloat16 --shapes 1x3072x9216 \
        --cols 64 128 --steps 64 --chunks 1 2 4 8 --subs - 2:2 2:8 --small-mm dot --stages 3

Each μGraph: a grid over W's columns (``--cols`` per block), a loop over K (``--steps``
deep); every variant is checked against float64 first (a wrong one is reported, not timed).
Prints the fastest variants per shape with their ratio to ``mm`` and to the copy floor of W,
the cost model's price of each (for the card it runs on, read as ``--timing`` reads the inputs:
``lower.cost_model.for_timing``; the ranking is what it is for), the measured time of the
model's favourite and the rank agreement (Spearman) of model and measurement over the shape's
variants (``--chunks``, ``--subs``, ``--combines`` and ``--staging`` widen the configurations
to re-chunked loops, sub-tiles, the combine kernel and staged loads); ``--json`` writes every row, with the μGraph of each tiling and the card's name
(``python -m lower.calibration --add-sweep`` records such a file for the model's checks). ``--form`` sweeps a decode step's forms of the product:
``residual`` (``X @ W + R``, the output and down projections, against ``addmm``) or ``norm``
(``rms_norm(X)·g @ W``, the RMSNorm fused into the projection that reads it, against ``mm``). ``--gated ACT`` sweeps the gated projection of an MLP instead —
``ACT(X @ W1) * (X @ W2)`` in one kernel, both weights walked by one loop and the gate in its
epilogue — against torch's two ``mm`` and its element-wise ops. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from lower import KernelConfig  # noqa: E402
from lower.config import parse_sub  # noqa: E402
from lower.calibration import spearman  # noqa: E402
from lower.cost_model import default_params, estimate, for_timing  # noqa: E402
from lower.cold_inputs import rotated_sets  # noqa: E402
from lower.profile import measure_on  # noqa: E402
from lower.runtime import compile as lower_compile  # noqa: E402
from lower.testing import rel_error  # noqa: E402
from mugraph.core.benchmarks.handwritten import GEMV_FORMS, gated_mlp, gemv  # noqa: E402
from mugraph.core.benchmarks.torch_versions import activation  # noqa: E402
from mugraph.core.serialize import graph_to_json  # noqa: E402


def configs(forloop: int, splits, warps, stages, small_mm, chunks=(1,), subs=((),), combines=("last",),
            staging=(False,)) -> list[KernelConfig]:
    """Split-K factors that divide the loop (each combined as ``combines`` lists: ``"last"``
    program or a ``"kernel"`` of its own), re-chunkings (``chunk`` loop iterations a generated
    step) that divide what each split keeps, sub-tilings (``KernelConfig.sub``) and staged loads
    (``stage_all_loads``), times the rest."""
    out = []
    for k, c, sub, mm, w, s, a in itertools.product(splits, chunks, subs, small_mm, warps, stages, staging):
        if forloop % k or (forloop // k) % c:
            continue
        for combine in (combines if k > 1 else ("kernel",)):
            out.append(KernelConfig(num_warps=w, num_stages=s, split=k, combine=combine, small_mm=mm, chunk=c,
                                    sub=sub, stage_all_loads=a))
    return out


def _inputs(form: str, gated: str | None, rows: int, k: int, n: int, dtype: torch.dtype):
    """``(inputs, float64 reference, torch's form)`` of one shape: W (W1, W2) in ``nn.Linear``'s
    layout, ``G`` for the norm, ``R`` for the residual; torch's form the baseline timed beside."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, k, device="cuda", generator=g) * 0.1).to(dtype)
    ins = {"X": x, **{name: (torch.randn(n, k, device="cuda", generator=g) * 0.1).to(dtype).t()  # (K, N), strides (1, K)
                      for name in (("W1", "W2") if gated else ("W",))}}
    if form == "norm":
        ins["G"] = (torch.rand(k, device="cuda", generator=g) + 0.5).to(dtype)
    if form == "residual":
        ins["R"] = torch.randn(rows, n, device="cuda", generator=g).to(dtype)
    d = {name: v.double() for name, v in ins.items()}
    if gated:
        act = activation(gated)
        return ins, act(d["X"] @ d["W1"]) * (d["X"] @ d["W2"]), lambda s: lambda: act(torch.mm(s["X"], s["W1"])) * \
            torch.mm(s["X"], s["W2"])
    if form == "norm":
        ref = (d["X"] * d["G"]) @ d["W"] / (d["X"] ** 2).mean(1, keepdim=True).sqrt()
        return ins, ref, lambda s: lambda: torch.mm(s["X"], s["W"])
    if form == "residual":
        return ins, d["X"] @ d["W"] + d["R"], lambda s: lambda: torch.addmm(s["R"], s["X"], s["W"])
    return ins, d["X"] @ d["W"], lambda s: lambda: torch.mm(s["X"], s["W"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1x4096x4096", "1x14336x4096", "1x4096x14336", "8x4096x4096"],
                    help="ROWSxKxN")
    ap.add_argument("--cols", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--steps", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--small-mm", nargs="+", default=["dot", "v"], choices=["dot", "v", "va"])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1], choices=[1, 2, 4, 8, 16],
                    help="loop iterations a generated step runs (KernelConfig.chunk)")
    ap.add_argument("--subs", nargs="+", default=["-"],
                    help="sub-tilings, as KernelConfig labels write them after 'p' (class:factor, e.g. 2:2); "
                         "'-' for none")
    ap.add_argument("--combines", nargs="+", default=["last"], choices=["last", "kernel"],
                    help="how split-K partials are combined (KernelConfig.combine)")
    ap.add_argument("--staging", nargs="+", default=["-"], choices=["-", "A"],
                    help="'A': every load staged through shared memory (KernelConfig.stage_all_loads)")
    ap.add_argument("--top", type=int, default=8, help="rows printed per shape")
    ap.add_argument("--json", default=None, help="write every row here")
    ap.add_argument("--timing", default="graph", choices=["graph", "dram"],
                    help="lower.profile.TIMINGS: graph (weights warm in L2 when they fit) or dram (each call on its "
                         "own copy of the weights, read from DRAM as in a model's step)")
    ap.add_argument("--gated", default=None, choices=["silu", "gelu_tanh"],
                    help="sweep ACT(X @ W1) * (X @ W2) in one kernel instead of X @ W")
    ap.add_argument("--form", default="plain", choices=GEMV_FORMS,
                    help="X @ W; X @ W + R (residual); rms_norm(X)·g @ W (norm)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = ap.parse_args()
    if args.gated and args.form != "plain":
        ap.error("--gated sweeps its own form: leave --form plain")
    try:
        subs = [() if t == "-" else parse_sub(t) for t in args.subs]
    except ValueError:
        ap.error(f"--subs: {' '.join(args.subs)}: each is '-' or class:factor[xclass:factor…], e.g. 2:2")
    if not torch.cuda.is_available():
        print("gemv_sweep: no CUDA device — nothing to time. Skipping.")
        return 0
    from mugraph.pipeline.bench import copy_bandwidth

    bw = copy_bandwidth()
    dev = for_timing(default_params(), args.timing)
    print(f"{torch.cuda.get_device_name()}; μs, median, CUDA-graph replay, {args.timing} timing; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s; W in nn.Linear's layout; {args.form} form, {args.dtype}; the model at "
          f"{dev.name}'s parameters, {'every input from DRAM' if dev.l2_bytes == 0 else 'small graphs in L2'}")
    rows_out, graphs = [], {}
    for shape in args.shapes:
        rows, k, n = (int(v) for v in shape.split("x"))
        ins, ref, torch_form = _inputs(args.form, args.gated, rows, k, n, getattr(torch, args.dtype))
        sets = rotated_sets(ins) if args.timing == "dram" else None
        mm_s = measure_on(torch_form, ins, args.timing, sets)
        floor_s = k * n * ins["X"].element_size() * (2 if args.gated else 1) / bw
        strides = {name: tuple(w.stride()) for name, w in ins.items() if name.startswith("W")}
        timed = []
        for cols, steps in itertools.product(args.cols, args.steps):
            if n % cols or k % steps:
                continue
            try:
                kg = (gated_mlp(rows=rows, hidden=k, out=n, col_tile=cols, loop=k // steps, act=args.gated,
                                dtype=args.dtype)
                      if args.gated else gemv(rows, k, n, cols, steps, args.form, args.dtype))
            except Exception as e:  # noqa: BLE001 - tiles too large for shared memory: say which
                print(f"  skipped: {cols} cols, {steps}-deep steps: {str(e).splitlines()[0][:100]}", flush=True)
                continue
            op = next(o.id for o in kg.ops if o.kind == "graph_defined")
            graphs[f"{shape} {cols}x{steps}"] = graph_to_json(kg)
            for c in configs(k // steps, args.splits, args.warps, args.stages, args.small_mm, args.chunks, subs,
                             args.combines, [t == "A" for t in args.staging]):
                label = f"{n // cols} blocks of {cols} cols, {steps}-deep steps, {c.label()}"
                try:
                    model_s = estimate(kg, dev, configs={op: c})
                    prog = lower_compile(kg, device="cuda", configs={op: c}, input_strides=strides)
                    err = rel_error(prog(**ins), ref)
                    if not err <= 2e-2:
                        print(f"  wrong: {label}: relative error {err:.2e}", flush=True)
                        continue
                    t = measure_on(lambda s: prog.launcher(**s), ins, args.timing, sets)
                except Exception as e:  # noqa: BLE001 - a variant the card cannot run (shared memory): say which
                    print(f"  skipped: {label}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                    continue
                timed.append((t, model_s, label))
                rows_out.append(dict(shape=shape, gated=args.gated, form=args.form, cols=cols, steps=steps,
                                     config=c.label(), us=t * 1e6, model_us=model_s * 1e6, mm_us=mm_s * 1e6,
                                     floor_us=floor_s * 1e6))
                if args.json:  # after every row: a sweep stopped by a time limit keeps what it timed
                    _write(args.json, args, graphs, rows_out)
        _report(shape, timed, mm_s, floor_s, "torch (mm, mm, element-wise)" if args.gated else
                {"residual": "cuBLAS addmm", "norm": "cuBLAS mm (no norm)"}.get(args.form, "cuBLAS mm"), args.top)
    return 0


def _write(path: str, args: argparse.Namespace, graphs: dict, rows: list[dict]) -> None:
    """Write the sweep so far to ``path`` (through a temporary file, so that a sweep killed
    mid-write leaves the previous version whole)."""
    doc = dict(kind="gemv_sweep", device=torch.cuda.get_device_name(), timing=args.timing, dtype=args.dtype,
               graphs=graphs, rows=rows)
    with open(path + ".part", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".part", path)


def _report(shape: str, timed: list[tuple[float, float, str]], mm_s: float, floor_s: float, base: str,
            top: int) -> None:
    """The fastest variants of one shape, the model's favourite and the rank agreement."""
    timed.sort()
    print(f"\n{shape}: {base} {mm_s * 1e6:.2f} μs, floor {floor_s * 1e6:.2f} μs; fastest of {len(timed)}:")
    for t, model_s, label in timed[:top]:
        print(f"  {t * 1e6:7.2f} μs  {mm_s / t:5.2f}× torch  {t / floor_s:5.2f}× floor  "
              f"model {model_s * 1e6:6.1f}  {label}", flush=True)
    if timed:
        fav = min(timed, key=lambda r: r[1])
        rho = spearman([r[1] for r in timed], [r[0] for r in timed])
        print(f"  the model's favourite: {fav[0] * 1e6:.2f} μs ({fav[2]}), {fav[0] / timed[0][0]:.2f}× the "
              f"fastest; rank agreement (Spearman) over the {len(timed)}: {rho:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
