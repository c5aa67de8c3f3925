"""torch.compile(backend="mugraph"): the real path — search, verify, lowered Triton
kernels (under the interpreter on the CPU), Inductor for the rest — against eager."""

import logging

import re

import pytest
import torch

import mugraph as mg
import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.frontend.backend import recent_graphs

g = torch.Generator().manual_seed(2)


def r(*shape):
    return torch.randn(*shape, generator=g)


def opts(cache, t=3.0, **kw):
    return {"time_limit": t, "cache_dir": cache, **kw}


def new_searches(caplog):
    return [m for m in caplog.messages if "new search" in m]


def test_safe_softmax_under_the_backend(piece_cache, mugraph_log):
    def attn(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.25
        m = s.amax(dim=-1, keepdim=True)           # the max of a safe softmax: a free shift, in the piece
        p = torch.exp(s - m)
        return (p / p.sum(dim=-1, keepdim=True)) @ v
    q, k, v = r(8, 16), r(8, 16), r(8, 16)
    with torch.no_grad():  # the whole attention is one piece (max included): a longer search than 3 s
        # (dynamic=False: dynamo traces each shape as a static graph, which the backend searches)
        f = torch.compile(attn, backend="mugraph", dynamic=False, options=opts(piece_cache, t=10.0))
        y = f(q, k, v)
    torch.testing.assert_close(y, attn(q, k, v), atol=1e-5, rtol=1e-5)
    assert len(new_searches(mugraph_log)) >= 1
    # the attention piece (q @ kᵀ, the max, x − m, exp, sum, div, @ v) became a searched,
    # proven μGraph: its Triton kernels ran under the interpreter
    (cap,) = _backend_results()[0].captured.values()
    assert any(bp.info.get("origin") == "search" and bp.info["kernels"] >= 1 for bp in cap.pieces), \
        [bp.info for bp in cap.pieces]
    # and says what its search did: when its first match came, how many matched and were proven
    shipped = next(bp for bp in cap.pieces if bp.info.get("origin") == "search")
    assert shipped.info["matches"] >= 1 and shipped.info["verified"] >= 1
    assert shipped.info["first_match_s"] is None or shipped.info["first_match_s"] >= 0
    # the shipped kernels (blocks x loop) and where the search's time went, one line each
    assert re.fullmatch(r"\d+x\d+( \+ (\d+x\d+|lib))*", shipped.info["structure"]), shipped.info["structure"]
    assert "search" in shipped.info["phases_started"] and "verify" in shipped.info["phases_started"]
    # a new shape: a new program, a new search, said in one line each
    mugraph_log.clear()
    with torch.no_grad():
        y = f(r(4, 16), k, v)
    assert len(new_searches(mugraph_log)) >= 1
    # the same shapes again, in a fresh compile: served by the cache, no search
    mugraph_log.clear()
    torch._dynamo.reset()
    with torch.no_grad():
        f2 = torch.compile(attn, backend="mugraph", options=opts(piece_cache, t=10.0))
        torch.testing.assert_close(f2(q, k, v), attn(q, k, v), atol=1e-5, rtol=1e-5)
    assert new_searches(mugraph_log) == []


def test_rmsnorm_mlp_module(piece_cache, mugraph_log):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(16) + 0.5)
            self.up = torch.nn.Linear(16, 32, bias=False)
            self.gate = torch.nn.Linear(16, 32, bias=False)
            self.down = torch.nn.Linear(32, 16, bias=False)

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
            return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
    m = Block().eval()
    x = r(2, 4, 16)
    torch._dynamo.reset()
    with torch.no_grad():
        y = torch.compile(m, backend="mugraph", options=opts(piece_cache))(x)
        torch.testing.assert_close(y, m(x), atol=1e-5, rtol=1e-5)


