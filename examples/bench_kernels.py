"""Time the lowered reference μGraphs against PyTorch on a CUDA GPU.

For each benchmark of docs/design.md §8.5 at full shapes (b = 1 and 8): the hand-written
reference μGraph, lowered and autotuned by ``lower.tune``, next to PyTorch eager,
``torch.compile`` and (attention) SDPA, the fastest of the forms a caller writes
(``torch_versions.sdpa_forms``) — every variant timed the same way by
``lower.profile.measure`` under each timing of ``--modes`` (default ``graph``,
triton's ``do_bench_cudagraph``: the headline and what the tuner optimizes, and
``cold``: L2 evicted before each call) — and the memory-traffic floor (inputs
read once + outputs written once, over the bandwidth of a device-to-device copy
measured on the same card) and the same floor as the timer sees it ("stream":
one Triton kernel reading that many bytes, timed like everything else). Also
the cost model's prediction beside each measured time and the Spearman rank
correlation between predicted and measured times (over the references and all
tuned variants).

The tuned configurations are written to ``OUT/configs.json``; ``--configs FILE``
times those instead of tuning again (so that one short run can time all twelve
rows after the tuning was done in several).

    python examples/bench_kernels.py --out out/bench          # table, CSV, PNG

Without CUDA it prints a message and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

NAMES = ["rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "ntrans"]


from lower.calibration import spearman  # noqa: E402
from lower.profile import TIMINGS, measure  # noqa: E402
from mugraph.core.benchmarks.torch_versions import SDPA, TORCH, sdpa_forms  # noqa: E402  the baselines, in one place


def stream_probe(nbytes: int, timing: str) -> float:
    """Seconds of one Triton kernel that reads ``nbytes`` (fp16) once with wide,
    pipelined loads and writes one float per program, timed by ``timing`` — the
    memory floor *as this timer sees it*: the same bytes as ``floor``, plus the
    kernel's ramp-up and tail (and, cold, a CUDA-graph launch). Best of a few grid
    shapes."""
    import triton
    import triton.language as tl

    @triton.jit
    def _stream(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, STAGES: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in tl.range(0, ITERS, num_stages=STAGES):
            offs = (i * tl.num_programs(0) + pid) * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    n = max(1, nbytes // 2)
    x = torch.rand(n, device="cuda").half()
    best = math.inf
    for progs, block, warps in ((132 * 4, 4096, 4), (132 * 8, 2048, 4), (132 * 2, 8192, 8), (None, 8192, 8)):
        grid = progs or triton.cdiv(n, block)
        iters = triton.cdiv(n, grid * block)
        out = torch.empty(grid, device="cuda")
        best = min(best, measure(lambda: _stream[(grid,)](x, out, n, BLOCK=block, ITERS=iters, STAGES=3,
                                                          num_warps=warps), timing))
    return best


def _copy_bandwidth() -> float:
    """Bytes a second of a 512 MB device-to-device copy (read + written); its buffers are
    freed on return."""
    import triton.testing

    big = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    t_copy = triton.testing.do_bench(lambda: dst.copy_(big), warmup=50, rep=200, return_mode="median") * 1e-3
    return 2 * big.numel() / t_copy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_kernels")
    ap.add_argument("--b", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--top", type=int, default=6, help="grid/loop configs timed per kernel")
    ap.add_argument("--modes", nargs="+", choices=[m for m in TIMINGS if m != "dram"], default=["graph", "cold"],
                    help="timings (lower.profile.TIMINGS) to report; the first is the headline and the one the "
                         "tuner optimizes")
    ap.add_argument("--configs", help="configs.json of an earlier run: time these configurations, do not tune")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device — nothing to time (the CPU tests check correctness). Skipping.")
        return 0

    import triton.testing

    import lower
    import mugraph as mg
    from lower import cost_model
    from lower.testing import bench_inputs
    from mugraph.core.benchmarks import reference

    os.makedirs(args.out, exist_ok=True)
    head = args.modes[0]
    TOL = 2e-2  # fp16 inputs, as the CPU tests
    log_f = open(os.path.join(args.out, "log.txt"), "w")
    given = {}
    if args.configs:
        with open(args.configs) as f:
            given = {k: {int(op): lower.KernelConfig.from_dict(c) for op, c in v.items()}
                     for k, v in json.load(f).items()}
    tuned: dict[str, dict] = {}

    def log(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log_f.write(s + "\n")
        log_f.flush()

    dev = torch.cuda.get_device_name()
    log(f"# bench_kernels {datetime.datetime.now().isoformat(timespec='seconds')} on {dev}, "
        f"torch {torch.__version__}, triton {triton.__version__}")
    bw = _copy_bandwidth()
    log(f"# copy bandwidth {bw / 1e12:.2f} TB/s")
    tiny = torch.zeros(1, device="cuda")
    log("# probe one tiny kernel: " + ", ".join(f"{m} {measure(lambda: tiny.add_(1), m) * 1e6:.2f} us"
                                                 for m in args.modes))

    rows, corr_pts = [], []
    for b in args.b:
        for name in args.names:
            t0 = time.time()
            row = {"name": name, "b": b}
            try:
                g = reference(name, b=b)
                ins = bench_inputs(g)
                targs = [ins[t.name] for t in g.inputs]
                # correctness: every timed variant is checked against the float64 interpreter
                ref64 = mg.evaluate(g, {k: v.double().cpu() for k, v in ins.items()})
                ref = ref64[0].float().to("cuda")
                key = f"{name}-b{b}"
                if key in given:
                    res = lower.profile(g, ins, configs=given[key], ref=ref64, tol=TOL, timing=head)
                else:
                    res = lower.tune(g, ins, top=args.top, log=log, ref=ref64, tol=TOL, timing=head)
                tuned[key] = {str(k): dataclasses.asdict(c) for k, c in res.configs.items()}
                with open(os.path.join(args.out, "configs.json"), "w") as f:
                    json.dump(tuned, f, indent=1)
                prog = res.program
                out = prog(**ins)
                row.update(predicted_us=res.predicted_s * 1e6,
                           rel_err=((out.float() - ref).norm() / ref.norm()).item(),
                           config=" ".join(f"k{k}:{c.label()}" for k, c in res.configs.items()),
                           launches=prog.num_launches)
                corr_pts += [(name, b, lab, m, p) for lab, m, p in res.trials if m is not None and lab != "given"]
                corr_pts.append((name, b, "final", res.time_s, res.predicted_s))
                variants = {"lowered": prog.launcher(**ins), "eager": lambda: TORCH[name](*targs)}
                if not args.no_compile:
                    compiled = torch.compile(TORCH[name], dynamic=False)
                    variants["compile"] = lambda: compiled(*targs)
                if name in SDPA:  # every form a caller writes; the column is the fastest (below)
                    variants.update({f"sdpa[{form}]": call for form, call in sdpa_forms(name, *targs).items()})
                floor_bytes = cost_model.memory_floor_bytes(g)
                row["floor_us"] = floor_bytes / bw * 1e6
                for mode in args.modes:
                    for lab, fn in variants.items():
                        try:
                            row[f"{lab}_{mode}_us"] = measure(fn, mode) * 1e6
                        except Exception as e:  # noqa: BLE001  (torch.compile failures: say so, go on)
                            log(f"  {lab} ({mode}) failed: {type(e).__name__}: {str(e)[:200]}")
                    sdpa = {k: row.pop(f"{k}_{mode}_us") for k in list(variants)
                            if k.startswith("sdpa[") and f"{k}_{mode}_us" in row}
                    if sdpa:
                        form = min(sdpa, key=sdpa.get)
                        row[f"sdpa_{mode}_us"], row[f"sdpa_{mode}_form"] = sdpa[form], form[5:-1]
                    row[f"stream_{mode}_us"] = stream_probe(floor_bytes, mode) * 1e6
                    best = min(row[f"{k}_{mode}_us"] for k in ("eager", "compile", "sdpa") if f"{k}_{mode}_us" in row)
                    row[f"best_torch_{mode}_us"] = best
                    row[f"speedup_{mode}"] = best / row[f"lowered_{mode}_us"]
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                log(traceback.format_exc())
            row["bench_s"] = round(time.time() - t0, 1)
            rows.append(row)
            write_results(args, rows, corr_pts, bw, dev, lambda *a: None)
            log(f"{name} b={b}: " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in row.items() if k not in ("name", "b")))

    write_results(args, rows, corr_pts, bw, dev, log)
    return 0


def write_results(args, rows, corr_pts, bw, dev, log) -> None:
    modes = args.modes
    cols = ["name", "b", "floor_us", "predicted_us", "rel_err", "launches", "config"]
    for m in modes:
        cols += [f"{k}_{m}_us" for k in ("lowered", "eager", "compile", "sdpa", "best_torch", "stream")]
        cols.append(f"sdpa_{m}_form")  # the SDPA form that was fastest (torch_versions.sdpa_forms)
        cols.append(f"speedup_{m}")
    cols += ["bench_s", "error"]
    # rank correlation: references' final times, and all variants
    fin = [(m, p) for (_, _, lab, m, p) in corr_pts if lab == "final"]
    rho_refs = spearman([m for m, _ in fin], [p for _, p in fin])
    rho_all = spearman([m for *_, m, _ in corr_pts], [p for *_, p in corr_pts])
    per = []
    for name in args.names:
        for b in args.b:
            pts = [(m, p) for (n, bb, lab, m, p) in corr_pts if n == name and bb == b and lab != "final"]
            r = spearman([m for m, _ in pts], [p for _, p in pts])
            if not math.isnan(r):
                per.append(r)
    rho_within = sorted(per)[len(per) // 2] if per else float("nan")

    with open(os.path.join(args.out, "bench_kernels.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    with open(os.path.join(args.out, "variants.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "b", "variant", "measured_us", "predicted_us"])
        for n, b, lab, m, p in corr_pts:
            w.writerow([n, b, lab, f"{m * 1e6:.3f}", f"{p * 1e6:.3f}"])

    def fmt(v, spec=".1f"):
        return format(v, spec) if isinstance(v, float) else "—"

    lines = []
    for m in modes:
        lines += [f"**{m}** — {TIMINGS[m]}", "",
                  "| benchmark | b | lowered | eager | compile | SDPA | ×best torch | floor | stream | ×floor | "
                  "×stream | predicted | rel.err | config |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['name']} | {r['b']} | error: {r['error'][:80]} |")
                continue
            low = r.get(f"lowered_{m}_us")
            st = r.get(f"stream_{m}_us")
            lines.append(f"| {r['name']} | {r['b']} | {fmt(low)} | {fmt(r.get(f'eager_{m}_us'))} | "
                         f"{fmt(r.get(f'compile_{m}_us'))} | {fmt(r.get(f'sdpa_{m}_us'))} | "
                         f"{fmt(r.get(f'speedup_{m}'), '.2f')} | {fmt(r['floor_us'])} | {fmt(st)} | "
                         f"{fmt(low / r['floor_us'] if low else None, '.2f')} | "
                         f"{fmt(low / st if low and st else None, '.2f')} | {r['predicted_us']:.1f} | "
                         f"{r['rel_err']:.1e} | {r['config']} |")
        lines.append("")
    lines.append(f"μs, medians; floor = inputs read once + outputs written once at the copy bandwidth "
                 f"{bw / 1e12:.2f} TB/s measured on this card; stream = one Triton kernel reading that many bytes, "
                 f"timed the same way (the floor as each timer sees it); ×best torch > 1 means ours is faster; "
                 f"tuned for the {modes[0]} timing; {dev}")
    lines.append("")
    lines.append(f"Spearman(predicted, measured): references {rho_refs:.2f}; all variants {rho_all:.2f}; "
                 f"median within a benchmark's variants {rho_within:.2f}")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(f"# bench_kernels\n\n{datetime.date.today()} — `python examples/bench_kernels.py "
                f"{' '.join(sys.argv[1:])}`\n\n{table}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        m = modes[0]
        ok = [r for r in rows if "error" not in r]
        labels = [f"{r['name']}\nb={r['b']}" for r in ok]
        series = [("lowered", f"lowered_{m}_us"), ("eager", f"eager_{m}_us"), ("torch.compile", f"compile_{m}_us"),
                  ("SDPA", f"sdpa_{m}_us"), ("floor", "floor_us")]
        fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(ok)), 4.5))
        wdt = 0.16
        for i, (lab, key) in enumerate(series):
            xs = [j + (i - 2) * wdt for j in range(len(ok))]
            ax.bar(xs, [r.get(key, 0) or 0 for r in ok], wdt, label=lab)
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(f"μs (median, {m} timing)")
        ax.set_title(f"mugraph lowered reference μGraphs vs PyTorch — {dev}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "bench_kernels.png"), dpi=120)
        plt.close(fig)
    except Exception as e:  # noqa: BLE001
        log(f"chart failed: {e}")
    log(table)


if __name__ == "__main__":
    sys.exit(main())
