"""Repeated layers compiled once (``mugraph.frontend.repeats``): which runs of a graph become
calls of one shared subgraph, which do not, and that the outlined graph computes what the
graph did — eagerly, under Inductor, and through the backend."""

import logging
import random

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import mugraph.frontend.repeats as R
from mugraph.frontend.inductor import compile_graph


def _layer(h, w, g, c, eps=1e-6):
    x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * g + c
    y = torch.nn.functional.silu(x @ w) * (x @ w.t())
    return h + y @ w


def _model(layers: int, hidden: int = 16, odd: dict | None = None):
    """``f(h, c, *weights)``: ``layers`` layers on a residual stream, each reading a value all
    share (``c.cos()``); ``odd`` maps a layer's index to keyword arguments that make it differ."""
    odd = odd or {}

    def f(h, c, *p):
        c = c.cos()
        for i in range(layers):
            h = _layer(h, p[2 * i], p[2 * i + 1], c, **odd.get(i, {}))
        return (h.sum(-1),)

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(4, hidden, generator=g), torch.randn(hidden, generator=g)]
    for _ in range(layers):
        args += [torch.randn(hidden, hidden, generator=g) * 0.2, torch.randn(hidden, generator=g)]
    return f, args


@pytest.fixture
def short_layers(monkeypatch):
    monkeypatch.setattr(R, "MIN_REGION_NODES", 4)
    monkeypatch.setattr(R, "MIN_SEGMENT_NODES", 3)


def _traced(f, args):
    return make_fx(f, tracing_mode="fake")(*args)


def _calls(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]


def test_identical_layers_become_calls_of_one_subgraph(short_layers):
    f, args = _model(6)
    gm = _traced(f, args)
    out, found = R.outline_repeats(gm)
    assert found is not None and found.windows == 6
    # the residual stream, each layer's two weights and the shared value: four operands, one result
    assert (found.inputs, found.outputs) == (4, 1)
    calls = _calls(out)
    assert len(calls) == 6 and len({c.args[0].target for c in calls}) == 1
    torch.testing.assert_close(out(*args)[0], f(*args)[0])


def test_a_layer_that_differs_ends_the_run(short_layers):
    """Layer 4 of 6 has another epsilon: the run stops before it, and the layers after it are
    compiled as they are; the result is the graph's."""
    f, args = _model(6, odd={4: {"eps": 1e-3}})
    out, found = R.outline_repeats(_traced(f, args))
    assert found is not None and found.windows == 4
    torch.testing.assert_close(out(*args)[0], f(*args)[0])


def test_layers_that_write_are_not_outlined(short_layers):
    """A layer writing into its input (an in-place add) is never inside a region."""
    def f(h, *p):
        for i in range(5):
            h = _layer(h, p[2 * i], p[2 * i + 1], 0.0)
            p[2 * i + 1].add_(1.0)
        return (h,)

    _, args = _model(5)
    args = [args[0]] + args[2:]
    gm = make_fx(f)(*[a.clone() for a in args])
    out, found = R.outline_repeats(gm)
    assert found is None and out is gm  # a write in every layer: no two whole layers without one


def test_short_repeats_are_left_alone():
    f, args = _model(6)
    gm = _traced(f, args)
    out, found = R.outline_repeats(gm)  # 14 nodes a layer, under MIN_REGION_NODES
    assert found is None and out is gm


def test_a_view_of_an_operand_is_not_a_result(short_layers):
    """Each layer returns a transpose of its weight besides the stream: a result that would
    alias an operand, which ``invoke_subgraph`` refuses. Nothing is outlined, and the graph
    computes what it did."""
    def f(h, *p):
        views = []
        for i in range(5):
            h = _layer(h, p[2 * i], p[2 * i + 1], 0.0)
            views.append(p[2 * i].t())
        return (h, *views)

    _, args = _model(5)
    args = [args[0]] + args[2:]
    gm = _traced(f, args)
    out, found = R.outline_repeats(gm)
    assert found is None and out is gm


def test_a_multi_output_call_stays_with_its_getitems(short_layers):
    """``var_mean`` returns two tensors: the window's edge never falls between it and them."""
    def f(h, *p):
        for i in range(5):
            v, m = torch.var_mean(h, -1, keepdim=True)
            h = _layer((h - m) * torch.rsqrt(v + 1e-5), p[2 * i], p[2 * i + 1], 0.0)
        return (h,)

    _, args = _model(5)
    args = [args[0]] + args[2:]
    out, found = R.outline_repeats(_traced(f, args))
    assert found is not None and found.windows >= 4
    torch.testing.assert_close(out(*args)[0], f(*args)[0])


