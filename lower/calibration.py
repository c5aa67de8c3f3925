"""How well the cost model ranks configurations the H100 and the H200 actually timed.

``lower/data/h100_graph_timing.csv`` holds measurements of the reference μGraphs at
full shapes (``"graph"`` timing, ``lower.profile.TIMINGS``): every variant the tuner
timed in ``examples/bench_kernels.py`` runs, and the sweeps of
``examples/sweep_configs.py`` — one row per (benchmark, b, kernel configs); a
``sizes`` column names builder sizes of a variant μGraph (``col_tile=128``: a coarser
grid), so rows of different μGraphs of one benchmark are ranked separately. The
model is meant to *rank* (the tuner times its best few), so what matters is rank
agreement within one benchmark and how much slower the model's favourite is than
the measured best ("regret"). No GPU needed: predictions are recomputed here.

Two more records, each with its μGraphs: ``h200_candidates.jsonl.gz``, the candidates of
different structures a GPU re-ranking timed (:func:`structure_agreement`), and
``h200_sweeps.jsonl.gz``, every configuration of hand-written one-row projections that
``examples/gemv_sweep.py`` timed, all tilings of one shape ranked together
(:func:`sweep_agreement`).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
from dataclasses import asdict, dataclass
from typing import NamedTuple

from mugraph.core.benchmarks import reference
from mugraph.core.serialize import graph_from_json
from mugraph.core.text import kernel_structure

from .config import KernelConfig, sub_text
from .cost_model import H100, DeviceParams, estimate, for_timing, params_for
from .replay import Replay, replay

DATA = os.path.join(os.path.dirname(__file__), "data", "h100_graph_timing.csv")


@dataclass
class Agreement:
    spearman_all: float                      # over every row (different benchmarks mixed)
    spearman_within: dict[tuple, float]      # per μGraph: (benchmark, b, *sizes)
    regret: dict[tuple, float]               # measured(model's favourite) / measured best − 1

    @property
    def median_within(self) -> float:
        v = sorted(x for x in self.spearman_within.values() if not math.isnan(x))
        return v[len(v) // 2] if v else float("nan")


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank); NaN below 3 points."""
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


@dataclass(frozen=True)
class Measurement:
    name: str                         # benchmark (docs/design.md §8.5)
    b: int
    configs: dict[int, KernelConfig]  # op id -> config
    seconds: float
    sizes: tuple[tuple[str, int], ...] = ()   # builder sizes of a variant μGraph

    @property
    def group(self) -> tuple:
        """Rows of one μGraph: ranked against each other."""
        return (self.name, self.b) + self.sizes


def measurements(path: str = DATA) -> list[Measurement]:
    """Every recorded row."""
    out = []
    with open(path) as f:
        for r in csv.DictReader(f):
            cfgs = {}
            for part in r["configs"].split():
                k, lab = part.split(":", 1)
                cfgs[int(k[1:])] = KernelConfig.from_label(lab)
            sizes = tuple((k, int(v)) for k, v in (kv.split("=", 1) for kv in (r.get("sizes") or "").split()))
            out.append(Measurement(r["name"], int(r["b"]), cfgs, float(r["measured_us"]) * 1e-6, sizes))
    return out


def agreement(device: DeviceParams = H100, path: str = DATA) -> Agreement:
    """Rank agreement of the cost model (``device`` parameters) with the recorded times."""
    graphs = {}
    pred, meas, groups = [], [], {}
    for m in measurements(path):
        g = graphs.get(m.group) or graphs.setdefault(m.group, reference(m.name, b=m.b, **dict(m.sizes)))
        p = estimate(g, device, m.configs)
        pred.append(p)
        meas.append(m.seconds)
        groups.setdefault(m.group, []).append((p, m.seconds))
    within = {k: spearman([p for p, _ in v], [t for _, t in v]) for k, v in groups.items()}
    regret = {k: min(v)[1] / min(t for _, t in v) - 1 for k, v in groups.items()}
    return Agreement(spearman(pred, meas), within, regret)


