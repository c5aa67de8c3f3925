"""A program's serial chain (a round trip, then its loop steps one after another) is paid once
per round of programs an SM runs: when a grid has more programs than the SMs hold at once,
the next round starts only as the last one ends. Measured on an H200 from DRAM
(``examples/gemv_sweep.py --form norm|residual --timing dram``, bf16, docs/results.md, "Chunks,
sub-tiles and rounds"): one row's RMSNorm fused into a 3072 × 9216 projection, in 1,152
programs of 8 columns (several rounds an SM), ran 46-83 μs, where 72
programs of 128 columns split four ways ran 17.7; the model, charging the chain once, priced
the first at 16.2 μs and ranked it above the second. CPU only: prices, nothing run."""

from __future__ import annotations

from lower.config import KernelConfig
from lower.cost_model import H200, breakdown, estimate, for_timing
from mugraph.core.benchmarks.handwritten import gemv

DRAM = for_timing(H200, "dram")


def _price(k: int, n: int, cols: int, steps: int, form: str, label: str) -> float:
    kg = gemv(1, k, n, cols, steps, form, "bfloat16")
    op = next(o.id for o in kg.ops if o.kind == "graph_defined")
    return estimate(kg, DRAM, {op: KernelConfig.from_label(label)})


def test_many_small_programs_pay_their_chain_each_round():
    """The fused norm in 8-column programs (measured 48.1 μs) is priced above 128-column
    programs split four ways (17.7 μs); so is the down projection's split-K 8 with its
    loop re-chunked to one step a program (29.7 against 15.4 for split-K 4 unchunked)."""
    assert _price(3072, 9216, 64, 64, "norm", "w4s3c8p2:8") > _price(3072, 9216, 128, 64, "norm", "w4s3k4L")
    assert _price(8192, 3072, 32, 128, "residual", "w4s3c8k8L") > _price(8192, 3072, 32, 128, "residual", "w4s3k4L")


def test_a_grid_of_one_round_is_priced_as_before():
    """96 programs on 132 SMs run in one round: the chain is charged once, as it always was —
    round trip plus the 64 steps, each its latency over the stages kept ahead plus its transfer."""
    kg = gemv(1, 8192, 3072, 32, 128, "residual", "bfloat16")
    op = next(o.id for o in kg.ops if o.kind == "graph_defined")
    (k,) = breakdown(kg, DRAM, {op: KernelConfig.from_label("w4s3")}).launches
    step_bytes = 128 * 32 * 2 + 128 * 2
    one_round = DRAM.mem_latency + 64 * (DRAM.iter_latency / 2 + step_bytes / DRAM.sm_bw)
    assert abs(k.t_serial - one_round) < 1e-3 * one_round
