"""A μGraph found for a program carried to the same program at other sizes (search.transfer):
the kernels' grids and loops scaled so each tile keeps its shape, the result verified
against the new program from scratch — by the verifier here, by the driver as a seed, and
found in the result cache by ``superoptimize`` for a program of the same structure."""

import json
from pathlib import Path

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks.programs import decode_attention
from mugraph.core.serialize import graph_from_json, graph_to_json
from mugraph.pipeline import optimize as opt_mod
from search import driver
from search.config import SearchConfig
from search.transfer import structure_key, transfer

#: a μGraph the search found and proved for ``_decode(256)`` (one worker, 16 KB of shared
#: memory: one block per KV head, 2 loop steps of 128 keys), kept so these tests do not search
FOUND = Path(__file__).parent / "data" / "decode_online_kv256.json"


def _decode(kv: int, safe: bool = True):
    return decode_attention(b=1, heads=8, kv_heads=2, kv=kv, head_dim=32, safe=safe, dtype="float16")


def _found():
    return graph_from_json(json.loads(FOUND.read_text()))


def _kernels(g):
    return [(op.attrs["block"].grid, op.attrs["block"].forloop) for op in g.ops if op.kind == "graph_defined"]


def test_the_structure_key_ignores_sizes_only():
    assert structure_key(_decode(256)) == structure_key(_decode(8192))
    assert structure_key(_decode(256)) != structure_key(_decode(256, safe=False))  # another program
    p, q = mg.Program("a"), mg.Program("b")
    p.output(mg.exp(p.input("x", (4, 8), "float32")))
    q.output(mg.exp(q.input("x", (4, 8, 2), "float32")))  # another rank
    assert structure_key(p) != structure_key(q)


