"""The main job until ``superoptimize`` lands: build the six benchmark programs,
check they are Lax, evaluate each hand-written reference μGraph against its
program under the float64 interpreter, and save/draw the μGraphs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .core.benchmarks import PROGRAMS, program, reference
from .core.interpreter import evaluate
from .core.ir import KernelGraph
from .core.lax import check_lax
from .core.progress import Progress
from .core.render import render
from .core.serialize import save


@dataclass
class DemoRow:
    name: str
    kernels: int
    blocks: str
    rel_error: float
    program_s: float
    graph_s: float


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _block_summary(g: KernelGraph) -> str:
    return " + ".join(f"{op.attrs['block'].grid}x{op.attrs['block'].forloop}"
                      for op in g.ops if op.kind == "graph_defined")


def run_demo(b: int = 1, small: bool = False, out_dir: str | Path | None = None, seed: int = 0,
             progress: bool = True) -> list[DemoRow]:
    rng = np.random.default_rng(seed)
    rows = []
    out = Path(out_dir) if out_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    with Progress("benchmarks", unit="benchmark", enabled=progress, leave=False) as bar:
        for name in bar.iterate(PROGRAMS):
            p, g = program(name, b=b, small=small), reference(name, b=b, small=small)
            check_lax(p)
            check_lax(g)
            inputs = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
            t0 = time.perf_counter()
            (ref,) = evaluate(p, inputs)
            t1 = time.perf_counter()
            (got,) = evaluate(g, inputs)
            t2 = time.perf_counter()
            rows.append(DemoRow(name, g.num_kernels, _block_summary(g), _rel(got, ref), t1 - t0, t2 - t1))
            if out:
                save(p, out / f"{name}.program.json")
                save(g, out / f"{name}.mugraph.json")
                try:
                    render(g, out / f"{name}.png")
                except Exception:  # no Graphviz 'dot' here: the .dot text still helps
                    render(g, out / f"{name}.dot")
    return rows


def format_rows(rows: list[DemoRow]) -> str:
    head = f"{'benchmark':16} {'kernels':>7}  {'grid x forloop':32} {'rel.err':>9} {'program':>9} {'μGraph':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.name:16} {r.kernels:7d}  {r.blocks:32} {r.rel_error:9.1e} "
                     f"{r.program_s * 1e3:7.0f}ms {r.graph_s * 1e3:7.0f}ms")
    return "\n".join(lines)
