"""The tuner's order replayed against recorded times (``lower.replay``): no GPU, the tuner's
own first round, climb and sweeps, each timing answered from a sweep's record."""

from __future__ import annotations

import os
import sys

import pytest

from lower.calibration import swept_graphs
from lower.cost_model import H200, for_timing, params_for
from lower.replay import replay
from mugraph.core.serialize import graph_from_json
from mugraph.core.text import kernel_structure

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gemv_sweep import gemv  # noqa: E402


def test_the_tuner_reaches_the_down_projections_fastest_within_six_timings():
    """Phi-3-mini's down projection, one row, 96 programs of 32 columns (H200 from DRAM, 2026-12-01):
    the order times the unsplit 1,024-deep form first (19.0 μs, 1.26× the fastest), its CUDA-core
    sibling, a re-chunked sub-tiled split-K 2 and its combine sibling, and reaches split-K 4
    (15.4, within 3 % of the fastest) at the fifth timing. In a decode step's pieces a tuning's
    share often ends before that (docs/results.md, "Chunks, sub-tiles and rounds"): an order
    that needs more is a regression."""
    (g,) = [g for g in swept_graphs() if g.sweep == "residual 1x8192x3072"
            and kernel_structure(graph_from_json(g.graph)) == "96x64"]
    r = replay(graph_from_json(g.graph), g.seconds, for_timing(params_for(g.device), g.timing))
    assert r.reached(1.03) is not None and r.reached(1.03) <= 6, r.timed[:8]
    assert r.best_after(2) > 1.2  # the first two are the re-chunked forms the model still favours


def test_a_configuration_not_recorded_is_a_timing_that_finds_nothing():
    """Unrecorded configurations count as timings spent (None), as a compile failure would; the
    recorded ones are answered with their times, and the replay stops after ``most`` timings."""
    kg = gemv(1, 1024, 512, 32, 64, "residual", "bfloat16")
    dram = for_timing(H200, "dram")
    blind = replay(kg, {"w4s3": 5e-6}, dram, most=10)
    assert len(blind.timed) == 10 and all(t is None for _, t in blind.timed)  # w4s3 is not among its first ten
    first, sixth = blind.timed[0][0], blind.timed[5][0]
    r = replay(kg, {first: 6e-6, sixth: 4e-6, "w4s3": 5e-6}, dram, most=10)
    assert r.timed[0] == (first, 6e-6) and r.fastest == 4e-6
    assert r.best_after(1) == 1.5 and r.best_after(0) == float("inf")
    assert r.reached(1.0) == 1 + [label for label, _ in r.timed].index(sixth)
    with pytest.raises(ValueError, match="a replay needs one kernel and at least one time"):
        replay(kg, {}, dram)
