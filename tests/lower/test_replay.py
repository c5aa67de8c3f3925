"""The tuner's order replayed against recorded times (``lower.replay``): no GPU, the tuner's
own first round, climb and sweeps, each timing answered from a sweep's record."""

from __future__ import annotations

import pytest

from lower.calibration import merged_tilings
from lower.cost_model import H200, for_timing
from lower.replay import replay
from mugraph.core.benchmarks.handwritten import gemv
from mugraph.core.serialize import graph_from_json
from mugraph.core.text import kernel_structure


def test_the_tuner_times_a_one_row_projections_near_fastest_config_within_two_timings():
    """Phi-3-mini's down and output projections, one row, each tiling swept (H200 from DRAM,
    2026-12-01). The model of 1197e49 led with unsplit 1,024-deep steps (19.0 μs on the down
    projection, 1.26× its fastest), whose tl.dot operands pass 255 registers a thread, and with
    their CUDA-core siblings; a decode step's pieces often stop a tuning after a few timings
    (docs/results.md, "Chunks, sub-tiles and rounds"). Counting the operands' registers, the
    first two timings of every tiling are within 7 % of its fastest, and the down projection's
    96 × 64 tiling (the layer's) reaches 4 % by its eighth (3.5 %: split-K 4 of 512-deep steps,
    15.6 μs, where the fastest, 4 stages deep, ran 15.0 and the tuner's first, split-K 8, 15.8;
    the tilings' sweeps of two runs merged, :func:`lower.calibration.merged_tilings`)."""
    graphs = [g for g in merged_tilings() if g.sweep.startswith("residual ")]
    assert len(graphs) == 4
    for g in graphs:
        r = replay(graph_from_json(g.graph), g.seconds, g.priced_as())
        assert r.best_after(2) <= 1.07, (g.sweep, r.timed[:4])
    (down,) = [g for g in graphs if g.sweep == "residual 1x8192x3072"
               and kernel_structure(graph_from_json(g.graph)) == "96x64"]
    r = replay(graph_from_json(down.graph), down.seconds, down.priced_as())
    assert r.best_after(8) <= 1.04, r.timed[:8]


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


def test_the_gated_projections_first_timing_is_its_fastest_config():
    """Phi-3-mini's gated projection (3072 → 2 × 8192 with SiLU·mul, one row, H200 from DRAM):
    its split factors are priced within 10 % of one another, and timed fullest wave first the
    first two timings of its 32- and 64-column tilings were 1.12× their fastest (split 6 and
    3 ways); the model's own pick, unsplit, leads now and is the fastest (25.4 μs)."""
    graphs = [g for g in merged_tilings() if g.sweep == "gated silu 1x3072x8192"
              and kernel_structure(graph_from_json(g.graph)) in ("256x48", "128x48")]
    assert len(graphs) == 2
    for g in graphs:
        r = replay(graph_from_json(g.graph), g.seconds, g.priced_as())
        assert r.best_after(1) <= 1.02, (kernel_structure(graph_from_json(g.graph)), r.timed[:3])