def test_options_are_checked():
    with pytest.raises(mg.ConfigError, match="time_lmit.*did you mean 'time_limit'"):
        mugraph.frontend.mugraph_backend(None, [], options={"time_lmit": 3})
    with pytest.raises(mg.ConfigError, match="time_limit"):
        mugraph.frontend.mugraph_backend(None, [], options={"time_limit": 0})
    with pytest.raises(mg.ConfigError, match="kernel_op"):
        mugraph.frontend.mugraph_backend(None, [], options={"kernel_op": "cuda"})
    with pytest.raises(mg.ConfigError, match="unfused"):
        mugraph.frontend.mugraph_backend(None, [], options={"unfused": "never"})
    with pytest.raises(mg.ConfigError, match="dynamic='yes'"):
        mugraph.frontend.mugraph_backend(None, [], options={"dynamic": "yes"})
    with pytest.raises(mg.ConfigError, match="no setting 'combo_kernel'; did you mean 'combo_kernels'"):
        mugraph.frontend.mugraph_backend(None, [], options={"inductor_config": {"combo_kernel": True}})
    with pytest.raises(mg.ConfigError, match="inductor_config="):
        mugraph.frontend.mugraph_backend(None, [], options={"inductor_config": ["combo_kernels"]})
    # a piece's GPU tuning is bounded like its search (not superoptimize's 240 s default)
    from mugraph.frontend.options import FrontendOptions
    cfg = mg.OptimizeConfig(**FrontendOptions.of({"time_limit": 12}).optimize_config())
    assert cfg.tune_s == pytest.approx(7.2) and cfg.search["time_limit"] == 12.0
    assert FrontendOptions.of({"time_limit": 2}).tune_s() == 2.0  # never below a compile and a timing


def test_a_piece_the_search_cannot_improve_stays_torch_code(piece_cache, caplog):
    """One kernel op and one block op cannot express exp(x @ w) * 2: the search returns
    the program itself, which by default is left to torch; ``unfused="lower"`` lowers it,
    its element-wise run (the exp and the ·2) as one kernel after the matmul."""
    caplog.set_level(logging.INFO, logger="mugraph")
    w = r(8, 8)
    fn = lambda x: torch.exp(x @ w) * 2  # noqa: E731
    x = r(4, 8)
    for unfused in ("torch", "lower"):
        torch._dynamo.reset()
        # (10 s: the space is small and exhausted early; 3 s ran out on a loaded 2-core machine)
        f = torch.compile(fn, backend="mugraph", options=opts(
            piece_cache, 10.0, search={"max_kernel_ops": 1, "max_block_ops": 1}, unfused=unfused))
        with torch.no_grad():
            torch.testing.assert_close(f(x), fn(x))
        (compiled,) = _backend_results()
        (cap,) = compiled.captured.values()
        (bp,) = cap.pieces
        if unfused == "torch":
            assert bp.info["origin"] == "program"
        else:
            assert (bp.info["origin"], bp.info["found_by"]) == ("search", "pointwise runs")
        assert (bp.info.get("runs") == "torch") == (unfused == "torch")
    assert any("found nothing better than the program" in m for m in caplog.messages)


def test_backend_is_registered_and_named_in_pyproject():
    import tomllib
    from pathlib import Path

    from torch._dynamo import list_backends
    from torch._dynamo.backends.registry import lookup_backend

    assert "mugraph" in list_backends(exclude_tags=())
    assert lookup_backend("mugraph") is mugraph.frontend.mugraph_backend
    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    target = doc["project"]["entry-points"]["torch_dynamo_backends"]["mugraph"]
    mod, name = target.split(":")
    assert getattr(__import__(mod, fromlist=[name]), name) is mugraph.frontend.mugraph_backend


def test_gradients_fall_back_to_inductor(piece_cache, caplog):
    caplog.set_level(logging.WARNING, logger="mugraph")
    w = torch.nn.Parameter(r(8, 8))
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.exp(x @ w) * 2, backend="mugraph", options=opts(piece_cache))
    y = f(r(4, 8))
    y.sum().backward()
    assert w.grad is not None
    assert any("inference only" in m for m in caplog.messages)


