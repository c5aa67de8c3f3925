"""superoptimize end to end on the CPU: search → verify → float check → lower →
run the generated Triton under the interpreter, checked against float64."""

import time

import numpy as np
import pytest
import torch

import mugraph as mg
from mugraph.core.benchmarks import program

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
    """With ``allow_unproven`` a candidate whose field tests all passed but whose bound
    missed the target may ship: the user is told, in one line, that its verification is
    evidence rather than a proof at that level."""
    import verify
    from mugraph.pipeline.optimize import _warn_if_unproven
    from mugraph.pipeline.results import Candidate

    lora = program("lora", small=True)
    weak = verify.equivalent(lora, lora, seed=0, max_tests=1, float_check=False)
    assert not weak.bound_met
    with caplog.at_level("WARNING", logger="mugraph"):
        _warn_if_unproven(lora, Candidate(lora, "search", verified=weak.to_json()), 2.0 ** -40)
    (rec,) = caplog.records
    assert lora.name in rec.getMessage() and "not a proof" in rec.getMessage()
    caplog.clear()
    strong = verify.equivalent(lora, lora, seed=0, float_check=False)
    with caplog.at_level("WARNING", logger="mugraph"):
        _warn_if_unproven(lora, Candidate(lora, "search", verified=strong.to_json()), 2.0 ** -40)
        _warn_if_unproven(lora, Candidate(lora, "program"), 2.0 ** -40)
    assert not caplog.records


def test_an_unproven_graph_is_never_shipped_by_default():
    """A candidate whose tests passed but whose bound missed the target is set aside, alone
    or beside a proven one; with ``allow_unproven`` it is set aside only beside a proven one."""
    import verify
    from mugraph.pipeline.optimize import OptimizeConfig, _set_aside_unproven
    from mugraph.pipeline.results import Candidate

    lora = program("lora", small=True)
    strong = verify.equivalent(lora, lora, seed=0, float_check=False).to_json()
    weak = verify.equivalent(lora, lora, seed=0, max_tests=1, float_check=False).to_json()

    def cands():
        return (Candidate(lora, "search", verified=weak), Candidate(lora, "search", verified=strong),
                Candidate(lora, "program"))

    for cfg in (OptimizeConfig(), OptimizeConfig(allow_unproven=True)):
        guess, proof, prog = cands()
        assert _set_aside_unproven([guess, proof, prog], cfg) == [guess]
        assert "not proven" in guess.rejected and not proof.rejected and not prog.rejected
    alone, prog = cands()[0], Candidate(lora, "program")
    assert _set_aside_unproven([alone, prog], OptimizeConfig()) == [alone]
    assert "bound" in alone.rejected and "allow_unproven=True" in alone.rejected and not prog.rejected
    alone = cands()[0]
    assert _set_aside_unproven([alone, Candidate(lora, "program")], OptimizeConfig(allow_unproven=True)) == []
    assert not alone.rejected


def _unproven_search(monkeypatch):
    """The real search, with every verdict it returns marked unproven (bound 1), as the
    verifier reports a μGraph whose bound it cannot bring under the target."""
    import mugraph.pipeline.optimize as optimize

    real = optimize._search

    def weakened(*a, **kw):
        import dataclasses

        found = real(*a, **kw)
        found.found = [dataclasses.replace(f, verdict={**f.verdict, "bound_met": False, "error_bound": 1.0,
                                                        "per_test_bound": 1.0}) for f in found.found]
        return found
    monkeypatch.setattr(optimize, "_search", weakened)


