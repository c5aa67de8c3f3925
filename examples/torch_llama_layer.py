"""A Hugging Face LlamaDecoderLayer under torch.compile(backend="mugraph") (README
"Using mugraph from PyTorch"; docs/design.md §10).

Builds one decoder layer at LLaMA-3-8B sizes (hidden 4096, 32 heads, 8 KV heads,
intermediate 14336; random weights, nothing downloaded) and times a decode step
of 1 and of 8 new tokens attending over a KV cache of ``--kv`` past tokens
(default 2048): eager, ``torch.compile`` (Inductor defaults) and
``torch.compile(backend="mugraph")``, each under CUDA graphs
(``triton.testing.do_bench_cudagraph``). Then a breakdown: every Lax piece
mugraph cut out of the layer, what its search found, and the piece's time as
lowered by mugraph next to the same ops as torch calls (what it replaced).

The KV cache is a fixed past of ``--kv`` tokens: each timed step appends the new
tokens' keys and values to it (``torch.cat``) and attends over past + new with a
causal mask, as a decode step does, but does not write them back — the timed
work is the layer's, without a cache write of 1 or 8 rows.

Bounded: searches get ``--time-limit`` seconds per piece and none starts after
``--budget`` seconds; results are cached in ``--cache`` (a second run reuses them
and finishes in about a minute). Writes ``layer.csv``, ``pieces.csv`` and
``table.md`` under ``--out``.

    python examples/torch_llama_layer.py --out out/llama --cache out/llama-cache
    python examples/torch_llama_layer.py --small --device cpu --out /tmp/llama   # CPU smoke run
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _layers import PastKV, cache_keyword, cuda_available, decode_inputs  # noqa: E402 - a read-only KV cache; the layer's name for it; a step's inputs


def build(args, torch, device, dtype):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    if args.small:
        dims = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    else:
        dims = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336)
    cfg = transformers.LlamaConfig(**dims, num_hidden_layers=1, vocab_size=128, rms_norm_eps=1e-5,
                                   max_position_embeddings=args.kv + 64, rope_theta=500000.0)
    cfg._attn_implementation = args.attn
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, layer_idx=0).to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.02)
    rope = LlamaRotaryEmbedding(cfg).to(device)
    return cfg, layer, rope


def inputs_for(cfg, rope, tokens, kv, torch, device, dtype):
    """One decode step's arguments in ``step``'s order — new hidden states, rotary cos/sin,
    the additive causal mask, past keys and values — as ``_layers.decode_inputs`` draws them."""
    (x, cos, sin, past_k, past_v, mask), _ = decode_inputs(cfg, rope, tokens, kv, device, dtype, mask="additive")
    return x, cos, sin, mask, past_k, past_v


def bench(fn, device, torch):
    if device == "cuda":
        from triton.testing import do_bench_cudagraph

        return do_bench_cudagraph(fn, rep=50) * 1e-3
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < 0.5:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for layer.csv, pieces.csv, table.md")
    ap.add_argument("--cache", default=None, help="mugraph result cache (reuse it: a second run is fast)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8], help="new tokens per decode step")
    ap.add_argument("--kv", type=int, default=2048, help="past tokens in the KV cache")
    ap.add_argument("--time-limit", type=float, default=20.0, help="search seconds per piece")
    ap.add_argument("--budget", type=float, default=300.0, help="no search starts after this many seconds")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                    help="search worker processes per piece (default: one per core)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                    help="attention of the layer (sdpa: one library op; eager: matmul/softmax/matmul)")
    ap.add_argument("--kernel-op", choices=["auto", "triton_op", "custom_op"], default="auto")
    ap.add_argument("--unfused", choices=["torch", "lower"], default="torch",
                    help="a piece whose search found only the program: left to torch, or lowered op by op")
    ap.add_argument("--small", action="store_true", help="a tiny config (CPU smoke run)")
    ap.add_argument("--max-piece-ops", type=int, default=None, help="cut pieces to this many catalog ops "
                    "(default: the front end's)")
    ap.add_argument("--max-piece-matmuls", type=int, default=None, help="cut pieces to this many matmuls "
                    "(default: the front end's)")
    ap.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                    help="the layer's dtype (auto: bfloat16 on a GPU, float32 on the CPU)")
    ap.add_argument("--capture-only", action="store_true",
                    help="print the pieces the layer is cut into (no search, no timing; any device)")
    args = ap.parse_args()
    if args.device == "cpu" or (args.device == "auto" and not cuda_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    import mugraph.frontend  # noqa: F401 - registers the backend
    from mugraph.frontend.backend import recent_graphs
    from mugraph.frontend.run import _DONE

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("mugraph").setLevel(logging.INFO)
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    dtype = (torch.bfloat16 if device == "cuda" else torch.float32) if args.dtype == "auto" \
        else getattr(torch, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    cfg, layer, rope = build(args, torch, device, dtype)

    key = cache_keyword(layer)  # cache= (transformers 5.2x), past_key_values= or past_key_value=

    def step(x, cos, sin, mask, pk, pv):
        cache = PastKV(pk, pv)
        r = layer(x, attention_mask=mask, position_embeddings=(cos, sin), use_cache=True, **{key: cache})
        return r[0] if isinstance(r, tuple) else r

    opts = {"time_limit": args.time_limit, "cache_dir": args.cache, "deadline": t_start + args.budget,
            "kernel_op": args.kernel_op, "unfused": args.unfused, "search": {"workers": args.workers}}
    for name in ("max_piece_ops", "max_piece_matmuls"):
        if getattr(args, name) is not None:
            opts[name] = getattr(args, name)
    if args.capture_only:
        return _capture_only(args, cfg, rope, step, opts, torch, device, dtype, out)
    rows, piece_rows = [], []
    with torch.no_grad():
        for T in args.tokens:
            ins = inputs_for(cfg, rope, T, args.kv, torch, device, dtype)
            want = step(*ins)
            torch._dynamo.reset()
            default = torch.compile(step)
            default(*ins)
            torch._dynamo.reset()
            t0 = time.time()
            ours = torch.compile(step, backend="mugraph", options=opts)
            got = ours(*ins)
            compile_s = time.time() - t0
            err = float((got.float() - want.float()).abs().max())
            times = {name: bench(lambda f=f: f(*ins), device, torch)
                     for name, f in (("eager", step), ("torch.compile", default), ("mugraph", ours))}
            rows.append({"tokens": T, "kv": args.kv, "eager_us": times["eager"] * 1e6,
                         "compile_us": times["torch.compile"] * 1e6, "mugraph_us": times["mugraph"] * 1e6,
                         "speedup_vs_compile": times["torch.compile"] / times["mugraph"],
                         "max_abs_err_vs_eager": err, "mugraph_compile_s": compile_s})
            print(f"T={T}: eager {times['eager']*1e6:.1f} us, torch.compile {times['torch.compile']*1e6:.1f} us, "
                  f"mugraph {times['mugraph']*1e6:.1f} us (max |err| vs eager {err:.2e}; compile {compile_s:.0f} s)")
            comp = [c for c in recent_graphs() if c.captured][-1]
            for cap in comp.captured.values():
                for bp in cap.pieces:
                    piece_rows.append(_piece_row(T, bp, _DONE, device, torch))
                    print("  " + ", ".join(f"{k}={v}" for k, v in piece_rows[-1].items()))
            torch._dynamo.reset()
    _write(out, rows, piece_rows, args, device)
    print(f"wrote {out / 'layer.csv'}, {out / 'pieces.csv'}, {out / 'table.md'} in {time.time() - t_start:.0f} s")
    return 0


def _capture_only(args, cfg, rope, step, opts, torch, device, dtype, out) -> int:
    """The pieces and library ops of one decode step per token count (traced with fake
    tensors: nothing runs), printed and written to ``capture.txt``."""
    from mugraph.frontend import from_torch

    keys = ("min_ops", "max_piece_ops", "max_piece_matmuls")
    lines = []
    with torch.no_grad():
        for T in args.tokens:
            ins = inputs_for(cfg, rope, T, args.kv, torch, device, dtype)
            cap = from_torch(step, *ins, **{k: opts[k] for k in keys if k in opts})
            lines.append(f"T={T}: {cap.summary()}")
            for bp in cap.pieces:
                kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
                casts = sum(n.target == torch.ops.aten._to_copy.default for n in bp.piece.nodes)
                lines.append(f"    {bp.name}: {len(kinds)} ops, {kinds.count('matmul')} matmuls, "
                             f"{casts} casts inside, runs at {bp.program.inputs[0].dtype}")
    text = "\n".join(lines)
    print(text)
    (out / "capture.txt").write_text(text + "\n")
    return 0


def _strided_randn(shape, strides, dtype, device, torch):
    """Normal values (std 0.1) in a tensor of ``shape`` with ``strides`` (None: row-major)."""
    if strides is None:
        return torch.randn(shape, device=device, dtype=dtype) * 0.1
    size = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    return (torch.randn(size, device=device, dtype=dtype) * 0.1).as_strided(tuple(shape), tuple(strides))


def _piece_row(T, bp, done, device, torch):
    import lower

    kinds = [op.kind for op in bp.program.ops if op.kind != "input"]
    row = {"tokens": T, "piece": bp.name, "ops": len(kinds), "matmuls": kinds.count("matmul"),
           "casts": sum(n.target == torch.ops.aten._to_copy.default for n in bp.piece.nodes),
           "dtype": bp.program.inputs[0].dtype,
           "inputs": " ".join("x".join(map(str, t.shape)) for t in bp.program.inputs),
           "found_by": "", "kernels": "", "runs": "", "search_s": "", "mugraph_us": "", "torch_us": "", "gain": ""}
    hit = [v for k, v in done.items() if k[0] == bp.name and v is not None]
    if bp.info.get("runs") == "torch":
        row.update(found_by="program only", kernels=bp.info.get("kernels", ""), runs="torch",
                   search_s=round(bp.info["search_s"], 1))
        return row
    if not bp.info or not hit:
        row.update(found_by="no search (failed or past the budget)", runs="torch")
        return row
    op, opt = hit[-1]
    row.update(found_by=(opt.best.found_by or opt.best.origin), kernels=opt.best.num_kernels, runs="lowered",
               search_s=round(bp.info["search_s"], 1))
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    # laid out as the layer passes them (a linear's weight arrives transposed: strides (1, in)),
    # which the piece's kernels were compiled and tuned for
    xs = [_strided_randn(t.shape, st, dt[t.dtype], device, torch)
          for t, st in zip(bp.program.inputs, bp.input_strides or [None] * len(bp.program.inputs))]
    replaced = lower.compile(bp.program, device=device, cuda_graphs=False)  # one torch call per op
    from mugraph.frontend.kernels import call as call_op  # passes the split-K counters an operator takes
    ours = bench(lambda: call_op(op, xs), device, torch)
    theirs = bench(lambda: replaced(*xs), device, torch)
    row.update(mugraph_us=round(ours * 1e6, 2), torch_us=round(theirs * 1e6, 2), gain=round(theirs / ours, 2))
    return row


def _write(out, rows, piece_rows, args, device):
    for name, data in (("layer.csv", rows), ("pieces.csv", piece_rows)):
        with open(out / name, "w", newline="") as f:
            if data:
                w = csv.DictWriter(f, fieldnames=list(data[0]))
                w.writeheader()
                w.writerows(data)
    lines = [f"LlamaDecoderLayer ({'tiny' if args.small else 'LLaMA-3-8B sizes'}), decode over a KV cache of "
             f"{args.kv} tokens, {device}, attention {args.attn}; times per step"
             + (" under CUDA graphs" if device == "cuda" else ""), "",
             "| new tokens | eager μs | torch.compile μs | mugraph μs | mugraph vs compile | max abs err vs eager |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['eager_us']:.1f} | {r['compile_us']:.1f} | {r['mugraph_us']:.1f} | "
                     f"{r['speedup_vs_compile']:.2f}× | {r['max_abs_err_vs_eager']:.1e} |")
    cols = ("tokens", "piece", "ops", "matmuls", "casts", "dtype", "inputs", "found_by", "kernels", "runs",
            "search_s", "mugraph_us", "torch_us", "gain")
    lines += ["", "| new tokens | piece | catalog ops | matmuls | casts inside | runs at | inputs | search returned "
              "| kernels | runs | search s | mugraph μs | torch μs (piece's ops, one call each) | gain |",
              "|" + "---|" * len(cols)]
    for r in piece_rows:
        lines.append("| " + " | ".join(str(r[k]) for k in cols) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
