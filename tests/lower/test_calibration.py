"""The cost model against recorded H100 times (``lower/data/h100_graph_timing.csv``):
a regression guard on how well it ranks what the GPU measured (no GPU needed), and
the measured rules behind it (which loops Triton pipelines; L2-resident graphs; a norm
inside a dot operand; split-K partials read back by the combining programs)."""

from __future__ import annotations

import dataclasses
import math

import pytest

import lower
from lower import KernelConfig, cost_model
from lower.calibration import (agreement, measurements, record_sweep, spearman, sweep_agreement,
                               swept_graphs)
from lower.plan import plan
from mugraph.core.benchmarks import reference


def test_every_recorded_config_parses_and_round_trips():
    rows = measurements()
    assert len(rows) >= 1450 and {m.name for m in rows} == {"rmsnorm_matmul", "gated_mlp", "lora", "gqa",
                                                           "qknorm_gqa", "ntrans"}
    assert {m.sizes for m in rows} >= {(), (("col_tile", 128),), (("col_tile", 256),)}
    for m in rows:
        assert m.seconds > 0
        for c in m.configs.values():
            assert KernelConfig.from_label(c.label()) == c


def test_spearman():
    assert abs(spearman([1, 2, 3, 4], [10, 20, 30, 40]) - 1) < 1e-12
    assert abs(spearman([1, 2, 3, 4], [4, 3, 2, 1]) + 1) < 1e-12
    assert abs(spearman([1, 2, 2, 3], [1, 2, 3, 4]) - 0.9487) < 1e-3


def test_cost_model_ranks_the_recorded_h100_times():
    """Measured 2026-11-22 (docs/history/lowering.md, staged loads): over all 1918 rows (20 μGraphs) ρ = 0.61, median
    within one μGraph 0.40, and the model's favourite among a μGraph's recorded configs is
    at most 21 % slower than the best (rmsnorm_matmul col_tile 256, b=8); for rmsnorm_matmul
    itself 0 % (the unstaged-load rule: the cost model before that rule favoured a no-split chunk 8 that runs
    32 μs); for the attention pair at most 2 % (the L2 and fix-up rules; without them: 20 %
    at gqa b=1). The tuner times the model's top picks and every (split, chunk) pair, so a
    regret here is not a regret of the tuner. A change that ranks worse fails this. (The
    median within was 0.47 with a 0.6 μs L2 round trip; at 0.2 μs, which the H200 re-rankings
    across structures ask for — next test —, lora b=8 and qknorm_gqa b=1 rank their configs
    worse, their favourites staying within 1 % of the best: the regrets are what is kept.)"""
    a = agreement()
    assert a.spearman_all >= 0.58
    assert a.median_within >= 0.38
    assert max(a.regret.values()) <= 0.25, a.regret
    attention = {k: v for k, v in a.regret.items() if k[0] in ("gqa", "qknorm_gqa")}
    assert len(attention) == 4 and max(attention.values()) <= 0.05, attention
    assert a.regret[("rmsnorm_matmul", 8)] <= 0.02 and a.regret[("rmsnorm_matmul", 1)] <= 0.02


def _op(g):
    return next(o for o in g.ops if o.kind == "graph_defined")


def test_only_loops_with_a_dot_are_pipelined_unasked():
    """Triton pipelines loads unasked only in loops with a tl.dot (its AssignLatencies pass);
    codegen asks (tl.range) only in the dot-free loops of the "v"/"va" lowerings. Measured:
    the attention combine loop (no dot) ran 7.3–7.4 μs at num_stages 2…5 alike, and asked
    to pipeline it ran slower. The shared-memory estimate counts pipelining buffers by this."""
    rms = _op(reference("rmsnorm_matmul", small=True)).attrs["block"]
    combine = [o for o in reference("gqa", small=True).ops if o.kind == "graph_defined"][1].attrs["block"]
    for blk, want in ((rms, True), (combine, False)):
        cfg = KernelConfig(num_stages=3)
        assert plan(blk, cfg).pipelined is want
        assert plan(blk, dataclasses.replace(cfg, num_stages=1)).pipelined is False
    v = KernelConfig(num_stages=3, small_mm="v")
    assert plan(combine, v).pipelined is True
    src = lower.compile(reference("gqa", small=True), device="cpu",
                        configs={[o for o in reference("gqa", small=True).ops
                                  if o.kind == "graph_defined"][1].id: KernelConfig(num_stages=3)}).triton_source()
    assert "tl.range(" not in src