@pytest.mark.parametrize("kv", [1024, 4096])
def test_a_found_online_attention_carries_to_more_keys_and_is_proven_there(kv):
    g = _found()
    assert verify.equivalent(_decode(256), g, seed=1).bound_met
    h = transfer(g, _decode(kv))
    assert h is not None
    assert _kernels(g) == [((2, 1, 1), 2)] and _kernels(h) == [((2, 1, 1), kv // 128)]  # 128-key tiles, more steps
    v = verify.equivalent(_decode(kv), h, seed=2)
    assert v.equivalent and v.bound_met, v


def test_what_cannot_carry_is_refused():
    g = _found()
    assert transfer(g, _decode(256)) is None   # the same sizes: nothing to carry
    assert transfer(g, _decode(384)) is None   # 1.5 times the keys: no whole number of loop steps
    other = mg.Program("other")
    other.output(mg.exp(other.input("x", (4, 8), "float16")))
    assert transfer(g, other) is None          # other inputs


def test_a_near_miss_carried_over_is_rejected_by_the_verifier():
    """Carrying proves nothing: the verifier decides. The found graph carried to 1,024 keys
    and checked against a program of the same inputs that leaves out the softmax's
    normalization fails."""
    g = transfer(_found(), _decode(1024))
    assert not verify.equivalent(_sum_not_softmax(1024), g, seed=3).equivalent


def _sum_not_softmax(kv: int):
    p = mg.Program("sum_not_softmax")
    q, k, v = p.input("Q", (2, 4, 32), "float16"), p.input("K", (2, 32, kv), "float16"), \
        p.input("V", (2, kv, 32), "float16")
    p.output(mg.exp(mg.scale(q @ k, 1 / 32 ** 0.5)) @ v)  # no normalization: a near miss of the softmax
    return p


def test_the_driver_verifies_a_seed_first_and_ships_it():
    """A seed is verified before the enumeration (at large sizes one verification costs
    seconds the verify phase's reserve may not leave) and ships like any proven candidate;
    a seed that is not equivalent to the program is rejected and never ships."""
    cfg = SearchConfig(time_limit=6, workers=1, progress=False, smem_budget=16 * 1024, compose=False,
                       split_loops=False, max_results=1, verify_per_kernels=1)
    seed = transfer(_found(), _decode(4096))
    # two seeds: once the first is proven the second is not verified before the enumeration
    # (each costs seconds at large sizes); it stays a proposal for the verify phase
    r = driver.run(_decode(4096), cfg, seeds=[seed, seed])
    assert r.stats["derived"]["transfer_seeds"] == 2 and r.stats["derived"]["transfer_verified"] == 1
    assert "transfer" in r.origins
    i = r.origins.index("transfer")
    assert r.verdicts[i]["equivalent"] and r.verdicts[i]["bound_met"]
    bad = driver.run(_sum_not_softmax(1024), cfg, seeds=[transfer(_found(), _decode(1024))])
    assert bad.stats["derived"].get("transfer_verified", 0) == 0 and "transfer" not in bad.origins


def test_seeds_are_verified_cheapest_first_with_their_tile_variants():
    """With the lowering's price, a seed's tile variants reached by following the price down
    are verified with the seeds, cheapest first: the seed carried from 256 keys steps over 128
    keys 32 times; a price that wants 32-key steps (as a long prompt's kernels want other tiles
    than its scout's) has the 128-step variant verified first, and it ships, proven."""
    import math

    def price(g):
        (_, loop), = _kernels(g)
        return 1.0 + abs(math.log2(loop) - 7)

    cfg = SearchConfig(time_limit=8, workers=1, progress=False, smem_budget=16 * 1024, compose=False,
                       split_loops=False, max_results=1, verify_per_kernels=1)
    r = driver.run(_decode(4096), cfg, estimate=price, seeds=[transfer(_found(), _decode(4096))])
    d = r.stats["derived"]
    assert d["transfer_variants"] == 2 and d["transfer_verified"] == 1
    assert _kernels(r.graphs[r.origins.index("transfer")]) == [((2, 1, 1), 128)]
    v = r.verdicts[r.origins.index("transfer")]
    assert v["equivalent"] and v["bound_met"]


def test_a_variant_the_price_barely_prefers_waits_behind_the_seed(monkeypatch):
    """The price ranks close tilings no better than chance: a tile variant priced only a
    little below the seed is verified after it (the seed's tiles were the best measured at
    its size), one priced clearly below before it."""
    import math

    seed = transfer(_found(), _decode(4096))
    order = []
    real = driver._seed_order

    def spy(state, seeds):
        out = real(state, seeds)
        order.append([_kernels(g)[0][1] for g in out.graphs])
        return out

    monkeypatch.setattr(driver, "_seed_order", spy)
    cfg = SearchConfig(time_limit=6, workers=1, progress=False, smem_budget=16 * 1024, compose=False,
                       split_loops=False, max_results=1, verify_per_kernels=1)
    for slope, expect_first in ((0.01, 32), (1.0, 128)):
        def price(g, slope=slope):
            (_, loop), = _kernels(g)
            return 1.0 + slope * abs(math.log2(loop) - 7)
        driver.run(_decode(4096), cfg, estimate=price, seeds=[seed])
        assert order[-1][0] == expect_first and sorted(order[-1]) == [32, 64, 128], order[-1]


def test_the_near_ties_of_a_proven_seed_are_verified_beside_it():
    """Once a seed is proven, the graphs the price cannot tell from it (within ``NEAR_TIE``)
    are verified too, those stepping differently first, so the GPU's timing chooses among
    them: a flat price proves the seed's 32-step kernel first, then its 128- and 64-step
    variants; all three ship proven (the enumeration may find one of them too). A price that
    sets the variants apart verifies none."""
    import math

    from search.derive import NEAR_TIES

    cfg = SearchConfig(time_limit=6, workers=1, progress=False, smem_budget=16 * 1024, compose=False,
                       split_loops=False, max_results=8, verify_per_kernels=8)
    seed = transfer(_found(), _decode(4096))
    for slope, ties in ((0.01, NEAR_TIES), (1.0, 0)):
        def price(g, slope=slope):
            (_, loop), = _kernels(g)
            return 1.0 + slope * abs(math.log2(loop) - 7)
        r = driver.run(_decode(4096), cfg, estimate=price, seeds=[seed])
        d = r.stats["derived"]
        assert d.get("transfer_near_ties_verified", 0) == ties and d["transfer_verified"] == 1 + ties
        shipped = {_kernels(g)[0][1] for g in r.graphs}
        assert not ties or shipped >= {32, 64, 128}, shipped
        assert all(v["equivalent"] and v["bound_met"] for v in r.verdicts)


@pytest.mark.parametrize("program, ships", [(_decode, True), (_sum_not_softmax, False)],
                         ids=["proven-seed", "near-miss-seed"])
def test_a_seed_verdict_counts_when_the_warm_up_runs_past_the_time_limit(monkeypatch, program, ships):
    """A seed is verified before the enumeration; when the verification warm-up (the
    program's side of every test, on a GPU) is still running at the time limit, no new
    verification starts, but the seed's verdict stands: proven, it ships; not equivalent
    (a near miss of the softmax), it does not. Before, the search then returned nothing
    verified, and an 8k-token prompt whose four scouted seeds had been proven shipped the
    program (H200)."""
    import time

    from search.check import Checker

    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: True))  # the warm-up runs (the verifier stays on the CPU)
    monkeypatch.setattr(Checker, "warm", lambda self: time.sleep(7))
    cfg = SearchConfig(time_limit=5, workers=2, executor="processes", progress=False, smem_budget=16 * 1024,
                       compose=False, split_loops=False, max_results=1, verify_per_kernels=1)
    r = driver.run(program(4096), cfg, seeds=[transfer(_found(), _decode(4096))])
    assert r.stats["derived"]["transfer_seeds"] == 1 and "verify_skipped_warm_up" in r.stats["search"]
    assert ("transfer" in r.origins) is ships
    if ships:
        v = r.verdicts[r.origins.index("transfer")]
        assert v["equivalent"] and v["bound_met"]