@pytest.mark.parametrize("seed", range(12))
def test_random_layers_outlined_compute_what_the_graph_does(short_layers, seed):
    """Random layer bodies (element-wise ops, products, row sums, reads of the shared value and
    of values two steps back), repeated: outlined, the graph's outputs are unchanged."""
    rng = random.Random(seed)
    steps = [rng.choice(["mul", "add_shared", "mm", "silu", "rowsum", "back2", "exp_neg"]) for _ in range(rng.randint(4, 9))]
    layers = rng.randint(3, 6)

    def body(h, w, c):
        vals = [h]
        for s in steps:
            x = vals[-1]
            if s == "mul":
                x = x * 0.5
            elif s == "add_shared":
                x = x + c
            elif s == "mm":
                x = x @ w
            elif s == "silu":
                x = torch.nn.functional.silu(x)
            elif s == "rowsum":
                x = x - x.sum(-1, keepdim=True) / x.shape[-1]
            elif s == "back2":
                x = x + vals[max(0, len(vals) - 3)]
            else:
                x = torch.exp(-x.abs())
            vals.append(x)
        return h + vals[-1]

    def f(h, c, *w):
        c = c.sin()
        for i in range(layers):
            h = body(h, w[i], c)
        return (h, c * 2)

    g = torch.Generator().manual_seed(seed)
    args = [torch.randn(3, 8, generator=g), torch.randn(8, generator=g)] + \
        [torch.randn(8, 8, generator=g) * 0.3 for _ in range(layers)]
    out, found = R.outline_repeats(_traced(f, args))
    assert found is not None and found.windows >= 2 and found.length >= R.MIN_REGION_NODES  # all 12 seeds outline
    for a, b in zip(out(*args), f(*args)):
        torch.testing.assert_close(a, b)


def test_inductor_compiles_the_outlined_graph(short_layers, caplog):
    f, args = _model(8)
    gm = _traced(f, args)
    with caplog.at_level(logging.INFO, logger="mugraph"):
        fn = compile_graph(gm, args, repeats_once=True)
    assert "8 repeats of" in caplog.text
    torch.testing.assert_close(fn(*args)[0], f(*args)[0])


def _tiny_llama(transformers):
    """A 4-layer LLaMA at tiny sizes, random weights (seed 0): its config and model."""
    cfg = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, num_hidden_layers=4, vocab_size=64,
                                   max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return cfg, transformers.LlamaForCausalLM(cfg).eval()


def test_the_backend_compiles_a_models_identical_layers_once(piece_cache, caplog):
    """A 4-layer LLaMA's decode step over a static cache under the backend, Inductor on: the
    layers after the first (which also makes the mask) are one subgraph called three times, and
    the logits are eager's; with ``repeats_once=False`` no subgraph is made."""
    transformers = pytest.importorskip("transformers")
    cfg, model = _tiny_llama(transformers)
    opts = {"time_limit": 1.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower",
            "cache_dir": piece_cache, "compile_ahead": False}
    ids = torch.tensor([[5]])
    for once in (True, False):
        cache = transformers.StaticCache(config=cfg, max_cache_len=16)
        kw = {"input_ids": ids, "position_ids": torch.tensor([[3]]), "past_key_values": cache,
              "cache_position": torch.tensor([3]), "use_cache": True}
        torch._dynamo.reset()
        caplog.clear()
        with torch.no_grad(), caplog.at_level(logging.INFO, logger="mugraph"):
            want = model(**kw).logits
            got = torch.compile(model.forward, backend="mugraph", options={**opts, "repeats_once": once})(**kw).logits
        torch.testing.assert_close(got, want)
        assert ("3 repeats of" in caplog.text) is once, caplog.text[-2000:]