def test_graphs_that_fit_in_l2_are_costed_at_l2_rates():
    """Timed calls repeat, so a graph whose bytes fit in (half of) L2 is read from there."""
    small, big = reference("gqa"), reference("rmsnorm_matmul")
    assert cost_model.footprint_bytes(small) < cost_model.H100.l2_bytes < cost_model.footprint_bytes(big)
    no_l2 = dataclasses.replace(cost_model.H100, l2_bytes=0)
    assert cost_model.estimate(small) < cost_model.estimate(small, no_l2)
    assert cost_model.estimate(big) == pytest.approx(cost_model.estimate(big, no_l2))


def test_recorded_candidates_load_and_the_plan_window_covers_their_fastest():
    """The re-rankings' recorded candidates (several structures of one program, tuned and
    timed on an H200): every one loads and prices; and in every recorded run the fastest
    measured candidate was predicted within ``STRUCTURE_SPREAD`` of the best prediction, so
    the re-ranking's plan (the best of each structure within that factor) would time it —
    gqa b=1's fastest, a split pair, was predicted at over 2x (the window was 2 before). The
    hand-written references recorded beside them are left out: the plan never chooses them."""
    from lower.calibration import candidate_timings, structure_agreement
    from mugraph.pipeline.timing import STRUCTURE_SPREAD

    rows = candidate_timings()
    assert len(rows) >= 60 and {r.program for r in rows} >= {"gqa-b1", "qknorm_gqa-b8", "gated_mlp-b1"}
    sa = structure_agreement()
    assert all(p > 0 and t > 0 for v in sa.rows.values() for p, t, _, _, _ in v)
    assert max(sa.window.values()) <= STRUCTURE_SPREAD, sa.window
    assert max(sa.window.values()) > 2.0  # the record that set the window


def test_the_model_ranks_gqa_b1_structures_as_the_h200_measured_them():
    """gqa b=1 on an H200 (2026-11-26/27): split pairs whose combine is its own kernel ran
    5.4–6.8 μs, single kernels combined by their last program ("last") 7.4–12.5, and pairs
    with a "last" split inside 8.3–10.2. With an L2 round trip of 0.6 μs and the fix-up at it
    the model ranked them backwards (rank agreement -0.01 and -0.67); priced at an unloaded
    L2 round trip and a fenced fix-up chain it agrees (0.82 and 0.48), and the favourite
    among the search's candidates of the first run and of the decode run is the fastest
    measured (it was 17 % and 23 % slower). Within the split pairs it is still not
    resolved: the pair of 128 + 8 blocks ran 5.4 μs, predicted 3 % behind pairs of 64 + 8
    that ran 6.2–6.4 (the 2026-11-27 favourite, 18 % slower) — why the re-ranking times
    every grid family of a structure (mugraph.pipeline.timing.grids).

    Per run (records without a run label are grouped by day): 0.82 (2026-11-26), 0.48 (the
    two unlabelled runs of 2026-11-27) and 0.18 (the run at 63f9002), whose fastest pair
    (128 + 8 blocks, 5.3 μs) was tuned to a 2-stage combine that the model prices 1.6 μs
    above 3–4 stages; the card ran them alike — the combine's loop has no tl.dot and its
    loads are not staged, so num_stages cannot matter there (left open: README, "Cost model
    across structures"). With the old L2 round trip alone: 0.13, -0.43, -0.71."""
    from lower.calibration import structure_agreement

    sa = structure_agreement()
    gqa1 = {k: sa.spearman[k] for k in sa.rows if k[0] == "gqa-b1"}
    assert len(gqa1) >= 3 and min(gqa1.values()) >= 0.15, gqa1
    assert sum(gqa1.values()) / len(gqa1) >= 0.45, gqa1
    for k, v in sa.rows.items():
        if k[0] in ("gqa-b1", "decode_h8_kv2_n2048_d64-b1") and k[2] == "2026-11-26":
            ours = [r for r in v if not r.reference]
            favourite = min(ours, key=lambda r: r.model)
            assert favourite.measured <= 1.02 * min(r.measured for r in ours), (k, favourite)


