"""Attention written with a safe softmax (``exp(S − max S)``), superoptimized end to end:
the proven μGraph the search finds, its time against SDPA and the memory or compute
floor, and its accuracy where the program without the max overflows (logits ×30). SDPA
is timed in each form a caller writes — a prompt on the flash kernel; a decode step with
a KV head's query rows as one head's rows, with ``enable_gqa``, and with K and V repeated
as transformers' ``repeat_kv`` does — and the fastest is reported, its form named.

    python examples/safe_attention.py --time-limit 60 --tune-s 30          # a GPU machine
    python examples/safe_attention.py --only prefill_h16_q1024_n1024_d64 --unsafe
    python examples/safe_attention.py --search-only --save results/       # search on a CPU machine …
    python examples/safe_attention.py --load results/                      # … time on a GPU machine

Prints a Markdown table, one row per shape: the decode shapes
(``mugraph.core.benchmarks.DECODE``, b=1, one query row per head over grouped KV heads)
and the prompt shapes (``PREFILL``: causal ones add a mask the kernels make from positions,
``mugraph.causal_mask``).
``--unsafe`` also superoptimizes the same program without the max and times its answer.
``--save DIR`` writes each result as ``DIR/<program>.json``; ``--search-only`` stops there
(no GPU needed: the search ranks by the cost model); ``--load DIR`` reads them and re-ranks
their candidates on this GPU (``Optimized.profile_on_gpu``) instead of searching. ``--cache
DIR`` gives the rows one result cache, as a user's default cache is: a row is then seeded by
the μGraph of the same program at other sizes searched before it (design §6.10, "Seeds
carried across sizes"), verified anew at its own; without it every row starts from nothing. A causal
row also times the chosen kernels running every loop step (``full loop μs``: the steps the
band mask hides are not skipped, ``KernelConfig.skip_masked``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import lower
import mugraph as mg
from lower.profile import measure
from mugraph.core.benchmarks import DECODE, PREFILL, decode_attention, prefill_attention
from mugraph.core.benchmarks.programs import decode_scale
from mugraph.core.benchmarks.torch_versions import sdpa_forms
from mugraph.pipeline.bench import copy_bandwidth

#: dense fp16 tensor-core peak of an H100 SXM (FLOP/s), for the compute floor of a prompt row
H100_FP16_PEAK = 989e12
CASES: dict[str, dict] = {**{k: dict(v, kind="decode") for k, v in DECODE.items()},
                          **{k: dict(v, kind="prefill") for k, v in PREFILL.items()}}


def _kernels(g) -> str:
    return " + ".join(f"{op.attrs['block'].num_blocks}x{op.attrs['block'].forloop}"
                      for op in g.ops if op.kind == "graph_defined") or "library ops"


def _program(name: str, safe: bool) -> mg.Program:
    sizes = {k: v for k, v in CASES[name].items() if k != "kind"}
    if CASES[name]["kind"] == "decode":
        return decode_attention(**sizes, safe=safe)
    return prefill_attention(**sizes, safe=safe)


def _inputs(p: mg.Program) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for t in p.inputs:
        if t.fill is None:  # a filled input (the causal mask) is made by the kernels
            out[t.name] = torch.randn(t.shape, generator=g, device="cuda", dtype=torch.float16) * 0.5
    return out


def _hidden(s: torch.Tensor) -> torch.Tensor:
    """SDPA's ``is_causal``: key ``j`` is hidden from query ``i`` when ``j > i``."""
    return torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)


def reference(x: dict[str, torch.Tensor], causal: bool) -> torch.Tensor:
    """float64 attention with torch's softmax (it subtracts the max)."""
    s = (x["Q"].double() @ x["K"].double()) * float(decode_scale(x["Q"].shape[-1]))
    if causal:
        s = s.masked_fill(_hidden(s), float("-inf"))
    return torch.softmax(s, -1) @ x["V"].double()


