"""The graph without its pieces compiled ahead in a child process (``mugraph.frontend.ahead``):
the child's compile serves the backend's own from Inductor's FX graph cache, with the same
result; a graph pickle cannot carry is compiled here as before; a child that fails or is
not needed is handled and cleaned up."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from mugraph.frontend import ahead


@pytest.fixture(autouse=True)
def _fresh_inductor_cache(tmp_path, monkeypatch):
    """Each test with a cache folder of its own, which the child inherits: a hit can only come
    from the child's compile in that test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _graph() -> tuple[fx.GraphModule, list]:
    """A small graph as dynamo hands it to a backend, and its inputs; it calls a tensor
    method (``view``), which AOTAutograd's cache takes as a tensor's only where the
    receiver's node has an example value."""
    seen = {}

    def grab(gm, example_inputs):
        seen["gm"] = gm
        return gm.forward

    w = torch.randn(16, 16)
    torch._dynamo.reset()  # one code object compiled by every test: past dynamo's recompile limit it runs eagerly
    torch.compile(lambda x: torch.tanh(x @ w).view(-1) * 3 + 1, backend=grab)(torch.randn(4, 16))
    return seen["gm"], [torch.randn(4, 16), w]


def test_the_childs_compile_serves_the_backends_from_the_cache():
    gm, args = _graph()
    want = gm(*args)
    job = ahead.start(gm, args)
    assert job is not None
    before = counters["inductor"]["fxgraph_cache_hit"]
    traced = counters["aot_autograd"]["autograd_cache_hit"]
    wall = __import__("time").time() - job.started
    fn = job.finish()
    assert job.proc.returncode == 0 and job.waited_s is not None
    # the child says when its compile ended: the measure of Inductor the graph clock learns from
    assert 0 < job.compile_s() <= wall + job.waited_s
    assert counters["inductor"]["fxgraph_cache_hit"] == before + 1
    # the trace too comes from the child's compile, not only Inductor's code
    assert counters["aot_autograd"]["autograd_cache_hit"] == traced + 1
    got = fn(*args)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = want[0] if isinstance(want, (list, tuple)) else want
    torch.testing.assert_close(got, want)
    assert not any(os.path.exists(job.path + x) for x in ("", ".err", ".done"))


def test_a_compile_here_without_a_child_is_served_by_what_a_compile_ahead_cached():
    """A warm compile whose graph runs without its pieces starts no child: it compiles the
    same pickled copy here (``compile_copy``), so the cold compile's caches serve it whole."""
    gm, args = _graph()
    ahead.compile_copy(gm, args)  # the cold compile (a child's compiles the same copy: the test above)
    before = counters["inductor"]["fxgraph_cache_hit"]
    traced = counters["aot_autograd"]["autograd_cache_hit"]
    fn = ahead.compile_copy(gm, args)
    assert counters["inductor"]["fxgraph_cache_hit"] == before + 1
    assert counters["aot_autograd"]["autograd_cache_hit"] == traced + 1
    got, want = fn(*args), gm(*args)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got,
                               want[0] if isinstance(want, (list, tuple)) else want)


def test_a_graph_pickle_cannot_carry_is_compiled_here(caplog):
    gm, args = _graph()
    local = lambda t: t  # noqa: E731 - a local function: pickle cannot name it
    node = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(node):
        wrapped = gm.graph.call_function(local, (node.args[0][0],))
    node.args = ((wrapped,),)
    gm.recompile()
    with caplog.at_level(logging.INFO, logger="mugraph"):
        assert ahead.start(gm, args) is None
        fn = ahead.compile_copy(gm, args)  # compiled from the graph itself
    assert any("compiled after the searches (it cannot be pickled" in m for m in caplog.messages)
    assert any("compiled from dynamo's graph (it cannot be pickled" in m for m in caplog.messages)
    got, want = fn(*args), gm(*args)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got,
                               want[0] if isinstance(want, (list, tuple)) else want)


def test_a_child_that_fails_is_said_and_the_compile_made_here(caplog):
    gm, args = _graph()
    job = ahead.start(gm, args)
    job.proc.kill()
    with caplog.at_level(logging.INFO, logger="mugraph"):
        fn = job.finish()
    assert any("compile ahead failed" in m for m in caplog.messages)
    assert job.compile_s() is None  # nothing measured: the graph clock keeps its own end
    got = fn(*args)
    want = gm(*args)
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got,
                               want[0] if isinstance(want, (list, tuple)) else want)


def test_a_child_not_needed_is_stopped_and_its_files_removed():
    gm, args = _graph()
    job = ahead.start(gm, args)
    job.close()
    assert job.proc.poll() is not None
    assert not os.path.exists(job.path) and not os.path.exists(job.path + ".err")