def test_record_candidates_appends_timed_ones_once(tmp_path):
    from lower.calibration import candidate_timings, record_candidates
    from mugraph.pipeline.results import Candidate, Optimized

    g = reference("lora", small=True)
    kid = _op(g).id
    timed = Candidate(g, "search", predicted_s=2e-6, measured_s=3e-6,
                      configs={kid: dataclasses.asdict(KernelConfig(num_warps=2))}, found_by="enumeration")
    untimed = Candidate(g, "search", predicted_s=4e-6)
    res = tmp_path / "lora-b1.gpu.mug.json"
    Optimized(g, timed, [timed, untimed], {"device": "NVIDIA H200"}, "cuda").save(res)
    data = str(tmp_path / "c.jsonl.gz")
    assert record_candidates([str(res)], "2026-11-26", data) == 1
    assert record_candidates([str(res)], "2026-11-26", data) == 0  # already there
    (r,) = candidate_timings(data)
    assert (r.program, r.device, r.date, r.seconds, r.predicted, r.run) == (
        "lora-b1", "NVIDIA H200", "2026-11-26", 3e-6, 2e-6, "")
    assert r.configs == {kid: KernelConfig(num_warps=2)}
    # another run of the same day, labelled: its own record and its own group
    assert record_candidates([str(res)], "2026-11-26", data, run="abc1234") == 1
    assert record_candidates([str(res)], "2026-11-26", data, run="abc1234") == 0
    assert [c.run for c in candidate_timings(data)] == ["", "abc1234"]
    from lower.calibration import structure_agreement
    assert sorted(structure_agreement(path=data).rows) == [("lora-b1", "NVIDIA H200", "2026-11-26", ""),
                                                          ("lora-b1", "NVIDIA H200", "2026-11-26", "abc1234")]


def _blocks(g):
    return [o for o in g.ops if o.kind == "graph_defined"]


def test_a_norm_inside_a_dot_operand_is_charged_per_step():
    """qknorm_gqa's reference normalizes each step's K tile before q·k (t_cone: its reduced
    elements each step); gqa's attention reduces nothing into a dot operand (its row sum is
    only accumulated); a norm of a tile loaded once, before the loop, is not charged."""
    k1 = _blocks(reference("qknorm_gqa", 8))[0]
    p = plan(k1.attrs["block"])
    k_tile = [t for t in p.loop_tiles if t.op.attrs["fmap"] == 2][0]
    assert cost_model._cone_reduced(p) == pytest.approx(math.prod(p.info.padded(k_tile)))
    (cost,) = cost_model.breakdown(reference("qknorm_gqa", 8), configs={k1.id: KernelConfig()}).launches[:1]
    assert cost.t_cone > 0
    plain = _blocks(reference("gqa", 8))[0]
    assert cost_model._cone_reduced(plan(plain.attrs["block"])) == 0.0
    assert all(c.t_cone == 0.0 for c in cost_model.breakdown(reference("gqa", 8)).launches)


