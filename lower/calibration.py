"""How well the cost model ranks configurations the H100 actually timed.

``lower/data/h100_graph_timing.csv`` holds measurements of the reference μGraphs at
full shapes (``"graph"`` timing, ``lower.profile.TIMINGS``): every variant the tuner
timed in ``examples/bench_kernels.py`` runs, and the sweeps of
``examples/sweep_configs.py`` — one row per (benchmark, b, kernel configs); a
``sizes`` column names builder sizes of a variant μGraph (``col_tile=128``: a coarser
grid), so rows of different μGraphs of one benchmark are ranked separately. The
model is meant to *rank* (the tuner times its best few), so what matters is rank
agreement within one benchmark and how much slower the model's favourite is than
the measured best ("regret"). No GPU needed: predictions are recomputed here.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass

from mugraph.benchmarks import reference

from .config import KernelConfig
from .cost_model import H100, DeviceParams, estimate

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