def test_superoptimize_seeds_its_search_with_a_cached_relative(tmp_path, monkeypatch):
    """A cached winner of the same program at other sizes (same configuration, seed,
    device, versions) is carried to the new sizes and handed to the search as a seed; a
    winner that was the program itself, or one cached under another configuration, is not."""
    seen = []

    def pipeline(program, cfg, device, progress, seed, checkpoint_dir=None, stop_by=None, seeds=None):
        """A stub: the 256-key program's winner is the found μGraph, every other's the program."""
        seen.append((program.name, [_kernels(s) for s in seeds or []]))
        keys = program.inputs[1].shape[-1]
        best = opt_mod.Candidate(_found(), "search") if keys == 256 else opt_mod.Candidate(program, "program")
        return opt_mod.Optimized(program, best, [best], {"device": "cpu", "why": "stub", "error_bound": None}, device)

    monkeypatch.setattr(opt_mod, "_run_pipeline", pipeline)
    mg.superoptimize(_decode(256), device="cpu", cache_dir=tmp_path, progress=False)
    mg.superoptimize(_decode(1024), device="cpu", cache_dir=tmp_path, progress=False)
    assert seen[0][1] == [] and seen[1][1] == [[((2, 1, 1), 8)]]
    mg.superoptimize(_decode(2048), {"error": 2.0 ** -30}, device="cpu", cache_dir=tmp_path, progress=False)
    assert seen[2][1] == []  # another configuration: no relative
    mg.superoptimize(_decode(4096), device="cpu", cache_dir=tmp_path, progress=False)
    assert seen[3][1] == [[((2, 1, 1), 32)]]  # the 1024 entry's best was the program: only 256's carries


def test_a_large_program_is_shrunk_by_value_for_its_scout():
    """The scout's copy of an 8k-token causal prompt: the 8,192-token dims (queries, keys, the
    mask's both) divided alike until its largest tensor holds at most 2^22 elements; heads and
    head dim untouched; the same structure, inputs and fills — what ``transfer`` needs to carry
    its μGraphs back."""
    from mugraph.core.benchmarks.programs import prefill_attention
    from search.transfer import SCOUT_ELEMENTS, SCOUT_TARGET, largest_tensor, shrunk

    p = prefill_attention(heads=16, q=8192, kv=8192, head_dim=128, causal=True, safe=True)
    assert largest_tensor(p) == 2 ** 30 > SCOUT_ELEMENTS
    s = shrunk(p)
    assert [t.shape for t in s.inputs] == [(16, 512, 128), (16, 128, 512), (16, 512, 128), (512, 512)]
    assert largest_tensor(s) <= SCOUT_TARGET
    assert structure_key(s) == structure_key(p) and [t.name for t in s.inputs] == [t.name for t in p.inputs]
    assert [t.op.attrs.get("fill") for t in s.inputs] == [t.op.attrs.get("fill") for t in p.inputs]
    mg.check_lax(s)