def test_split_partials_are_read_back_at_what_the_combining_programs_pull():
    """gqa b=1 (H200): a single kernel split 16 ways whose 8 tiles' last programs add the
    partials up ran 11.3–12.5 μs where the GPU's aggregate bandwidth predicted 6.2 — the
    partials come back at most ``sm_bw`` a combining program."""
    g = reference("gqa")
    k2 = _blocks(g)[1]  # the combine: 8 blocks, a loop over 16 chunks
    cfg = KernelConfig(split=8, combine="last")
    costs = {c.name: c for c in cost_model.breakdown(g, configs={k2.id: cfg}).launches}
    fix = costs[f"k{k2.id}_fixup"]
    assert fix.programs == 8
    assert fix.t_dram == pytest.approx(fix.dram_bytes / (8 * cost_model.H100.sm_bw))


def test_a_run_label_without_timings_to_record_is_refused(capsys):
    from lower.calibration import main

    with pytest.raises(SystemExit):
        main(["--run", "abc1234"])
    assert "--run labels the timings --add or --add-sweep records" in capsys.readouterr().err


def test_the_model_prices_for_the_gpu_it_is_named():
    assert cost_model.params_for("NVIDIA H200") is cost_model.H200
    assert cost_model.params_for("NVIDIA H100 80GB HBM3") is cost_model.H100
    assert cost_model.params_for("an unknown card") is cost_model.H100 and cost_model.params_for(None) is cost_model.H100
    assert cost_model.H200.sms == cost_model.H100.sms and cost_model.H200.dram_bw > cost_model.H100.dram_bw


def test_without_a_gpu_in_use_the_default_is_the_named_device_or_the_h100(monkeypatch):
    import torch
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is in use: the default is that GPU's")
    monkeypatch.delenv("MUGRAPH_COST_DEVICE", raising=False)
    assert cost_model.default_params() is cost_model.H100
    monkeypatch.setenv("MUGRAPH_COST_DEVICE", "NVIDIA H200")
    assert cost_model.default_params() is cost_model.H200