# ------------------------------------------------ candidates of different structures

#: tuned and timed candidates of the GPU re-ranking (``*.gpu.mug.json`` results), several
#: structures of one program each: how well the model ranks *across* structures
CANDIDATES = os.path.join(os.path.dirname(__file__), "data", "h200_candidates.jsonl.gz")


@dataclass(frozen=True)
class CandidateTiming:
    """One candidate μGraph as the re-ranking tuned and timed it."""

    program: str                      # the program's name and batch, e.g. "gqa-b1"
    device: str
    date: str                         # ISO date of the run
    graph: dict                       # the candidate's KernelGraph JSON
    configs: dict[int, KernelConfig]  # op id -> the tuned config it was timed with
    seconds: float
    origin: str                       # "search", "program" (the unfused program) or "reference"
    found_by: str
    predicted: float | None           # s: what the re-ranking's plan ranked it by (best predicted config)
    run: str = ""                     # which run of that day (e.g. the commit; "" for records without one)


def record_candidates(results: list[str], date: str, path: str = CANDIDATES, run: str = "") -> int:
    """Append every timed candidate of the results files ``results`` (``Optimized`` JSON
    saved on a GPU: a re-ranking's ``<program>-b<b>.gpu.mug.json``, a bench row's
    reference ``<program>-b<b>.ref.gpu.mug.json``) to ``path``;
    returns how many. A candidate already recorded for the same run (same program,
    device, date, run label, graph and configs) is not added twice. ``run`` labels the run
    within its day: the agreement is computed per run, and each run's group holds every
    candidate it timed (a graph and config timed again in a later run is a new record)."""
    def key(program: str, device: str, graph: dict, configs: dict[int, KernelConfig]) -> tuple:
        return (program, device, json.dumps(graph, sort_keys=True),
                json.dumps({k: asdict(v) for k, v in sorted(configs.items())}, sort_keys=True))

    seen = {key(c.program, c.device, c.graph, c.configs)
            for c in candidate_timings(path) if (c.date, c.run) == (date, run)} if os.path.exists(path) else set()
    lines = []
    for r in results:
        # read as JSON here (the results' own loader belongs to the product, above this stage);
        # each graph and config is parsed, so a malformed file stops before anything is written
        doc = _document(r, "Optimized", "a saved mugraph result")
        program = os.path.basename(r).split(".")[0]
        device = (doc.get("report") or {}).get("device", "")
        for c in doc["candidates"]:
            if c.get("measured_s") is None:
                continue
            graph_from_json(c["graph"])
            cfgs = {int(k): KernelConfig.from_dict(v) for k, v in c.get("configs", {}).items()}
            k = key(program, device, c["graph"], cfgs)
            if k in seen:
                continue
            seen.add(k)
            pred = c.get("predicted_s")
            lines.append(json.dumps({"program": program, "device": device, "date": date, "graph": c["graph"],
                                     "configs": c.get("configs", {}), "measured_us": c["measured_s"] * 1e6,
                                     "origin": c["origin"], "predicted_us": None if pred is None else pred * 1e6,
                                     "found_by": c.get("found_by", ""), **({"run": run} if run else {})},
                                    sort_keys=True))
    return _append(path, lines)