def test_superoptimize_returns_the_program_when_no_candidate_is_proven(monkeypatch, caplog):
    """End to end: every searched μGraph unproven → the program ships, the report lists the
    faster ones set aside with their bounds; allow_unproven restores the old choice with a
    warning."""
    _unproven_search(monkeypatch)
    p = program("lora", small=True, dtype="float32")
    opt = mg.superoptimize(p, _cfg(CASES["lora"]), device="cpu", cache_dir=False, progress=False)
    assert opt.best.origin == "program", opt.summary()
    aside = opt.report["set_aside"]
    assert aside and all(a["error_bound"] == 1.0 and "not proven" in a["why"] for a in aside)
    assert any(a["faster_than_answer"] for a in aside)
    assert "set aside" in opt.report["why"]
    with caplog.at_level("WARNING", logger="mugraph"):
        opt = mg.superoptimize(p, {**_cfg(CASES["lora"]), "allow_unproven": True}, device="cpu", cache_dir=False,
                               progress=False)
    assert opt.best.origin == "search"
    assert any("not a proof" in r.getMessage() for r in caplog.records)


def test_the_report_says_where_the_time_went(tmp_path):
    """``report["phases"]``: seconds per phase, within the call's wall time; the budget is
    time_limit + SLACK_S on a CPU (no GPU tuning)."""
    from mugraph.pipeline.optimize import SLACK_S

    p = program("lora", small=True, dtype="float32")
    opt = mg.superoptimize(p, _cfg(CASES["lora"]), device="cpu", cache_dir=False, progress=False)
    ph = opt.report["phases"]
    assert set(ph) >= {"search", "check"} and all(v >= 0 for v in ph.values())
    assert sum(ph.values()) <= opt.report["total_s"] + 1e-6
    assert opt.report["budget_s"] == 120 + SLACK_S and opt.report["overran"] is None


def test_a_short_call_gets_a_short_slack():
    """The slack past ``time_limit + tune_s`` is SLACK_S for a long call and half the limits
    for a short one (at least MIN_SLACK_S): a model's pieces, cut to shares of one graph
    budget, do not each add 30 s to it."""
    from mugraph.pipeline.optimize import MIN_SLACK_S, SLACK_S, slack_s

    assert slack_s(300.0, 240.0) == SLACK_S and slack_s(60.0, 0.0) == SLACK_S
    assert slack_s(13.0, 13.0) == 13.0 and slack_s(2.0, 2.0) == MIN_SLACK_S
    assert all(slack_s(t, t) <= slack_s(t + 1, t + 1) for t in range(1, 60))  # never shrinks with the limits


def test_the_search_prices_its_split_variants_with_the_lowering(monkeypatch):
    """superoptimize hands the search the lowering's cost model at its best predicted
    configs — the price the verified candidates are ranked by afterwards."""
    import search
    from mugraph.core.benchmarks import reference
    from mugraph.pipeline import optimize
    from mugraph.pipeline.timing import predict_tuned

    seen = {}

    def spy(program, cfg, estimate=None, seeds=(), checker=None):
        seen["estimate"] = estimate
        raise KeyboardInterrupt  # stop before any search: nothing was verified

    monkeypatch.setattr(search, "run", spy)
    with pytest.raises((KeyboardInterrupt, mg.pipeline.Interrupted)):
        mg.superoptimize(program("gqa", 1, small=True), device="cpu", cache_dir=False, progress=False)
    est = seen["estimate"]
    g = reference("gqa", small=True)
    assert est is optimize._lowered_estimate and est(g) == predict_tuned(g).predicted_s > 0


def test_the_program_alone_is_priced_not_checked_when_the_caller_runs_its_own_ops():
    """``time_program=False`` (the torch.compile backend with ``unfused="torch"``): a
    search that verifies nothing returns the program priced by the cost model, its float
    check skipped; by default the program is float-checked as before."""
    p = program("lora", small=True, dtype="float32")
    nothing = {"search": {"workers": 1, "time_limit": 20, "forloop_ranges": [4], "tile_sizes": [64],
                          "max_kernel_ops": 1, "max_block_ops": 1}}
    checked = mg.superoptimize(p, nothing, device="cpu", cache_dir=False, progress=False)
    alone = mg.superoptimize(p, {**nothing, "time_program": False}, device="cpu", cache_dir=False,
                             progress=False)
    for opt in (checked, alone):
        assert opt.best.origin == "program" and opt.best.predicted_s > 0
    assert checked.best.float_ok and checked.best.float_summary
    assert alone.best.float_summary == "" and "time_program=False" in alone.report["why"]
    x = {t.name: torch.randn(t.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).float()
         for t in p.inputs}
    ref = mg.evaluate(p, {k: v.double() for k, v in x.items()})[0]
    assert torch.allclose(alone(**x).double(), ref, rtol=1e-4, atol=1e-4)  # still the program, lowered
    with pytest.raises(mg.ConfigError, match="time_program"):
        mg.OptimizeConfig(time_program="no")


