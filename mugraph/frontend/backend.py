"""The ``"mugraph"`` backend of ``torch.compile`` (docs/design.md §10.5).

Dynamo hands the backend a graph of torch calls and its example inputs; the
backend returns a callable that specializes on first use of each input
signature (shapes, dtypes, devices, and the values of integer inputs): it traces
the graph at ATen level, cuts it into Lax pieces, superoptimizes each (a new
shape is a new program: a new search, cached on disk, announced in one log
line), keeps a piece's μGraph only where it times faster than the piece's own torch
ops on the GPU (the never-slower rule, :mod:`.run`), stitches the kept pieces in as
torch operators and hands the result to Inductor, which compiles the rest — and runs that
only if it beats the graph compiled by Inductor alone (the same rule for the whole graph).
A graph with dynamic shapes (a dim dynamo saw change) specializes the first
``DYNAMIC_SIZES`` concrete shapes it meets, each traced again as a static graph of its
own, and runs the later ones as Inductor compiles it, without pieces (``dynamic="auto"``).

Inference only: a call that needs gradients runs the graph through Inductor
without pieces (one log line says so) — the pieces have no backward.

What the backend returns can be saved with the rest of a compile
(``torch.compiler.save_compiled_function``; :mod:`.saved` does it for a model): it keeps
dynamo's graph and the options, and a load specializes again at its first call, from the
caches the saved compile filled.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from collections import deque
from typing import Any, Callable

import torch
import torch.fx as fx

from ..core.errors import ConfigError, first_line
from .ahead import AheadCompile, compile_copy, start as start_ahead
from .aten import Unmapped
from .capture import trace
from .graph import Captured, SearchPlan, gc_paused
from .inductor import compile_graph
from .options import (DYNAMIC_SIZES, GRAPH_RULE_TIMING_S, INDUCTOR_PER_AHEAD_OUTLINED_S, INDUCTOR_PER_AHEAD_S,
                      FrontendOptions)
from .repeats import has_repeats
from .run import device_of, judge_graph
from .trace_memo import folder_of, traced

log = logging.getLogger("mugraph")

#: new searches of at least this many seconds (their limits) start the plain graph's compile
#: in a child process beside them (``FrontendOptions.compile_ahead``); shorter ones would
#: mostly wait for it
AHEAD_MIN_SEARCH_S = 10.0


def pieces_end(ahead: AheadCompile | None, opts: FrontendOptions, started: float,
               outlined: bool = False) -> Callable[[], float | None] | None:
    """The graph clock's ``end_hint`` for a compile that started (``time.time()``) at
    ``started``: once the compile ahead has measured Inductor on this graph, the pieces must
    be done by ``compile_budget`` from the start less Inductor's compile of the graph with
    its pieces (:data:`INDUCTOR_PER_AHEAD_S` times the child's seconds, or
    :data:`INDUCTOR_PER_AHEAD_OUTLINED_S` where its identical layers are compiled once:
    ``outlined``) and the whole-graph rule's timing. None without a compile ahead or a
    ``compile_budget``."""
    if ahead is None or opts.compile_budget is None:
        return None
    factor = INDUCTOR_PER_AHEAD_OUTLINED_S if outlined else INDUCTOR_PER_AHEAD_S

    def end() -> float | None:
        s = ahead.compile_s()
        return None if s is None else started + opts.compile_budget - factor * s - GRAPH_RULE_TIMING_S
    return end


def compiles_ahead(opts: FrontendOptions, device: str, new_search_s: float) -> bool:
    """Whether the graph without its pieces is compiled in a child process beside the
    searches (:mod:`.ahead`): with Inductor, the whole-graph rule on, on a GPU (where the
    rule times it; on a CPU nothing is timed, and the CPU is the searches'), and new searches
    long enough to hide it."""
    return (opts.inductor and opts.compile_ahead and opts.never_slower and device == "cuda"
            and new_search_s >= AHEAD_MIN_SEARCH_S)


def _signature(args: tuple) -> tuple:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append(("T", tuple(a.shape), a.dtype, a.device.type, a.requires_grad))
        else:
            sig.append(("V", a))
    return tuple(sig)


def _timed(timings: dict[str, float], name: str, make: Callable[[], Callable]) -> Callable[[], Callable]:
    """``make``, recording in ``timings[name]`` the seconds it takes when it is called (the
    whole-graph rule makes each form only when it needs it)."""
    def run() -> Callable:
        t = time.perf_counter()
        try:
            return make()
        finally:
            timings[name] = time.perf_counter() - t
    return run


#: the graphs the backend compiled most recently (:func:`recent_graphs`)
_RECENT: deque["MugraphCompiled"] = deque(maxlen=16)


def _uses_worker_processes(opts: FrontendOptions) -> bool:
    """Whether the pieces' searches run local worker processes (``SearchConfig.executor``)."""
    from search.config import SearchConfig

    return opts.search.get("executor", SearchConfig.executor) == "processes"


def recent_graphs() -> list["MugraphCompiled"]:
    """The most recent graphs the backend compiled (at most 16), oldest first.

    ``torch.compile`` hides what a backend returns, so this is how a user — or a benchmark
    script — sees what mugraph did with each dynamo graph: its captures
    (``.captured``: pieces, library ops) and each piece's search and verdict (``bp.info``:
    ``runs`` is ``"mugraph"`` or ``"torch"``, ``why`` says why, ``mugraph_s``/``torch_s`` are
    the never-slower rule's times; ``captured[sig].report()`` prints them, a line a piece)."""
    return list(_RECENT)


class MugraphCompiled:
    """What the backend returns for one dynamo graph: a callable specialized per
    input signature (``variants``) — for a graph of dynamic shapes (``dims``, its symbolic
    sizes), its first ``sizes`` signatures (:data:`~.options.DYNAMIC_SIZES` under
    ``dynamic="auto"``, none under ``"inductor"``), the later ones running the graph as
    Inductor compiles it with those dims (:meth:`general`)."""

    def __init__(self, gm: fx.GraphModule, options: FrontendOptions, example_inputs: list | None = None) -> None:
        self.gm, self.options = gm, options
        _RECENT.append(self)
        self.variants: dict[tuple, Callable] = {}
        self.captured: dict[tuple, Captured] = {}
        #: the graph's symbolic sizes, and how many signatures it specializes before the
        #: rest run :meth:`general` (none of either: every signature is specialized)
        self.dims = symbolic_dims(example_inputs or [])
        self.sizes = {"auto": DYNAMIC_SIZES, "inductor": 0}.get(options.dynamic) if self.dims else None
        self._example_inputs = example_inputs if self.sizes is not None else None
        # the compile of the symbolic graph runs later, in the tracing context dynamo handed it in
        self._tracing = _tracing_context() if self.sizes is not None else None
        self._general: Callable | None | bool = None  # False: its compile failed

    def __call__(self, *args: Any):
        sig = _signature(args)
        fn = self.variants.get(sig)
        if fn is None:
            if self.sizes is not None and len(self.variants) >= self.sizes:
                general = self.general()
                if general:
                    return general(*args)
            fn = self.variants[sig] = self._specialize(sig, args)
        return fn(*args)

    def general(self) -> Callable | None:
        """The graph compiled once for every size of its symbolic dims, as Inductor (or,
        without Inductor, as torch) runs it — no pieces; None when that compile failed (the
        sizes are then specialized, as before)."""
        if self._general is None:
            dims = ", ".join(self.dims[:4]) + (", …" if len(self.dims) > 4 else "")
            past = f" past the {len(self.variants)} sizes it specialized" if self.variants else ""
            log.warning("mugraph: a graph of dynamic shapes (%s: a dim that changes between calls, such as a "
                        "growing KV cache) runs as Inductor compiles it%s, without μGraph pieces. Static shapes "
                        "get them (transformers: cache_implementation=\"static\"; torch.compile(..., "
                        "dynamic=False)), or options dynamic=\"specialize\" searches every size", dims, past)
            try:
                self._general = compile_dynamic(self.gm, self._example_inputs, self.options, self._tracing)
            except Exception as e:  # noqa: BLE001 - Inductor's many errors: the sizes are specialized instead
                log.warning("mugraph: the graph of dynamic shapes did not compile (%s: %s); each size is "
                            "specialized", type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
                self._general = False
        return self._general or None

    #: the format of :meth:`serialize_compile_artifacts`; a saved compile of another is not loaded
    SAVED_FORMAT = 1

    @classmethod
    def serialize_compile_artifacts(cls, fn: "MugraphCompiled") -> bytes:
        """What a saved compile keeps of this graph (torch's ``SerializableCallable``): dynamo's
        graph and the options — not its pieces or kernels, which the result cache, the stored
        trace and Inductor's caches hold, so a load rebuilds the callable from them at its first
        call. A graph of dynamic shapes is not saved (its compile for every size needs dynamo's
        shape environment, which a load does not have)."""
        if fn.dims:
            raise ConfigError(f"mugraph: a graph of dynamic shapes ({', '.join(fn.dims[:4])}) cannot be saved; "
                              "compile it with dynamic=False")
        from torch.fx._graph_pickler import GraphPickler, Options

        dropped = _drop_unpicklable_meta(fn.gm)
        try:
            graph = GraphPickler.dumps(fn.gm, Options(ops_filter=None))
        finally:
            for node, meta in dropped:
                node.meta.update(meta)
        return pickle.dumps({"format": cls.SAVED_FORMAT, "graph": graph, "options": fn.options})

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "MugraphCompiled":
        """The callable :meth:`serialize_compile_artifacts` saved, before its first call."""
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        state = pickle.loads(data)
        if state.get("format") != cls.SAVED_FORMAT:
            raise ConfigError(f"mugraph: a saved graph of format {state.get('format')!r}, not "
                              f"{cls.SAVED_FORMAT}: compile it again")
        gm = GraphPickler.loads(state["graph"], FakeTensorMode(shape_env=ShapeEnv()))
        gm.recompile()  # a module unpickled with a graph of submodules has no forward until then
        # not a graph dynamo traced in this process: its placeholders have no dynamo sources,
        # which AOTAutograd asks of a graph marked as dynamo's
        gm.meta.pop("dynamo_compile_id", None)
        return cls(gm, state["options"])

    def _specialize(self, sig: tuple, args: tuple) -> Callable:
        opts = self.options
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            log.warning("mugraph: gradients are needed; the graph runs without mugraph pieces (inference only)")
            return self._without_pieces(args)
        t0 = time.perf_counter()
        if _uses_worker_processes(opts):
            from search.executors import prestart

            prestart()  # the search workers' fork server imports while the capture runs
        with gc_paused() as pause:
            with torch.no_grad():
                # on a warm start the trace is rebuilt from the one an earlier compile stored
                try:
                    gm, stored = traced(self.gm, args, folder_of(opts.cache_dir), trace)
                except Unmapped as e:  # torch's own tracer refused the graph: it runs as torch.compile runs it
                    log.warning("mugraph: the graph runs without μGraph pieces, as %s: %s",
                                "Inductor compiles it" if opts.inductor else "torch runs it", first_line(e, 300))
                    return self._without_pieces(args)
                cap = Captured(gm, opts.min_ops, opts.max_piece_ops, opts.max_piece_matmuls,
                               proven_only=not opts.allow_unproven)
            self.captured[sig] = cap
            cap.timings["capture_s"] = time.perf_counter() - t0
            cap.timings["stored_trace"] = float(stored)
            dev = device_of(args)
            if opts.repeats_once is None and opts.outlines(dev) and not has_repeats(gm):
                # nothing to compile once: the pieces keep their split-K counters in the graph's buffer
                opts = dataclasses.replace(opts, repeats_once=False)
            plan = cap.plan(opts, dev)
            if plan.new_search_s > 0:  # searches and tunings ahead (seconds to minutes): collected as usual
                pause.resume()
            return self._finish(cap, plan, args, dev, t0, pause, opts)

    def _without_pieces(self, args: tuple) -> Callable:
        """The graph as ``torch.compile`` runs it (Inductor's compile, or torch's ops without
        Inductor): where pieces cannot be made for it."""
        return compile_graph(self.gm, list(args)) if self.options.inductor else self.gm

    def _finish(self, cap: Captured, plan: SearchPlan, args: tuple, dev: str, t0: float,
                pause: gc_paused, opts: FrontendOptions) -> Callable:
        """The pieces searched (or read from the cache) and stitched in, the graph compiled,
        and the whole-graph rule's choice: the callable the signature runs. The collector
        resumes before Inductor, whose compile may be a cold one of a minute."""
        outlines = opts.outlines(dev)  # whether Inductor compiles the graph's identical layers once
        # the whole-graph rule's other side does not depend on the searches: compiled beside them
        ahead = start_ahead(self.gm, list(args)) if compiles_ahead(opts, dev, plan.new_search_s) else None
        started = time.time() - (time.perf_counter() - t0)  # the compile's start, on the wall clock
        try:
            end = pieces_end(ahead, opts, started, outlines)
            stitched = cap.compile(opts, dev, plan=plan, end_hint=end)
            pause.resume()
            cap.timings["pieces_s"] = time.perf_counter() - t0 - cap.timings["capture_s"]
            slower = sum(bp.info.get("torch_s") is not None and bp.info.get("runs") == "torch" for bp in cap.pieces)
            log.info("mugraph: graph of %d ATen ops: %d of %d Lax pieces superoptimized%s, %d library ops",
                     len(cap.info), len(cap.kept), len(cap.pieces),
                     f" ({slower} left to torch as not faster: never-slower rule)" if slower else "",
                     len(cap.library))

            def plain() -> Callable:
                if not opts.inductor:
                    return self.gm
                if ahead is None:  # the copy a compile ahead makes: a cold compile's caches serve it
                    return compile_copy(self.gm, list(args))
                fn = ahead.finish()
                cap.timings["ahead_wait_s"] = ahead.waited_s or 0.0
                cap.timings["ahead_s"] = ahead.compile_s() or 0.0
                return fn

            t1 = time.perf_counter()
            def subset(keep: list) -> Callable:  # the graph with only these pieces as μGraphs
                gm = cap.stitched_with(keep)
                return compile_graph(gm, list(args), outlines, opts.inductor_config) if opts.inductor else gm

            fn = judge_graph(cap, _timed(cap.timings, "inductor_with_pieces_s",
                                         lambda: compile_graph(stitched, list(args), outlines,
                                                               opts.inductor_config)
                                         if opts.inductor else stitched),
                             _timed(cap.timings, "inductor_without_s", plain), args, opts, dev, subset)
            cap.timings["graph_rule_s"] = time.perf_counter() - t1
        finally:
            if ahead is not None:
                ahead.close()
        cap.timings["total_s"] = time.perf_counter() - t0
        log.info("mugraph: graph compiled in %s", cap.timing_summary())
        return fn


#: node metadata a saved graph leaves out: where each node came from in the model (module
#: objects and source frames, which do not pickle) and dynamo's example values (the capture
#: traces the graph again from the call's own inputs)
_UNSAVED_META = ("nn_module_stack", "source_fn_stack", "example_value", "fwd_nn_module_stack")


def _drop_unpicklable_meta(gm: fx.GraphModule) -> list[tuple[fx.Node, dict]]:
    """Removes :data:`_UNSAVED_META` from ``gm``'s nodes; returns what it removed, per node,
    so that the caller can put it back (the live graph may be compiled again)."""
    dropped = []
    for n in gm.graph.nodes:
        meta = {k: n.meta.pop(k) for k in _UNSAVED_META if k in n.meta}
        if meta:
            dropped.append((n, meta))
    return dropped


def _declare_serializable() -> None:
    """Declares :class:`MugraphCompiled` one of torch's ``SerializableCallable`` (what
    ``aot_compile`` asks of a backend's result), where this torch has them."""
    try:
        from torch._dynamo.aot_compile_types import SerializableCallable
    except ImportError:  # pragma: no cover - a torch without saved compiles
        return
    SerializableCallable.register(MugraphCompiled)


_declare_serializable()


def _tracing_context() -> Any:
    from torch._guards import TracingContext

    return TracingContext.try_get()


def compile_dynamic(gm: fx.GraphModule, example_inputs: list, opts: FrontendOptions, tracing_context: Any) -> Callable:
    """``gm`` compiled by Inductor for every size of its symbolic dims — what ``torch.compile``
    itself runs — in the tracing context dynamo handed it in (a later compile needs its
    shape environment); ``gm`` itself without Inductor."""
    if not opts.inductor:
        return gm.forward
    from torch._guards import tracing
    from torch._inductor.compile_fx import compile_fx

    with tracing(tracing_context):
        return compile_fx(gm, example_inputs)


def symbolic_dims(example_inputs: list) -> list[str]:
    """The symbolic sizes among a dynamo graph's example inputs (``s0``, …): dynamo traces a
    graph with them after meeting an input at two sizes of one dim."""
    sizes = [d for a in example_inputs for d in (a.shape if isinstance(a, torch.Tensor) else (a,))]
    return sorted({str(d) for d in sizes if isinstance(d, torch.SymInt)})


def mugraph_backend(gm: fx.GraphModule, example_inputs: list, options: dict | None = None, **kw: Any) -> Callable:
    """``torch.compile(m, backend="mugraph", options={...})``: see :class:`FrontendOptions`.

    A graph with dynamic shapes specializes its first sizes and runs the others as Inductor
    compiles it, without pieces (``dynamic="auto"``; ``"inductor"`` from the first size,
    ``"specialize"`` specializes every size: :class:`MugraphCompiled`). Why: specialized, every size is a new trace,
    new searches of the pieces that depend on it and a new Inductor compile — a
    ``generate`` over transformers' default (growing) cache paid them at every token;
    compiled once with its symbolic dims, the graph runs as ``torch.compile``'s."""
    return MugraphCompiled(gm, FrontendOptions.of({**(options or {}), **kw}), example_inputs)


def register() -> None:
    """Register ``"mugraph"`` with dynamo (once; the entry point does the same lazily)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if _BACKENDS.get("mugraph") is None:
        register_backend(name="mugraph")(mugraph_backend)


register()