def test_reshapes_follow_the_shrunk_dims_and_what_cannot_shrink_is_refused():
    from search.transfer import shrunk

    p = mg.Program("heads")
    x = p.input("X", (4096, 4, 16), "float16")
    p.output(mg.exp(mg.reshape(x, (4096, 64))))
    s = shrunk(p, target=2 ** 14)
    assert s.inputs[0].shape == (256, 4, 16) and s.outputs[0].shape == (256, 64)
    small = mg.Program("small")
    small.output(mg.exp(small.input("X", (512, 64), "float16")))
    assert shrunk(small) is None  # no dim of 1,024 elements or more
    split = mg.Program("split")
    y = split.input("Y", (2048, 64), "float16")
    split.output(mg.exp(mg.reshape(y, (1024, 128))))  # a reshape that folds the large dim: not by value
    assert shrunk(split) is None


def test_superoptimize_scouts_a_large_program_and_seeds_its_search(monkeypatch):
    """A program past the scout's size (lowered here to a test's) is searched at smaller sizes
    first; what that finds is carried to the program's sizes and seeds its search, whose
    time limit is what the scout left. The stubbed scout search returns the found μGraph."""
    import search as search_pkg
    import search.transfer as tr

    monkeypatch.setattr(tr, "SCOUT_ELEMENTS", 2 ** 16)
    monkeypatch.setattr(tr, "SCOUT_TARGET", 2 ** 14)
    scouted, searched = [], []

    class Found:
        graphs = [_found()]

    def scout_run(program, cfg, estimate=None):
        scouted.append(([t.shape for t in program.inputs], cfg.time_limit, cfg.checkpoint))
        return Found()

    def main_search(program, scfg, own_checkpoint, seeds, estimate, checker=None):
        searched.append(([_kernels(s) for s in seeds], scfg.time_limit))
        raise KeyboardInterrupt  # the rest of the pipeline is not this test's

    monkeypatch.setattr(search_pkg, "run", scout_run)
    monkeypatch.setattr(opt_mod, "_search", main_search)
    cfg = {"search": {"time_limit": 20, "workers": 1}}
    with pytest.raises(opt_mod.Interrupted):
        mg.superoptimize(_decode(4096), cfg, device="cpu", cache_dir=False, progress=False)
    assert scouted == [([(2, 4, 32), (2, 32, 256), (2, 256, 32)], 8.0, None)]
    ((seeds, limit),) = searched
    assert seeds == [[((2, 1, 1), 32)]] and 5.0 <= limit <= 20.0
    searched.clear()
    monkeypatch.setattr(tr, "SCOUT_ELEMENTS", 2 ** 20)  # below the size: no scout, the whole limit
    with pytest.raises(opt_mod.Interrupted):
        mg.superoptimize(_decode(4096), cfg, device="cpu", cache_dir=False, progress=False)
    assert searched == [([], 20)] and len(scouted) == 1