def test_a_caller_running_its_own_ops_gets_the_fastest_mugraph_and_no_program_timing(monkeypatch):
    """``time_program=False`` on a GPU (the re-ranking pretended): only the μGraphs are timed —
    the caller times its own ops against the answer — and the fastest of them is the answer
    even where the lowered program would have timed faster; when none runs on the card the
    program is the answer, as priced. By default the program is timed with them."""
    from mugraph.core.benchmarks import reference
    from mugraph.pipeline import optimize
    from mugraph.pipeline.results import Candidate

    p = program("lora", small=True, dtype="float32")
    g = reference("lora", small=True)
    handed = []

    def fake_time_on_gpu(program_, alive, *a, **k):
        handed.append([c.origin for c in alive])
        runs = [c for c in alive if c.predicted_s is not None and c.predicted_s < 1.0]
        if not runs:
            raise mg.MugraphError("superoptimize: no candidate runs on this GPU: out of resources")
        for c in runs:
            c.measured_s = c.predicted_s
        best = min(runs, key=lambda c: c.measured_s)
        return best, "fastest (pretend)"
    monkeypatch.setattr(optimize, "time_on_gpu", fake_time_on_gpu)

    def alive(mu_s: float):
        return [Candidate(p, "program", predicted_s=1e-6), Candidate(g, "search", predicted_s=mu_s)]
    own = optimize.OptimizeConfig(time_program=False)
    best, why = optimize._timed_on_gpu(p, alive(5e-6), own, None)
    assert handed[-1] == ["search"] and best.origin == "search" and "time_program=False" in why
    best, why = optimize._timed_on_gpu(p, alive(5e-6), optimize.OptimizeConfig(), None)
    assert handed[-1] == ["program", "search"] and best.origin == "program"  # timed, and faster
    best, why = optimize._timed_on_gpu(p, alive(5.0), own, None)  # the μGraph does not run
    assert best.origin == "program" and best.measured_s is None and "no candidate runs" in why
    with pytest.raises(mg.MugraphError, match="no candidate runs"):
        optimize._timed_on_gpu(p, [Candidate(g, "search", predicted_s=5.0)], own, None)


def test_stop_by_cuts_the_checks_and_tuning_not_the_search_or_the_key(tmp_path):
    """``stop_by`` (a shared wall-clock budget: the backend's graph clock) cuts the call's
    budget to end by then — never below the search's time limit and the least slack — and
    is not part of the cache key: the answer stored under these limits is found again
    without it."""
    from mugraph.pipeline.optimize import MIN_SLACK_S, slack_s

    p = program("lora", small=True, dtype="float32")
    cfg = {"search": {"workers": 1, "time_limit": 20, "forloop_ranges": [4], "tile_sizes": [64],
                      "max_kernel_ops": 1, "max_block_ops": 1}, "time_program": False}
    t0 = time.time()
    cut = mg.superoptimize(p, cfg, device="cpu", cache_dir=tmp_path, progress=False, stop_by=t0 + 22)
    assert 20 + MIN_SLACK_S - 0.5 <= cut.report["budget_s"] <= 20 + MIN_SLACK_S + 0.5  # 20 s + the least slack
    assert cut.report["cut_to_s"] == cut.report["budget_s"] < 20 + slack_s(20, 0)
    again = mg.superoptimize(p, cfg, device="cpu", cache_dir=tmp_path, progress=False)
    assert again.report["cut_to_s"] == cut.report["cut_to_s"]  # served from the cache
    free = mg.superoptimize(p, cfg, device="cpu", cache_dir=False, progress=False, stop_by=time.time() + 600)
    assert free.report["budget_s"] == pytest.approx(20 + slack_s(20, 0))  # a far stop changes nothing
    assert free.report["cut_to_s"] is None
    for bad in ("soon", True, float("nan")):
        with pytest.raises(mg.ConfigError, match="stop_by"):
            mg.superoptimize(p, cfg, device="cpu", cache_dir=False, progress=False, stop_by=bad)