def _sdpa(name: str, x: dict[str, torch.Tensor], causal: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """SDPA on the same data, K already in rows (as a KV cache keeps it), in each form a
    caller might write it; the table reports the fastest. A prompt: the flash kernel. A
    decode step: :func:`~mugraph.core.benchmarks.torch_versions.sdpa_forms` (rows of a KV
    head, ``enable_gqa``, ``repeat_kv``)."""
    if CASES[name]["kind"] == "decode":
        return sdpa_forms(name, x["Q"], x["K"], x["V"])
    q, k, v = x["Q"][None], x["K"].transpose(1, 2).contiguous()[None], x["V"][None]
    scale = float(decode_scale(q.shape[-1]))

    def call() -> torch.Tensor:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return {"flash": call}


def _floor_us(p: mg.Program, bw: float) -> float:
    """The larger of the memory floor (inputs and output moved once) and, for a prompt,
    the compute floor (4·heads·q·kv·d FLOPs, half of it under a causal mask)."""
    nbytes = sum(t.nbytes for t in p.inputs) + sum(t.nbytes for t in p.outputs)
    mem = nbytes / bw
    Q, V = p.inputs[0], p.inputs[2]
    flops = 4 * Q.shape[0] * Q.shape[1] * V.shape[1] * Q.shape[2]
    if any(t.fill is not None for t in p.inputs):
        flops //= 2
    return max(mem, flops / H100_FP16_PEAK) * 1e6


def _optimize(p: mg.Program, args, device: str = "cuda") -> tuple[mg.Optimized, float]:
    """Superoptimized here, or read from ``--load`` and re-ranked on this GPU (its wall time
    is then the saved search's)."""
    t0 = time.perf_counter()
    saved = Path(args.load or "") / f"{p.name}.json"
    if args.load and saved.exists():
        opt = mg.load(saved)
        wall = float(opt.report.get("wall_s", 0.0))
        return opt.profile_on_gpu(tune_total_s=args.tune_s), wall
    opt = mg.superoptimize(p, {"search": {"time_limit": args.time_limit}, "tune_s": args.tune_s},
                           device=device, cache_dir=args.cache or False, progress=False)
    wall = time.perf_counter() - t0
    opt.report = {**opt.report, "wall_s": wall}
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        opt.save(Path(args.save) / f"{p.name}.json")
    return opt, wall


def _full_loop(opt: mg.Optimized):
    """The chosen μGraph and configs with every loop step run (no band-mask skipping)."""
    configs = {k: dataclasses.replace(lower.KernelConfig.from_dict(v), skip_masked=False)
               for k, v in opt.best.configs.items()}
    return lower.compile(opt.graph, device="cuda", configs=configs)


def _call(fn, x: dict[str, torch.Tensor]):
    y = fn(**x)
    return y[0] if isinstance(y, (tuple, list)) else y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--tune-s", type=float, default=30.0)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(CASES))
    ap.add_argument("--unsafe", action="store_true", help="also superoptimize and time the program without the max")
    ap.add_argument("--save", default=None, help="write each result to DIR/<program>.json")
    ap.add_argument("--load", default=None, help="read results from DIR instead of searching (re-ranked here)")
    ap.add_argument("--cache", default=None,
                    help="one result cache for the rows (seeds a row from the same program searched at other sizes)")
    ap.add_argument("--search-only", action="store_true", help="search (on this CPU) and --save, time nothing")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="each result's summary (its candidates, predicted and measured) on stderr")
    args = ap.parse_args()
    if args.search_only:
        for name in args.only or CASES:
            for safe in (True, False) if args.unsafe else (True,):
                opt, wall = _optimize(_program(name, safe), args, device="cpu")
                print(f"{name}{'' if safe else ' (unsafe)'}: {wall:.0f} s, {opt.best.origin}, "
                      f"proven {opt.best.proven}, {_kernels(opt.graph)}", flush=True)
        return
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}; μs, median, CUDA-graph replay")
    print("| program | wall s | shipped | proven | found by; structure | ours μs | SDPA μs (form) | × SDPA | full loop μs | "
          "unsafe μs | floor μs | rel. err (×1) | rel. err (logits ×30) | unsafe program at ×30 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.only or CASES:
        p = _program(name, safe=True)
        opt, wall = _optimize(p, args)
        if args.verbose:
            print(opt.summary(), file=sys.stderr, flush=True)
        x = _inputs(p)
        causal = any(t.fill is not None for t in p.inputs)
        fn = opt.compiled("cuda")
        ours = measure(fn.launcher(**x))
        forms = {form: measure(call) for form, call in _sdpa(name, x, causal).items()}
        form = min(forms, key=forms.get)
        sd = forms[form]
        full = f"{measure(_full_loop(opt).launcher(**x)) * 1e6:.1f}" if causal and opt.best.origin != "program" else "-"
        unsafe = "-"
        if args.unsafe:
            u, _ = _optimize(_program(name, safe=False), args)
            unsafe = f"{measure(u.compiled('cuda').launcher(**x)) * 1e6:.1f}"
        errs = []
        for mult in (1, 30):
            xm = dict(x, Q=x["Q"] * mult)  # larger logits: exp(S) alone overflows fp16 past ~11
            ref = reference(xm, causal)
            errs.append(float((_call(fn, xm).double() - ref).norm() / ref.norm()))
        s = (x["Q"] * 30 @ x["K"]) * float(decode_scale(x["Q"].shape[-1]))
        e = torch.exp(s.masked_fill(_hidden(s), float("-inf")) if causal else s)  # without the max, fp16 as written
        finite = bool(torch.isfinite((e / e.sum(-1, keepdim=True)) @ x["V"]).all())
        print(f"| {name} | {wall:.0f} | {opt.best.origin} | {'yes' if opt.best.proven else 'NO'} | "
              f"{opt.best.found_by or '-'}; {_kernels(opt.graph)} | {ours * 1e6:.1f} | {sd * 1e6:.1f} ({form}) | "
              f"{sd / ours:.2f} | {full} | {unsafe} | {_floor_us(p, bw):.1f} | {errs[0]:.1e} | {errs[1]:.1e} | "
              f"{'finite' if finite else 'inf/nan'} |", flush=True)


if __name__ == "__main__":
    main()
