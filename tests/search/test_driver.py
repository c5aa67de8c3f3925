"""search.run: verified results, determinism, checkpoint/resume, JSON round trip."""

import json

import mugraph as mg
import search
from search import SearchConfig, SearchResult


def _program():
    p = mg.Program("expmm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32)); V = p.input("V", (64, 32))
    p.output(mg.exp(X @ W) * (X @ V))
    return p


def _cfg(**kw):
    base = dict(max_kernel_ops=1, max_block_ops=5, tile_sizes=(16,), forloop_ranges=(4,), workers=1, verify_error=1e-3,
                progress=False)
    base.update(kw)
    return SearchConfig(**base)


def test_finds_single_kernel_and_is_deterministic(tmp_path):
    a = search.run(_program(), _cfg())
    assert a.stats["complete"]
    assert a.graphs and any(g.num_kernels == 1 for g in a.graphs)
    for g in a.graphs[:3]:
        assert g.num_kernels >= 1
    b = search.run(_program(), _cfg(workers=2))
    assert a.graph_json == b.graph_json
    p = a.save(tmp_path / "r.json")
    c = SearchResult.load(p)
    assert c.graph_json == a.graph_json and c.stats == json.loads(json.dumps(a.stats))


def test_checkpoint_resume_gives_same_result(tmp_path):
    full = search.run(_program(), _cfg())
    ck = str(tmp_path / "ck.json")
    part = search.run(_program(), _cfg(checkpoint=ck, time_limit=0.3))
    assert not part.stats["complete"] or part.graph_json == full.graph_json
    resumed = search.run(_program(), _cfg(checkpoint=ck))
    assert resumed.stats["complete"]
    assert resumed.graph_json == full.graph_json


def test_generality_softmax_and_residual_norm():
    p = mg.Program("softmax")
    X = p.input("X", (16, 64))
    E = mg.exp(X)
    p.output(E / mg.sum(E, 1))
    r = search.run(p, _cfg(max_kernel_ops=1, max_block_ops=4))
    assert any(g.num_kernels == 1 for g in r.graphs)
    q = mg.Program("residual_rmsnorm")
    H = q.input("H", (8, 64)); R = q.input("R", (8, 64))
    q.output(mg.rms_norm(H + R))
    r = search.run(q, _cfg(max_kernel_ops=1, max_block_ops=7))
    assert any(g.num_kernels == 1 for g in r.graphs)


def test_generality_low_rank_chain():
    """``(X @ U) @ V`` (a rank-8 bottleneck): one kernel that recomputes the small X@U per block."""
    p = mg.Program("low_rank_chain")
    X = p.input("X", (16, 64)); U = p.input("U", (64, 8)); V = p.input("V", (8, 64))
    p.output((X @ U) @ V)
    r = search.run(p, _cfg(max_kernel_ops=1, max_block_ops=4))
    ones = [g for g in r.graphs if g.num_kernels == 1]
    assert ones
    assert any(g.ops[-1].attrs["block"].num_blocks > 1 for g in ones)


def test_iterative_deepening_and_verification_budget():
    """Phase 1 (one kernel op) comes first; only a bounded number of fingerprint
    matches is fully verified, cheapest first, per kernel count."""
    p = mg.Program("mm_exp")
    X = p.input("X", (8, 32)); W = p.input("W", (32, 16))
    p.output(mg.exp(X @ W))
    r = search.run(p, _cfg(max_kernel_ops=2, max_block_ops=3, max_verify=3, verify_per_kernels=1))
    st = r.stats
    assert st["search"]["verifications"] <= 3
    ks = [g.num_kernels for g in r.graphs]
    assert ks and ks[0] == 1 and ks == sorted(ks) and len(set(ks)) == len(ks)
    assert st["search"]["fingerprint_matches"] == sum(n for _, n in st["fingerprint_matches_by_kernels"])
    assert st["search"]["unverified_matches"] == st["search"]["fingerprint_matches"] - st["search"]["verifications"]
    assert set(st["phase_complete_seconds"]) == {1, 2}