def test_the_program_side_is_prepared_while_the_scout_runs(monkeypatch):
    """On a GPU (pretended: the verifier stays on the CPU) a scouted call starts preparing the
    program's side of its verifications before the scout and hands that checker to the
    program's search, which verifies its seeds with it: the seed's verdict evaluates the
    program no more. On a CPU nothing is prepared ahead (the workers have the cores)."""
    import search as search_pkg
    import search.transfer as tr
    from search.check import Checker

    monkeypatch.setattr(tr, "SCOUT_ELEMENTS", 2 ** 16)
    monkeypatch.setattr(tr, "SCOUT_TARGET", 2 ** 14)
    real_run = search_pkg.run
    handed = []

    class Found:
        graphs = [_found()]

    def run(program, cfg, estimate=None, seeds=(), checker=None):
        if not seeds:  # the scout
            return Found()
        handed.append(checker)
        if checker is None:
            raise KeyboardInterrupt
        checker._settle()
        before = checker._reference.evaluations
        r = real_run(program, cfg, estimate=estimate, seeds=seeds, checker=checker)
        assert r.stats["derived"]["transfer_verified"] >= 1  # the seed, and its near ties
        assert checker._reference.evaluations == before  # the seed's verdict read the prepared side
        raise KeyboardInterrupt  # the rest of the pipeline is not this test's

    monkeypatch.setattr(search_pkg, "run", run)
    cfg = {"search": {"time_limit": 8, "workers": 1, "executor": "serial", "compose": False,
                      "split_loops": False, "smem_budget": 16 * 1024}}
    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: False))
    with pytest.raises(opt_mod.Interrupted):
        mg.superoptimize(_decode(4096), cfg, device="cpu", cache_dir=False, progress=False)
    assert handed == [None]
    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: True))
    with pytest.raises(opt_mod.Interrupted):
        mg.superoptimize(_decode(4096), cfg, device="cpu", cache_dir=False, progress=False)
    assert isinstance(handed[-1], Checker) and handed[-1]._reference.evaluations > 0


def test_a_scout_stopped_by_ctrl_c_stops_the_preparation(monkeypatch):
    """Ctrl-C during the scout: no search follows, so the preparation started for it is
    stopped before its next draw, and its thread is gone when ``superoptimize`` raises."""
    import threading
    import time

    import search as search_pkg
    import search.transfer as tr
    from search.check import Checker

    monkeypatch.setattr(tr, "SCOUT_ELEMENTS", 2 ** 16)
    monkeypatch.setattr(tr, "SCOUT_TARGET", 2 ** 14)
    monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: True))

    def endless(self, *, error=None, stop=None, **kw):  # a preparation that runs until stopped
        while not stop():
            time.sleep(0.01)
        return 0

    monkeypatch.setattr(verify.Reference, "prepare", endless)

    def scout(program, cfg, estimate=None, seeds=(), checker=None):
        time.sleep(0.2)
        raise KeyboardInterrupt

    monkeypatch.setattr(search_pkg, "run", scout)
    with pytest.raises((KeyboardInterrupt, opt_mod.Interrupted)):
        mg.superoptimize(_decode(4096), {"search": {"time_limit": 8, "workers": 1}}, device="cpu",
                         cache_dir=False, progress=False)
    assert not any(t.name == "mugraph-verify-prepare" and t.is_alive() for t in threading.enumerate())


def test_a_checker_made_for_other_settings_is_not_used():
    """``search.run(checker=)`` uses a checker only for the program, error bound and seed it
    was made for."""
    from search.check import Checker
    from search.run_state import RunState

    p = _decode(1024)
    cfg = SearchConfig(time_limit=5, workers=1, progress=False, seed=3)
    mine = Checker(p, cfg.verify_error, 3)
    assert RunState.start(p, cfg, checker=mine).checker is mine
    for other in (Checker(p, cfg.verify_error, 4), Checker(_decode(1024), cfg.verify_error, 3),
                  Checker(p, cfg.verify_error / 2, 3)):
        assert RunState.start(p, cfg, checker=other).checker is not other


def _scouted_call(monkeypatch, scout_s: float, search_s: float, found: int):
    """``superoptimize`` of a 4,096-key decode attention past a lowered scout size, on a fake
    clock: the stubbed scout takes ``scout_s`` of a 20 s limit and the stubbed search
    ``search_s``, returning the scout's μGraph carried up and proven, ``found`` times."""
    import types

    import search as search_pkg
    import search.transfer as tr
    from search.driver import SearchResult
    from search.records import Found

    monkeypatch.setattr(tr, "SCOUT_ELEMENTS", 2 ** 16)
    monkeypatch.setattr(tr, "SCOUT_TARGET", 2 ** 14)
    skew = [0.0]
    real = opt_mod.time
    clock = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("_")})
    clock.perf_counter = lambda: real.perf_counter() + skew[0]
    monkeypatch.setattr(opt_mod, "time", clock)
    program = _decode(4096)
    verdict = verify.equivalent(program, transfer(_found(), program)).to_json()

    def scout_run(prog, cfg, estimate=None):
        skew[0] += scout_s
        return types.SimpleNamespace(graphs=[_found()])

    def main_search(prog, scfg, own_checkpoint, seeds, estimate, checker=None):
        skew[0] += search_s
        return SearchResult(prog.name, [Found(graph_to_json(seeds[0]), "transfer", verdict)] * found,
                            {"complete": True})

    monkeypatch.setattr(search_pkg, "run", scout_run)
    monkeypatch.setattr(opt_mod, "_search", main_search)
    return mg.superoptimize(program, {"search": {"time_limit": 20, "workers": 1}}, device="cpu", cache_dir=False,
                            progress=False)


