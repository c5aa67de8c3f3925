"""The benchmark table (``python -m mugraph bench``): each benchmark of DESIGN §7
superoptimized (or loaded from a saved result) and, on a GPU, timed beside
PyTorch eager, ``torch.compile`` and SDPA — every variant timed the same way by
``lower.profile.measure`` (CUDA graphs; default ``"graph"`` timing) — and the memory-traffic floor (bytes read and
written once over the bandwidth of a device-to-device copy measured on the same
card). Without a GPU the table holds the cost model's predictions."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from lower.cost_model import estimate, memory_floor_bytes
from lower.profile import TIMINGS, measure

from ..benchmarks import PROGRAMS, program
from ..benchmarks.torch_versions import SDPA, TORCH
from ..errors import ArgumentTypeError, ConfigError, MugraphError
from ..files import as_path, safe_name
from ..ir import short
from ..serialize import graph_to_json
from .optimize import OptimizeConfig, Optimized, log, make_config, superoptimize
from .results import load


@dataclass
class BenchRow:
    name: str
    b: int
    ours_us: float | None
    predicted_us: float | None
    eager_us: float | None = None
    compile_us: float | None = None
    sdpa_us: float | None = None
    floor_us: float | None = None
    kernels: int = 0
    rel_error: float | None = None
    origin: str = ""
    #: how the winner was found ("enumeration", "composed+fused", "split-loop", …; "program" if unfused)
    found_by: str = ""

    @property
    def best_torch_us(self) -> float | None:
        xs = [x for x in (self.eager_us, self.compile_us, self.sdpa_us) if x is not None]
        return min(xs) if xs else None


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy (read + write), measured here."""
    n = 1 << 28
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = measure(lambda: b.copy_(a), "warm")
    return 2 * n / t


def _optimized(name: str, b: int, results: Path | None, config: OptimizeConfig | None, progress: bool,
               seed: int = 0, cache_dir=None) -> Optimized:
    """The saved result ``results/NAME-bB.mug.json`` if it holds this very program;
    else (missing, unreadable, or another program's) superoptimized and saved."""
    prog = program(name, b=b)
    saved = results / f"{safe_name(name)}-b{b}.mug.json" if results is not None else None
    if saved is not None and saved.exists():
        try:
            opt = load(saved)
            if not isinstance(opt, Optimized):
                why = "it holds a graph, not a superoptimize result"
            elif graph_to_json(opt.program) != graph_to_json(prog):
                why = f"it holds another program ({opt.program.name!r} with other inputs or ops)"
            else:
                return opt
        except MugraphError as e:
            why = f"it is unreadable ({e})"
        log.warning("mugraph bench: re-running %s: %s", saved, why[:300])
    opt = superoptimize(prog, config, progress=progress, seed=seed, cache_dir=cache_dir)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        opt.save(saved)
    return opt


def check_args(names, batches, results, timing: str, top_k: int, tune_seconds) -> tuple[list[str], Path | None]:
    """The table's arguments, checked before anything runs: benchmark names, batch
    sizes, the results folder, the timing mode and the tuning budget."""
    if isinstance(names, str):
        raise ArgumentTypeError(f"bench: names={names!r} must be a list of benchmark names, e.g. [{names!r}]")
    names = list(names or PROGRAMS)
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        raise ConfigError(f"bench: unknown benchmark(s) {', '.join(short(n, 30) for n in unknown[:5])}; "
                          f"choose from {sorted(PROGRAMS)}")
    if not isinstance(batches, (list, tuple)) or not batches or any(type(b) is not int or b < 1 for b in batches):
        raise ConfigError(f"bench: batches={short(batches)} must be a non-empty list of positive ints")
    res = as_path(results, "bench: results") if results is not None else None
    if res is not None and res.exists() and not res.is_dir():
        raise ConfigError(f"bench: results={str(res)!r} is a file, not a folder")
    if timing not in TIMINGS:
        raise ConfigError(f"bench: timing={short(timing)}: use one of {sorted(TIMINGS)}")
    if type(top_k) is not int or top_k < 1:
        raise ConfigError(f"bench: top_k={short(top_k)} must be a positive int")
    if tune_seconds is not None and (isinstance(tune_seconds, bool) or not isinstance(tune_seconds, (int, float))
                                     or not 0 < tune_seconds < float("inf")):
        raise ConfigError(f"bench: tune_seconds={short(tune_seconds)} must be seconds > 0 or None")
    return names, res


