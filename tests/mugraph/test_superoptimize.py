"""superoptimize end to end on the CPU: search → verify → float check → lower →
run the generated Triton under the interpreter, checked against float64."""

import time

import numpy as np
import pytest
import torch

import mugraph as mg
from mugraph.benchmarks import program

# Small generic search spaces (no benchmark-specific hints: op limits, one tile size, one loop range).
CASES = {
    "gated_mlp": {"max_kernel_ops": 1, "max_block_ops": 6},
    "lora": {"max_kernel_ops": 1, "max_block_ops": 5},
    "rmsnorm_matmul": {"max_kernel_ops": 1, "max_block_ops": 9, "max_results": 1},
}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _cfg(extra):
    return {"search": {"workers": 1, "time_limit": 120, "forloop_ranges": [4], "tile_sizes": [64],
                       "max_results": 2, **extra}}


@pytest.mark.parametrize("name", list(CASES))
def test_end_to_end(tmp_path, name):
    p = program(name, small=True, dtype="float32")
    opt = mg.superoptimize(p, _cfg(CASES[name]), device="cpu", cache_dir=tmp_path, progress=False)
    assert opt.best.origin == "search" and opt.best.num_kernels == 1, opt.summary()
    assert any(op.kind == "graph_defined" for op in opt.graph.ops)
    assert opt.report["error_bound"] <= 2.0 ** -40
    assert "the chosen μGraph:" in opt.summary() and "NOT MET" not in opt.summary()
    assert "cost model" in opt.report["why"]
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(t.shape, generator=gen) for t in p.inputs]
    (ref,) = mg.evaluate(p, {t.name: x.double().numpy() for t, x in zip(p.inputs, xs)})
    y = opt(*xs)
    assert np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref) <= 1e-4
    assert "@triton.jit" in opt.triton_source()

    # the second call is served from the cache, at once
    t0 = time.perf_counter()
    again = mg.superoptimize(p, _cfg(CASES[name]), device="cpu", cache_dir=tmp_path, progress=False)
    assert time.perf_counter() - t0 < 2.0
    assert str(again.graph) == str(opt.graph)

    # save / load restores without searching; the source is regenerated, never read from the file
    path = opt.save(tmp_path / "opt.json")
    back = mg.load(path)
    assert isinstance(back, mg.Optimized) and str(back.graph) == str(opt.graph)
    np.testing.assert_allclose(back(*xs).numpy(), y.numpy(), rtol=1e-6, atol=1e-6)


def test_wrong_inputs_at_call_time(tmp_path):
    p = program("lora", small=True, dtype="float32")
    opt = mg.superoptimize(p, _cfg(CASES["lora"]), device="cpu", cache_dir=tmp_path, progress=False)
    xs = [torch.randn(t.shape) for t in p.inputs]
    with pytest.raises(mg.InputError, match="input 'X' has shape"):
        opt(torch.randn(3, 3), *xs[1:])
    with pytest.raises(mg.InputError, match="dtype"):
        opt(*[x.double() for x in xs])


def test_a_chosen_graph_whose_bound_was_not_met_is_warned_about(caplog):
    """The search accepts a candidate whose field tests all passed even when the per-test
    bound cannot reach the target (silu inside a long reduction): the user is told, in one
    line, that its verification is evidence rather than a proof at that level."""
    import verify
    from mugraph.pipeline.optimize import _warn_if_unproven
    from mugraph.pipeline.results import Candidate

    p = mg.Program("silu_mlp")
    X = p.input("X", (4, 8), "float16")
    W1 = p.input("W1", (8, 4096), "float16")
    W2 = p.input("W2", (4096, 8), "float16")
    p.output(mg.silu(X @ W1) @ W2)
    weak = verify.equivalent(p, p, seed=0, max_tests=2, float_check=False)
    with caplog.at_level("WARNING", logger="mugraph"):
        _warn_if_unproven(p, Candidate(p, "search", verified=weak.to_json()), 2.0 ** -40)
    (rec,) = caplog.records
    assert "silu_mlp" in rec.getMessage() and "not a proof" in rec.getMessage()
    caplog.clear()
    strong = verify.equivalent(program("lora", small=True), program("lora", small=True), seed=0, float_check=False)
    with caplog.at_level("WARNING", logger="mugraph"):
        _warn_if_unproven(p, Candidate(p, "search", verified=strong.to_json()), 2.0 ** -40)
        _warn_if_unproven(p, Candidate(p, "program"), 2.0 ** -40)
    assert not caplog.records


def test_an_unproven_graph_is_set_aside_when_a_proven_one_exists():
    """A candidate whose tests passed but whose bound missed the target is not shipped when
    another searched μGraph is proven, however fast it is; with none proven it stays."""
    import verify
    from mugraph.pipeline.optimize import _set_aside_unproven
    from mugraph.pipeline.results import Candidate

    lora = program("lora", small=True)
    strong = verify.equivalent(lora, lora, seed=0, float_check=False).to_json()
    weak = verify.equivalent(lora, lora, seed=0, max_tests=1, float_check=False)
    assert not weak.bound_met
    guess, proof, prog = (Candidate(lora, "search", verified=weak.to_json()),
                          Candidate(lora, "search", verified=strong), Candidate(lora, "program"))
    _set_aside_unproven([guess, proof, prog])
    assert "not proven" in guess.rejected and not proof.rejected and not prog.rejected
    alone = Candidate(lora, "search", verified=weak.to_json())
    _set_aside_unproven([alone, Candidate(lora, "program")])
    assert not alone.rejected


def test_the_search_prices_its_split_variants_with_the_lowering(monkeypatch):
    """superoptimize hands the search the lowering's cost model at its best predicted
    configs — the price the verified candidates are ranked by afterwards."""
    import search
    from mugraph.benchmarks import reference
    from mugraph.pipeline import optimize
    from mugraph.pipeline.timing import predict_tuned

    seen = {}

    def spy(program, cfg, estimate=None):
        seen["estimate"] = estimate
        raise KeyboardInterrupt  # stop before any search: nothing was verified

    monkeypatch.setattr(search, "run", spy)
    with pytest.raises((KeyboardInterrupt, mg.pipeline.Interrupted)):
        mg.superoptimize(program("gqa", 1, small=True), device="cpu", cache_dir=False, progress=False)
    est = seen["estimate"]
    g = reference("gqa", small=True)
    assert est is optimize._lowered_estimate and est(g) == predict_tuned(g).predicted_s > 0
