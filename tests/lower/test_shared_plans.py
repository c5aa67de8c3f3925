"""What the tuner and the cost model share between the rankings of one block's configurations:
analyses and plans within ``lower.tiles.shared_analyses``, launch prices and first rounds per
frozen block — the same answers as made anew, an error raised again, and nothing kept alive."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

import lower.cost_model as cost_model
import lower.profile  # noqa: F401 - the module (the package's ``profile`` is a function)
import mugraph as mg
from lower.config import KernelConfig, KernelConfigError
from lower.plan import plan
from lower.tiles import shared_analyses
from mugraph.core.benchmarks import handwritten

profile_mod = sys.modules["lower.profile"]


def _gemv() -> mg.KernelGraph:
    """A hand-written μGraph of one kernel (RMSNorm, then a projection): 4 blocks of 32
    columns, a loop of 4 steps."""
    return handwritten.rmsnorm_matmul(b=1, hidden=256, out=128, col_tile=32, loop=4)


def _block(g):
    return next(op for op in g.ops if op.kind == "graph_defined").attrs["block"]


def test_a_plan_is_made_once_within_the_context_and_anew_outside():
    blk = _block(_gemv())
    cfg = KernelConfig(split=2)
    with shared_analyses():
        first = plan(blk, cfg)
        assert plan(blk, cfg) is first
        assert plan(blk, KernelConfig(split=4)) is not first
        with shared_analyses():  # nested: the outer memo
            assert plan(blk, cfg) is first
    again = plan(blk, cfg)
    assert again is not first and plan(blk, cfg) is not again
    assert (again.programs, again.iterations, again.steps) == (first.programs, first.iterations, first.steps)


def test_a_config_the_block_cannot_take_is_refused_each_time():
    blk = _block(_gemv())  # a loop of 4 steps: split 3 does not divide it
    with shared_analyses():
        for _ in range(2):
            with pytest.raises(KernelConfigError, match="split 3 must divide forloop 4"):
                plan(blk, KernelConfig(split=3))


def test_an_unfrozen_block_is_not_memoized():
    bg = mg.BlockGraph(grid=(4, 1, 1), forloop=4)
    kg = mg.KernelGraph("open")
    X, W = kg.input("X", (1, 256), "float16"), kg.input("W", (256, 128), "float16")
    x, w = bg.input(X, imap=(None,), fmap=1), bg.input(W, imap=(1,), fmap=0)
    bg.output(bg.accum(x @ w), omap=(1,))
    assert not bg.frozen
    with shared_analyses():
        assert plan(bg) is not plan(bg)


def test_prices_are_the_same_as_made_anew_and_copies(monkeypatch):
    g = _gemv()
    op = next(op for op in g.ops if op.kind == "graph_defined")
    cfgs = [KernelConfig(num_warps=w, split=s) for w in (4, 8) for s in (1, 2, 4)]
    priced = [cost_model._block_cost(op, c, cost_model.H100) for c in cfgs]
    assert [cost_model._block_cost(op, c, cost_model.H100) for c in cfgs] == priced
    assert [cost_model._price_block(op, c, cost_model.H100) for c in cfgs] == priced
    calls = []
    monkeypatch.setattr(cost_model, "_price_block", lambda *a, **k: calls.append(a) or [])
    again = cost_model._block_cost(op, cfgs[0], cost_model.H100)
    assert calls == [] and again == priced[0] and again[0] is not priced[0][0]
    # another device or the graph in L2 is another question
    cost_model._block_cost(op, cfgs[0], cost_model.H100, in_l2=True)
    assert len(calls) == 1


def test_a_refused_config_is_priced_as_refused_each_time():
    g = _gemv()
    op = next(op for op in g.ops if op.kind == "graph_defined")
    for _ in range(2):
        with pytest.raises(KernelConfigError, match="split 3"):
            cost_model._block_cost(op, KernelConfig(split=3), cost_model.H100)


def test_the_first_round_is_listed_once_per_block_and_menu(monkeypatch):
    blk = _block(_gemv())
    first = profile_mod.first_round(blk)
    monkeypatch.setattr(profile_mod, "_first_round", lambda *a: pytest.fail("listed again"))
    assert profile_mod.first_round(blk) == first
    first.clear()  # a caller's copy
    assert profile_mod.first_round(blk)


def test_nothing_keeps_a_block_alive():
    g = _gemv()
    blk = _block(g)
    op = next(op for op in g.ops if op.kind == "graph_defined")
    with shared_analyses():
        plan(blk, KernelConfig())
        cost_model.estimate(g, cost_model.H100, {op.id: KernelConfig()})
        profile_mod.first_round(blk)
    ref = weakref.ref(blk)
    del g, blk, op
    gc.collect()
    assert ref() is None


def test_tuning_by_the_model_alone_is_unchanged_by_the_memos():
    """The cost model's ranking of a block's configurations, with every memo warm, is the one
    a fresh process makes: the configs predicted best and their predictions."""
    import lower

    g1, g2 = _gemv(), _gemv()
    cold = lower.tune(g1, predict_only=True)
    warm = lower.tune(g1, predict_only=True)
    other = lower.tune(g2, predict_only=True)
    assert cold.configs == warm.configs == {k: v for k, v in other.configs.items()}
    assert cold.predicted_s == warm.predicted_s == other.predicted_s