def test_a_scouts_seconds_do_not_count_twice_against_the_checks(monkeypatch):
    """The checks after the search end at the call's own limit plus half its slack, counted
    from the call's start, scout included. Before, the end was counted from the search's limit
    as the scout had cut it, so the scout's seconds counted twice: an 8k-token prompt whose
    scouted seed was proven had every candidate rejected unchecked (H200). The scout takes
    12 s of a 20 s limit, the search 10 s: the proven seed is checked and ships."""
    opt = _scouted_call(monkeypatch, 12.0, 10.0, 1)
    (carried,) = [c for c in opt.candidates if c.origin == "search"]
    assert carried.rejected == "" and carried.float_ok and opt.best is carried


def test_past_the_checks_end_the_first_proven_candidate_is_still_checked(monkeypatch):
    """Past the checks' end one searched candidate is still checked — the first, the proven
    ones first — and the rest are not: a proven μGraph is checked late rather than thrown
    away (an 8k causal prompt's one proven μGraph came 0.8 s past the end, and the program
    shipped at 0.09× SDPA; H200). The search here ends 7 s past the checks' end (25 s)."""
    opt = _scouted_call(monkeypatch, 12.0, 20.0, 2)
    first, second = [c for c in opt.candidates if c.origin == "search"]
    assert first.rejected == "" and first.float_ok and opt.best is first
    assert second.rejected == opt_mod.UNCHECKED


def test_the_summary_says_what_the_scout_and_the_seeds_did():
    best = opt_mod.Candidate(_found(), "search")
    report = {"device": "cpu", "why": "stub", "error_bound": None,
              "scout": {"shapes": {"K": [2, 32, 256]}, "found": 2, "seeds": 1, "wall_s": 5.7},
              "search": {"graphs": 1, "wall_s": 11.2,
                         "stats": {"derived": {"transfer_seeds": 1, "transfer_verified": 1, "transfer_verify_s": 3.0}}}}
    text = opt_mod.Optimized(_decode(256), best, [best], report, "cpu").summary()
    assert "scout: searched at K (2, 32, 256) for 5.7 s: 2 verified there, 1 carried back as seeds" in text
    assert "seeds carried from other sizes: 1, 1 verified first (3.0 s)" in text


def test_a_scout_that_fails_leaves_the_search_its_time(monkeypatch):
    """Whatever stops the scout's search (here an error of the search itself), the program's
    own search runs, without seeds, with what the scout left of the limit."""
    import search as search_pkg
    import search.transfer as tr
    from mugraph.core.errors import ResourceError

    monkeypatch.setattr(tr, "SCOUT_ELEMENTS", 2 ** 16)
    searched = []

    def scout_run(program, cfg, estimate=None):
        raise ResourceError("out of memory in a worker")

    def main_search(program, scfg, own_checkpoint, seeds, estimate, checker=None):
        searched.append((list(seeds), scfg.time_limit))
        raise KeyboardInterrupt

    monkeypatch.setattr(search_pkg, "run", scout_run)
    monkeypatch.setattr(opt_mod, "_search", main_search)
    with pytest.raises(opt_mod.Interrupted):
        mg.superoptimize(_decode(4096), {"search": {"time_limit": 20, "workers": 1}}, device="cpu",
                         cache_dir=False, progress=False)
    ((seeds, limit),) = searched
    assert seeds == [] and 5.0 <= limit <= 20.0
