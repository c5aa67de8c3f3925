"""The benchmark table (``python -m mugraph bench``): each benchmark of docs/design.md §8.5 and
each decode-shaped attention program (``mugraph.core.benchmarks.DECODE``) superoptimized
(or loaded from a saved result) and, on a GPU, re-ranked there and timed beside the
hand-written reference μGraph's lowering (autotuned like ours), PyTorch eager,
``torch.compile`` and SDPA — every variant timed the same way, side by side in
:data:`FINAL_ROUNDS` rounds (``lower.profile.measure_together``: CUDA graphs, default
``"graph"`` timing, each variant's median) — and the
memory-traffic floor (bytes read and written once over the bandwidth of a
device-to-device copy measured on the same card). Without a GPU the table holds the
cost model's predictions.

Every row also says how far the search reached (:func:`reach`): how many candidates it
verified, whether one of them has the reference's structure (kernel count, each
kernel's blocks and loop length: e.g. a split-KV pair), where the cost model ranks it,
and whether the GPU re-ranking's plan (``timing.plan_rerank``) times it."""

from __future__ import annotations

import csv
import datetime
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch

import lower
from lower.cost_model import estimate, memory_floor_bytes
from lower.profile import TIMINGS, ProfileResult, measure, measure_together

from ..core.benchmarks import DECODE, PROGRAMS, REFERENCES, program, reference
from ..core.benchmarks.torch_versions import SDPA, TORCH, sdpa_call
from ..core.errors import ArgumentTypeError, ConfigError, MugraphError
from ..core.files import as_path, safe_name
from ..core.ir import KernelGraph, short
from ..core.serialize import graph_to_json
from ..core.text import kernel_structure as structure  # the table's structure column
from .optimize import OptimizeConfig, Optimized, log, make_config, superoptimize
from .results import Candidate, load
from .timing import (MAX_TUNE_S, MIN_TUNE_S, SECONDS_PER_CONFIG, TOTAL_TUNE_S, config_space, device_name,
                     plan_rerank, predict_tuned)


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
    #: how the winner was found ("enumeration", "composed+fused", "split-loop", "retile", …; "program" if unfused)
    found_by: str = ""
    #: the search's wall seconds (as saved with the result) and the candidates it verified
    search_s: float | None = None
    verified: int = 0
    #: the hand-written reference μGraph: predicted and (GPU) autotuned μs; None: there is none
    ref_predicted_us: float | None = None
    ref_us: float | None = None
    #: the reference's kernels as "blocks×loop" (see :func:`structure`)
    ref_structure: str = ""
    #: the closest level of :data:`REACH_LEVELS` a verified candidate reaches ("same",
    #: "split", "kernels"), "" (none), "-" (no reference)
    reach: str = ""
    #: rank by predicted time among the verified candidates of the best such one (1 = best)
    reach_rank: int | None = None
    #: whether the re-ranking plan (default sizing) times it
    reach_timed: bool = False
    #: the best verified candidate's structure
    structure: str = ""
    #: wall seconds of the whole row (search or load, re-ranking, every timing)
    row_s: float | None = None

    @property
    def best_torch_us(self) -> float | None:
        xs = [x for x in (self.eager_us, self.compile_us, self.sdpa_us) if x is not None]
        return min(xs) if xs else None


def _kernels(g) -> list[tuple[int, int] | None]:
    """(blocks, loop length) per kernel op in order; None for a pre-defined op."""
    return [(op.attrs["block"].num_blocks, op.attrs["block"].forloop) if op.kind == "graph_defined" else None
            for op in g.ops if op.kind != "input"]


#: how close a candidate's structure is to the reference's, closest first: every kernel's
#: blocks and loop; every kernel's loop length (the same loop split, another tiling); the
#: same kernels looping (e.g. a split-KV pair at another chunk count)
REACH_LEVELS = (
    ("same", lambda k: k),
    ("split", lambda k: [x if x is None else x[1] for x in k]),
    ("kernels", lambda k: [x if x is None else x[1] > 1 for x in k]),
)


def reach(ref, cands: list[Candidate]) -> tuple[str, int | None, bool]:
    """How close the verified candidates (``cands``: the search's, not rejected) come to the
    reference μGraph ``ref``: (the closest :data:`REACH_LEVELS` level any reaches, or "";
    the rank by predicted time among ``cands`` of the best candidate at that level; whether
    :func:`~mugraph.pipeline.timing.plan_rerank` times it)."""
    ranked = sorted(cands, key=lambda c: c.predicted_s if c.predicted_s is not None else float("inf"))
    want = _kernels(ref)
    for level, view in REACH_LEVELS:
        hits = [i for i, c in enumerate(ranked) if view(_kernels(c.graph)) == view(want)]
        if hits:
            c = ranked[hits[0]]
            timed = any(x is c for x, _ in plan_rerank(ranked, space=lambda g: 1).timed)
            return level, hits[0] + 1, timed
    return "", None, False