def test_a_cache_update_stays_beside_its_write(short_layers):
    """Layers that write into a cache of their own, functionalized as ``torch.compile`` hands
    Inductor such a graph (``index_copy`` in the layer, ``copy_`` into the cache at the end):
    the new cache value is never made inside a subgraph — there it would be a fresh copy of
    the cache — and the outlined graph updates the caches and computes what the graph does."""
    layers = 5

    def f(h, pos, *p):
        for i in range(layers):
            w, cache = p[2 * i], p[2 * i + 1]
            k = torch.nn.functional.silu(h @ w)
            cache.index_copy_(0, pos, k)
            h = h + torch.softmax(h @ cache.t(), -1) @ cache * 0.5
        return (h,)

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 8, generator=g), torch.tensor([3, 5])]
    for _ in range(layers):
        args += [torch.randn(8, 8, generator=g) * 0.3, torch.zeros(16, 8)]
    gm = make_fx(torch.func.functionalize(f, remove="mutations_and_views"), tracing_mode="fake")(
        *[a.clone() for a in args])
    out, found = R.outline_repeats(gm)
    assert found is not None and found.windows >= 4
    for sub in (m for name, m in out.named_children() if name.startswith("mugraph_repeat")):
        assert not any(n.target is torch.ops.aten.index_copy.default for n in sub.graph.nodes)
    want_args, got_args = [a.clone() for a in args], [a.clone() for a in args]
    want, got = f(*want_args)[0], out(*got_args)[0]
    torch.testing.assert_close(got, want)
    for a, b in zip(got_args, want_args):
        torch.testing.assert_close(a, b)


