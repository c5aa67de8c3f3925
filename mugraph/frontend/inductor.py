"""Graphs handed to Inductor (docs/design.md §10.5): the backend's graph with its pieces, the
graph without them, and each piece's own torch ops for the never-slower rule.

Things Inductor does not do by itself for these graphs, all about compile time: its caches
must be able to serve them (:func:`_cacheable`), the calls of one piece's Triton kernels
must share the analysis Inductor makes of each call (:func:`shared_kernel_analysis`), and,
where the option asks for it, a model's identical layers are compiled once
(:mod:`.repeats`).
"""

import contextlib
import functools
import hashlib
import inspect
import logging
import types
from typing import Any, Callable, Iterator

import torch
import torch.fx as fx

from ..core.errors import first_line
from .repeats import outline_repeats

log = logging.getLogger("mugraph")


def compile_graph(gm: fx.GraphModule, args: list, repeats_once: bool = False,
                  config: dict[str, Any] | None = None) -> Callable:
    """``gm`` compiled by Inductor for inputs like ``args``, as dynamo hands a graph to a
    backend: in a tracing context, on fake inputs of static shapes — so that its FX graph
    and autograd caches serve the next compile of the same graph (:func:`_cacheable`) — and
    keyed by its placeholders' own names (:func:`_placeholder_names_kept`).

    ``repeats_once``: a run of identical layers is compiled once, as calls of one subgraph
    (:mod:`.repeats`; the backend's option of that name, for the graphs with μGraph pieces);
    should Inductor refuse that graph, the graph is compiled as it is (a warning line says
    why). A graph so compiled carries ``one_by_one()``, which compiles it as it is.

    ``config``: Inductor settings for this compile (``torch._inductor.config`` names and
    values; the backend's ``inductor_config`` option, for the graph with its pieces)."""
    from torch._inductor.compile_fx import compile_fx

    def compiled(g: fx.GraphModule) -> Callable:
        with shared_kernel_analysis(), _placeholder_names_kept(), inductor_settings(config), \
                _cacheable(g, args) as fakes:
            return compile_fx(g, fakes)

    outlined, found = outline_repeats(gm) if repeats_once else (gm, None)
    if found is not None:
        try:
            fn = compiled(outlined)
            log.info("mugraph: Inductor compiled %s", found.line())
            # the graph compiled as it is, for the whole-graph rule should this form's outputs
            # not be torch.compile's (run.judge_graph)
            fn.one_by_one = lambda: compiled(gm)
            return fn
        except Exception as e:  # noqa: BLE001 - any refusal of the subgraph: compile the graph as it is
            log.warning("mugraph: the graph's repeated layers are compiled one by one: Inductor refused their "
                        "shared subgraph (%s)", first_line(e))
    return compiled(gm)


def inductor_settings(config: dict[str, Any] | None) -> contextlib.AbstractContextManager:
    """``torch._inductor.config`` patched with ``config`` (nothing when it is empty). Its
    names are checked where the option is given (``FrontendOptions``); the patch is part of
    what Inductor's caches key a compile on, so a graph compiled with other settings is
    compiled again, not served the other's kernels."""
    if not config:
        return contextlib.nullcontext()
    from torch._inductor import config as inductor_config

    return inductor_config.patch(config)


@contextlib.contextmanager
def _placeholder_names_kept() -> Iterator[None]:
    """AOTAutograd's cache keyed by the graph as it is, its placeholders not renamed first.

    Why: to let graphs that differ only in their input names share an entry, the key
    renames every placeholder, generates the graph's code, and generates it again when it
    puts the names back — 0.7 s of the 1.45 s a warm compile of a tiny 32-layer Phi-3's graph
    spent in Inductor on a CPU, for a graph of 2,500 nodes. The backend's graphs are rebuilt
    from the stored trace with the same names at every warm start, so the key needs no
    renaming to be found again. Where this torch has no such setting, nothing changes."""
    try:
        from torch._functorch import config
    except ImportError:  # pragma: no cover - a torch without AOTAutograd's config
        config = None
    patch = (config.patch(autograd_cache_normalize_inputs=False)
             if hasattr(config, "autograd_cache_normalize_inputs") else contextlib.nullcontext())
    with patch:
        yield


