"""Hugging Face decoder layers of five families under torch.compile(backend="mugraph"), decode steps
timed against eager, Inductor and the memory floor (docs/models.md, "Measuring").

One decoder layer per family at its public sizes, random weights, nothing downloaded
(configs written here, ``examples/_layers.py``):

    LLaMA-3-8B   LlamaDecoderLayer    hidden 4096, 32 heads, 8 KV heads, intermediate 14336
    Qwen2-7B     Qwen2DecoderLayer    hidden 3584, 28 heads, 4 KV heads, intermediate 18944, biased q/k/v
    Mistral-7B   MistralDecoderLayer  hidden 4096, 32 heads, 8 KV heads, intermediate 14336 (v0.3: no window)
    Phi-3-mini   Phi3DecoderLayer     hidden 3072, 32 heads, 32 KV heads, intermediate 8192, fused qkv, gate_up
    Gemma-2B     GemmaDecoderLayer    hidden 2048, 8 heads, 1 KV head, head_dim 256, intermediate 16384, GeLU-tanh

For each layer, each count of new tokens (``--tokens``) and each count of cached tokens
(``--kv``), one decode step — the new tokens attending over the cache — is timed eagerly,
under ``torch.compile`` (Inductor defaults) and under ``torch.compile(backend="mugraph")``:
on a GPU as medians over CUDA-graph replays, the three timed in turns
(``lower.profile.measure_together``); on the CPU as wall-clock medians (the header says so;
mugraph's kernels then run under Triton's interpreter, and the times say nothing of a GPU).

The step: the rotary cos/sin of positions kv .. kv+T-1, the KV cache and the mask. By default
(``--kv-cache static``) the cache is transformers' layout for ``torch.compile``
(``_layers.StaticKV``): key and value buffers of a fixed capacity (kv + T rounded up to 256
slots), the step writing its T rows in place (``index_copy_``) and attending over every
slot, an additive mask hiding the slots after each token's position — the shapes stay the
same from step to step. ``--kv-cache cat``: a fixed past concatenated with the new keys
(``_layers.PastKV``, ``torch.cat``, nothing written back; the key length kv + T changes
every step), the mask transformers' own ``create_causal_mask`` (SDPA gets none for one new
token, a boolean one for several). Either way every timed step is the same step.

Beside the times: the memory floor — bytes of the weights, of the past keys and values
and of the activations (hidden states in and out, the new keys and values), over the copy
bandwidth measured here (``mugraph.pipeline.bench.copy_bandwidth()`` on a GPU) — mugraph's
time over it, ``× compile`` (torch.compile's time over mugraph's: above 1, mugraph is
faster) and the backend's compile times: cold (the first call, its result cache directory
empty: ``--cache``/<family>/t<T>-kv<K>) and warm (a fresh ``torch.compile`` of a fresh layer
object with the same directory, after forgetting the backend's in-process memo: what a
new process pays, the pieces coming from the result cache). The table ends with the
geomean of ``× compile``.

Bounded: each search gets ``--time-limit`` s (default: the backend's), cut to the graph's share
of ``--graph-budget`` (the backend's ``graph_budget``), no search starts
after ``--row-budget`` s of a row, and a row is stopped after ``--row-timeout`` s. A family
this transformers lacks, or a compile that fails, gives a row with the one-line error.
Writes ``layers.json`` (its header names the commit and the date) and ``table.md`` under
``--out``. Rows run apart — one process per GPU, or rows re-run after a change — become one
table with ``--merge``, each row beside the commit its run recorded, with the geomean over
all of them and the rows below 1.1×.

    python examples/hf_decoder_layers.py --out out/layers --cache out/layers-cache          # GPU
    python examples/hf_decoder_layers.py --small --device cpu --out /tmp/layers --kv 64 --tokens 1 --time-limit 5
    python examples/hf_decoder_layers.py --out out/all --merge out/gpu0/layers.json out/gpu1/layers.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import _layers as L  # noqa: E402
from _layers import RowTimeout, hard_limit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", choices=list(L.FAMILIES), default=L.FIVE)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8], help="new tokens per decode step")
    ap.add_argument("--kv", type=int, nargs="+", default=[2048, 8192], help="cached (past) tokens")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="search seconds per piece (default: the backend's)")
    ap.add_argument("--graph-budget", type=float, default=None,
                    help="search and tuning seconds for a graph's pieces in all (default: the backend's; "
                         "0: none, --time-limit for every piece)")
    ap.add_argument("--cache", default=None, help="the backend's result cache (default: OUT/cache); one "
                    "folder per row under it, so each row's first compile is cold")
    ap.add_argument("--out", required=True, help="folder for layers.json and table.md")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--small", action="store_true", help="tiny configs (a CPU smoke run of about a minute)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="the layers' attention")
    ap.add_argument("--mask", choices=["model", "additive"], default="model",
                    help="model: transformers' create_causal_mask; additive: a hand-built float mask")
    ap.add_argument("--kv-cache", choices=["static", "cat"], default="static",
                    help="static: transformers' layout for torch.compile (fixed-capacity buffers written in place, "
                         "an additive mask); cat: a fixed past concatenated with the new keys (odd lengths)")
    ap.add_argument("--row-budget", type=float, default=1200.0, help="no search starts after this many s of a row")
    ap.add_argument("--row-timeout", type=float, default=None,
                    help="stop a row after this many s (default: row budget + 4 × time limit + 600)")
    ap.add_argument("--workers", type=int, default=None, help="search workers per piece (default: the backend's)")
    ap.add_argument("--max-kernel-ops", type=int, default=None,
                    help="search limit: kernels in a μGraph (default: the search's; --small: 1)")
    ap.add_argument("--max-block-ops", type=int, default=None,
                    help="search limit: ops in a block graph (default: the search's; --small: 4)")
    ap.add_argument("--mugraph-inductor", choices=["auto", "on", "off"], default="auto",
                    help="Inductor for the code around the pieces (auto: on a GPU only; on the CPU its "
                         "C++ compile would be most of the smoke run)")
    ap.add_argument("--profile", action="store_true",
                    help="GPU: also profile each variant kernel by kernel (torch.profiler, no CUDA graph): "
                         "kernels per step, their summed time and the largest, into layers.json and the log")
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="the backend's log lines (searches, verdicts); -vv also each configuration a tuning times")
    ap.add_argument("--merge", nargs="+", default=None, metavar="LAYERS_JSON",
                    help="measure nothing: print one table of the rows of these layers.json files (runs "
                         "split over GPUs or processes), each row with the commit its run recorded, "
                         "and write it to OUT/table.md")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, Path(args.out))
    run = L.start_run(args)
    import torch
    import transformers

    device, dtype, out, cache_root, time_limit = run.device, run.dtype, run.out, run.cache_root, run.time_limit
    row_timeout = args.row_timeout or args.row_budget + 4 * time_limit + 600
    inductor = args.mugraph_inductor == "on" or (args.mugraph_inductor == "auto" and device == "cuda")
    t_start = time.time()

    bw = L.copy_bandwidth(device)
    dev_name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    timing = ("medians over CUDA-graph replays (lower.profile.measure_together)" if device == "cuda" else
              "wall-clock medians on the CPU, no CUDA graphs; mugraph's kernels run under Triton's "
              "interpreter, so its times say nothing of a GPU")
    header = {"device": dev_name, "dtype": str(dtype).replace("torch.", ""), "timing": timing,
              "copy_bandwidth_GBps": bw / 1e9, "attention": args.attn, "kv_cache": ("static (StaticKV: capacity kv + T rounded up to 256, written in place)"
                             if args.kv_cache == "static" else "fixed past (PastKV: cat, no write-back)"),
              "sizes": "tiny (--small)" if args.small else "public", "time_limit_s": time_limit,
              "row_budget_s": args.row_budget, "mugraph_inductor": inductor,
              "transformers": transformers.__version__, "torch": torch.__version__,
              "commit": L.source_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    print(f"# decoder layers on {dev_name}, {header['dtype']}, {header['sizes']} sizes; {timing}; "
          f"copy bandwidth {bw / 1e9:.0f} GB/s; attention {args.attn}; search ≤ {time_limit:g} s a piece")

    rows = []
    for fam in args.families:
        rows += run_family(fam, args, torch, device, dtype, bw, cache_root, time_limit, row_timeout, inductor)
        if device == "cuda":
            torch.cuda.empty_cache()
    header["masks"] = sorted({r["mask"] for r in rows if r.get("mask")})
    speedups = [r["x_compile"] for r in rows if isinstance(r.get("x_compile"), float)]
    geo = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
    table = format_table(rows, header, geo)
    print()
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "layers.json").write_text(json.dumps({"header": header, "rows": rows, "geomean_x_compile": geo},
                                                indent=1, default=str) + "\n")
    print(f"\nwrote {out / 'layers.json'} and {out / 'table.md'} in {time.time() - t_start:.0f} s")
    return 0


def run_family(fam, args, torch, device, dtype, bw, cache_root, time_limit, row_timeout, inductor) -> list[dict]:
    spec = L.FAMILIES[fam]
    max_pos = max(args.kv) + max(args.tokens) + 16
    base = {"family": fam, "layer": spec.name}
    try:
        cfg, layer, rope = L.build_layer(fam, args.small, device, dtype, args.attn, max_pos)
    except Exception as e:  # noqa: BLE001 - this transformers lacks the family, or its config
        err = f"build: {L.one_line(e)}"
        print(f"{spec.name}: {err}")
        return [{**base, "tokens": t, "kv": k, "error": err} for t in args.tokens for k in args.kv]
    rows = []
    for T in args.tokens:
        for kv in args.kv:
            row = {**base, "tokens": T, "kv": kv}
            t0 = time.time()
            try:
                with hard_limit(row_timeout), torch.no_grad():
                    run_row(row, fam, cfg, layer, rope, args, torch, device, dtype, bw, cache_root, time_limit,
                            inductor)
            except Exception as e:  # noqa: BLE001 - a row that fails says why; the table goes on
                row["error"] = L.one_line(e)
            finally:
                torch._dynamo.reset()
            print(f"{spec.name} T={T} kv={kv}: " + summary(row) + f" ({time.time() - t0:.0f} s)", flush=True)
            rows.append(row)
    del layer
    return rows


def run_row(row, fam, cfg, layer, rope, args, torch, device, dtype, bw, cache_root, time_limit, inductor):
    from mugraph.frontend import recent_graphs

    T, kv = row["tokens"], row["kv"]
    if args.kv_cache == "static":
        ins, row["mask"] = L.static_inputs(cfg, rope, T, kv, device, dtype)
        step = L.make_static_step(layer)
    else:
        ins, row["mask"] = L.decode_inputs(cfg, rope, T, kv, device, dtype, args.mask)
        step = L.make_step(layer)
    want = step(*ins)
    if not step.last_cache or not step.last_cache.calls:
        raise RuntimeError(f"the layer did not read the KV cache (passed as {L.cache_keyword(layer)}=)")
    fb = L.floor_bytes(cfg, layer, T, kv, dtype)
    row["floor_bytes"] = fb["total"]
    row["floor_us"] = fb["total"] / bw * 1e6

    torch._dynamo.reset()
    t0 = time.perf_counter()
    default = torch.compile(step)
    default(*ins)
    row["inductor_compile_s"] = time.perf_counter() - t0

    # cold: an empty result-cache folder of the row's own, and nothing memoized in the process
    rowdir = cache_root / fam / f"t{T}-kv{kv}"
    row["cold_cache_empty"] = not (rowdir.exists() and any(rowdir.iterdir()))
    rowdir.mkdir(parents=True, exist_ok=True)
    opts = {"cache_dir": str(rowdir), "time_limit": time_limit, "deadline": time.time() + args.row_budget,
            "inductor": inductor}
    if args.graph_budget is not None:
        opts["graph_budget"] = args.graph_budget or None
    search = {"workers": args.workers, "max_kernel_ops": args.max_kernel_ops, "max_block_ops": args.max_block_ops}
    if args.small:  # a smoke run: searches small enough to end well within the time limit
        search["max_kernel_ops"] = search["max_kernel_ops"] or 1
        search["max_block_ops"] = search["max_block_ops"] or 4
    if any(v is not None for v in search.values()):
        opts["search"] = {k: v for k, v in search.items() if v is not None}
    graph_profiles = []
    if args.profile and device == "cuda":
        opts["timer"] = _profiling_timer(graph_profiles)
    ours = None
    L.forget_backend_memo()
    torch._dynamo.reset()
    try:
        t0 = time.perf_counter()
        ours = torch.compile(step, backend="mugraph", options=opts)
        got = ours(*ins)
        row["cold_s"] = time.perf_counter() - t0
        row["max_abs_err"] = float((got.float() - want.float()).abs().max())
        row["rel_err"] = float((got.float() - want.float()).norm() / want.float().norm())
        comp = [c for c in recent_graphs() if c.captured]
        pieces = [bp for cap in comp[-1].captured.values() for bp in cap.pieces] if comp else []
        row["pieces"] = len(pieces)
        row["cold_phases"] = L.compile_phases(comp[-1:])
        row["pieces_mugraph"] = sum(bp.info.get("runs") == "mugraph" for bp in pieces)
        # each piece's outcome (what it runs and why, its search's share, first match and
        # proofs): what a row's ratio is made of, without rerunning it
        row["piece_info"] = [{"piece": bp.describe(), **{k: v for k, v in bp.info.items()
                                                         if isinstance(v, (bool, int, float, str, type(None)))}}
                             for bp in pieces]
        # the whole-graph rule's verdict: with the pieces, as traced without them, or torch's
        wholes = [cap.whole for cap in comp[-1].captured.values() if cap.whole] if comp else []
        if wholes:
            row["graph_runs"], row["graph_why"] = wholes[-1]["runs"], wholes[-1].get("why")
    except RowTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - eager and Inductor are still timed
        row["mugraph_error"] = L.one_line(e)
        ours = None

    launches = {"eager": lambda: step(*ins), "compile": lambda: default(*ins)}
    if ours is not None:
        launches["mugraph"] = lambda: ours(*ins)
    times = L.time_steps(launches, device)
    for name, v in times.items():
        if isinstance(v, float):
            row[f"{name}_us"] = v * 1e6
        else:
            row[f"{name}_error"] = v
    if args.profile and device == "cuda":
        row["profile"] = L.kernel_profile(launches)
        for name, p in row["profile"].items():
            _print_profile(f"profile {name} T={T} kv={kv}", p,
                           f" (CUDA-graph replay {row.get(name + '_us', float('nan')):.1f} μs)")
    for i, prof in enumerate(graph_profiles):  # the whole-graph rule's two forms, kernel by kernel
        row.setdefault("graph_profiles", []).append(prof)
        for name, p in prof.items():
            _print_profile(f"graph rule {i} {name} " + ("(with its μGraph pieces)" if name == "mugraph"
                                                       else "(without them)"), p)
    if isinstance(row.get("mugraph_us"), float):
        if isinstance(row.get("compile_us"), float):
            row["x_compile"] = row["compile_us"] / row["mugraph_us"]
        row["x_floor"] = row["mugraph_us"] / row["floor_us"]

    # warm: a fresh layer object, a fresh torch.compile, the same result-cache folder
    if ours is not None:
        del ours
        torch._dynamo.reset()
        L.forget_backend_memo()
        _, layer2, _ = L.build_layer(fam, args.small, device, dtype, args.attn, max(args.kv) + max(args.tokens) + 16)
        step2 = L.make_static_step(layer2) if args.kv_cache == "static" else L.make_step(layer2)
        try:
            t0 = time.perf_counter()
            again = torch.compile(step2, backend="mugraph", options={**opts, "deadline": time.time() + args.row_budget})
            got2 = again(*ins)
            row["warm_s"] = time.perf_counter() - t0
            row["warm_matches_cold"] = bool(torch.allclose(got2.float(), got.float(), rtol=1e-3, atol=1e-3))
        except RowTimeout:
            raise
        except Exception as e:  # noqa: BLE001
            row["warm_error"] = L.one_line(e)
        del layer2


def _print_profile(label: str, p: dict, tail: str = "") -> None:
    """One :func:`_layers.kernel_profile` entry on the log: kernels per step, their time, the largest."""
    if "error" in p:
        print(f"  {label}: {p['error']}", flush=True)
        return
    print(f"  {label}: {p['kernels']:.0f} kernels, {p['kernel_us']:.1f} μs of kernels{tail}", flush=True)
    for k, us, n in p["top"]:
        print(f"    {us:7.1f} μs  ×{n:.0f}  {k}", flush=True)


def _profiling_timer(out: list):
    """The backend's GPU timer, and for the whole-graph never-slower rule (its ``piece`` a
    captured graph, not one piece) a kernel-by-kernel profile of both forms appended to
    ``out``: where a graph whose pieces each win loses as a whole (``--profile``)."""
    from mugraph.frontend.pieces import BuiltPiece
    from mugraph.frontend.run import gpu_timer

    def timer(piece, launches):
        times = gpu_timer(piece, launches)
        if not isinstance(piece, BuiltPiece):
            out.append(L.kernel_profile(launches, top=16))
        return times
    # it measures what the backend's timer does, so its verdicts are kept as that one's are and
    # a warm compile reads them, as it does without --profile (else it times every piece again)
    timer.cache_key = gpu_timer.cache_key
    return timer


def summary(row: dict) -> str:
    if "error" in row:
        return f"error: {row['error']}"
    parts = [f"{k.replace('_us', '')} {row[k]:.1f} μs" for k in ("eager_us", "compile_us", "mugraph_us")
             if isinstance(row.get(k), float)]
    if "x_compile" in row:
        parts.append(f"× compile {row['x_compile']:.2f}")
    if "cold_s" in row:
        parts.append(f"cold {row['cold_s']:.1f} s, warm {row.get('warm_s', float('nan')):.1f} s")
    for k in ("mugraph_error", "warm_error", "eager_error", "compile_error"):
        if k in row:
            parts.append(f"{k}: {row[k]}")
    return "; ".join(parts)


def format_table(rows, header, geo) -> str:
    lines = [f"Decoder layers ({header['sizes']} sizes), one decode step on {header['device']}, "
             f"{header['dtype']}, attention {header['attention']}; {header['timing']}. KV cache: "
             f"{header['kv_cache']}; masks: {', '.join(header.get('masks', [])) or '—'}. Memory floor at "
             f"{header['copy_bandwidth_GBps']:.0f} GB/s (copy bandwidth measured here). "
             f"Search ≤ {header['time_limit_s']:g} s a piece; compile times: cold = first call with an empty "
             "result cache, warm = a fresh compile of a fresh layer with the same cache.", "",
             *L.table_head(["layer", "new tokens", "cached tokens", "eager μs", "torch.compile μs", "mugraph μs",
                            "× compile", "floor μs", "mugraph / floor", "cold compile s", "warm compile s",
                            "pieces (mugraph / all)", "max abs err vs eager", "note"])]
    for r in rows:
        pieces = f"{r['pieces_mugraph']} / {r['pieces']}" if "pieces" in r else "—"
        lines.append(
            f"| {r['layer']} | {r['tokens']} | {r['kv']} | {L.fmt(r.get('eager_us'), '.1f')} "
            f"| {L.fmt(r.get('compile_us'), '.1f')} | {L.fmt(r.get('mugraph_us'), '.1f')} "
            f"| {L.fmt(r.get('x_compile'), '.2f')}{'×' if 'x_compile' in r else ''} | {L.fmt(r.get('floor_us'), '.1f')} "
            f"| {L.fmt(r.get('x_floor'), '.2f')}{'×' if 'x_floor' in r else ''} | {L.fmt(r.get('cold_s'), '.1f')} "
            f"| {L.fmt(r.get('warm_s'), '.1f')} | {pieces} | {L.fmt(r.get('max_abs_err'), '.1e')} "
            f"| {L.row_notes(r)} |")
    lines += ["", f"Geomean of × compile (torch.compile μs / mugraph μs) over {sum('x_compile' in r for r in rows)} "
              f"rows: {L.fmt(geo, '.3f')}{'×' if geo else ''}"]
    return "\n".join(lines)


def merge(files: list[str], out: Path) -> int:
    """One table of the rows of several ``layers.json`` files, ordered by family, cached
    tokens and new tokens: each row with its run's commit (``tree``), the geomean of × compile
    over all of them, and the rows below 1.1× (the decode-step target's bar)."""
    rows = []
    for f in files:
        try:
            d = json.loads(Path(f).read_text())
            head, found = d["header"], d["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"--merge: {f} is not a layers.json of this script ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        rows += [dict(r, tree=head.get("commit") or "—", device=head.get("device", "—")) for r in found]
    order = {name: i for i, name in enumerate(L.FAMILIES)}
    rows.sort(key=lambda r: (order.get(r.get("family"), len(order)), r.get("kv", 0), r.get("tokens", 0)))
    lines = L.table_head(["layer", "tokens", "cached", "tree", "device", "eager μs", "torch.compile μs",
                          "mugraph μs", "× compile", "floor μs", "mugraph / floor", "cold s", "warm s"])
    for r in rows:
        lines.append(f"| {r.get('layer', '—')} | {r.get('tokens', '—')} | {r.get('kv', '—')} | {r['tree']} "
                     f"| {r['device']} | {L.fmt(r.get('eager_us'), '.1f')} | {L.fmt(r.get('compile_us'), '.1f')} "
                     f"| {L.fmt(r.get('mugraph_us'), '.1f')} | {L.fmt(r.get('x_compile'), '.2f')} "
                     f"| {L.fmt(r.get('floor_us'), '.1f')} | {L.fmt(r.get('x_floor'), '.2f')} "
                     f"| {L.fmt(r.get('cold_s'), '.1f')} | {L.fmt(r.get('warm_s'), '.1f')} |")
    xs = [r["x_compile"] for r in rows if isinstance(r.get("x_compile"), float)]
    geo = math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
    low = [f"{r['layer']} {r['tokens']}×{r['kv']} ({r['x_compile']:.2f}×)" for r in rows
           if isinstance(r.get("x_compile"), float) and r["x_compile"] < 1.1]
    lines += ["", f"Geomean of × compile over {len(xs)} rows: {L.fmt(geo, '.3f')}{'×' if geo else ''}; "
              f"rows below 1.1×: {', '.join(low) or 'none'}"]
    table = "\n".join(lines)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
