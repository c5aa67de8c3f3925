"""Sweep the one-kernel decode attention μGraph over its key step and kernel configs, with
the KV cache in the layout a decoding model keeps it (key-major, ``(KV heads, slots, d)``)
and an additive mask over the slots, against SDPA called as the model calls it: what the
lowering can reach for a decode step's attention, whatever the search and the tuner find.

    python examples/decode_attention_sweep.py                                   # a GPU machine
    python examples/decode_attention_sweep.py --shapes 32x32x1x8448x96 --steps 64 128 --splits 4 6 12
    python examples/decode_attention_sweep.py --shapes 8x8x1x32768x128 --no-mask

A shape is ``HEADSxKV_HEADSxQUERIESxSLOTSxD``. The μGraph (design §3.4, the online form the
search finds for a safe softmax): a block per KV head holding its ``HEADS / KV_HEADS ×
QUERIES`` query rows, the loop walking the slots ``--steps`` keys at a time,
``S = Q@Kᵀ·d^-½ + mask``, ``m = max(S)``, ``e = exp(S − m)``, ``e@V`` and ``Σe`` accumulated
rescaled by ``m``; split-K factors divide the loop over programs whose partials are combined
by the last program (``L``) or by a second kernel. Every variant is checked against float64
first (a wrong one is reported, not timed); each is timed from DRAM (``"dram"``: every call on
its own copy of the cache, as a model's step reads it). Prints the fastest variants per shape
with their ratio to SDPA (with ``enable_gqa``, the mask as the model passes it) and to the
copy floor of the cache, the cost model's price of each, and what each kernel compiled to
beside what the model assumes (registers a thread, spills, shared memory, programs an SM:
``CompiledProgram.resources()``, ``lower.cost_model.residency``); ``--json`` writes every row.
Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mugraph as mg  # noqa: E402
from lower import KernelConfig  # noqa: E402
from lower.cost_model import estimate, residency  # noqa: E402
from lower.profile import measure_on  # noqa: E402
from lower.runtime import compile as lower_compile  # noqa: E402
from lower.testing import rel_error  # noqa: E402


def decode_attention(kv_heads: int, rows: int, slots: int, d: int, steps: int, mask: bool,
                     dtype: str = "bfloat16") -> mg.KernelGraph:
    """The online μGraph: a block per KV head (its ``rows`` query rows), ``steps`` keys a step."""
    g = mg.KernelGraph(f"decode_kv{kv_heads}_r{rows}_n{slots}_d{d}")
    Q = g.input("Q", (kv_heads, rows, d), dtype)
    K = g.input("K", (kv_heads, d, slots), dtype)
    V = g.input("V", (kv_heads, slots, d), dtype)
    M = g.input("M", (1, rows, slots), dtype) if mask else None
    b = mg.BlockGraph(grid=(kv_heads, 1, 1), forloop=slots // steps)
    heads = (0 if kv_heads > 1 else None, None, None)  # a grid axis of one block maps no dim
    q, k, v = b.input(Q, heads, None), b.input(K, heads, 2), b.input(V, heads, 1)
    s = mg.scale(q @ k, 1 / math.sqrt(d))
    if M is not None:
        s = s + b.input(M, (None, None, None), 2)
    m = mg.max(s, 2)
    e = mg.exp(s - m)
    b.output(b.accum(e @ v, m) / b.accum(mg.sum(e, 2), m), heads)
    (o,) = g.kernel(b)
    g.output(o)
    return g


def configs(loop: int, splits, warps, stages, combines) -> list[KernelConfig]:
    """Split-K factors that divide the loop, each combine mode, times warps and stages."""
    out = []
    for k, w, s in itertools.product(splits, warps, stages):
        if loop % k:
            continue
        for comb in (combines if k > 1 else ("kernel",)):
            out.append(KernelConfig(num_warps=w, num_stages=s, split=k, combine=comb))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["32x32x1x8448x96", "8x8x1x32768x128", "64x8x1x16384x128"],
                    help="HEADSxKV_HEADSxQUERIESxSLOTSxD")
    ap.add_argument("--steps", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 11, 12, 16, 22, 24, 32])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--combines", nargs="+", default=["last"], choices=["last", "kernel"])
    ap.add_argument("--no-mask", action="store_true", help="no additive mask (SDPA then runs its flash kernel)")
    ap.add_argument("--top", type=int, default=10, help="rows printed per shape")
    ap.add_argument("--json", default=None, help="write every row here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("decode_attention_sweep: no CUDA device — nothing to time. Skipping.")
        return 0
    from mugraph.pipeline.bench import copy_bandwidth

    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; μs, median, CUDA-graph replay from DRAM; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s; bf16; the cache key-major")
    rows_out = []
    for shape in args.shapes:
        heads, kvh, queries, slots, d = (int(v) for v in shape.split("x"))
        group = heads // kvh
        rows = group * queries
        gen = torch.Generator(device="cuda").manual_seed(0)
        dt = torch.bfloat16
        q = torch.randn(1, heads, queries, d, device="cuda", generator=gen).to(dt)
        kc = torch.randn(1, kvh, slots, d, device="cuda", generator=gen).to(dt)
        vc = torch.randn(1, kvh, slots, d, device="cuda", generator=gen).to(dt)
        mask4 = None
        if not args.no_mask:  # the static cache's mask: the last 3/16 of the slots not yet written
            mask4 = torch.zeros(1, 1, queries, slots, device="cuda", dtype=dt)
            mask4[..., slots - slots * 3 // 16:] = torch.finfo(dt).min
        ref = F.scaled_dot_product_attention(q.double(), kc.double(), vc.double(),
                                             attn_mask=None if mask4 is None else mask4.double(), enable_gqa=True)
        # the μGraph's view: (KV heads, group × queries, d) rows, Kᵀ as a strided view of the cache
        inputs = {"Q": q[0].reshape(kvh, rows, d), "K": kc[0].transpose(1, 2), "V": vc[0]}
        if mask4 is not None:
            inputs["M"] = mask4[0, :, :, :].expand(1, group, queries, slots).reshape(1, rows, slots).contiguous()
        ref_rows = ref[0].reshape(kvh, rows, d)
        strides = {"K": tuple(inputs["K"].stride())}

        def sdpa(s):
            return lambda: F.scaled_dot_product_attention(s["q"], s["k"], s["v"], attn_mask=s["m"], enable_gqa=True)

        sdpa_s = measure_on(sdpa, {"q": q, "k": kc, "v": vc, "m": mask4}, "dram")
        cache_bytes = 2 * kc.numel() * kc.element_size()
        floor_s = cache_bytes / bw
        timed = []
        for steps in args.steps:
            if slots % steps:
                continue
            kg = decode_attention(kvh, rows, slots, d, steps, mask4 is not None)
            kernel = next(o for o in kg.ops if o.kind == "graph_defined")
            op = kernel.id
            for c in configs(slots // steps, args.splits, args.warps, args.stages, args.combines):
                label = f"{slots // steps} steps of {steps} keys, {c.label()}"
                try:
                    model_s = estimate(kg, configs={op: c})
                    prog = lower_compile(kg, device="cuda", configs={op: c}, input_strides=strides)
                    err = rel_error(prog(**inputs), ref_rows)
                    if not err <= 2e-2:
                        print(f"  wrong: {label}: relative error {err:.2e}", flush=True)
                        continue
                    t = measure_on(lambda s: prog.launcher(**s), inputs, "dram")
                    card = prog.resources(**inputs)[0]
                    mine = residency(kernel, c)
                    label += (f"  [card: {card.regs} regs, {card.spills} spilled, {card.shared // 1024} KB, "
                              f"{card.resident()}/SM; model: {mine['regs']:.0f} regs, {mine['shared'] / 1024:.0f} KB, "
                              f"{mine['resident']}/SM]")
                except Exception as e:  # noqa: BLE001 - a variant the card cannot run (shared memory): say which
                    print(f"  skipped: {label}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                    continue
                timed.append((t, model_s, label))
                rows_out.append(dict(shape=shape, steps=steps, config=c.label(), us=t * 1e6, model_us=model_s * 1e6,
                                     sdpa_us=sdpa_s * 1e6, floor_us=floor_s * 1e6, regs=card.regs,
                                     spills=card.spills, shared=card.shared, resident=card.resident(),
                                     model_regs=mine["regs"], model_shared=mine["shared"],
                                     model_resident=mine["resident"]))
        timed.sort()
        print(f"\n{shape} ({'additive mask' if mask4 is not None else 'no mask'}): SDPA {sdpa_s * 1e6:.2f} μs, "
              f"floor {floor_s * 1e6:.2f} μs; fastest of {len(timed)}:")
        for t, model_s, label in timed[:args.top]:
            print(f"  {t * 1e6:7.2f} μs  {sdpa_s / t:5.2f}× SDPA  {t / floor_s:5.2f}× floor  "
                  f"model {model_s * 1e6:6.1f}  {label}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
