"""Split-loop of a fused norm+attention kernel (what composition and fusion find for
qknorm_gqa), and the composition's fingerprint order: the split pairs are proposed,
fingerprint-match the program and equal it in float64, with the norms inside the first
kernel; composed graphs are fingerprinted one per kernel shape first, within the time."""

import time
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

import mugraph as mg
import search
from mugraph.core.benchmarks import programs
from online_graphs import gqa_blocks
from search import SearchConfig
from search.check import Checker
from search.derive import kernel_shape, composed, sequential, splits
from search.enumerate import cost_key
from search.rewrite import fuse_all, graph_key, split_variants


def norm_then_attention(p: mg.Program, q_tiles: int, loop: int) -> mg.KernelGraph:
    """qknorm_gqa as composition splices it: a Q-norm kernel (heads × query tiles), a
    K-norm kernel over ``loop`` key tiles (both loop-free), and an attention kernel over
    heads × ``q_tiles`` query tiles looping ``loop`` times over the keys."""
    g = mg.KernelGraph(p.name)
    q, k, v = (g.input(t.name, t.shape, t.dtype) for t in p.inputs)
    heads = q.shape[0]
    qa = 1 if q_tiles > 1 else None
    a = mg.BlockGraph((heads, q_tiles, 1), 1)
    a.output(a.accum(mg.rms_norm(a.input(q, (0, qa, None)), 2)), (0, qa, None))
    (qn,) = g.kernel(a)
    b = mg.BlockGraph((heads, loop, 1), 1)
    b.output(b.accum(mg.rms_norm(b.input(k, (0, 2, None)), 1)), (0, 2, None))
    (kn,) = g.kernel(b)
    c = mg.BlockGraph((heads, q_tiles, 1), loop)
    qt = c.input(qn, (0, qa, None))
    kt = c.input(kn, (0, None, None), 2)
    vt = c.input(v, (0, None, None), 1)
    e = mg.exp(mg.scale(qt @ kt, Fraction(1, 8)))
    c.output(c.accum(e @ vt) / c.accum(mg.sum(e, 2)), (0, qa, None))
    g.output(g.kernel(c)[0])
    return g


def fused_norm_attention(p: mg.Program, q_tiles: int, loop: int) -> mg.KernelGraph:
    """:func:`norm_then_attention` with both norm kernels fused into the attention loop."""
    f = fuse_all(norm_then_attention(p, q_tiles, loop))[-1]
    assert f.num_kernels == 1
    return f


def _agree(p, g, seed=0):
    rng = np.random.default_rng(seed)
    x = {t.name: rng.uniform(0.5, 1.5, t.shape) for t in p.inputs}
    return np.allclose(mg.evaluate(g, x)[0], mg.evaluate(p, x)[0], rtol=1e-9, atol=0)


def _blocks(g):
    return [op.attrs["block"] for op in g.ops if op.kind == "graph_defined"]


def test_split_pairs_of_a_fused_norm_attention_kernel_are_proposed_and_match():
    # two heads, 16 query rows, 4096 keys in 16 steps of 256: two blocks that loop 16 times,
    # the shape where a split pays (the search finds this kernel by composition + fusion)
    p = programs.qknorm_gqa(1, queries=16, head_dim=16, kv=4096)
    f = fused_norm_attention(p, 1, 16)
    assert _agree(p, f)
    ck = Checker(p)
    stats: dict = {}
    props = splits([f], sequential(ck), stats)
    assert props and stats["split_matches"] == len(props)
    for pr in props:
        first, combine = _blocks(pr.graph)
        # the norms run in the first kernel (fused), the combine loops over the chunks
        assert any(o.kind == "sqrt" for o in first.ops) and not any(o.kind == "sqrt" for o in combine.ops)
        assert combine.forloop > 1 and combine.forloop in first.grid
        assert cost_key(pr.graph)[1] < cost_key(f)[1]
        assert _agree(p, pr.graph)
    # finer steps: a 4-way split keeps 16 steps of 64 keys (each block's tiles a quarter of
    # the source's), besides 4 steps of 256
    loops = {(b[0].grid[1], b[0].forloop) for b in map(_blocks, split_variants(f))}
    assert {(4, 4), (4, 16)} <= loops
    fine = [h for h in split_variants(f) if (_blocks(h)[0].grid[1], _blocks(h)[0].forloop) == (4, 16)]
    assert fine and all(ck.fingerprint_matches(h) and _agree(p, h) for h in fine)


@pytest.mark.parametrize("executor,workers", [("serial", 1), ("processes", 2)])
def test_search_reaches_the_split_of_the_fused_norm_attention_kernel(executor, workers):
    """End to end at reduced shapes: pieces searched, spliced and fused into one kernel, its
    loop split — the verified graphs include a split-KV pair whose first kernel holds the norms."""
    p = programs.qknorm_gqa(1, queries=16, head_dim=16, kv=4096)
    # whole query rows per block (full_split_max below the 16 rows, tile sizes above them):
    # a kernel of two blocks looping over the keys, which a split puts on more SMs
    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=8, full_split_max=8, tile_sizes=(256,),
                       forloop_ranges=(16,), workers=workers, executor=executor, time_limit=40, verify_reserve=12,
                       compose_share=0.5, progress=False, verify_error=1e-3, max_verify=3)
    r = search.run(p, cfg)
    assert "composed+fused" in r.origins
    pairs = [g for g, o in zip(r.graphs, r.origins) if o == "split-loop"]
    assert pairs, (r.origins, r.stats["derived"])
    first, combine = _blocks(pairs[0])
    assert any(o.kind == "sqrt" for o in first.ops) and combine.forloop in first.grid
    assert all(_agree(p, g) for g in pairs)