def test_a_float_check_out_of_gpu_memory_rejects_that_candidate_only(monkeypatch):
    """A candidate whose float check does not fit the GPU's memory (an 8k-token causal prompt's
    scores, evaluated whole, on an H200) is rejected with the reason in one line; the call goes
    on and ships what is left — here the program — instead of ending in a traceback."""
    import json
    from pathlib import Path

    import verify
    from mugraph.core.benchmarks.programs import decode_attention
    from mugraph.core.serialize import graph_from_json, graph_to_json
    from mugraph.pipeline import optimize as opt_mod
    from search.driver import SearchResult
    from search.records import Found

    prog = decode_attention(b=1, heads=8, kv_heads=2, kv=256, head_dim=32, safe=True, dtype="float16")
    g = graph_from_json(json.loads((Path(__file__).parents[1] / "search" / "data" / "decode_online_kv256.json")
                                   .read_text()))
    verdict = verify.equivalent(prog, g).to_json()
    monkeypatch.setattr(opt_mod, "_search", lambda p, scfg, own, seeds, est, checker=None: SearchResult(
        p.name, [Found(graph_to_json(g), "enumeration", verdict)], {"complete": True}))
    real = verify.float_check

    def float_check(program, candidate, **kw):
        if candidate is not program:  # the searched candidate
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return real(program, candidate, **kw)
    monkeypatch.setattr(verify, "float_check", float_check)
    opt = mg.superoptimize(prog, {"search": {"time_limit": 5, "workers": 1}}, device="cpu", cache_dir=False,
                           progress=False)
    (searched,) = [c for c in opt.candidates if c.origin == "search"]
    assert searched.rejected.startswith("float check: out of GPU memory (CUDA out of memory.")
    assert opt.best.origin == "program"


def test_the_program_with_its_elementwise_runs_fused_is_a_candidate():
    """Where the program itself would run (``time_program``, the default), the search also
    offers it with each run of element-wise ops as one kernel — the gated MLP's GeLU-tanh and
    product beside its two matmuls, 3 kernels against the program's 13 — verified like any
    candidate; the backend's pieces (``time_program=False``: torch runs the program) are not
    offered it."""
    from mugraph.core.benchmarks import programs as bench

    p = bench.gated_mlp(hidden=32, out=48, act="gelu_tanh", rows=8)
    search_cfg = {"time_limit": 4, "executor": "serial", "compose": False, "max_kernel_ops": 1}
    opt = mg.superoptimize(p, {"search": search_cfg}, device="cpu", cache_dir=False, progress=False)
    fused = [c for c in opt.candidates if c.found_by == "pointwise runs"]
    assert len(fused) == 1 and fused[0].proven and fused[0].num_kernels == 3
    program = next(c for c in opt.candidates if c.origin == "program")
    assert program.num_kernels == 13 and fused[0].predicted_s < program.predicted_s
    assert opt.report["search"]["stats"]["derived"]["pointwise_runs"] is True
    quiet = mg.superoptimize(p, {"search": search_cfg, "time_program": False}, device="cpu", cache_dir=False,
                             progress=False)
    assert not any(c.found_by == "pointwise runs" for c in quiet.candidates)
    assert "pointwise_runs" not in quiet.report["search"]["stats"]["derived"]