#: seconds one row of the table may take on the GPU machine, and what it keeps back for the
#: PyTorch baselines (torch.compile compiles) and the final timings: the re-ranking's and the
#: reference's tuning get what the search left of it (see :func:`tuning_shares`)
ROW_S, BASELINES_S = 480.0, 60.0
#: rounds of the final timings: ours, the reference and the PyTorch variants, each timed once
#: a round, in turn; a row reports each one's median (``lower.profile.measure_together``)
FINAL_ROUNDS = 5


def tuning_shares(elapsed: float, ref_graph=None, row_s: float = ROW_S) -> tuple[float, float | None]:
    """(re-ranking's total tuning seconds, the reference's) for a row whose search and
    checks took ``elapsed`` seconds: what is left of ``row_s`` (default :data:`ROW_S`) after
    :data:`BASELINES_S`, the reference sized like a candidate (``SECONDS_PER_CONFIG`` ×
    its configuration space, within [MIN_TUNE_S, MAX_TUNE_S]) but at most a third of it;
    the re-ranking the rest, at most ``timing.TOTAL_TUNE_S``, at least two candidates'
    minimum — so a row takes about ``max(row_s, elapsed + 3 · MIN_TUNE_S + BASELINES_S)``."""
    left = max(row_s - elapsed - BASELINES_S, 3 * MIN_TUNE_S)
    ref_s = None
    if ref_graph is not None:
        want = min(MAX_TUNE_S, max(MIN_TUNE_S, SECONDS_PER_CONFIG * sum(config_space(ref_graph).values())))
        ref_s = max(MIN_TUNE_S, min(want, left / 3))
    rerank = max(2 * MIN_TUNE_S, min(TOTAL_TUNE_S, left - (ref_s or 0.0)))
    return rerank, ref_s


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
    else (missing, unreadable, or another program's) superoptimized — not timed: on a GPU
    machine too the re-ranking is :func:`run_bench`'s, within the row's budget — and saved."""
    prog = program(name, b=b)
    saved = results / f"{safe_name(name)}-b{b}.mug.json" if results is not None else None
    if saved is not None and saved.exists():
        try:
            opt = load(saved)
            if not isinstance(opt, Optimized):
                why = "it holds a graph, not a superoptimize result"
            elif graph_to_json(opt.program) != graph_to_json(prog):
                why = f"it holds another program ({opt.program.name!r} with other inputs or ops)"
            elif not opt.best.proven and not (config is not None and make_config(config).allow_unproven):
                why = "its answer is an unproven μGraph (saved with allow_unproven)"
            else:
                return opt
        except MugraphError as e:
            why = f"it is unreadable ({e})"
        log.warning("mugraph bench: re-running %s: %s", saved, why[:300])
    # searched, checked and ranked by the cost model here; the GPU re-ranking is the row's
    # own (run_bench), with the tuning time the row has left
    opt = superoptimize(prog, config, device="cpu", progress=progress, seed=seed, cache_dir=cache_dir)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        opt.save(saved)
    return opt


def check_args(names, batches, results, timing: str, top_k: int | None, tune_seconds) -> tuple[list[str], Path | None]:
    """The table's arguments, checked before anything runs: benchmark names, batch
    sizes, the results folder, the timing mode and the tuning budget."""
    if isinstance(names, str):
        raise ArgumentTypeError(f"bench: names={names!r} must be a list of benchmark names, e.g. [{names!r}]")
    names = list(names or [*PROGRAMS, *DECODE])
    unknown = [n for n in names if n not in PROGRAMS and n not in DECODE]
    if unknown:
        raise ConfigError(f"bench: unknown benchmark(s) {', '.join(short(n, 30) for n in unknown[:5])}; "
                          f"choose from {sorted(PROGRAMS) + sorted(DECODE)}")
    if not isinstance(batches, (list, tuple)) or not batches or any(type(b) is not int or b < 1 for b in batches):
        raise ConfigError(f"bench: batches={short(batches)} must be a non-empty list of positive ints")
    res = as_path(results, "bench: results") if results is not None else None
    if res is not None and res.exists() and not res.is_dir():
        raise ConfigError(f"bench: results={str(res)!r} is a file, not a folder")
    if timing not in TIMINGS or timing == "dram":
        raise ConfigError(f"bench: timing={short(timing)}: use one of {sorted(set(TIMINGS) - {'dram'})} "
                          "(the table times library baselines on fixed inputs)")
    if top_k is not None and (type(top_k) is not int or top_k < 1):
        raise ConfigError(f"bench: top_k={short(top_k)} must be a positive int or None")
    if tune_seconds is not None and (isinstance(tune_seconds, bool) or not isinstance(tune_seconds, (int, float))
                                     or not 0 < tune_seconds < float("inf")):
        raise ConfigError(f"bench: tune_seconds={short(tune_seconds)} must be seconds > 0 or None")
    return names, res


def run_bench(names=None, batches=(1, 8), results: str | Path | None = None, config: OptimizeConfig | None = None,
              timing: str = "graph", progress: bool = True, top_k: int | None = None, tune_seconds: float | None = None,
              on_row: Callable[[BenchRow], None] | None = None, seed: int = 0,
              cache_dir: str | Path | None | bool = None, out: str | Path | None = None,
              row_seconds: float = ROW_S) -> tuple[list[BenchRow], str]:
    """Rows of the table, and a header line saying where and how it was measured.
    ``row_seconds``: what one row may take in all — search, re-ranking, the reference's
    tuning and the baselines (:func:`tuning_shares`); a search that ends early leaves
    the tuning more.
    ``on_row`` sees each row as soon as it is measured (long runs show progress);
    ``out``: a folder where ``bench.csv`` gets each row as it finishes.
    ``top_k``/``tune_seconds``: override the re-ranking plan (``timing.plan_rerank``).
    ``seed`` and ``cache_dir`` go to ``superoptimize`` for results not saved yet."""
    names, res = check_args(names, batches, results, timing, top_k, tune_seconds)
    if isinstance(row_seconds, bool) or not isinstance(row_seconds, (int, float)) or not 0 < row_seconds < float("inf"):
        raise ConfigError(f"bench: row_seconds={short(row_seconds)} must be seconds > 0")
    outdir = as_path(out, "bench: out") if out is not None else None
    if outdir is not None and outdir.exists() and not outdir.is_dir():
        raise ConfigError(f"bench: out={str(outdir)!r} is a file, not a folder")
    config = make_config(config)
    gpu = torch.cuda.is_available()
    if gpu:
        bw = copy_bandwidth()
    rows = []
    sink = _CsvSink(outdir / "bench.csv") if outdir is not None else None
    for name in names:
        for b in batches:
            t_row = time.perf_counter()
            opt = _optimized(name, b, res, config, progress, seed, cache_dir)
            pred = opt.best.predicted_s if opt.best.predicted_s is not None else estimate(opt.graph)
            verified = [c for c in opt.candidates if c.origin == "search" and not c.rejected]
            row = BenchRow(name, b, None, pred * 1e6, kernels=opt.best.num_kernels,
                           origin=opt.best.origin, found_by=_how(opt.best),
                           search_s=(opt.report.get("search") or {}).get("wall_s"), verified=len(verified),
                           structure=structure(opt.graph))
            if name in REFERENCES:
                ref_graph = reference(name, b)
                row.ref_structure = structure(ref_graph)
                row.ref_predicted_us = predict_tuned(ref_graph).predicted_s * 1e6
                row.reach, row.reach_rank, row.reach_timed = reach(ref_graph, verified)
            else:
                row.reach = "-"
            if gpu:
                rerank_s, ref_s = tuning_shares(time.perf_counter() - t_row,
                                                reference(name, b) if name in REFERENCES else None, row_seconds)
                if opt.device != "cuda" or opt.best.measured_s is None:
                    # searched on a CPU: autotune and time the best candidates here
                    opt.profile_on_gpu(top_k=top_k, tune_seconds=tune_seconds, timing=timing, tune_total_s=rerank_s,
                                       allow_unproven=config.allow_unproven)
                    row.kernels, row.origin, row.found_by = opt.best.num_kernels, opt.best.origin, _how(opt.best)
                    row.structure = structure(opt.graph)
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
                launches = {"ours": comp.launcher(*args), "eager": lambda: TORCH[name](*args)}
                compiled = torch.compile(TORCH[name])
                compiled(*args)  # compiles here, not inside the first timing
                launches["compile"] = lambda: compiled(*args)
                if name in SDPA:
                    launches["sdpa"] = sdpa_call(name, *args)
                if name in REFERENCES:
                    ins = {t.name: a for t, a in zip(opt.program.inputs, args)}
                    tuned = lower.profile(reference(name, b), inputs=ins, ref=[ref], tol=2e-2, budget_s=ref_s,
                                          timing=timing)
                    if tuned.program is not None:
                        launches["ref"] = tuned.program.launcher(**ins)
                # every variant timed in the same rounds, in turn (lower.profile.measure_together)
                us = {k: v * 1e6 for k, v in measure_together(launches, timing, FINAL_ROUNDS).items()}
                row.ours_us, row.eager_us, row.compile_us = us["ours"], us["eager"], us["compile"]
                row.sdpa_us, row.ref_us = us.get("sdpa"), us.get("ref")
                if res is not None and "ref" in launches:
                    _save_reference(res / f"{safe_name(name)}-b{b}.ref.gpu.mug.json", opt.program, tuned,
                                    us["ref"] * 1e-6)
                row.floor_us = memory_floor_bytes(opt.program) / bw * 1e6
            row.row_s = time.perf_counter() - t_row
            rows.append(row)
            if sink is not None:
                sink.write(row)
            if on_row:
                on_row(row)
    where = torch.cuda.get_device_name() if gpu else "CPU (no GPU: cost-model predictions only)"
    head = f"{datetime.date.today()} on {where}; μs, median, {TIMINGS[timing]}"
    return rows, head


def _save_reference(path: Path, program: KernelGraph, tuned: ProfileResult, seconds: float) -> None:
    """The row's hand-written reference as it was tuned and timed (its graph, tuned configs,
    side-by-side median), saved as a result of one ``reference`` candidate: what
    ``python -m lower.calibration --add`` records beside the search's candidates, so the
    cost model is checked against the structures the search should reach too."""
    c = Candidate(tuned.graph, "reference", predicted_s=tuned.predicted_s, measured_s=seconds,
                  configs={k: asdict(v) for k, v in tuned.configs.items()}, found_by="hand-written")
    Optimized(program, c, [c], {"device": device_name("cuda"),
                                "why": "the hand-written reference μGraph, autotuned and timed beside the row"},
              "cuda").save(path)


class _CsvSink:
    """``bench.csv``: a header, then each row as soon as it is measured (flushed), so a
    long run that is stopped keeps the rows it finished."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.cols = [f.name for f in fields(BenchRow)]
        with open(path, "w", newline="") as f:
            csv.writer(f).writerow(self.cols)

    def write(self, row: BenchRow) -> None:
        d = asdict(row)
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow(["" if d[c] is None else d[c] for c in self.cols])


