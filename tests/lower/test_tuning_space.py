"""lower.profile's tuning space: the sweep around a winner that stages every load (``A``)
keeps ``A`` among its choices, and config_space counts what tune may time. No GPU needed."""

from lower.profile import STAGES, WARPS, config_space, first_round, neighbours
from mugraph.benchmarks import reference


def _kernel(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


def test_sweep_around_a_staged_winner_tries_staging_again():
    g = reference("rmsnorm_matmul", 8)
    blk = _kernel(g).attrs["block"]
    staged = [c for c in first_round(blk) if c.stage_all_loads]
    assert staged, "rmsnorm_matmul b=8's matmul loop has a load Triton does not stage unasked"
    for base in staged[:3]:
        sweep = neighbours(blk, base, WARPS, STAGES)
        assert {c.stage_all_loads for c in sweep} == {False, True}
        # the flaw this guards against: w2s5 with A (found by hand) must be in the sweep
        assert any(c.num_warps == 2 and c.num_stages == 5 and c.stage_all_loads for c in sweep)
        assert len(sweep) == len(set(sweep))


def test_config_space_counts_first_round_picks_and_two_sweeps():
    g = reference("rmsnorm_matmul", 8)
    op = _kernel(g)
    sizes = config_space(g)
    assert set(sizes) == {op.id}
    blk = op.attrs["block"]
    sweep = len(neighbours(blk, first_round(blk)[0], WARPS, STAGES))
    # the first round's picks (at least one, at most all of it) and two sweeps
    assert 2 * sweep < sizes[op.id] <= 2 * sweep + len(first_round(blk))
    assert config_space(g, top=2)[op.id] < sizes[op.id]