def test_inputs_are_remade_with_their_layout():
    x = torch.randn(8, 4).t()
    (made, value) = ahead.make_inputs(ahead.describe_inputs([x.requires_grad_(), 3]))
    assert made.shape == x.shape and made.stride() == x.stride() and made.dtype == x.dtype
    assert made.requires_grad and value == 3


def test_the_backend_option_is_checked():
    from mugraph.core.errors import ConfigError
    from mugraph.frontend import FrontendOptions

    assert FrontendOptions().compile_ahead is True
    with pytest.raises(ConfigError, match="compile_ahead"):
        FrontendOptions(compile_ahead="yes")


def test_a_graph_holding_large_constants_is_compiled_here(monkeypatch, caplog):
    gm, args = _graph()
    monkeypatch.setattr(ahead, "MAX_PICKLE_BYTES", 100)
    with caplog.at_level(logging.INFO, logger="mugraph"):
        assert ahead.start(gm, args) is None
    assert any("pickled, it holds" in m for m in caplog.messages)


def test_no_child_to_start_is_said_and_nothing_left(monkeypatch, caplog, tmp_path):
    gm, args = _graph()
    monkeypatch.setattr(ahead.sys, "executable", str(tmp_path / "no-python"))
    monkeypatch.setattr(ahead.tempfile, "tempdir", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="mugraph"):
        assert ahead.start(gm, args) is None
    assert any("no child process" in m for m in caplog.messages)
    assert not list(tmp_path.glob("mugraph_ahead_*"))


def test_when_the_backend_compiles_ahead():
    from mugraph.frontend import FrontendOptions
    from mugraph.frontend.backend import AHEAD_MIN_SEARCH_S, compiles_ahead

    on, long = FrontendOptions(), AHEAD_MIN_SEARCH_S + 1
    assert compiles_ahead(on, "cuda", long)
    assert not compiles_ahead(on, "cpu", long)                      # nothing timed on a CPU
    assert not compiles_ahead(on, "cuda", AHEAD_MIN_SEARCH_S / 2)   # too short to hide it (a warm start: 0)
    for off in ({"compile_ahead": False}, {"inductor": False}, {"never_slower": False}):
        assert not compiles_ahead(FrontendOptions(**off), "cuda", long), off