class _Recording(Checker):
    """A Checker that records the order of the graphs it fingerprints."""

    def __init__(self, program):
        super().__init__(program)
        self.seen = []

    def fingerprint_matches(self, graph, stop_at=None):
        self.seen.append(graph)
        return super().fingerprint_matches(graph, stop_at)


def test_composed_graphs_are_fingerprinted_one_per_shape_first_within_the_time():
    p = programs.qknorm_gqa(1, queries=16, head_dim=16, kv=64)
    cache: dict = {}

    def run_once(piece, cfg):  # the piece searches run once, briefly; the three calls below share them
        key = graph_key(piece)
        if key not in cache:
            cache[key] = search.run(piece, replace(cfg, time_limit=4.0))
        return cache[key]

    cfg = SearchConfig(max_kernel_ops=1, max_block_ops=8, tile_sizes=(16,), forloop_ranges=(4,), workers=1,
                       executor="serial", progress=False)
    full, stats = _Recording(p), {}
    composed(p, cfg, 60.0, sequential(full), stats, run_once)
    n = stats["composed_graphs"]
    assert n == stats["composed_fingerprinted"] == len(full.seen) > 4
    shapes = [kernel_shape(g) for g in full.seen]
    distinct = len(set(shapes))
    assert 1 < distinct <= n
    assert len(set(shapes[:distinct])) == distinct  # every shape before a second of any
    # the budget spent (the pieces took it): one per shape only
    few, st = _Recording(p), {}
    composed(p, cfg, 0.0, sequential(few), st, run_once)
    assert [kernel_shape(g) for g in few.seen] == shapes[:distinct] and st["composed_fingerprinted"] == distinct
    # past the deadline: none
    none, st = _Recording(p), {}
    assert composed(p, cfg, 60.0, sequential(none), st, run_once, deadline=time.monotonic() - 1) == []
    assert none.seen == [] and st["composed_fingerprinted"] == 0


def test_lowering_model_prices_the_split_of_the_full_size_fused_kernel():
    """qknorm_gqa b=8 at full shapes: the fused kernel composition finds (16 heads × 4 query
    tiles of 64 rows, 16 steps of 256 keys). Its split pairs — the 4-way split also in 16
    steps of 64 keys, the hand-written kernel's step — rank before it by the search's cost
    key, and the lowering's model prices each, as written (default configs), faster than
    the unsplit kernel. Tuned, the model puts them well behind the hand-written split-KV
    reference, as measured: on an H200 the splits of the fused kernel ran 36.3–38.7 μs and
    the reference 26.4 (``lower/data/h200_candidates.jsonl.gz``) — their first kernel
    normalizes each step's K tile inside the attention loop (the model's ``t_cone``)."""
    from lower.cost_model import estimate
    from mugraph.core.benchmarks import reference
    from mugraph.pipeline.timing import predict_tuned

    p = programs.qknorm_gqa(8)
    f = fused_norm_attention(p, 4, 16)
    assert (_blocks(f)[0].grid, _blocks(f)[0].forloop) == ((16, 4, 1), 16)
    by_shape = {tuple((b.grid, b.forloop) for b in _blocks(h)): h for h in split_variants(f)}
    fine = by_shape[(((16, 4, 4), 16), ((16, 4, 1), 4))]
    coarse = by_shape[(((16, 4, 4), 4), ((16, 4, 1), 4))]
    ref = predict_tuned(reference("qknorm_gqa", 8)).predicted_s
    for h in (fine, coarse):
        assert cost_key(h)[1] < cost_key(f)[1]
        assert estimate(h) < estimate(f)
        assert predict_tuned(h).predicted_s > 1.3 * ref


