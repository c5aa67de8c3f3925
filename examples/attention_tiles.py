"""The lowering of one online-softmax attention kernel, timed over its tile shapes and
configurations, with the shift folded and not (``KernelConfig.fold_shifts``), against
SDPA's flash kernel — what the lowering can reach for a prompt, whatever μGraph the
search finds.

    python examples/attention_tiles.py                      # a GPU machine
    python examples/attention_tiles.py --shapes 16x1024x64 --tiles 64x64 128x128 --json out.json

The μGraph is the one-kernel online form the search finds for
``mugraph.core.benchmarks.prefill_attention`` (design §3.4): a block per (rows, head), the
keys walked by the loop, ``S = Q@Kᵀ·scale``, ``m = max(S)``, ``e = exp(S − m)``, ``e@V``
and ``Σe`` accumulated rescaled by ``m``. Each (tile, configuration) is checked against
SDPA in fp32 before it is timed (CUDA-graph median, ``lower.profile.measure``); the best
of each side is then timed again side by side with SDPA (``measure_together``). Prints
one Markdown table per shape.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import torch.nn.functional as F

import lower
import mugraph as mg
from lower.config import KernelConfig
from lower.profile import measure, measure_together


def online_attention(heads: int, q: int, kv: int, d: int, rows: int, keys: int) -> mg.KernelGraph:
    """The online μGraph: a block per ``rows`` query rows of a head, ``keys`` keys a step."""
    g = mg.KernelGraph(f"attention_h{heads}_q{q}_n{kv}_d{d}")
    Q = g.input("Q", (heads, q, d), "float16")
    K = g.input("K", (heads, d, kv), "float16")
    V = g.input("V", (heads, kv, d), "float16")
    b = mg.BlockGraph(grid=(q // rows, heads, 1), forloop=kv // keys)
    qt, kt, vt = b.input(Q, (1, 0, None), None), b.input(K, (None, 0, None), 2), b.input(V, (None, 0, None), 1)
    s = mg.scale(qt @ kt, 1 / math.sqrt(d))
    m = mg.max(s, 2)
    e = mg.exp(s - m)
    b.output(b.accum(e @ vt, m) / b.accum(mg.sum(e, 2), m), (1, 0, None))
    (o,) = g.kernel(b)
    g.output(o)
    return g


def _shape(text: str) -> tuple[int, int, int]:
    heads, n, d = (int(v) for v in text.split("x"))
    return heads, n, d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["32x2048x128", "16x1024x64", "16x8192x128"],
                    help="heads x tokens x head dim (queries = keys = tokens)")
    ap.add_argument("--tiles", nargs="+", default=["64x64", "64x128", "128x64", "128x128"],
                    help="query rows x keys per step")
    ap.add_argument("--configs", nargs="+", default=["w4s2", "w4s3", "w8s2", "w8s3"])
    ap.add_argument("--json", default=None, help="write every timing to this file")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"{torch.cuda.get_device_name()}; μs, median, CUDA-graph replay; fold: the shift folded "
          "(design §7.14), else per-step beta")
    rows = []
    for heads, n, d in map(_shape, args.shapes):
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = {k: torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)
             for k, shape in (("Q", (heads, n, d)), ("K", (heads, d, n)), ("V", (heads, n, d)))}
        k_rows = x["K"].transpose(1, 2).contiguous()[None]
        ref = F.scaled_dot_product_attention(x["Q"][None].float(), k_rows.float(), x["V"][None].float())[0]

        def sdpa() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(x["Q"][None], k_rows, x["V"][None])

        best: dict[bool, tuple[float, str, object]] = {}
        print(f"\n### {heads} heads, {n} × {n}, head dim {d}\n\n| tile | config | fold μs | no fold μs |\n|---|---|---|---|")
        for tile, label in itertools.product(args.tiles, args.configs):
            r, k = (int(v) for v in tile.split("x"))
            if n % r or n % k:
                continue
            g = online_attention(heads, n, n, d, r, k)
            op = next(o for o in g.ops if o.kind == "graph_defined")
            us = {}
            for fold in (True, False):
                cfg = KernelConfig.from_label(label + ("" if fold else "N"))
                try:
                    prog = lower.compile(g, device="cuda", configs={op.id: cfg})
                    err = ((prog(**x).float() - ref).abs().max() / ref.abs().max()).item()
                    if err > 2e-2:
                        raise ValueError(f"relative error {err:.1e}")
                    us[fold] = measure(prog.launcher(**x)) * 1e6
                except Exception as e:  # a tile the card cannot hold: named, not fatal
                    print(f"<!-- {tile} {cfg.label()}: {type(e).__name__}: {str(e)[:120]} -->")
                    continue
                rows.append(dict(heads=heads, n=n, d=d, tile=tile, config=cfg.label(), us=us[fold]))
                if fold not in best or us[fold] < best[fold][0]:
                    best[fold] = (us[fold], f"{tile} {label}", prog.launcher(**x))
            cells = [f"{us[f]:.1f}" if f in us else "-" for f in (True, False)]
            print(f"| {tile} | {label} | {cells[0]} | {cells[1]} |")
        launches = {"sdpa": sdpa, **{f"fold={f}": b[2] for f, b in best.items()}}
        t = {k: v * 1e6 for k, v in measure_together(launches).items()}
        flops = 4 * heads * n * n * d
        print(f"\nside by side: SDPA {t['sdpa']:.1f} μs ({flops / t['sdpa'] / 1e6:.0f} TFLOP/s)"
              + "".join(f"; best {'folded' if f else 'unfolded'} ({best[f][1]}) {t[f'fold={f}']:.1f} μs, "
                        f"{t['sdpa'] / t[f'fold={f}']:.2f}× SDPA" for f in best))
        rows.append(dict(heads=heads, n=n, d=d, together=t))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