def test_the_callers_settings_go_to_the_child(monkeypatch):
    """Settings in Inductor's cache key — one of Inductor's own, and a global torch one, the
    CPU kernels' thread count — are the caller's in the child too, so its compile still
    serves the caller's (either left behind, the caller misses the cache)."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "max_fusion_size", 31)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        gm, args = _graph()
        job = ahead.start(gm, args)
        before = counters["inductor"]["fxgraph_cache_hit"]
        job.finish()
        assert job.proc.returncode == 0
        assert counters["inductor"]["fxgraph_cache_hit"] == before + 1
    finally:
        torch.set_num_threads(threads)


def test_example_values_are_given_back_or_the_copy_left_as_it_was():
    gm, args = _graph()
    inputs = ahead.describe_inputs(args)
    copy = pickle.loads(pickle.dumps(gm))  # as both processes get it: no node metadata
    assert not any("example_value" in n.meta for n in copy.graph.nodes)
    assert ahead.with_example_values(copy, inputs) is copy
    assert all("example_value" in n.meta for n in copy.graph.nodes if n.op != "output")
    # an op fake tensors cannot run (a tensor's values read in Python): no values, no error
    odd = pickle.loads(pickle.dumps(gm))
    out = next(n for n in odd.graph.nodes if n.op == "output")
    with odd.graph.inserting_before(out):
        odd.graph.call_function(torch.Tensor.tolist, (next(iter(odd.graph.nodes)),))
    odd.recompile()
    assert ahead.with_example_values(odd, inputs) is odd
    assert not any("example_value" in n.meta or "val" in n.meta for n in odd.graph.nodes)


def test_a_graph_that_makes_a_tensor_and_writes_it_is_compiled_from_itself(caplog):
    """A tensor the graph makes without tensor arguments (transformers' static cache creates
    its keys with ``torch.zeros`` at the first write) comes back from pickle as a constant,
    and a write into it would be state shared by every call: such a graph is not copied, and
    compiled from dynamo's own graph it gives eager's result on every call."""
    seen = {}

    def grab(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, example_inputs
        return gm.forward

    def step(x, count):
        buf = torch.zeros(6, 4)
        buf.index_copy_(0, torch.arange(2) + count, x)
        count.add_(2)
        return buf * 2

    torch._dynamo.reset()
    torch.compile(step, backend=grab)(torch.randn(2, 4), torch.tensor(0))
    gm = seen["gm"]
    x_first = seen["inputs"][0].dim() == 2  # dynamo orders the graph's inputs by first use

    def call_args(x, count):
        return [x, count] if x_first else [count, x]
    loaded = pickle.loads(pickle.dumps(gm))
    assert ahead.constants_made(gm, loaded)  # unpickled, the zeros are a constant
    with caplog.at_level(logging.INFO, logger="mugraph"):
        assert ahead.start(gm, call_args(torch.randn(2, 4), torch.tensor(0))) is None
        fn = ahead.compile_copy(gm, call_args(torch.randn(2, 4), torch.tensor(0)))
    assert any("makes as constants" in m for m in caplog.messages)
    count, want_count = torch.tensor(0), torch.tensor(0)
    for _ in range(2):
        x = torch.randn(2, 4)
        got = fn(*call_args(x, count))
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, step(x, want_count))
    plain = _graph()[0]
    assert ahead.constants_made(plain, pickle.loads(pickle.dumps(plain))) == set()


def _dynamo_graph(fn, *args) -> fx.GraphModule:
    seen = {}

    def grab(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, example_inputs
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=grab)(*args)
    return seen["gm"], seen["inputs"]


def test_a_graph_that_makes_a_tensor_it_only_reads_is_compiled_ahead():
    """A decode step's ``torch.arange`` of its positions comes back from pickle as a constant
    too, but one only read, of a call that makes the same tensor every time: the copy is the
    same function, so it is compiled ahead (a whole model's step has one per layer, and
    refusing them cost each cold compile its Inductor compile ahead). Its writes go into the
    graph's inputs — the cache and its counter — and the copy's results follow eager's over
    calls that move the counter."""
    def step(x, cache, count):
        cache.index_copy_(0, torch.arange(2) + count, x)
        count.add_(2)
        return cache * 2

    gm, inputs = _dynamo_graph(step, torch.randn(2, 4), torch.zeros(6, 4), torch.tensor(0))
    copy = pickle.loads(pickle.dumps(gm))
    assert ahead.constants_made(gm, copy)  # the arange, frozen
    assert not ahead.unsafe_constants(gm, copy)
    order = [{(2, 4): "x", (6, 4): "cache", (): "count"}[tuple(t.shape)] for t in inputs]

    def call(x, cache, count):
        named = {"x": x, "cache": cache, "count": count}
        return [named[k] for k in order]
    cache, count = torch.zeros(6, 4), torch.tensor(0)
    assert ahead._pickled_copy(gm, call(torch.randn(2, 4), cache, count), "why") is not None
    fn = ahead.compile_copy(gm, call(torch.randn(2, 4), cache, count))
    want_cache, want_count = torch.zeros(6, 4), torch.tensor(0)
    for _ in range(2):
        x = torch.randn(2, 4)
        got = fn(*call(x, cache, count))
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, step(x, want_cache, want_count))
    assert int(count) == 4


def test_a_graph_that_makes_a_tensor_by_a_draw_is_compiled_from_itself():
    """A tensor made by ``torch.rand`` would come back from pickle as one frozen draw: the copy
    is another function even where the draw is only read, so it is not compiled ahead."""
    gm, _ = _dynamo_graph(lambda x: x + torch.rand(4), torch.randn(4))
    unsafe = ahead.unsafe_constants(gm, pickle.loads(pickle.dumps(gm)))
    assert unsafe and "rand" in unsafe.why


def test_writes_are_found_in_every_form_a_graph_writes():
    """In-place methods and functions, ``setitem`` and the augmented operators, ``out=`` and an
    ATen overload's written arguments — and a constant counts as written where a write reaches
    a value computed from it, not only the constant itself."""
    import operator

    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    nodes = {
        "method": g.call_method("add_", (a, b)),
        "setitem": g.call_function(operator.setitem, (a, 0, b)),
        "iadd": g.call_function(operator.iadd, (a, b)),
        "out": g.call_function(torch.add, (b, b), {"out": a}),
        "aten": g.call_function(torch.ops.aten.index_copy_.default, (a, 0, b, b)),
        "relu": g.call_function(torch.nn.functional.relu, (a,), {"inplace": True}),
        "private": g.call_function(torch._foreach_add_, (a, b)),
        "dunder": g.call_method("__setitem__", (a, 0, b)),
    }
    for form, node in nodes.items():
        assert ahead._written_args(node) == [a], form
    assert ahead._written_args(g.call_method("add", (a, b))) == []
    assert ahead._written_args(g.call_method("__getitem__", (a, 0))) == []
    assert ahead._written_args(g.call_function(torch.ops.aten.add.Tensor, (a, b))) == []

    gm = fx.GraphModule(torch.nn.Module(), fx.Graph())
    gm.register_buffer("c0", torch.zeros(3))
    gm.register_buffer("c1", torch.zeros(3))
    h = gm.graph
    x = h.placeholder("x")
    c0, c1 = h.get_attr("c0"), h.get_attr("c1")
    view = h.call_method("view", (c0, -1))
    h.call_method("copy_", (view, x))           # c0 written through a view of it
    h.call_method("index_copy_", (x, 0, c1, x))  # c1 only read: the index of a write into x
    h.output(x)
    assert ahead._written_constants(gm, {"c0", "c1"}) == {"c0"}
