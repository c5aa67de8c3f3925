"""``graph_budget``: a compiled graph's pieces share one budget of search and tuning, so a
model's cold compile is bounded whatever its size; the share depends only on the graph's
distinct pieces and their weights (one, and one per matmul or reduction), so a warm compile
looks up the keys the cold one stored."""

import pytest
import torch

import mugraph.frontend.run as run
from mugraph.core.errors import ConfigError
from mugraph.frontend import FrontendOptions, from_torch
from mugraph.frontend.options import MIN_PIECE_S, piece_weight


def test_each_distinct_piece_gets_its_share_of_the_budget():
    o = FrontendOptions()
    assert o.graph_budget == 160.0 and o.time_limit == 30.0
    assert o.for_piece(1, 2) is o                     # 80 / 2 = 40 s: the piece's own 30 s is less
    assert o.for_piece(2, 16).time_limit == pytest.approx(10.0)
    assert o.for_piece(5, 20).time_limit == pytest.approx(20.0)  # a decode attention of a LLaMA step
    assert o.for_piece(1, 1000).time_limit == MIN_PIECE_S
    assert o.for_piece(2, 16).key() != o.key()        # another limit is another result
    assert FrontendOptions(graph_budget=None).for_piece(1, 100).time_limit == 30.0
    for bad in (0, -1, True, "60"):
        with pytest.raises(ConfigError, match="graph_budget"):
            FrontendOptions(graph_budget=bad)


def test_a_piece_weighs_one_and_one_per_folded_dim():
    assert piece_weight(["input", "matmul", "scale", "add", "max", "sub", "exp", "matmul", "sum", "div"]) == 5
    assert piece_weight(["input", "input", "matmul", "add"]) == 2
    assert piece_weight(["input", "mul", "tanh", "add"]) == 1


def test_the_graph_passes_the_share_to_its_pieces(monkeypatch):
    def f(x, w1, w2):
        a = torch.exp(x @ w1) * 2                     # two pieces of different shapes,
        b = torch.exp(a[:, :4] @ w2) * 3              # a cosine between them
        return torch.cos(b)

    g = torch.Generator().manual_seed(0)
    cap = from_torch(f, torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g),
                     torch.randn(4, 8, generator=g))
    seen = []
    monkeypatch.setattr(run, "optimize_piece", lambda bp, opts, dev: seen.append(opts.time_limit))
    cap.compile(time_limit=30, graph_budget=20, device="cpu")
    w = {(bp.name, bp.layout_key): piece_weight([op.kind for op in bp.program.ops]) for bp in cap.pieces}
    total = sum(w.values())
    assert len(w) >= 1 and seen == [pytest.approx(max(MIN_PIECE_S, min(30, 20 / 2 * w[(bp.name, bp.layout_key)] / total)))
                                    for bp in cap.pieces]
