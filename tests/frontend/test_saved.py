"""Saved compiles (``mugraph.frontend.saved_forward``; docs/models.md, "Saved compiles"): a
model's forward compiled once per call signature, written to a folder, and loaded by a later
compile without dynamo tracing the model again — with the guards that keep a file from
running a call it was not compiled for.

Search and lowering as in test_models.py: the shortest search, every piece run lowered under
Triton's interpreter, Inductor off."""

import inspect
import logging
import pickle
import shutil

import pytest
import torch

import mugraph.frontend  # noqa: F401 - registers the backend
from mugraph.core.errors import ConfigError
from mugraph.frontend import SavedForward, saved_forward
from mugraph.frontend.backend import MugraphCompiled
from mugraph.frontend.options import FrontendOptions

transformers = pytest.importorskip("transformers")

QUICK = {"time_limit": 1.0, "search": {"max_kernel_ops": 1, "max_block_ops": 1}, "unfused": "lower",
         "inductor": False}


class NormLinear(torch.nn.Module):
    """An RMSNorm and a projection: one piece, a plain tensor out."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.proj(h)


@pytest.fixture
def no_trace(monkeypatch):
    """Makes any dynamo trace of a whole graph fail: what a load must not need."""
    import torch._dynamo.convert_frame as cf

    def refuse(*a, **k):
        raise AssertionError("dynamo traced a graph")

    def arm():
        monkeypatch.setattr(cf, "fullgraph_capture", refuse)
        monkeypatch.setattr(cf, "_compile", refuse)
    return arm


def _fresh_process_state() -> None:
    """What a new process starts without: dynamo's compiled frames and the backend's memo."""
    from mugraph.frontend import run

    torch._dynamo.reset()
    run.forget()


def _llama(seed: int = 0):
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, num_hidden_layers=2, vocab_size=128,
                                   max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                   initializer_range=0.2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_generate_saves_two_compiles_and_a_later_one_loads_them_without_tracing(tmp_path, piece_cache, no_trace):
    """``generate`` over a static cache calls the forward at two signatures (the prompt, a
    decode step): each is compiled and saved once; a new ``saved_forward`` over the same
    folder — the model built again, dynamo reset — loads both and generates eager's tokens,
    and no graph is traced by dynamo on the way."""
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static", disable_compile=True)
    opts = {**QUICK, "cache_dir": piece_cache}
    model = _llama()
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = saved_forward(model, tmp_path, opts)
        got = model.generate(ids, **kw)
    assert got.tolist() == want.tolist()
    assert sorted(i["how"] for i in model.forward.info.values()) == ["compiled", "compiled"]
    assert len(list(tmp_path.glob("*.pt2"))) == 2

    _fresh_process_state()
    again = _llama()
    no_trace()
    with torch.no_grad():
        again.forward = saved_forward(again, tmp_path, opts)
        got = again.generate(ids, **kw)
    assert got.tolist() == want.tolist()
    assert sorted(i["how"] for i in again.forward.info.values()) == ["loaded", "loaded"]


def test_a_module_returning_a_tensor_is_saved_and_loaded(tmp_path, piece_cache, no_trace):
    """A plain module: its output comes back as the tensor it returns, and its signature is
    the forward's (``generate`` reads it). A pickled ``SavedForward`` (a model saved with it
    as its forward) loads its compile again."""
    m = NormLinear()
    x = torch.randn(4, 32)
    opts = {**QUICK, "cache_dir": piece_cache}
    with torch.no_grad():
        want = m(x)
        sf = saved_forward(m, tmp_path, opts)
        assert list(inspect.signature(sf).parameters) == ["x"]
        torch.testing.assert_close(sf(x), want)
        copy = pickle.loads(pickle.dumps(sf))
        _fresh_process_state()
        no_trace()
        torch.testing.assert_close(copy(x), want)
    assert [i["how"] for i in copy.info.values()] == ["loaded"]


def _as_module(fn):
    """``fn`` wrapped in a module of a class made here, per call — as transformers 5.25 wraps
    functions it may replace by hub kernels (``apply_rotary_pos_emb``)."""
    class Func(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)
    return Func()


def _halved(x, k=0.5):
    return x * k


class WithLocalClass(torch.nn.Module):
    """A model holding a module of a class no other process can name, outside its submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = NormLinear()
        self.funcs = {"halved": _as_module(_halved)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.funcs["halved"](self.inner(x))


def test_a_model_holding_an_object_of_a_local_class_is_saved_and_loaded(tmp_path, piece_cache, no_trace):
    """The guards dynamo makes through such an object (its type, its function's closure and
    defaults) cannot be saved, or cannot be built again from what was saved: they are left
    out, the model's fingerprint standing for them, and the compile loads without a trace."""
    x = torch.randn(4, 32)
    opts = {**QUICK, "cache_dir": piece_cache}
    torch.manual_seed(0)
    m = WithLocalClass()
    with torch.no_grad():
        want = m(x)
        torch.testing.assert_close(saved_forward(m, tmp_path, opts)(x), want)
        _fresh_process_state()
        torch.manual_seed(0)
        again = WithLocalClass()
        no_trace()
        sf = saved_forward(again, tmp_path, opts)
        torch.testing.assert_close(sf(x), want)
    assert [i["how"] for i in sf.info.values()] == ["loaded"]


def test_a_loaded_graph_with_no_stored_trace_is_traced_again(tmp_path, no_trace):
    """Without the stored ATen trace (``cache_dir=False``) the loaded graph is traced by the
    capture itself, so it must run as a module (its code generated at load); and it is not
    marked as a graph dynamo traced in this process (AOTAutograd would ask its placeholders
    for dynamo sources it does not have)."""
    from mugraph.frontend import recent_graphs

    m = NormLinear()
    x = torch.randn(4, 32)
    opts = {**QUICK, "cache_dir": False}
    with torch.no_grad():
        want = m(x)
        saved_forward(m, tmp_path, opts)(x)
        _fresh_process_state()
        no_trace()
        loaded = saved_forward(m, tmp_path, opts)
        torch.testing.assert_close(loaded(x), want)
    assert [i["how"] for i in loaded.info.values()] == ["loaded"]
    gm = recent_graphs()[-1].gm
    assert "dynamo_compile_id" not in gm.meta and callable(gm.forward)


def test_a_file_whose_guards_refuse_the_call_is_compiled_again(tmp_path, piece_cache, caplog):
    """A saved compile put where another signature's belongs (its name's key is one thing,
    its guards another): the load's guard check refuses it, a log line says so, and the call
    is compiled again — never run by code specialized for other shapes."""
    m = NormLinear()
    opts = {**QUICK, "cache_dir": piece_cache}
    a, b = torch.randn(4, 32), torch.randn(3, 32)
    with torch.no_grad():
        sf = saved_forward(m, tmp_path, opts)
        sf(a)
        shutil.copy(sf.path_of((a,), {}), sf.path_of((b,), {}))
        _fresh_process_state()
        caplog.set_level(logging.WARNING, logger="mugraph")
        other = saved_forward(m, tmp_path, opts)
        torch.testing.assert_close(other(b), m(b))
    assert [i["how"] for i in other.info.values()] == ["compiled"]
    assert any("does not fit this call" in r.getMessage() for r in caplog.records)


def test_a_file_that_does_not_load_is_compiled_again(tmp_path, piece_cache, caplog):
    m = NormLinear()
    x = torch.randn(2, 32)
    sf = saved_forward(m, tmp_path, {**QUICK, "cache_dir": piece_cache})
    caplog.set_level(logging.WARNING, logger="mugraph")
    with torch.no_grad():  # the grad mode is part of the key
        sf.path_of((x,), {}).write_bytes(b"not a saved compile")
        torch.testing.assert_close(sf(x), m(x))
    assert [i["how"] for i in sf.info.values()] == ["compiled"]
    assert any("did not load" in r.getMessage() for r in caplog.records)


def test_the_file_is_keyed_on_the_architecture_not_the_weights(tmp_path):
    """Same architecture, other weights (a fine-tuned copy): the same file — the weights are
    the compiled graph's inputs. Another width, another dtype, training mode or another
    input shape: another file."""
    x = torch.randn(2, 32)
    a, b = NormLinear(), NormLinear()
    path = SavedForward(a, tmp_path).path_of((x,), {})
    assert SavedForward(b, tmp_path).path_of((x,), {}) == path
    assert SavedForward(NormLinear(16), tmp_path).path_of((x,), {}) != path
    assert SavedForward(NormLinear().double(), tmp_path).path_of((x,), {}) != path
    assert SavedForward(NormLinear().eval(), tmp_path).path_of((x,), {}) != path  # a module starts in training mode
    assert SavedForward(a, tmp_path).path_of((torch.randn(3, 32),), {}) != path
    assert SavedForward(a, tmp_path, {"time_limit": 2.0}).path_of((x,), {}) != path


def test_a_forward_that_is_not_one_graph_is_a_one_line_error(tmp_path):
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum().item() > 0:  # data-dependent control flow: a graph break
                return x * 2
            return x

    sf = saved_forward(Branchy(), tmp_path, QUICK)
    with pytest.raises(ConfigError) as e:
        sf(torch.randn(4))
    assert "Branchy's forward could not be compiled to be saved" in str(e.value)
    assert "\n" not in str(e.value)


def test_an_unknown_option_is_said_when_the_forward_is_made(tmp_path):
    with pytest.raises(ConfigError, match="unknown option 'time_limt'"):
        saved_forward(NormLinear(), tmp_path, {"time_limt": 3})


def test_a_graph_of_dynamic_shapes_is_not_saved():
    gm = torch.fx.symbolic_trace(NormLinear())
    compiled = MugraphCompiled(gm, FrontendOptions())
    compiled.dims = ["s0"]
    with pytest.raises(ConfigError, match="dynamic shapes"):
        MugraphCompiled.serialize_compile_artifacts(compiled)


def test_a_process_that_writes_no_bytecode_is_told_when_torch_has_none(tmp_path, monkeypatch):
    """Where Python writes no bytecode and torch's Inductor has none, every new process compiles
    Inductor's modules from source (2-3 s of a whole model's loaded first step on an H200
    host): ``bytecode_missing`` says so — and only then."""
    import importlib.util

    from mugraph.frontend.saved import bytecode_missing

    cached = tmp_path / "compile_fx.cpython.pyc"
    monkeypatch.setattr(importlib.util, "cache_from_source", lambda path: str(cached))
    monkeypatch.setattr("sys.dont_write_bytecode", True)
    assert bytecode_missing()
    cached.write_bytes(b"")
    assert not bytecode_missing()  # torch's bytecode is there to read
    cached.unlink()
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    assert not bytecode_missing()  # the first process writes it for the next
