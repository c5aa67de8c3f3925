"""``graph_budget``: a compiled graph's pieces share one budget of search and tuning, so a
model's cold compile is bounded whatever its size; the share depends only on the graph's
distinct pieces, so a warm compile looks up the keys the cold one stored."""

import pytest
import torch

import mugraph.frontend.run as run
from mugraph.core.errors import ConfigError
from mugraph.frontend import FrontendOptions, from_torch
from mugraph.frontend.options import MIN_PIECE_S


def test_each_distinct_piece_gets_its_share_of_the_budget():
    o = FrontendOptions()
    assert o.graph_budget == 160.0 and o.time_limit == 30.0
    assert o.for_pieces(2) is o                       # 160 / 4 = 40 s: the piece's own 30 s is less
    assert o.for_pieces(8).time_limit == pytest.approx(10.0)
    assert o.for_pieces(1000).time_limit == MIN_PIECE_S
    assert o.for_pieces(8).key() != o.key()           # another limit is another result
    assert FrontendOptions(graph_budget=None).for_pieces(100).time_limit == 30.0
    for bad in (0, -1, True, "60"):
        with pytest.raises(ConfigError, match="graph_budget"):
            FrontendOptions(graph_budget=bad)


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
    n = len({(bp.name, bp.layout_key) for bp in cap.pieces})
    assert n >= 1 and seen == [pytest.approx(max(MIN_PIECE_S, min(30, 20 / (2 * n))))] * len(cap.pieces)
