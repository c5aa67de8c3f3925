"""Time the lowered reference μGraphs against PyTorch on a CUDA GPU.

For each benchmark of DESIGN §7 at full shapes (b = 1 and 8): the hand-written
reference μGraph, lowered and autotuned by ``lower.tune``, next to PyTorch eager,
``torch.compile`` and (attention) SDPA — every variant timed the same way, as the
median over CUDA-graph replays, both cold (L2 evicted before every call: the
headline, ``--timing cold``) and warm (back-to-back calls) — and the
memory-traffic floor (inputs read once + outputs written once, over the
bandwidth of a device-to-device copy measured on the same card), and the same
floor as the timer sees it ("stream": one Triton kernel reading that many bytes,
timed cold like everything else). Also the cost
model's prediction beside each measured time and the Spearman rank correlation
between predicted and measured times (over the references and all tuned
variants).

    python examples/bench_kernels.py --out out/bench          # table, CSV, PNG

Without CUDA it prints a message and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

NAMES = ["rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "ntrans"]


from mugraph.benchmarks.torch_versions import SDPA, TORCH  # noqa: E402  the baselines, in one place
from mugraph.pipeline.bench import graphed  # noqa: E402


def torch_fn(name: str):
    return TORCH[name]


def sdpa_fn(name: str):
    return SDPA.get(name)


def stream_probe(nbytes: int, bench, graphed) -> float:
    """Seconds, cold, of one Triton kernel that reads ``nbytes`` (fp16) once with wide,
    pipelined loads and writes one float per program — the memory floor *as this timer
    sees it*: the same bytes as ``floor``, plus a CUDA-graph launch and the kernel's
    ramp-up and tail. Best of a few grid shapes."""
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
        f = graphed(lambda xx, oo: _stream[(grid,)](xx, oo, n, BLOCK=block, ITERS=iters, STAGES=3, num_warps=warps),
                    [x, out])
        best = min(best, bench(f, flush=True))
    return best


def spearman(xs, ys) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 3:
        return float("nan")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_kernels")
    ap.add_argument("--b", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--names", nargs="+", default=NAMES)
    ap.add_argument("--top", type=int, default=6, help="grid/loop configs timed per kernel")
    ap.add_argument("--timing", choices=["cold", "warm"], default="cold",
                    help="headline timing: cold = L2 evicted (clean) before every call (default); "
                         "warm = back-to-back calls, inputs may stay in L2. The other is reported too.")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device — nothing to time (the CPU tests check correctness). Skipping.")
        return 0

    import triton.testing

    import lower
    import mugraph as mg
    from lower import cost_model
    from lower.profile import bench
    from mugraph.benchmarks import reference

    os.makedirs(args.out, exist_ok=True)
    flush = args.timing == "cold"
    other = "warm" if flush else "cold"
    TOL = 2e-2  # fp16 inputs, as the CPU tests
    log_f = open(os.path.join(args.out, "log.txt"), "w")

    def log(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log_f.write(s + "\n")
        log_f.flush()

    dev = torch.cuda.get_device_name()
    log(f"# bench_kernels {datetime.datetime.now().isoformat(timespec='seconds')} on {dev}, "
        f"torch {torch.__version__}, triton {triton.__version__}")
    # bandwidth of a device-to-device copy (bytes read + written)
    big = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    t_copy = triton.testing.do_bench(lambda: dst.copy_(big), warmup=50, rep=200, return_mode="median") * 1e-3
    bw = 2 * big.numel() / t_copy
    del big, dst
    log(f"# copy bandwidth {bw / 1e12:.2f} TB/s")
    # probes under both timing methods: one tiny kernel (launch latency), and a read of 50 MB
    tiny = torch.zeros(1, device="cuda")
    rd = torch.ones(25 * 2**20, dtype=torch.float16, device="cuda")
    for lab, f in [("one tiny kernel", lambda: tiny.add_(1)), ("torch.sum of 50 MB fp16", lambda: rd.sum())]:
        rep = graphed(f, [])
        log(f"# probe {lab}: cold {bench(rep, flush=True) * 1e6:.2f} us, warm {bench(rep, flush=False) * 1e6:.2f} us")

    rows, corr_pts = [], []
    for b in args.b:
        for name in args.names:
            t0 = time.time()
            row = {"name": name, "b": b}
            try:
                g = reference(name, b=b)
                gen = torch.Generator(device="cuda").manual_seed(0)
                ins = {t.name: ((torch.rand(t.shape, generator=gen, device="cuda") * 2 - 1) * 0.5).half()
                       for t in g.inputs}
                targs = [ins[t.name] for t in g.inputs]
                # correctness: every timed variant is checked against the float64 interpreter
                ref64 = mg.evaluate(g, {k: v.double().cpu() for k, v in ins.items()})
                ref = ref64[0].float().to("cuda")
                res = lower.tune(g, ins, top=args.top, log=log, ref=ref64, tol=TOL, flush=flush)
                prog = res.program
                out = prog(**ins)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                row.update(lowered_us=res.time_s * 1e6, predicted_us=res.predicted_s * 1e6, rel_err=err,
                           config=" ".join(f"k{k}:{c.label()}" for k, c in res.configs.items()),
                           launches=prog.num_launches)
                row["lowered_other_us"] = bench(prog.runner(**ins), flush=not flush) * 1e6
                corr_pts += [(name, b, lab, m, p) for lab, m, p in res.trials if m is not None]
                corr_pts.append((name, b, "final", res.time_s, res.predicted_s))
                # baselines
                fn = torch_fn(name)

                def both(key, f):
                    rep = graphed(f, targs)
                    row[key] = bench(rep, flush=flush) * 1e6
                    row[key.replace("_us", "_other_us")] = bench(rep, flush=not flush) * 1e6

                both("eager_us", fn)
                if not args.no_compile:
                    try:
                        both("compile_us", torch.compile(fn, dynamic=False))
                    except Exception as e:  # noqa: BLE001
                        log(f"  torch.compile failed: {type(e).__name__}: {str(e)[:200]}")
                sd = sdpa_fn(name)
                if sd is not None:
                    both("sdpa_us", sd)
                row["floor_us"] = cost_model.memory_floor_bytes(g) / bw * 1e6
                if flush:
                    try:
                        row["stream_us"] = stream_probe(cost_model.memory_floor_bytes(g), bench, graphed) * 1e6
                    except Exception as e:  # noqa: BLE001
                        log(f"  stream probe failed: {type(e).__name__}: {str(e)[:200]}")
                # a measured floor: one read of every input (torch.sum), timed the same way
                rd_rep = graphed(lambda *xs: [x.sum(dtype=torch.float32) for x in xs], targs)
                row["read_floor_us"] = bench(rd_rep, flush=flush) * 1e6
                row["read_floor_other_us"] = bench(rd_rep, flush=not flush) * 1e6
                best = min(v for k, v in row.items() if k in ("eager_us", "compile_us", "sdpa_us"))
                row["best_torch_us"] = best
                row["speedup"] = best / row["lowered_us"]
                row["vs_floor"] = row["lowered_us"] / row["floor_us"]
                oth = [v for k, v in row.items() if k in ("eager_other_us", "compile_other_us", "sdpa_other_us")]
                row["best_torch_other_us"] = min(oth)
                row["speedup_other"] = min(oth) / row["lowered_other_us"]
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                log(traceback.format_exc())
            row["bench_s"] = round(time.time() - t0, 1)
            rows.append(row)
            write_results(args, rows, corr_pts, bw, dev, flush, other, lambda *a: None)
            log(f"{name} b={b}: " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in row.items() if k not in ("name", "b")))

    write_results(args, rows, corr_pts, bw, dev, flush, other, log)
    return 0


def write_results(args, rows, corr_pts, bw, dev, flush, other, log) -> None:
    cols = ["name", "b", "lowered_us", "eager_us", "compile_us", "sdpa_us", "best_torch_us", "floor_us", "stream_us",
            "speedup", "vs_floor", "predicted_us", "rel_err", "launches", "config", "lowered_other_us",
            "eager_other_us", "compile_other_us", "sdpa_other_us", "best_torch_other_us", "speedup_other",
            "read_floor_us", "read_floor_other_us", "bench_s", "error"]
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

    def fmt(v):
        return f"{v:8.1f}" if isinstance(v, float) else f"{'—':>8}"

    lines = [f"| benchmark | b | lowered | eager | compile | SDPA | floor | stream | read floor | ×best torch | "
             f"×floor | ×stream | predicted | rel.err | config |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['b']} | error: {r['error'][:80]} |")
            continue
        vs_stream = f"{r['lowered_us'] / r['stream_us']:.2f}" if r.get("stream_us") else "—"
        lines.append(f"| {r['name']} | {r['b']} | {r['lowered_us']:.1f} | {fmt(r.get('eager_us')).strip()} | "
                     f"{fmt(r.get('compile_us')).strip()} | {fmt(r.get('sdpa_us')).strip()} | {r['floor_us']:.1f} | "
                     f"{fmt(r.get('stream_us')).strip()} | "
                     f"{r['read_floor_us']:.1f} | {r['speedup']:.2f} | {r['vs_floor']:.2f} | {vs_stream} | "
                     f"{r['predicted_us']:.1f} | {r['rel_err']:.1e} | {r['config']} |")
    lines.append("")
    mode = ("cold: L2 evicted (256 MB read, L2 left clean) before every call" if flush
            else "warm: back-to-back calls on the same buffers")
    lines.append(f"times in μs, median of CUDA-graph replays, {mode}; floor = inputs read once + outputs "
                 f"written once at the copy bandwidth {bw / 1e12:.2f} TB/s measured on this card; stream = one "
                 f"Triton kernel reading that many bytes, timed the same way (the floor plus launch, ramp-up "
                 f"and tail, as this timer sees them); {dev}")
    lines.append("")
    lines.append(f"The same programs timed {other} ({'back-to-back calls on the same buffers' if flush else 'L2 evicted before every call'}):")
    lines.append("")
    lines.append("| benchmark | b | lowered | eager | compile | SDPA | read floor | ×best torch |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            continue
        lines.append(f"| {r['name']} | {r['b']} | {r['lowered_other_us']:.1f} | {fmt(r.get('eager_other_us')).strip()} | "
                     f"{fmt(r.get('compile_other_us')).strip()} | {fmt(r.get('sdpa_other_us')).strip()} | "
                     f"{r['read_floor_other_us']:.1f} | {r['speedup_other']:.2f} |")
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

        ok = [r for r in rows if "error" not in r]
        labels = [f"{r['name']}\nb={r['b']}" for r in ok]
        series = [("lowered", "lowered_us"), ("eager", "eager_us"), ("torch.compile", "compile_us"),
                  ("SDPA", "sdpa_us"), ("floor", "floor_us")]
        fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(ok)), 4.5))
        wdt = 0.16
        for i, (lab, key) in enumerate(series):
            xs = [j + (i - 2) * wdt for j in range(len(ok))]
            ax.bar(xs, [r.get(key, 0) or 0 for r in ok], wdt, label=lab)
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("μs (median, CUDA graph)")
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