def run_bench(names=None, batches=(1, 8), results: str | Path | None = None, config: OptimizeConfig | None = None,
              timing: str = "graph", progress: bool = True, top_k: int = 2, tune_seconds: float | None = None,
              on_row: Callable[[BenchRow], None] | None = None, seed: int = 0,
              cache_dir: str | Path | None | bool = None) -> tuple[list[BenchRow], str]:
    """Rows of the table, and a header line saying where and how it was measured.
    ``on_row`` sees each row as soon as it is measured (long runs show progress).
    ``seed`` and ``cache_dir`` go to ``superoptimize`` for results not saved yet."""
    names, res = check_args(names, batches, results, timing, top_k, tune_seconds)
    config = make_config(config)
    gpu = torch.cuda.is_available()
    if gpu:
        bw = copy_bandwidth()
    rows = []
    for name in names:
        for b in batches:
            opt = _optimized(name, b, res, config, progress, seed, cache_dir)
            pred = opt.best.predicted_s if opt.best.predicted_s is not None else estimate(opt.graph)
            row = BenchRow(name, b, None, pred * 1e6, kernels=opt.best.num_kernels,
                           origin=opt.best.origin, found_by=_how(opt.best))
            if gpu:
                if opt.device != "cuda" or opt.best.measured_s is None:
                    opt.profile_on_gpu(top_k=top_k, tune_seconds=tune_seconds, timing=timing)  # searched on a CPU: autotune and time the best candidates here
                    row.kernels, row.origin, row.found_by = opt.best.num_kernels, opt.best.origin, _how(opt.best)
                    if res is not None:
                        opt.save(res / f"{safe_name(name)}-b{b}.gpu.mug.json")  # the re-ranked result, measured times in it
                    row.predicted_us = (opt.best.predicted_s or 0.0) * 1e6
                # inputs of std 0.25 (the GPU re-ranking's accuracy gate uses the same): attention
                # without a max subtraction overflows fp16 at std ≳ 0.5, in the program as much as ours
                gen = torch.Generator(device="cuda").manual_seed(0)
                args = [torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float16) * 0.25
                        for t in opt.program.inputs]
                comp = opt.compiled("cuda")
                y = comp(*args)
                ref = TORCH[name](*[a.double() for a in args])
                row.rel_error = float((y.double() - ref).norm() / ref.norm())
                row.ours_us = measure(comp.launcher(*args), timing) * 1e6
                row.eager_us = measure(lambda: TORCH[name](*args), timing) * 1e6
                compiled = torch.compile(TORCH[name])
                row.compile_us = measure(lambda: compiled(*args), timing) * 1e6
                if name in SDPA:
                    row.sdpa_us = measure(lambda: SDPA[name](*args), timing) * 1e6
                row.floor_us = memory_floor_bytes(opt.program) / bw * 1e6
            rows.append(row)
            if on_row:
                on_row(row)
    where = torch.cuda.get_device_name() if gpu else "CPU (no GPU: cost-model predictions only)"
    head = f"{datetime.date.today()} on {where}; μs, median, {TIMINGS[timing]}"
    return rows, head


COLUMNS = (f"{'benchmark':15} {'b':>2} {'kern':>4} {'ours':>8} {'eager':>8} {'compile':>8} {'SDPA':>8} "
           f"{'floor':>8} {'×torch':>7} {'×floor':>7} {'predict':>8} {'rel.err':>8}  found by")


def _how(c) -> str:
    return c.found_by or ("program" if c.origin == "program" else c.origin)


def format_row(r: BenchRow) -> str:
    def f(x):
        return f"{x:8.1f}" if x is not None else "       -"

    best = r.best_torch_us
    vs = f"{best / r.ours_us:7.2f}" if best and r.ours_us else "      -"
    fl = f"{r.ours_us / r.floor_us:7.2f}" if r.floor_us and r.ours_us else "      -"
    err = f"{r.rel_error:8.1e}" if r.rel_error is not None else "       -"
    return (f"{r.name:15} {r.b:2d} {r.kernels:4d} {f(r.ours_us)} {f(r.eager_us)} {f(r.compile_us)} "
            f"{f(r.sdpa_us)} {f(r.floor_us)} {vs} {fl} {f(r.predicted_us)} {err}  {r.found_by}")


def format_table(rows: list[BenchRow], head: str) -> str:
    return "\n".join([head, COLUMNS, "-" * len(COLUMNS)] + [format_row(r) for r in rows])