def test_a_graph_torchs_tracer_refuses_runs_as_inductor_compiles_it(piece_cache, caplog, monkeypatch):
    """Where torch's own tracer fails on a graph dynamo handed over (measured: Mamba's and
    Falcon-Mamba's forward, an internal assert of functionalization), the graph runs as
    ``torch.compile`` runs it, with one warning line that says why, not a traceback."""
    import mugraph.frontend.backend as backend
    from mugraph.frontend.aten import Unmapped

    def refuse(*a, **k):
        raise Unmapped("from_torch: tracing failed: RuntimeError: an internal assert of functionalization")

    monkeypatch.setattr(backend, "traced", refuse)
    caplog.set_level(logging.WARNING, logger="mugraph")
    w, x = r(8, 8), r(4, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(lambda x: torch.exp(x @ w) * 2, backend="mugraph", options=opts(piece_cache))(x)
    assert torch.allclose(got, torch.exp(x @ w) * 2, rtol=1e-5, atol=1e-5)
    said = [m for m in caplog.messages if "without μGraph pieces" in m]
    assert len(said) == 1 and "tracing failed" in said[0] and "\n" not in said[0]


def test_a_graph_of_dynamic_shapes_specializes_a_few_sizes_then_runs_as_inductor_compiles_it(piece_cache,
                                                                                             mugraph_log):
    """A dim that changes between calls (a growing KV cache) makes dynamo trace the graph
    with a symbolic size. By default (``dynamic="auto"``) the backend specializes its first
    ``DYNAMIC_SIZES`` sizes and runs every later one as Inductor compiles the graph once —
    no trace, search or compile per size — and says so in one line; ``"inductor"`` does so
    from the first; under ``"specialize"`` each size is a static graph of its own."""
    from mugraph.frontend.options import DYNAMIC_SIZES

    w = r(16, 16)

    def fn(x):
        return torch.softmax(x @ w, dim=-1) * 2

    sizes = list(range(3, 3 + DYNAMIC_SIZES + 3))
    for mode in ("auto", "inductor", "specialize"):
        torch._dynamo.reset()
        mugraph_log.clear()
        f = torch.compile(fn, backend="mugraph", options=opts(piece_cache, t=2.0, inductor=False, dynamic=mode))
        before = {id(c) for c in recent_graphs()}  # the record keeps the last 16: not by count
        with torch.no_grad():
            for n in sizes:
                x = r(n, 16)
                torch.testing.assert_close(f(x), fn(x))
        said = [m for m in mugraph_log.messages if "dynamic shapes" in m]
        graphs = [c for c in recent_graphs() if id(c) not in before]
        specialized = sum(len(c.variants) for c in graphs)
        # the first size is a static graph; dynamo traces the symbolic one at the second
        if mode == "auto":
            assert len(said) == 1 and "cache_implementation" in said[0], mugraph_log.messages
            assert specialized == 1 + DYNAMIC_SIZES
        elif mode == "inductor":
            assert len(said) == 1 and "cache_implementation" in said[0], mugraph_log.messages
            assert specialized == 1
        else:
            assert not said
            assert specialized == len(sizes)


def test_llama_decoder_layer(piece_cache, mugraph_log):
    transformers = pytest.importorskip("transformers")  # the 'torch' extra: pip install 'mugraph[torch]'
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, num_hidden_layers=1, vocab_size=32,
                                   max_position_embeddings=64)
    cfg._attn_implementation = "eager"  # matmul/softmax/matmul in ATen (SDPA would stay one library op)
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    rope = LlamaRotaryEmbedding(cfg)
    x = torch.randn(1, 4, 64)
    cos, sin = rope(x, torch.arange(4)[None])
    mask = torch.full((4, 4), float("-inf")).triu(1)[None, None]

    def run(h, cos, sin, mask):
        out = layer(h, attention_mask=mask, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out

    torch._dynamo.reset()
    with torch.no_grad():
        want = run(x, cos, sin, mask)
        # unfused="lower": a piece whose search finds only the program still runs lowered (the real path)
        f = torch.compile(run, backend="mugraph", options=opts(piece_cache, 3.0, unfused="lower"))
        got = f(x, cos, sin, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # what ran: every piece searched (or served by the cache), verified and lowered
    (compiled,) = _backend_results()
    (cap,) = compiled.captured.values()
    assert len(cap.pieces) >= 4
    for bp in cap.pieces:
        mg.check_lax(bp.program)
        assert bp.info, f"{bp.name} was not superoptimized"


def _backend_results():
    return [c for c in recent_graphs() if c.captured][-1:]


def test_shared_kernel_analysis_compiles_each_kernel_and_argument_kind_once(monkeypatch):
    """Inductor's per-call analysis of a triton_op's kernels shares one IR compile per kernel
    and argument kinds inside the block (and only there); a new dtype, value or kernel compiles."""
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    from mugraph.frontend.inductor import shared_kernel_analysis

    calls = []

    def compile_ir(kernel, kwargs, tma):
        calls.append((kernel, dict(kwargs)))
        return f"ir{len(calls)}", sorted(kwargs)

    monkeypatch.setattr(wrap, "generate_ttir", compile_ir)
    k1, k2 = object(), object()
    x32, y32 = torch.empty(3), torch.empty(5)
    x16 = torch.empty(3, dtype=torch.float16)
    with shared_kernel_analysis():
        first = wrap.generate_ttir(k1, {"x": x32, "n": 4}, {})
        assert wrap.generate_ttir(k1, {"x": y32, "n": 4}, {}) == first   # another tensor, same dtype
        assert len(calls) == 1
        assert wrap.generate_ttir(k1, {"x": x16, "n": 4}, {}) != first   # another dtype
        assert wrap.generate_ttir(k1, {"x": x32, "n": 1}, {}) != first   # another value (Triton specializes 1)
        assert wrap.generate_ttir(k2, {"x": x32, "n": 4}, {}) != first   # another kernel
        wrap.generate_ttir(k1, {"x": x32, "n": [4]}, {})                  # a value it cannot key: compiled
        wrap.generate_ttir(k1, {"x": x32, "n": [4]}, {})
        assert len(calls) == 6
    assert wrap.generate_ttir is compile_ir                                # restored after the block
    wrap.generate_ttir(k1, {"x": x32, "n": 4}, {})
    assert len(calls) == 7                                                 # nothing shared outside it


def _copy_kernel(x_ptr, y_ptr):
    pass


def _other_kernel(x_ptr, y_ptr):
    x_ptr += 1


def test_shared_kernel_analysis_knows_a_kernel_by_its_code(monkeypatch):
    """Inductor hands the analysis another kernel object at every call site: two
    ``JITFunction`` objects of one source share one IR compile, another source compiles."""
    from torch._higher_order_ops import triton_kernel_wrap as wrap
    from triton.runtime.jit import JITFunction

    from mugraph.frontend.inductor import shared_kernel_analysis

    calls = []

    def compile_ir(kernel, kwargs, tma):
        calls.append(kernel)
        return "ir", sorted(kwargs)

    monkeypatch.setattr(wrap, "generate_ttir", compile_ir)
    a, b, c = JITFunction(_copy_kernel), JITFunction(_copy_kernel), JITFunction(_other_kernel)
    x = torch.empty(3)
    with shared_kernel_analysis():
        for k in (a, b, a, c, c):
            wrap.generate_ttir(k, {"x_ptr": x, "y_ptr": x}, {})
    assert calls == [a, c]
    # torch wraps a launch given warps and stages in a new Autotuner of one config each time:
    # one IR compile per kernel and config arguments
    from triton import Config
    from triton.runtime.autotuner import Autotuner

    def tuned(k, **kwargs):
        return Autotuner(k, k.arg_names, [Config(kwargs, num_warps=4, num_stages=3)], [], None, None)

    calls.clear()
    with shared_kernel_analysis():
        for t in (tuned(a), tuned(b), tuned(a), tuned(c)):
            wrap.generate_ttir(t, {"x_ptr": x, "y_ptr": x}, {})
    assert [k.fn for k in calls] == [a, c]


def test_a_compiled_graph_is_served_by_inductors_caches_the_second_time(piece_cache, monkeypatch, tmp_path):
    """The graph with its pieces goes to Inductor in a tracing context of its own, and the
    mugraph helpers the capture calls (rotate_half here) are declared cache-safe: a second
    compile of the same graph is a hit of the FX graph cache and of the autograd cache (they
    were bypassed: no shape environment, an unknown function), and computes the same."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    w = torch.rand(16) + 0.5

    def f(x, y):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        rot = torch.cat([-y[..., 8:], y[..., :8]], dim=-1)  # aten.rotate_half after the capture: alone,
        return h * 2.0, rot                                   # too small a piece, so it stays torch code
    x, y = r(4, 16), r(4, 16)
    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        with torch.no_grad():
            outs.append(torch.compile(f, backend="mugraph", options=opts(piece_cache))(x, y))
    torch.testing.assert_close(outs[0], f(x, y), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)
    (cap,) = _backend_results()[0].captured.values()
    handed = cap.stitched(lambda bp: torch.ops.aten.clone.default, cap.kept)  # the graph Inductor got
    assert any(n.target is mugraph.frontend.rotate_half for n in handed.graph.nodes)
    assert counters["inductor"]["fxgraph_cache_hit"] == 1, dict(counters["inductor"])
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1, dict(counters["aot_autograd"])


def test_why_unproven_names_each_kind_of_unverified_match():
    """A piece that ships nothing says what became of its matches, one clause a kind: a
    graph the verifier could not evaluate (a value past the evaluator's limit) is not
    read as one that failed verification."""
    from types import SimpleNamespace

    from mugraph.frontend.run import _why_unproven
    opt = SimpleNamespace(candidates=[])
    why = _why_unproven(opt, {"verify_failed": 2, "verify_unevaluated": 3, "verify_skipped_time": 4})
    assert "2 failed verification" in why and "3 could not be evaluated by the verifier" in why
    assert "4 not verified for lack of time" in why
    assert _why_unproven(opt, {}) == ""


def test_the_search_workers_start_before_the_capture(piece_cache, monkeypatch):
    """The workers' fork server is started before the ATen capture, so its imports overlap
    the capture instead of the first search's share; the serial executor starts none."""
    import search.executors

    import mugraph.frontend.backend as backend
    import mugraph.frontend.capture as capture

    order: list[str] = []
    monkeypatch.setattr(search.executors, "prestart", lambda: order.append("prestart"))
    traced = backend.trace
    captured = backend.traced  # the capture: traced, or rebuilt from the trace an earlier compile stored
    monkeypatch.setattr(backend, "traced", lambda *a, **k: (order.append("capture"), captured(*a, **k))[1])
    w = r(8, 8)
    fn = lambda x: torch.exp(x @ w) * 2  # noqa: E731
    for executor, expect in (("processes", ["prestart", "capture"]), ("serial", ["capture"])):
        order.clear()
        torch._dynamo.reset()
        f = torch.compile(fn, backend="mugraph", options=opts(
            piece_cache, search={"max_kernel_ops": 1, "max_block_ops": 1, "executor": executor}))
        with torch.no_grad():
            f(r(4, 8))
        assert order == expect, executor
    assert capture.trace is traced  # the capture itself is untouched


def test_prestart_is_idempotent():
    from search.executors import prestart

    prestart()
    prestart()  # a running fork server is left as it is


def test_a_piece_at_new_sizes_is_seeded_with_its_cached_winner(tmp_path):
    """The same decode attention over 128 and then 512 cached keys, one result cache: the
    second compile's attention piece is another program (other sizes), and its search is
    seeded with the first one's winner carried to 512 keys and verified there
    (search.transfer) — through the backend, whose pieces' layouts differ with the sizes."""
    import torch.nn.functional as F

    from mugraph.frontend import run

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    options = {"cache_dir": str(tmp_path), "time_limit": 8, "inductor": False,
               "search": {"workers": 2, "smem_budget": 16384}}
    derived = []
    for n in (128, 512):
        q, k, v = r(1, 4, 1, 32), r(1, 2, n, 32), r(1, 2, n, 32)
        torch._dynamo.reset()
        run.forget()
        with torch.no_grad():
            y = torch.compile(f, backend="mugraph", options=options)(q, k, v)
        torch.testing.assert_close(y, f(q, k, v), atol=1e-5, rtol=1e-4)
        (cap,) = _backend_results()[0].captured.values()
        (bp,) = cap.pieces
        assert bp.info.get("origin") == "search", bp.info
        (info,) = [i for key, i in run._INFO.items() if key[0] == bp.name]
        derived.append(info["optimized"].report["search"]["stats"]["derived"])
    assert derived[0]["transfer_seeds"] == 0
    # the seed proven, and beside it its near ties (the tilings the price cannot tell from it)
    d = derived[1]
    assert d["transfer_seeds"] == 1 and d["transfer_verified"] == 1 + d.get("transfer_near_ties_verified", 0), d


def test_search_digest_says_where_a_pieces_time_went():
    """The piece's info carries its search's phases, its composition's pieces and its
    variants as one line each (what a decoder-layer table shows for a piece that ships
    nothing), and leaves out what the search did not do."""
    from mugraph.frontend.run import search_digest

    stats = {"phase_started": {"pieces": 0.05, "search": 6.7, "verify": 27.7},
             "derived": {"pieces": [{}, {}, {}],
                         "piece0": {"seconds": 1.4, "matches": 3, "complete": True, "executor": "serial"},
                         "piece1": {"seconds": 4.6, "matches": 1, "executor": "processes", "serial_first_s": 2.61},
                         "piece2": {"seconds": 0.0, "matches": 1, "complete": True, "constructed": True},
                         "composed_graphs": 8, "composed_matches": 2,
                         "split_variants": 32, "split_matches": 8, "split_priced": 20, "split_fingerprinted": 12,
                         "split_s": 1.2,
                         "retile_variants": 36, "retile_matches": 4, "retile_s": 0.3},
             "verify_seconds_median": 0.2}
    d = search_digest(stats)
    assert d["phases_started"] == "pieces 0.05, search 6.7, verify 27.7"
    assert d["composed"] == ("piece 0: 3 in 1.4 s (complete, serial); "
                             "piece 1: 1 in 4.6 s (processes after 2.61 s serial); "
                             "piece 2: 1 in 0 s (built); 2 of 8 composed matched")
    assert d["variants"] == "split 8/32 (20 priced, 12 fingerprinted, 1.2 s), retile 4/36 (0.3 s)"
    stats["derived"]["retile_climbed"] = 2
    assert search_digest(stats)["variants"].endswith("retile 4/36 (climbed 2, 0.3 s)")
    assert d["verify_s_median"] == 0.2 and d["warm_up_s"] is None
    assert search_digest({}) == {"phases_started": "", "composed": None, "variants": None, "warm_up_s": None,
                                 "verify_s_median": None}


def test_candidates_digest_lists_what_was_proven_and_how_it_timed():
    """A piece's info lists its candidates in their ranking — where each came from, its
    kernels, the model's price and the GPU's time, why it was set aside — the chosen one
    marked, at most DIGEST_CANDIDATES of them."""
    import mugraph as mg
    from mugraph.frontend.run import candidates_digest
    from mugraph.pipeline.results import Candidate

    g = mg.KernelGraph("mm")
    x = g.input("X", (4, 64), "float32"); w = g.input("W", (64, 8), "float32")
    b = mg.BlockGraph((2, 1, 1), 4)
    b.output(b.accum(b.input(x, (None, None, None), 1) @ b.input(w, (1, None, None), 0)), (1, None, None))
    g.output(g.kernel(b)[0])
    from dataclasses import asdict

    import lower

    best = Candidate(g, "search", predicted_s=10.64e-6, measured_s=11.2e-6, found_by="retile",
                     configs={3: asdict(lower.KernelConfig.from_label("w4s3k4L"))})
    cands = [best,
             Candidate(g, "search", predicted_s=14.7e-6, found_by="split-loop",
                       rejected="not checked: the wall-time budget was spent"),
             Candidate(g, "program", predicted_s=21.3e-6, measured_s=61.7e-6)]
    assert candidates_digest(cands, best) == ("*retile 2x4 p10.6 m11.2 [w4s3k4L]; split-loop 2x4 p14.7 m- "
                                              "(not checked); program 1 kernels p21.3 m61.7")
    assert candidates_digest(cands, best, most=1) == "*retile 2x4 p10.6 m11.2 [w4s3k4L]; +2 more"
    assert candidates_digest([], None) is None


def test_inductor_keys_the_graph_by_its_own_placeholder_names(monkeypatch):
    """Inside the backend's Inductor compile, AOTAutograd's cache keys the graph without
    renaming its placeholders first (the renaming generated the graph's code twice; the
    backend's graphs keep their names from one warm start to the next); outside it, torch's
    own setting is back."""
    import torch._functorch.config as fconfig
    import torch._inductor.compile_fx as cfx

    from mugraph.frontend.inductor import compile_graph

    if not hasattr(fconfig, "autograd_cache_normalize_inputs"):
        pytest.skip("this torch has no such setting")
    before = fconfig.autograd_cache_normalize_inputs
    seen = []
    monkeypatch.setattr(cfx, "compile_fx", lambda gm, ins: seen.append(fconfig.autograd_cache_normalize_inputs) or gm)
    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    compile_graph(gm, [torch.randn(2)])
    assert seen == [False] and fconfig.autograd_cache_normalize_inputs == before


def test_inductor_settings_apply_to_the_graph_with_its_pieces_only(monkeypatch):
    """``inductor_config`` is in force while Inductor compiles the graph ``compile_graph`` is
    given it for, and torch's own settings are back after; without it nothing is patched."""
    import torch._inductor.compile_fx as cfx
    from torch._inductor import config as iconfig

    from mugraph.frontend.inductor import compile_graph

    before = iconfig.combo_kernels
    seen = []
    monkeypatch.setattr(cfx, "compile_fx", lambda gm, ins: seen.append(iconfig.combo_kernels) or gm)
    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    compile_graph(gm, [torch.randn(2)], config={"combo_kernels": not before})
    compile_graph(gm, [torch.randn(2)])
    assert seen == [not before, before] and iconfig.combo_kernels == before


def test_a_model_whose_trace_torch_refuses_still_compiles(piece_cache, caplog):
    """A tiny Mamba: functionalization fails inside torch on its forward (an internal assert
    that leaves a functorch layer pushed). The graph then runs as Inductor compiles it — which
    works only once that layer is popped again — and its logits are eager's."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=128, state_size=8,
                                   intermediate_size=128, time_step_rank=8)
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(cfg).eval()
    ids = torch.randint(1, 120, (1, 8))
    mask = torch.ones_like(ids)  # with a mask the fallback's compile met the layer left pushed
    caplog.set_level(logging.WARNING, logger="mugraph")
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(ids, attention_mask=mask, use_cache=False).logits
        got = torch.compile(model, backend="mugraph", options=opts(piece_cache, t=1.0))(
            ids, attention_mask=mask, use_cache=False).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert torch._C._functorch.get_dynamic_layer_stack_depth() == 0
    # torch 2.13's functionalization refuses the graph; a torch that traces it needs no fallback
    refused = [m for m in caplog.messages if "without μGraph pieces" in m]
    assert all("tracing failed" in m for m in refused)
