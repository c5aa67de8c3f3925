"""The benchmark table's reach columns (mugraph.pipeline.bench: structure, reach), its CSV,
the decode-shaped attention programs and their PyTorch baselines. No GPU, no search."""

import numpy as np
import pytest
import torch

import mugraph as mg
from mugraph.core.benchmarks import DECODE, program, reference
from mugraph.core.benchmarks.torch_versions import SDPA, TORCH, sdpa_call, sdpa_forms
from mugraph.core.errors import ConfigError
from mugraph.pipeline import bench
from mugraph.pipeline.results import Candidate
from mugraph.pipeline.timing import STRUCTURE_SPREAD, plan_rerank
from search.rewrite import split_loop, split_variants


def _single_attention(p, loop):
    """One kernel, one block per KV head, looping over the keys (what the enumeration finds)."""
    g = mg.KernelGraph(p.name)
    q, k, v = (g.input(t.name, t.shape, t.dtype) for t in p.inputs)
    blk = mg.BlockGraph((p.inputs[0].shape[0], 1, 1), loop)
    qt = blk.input(q, (0, None, None)); kt = blk.input(k, (0, None, None), 2); vt = blk.input(v, (0, None, None), 1)
    scale = next((op.attrs["c"] for op in p.ops if op.kind == "scale"), None)
    s = qt @ kt
    e = mg.exp(mg.scale(s, scale) if scale is not None else s)
    blk.output(blk.accum(e @ vt) / blk.accum(mg.sum(e, 2)), (0, None, None))
    g.output(g.kernel(blk)[0])
    return g


def _kernel_id(g):
    return next(op.id for op in g.ops if op.kind == "graph_defined")


def test_structure_names_blocks_and_loops():
    assert bench.structure(reference("gqa", 1)) == "32x4 + 8x16"
    assert bench.structure(reference("rmsnorm_matmul", 1)) == "96x64"
    assert bench.structure(program("gqa", 1, small=True)).startswith("lib")


def test_reach_levels_and_rank():
    ref = reference("gqa", 1)
    p = program("gqa", 1)
    single = _single_attention(p, 64)
    same = split_loop(single, _kernel_id(single), 16, combine_tiles=4)   # the reference's own shape
    other_tiles = split_loop(single, _kernel_id(single), 16)             # same loop split, combine untiled
    other_chunks = split_loop(single, _kernel_id(single), 32)            # a split-KV pair at 32 chunks
    assert bench.structure(same) == bench.structure(ref)

    def cands(*gs):  # predicted 1, 1.1, 1.2, … μs: within the re-ranking's spread
        return [Candidate(g, "search", predicted_s=(1 + i / 10) * 1e-6) for i, g in enumerate(gs)]

    assert bench.reach(ref, cands(single, other_chunks, same)) == ("same", 3, True)
    assert bench.reach(ref, cands(single, other_tiles)) == ("split", 2, True)
    assert bench.reach(ref, cands(single, other_chunks)) == ("kernels", 2, True)
    assert bench.reach(ref, cands(single)) == ("", None, False)
    # far behind the best, behind MIN_TIMED others of its kernel count: not timed
    many = [Candidate(_single_attention(p, loop), "search", predicted_s=1e-6 + i * 1e-9)
            for i, loop in enumerate((64, 32, 128, 256, 512))]
    late = Candidate(other_chunks, "search", predicted_s=10e-6)
    level, rank, timed = bench.reach(ref, [*many, late])
    assert (level, rank, timed) == ("kernels", 6, False)


def test_rows_are_written_to_csv_as_they_finish(tmp_path):
    sink = bench._CsvSink(tmp_path / "o" / "bench.csv")
    sink.write(bench.BenchRow("gqa", 1, 6.5, 7.0, reach="same", reach_rank=1))
    sink.write(bench.BenchRow("lora", 8, None, 2.0))
    lines = (tmp_path / "o" / "bench.csv").read_text().splitlines()
    assert lines[0].startswith("name,b,ours_us,predicted_us") and len(lines) == 3
    assert lines[1].startswith("gqa,1,6.5,7.0") and ",same,1," in lines[1]
    assert bench.format_row(bench.BenchRow("gqa", 1, 6.5, 7.0, ref_us=6.7, reach="same", reach_rank=1,
                                           reach_timed=True)).split()[:2] == ["gqa", "1"]