def _gated(blocks: int, k: int = 2048, n: int = 16384, steps: int = 64):
    from mugraph.core.benchmarks.handwritten import gated_mlp
    return gated_mlp(rows=1, hidden=k, out=n, col_tile=n // blocks, loop=k // steps, act="gelu_tanh")


def test_a_grid_too_small_to_pull_the_h200s_bandwidth_is_priced_so():
    """A GeLU-gated projection (2048 → 2 × 16384, 134 MB) in one kernel on an H200
    (``examples/gemv_sweep.py --gated gelu_tanh``, 2026-11-29): 64 programs ran 35.4 μs at
    best, 128 and 256 programs 32.6–32.9 (1.01× the copy floor). 64 programs pull at most
    64 × 60 GB/s = 3.84 TB/s: the H100's whole bandwidth, not the H200's."""
    cfg = KernelConfig(num_warps=4, num_stages=4)
    price = {dev.name: {b: cost_model.estimate(_gated(b), dev, {3: cfg}) for b in (64, 128, 256)}
             for dev in (cost_model.H100, cost_model.H200)}
    h100, h200 = price["NVIDIA H100 SXM"], price["NVIDIA H200"]
    assert h100[64] == pytest.approx(h100[256], rel=1e-3)  # the H100's parameters cannot tell them apart
    assert h200[64] > 1.05 * h200[256] and h200[128] == pytest.approx(h200[256], rel=0.02)


def test_the_recorded_h200_runs_rank_better_at_the_h200s_parameters():
    from lower.calibration import structure_agreement

    def mean(sa):
        v = [x for x in sa.spearman.values() if x == x]
        return sum(v) / len(v)
    assert mean(structure_agreement()) > mean(structure_agreement(cost_model.H100)) + 0.02


def test_the_model_ranks_the_recorded_one_row_sweeps():
    """Every configuration of Phi-3-mini's one-row projections timed from DRAM on an H200
    (``examples/gemv_sweep.py``, re-chunked loops and sub-tiles included, 2026-12-01;
    docs/results.md, "Chunks, sub-tiles and rounds"): 492 configs over three shapes, rank
    agreement 0.59-0.70 and the favourite at most 38 % slower than the fastest. Before the
    serial chain was paid per round of programs an SM runs, the fused norm's was −0.19 and its
    favourite 2.7× the fastest. The norm's later sweep of staged loads and combine kernels (264
    configs, run 2d310f5) ranks at 0.53 (0.17 before the model counted the other resident
    programs' transfers, partial waves and the split programs' exit), the gated projection's
    (78 configs) at 0.67, the other six at 0.76-0.89."""
    sw = sweep_agreement()
    assert len(sw.rows) >= 3 and sum(len(v) for v in sw.rows.values()) >= 490
    assert min(sw.spearman.values()) >= 0.5, sw.spearman
    assert sorted(sw.spearman.values())[len(sw.spearman) // 2] >= 0.75, sw.spearman
    assert max(sw.regret.values()) <= 0.45, sw.regret


def test_a_sweep_is_recorded_once_with_its_graphs(tmp_path):
    """``--add-sweep`` keeps each tiling with its μGraph and times; the same file again adds
    nothing, and a file that is not a sweep's is refused by name before anything is written."""
    import json

    from mugraph.core.benchmarks.handwritten import gemv
    from mugraph.core.serialize import graph_to_json

    doc = {"kind": "gemv_sweep", "device": "NVIDIA H200", "timing": "dram", "dtype": "bfloat16",
           "graphs": {"1x256x512 32x64": graph_to_json(gemv(1, 256, 512, 32, 64, "residual", "bfloat16"))},
           "rows": [{"shape": "1x256x512", "gated": None, "form": "residual", "cols": 32, "steps": 64,
                     "config": label, "us": us} for label, us in (("w4s3", 3.0), ("w4s3k2L", 2.5), ("w4s4", 2.8))]}
    src, out = tmp_path / "sweep.json", str(tmp_path / "sweeps.jsonl.gz")
    src.write_text(json.dumps(doc))
    assert record_sweep([str(src)], "2026-12-01", "abc1234", path=out) == 1
    assert record_sweep([str(src)], "2026-12-01", "abc1234", path=out) == 0
    (g,) = swept_graphs(out)
    assert (g.sweep, g.run, g.timing) == ("residual 1x256x512", "abc1234", "dram")
    assert g.seconds == pytest.approx({"w4s3": 3e-6, "w4s3k2L": 2.5e-6, "w4s4": 2.8e-6})
    (rows,) = sweep_agreement(path=out).rows.values()
    assert len(rows) == 3 and all(model > 0 for model, _, _ in rows)
    bad = tmp_path / "rows.json"
    bad.write_text(json.dumps(doc["rows"]))
    with pytest.raises(ValueError, match="rows.json: not an examples/gemv_sweep.py --json file"):
        record_sweep([str(bad)], "2026-12-01", path=out)


def _records(tmp_path, keep) -> str:
    """The recorded sweeps ``keep(record)`` keeps, as a records file of their own."""
    import gzip
    import json

    from lower.calibration import SWEEPS

    with gzip.open(SWEEPS, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    path = str(tmp_path / "sweeps.jsonl.gz")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs if keep(d))
    return path


def test_the_sweeps_to_run_next_time_what_the_replays_could_not_answer(tmp_path):
    """``python -m lower.calibration`` ends with the gemv_sweep commands that time what the tuner's
    first timings ask for on the recorded tilings and no sweep timed (the norm's staged loads,
    the combine kernel): every such configuration is in its sweep's product of flags, the shape,
    form and timing are the record's, and nothing is asked where nothing is missing. On the
    sweeps of the first run alone (1197e49) the norm's staged loads are asked for."""
    from lower.calibration import next_sweeps, swept_graphs, unswept

    first_run = _records(tmp_path, lambda d: d["run"] == "1197e49")
    commands = {c.split("--shapes ")[1].split()[0]: c for c in next_sweeps(first_run)}
    for g in swept_graphs(first_run):
        missing = unswept(g)
        shape = g.sweep.rsplit(" ", 1)[1]
        if not missing:
            continue
        cmd = commands[shape]
        assert f"--form {g.sweep.split()[0]}" in cmd and f"--timing {g.timing}" in cmd

        def flag(name: str) -> list[str]:
            return cmd.split(f"--{name} ")[1].split(" --")[0].split()
        for c in missing:
            sub = c.label().split("p")[1].rstrip("vaA") if "p" in c.label() else "-"
            assert str(c.split) in flag("splits") and str(c.chunk) in flag("chunks") and sub in flag("subs"), c.label()
            assert c.small_mm in flag("small-mm") and ("A" if c.stage_all_loads else "-") in flag("staging")
            assert c.combine in flag("combines") and str(c.num_stages) in flag("stages")
    assert "1x3072x9216" in commands   # the first run's norm sweep left out what the order asks first


def test_a_later_sweep_of_a_tiling_answers_what_an_earlier_one_left_out(tmp_path):
    """The norm's first sweep (1197e49) left out configurations the tuner's first eight timings
    ask for; the later sweeps of the same tilings timed them. Merged (:func:`merged_tilings`),
    each norm tiling's replay misses fewer of its first eight than on the first run's record
    alone, and reaches the tiling's fastest within 3 % by the fourth timing."""
    from lower.calibration import merged_tilings, replayed, unswept
    from mugraph.core.serialize import graph_from_json
    from mugraph.core.text import kernel_structure

    first_run = {kernel_structure(graph_from_json(g.graph)): g
                 for g in merged_tilings(_records(tmp_path, lambda d: d["run"] == "1197e49"))
                 if g.sweep == "norm 1x3072x9216"}
    later = [(g, r) for g, r in replayed() if g.sweep == "norm 1x3072x9216"]
    assert len(later) == 2 and all("+" in g.run for g, _ in later)
    for g, r in later:
        alone = first_run[kernel_structure(graph_from_json(g.graph))]
        assert len(unswept(g, 8, r)) < len(unswept(alone, 8)), g.run
        assert r.best_after(4) <= 1.03, (g.run, r.timed[:4])


def test_a_library_matmul_of_one_row_is_priced_as_the_split_k_pair_cublas_runs():
    """One row times Mistral-7B's v projection (4096 × 1024, bf16) as a library call ran
    9.1 μs on an H200 from DRAM; at its bytes alone it was priced 4.05, first among the
    candidates, and a short tuning timed it and a kernel beside it in place of the tiling
    that ran 5.4. A prompt's matmul (rows past ``LIBRARY_SKINNY_ROWS``) keeps one launch
    and no round trip of its own."""
    import mugraph as mg

    dev = cost_model.for_timing(cost_model.H200, "dram")

    def lib(rows: int) -> float:
        g = mg.KernelGraph("lib")
        x, w = g.input("X", (rows, 4096), "bfloat16"), g.input("W", (4096, 1024), "bfloat16")
        g.output(x @ w)
        return cost_model.estimate(g, dev)

    moved = (4096 * 1024 + 4096 + 1024) * 2 / dev.dram_bw
    assert lib(1) == pytest.approx(2 * dev.launch + 2 * dev.mem_latency + moved)
    assert 7.5e-6 < lib(1) < 9.5e-6
    big = (4096 * 4096 + 4096 * 1024 + 4096 * 1024) * 2  # X, W, the output
    assert lib(4096) == pytest.approx(dev.launch + max(big / dev.dram_bw, 2 * 4096 ** 2 * 1024 / dev.tc_flops))