def test_a_kernel_the_lowering_can_split_ranks_at_its_best_split(monkeypatch):
    """The driver credits a match with its best split variant's estimate (the lowering splits
    a loop itself): a kernel of two blocks looping 64 times over 1024 keys is ranked, and so
    verified, as what it becomes split — ahead of a kernel its own estimate ranked it behind.
    (The loop-free rival would get a loop of its own among the tile variants, which would
    then outrank both: tests/search/test_loops.py; here it stays loop-free, and the retiles
    go one step: search.derive.near_tilings.)"""
    import search.derive
    from search.candidates import split_loops

    monkeypatch.setattr(search.derive, "loop_variants", lambda g, smem_budget=None: [])
    # (and the retiles one step away: a step two doublings away would outrank both, as it should)
    from search.rewrite import tile_variants
    monkeypatch.setattr(search.derive, "near_tilings", tile_variants)
    from search.run_state import RunState
    from search.verification import order
    from search.records import Match
    from search.enumerate import signature
    from mugraph.core.serialize import graph_to_json

    p = programs.gqa(1, queries=16, head_dim=16, kv=1024)

    def attention(loop):
        g = mg.KernelGraph("gqa")
        q, k, v = (g.input(t.name, t.shape, t.dtype) for t in p.inputs)
        b = mg.BlockGraph((2, 1, 1), loop)
        fm = (2, 1) if loop > 1 else (None, None)
        qt = b.input(q, (0, None, None)); kt = b.input(k, (0, None, None), fm[0]); vt = b.input(v, (0, None, None), fm[1])
        e = mg.exp(qt @ kt)
        b.output(b.accum(e @ vt) / b.accum(mg.sum(e, 2)), (0, None, None))
        g.output(g.kernel(b)[0])
        return g

    two, whole = attention(64), attention(1)
    own = cost_key(two)
    best = min(cost_key(h)[1] for h in split_variants(two))
    assert best < own[1] and split_variants(whole) == []
    # a rival that cannot be split (no loop), priced between the two (only its cost matters here)
    rival = Match((1, (best + own[1]) / 2, 0, 0), 0, 1, graph_to_json(whole), "gd", "enumeration")
    m = Match(tuple(own), 0, 0, graph_to_json(two), signature(two), "enumeration")
    state = RunState.start(p, SearchConfig(workers=1, executor="serial", time_limit=None, progress=False))
    matches = [rival, m]
    split_loops(state, matches)
    credited = next(x for x in matches if x.rank == 0 and x.task == 0)
    assert credited.cost == (1, best, *own[2:])
    assert state.dstats["split_credited"] == 1 and state.dstats["split_matches"] >= 1
    assert order(matches)[0] is credited


def test_the_tile_variants_keep_half_of_the_split_phase(monkeypatch):
    """The split variants take at most half of the phase's share: with fingerprints slow
    enough to use the whole share, the tile variants (which spread a few-block kernel over
    the grid) are still made and proposed."""
    import time

    from search.candidates import split_loops
    from search.records import Match
    from search.run_state import RunState
    from search.enumerate import signature
    from mugraph.core.serialize import graph_to_json

    p = programs.gqa(1, queries=16, head_dim=16, kv=4096)
    g = gqa_blocks(p, 2, 256)
    state = RunState.start(p, SearchConfig(workers=1, executor="serial", time_limit=4.0, progress=False))
    state.estimate = lambda h: cost_key(h)[1]

    def slow_fingerprint(h, stop_at=None):  # a fingerprint at full shapes takes tenths of a second
        time.sleep(0.3)
        return True

    monkeypatch.setattr(state.checker, "fingerprint_matches", slow_fingerprint)
    matches = [Match(tuple(cost_key(g)), 0, 0, graph_to_json(g), signature(g), "enumeration")]
    split_loops(state, matches)
    stats = state.dstats
    # the split variants' fingerprints stop at half of the phase's share (a quarter of 4 s);
    # with the whole share they ran to its end and the tile variants got none
    assert 1 <= stats["split_fingerprinted"] < 4 and stats["split_s"] < 0.8
    assert stats["retile_variants"] >= 1 and stats["retile_matches"] >= 1


def test_split_variants_skip_the_fingerprint_only_where_verifying_is_cheap(monkeypatch):
    """Where verifications run here on a GPU (pretended; the verifier stays on the CPU) and a
    field test's program evaluation is cheap, the split variants are proposed without a
    fingerprint (the verifier decides, as for tile variants): slow fingerprints no longer
    starve them. On the CPU, or where tests are slow, they are fingerprinted first."""
    import time

    from search import candidates
    from search.candidates import split_loops
    from search.check import Checker
    from search.records import Match
    from search.run_state import RunState
    from search.enumerate import signature
    from mugraph.core.serialize import graph_to_json

    p = programs.gqa(1, queries=16, head_dim=16, kv=4096)
    g = gqa_blocks(p, 2, 256)

    def run(gpu: bool, test_s: float) -> dict:
        monkeypatch.setattr(Checker, "on_gpu", staticmethod(lambda: gpu))
        monkeypatch.setattr(Checker, "seconds_per_test", lambda self: test_s)
        state = RunState.start(p, SearchConfig(workers=2, executor="processes", time_limit=4.0, progress=False))
        state.estimate = lambda h: cost_key(h)[1]
        monkeypatch.setattr(state.checker, "fingerprint_matches", lambda h, stop_at=None: time.sleep(0.5) or True)
        split_loops(state, [Match(tuple(cost_key(g)), 0, 0, graph_to_json(g), signature(g), "enumeration")])
        return state.dstats

    cheap = run(True, candidates.CHEAP_TEST_S / 2)
    assert cheap["split_unfingerprinted"] and "split_fingerprinted" not in cheap and cheap["split_matches"] >= 4
    for gpu, test_s in ((False, 0.001), (True, 1.0)):
        d = run(gpu, test_s)
        assert not d["split_unfingerprinted"] and d["split_fingerprinted"] <= 2 and d["split_matches"] <= 2
