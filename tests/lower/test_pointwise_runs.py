"""The program with its element-wise runs fused (``search.compose.pointwise_runs``), lowered:
the gated MLP's two library matmuls and one kernel of its GeLU-tanh and product, run under
Triton's interpreter, against the program in float64."""

import numpy as np
import pytest
import torch

import lower
import mugraph as mg
from mugraph.core.benchmarks import programs as bench
from search.compose import pointwise_runs


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_the_fused_program_runs_as_three_launches_and_matches_float64(act):
    p = bench.gated_mlp(hidden=64, out=96, act=act, rows=8, dtype="float32")
    g = pointwise_runs(p)
    fn = lower.compile(g, device="cpu")
    assert fn.triton_source().count("@triton.jit") == 1  # the matmuls are library calls
    rng = np.random.default_rng(0)
    x = {t.name: rng.standard_normal(t.shape) * 0.5 for t in p.inputs}
    want = np.asarray(mg.evaluate(p, x)[0], dtype=np.float64)
    got = fn(*[torch.tensor(v, dtype=torch.float32) for v in x.values()])
    got = (got[0] if isinstance(got, (list, tuple)) else got).double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