@contextlib.contextmanager
def _cacheable(gm: fx.GraphModule, args: list) -> Iterator[list]:
    """What Inductor's caches ask of a graph they store, given to one the backend compiles;
    yields ``args`` as the fake tensors to compile for.

    The backend compiles at a graph's first call, outside dynamo's tracing, so Inductor found
    no shape environment and bypassed its FX graph cache, and the autograd cache refused the
    mugraph helpers the capture calls (``aten.rotate_half``, the attention's): a whole
    LLaMA-3-8B's graph with its pieces took 57 s to compile at every warm start. Here the
    compile gets a tracing context with a fake mode and a shape environment of its own, and
    the inputs as fake tensors of static shapes — what dynamo hands a backend (the backend
    specializes per signature; real inputs would be made fake by the compile itself with
    every dim symbolic, and a 32-layer LLaMA-3-8B's plain graph then compiled in 60.5 s
    instead of 26 s) — and each call of a mugraph function is marked as a wrapped call keyed
    by a hash of its source, torch's way of declaring a function cache-safe."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    for n in gm.graph.nodes:
        f = n.target
        if n.op == "call_function" and isinstance(f, types.FunctionType) \
                and f.__module__.split(".")[0] == "mugraph":
            n.meta["is_wrapped"] = True
            n.meta["user_cache_hash"] = _source_hash(f)
    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
    fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    with tracing(TracingContext(mode)):
        yield fakes


@functools.lru_cache(maxsize=None)
def _source_hash(f: Callable) -> str:
    """A function's qualified name and the source of its module (the helpers beside it
    included), hashed: what a cache keyed on a call of it must change with."""
    try:
        src = inspect.getsource(inspect.getmodule(f))
    except (OSError, TypeError):
        src = repr(f.__code__.co_code)
    return hashlib.sha256(f"{f.__module__}.{f.__qualname__}\n{src}".encode()).hexdigest()[:24]


def _ir_arg_key(a: Any) -> Any:
    """What of one kernel argument the Triton IR of a call depends on (torch's
    ``generate_ttir`` replaces a traced tensor by a small real one of its dtype and a
    symbolic size by 2): a tensor's dtype (and a real tensor's 16-byte alignment,
    which Triton specializes on), a plain value itself; ``None`` when it cannot say."""
    if isinstance(a, torch.Tensor):
        fake = isinstance(a, torch._subclasses.fake_tensor.FakeTensor)
        return ("tensor", a.dtype, True if fake else a.data_ptr() % 16 == 0)
    if hasattr(a, "get_dtype") and hasattr(a, "get_size"):  # an Inductor TensorBox
        return ("tensor", a.get_dtype(), True)
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) or type(a).__module__.startswith("sympy"):
        return ("symbolic",)
    try:
        hash(a)
    except TypeError:
        return None
    return ("value", type(a).__name__, a)


@contextlib.contextmanager
def shared_kernel_analysis() -> Iterator[None]:
    """While Inductor compiles a graph, calls of the same Triton kernel with arguments of
    the same kinds (:func:`_ir_arg_key`) share one compile to Triton's IR.

    Why: to learn which tensors a ``triton_op``'s kernels write, Inductor compiles each
    call's kernel to Triton's IR, at every call site and twice per site, and keeps
    nothing between them — a 32-layer model's graph with 128–160 piece calls spent 44–55 s
    there, again at every warm compile. The IR is a function of the kernel and of what
    this key holds, so sharing it changes no result. Only torch's private
    ``triton_kernel_wrap.generate_ttir`` is wrapped, for the duration of the block, and
    only where this torch has it. A kernel is known by its code, not by the object
    (:func:`_kernel_key`: torch wraps each launch in a new ``Autotuner``, and a whole
    LLaMA-3-8B's compile made 454 Triton-IR compiles of 6 distinct calls, 15–17 s, keyed by
    object; H200, torch 2.11). Any call whose arguments the key cannot describe compiles as
    before."""
    try:
        from torch._higher_order_ops import triton_kernel_wrap as wrap
    except ImportError:  # a torch without Triton support: nothing to share
        yield
        return
    original = getattr(wrap, "generate_ttir", None)
    if original is None:
        yield
        return
    memo: dict = {}

    def generate_ttir(kernel, kwargs, tma_descriptor_metadata, *rest, **kw):
        args = tuple(sorted((name, _ir_arg_key(v)) for name, v in kwargs.items()))
        try:
            key = (_kernel_key(kernel), args, repr(tma_descriptor_metadata), rest, tuple(sorted(kw.items())))
            hash(key)
        except TypeError:
            key = None
        if key is None or any(k is None for _, k in args):
            return original(kernel, kwargs, tma_descriptor_metadata, *rest, **kw)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (kernel, original(kernel, kwargs, tma_descriptor_metadata, *rest, **kw))
        return hit[1]

    wrap.generate_ttir = generate_ttir
    try:
        yield
    finally:
        wrap.generate_ttir = original


def _kernel_key(kernel: Any) -> Any:
    """What a Triton IR compile of ``kernel`` depends on besides its arguments: for a
    ``JITFunction``, its ``cache_key`` (Triton's own hash of its source and of the globals it
    reads); for an ``Autotuner`` around one — what torch makes of a launch given warps and
    stages, a new one at every call — that key and the first config's arguments, the only
    part of it the IR compile reads; anything else, the object itself. Why not the object: a
    whole LLaMA-3-8B's compile handed the analysis 454 of them for 6 distinct kernels and
    calls, and a key by object shared nothing (H200, torch 2.11)."""
    try:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        if isinstance(kernel, Autotuner) and isinstance(kernel.fn, JITFunction):
            first = kernel.configs[0].kwargs if kernel.configs else {}
            return ("tuned", kernel.fn.cache_key, tuple(sorted((k, repr(v)) for k, v in first.items())))
        if isinstance(kernel, JITFunction):
            return ("source", kernel.cache_key)
    except Exception:  # noqa: BLE001 - a kernel Triton cannot hash (or no Triton): keyed by itself
        pass
    return ("object", id(kernel))
