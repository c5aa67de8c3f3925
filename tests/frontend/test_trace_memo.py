"""The stored ATen trace (mugraph.frontend.trace_memo): a warm start rebuilds the graph an
earlier compile traced — the same nodes, targets, arguments and values' layouts, so the same
pieces — and anything it cannot store or rebuild is traced again."""

import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.frontend import trace_memo as M
from mugraph.frontend.backend import recent_graphs
from mugraph.frontend.capture import trace
from mugraph.frontend.graph import Captured

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import _layers as L  # noqa: E402


def _step(family: str = "llama"):
    cfg, layer, rope = L.build_layer(family, True, "cpu", torch.float32, "sdpa", 64)
    ins, _ = L.static_inputs(cfg, rope, 1, 16, "cpu", torch.float32)
    return L.make_static_step(layer), ins


def _dynamo_graph(fn, ins):
    got = {}

    def grab(gm, example_inputs):
        got["gm"], got["inputs"] = gm, tuple(example_inputs)
        return gm
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=grab)(*ins)
    return got["gm"], got["inputs"]


def _layout(v):
    return None if v is None else (tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype, v.device.type)


@pytest.mark.parametrize("family", list(L.FAMILIES))
def test_a_stored_trace_rebuilds_the_same_graph_and_pieces(family):
    gm, ins = _dynamo_graph(*_step(family))
    with torch.no_grad():
        traced = trace(gm, ins)
    rebuilt = M.loads(M.dumps(traced), ins)
    a, b = list(traced.graph.nodes), list(rebuilt.graph.nodes)
    assert [(n.op, n.target, str(n.args)) for n in a] == [(n.op, n.target, str(n.args)) for n in b]
    assert any(callable(n.target) and not isinstance(n.target, torch._ops.OpOverload) for n in b)  # rotate_half
    assert [_layout(n.meta.get("val")) for n in a] == [_layout(n.meta.get("val")) for n in b]
    ca, cb = Captured(traced), Captured(rebuilt)
    assert [(p.name, p.layout_key) for p in ca.pieces] == [(p.name, p.layout_key) for p in cb.pieces]
    assert len(ca.library) == len(cb.library) and ca.pieces


def test_a_warm_compile_rebuilds_the_stored_trace_and_a_bad_file_is_traced_again(tmp_path, caplog):
    step, ins = _step()
    with torch.no_grad():
        want = step(*ins)
    opts = {"cache_dir": str(tmp_path), "time_limit": 2.0, "inductor": False}

    def compile_once():
        torch._dynamo.reset()
        from mugraph.frontend import run
        run.forget()
        with torch.no_grad():
            got = torch.compile(step, backend="mugraph", options=opts)(*ins)
        (cap,) = recent_graphs()[-1].captured.values()
        return got, cap

    got, cap = compile_once()
    assert cap.timings["stored_trace"] == 0.0
    (stored,) = (tmp_path / "traces").glob("*.trace")
    again, cap2 = compile_once()
    assert cap2.timings["stored_trace"] == 1.0 and "the stored trace" in cap2.timing_summary()
    assert [p.name for p in cap2.pieces] == [p.name for p in cap.pieces]
    torch.testing.assert_close(again, got)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # a file cut short: one log line, the graph traced again (and stored again, whole)
    stored.write_bytes(stored.read_bytes()[:100])
    caplog.set_level("INFO", logger="mugraph")
    third, cap3 = compile_once()
    assert cap3.timings["stored_trace"] == 0.0 and any("could not be rebuilt" in m for m in caplog.messages)
    torch.testing.assert_close(third, got)
    assert stored.stat().st_size > 100  # stored again, whole


def test_what_the_memo_cannot_store_is_traced_every_time(tmp_path):
    """A graph holding a tensor of its own (a get_attr constant) is not stored; ``cache_dir=False``
    stores nothing; the key changes with the inputs' layout."""
    class WithConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.ones(4))

        def forward(self, x):
            return x * self.w

    gm = fx.symbolic_trace(WithConstant())
    x = torch.randn(2, 4)
    with pytest.raises(M.NotStorable):
        M.dumps(gm)
    out, stored = M.traced(gm, (x,), tmp_path, lambda g, ins: g)
    assert out is gm and not stored and not list(tmp_path.glob("*.trace"))
    assert M.folder_of(False) is None and M.folder_of(str(tmp_path)) == tmp_path / "traces"
    plain = fx.symbolic_trace(lambda a: a + 1)
    assert M.key(plain, (x,)) != M.key(plain, (x.t().contiguous().t(),)) != M.key(plain, (torch.randn(3, 4),))


def test_the_key_reads_the_nodes_not_generated_code(tmp_path):
    """The key is the nodes' printed form: it changes with a constant argument and a target,
    is the same for an equal graph traced again; a node naming an object only by its address
    has no key (another process would never find it), and such a graph is traced, not stored."""
    x = torch.randn(2, 4)
    a, b = fx.symbolic_trace(lambda t: t * 2 + 1), fx.symbolic_trace(lambda t: t * 2 + 1)
    assert M.key(a, (x,)) == M.key(b, (x,))
    assert M.key(a, (x,)) != M.key(fx.symbolic_trace(lambda t: t * 3 + 1), (x,))
    assert M.key(a, (x,)) != M.key(fx.symbolic_trace(lambda t: t * 2 - 1), (x,))
    text = M.graph_text(a)
    assert "mul" in text and "add" in text and " at 0x" not in text

    g = fx.Graph()
    p = g.placeholder("t")
    g.output(g.call_function(getattr, (p, object())))  # an argument printed by its address
    anonymous = M.lazy_module(g)  # (its code would not compile)
    with pytest.raises(M.NotStorable):
        M.key(anonymous, (x,))
    out, stored = M.traced(anonymous, (x,), tmp_path, lambda gm, ins: gm)
    assert out is anonymous and not stored and not list(tmp_path.glob("*.trace"))

    lazy = M.lazy_module(a.graph)
    assert lazy._needs_recompile()  # nothing generated yet ...
    torch.testing.assert_close(lazy(x), x * 2 + 1)  # ... and it still runs when called
    assert not lazy._needs_recompile()


def test_the_rebuilt_trace_is_code_free_until_called():
    gm, ins = _dynamo_graph(*_step())
    with torch.no_grad():
        traced = trace(gm, ins)
        rebuilt = M.loads(M.dumps(traced), ins)
        from torch.fx._lazy_graph_module import _LazyGraphModule
        assert isinstance(rebuilt, _LazyGraphModule) and rebuilt._needs_recompile()
        torch.testing.assert_close(rebuilt(*ins), traced(*ins))


def test_the_collector_is_paused_only_for_the_block():
    import gc

    from mugraph.frontend.graph import gc_paused

    assert gc.isenabled()
    with gc_paused() as pause:
        assert not gc.isenabled()
        pause.resume()
        assert gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failing block")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused() as pause:
            pause.resume()
            assert not gc.isenabled()  # a caller's own pause is left as it was
    finally:
        gc.enable()