def _document(name: str, kind: str, what: str) -> dict:
    """The JSON document in file ``name``; a ValueError naming the file unless it is of ``kind``."""
    with open(name, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise ValueError(f"{name}: not {what} (kind {doc.get('kind') if isinstance(doc, dict) else None!r})")
    return doc


def _append(path: str, lines: list[str]) -> int:
    """Append ``lines`` to the gzipped JSON-lines record ``path``; returns how many."""
    if lines:
        with gzip.open(path, "at", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return len(lines)


def candidate_timings(path: str = CANDIDATES) -> list[CandidateTiming]:
    """Every recorded candidate timing."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append(CandidateTiming(d["program"], d["device"], d["date"], d["graph"],
                                           {int(k): KernelConfig.from_dict(v) for k, v in d["configs"].items()},
                                           d["measured_us"] * 1e-6, d["origin"], d["found_by"],
                                           None if d.get("predicted_us") is None else d["predicted_us"] * 1e-6,
                                           d.get("run", "")))
    return out


class TimedRow(NamedTuple):
    """One recorded candidate as :class:`StructureAgreement` compares it."""

    model: float              # s: the cost model at the timed configs
    measured: float           # s
    structure: str            # mugraph.core.text.kernel_structure
    planned: float | None     # s: what the re-ranking's plan ranked it by, if recorded
    reference: bool           # the hand-written reference (never the plan's to choose)


@dataclass
class _Ranked:
    """Groups of timed rows, each row ``(model s, measured s, …)``: per group the rank
    agreement of model and measurement, and the regret of the model's favourite."""

    rows: dict[tuple, list]

    @property
    def spearman(self) -> dict[tuple, float]:
        return {k: spearman([r[0] for r in v], [r[1] for r in v]) for k, v in self.rows.items()}

    @property
    def regret(self) -> dict[tuple, float]:
        """Measured time of the model's favourite over the fastest measured, − 1."""
        return {k: min(v, key=lambda r: (r[0], r[1]))[1] / min(r[1] for r in v) - 1 for k, v in self.rows.items()}


@dataclass
class StructureAgreement(_Ranked):
    """Per program run (program, device, date, run label — "" for the records without one,
    which are grouped by day): the model's predictions at the timed configs against the
    times, over candidates of different structures."""

    rows: dict[tuple, list[TimedRow]]

    @property
    def window(self) -> dict[tuple, float]:
        """The fastest measured candidate's plan prediction over the best plan prediction:
        how far from the model's favourite the re-ranking had to look to time it
        (``mugraph.pipeline.timing.STRUCTURE_SPREAD``, ``SPREAD``)."""
        out = {}
        for k, v in self.rows.items():
            v = [r for r in v if not r.reference]
            if not v:
                continue
            preds = [r.planned for r in v if r.planned is not None]
            fastest = min(v, key=lambda r: r.measured)
            if preds and fastest.planned is not None:
                out[k] = fastest.planned / min(preds)
        return out


def structure_agreement(device: DeviceParams | None = None, path: str = CANDIDATES,
                        with_program: bool = False) -> StructureAgreement:
    """Rank agreement of the cost model with the recorded candidate timings (the search's
    and, where recorded, the hand-written reference's), one group per program run, each
    priced with the parameters of the GPU it was timed on (``device``: these for all);
    ``with_program`` adds the unfused program (library kernels, which the model prices by
    bytes alone)."""

    rows: dict[tuple, list[TimedRow]] = {}
    for c in candidate_timings(path):
        if c.origin == "program" and not with_program:
            continue
        g = graph_from_json(c.graph)
        rows.setdefault((c.program, c.device, c.date, c.run), []).append(
            TimedRow(estimate(g, device or params_for(c.device), c.configs), c.seconds, kernel_structure(g), c.predicted,
                     c.origin == "reference"))
    return StructureAgreement(rows)


SWEEPS = os.path.join(os.path.dirname(__file__), "data", "h200_sweeps.jsonl.gz")


class SweptGraph(NamedTuple):
    """One tiling of a swept shape and the times of its configurations."""

    device: str
    date: str
    run: str                  # which run of that day (e.g. the commit whose sweep timed it)
    sweep: str                # the shape and form swept ("residual 1x8192x3072"): tilings ranked together
    timing: str               # lower.profile.TIMINGS: how the inputs were read
    graph: dict               # the μGraph (mugraph.core.serialize), one graph-defined kernel
    seconds: dict[str, float]  # KernelConfig label -> measured seconds

    def priced_as(self, device: DeviceParams | None = None) -> DeviceParams:
        """The model's parameters for this sweep: its card's (or ``device``), read as its timing read the inputs."""
        return for_timing(device or params_for(self.device), self.timing)


def record_sweep(files: list[str], date: str, run: str = "", path: str = SWEEPS) -> int:
    """Append the tilings timed in ``examples/gemv_sweep.py --json`` files to ``path``; returns
    how many. Each file names its card and timing; each row its shape, form, tiling and config.
    A tiling already recorded for the same card, date, run and sweep is not added twice."""
    seen = ({(g.device, g.date, g.run, g.sweep, json.dumps(g.graph, sort_keys=True)) for g in swept_graphs(path)}
            if os.path.exists(path) else set())
    lines = []
    for name in files:
        doc = _document(name, "gemv_sweep", "an examples/gemv_sweep.py --json file")
        tilings: dict[tuple[str, str], dict[str, float]] = {}
        for r in doc["rows"]:
            KernelConfig.from_label(r["config"])
            form = f"gated {r['gated']}" if r.get("gated") else r.get("form", "plain")
            tilings.setdefault((f"{form} {r['shape']}", f"{r['shape']} {r['cols']}x{r['steps']}"), {})[r["config"]] = r["us"]
        for (sweep, key), times in tilings.items():
            graph = doc["graphs"][key]
            graph_from_json(graph)
            k = (doc["device"], date, run, sweep, json.dumps(graph, sort_keys=True))
            if k in seen:
                continue
            seen.add(k)
            lines.append(json.dumps({"device": doc["device"], "date": date, "run": run, "sweep": sweep,
                                     "timing": doc["timing"], "graph": graph, "measured_us": times}, sort_keys=True))
    return _append(path, lines)


def swept_graphs(path: str = SWEEPS) -> list[SweptGraph]:
    """Every recorded tiling of a sweep."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    return [SweptGraph(d["device"], d["date"], d["run"], d["sweep"], d["timing"], d["graph"],
                       {k: v * 1e-6 for k, v in d["measured_us"].items()}) for d in docs]


@dataclass
class SweepAgreement(_Ranked):
    """Per sweep (device, date, run, shape and form): the model against the times of every
    tiling and configuration timed, each priced as its timing read the inputs."""

    rows: dict[tuple, list[tuple[float, float, str]]]   # (model s, measured s, "tiling config")


def sweep_agreement(device: DeviceParams | None = None, path: str = SWEEPS) -> SweepAgreement:
    """Rank agreement of the cost model with the recorded sweeps, each priced with the
    parameters of the card it was timed on (``device``: these for all) as its timing reads
    the inputs (:func:`lower.cost_model.for_timing`)."""
    rows: dict[tuple, list[tuple[float, float, str]]] = {}
    for g in swept_graphs(path):
        kg = graph_from_json(g.graph)
        (op,) = [o.id for o in kg.ops if o.kind == "graph_defined"]
        dev = g.priced_as(device)
        tiling = kernel_structure(kg)
        rows.setdefault((g.device, g.date, g.run, g.sweep), []).extend(
            (estimate(kg, dev, {op: KernelConfig.from_label(label)}), t, f"{tiling} {label}")
            for label, t in g.seconds.items())
    return SweepAgreement(rows)


def merged_tilings(path: str = SWEEPS) -> list[SweptGraph]:
    """Every recorded tiling once: the sweeps of one tiling on one card, timed one way, on
    several days or runs, as one — its ``seconds`` the union of theirs (a configuration
    timed more than once at the mean), its ``date`` and ``run`` theirs joined by ``+``. A later
    sweep that times what an earlier one left out so answers the replay of both."""
    groups: dict[tuple, list[SweptGraph]] = {}
    for g in swept_graphs(path):
        groups.setdefault(_tiling_key(g), []).append(g)
    out = []
    for gs in groups.values():
        times: dict[str, list[float]] = {}
        for g in gs:
            for label, t in g.seconds.items():
                times.setdefault(label, []).append(t)
        joined = lambda field: "+".join(dict.fromkeys(getattr(g, field) for g in gs))  # noqa: E731
        out.append(gs[0]._replace(date=joined("date"), run=joined("run"),
                                  seconds={label: sum(v) / len(v) for label, v in times.items()}))
    return out


def replayed(path: str = SWEEPS) -> list[tuple[SweptGraph, Replay]]:
    """Every recorded tiling (its sweeps merged: :func:`merged_tilings`) with the tuner's order
    replayed on it (:func:`lower.replay.replay`)."""
    return [(g, replay(graph_from_json(g.graph), g.seconds, g.priced_as())) for g in merged_tilings(path)]


def unswept(g: SweptGraph, first: int = 8, r: Replay | None = None) -> list[KernelConfig]:
    """The configurations among the tuner's first ``first`` timings of ``g`` (its replay ``r``,
    made here when not given) that its sweep did not time: what a replay of ``g`` cannot answer."""
    r = r or replay(graph_from_json(g.graph), g.seconds, g.priced_as(), most=first)
    return [KernelConfig.from_label(label) for label, t in r.timed[:first] if t is None]


def _tiling_key(g: SweptGraph) -> tuple:
    """One tiling of one shape on one card, timed one way (:func:`merged_tilings`)."""
    return g.device, g.sweep, g.timing, json.dumps(g.graph, sort_keys=True)


def _flag_order(v: object) -> tuple:
    """Numbers in order, then words ("-" first)."""
    return (0, v, "") if isinstance(v, int) else (1, 0, str(v))


def next_sweeps(path: str = SWEEPS, first: int = 8,
                replays: list[tuple[SweptGraph, Replay]] | None = None) -> list[str]:
    """Per recorded sweep (its shape and form), the ``examples/gemv_sweep.py`` command that times
    what the tuner's first ``first`` timings of its tilings ask for and no sweep of them timed
    (:func:`unswept`): the product of the values those configurations take, so its ``--json``,
    recorded with ``--add-sweep``, lets the replay answer them. Empty when nothing is missing.
    ``replays``: the record's tilings already replayed (:func:`replayed`)."""
    asked: dict[tuple, dict[str, set]] = {}
    for g, r in replays if replays is not None else replayed(path):
        missing = unswept(g, first, r)
        if not missing:
            continue
        kg = graph_from_json(g.graph)
        (op,) = [o for o in kg.ops if o.kind == "graph_defined"]
        bg = op.attrs["block"]
        form, shape = g.sweep.rsplit(" ", 1)
        _, k, n = (int(v) for v in shape.split("x"))
        key = (form, shape, g.timing, kg.inputs[0].dtype)
        want = asked.setdefault(key, {f: set() for f in ("cols", "steps", "splits", "chunks", "subs", "combines",
                                                         "staging", "small-mm", "warps", "stages")})
        want["cols"].add(n // bg.grid[0])
        want["steps"].add(k // bg.forloop)
        for c in missing:
            for f, v in (("splits", c.split), ("chunks", c.chunk), ("subs", sub_text(c.sub) or "-"),
                         ("combines", c.combine), ("staging", "A" if c.stage_all_loads else "-"),
                         ("small-mm", c.small_mm), ("warps", c.num_warps), ("stages", c.num_stages)):
                want[f].add(v)
    out = []
    for (form, shape, timing, dtype), want in sorted(asked.items()):
        how = f"--gated {form.split()[1]}" if form.startswith("gated ") else f"--form {form}"
        flags = " ".join(f"--{f} {' '.join(str(v) for v in sorted(vals, key=_flag_order))}"
                         for f, vals in want.items())
        out.append(f"python examples/gemv_sweep.py {how} --timing {timing} --dtype {dtype} --shapes {shape} {flags} "
                   f"--json {form.replace(' ', '_')}_{shape}.json")
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m lower.calibration [--add DATE RESULTS… [--run LABEL]]``: print the agreements,
    the tuner's order replayed on each swept tiling and the sweeps that would answer what the
    replays could not (:func:`next_sweeps`); with ``--add``, first record the timed candidates of
    re-ranking results files."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lower.calibration", description=main.__doc__)
    ap.add_argument("--add", nargs="+", metavar=("DATE", "RESULTS"),
                    help="ISO date of the run, then *.gpu.mug.json results files to record")
    ap.add_argument("--add-sweep", nargs="+", metavar=("DATE", "SWEEP"),
                    help="ISO date of the run, then examples/gemv_sweep.py --json files to record")
    ap.add_argument("--run", default="", metavar="LABEL",
                    help="with --add or --add-sweep: which run of that day (e.g. the commit), so runs are "
                         "compared apart")
    a = ap.parse_args(argv)
    if a.run and not (a.add or a.add_sweep):
        ap.error("--run labels the timings --add or --add-sweep records: give one of them too")
    for given, what in ((a.add, "--add"), (a.add_sweep, "--add-sweep")):
        if given and len(given) < 2:
            ap.error(f"{what} takes a date and at least one file")
    if a.add:
        print(f"recorded {record_candidates(a.add[1:], a.add[0], run=a.run)} candidate timings in {CANDIDATES}")
    if a.add_sweep:
        print(f"recorded {record_sweep(a.add_sweep[1:], a.add_sweep[0], run=a.run)} swept tilings in {SWEEPS}")
    ag = agreement()
    print(f"configs of the reference μGraphs ({DATA}): Spearman {ag.spearman_all:.2f} over all, "
          f"median {ag.median_within:.2f} within one μGraph, regret ≤ {max(ag.regret.values()):.0%}")
    sa = structure_agreement()
    print(f"\ncandidates of different structures ({CANDIDATES}): model at the timed configs, μs")
    for k, v in sorted(sa.rows.items()):
        w = sa.window.get(k)
        print(f"{k[0]:<32} {k[1]:<12} {k[2]} {k[3]:<8} Spearman {sa.spearman[k]:5.2f}  regret {sa.regret[k]:5.0%}"
              + ("" if w is None else f"  fastest at {w:.2f}x the best plan prediction"))
        for r in sorted(v, key=lambda r: r.measured):
            note = "  (hand-written reference)" if r.reference else ""
            print(f"    measured {r.measured * 1e6:7.1f}  predicted {r.model * 1e6:7.1f}  "
                  f"ratio {r.measured / r.model:5.2f}  {r.structure}{note}")
    sw = sweep_agreement()
    print(f"\nswept one-row projections ({SWEEPS}): every tiling and config of a shape ranked together")
    for k, v in sorted(sw.rows.items()):
        fav = min(v)
        print(f"{k[3]:<32} {k[0]:<12} {k[1]} {k[2]:<8} {len(v):4d} configs  Spearman {sw.spearman[k]:5.2f}  "
              f"regret {sw.regret[k]:5.0%}  (favourite {fav[2]}: {fav[1] * 1e6:.2f} μs, fastest "
              f"{min(t for _, t, _ in v) * 1e6:.2f})")
    print("\nthe tuner's order replayed on each swept tiling, its sweeps merged (lower.replay): its best after 2, 4, "
          "6, 8 timings over the tiling's fastest; timings on configurations no sweep timed find nothing")
    replays = replayed()
    for g, r in replays:
        missing = [c.label() for c in unswept(g, 8, r)]
        print(f"{g.sweep:<32} {kernel_structure(graph_from_json(g.graph)):<8} {g.date} {g.run:<8} "
              + " ".join(f"{r.best_after(n):5.2f}" for n in (2, 4, 6, 8))
              + (f"  not swept: {', '.join(missing)}" if missing else ""))
    commands = next_sweeps(replays=replays)
    if commands:
        print("\nwhat the replays ask for and no sweep timed, as sweeps to run on the card "
              "(then --add-sweep DATE FILE --run LABEL):")
        for cmd in commands:
            print(f"    {cmd}")


if __name__ == "__main__":
    main()