def test_a_slice_of_a_fused_product_leaves_as_the_product(short_layers):
    """Phi-3's shape: one product makes q, k and v side by side, and the v slice goes into the
    cache outside the subgraph. The slice is no result of the subgraph — the product is, the
    slice made again after the call — and Inductor's compile of the outlined graph updates the
    caches and computes what the graph does. (Returned as a slice, Inductor wrote zeros and NaN
    into the caches.)"""
    layers, d = 5, 8

    def f(h, pos, *p):
        for i in range(layers):
            w, cache = p[2 * i], p[2 * i + 1]
            qkv = h @ w
            q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
            cache.index_copy_(0, pos, v.view(1, 2, d // 2))  # one token: a view of the product
            h = h + torch.softmax((q * k) @ cache.reshape(16, d).t(), -1) @ cache.reshape(16, d) * 0.5
        return (h,)

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(1, d, generator=g), torch.tensor([3])]
    for _ in range(layers):
        args += [torch.randn(d, 3 * d, generator=g) * 0.3, torch.randn(16, 2, d // 2, generator=g)]
    gm = make_fx(torch.func.functionalize(f, remove="mutations"), tracing_mode="fake")(
        *[a.clone() for a in args])
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # example values made one node at a time, as the backend's graphs have them
        for n in gm.graph.nodes:
            if isinstance(v := n.meta.get("val"), torch.Tensor):
                n.meta["val"] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
    out, found = R.outline_repeats(gm)
    assert found is not None and found.windows >= 4
    for sub in (m for name, m in out.named_children() if name.startswith("mugraph_repeat")):
        (ret,) = [n for n in sub.graph.nodes if n.op == "output"]
        assert all(R._view_base(r) is r for r in ret.args[0]), ret.args[0]  # no view leaves a subgraph
    fn = compile_graph(out, [a.clone() for a in args])
    want_args, got_args = [a.clone() for a in args], [a.clone() for a in args]
    want, got = f(*want_args)[0], fn(*got_args)[0]
    torch.testing.assert_close(got, want)
    for a, b in zip(got_args, want_args):
        torch.testing.assert_close(a, b)


def test_a_refused_subgraph_falls_back_to_the_graph_as_it_is(short_layers, caplog, monkeypatch):
    """Should Inductor refuse the outlined graph, the graph is compiled as it is, and one
    warning line names the error."""
    import torch._inductor.compile_fx as cfx

    real = cfx.compile_fx

    def refuse_subgraphs(gm, args, *a, **k):
        if any(n.target is torch.ops.higher_order.invoke_subgraph for n in gm.graph.nodes):
            raise RuntimeError("invoke_subgraph: not supported here")
        return real(gm, args, *a, **k)

    monkeypatch.setattr(cfx, "compile_fx", refuse_subgraphs)
    f, args = _model(4)
    with caplog.at_level(logging.INFO, logger="mugraph"):
        fn = compile_graph(_traced(f, args), args, repeats_once=True)
    assert "compiled one by one" in caplog.text and "RuntimeError: invoke_subgraph: not supported here" in caplog.text
    torch.testing.assert_close(fn(*args)[0], f(*args)[0])


def test_layers_compiled_once_that_compute_otherwise_are_compiled_one_by_one(piece_cache, caplog, monkeypatch):
    """The whole-graph rule runs the form with its repeats outlined once before timing it
    (``run.judge_graph``). Its outputs not torch.compile's (here: the outlined graph's last
    output, the logits, made three times what they were), the graph with its pieces is compiled
    one layer after another instead, with one warning line, and the pieces still run; a warm
    compile reads that in the kept verdict and compiles the layers one by one again."""
    transformers = pytest.importorskip("transformers")
    import mugraph.frontend.inductor as I
    from mugraph.frontend import run

    outline = I.outline_repeats

    def wrong(gm):
        out, found = outline(gm)
        if found is not None:
            node = next(n for n in out.graph.nodes if n.op == "output")
            *rest, logits = node.args[0]
            with out.graph.inserting_before(node):
                tripled = out.graph.call_function(torch.ops.aten.mul.Tensor, (logits, 3.0))
            node.args = ((*rest, tripled),)
            out.recompile()
        return out, found
    monkeypatch.setattr(I, "outline_repeats", wrong)
    cfg, model = _tiny_llama(transformers)

    def faster(cap, launches):
        return {"mugraph": 1e-6, "torch": 3e-6}
    faster.cache_key = "a test's fixed times"  # its verdicts are kept: the warm compile reads them
    opts = {"time_limit": 1.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower",
            "cache_dir": piece_cache, "compile_ahead": False, "repeats_once": True, "timer": faster}
    kw = {"input_ids": torch.tensor([[5]]), "position_ids": torch.tensor([[3]]), "cache_position": torch.tensor([3]),
          "use_cache": True}
    with torch.no_grad():
        want = model(**kw, past_key_values=transformers.StaticCache(config=cfg, max_cache_len=16)).logits
    for compile in ("cold", "warm"):
        torch._dynamo.reset()
        run.forget()
        caplog.clear()
        with torch.no_grad(), caplog.at_level(logging.INFO, logger="mugraph"):
            got = torch.compile(model.forward, backend="mugraph", options=opts)(
                **kw, past_key_values=transformers.StaticCache(config=cfg, max_cache_len=16)).logits
        torch.testing.assert_close(got, want)
        said = [r.getMessage() for r in caplog.records if "compiled one by one" in r.getMessage()]
        if compile == "cold":
            assert len(said) == 1 and "compiled once, output" in said[0] and "differs" in said[0], said
            assert "the graph runs with its μGraph pieces" in caplog.text
        else:  # the verdict says one by one: the outlined form is not run again
            assert not said and "(timed at an earlier compile)" in caplog.text


def test_by_default_layers_are_compiled_once_where_the_graph_rule_checks_them():
    """``repeats_once=None``: on where the whole-graph rule runs the outlined form against
    torch.compile's (Inductor, ``never_slower``, a GPU or a timer), off elsewhere; True/False
    force it; anything else is a one-line error."""
    import mugraph as mg
    from mugraph.frontend import FrontendOptions

    default = FrontendOptions.of({})
    assert default.repeats_once is None and default.outlines("cuda") and not default.outlines("cpu")
    assert FrontendOptions.of({"timer": lambda cap, launches: {}}).outlines("cpu")
    assert not FrontendOptions.of({"never_slower": False}).outlines("cuda")
    assert not FrontendOptions.of({"inductor": False, "repeats_once": True}).outlines("cuda")
    assert FrontendOptions.of({"repeats_once": True}).outlines("cpu")
    assert not FrontendOptions.of({"repeats_once": False}).outlines("cuda")
    with pytest.raises(mg.ConfigError, match="repeats_once='yes': must be True, False or None"):
        FrontendOptions.of({"repeats_once": "yes"})


def test_by_default_a_graph_without_repeats_keeps_its_counters_in_the_graph(piece_cache):
    """``repeats_once=None`` where the rule checks (a timer): a graph with nothing to compile
    once keeps its pieces' operators as they are (no ``_own`` counters), a model's layers are
    compiled once."""
    from mugraph.frontend import kernels, recent_graphs, run

    W = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))

    def block(x):
        return torch.exp(x @ W) * 2

    def faster(cap, launches):
        return {"mugraph": 1e-6, "torch": 3e-6}
    run.forget()
    torch._dynamo.reset()
    opts = {"time_limit": 1.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower",
            "cache_dir": piece_cache, "timer": faster}
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(block, backend="mugraph", options=opts)(x), block(x))
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    assert cap.kept and not R.has_repeats(cap.graph_module)
    names = [q for q in kernels._OPS if any(bp.name in q for bp in cap.kept)]
    assert names and not any(q.endswith("_own") for q in names), names