COLUMNS = (f"{'benchmark':26} {'b':>2} {'search':>7} {'verif':>5} {'kern':>4} {'ours':>8} {'ref':>8} {'eager':>8} "
           f"{'compile':>8} {'SDPA':>8} {'floor':>8} {'×torch':>7} {'×ref':>6} {'predict':>8} {'ref.pr':>8} "
           f"{'rel.err':>8} {'reach':>11}  found by; structure (ref)")


def _how(c) -> str:
    return c.found_by or ("program" if c.origin == "program" else c.origin)


def format_row(r: BenchRow) -> str:
    """One line of the table. ``×ref``: the reference's time over ours (≥ 1/1.1 is the goal);
    ``reach``: whether a verified candidate has the reference's structure, its rank by the
    cost model, and ``*`` when the re-ranking times it."""
    def f(x, w=8):
        return f"{x:{w}.1f}" if x is not None else " " * (w - 1) + "-"

    best = r.best_torch_us
    vs = f"{best / r.ours_us:7.2f}" if best and r.ours_us else "      -"
    vr = f"{r.ref_us / r.ours_us:6.2f}" if r.ref_us and r.ours_us else "     -"
    err = f"{r.rel_error:8.1e}" if r.rel_error is not None else "       -"
    reach = r.reach if r.reach in ("-", "") else f"{r.reach}#{r.reach_rank}{'*' if r.reach_timed else ''}"
    ref = f" ({r.ref_structure})" if r.ref_structure else ""
    return (f"{r.name:26} {r.b:2d} {f(r.search_s, 7)} {r.verified:5d} {r.kernels:4d} {f(r.ours_us)} {f(r.ref_us)} "
            f"{f(r.eager_us)} {f(r.compile_us)} {f(r.sdpa_us)} {f(r.floor_us)} {vs} {vr} {f(r.predicted_us)} "
            f"{f(r.ref_predicted_us)} {err} {reach or 'no':>11}  {r.found_by}; {r.structure}{ref}")


def rows_from_csv(lines: list[dict]) -> list[BenchRow]:
    """``bench.csv`` lines (as ``csv.DictReader`` gives them) back into rows."""
    types = {f.name: f.type for f in fields(BenchRow)}
    out = []
    for d in lines:
        kw = {}
        for k, v in d.items():
            if k not in types:
                continue
            t = str(types[k])
            if v == "":
                kw[k] = None if "None" in t else ("" if "str" in t else 0)
            elif "bool" in t:
                kw[k] = v == "True"
            elif "int" in t:
                kw[k] = int(float(v))
            elif "float" in t:
                kw[k] = float(v)
            else:
                kw[k] = v
        out.append(BenchRow(**kw))
    return out


def format_table(rows: list[BenchRow], head: str) -> str:
    return "\n".join([head, COLUMNS, "-" * len(COLUMNS)] + [format_row(r) for r in rows])