def test_bench_arguments_take_decode_programs_and_no_top_k():
    names, _ = bench.check_args(None, (1,), None, "graph", None, None)
    assert set(DECODE) <= set(names) and "gqa" in names
    with pytest.raises(ConfigError, match="unknown benchmark"):
        bench.check_args(["decode_nonexistent"], (1,), None, "graph", None, None)
    with pytest.raises(ConfigError, match="top_k=0"):
        bench.check_args(["gqa"], (1,), None, "graph", 0, None)


@pytest.mark.parametrize("name", sorted(DECODE))
def test_decode_programs_and_baselines_agree(name):
    p = program(name, 2, small=True)
    kvh = 2 * DECODE[name]["kv_heads"]
    assert p.inputs[0].shape == (kvh, DECODE[name]["heads"] // DECODE[name]["kv_heads"], 16)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(0, 0.5, t.shape) for t in p.inputs]
    ref = mg.evaluate(p, {t.name: x for t, x in zip(p.inputs, xs)})[0]
    ts = [torch.tensor(x) for x in xs]
    assert np.allclose(TORCH[name](*ts).numpy(), ref, rtol=1e-9)
    assert np.allclose(SDPA[name](*ts).numpy(), ref, rtol=1e-9)
    assert np.allclose(sdpa_call(name, *ts)().numpy(), ref, rtol=1e-9)
    with pytest.raises(ValueError, match="not a multiple"):
        program(name, 1, heads=6, kv_heads=4)


@pytest.mark.parametrize("name", sorted(DECODE))
def test_every_sdpa_form_of_a_decode_program_computes_it(name):
    """The baseline forms a caller writes (a KV head's rows, one row per query head with
    ``enable_gqa``, K and V repeated as ``repeat_kv``) all compute the program."""
    p = program(name, 2, small=True)
    rng = np.random.default_rng(2)
    xs = [rng.uniform(0, 0.5, t.shape) for t in p.inputs]
    ref = mg.evaluate(p, {t.name: x for t, x in zip(p.inputs, xs)})[0]
    forms = sdpa_forms(name, *[torch.tensor(x) for x in xs])
    assert set(forms) == {"rows", "gqa", "repeat_kv"}
    for form, call in forms.items():
        assert np.allclose(call().reshape(ref.shape).numpy(), ref, rtol=1e-9), form


def test_decode_split_kv_is_equivalent_and_ranked_first():
    """A decode program's one-block-per-KV-head kernel: its split-KV variants are equivalent
    (reduced shape) and, at the full shape, the best of them ranks first by the search's
    cost_key, and the lowering's model predicts it close enough to the single kernel (which
    it lowers with its own split-K) that the GPU re-ranking times both."""
    from mugraph.pipeline.timing import predict_tuned
    from search.check import Checker
    from search.enumerate import cost_key

    small = program("decode_h8_kv2_n2048_d64", 1, small=True)
    one = _single_attention(small, 4)
    vs = split_variants(one)
    assert vs and all(v.num_kernels == 2 for v in vs)
    ck = Checker(small)
    x = {t.name: np.random.default_rng(1).uniform(0, 0.5, t.shape) for t in small.inputs}
    want = mg.evaluate(small, x)[0]
    for v in vs:
        assert np.allclose(mg.evaluate(v, x)[0], want, rtol=1e-9) and ck.fingerprint_matches(v)
    full = program("decode_h32_kv8_n4096_d128", 1)
    one = _single_attention(full, 64)
    vs = split_variants(one)
    best = min(vs, key=cost_key)
    assert cost_key(best)[1] < cost_key(one)[1]
    a, b = (Candidate(g, "search", predicted_s=predict_tuned(g).predicted_s) for g in (one, best))
    assert b.predicted_s < STRUCTURE_SPREAD * a.predicted_s
    assert any(c is b for c, _ in plan_rerank([a, b], space=lambda g: 1).timed)


def test_row_tuning_shares_keep_a_row_within_its_budget():
    from mugraph.pipeline.timing import MIN_TUNE_S, TOTAL_TUNE_S

    ref = reference("gqa", 1)
    rerank, ref_s = bench.tuning_shares(0.0, ref)
    assert rerank == TOTAL_TUNE_S and MIN_TUNE_S <= ref_s <= (bench.ROW_S - bench.BASELINES_S) / 3
    rerank, ref_s = bench.tuning_shares(300.0, ref)  # a search that used its whole default limit
    assert 300 + rerank + ref_s + bench.BASELINES_S <= bench.ROW_S + 1e-9
    rerank, ref_s = bench.tuning_shares(10_000.0, ref)  # past the budget already: the minimum
    assert rerank == 2 * MIN_TUNE_S and ref_s == MIN_TUNE_S
    assert bench.tuning_shares(0.0)[1] is None  # no reference
    rerank, ref_s = bench.tuning_shares(60.0, ref, row_s=150.0)  # a shorter row budget
    assert 60 + rerank + ref_s + bench.BASELINES_S <= 150.0 + 1e-9
    with pytest.raises(mg.MugraphError, match="row_seconds"):
        bench.run_bench(["gqa"], (1,), row_seconds=0)


@pytest.mark.parametrize("name", ["gqa", "qknorm_gqa"])
def test_timed_sdpa_baseline_computes_the_program(name):
    """The timed SDPA call (K laid out once beforehand) computes what the program does."""
    p = program(name, 1, small=True)
    rng = np.random.default_rng(1)
    xs = [rng.uniform(0, 0.5, t.shape) for t in p.inputs]
    ref = mg.evaluate(p, {t.name: x for t, x in zip(p.inputs, xs)})[0]
    ts = [torch.tensor(x) for x in xs]
    assert np.allclose(sdpa_call(name, *ts)().numpy(), ref, rtol=1e-9)
    assert np.allclose(SDPA[name](*ts).numpy(), ref, rtol=1e-9)


def test_candidates_are_ranked_without_compiling_on_a_gpu_machine(monkeypatch):
    """Ranking before the GPU re-ranking is the cost model's alone: on a machine with CUDA
    nothing is compiled there (a configuration the card cannot hold once stopped a whole
    superoptimize call with Triton's OutOfResources)."""
    import sys

    from mugraph.pipeline.timing import predict_tuned
    lp = sys.modules["lower.profile"]  # (the package's `profile` attribute is the function)

    def refuse(*a, **k):
        raise AssertionError("compiled while ranking")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(lp, "_time", refuse)
    monkeypatch.setattr(lp, "lower_compile", refuse)
    res = predict_tuned(reference("gqa", 1, small=True))
    assert res.predicted_s > 0 and not res.measured


def test_a_rows_reference_is_saved_as_a_result_the_calibration_records(tmp_path, monkeypatch):
    """A bench row on a GPU saves its tuned reference beside the re-ranked result; that file
    loads as a result of one ``reference`` candidate, and ``python -m lower.calibration
    --add`` records it with the search's candidates (the structure the search should reach,
    measured, next to what it found)."""
    from lower import KernelConfig
    from lower.calibration import candidate_timings, record_candidates, structure_agreement
    from lower.profile import ProfileResult
    from mugraph.pipeline.results import load_result

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    ref = reference("gqa", 1, small=True)
    kids = [op.id for op in ref.ops if op.kind == "graph_defined"]
    tuned = ProfileResult(ref, {k: KernelConfig(num_warps=2) for k in kids}, 5.6e-6, 8.8e-6, True)
    path = tmp_path / "gqa-b1.ref.gpu.mug.json"
    bench._save_reference(path, program("gqa", 1, small=True), tuned, 5.65e-6)
    opt = load_result(path)
    assert [c.origin for c in opt.candidates] == ["reference"] and opt.best.measured_s == 5.65e-6
    data = str(tmp_path / "c.jsonl.gz")
    assert record_candidates([str(path)], "2026-11-26", data) == 1
    (r,) = candidate_timings(data)
    assert (r.program, r.origin, r.device, r.predicted) == ("gqa-b1", "reference", "NVIDIA H200", 8.8e-6)
    assert r.configs == {k: KernelConfig(num_warps=2) for k in kids}
    assert list(structure_agreement(path=data).rows) == [("gqa-b1", "NVIDIA H200", "2026-11-26", "")]
