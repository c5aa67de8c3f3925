"""The runtime: ``lower.compile(graph) -> CompiledProgram``.

Compilation runs the optimizer passes (layout ILP, scheduling, memory plan), emits
one Triton module for the whole kernel graph and loads it. The compiled program
allocates its workspace and output buffers once; a call checks the inputs, then
launches the kernels (and torch calls for pre-defined ops) in schedule order. On a
GPU every distinct set of input buffers is captured once into a CUDA graph and
replayed, so a call costs one graph launch. On the CPU the same kernels run under
Triton's interpreter (``TRITON_INTERPRET=1``) — slow, but the very code the GPU
runs, which is how the tests check lowering without a GPU.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import linecache
import math
import os
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from mugraph.core.errors import ArgumentTypeError, InputError, InvalidGraphError
from mugraph.core.ir import DEFAULT_SMEM_BUDGET, KernelGraph, Op, Tensor
from mugraph.core.ops import strided_view

from . import layout as layout_mod
from .codegen import BlockKernel, DevArg, KernelConfig, generate
from .config import KernelConfigError, configs_for
from .cost_model import estimate
from .memory import Buffer, MemoryPlan, check_shared_memory, nbytes, plan
from .schedule import kernel_order
from .torch_ops import TORCH_OPS, matmul_adds, source_line

TORCH_DTYPE = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class Step:
    """One scheduled kernel-graph op: a Triton kernel (its launches) or a torch call."""

    op: Op
    kernel: BlockKernel | None = None
    name: str = ""
    fns: list[Callable] = field(default_factory=list)
    options: list[dict] = field(default_factory=list)   # per launch: num_warps, num_stages, launch_pdl
    #: a library ``add`` whose one operand is a library ``matmul`` read by nothing else: the
    #: step runs both as one cuBLAS call (``addmm``/``baddbmm``) and the matmul's step is gone
    fused_matmul: Op | None = None


@contextlib.contextmanager
def _interpret(on: bool):
    """Triton's interpreter for what runs inside: ``TRITON_INTERPRET`` set (a kernel defined
    now is an interpreted one) and Triton's library functions written in Triton as the
    interpreter runs them (:func:`_interpreted_library`)."""
    if not on:
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    restore = _interpreted_library()
    try:
        yield
    finally:
        restore()
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@functools.cache
def _library_functions() -> tuple[tuple[Any, str, Any, Any], ...]:
    """(module, name, compiled function, interpreted one) for each of ``triton.language``'s
    functions written in Triton that is a compiler's ``JITFunction`` — none when Triton was
    first imported under :func:`_interpret`. Made once: the library does not change."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return tuple((mod, name, member, InterpretedFunction(member.fn))
                 for mod in (tl, tl.standard, tl.core, tl.math) for name, member in list(vars(mod).items())
                 if isinstance(member, JITFunction) and not isinstance(member, InterpretedFunction))


def _interpreted_library() -> Callable[[], None]:
    """Swap each of ``triton.language``'s functions written in Triton (``tl.sum``, ``tl.max``,
    their combine functions, …) that is a compiler's ``JITFunction`` for an interpreted one
    (:func:`_library_functions`), and return what swaps them back.

    Why: Triton makes its library functions interpreted or compiled once, when
    ``triton.language`` is first imported, by ``TRITON_INTERPRET`` then. Imported first
    under :func:`_interpret`, they are interpreted and nothing is swapped. Imported before —
    by the caller's own code: a Hugging Face Qwen3 model's import does — they are compiled
    ones, which the interpreter refuses to call ("Cannot call @triton.jit'd outside of the
    scope of a kernel"), and every kernel with a ``tl.sum`` failed on the CPU. The swap lasts
    while the interpreter runs (an inner one, finding them swapped, swaps nothing); compiled
    kernels of the same process see the originals."""
    swapped = []
    for mod, name, compiled, interpreted in _library_functions():
        if getattr(mod, name) is compiled:
            setattr(mod, name, interpreted)
            swapped.append((mod, name, compiled))

    def restore() -> None:
        for mod, name, compiled in reversed(swapped):
            setattr(mod, name, compiled)
    return restore


def _ident(s: str) -> str:
    s = re.sub(r"\W", "_", s)
    return s if s and not s[0].isdigit() else f"g_{s}"


#: generated modules by (sha256 of the source, interpreted?): each is compiled from the
#: source string in memory, never written to or read back from disk
_MODULES: dict[tuple[str, bool], types.ModuleType] = {}


def forget_modules() -> None:
    """Drop the generated modules this process keeps: the next compile of the same source
    loads it afresh and finds its kernels in Triton's cache, or compiles them — what a new
    process does (``examples/tuning_speed.py`` times tunings from nothing compiled so)."""
    _MODULES.clear()


def _load_module(source: str, interpret: bool) -> types.ModuleType:
    """Load the generated module from memory.

    The module is compiled from ``source`` itself and its text is registered with
    :mod:`linecache` under a ``<…>`` name (Triton's ``@jit`` reads a kernel's source
    through :mod:`inspect`; linecache never looks for such names on disk). Nothing is
    written to or imported from a file, so no folder anyone else can write — the
    shared temporary directory included — can put code into a compiled program.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    mode = "i" if interpret else "c"
    filename = f"<mugraph-lower {digest}{mode}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    mod = _MODULES.get((digest, interpret))
    if mod is not None and mod.__dict__.get("__mugraph_source__") == source:
        return mod
    name = f"mugraph_lower_{digest}_{mode}"
    mod = types.ModuleType(name)
    mod.__file__ = filename
    mod.__mugraph_source__ = source
    code = builtins.compile(source, filename, "exec")
    sys.modules[name] = mod  # Triton names kernels by module; pickling finds them here
    with _interpret(interpret):
        exec(code, mod.__dict__)  # noqa: S102 - the source generated just now, from the μGraph
    _MODULES[(digest, interpret)] = mod
    return mod


def pdl_supported(device: str) -> bool:
    """Whether kernels for ``device`` can use programmatic dependent launch: a CUDA GPU of
    compute capability 9.0 or later (Hopper) and a Triton that has ``gdc_wait``."""
    if device != "cuda" or not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        return False
    try:
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True


def capture_graph(launch: Callable[[], object], warmups: int = 3) -> Callable[[], None]:
    """Capture ``launch()`` (kernels, torch calls) as a CUDA graph after ``warmups`` calls
    on a side stream (compilation and autotuning happen outside the capture); returns
    the graph's replay."""
    if warmups:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmups):
                launch()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch()
    return g.replay


def conform(v: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``v`` with the strides the kernels read it with: ``v`` itself when its strides
    match on every dim longer than 1 (a strided view — a transposed weight, a slice —
    passes without a copy), else a copy laid out that way (what ``.contiguous()`` did
    for a row-major input)."""
    if all(n == 1 or a == b for n, a, b in zip(v.shape, v.stride(), strides)):
        return v
    out = torch.empty_strided(tuple(v.shape), strides, dtype=v.dtype, device=v.device)
    out.copy_(v)
    return out


def _fill_tensor(t: Tensor, steps: list["Step"], device: torch.device) -> torch.Tensor:
    """The tensor of filled input ``t`` (:mod:`mugraph.core.fills`), made once: its values
    when a library op reads it, else one element — a kernel makes its tiles from indices
    and never reads the pointer it is passed."""
    if any(s.kernel is None and (t in s.op.inputs or (s.fused_matmul is not None and t in s.fused_matmul.inputs))
           for s in steps):
        return torch.from_numpy(t.fill.values(t.shape, t.dtype)).to(device=device, dtype=TORCH_DTYPE[t.dtype])
    return torch.zeros(1, dtype=TORCH_DTYPE[t.dtype], device=device)


class CompiledProgram:
    """A lowered kernel graph, callable with torch tensors.

    ``prog(x, w1, w2)`` (positional in the graph's input order) or
    ``prog(X=x, W1=w1, W2=w2)``; returns one tensor, or a tuple for several
    outputs. ``out=[...]`` writes into given (contiguous) tensors instead.
    """

    def __init__(self, graph: KernelGraph, device: str, steps: list[Step], source: str,
                 layout: layout_mod.LayoutPlan, memory: MemoryPlan, configs: dict[int, KernelConfig],
                 module: Any, buffers: dict[str, tuple[int, tuple, tuple, str]], cuda_graphs: bool,
                 poison: bool, copy_outputs: bool) -> None:
        self.graph, self.device, self.steps, self._source = graph, device, steps, source
        self.layout, self.memory, self.configs, self.module = layout, memory, configs, module
        self.interpret = device == "cpu"
        self.poison = poison
        self.copy_outputs = copy_outputs
        self.use_cuda_graphs = cuda_graphs and device == "cuda"
        self._graphs: dict[tuple, Callable[[], None]] = {}  # inputs' and outputs' addresses -> replay
        dev = torch.device(device)
        self.arena = torch.empty(max(memory.size, 1), dtype=torch.uint8, device=dev)
        self.views: dict[str, torch.Tensor] = {}
        for name, (off, shape, strides, dtype) in buffers.items():
            n = nbytes(shape, dtype) if shape else 0
            raw = self.arena[off: off + n]
            if dtype == "raw":
                self.views[name] = self.arena[off: off + max(n, 0)]
            else:
                self.views[name] = raw.view(TORCH_DTYPE[dtype]).as_strided(shape, strides)
        #: the strides the kernels read each input with and write each output with (row-major
        #: unless compiled with input_strides / output_strides)
        self.input_strides: list[tuple[int, ...]] = [layout.strides[t.id] for t in graph.inputs]
        self.output_strides: list[tuple[int, ...]] = [layout.strides[t.id] for t in graph.outputs]
        self.outputs = [torch.empty_strided(t.shape, st, dtype=TORCH_DTYPE[t.dtype], device=dev)
                        for t, st in zip(graph.outputs, self.output_strides)]
        self.fills = {t.name: _fill_tensor(t, steps, dev) for t in graph.inputs if t.fill is not None}
        # split-K tile counters ("last" combine): zero now, and every run leaves them zero;
        # outside the arena, so poisoning never touches them
        for s in steps:
            if s.kernel is not None:
                for name, n in s.kernel.locks.items():
                    self.views[name] = torch.zeros(n, dtype=torch.int32, device=dev)

    # ------------------------------------------------------------------ info
    @property
    def kernels(self) -> list[BlockKernel]:
        return [s.kernel for s in self.steps if s.kernel is not None]

    @property
    def num_launches(self) -> int:
        return sum(len(s.kernel.launches) if s.kernel else 1 for s in self.steps)

    def triton_source(self) -> str:
        """The generated module: every Triton kernel, plus the launch schedule."""
        return self._source

    def predicted_time(self, device_params=None) -> float:
        """The analytic cost model's time for this program (seconds)."""
        return estimate(self.graph, device_params, configs=self.configs)

    def __repr__(self) -> str:
        return (f"<CompiledProgram {self.graph.name} on {self.device}: {len(self.kernels)} Triton kernels, "
                f"{self.num_launches} launches, workspace {self.memory.size} B>")

    # ------------------------------------------------------------------ calls
    def _bind(self, args: tuple, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        g = self.graph
        names = [t.name for t in g.inputs if t.fill is None]
        for t in g.inputs:
            if t.fill is not None and t.name in kwargs:
                raise InputError(f"{g.name}: input {t.name!r} is made by the program ({t.fill}); leave it out")
        if len(args) > len(names):
            raise InputError(f"{g.name}: takes {len(names)} inputs {names}, got {len(args)} positional")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise InputError(f"{g.name}: unexpected input {k!r}; inputs are {names}")
            if k in given:
                raise InputError(f"{g.name}: input {k!r} given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise InputError(f"{g.name}: missing inputs {missing}")
        out = []
        for t in g.inputs:
            if t.fill is not None:
                out.append(self.fills[t.name])
                continue
            v = given[t.name]
            if not isinstance(v, torch.Tensor):
                raise InputError(f"{g.name}: input {t.name!r} must be a torch.Tensor, got {type(v).__name__}")
            if tuple(v.shape) != t.shape:
                raise InputError(f"{g.name}: input {t.name!r} has shape {tuple(v.shape)}, expected {t.shape}")
            if v.dtype != TORCH_DTYPE[t.dtype]:
                raise InputError(f"{g.name}: input {t.name!r} has dtype {v.dtype}, expected {TORCH_DTYPE[t.dtype]} "
                                 f"(compile the graph for that dtype, or cast)")
            if v.device != self.arena.device:
                raise InputError(f"{g.name}: input {t.name!r} is on {v.device}, this program runs on "
                                 f"{self.arena.device}")
            if v.layout != torch.strided:
                raise InputError(f"{g.name}: input {t.name!r} is a {v.layout} tensor; pass a dense one")
            out.append(conform(v, self.input_strides[len(out)]))
        return out

    def _check_out(self, out) -> list[torch.Tensor]:
        g = self.graph
        if isinstance(out, torch.Tensor) and len(g.outputs) == 1:
            raise InputError(f"{g.name}: out= takes a list of tensors, one per output: out=[y]")
        if not isinstance(out, (list, tuple)):
            raise InputError(f"{g.name}: out= must be a list of {len(g.outputs)} tensors, got {type(out).__name__}")
        out = list(out)
        if len(out) != len(g.outputs):
            raise InputError(f"{g.name}: out= needs {len(g.outputs)} tensors, got {len(out)}")
        for k, (o, t) in enumerate(zip(out, g.outputs)):
            st = self.output_strides[k]
            if (not isinstance(o, torch.Tensor) or tuple(o.shape) != t.shape or o.dtype != TORCH_DTYPE[t.dtype]
                    or o.device != self.arena.device or o.layout != torch.strided
                    or any(n > 1 and a != b for n, a, b in zip(t.shape, o.stride(), st))):
                lay = "a contiguous" if st == layout_mod.strides_for(t.shape, t.ndim - 1) else f"a strides-{st}"
                raise InputError(f"{g.name}: out[{k}] must be {lay} {t.shape} {t.dtype} tensor on {self.device}")
        return out

    def __call__(self, *args, out=None, **kwargs):
        inputs = self._bind(args, kwargs)
        outs = self._check_out(out) if out is not None else self.outputs
        if self.poison:
            self.arena.fill_(255)  # all-ones bytes: NaN in fp16, bf16 and fp32
            if out is None:
                for o in outs:
                    o.fill_(float("nan"))
        if self.use_cuda_graphs:
            self._replay(inputs, outs)
        else:
            self._run(inputs, outs)
        res = [o.clone() for o in outs] if (self.copy_outputs and out is None) else outs
        return res[0] if len(res) == 1 else tuple(res)

    def resources(self, *args, **kwargs) -> list["LaunchResources"]:
        """What each Triton launch was compiled to on this card, in launch order: registers per
        thread, spilled registers, shared memory per program, warps — and so how many of its
        programs one SM holds at once (:meth:`LaunchResources.resident`). Runs the program once
        on the given inputs (a GPU only: the interpreter compiles nothing)."""
        if self.interpret:
            raise InputError(f"{self.graph.name}: resources are those of a compiled kernel; this program runs "
                             "in Triton's interpreter")
        env = self._env(self._bind(args, kwargs), self.outputs)
        got: list[LaunchResources] = []
        self.run_steps(env, self.arena.device, wrap=lambda fn: _Recording(fn, got), keep_options=True)
        return got

    def launcher(self, *args, **kwargs) -> Callable[[], None]:
        """A zero-argument callable that launches the program's kernels on these
        inputs into the static output buffers, without a CUDA graph of its own — for
        timers that capture many calls into one graph (``lower.profile.measure``)."""
        inputs = self._bind(args, kwargs)
        outs = self.outputs
        return lambda: self._run(inputs, outs)

    @staticmethod
    def _key(inputs, outs) -> tuple:
        return tuple(t.data_ptr() for t in inputs) + tuple(o.data_ptr() for o in outs)

    def _replay(self, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        key = self._key(inputs, outs)
        replay = self._graphs.get(key)
        if replay is None:
            # every new binding runs once outside the capture: Triton specializes a kernel on
            # its arguments (a pointer's 16-byte alignment, an int equal to 1), so new inputs
            # can compile a new variant inside the capture — seen holding one for minutes in
            # ptxas; loading a module there is the likely cause of "operation failed due to a
            # previous error during capture" (a decode layer's first piece on an H200)
            replay = capture_graph(lambda: self._run(inputs, outs), warmups=1)
            if len(self._graphs) >= 8:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = replay
        replay()

    def _env(self, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every buffer the schedule names: the plan's views, the inputs and the outputs."""
        env: dict[str, torch.Tensor] = dict(self.views)
        for t, v in zip(self.graph.inputs, inputs):
            env[t.label()] = v
        for t, o in zip(self.graph.outputs, outs):
            env[t.label()] = o
        return env

    def _run(self, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        self.run_steps(self._env(inputs, outs), self.arena.device)

    def run_steps(self, env: dict[str, torch.Tensor], device: torch.device | str,
                  wrap: Callable | None = None, keep_options: bool = False) -> None:
        """Run the schedule on the buffers in ``env`` (tensor label -> tensor: inputs,
        outputs and every view of the plan): pre-defined ops as torch calls, the rest as
        Triton launches, each through ``wrap(fn)`` when given (``torch.library.wrap_triton``,
        which takes no launch option but warps and stages: ``launch_pdl`` is dropped unless
        ``keep_options``)."""
        with _interpret(self.interpret):
            for step in self.steps:
                op = step.op
                if step.kernel is None:
                    t = op.outputs[0]
                    if step.fused_matmul is not None:
                        r = _matmul_add(step, env).to(TORCH_DTYPE[t.dtype])
                    else:
                        r = TORCH_OPS[op.kind]([env[x.label()] for x in op.inputs], op.attrs,
                                               TORCH_DTYPE[t.dtype], device).to(TORCH_DTYPE[t.dtype])
                    if t in self.graph.outputs:
                        env[t.label()].copy_(r)
                    else:  # a permute or slice stays a strided view: lower.layout gave its readers its strides
                        env[t.label()] = r if strided_view(op.kind) else r.contiguous()
                    continue
                for fn, ln, opts in zip(step.fns, step.kernel.launches, step.options):
                    if wrap is not None:
                        fn = wrap(fn)
                        opts = opts if keep_options else {k: v for k, v in opts.items() if k != "launch_pdl"}
                    fn[(ln.grid,)](*[env[a] for a in ln.args], **opts)


@dataclass(frozen=True)
class LaunchResources:
    """One Triton launch as compiled for the card (:meth:`CompiledProgram.resources`)."""

    name: str
    num_warps: int
    regs: int      # registers per thread
    spills: int    # registers spilled to local memory, per thread
    shared: int    # shared memory per program, bytes
    programs: int  # programs launched

    def resident(self, smem_per_sm: int = 228 * 1024, regs_per_sm: int = 65536, max_warps: int = 64,
                 max_programs: int = 32) -> int:
        """Programs one SM holds at once (a Hopper SM's limits by default): registers are
        given out per warp in units of 256, and each program reserves 1 KB of shared memory
        beside its own."""
        regs_per_warp = -(-max(self.regs, 1) * 32 // 256) * 256
        by_regs = regs_per_sm // (regs_per_warp * self.num_warps)
        by_smem = smem_per_sm // (self.shared + 1024)
        return max(0, min(by_regs, by_smem, max_warps // self.num_warps, max_programs))


class _Recording:
    """A Triton kernel whose launches append what they were compiled to (:class:`LaunchResources`)."""

    def __init__(self, fn: Any, into: list[LaunchResources]) -> None:
        self.fn, self.into = fn, into

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            k = self.fn[grid](*args, **kwargs)
            programs = math.prod(grid)
            self.into.append(LaunchResources(k.name, k.metadata.num_warps, k.n_regs, k.n_spills,
                                             k.metadata.shared, programs))
            return k
        return launch


def _residual(add: Op, mm: Op) -> Tensor:
    return add.inputs[1] if add.inputs[0] is mm.outputs[0] else add.inputs[0]


def _matmul_add(step: Step, env: dict[str, torch.Tensor]) -> torch.Tensor:
    """The fused step's ``residual + a @ b`` as one cuBLAS call."""
    mm = step.fused_matmul
    assert mm is not None
    a, b = (env[t.label()] for t in mm.inputs)
    r = env[_residual(step.op, mm).label()]
    if a.dim() == 2:
        return torch.addmm(r, a, b)
    return torch.baddbmm(r, a, b)


def emit(graph: KernelGraph, configs: Mapping[int, KernelConfig], lay: layout_mod.LayoutPlan, *,
         interpret: bool, pdl: bool, smem_budget: int = DEFAULT_SMEM_BUDGET) -> tuple[list[Step], str]:
    """The scheduled steps of ``graph`` and the Triton module that holds its kernels, as
    :func:`compile` loads it (``configs`` checked already, ``lay`` solved). Kept apart so
    that a process compiling kernels ahead of the tuner (:mod:`lower.precompile`) builds
    the very same module text: Triton's compile cache keys a kernel by its module and the
    line it starts on."""
    order = kernel_order(graph)
    base = _ident(graph.name)

    def devarg(t: Tensor) -> DevArg:
        return DevArg(t.label(), t.shape, lay.strides[t.id], t.dtype)

    adds = matmul_adds(graph)
    fused = {mm.id for mm in adds.values()}
    steps: list[Step] = []
    parts = ["import triton", "import triton.language as tl"]
    if pdl:
        parts.append("from triton.language.extra.cuda import gdc_wait")
    parts += ["",
             f"# mugraph lowering of {graph.name!r}: {len(order)} scheduled ops", ""]
    schedule_lines = []
    for i, op in enumerate(order):
        if op.kind == "graph_defined":
            bg = op.attrs["block"]
            cfg = configs.get(op.id, KernelConfig())
            name = f"{base}_k{op.id}"
            check_shared_memory(bg, 1, smem_budget, name)
            try:
                k = generate(bg, name, [devarg(t) for t in op.inputs], [devarg(t) for t in op.outputs], cfg,
                             interpret=interpret, pdl=pdl)
            except KernelConfigError as e:  # a config this block cannot take: name whose it is
                if op.id not in configs:
                    raise
                raise KernelConfigError(f"lower.compile: configs[{op.id}] ({cfg.label()}): {e}") from None
            steps.append(Step(op, k, name))
            parts.append(k.source)
            for ln in k.launches:
                schedule_lines.append(f"#   {i}: {ln.fn}[({ln.grid},)]({', '.join(ln.args)}) "
                                      f"num_warps={ln.num_warps} num_stages={ln.num_stages}"
                                      + (" launch_pdl=True" if ln.pdl else ""))
        elif op.id in fused:
            continue  # its one reader, an add, runs it (below)
        else:
            mm = adds.get(op.id)
            steps.append(Step(op, None, op.kind, fused_matmul=mm))
            line = source_line(op.kind, op.outputs[0].label(), [x.label() for x in op.inputs], op.attrs)
            if mm is not None:
                call = "addmm" if mm.inputs[0].ndim == 2 else "baddbmm"
                line = (f"{op.outputs[0].label()} = {call}({_residual(op, mm).label()}, "
                        f"{mm.inputs[0].label()}, {mm.inputs[1].label()})  # {mm.outputs[0].label()} fused")
            schedule_lines.append("#   " + f"{i}: " + line)
    parts.append("# launch schedule")
    parts += schedule_lines
    return steps, "\n".join(parts) + "\n"


def compile(graph: KernelGraph, device: str = "cuda", configs: Mapping[int, KernelConfig | dict | str] | None = None,
            *, cuda_graphs: bool = True, use_z3: bool = True, poison: bool = False, copy_outputs: bool = True,
            smem_budget: int = DEFAULT_SMEM_BUDGET, pdl: bool | None = None,
            input_strides: Mapping[str, tuple[int, ...]] | None = None,
            output_strides: Mapping[int, tuple[int, ...]] | None = None) -> CompiledProgram:  # noqa: A001
    """Lower ``graph`` (a μGraph or a plain Program) to a :class:`CompiledProgram`.

    ``device="cuda"`` compiles for the GPU (error if there is none); ``"cpu"`` runs
    the same Triton kernels under the interpreter. ``configs`` maps the op id of
    a graph-defined op to its :class:`KernelConfig` (warps, stages, split-K,
    sub-tiles; see :mod:`lower.profile` for tuning), given as a config, a dict of its
    fields or its label (``"w4s3k2"``); a key that is no graph-defined op of ``graph``, or
    a config the op cannot take, is a one-line error naming the op id. ``poison=True`` fills the
    workspace and outputs with NaN before every call (tests: unwritten elements
    show). ``copy_outputs=False`` returns the static output buffers themselves
    (overwritten by the next call) instead of copies. ``pdl``: launch every Triton
    kernel with programmatic dependent launch (:func:`pdl_supported`; default: where
    supported) — each kernel's launch overlaps the tail of the kernel before it, and
    its first statement, ``gdc_wait()``, holds it until that kernel's writes are
    visible, so results are as with plain stream order (H100: −0.1 to −0.6 μs per
    launch under CUDA-graph replay; docs/history/lowering.md, staged loads).
    ``input_strides`` (input name -> strides in elements, non-overlapping): inputs
    that arrive as strided views — the kernels load through these strides, so a
    transposed weight or a slice is read in place; a call whose tensor has other
    strides is copied into this layout first (:func:`conform`).
    """
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"lower.compile: expected a KernelGraph or Program, got {type(graph).__name__}")
    if device not in ("cuda", "cpu"):
        raise InputError(f"lower.compile: device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("lower.compile: device='cuda' but torch sees no CUDA device; use device='cpu' "
                         "(Triton interpreter)")
    if not graph.outputs:
        raise InvalidGraphError(f"{graph.name}: the graph has no outputs")
    use_pdl = pdl_supported(device)
    if pdl and not use_pdl:
        raise InputError(f"lower.compile: pdl=True needs a CUDA device of compute capability 9.0 or later and a "
                         f"Triton with gdc_wait (device={device!r})")
    use_pdl = use_pdl if pdl is None else pdl
    configs = configs_for(graph, configs, "lower.compile")
    if input_strides is not None:
        names = {t.name for t in graph.inputs}
        if not isinstance(input_strides, Mapping) or not set(input_strides) <= names:
            raise InputError(f"lower.compile: input_strides must map input names {sorted(names)} to strides, "
                             f"got {input_strides!r}"[:300])
    if output_strides is not None and (not isinstance(output_strides, Mapping)
                                       or not set(output_strides) <= set(range(len(graph.outputs)))):
        raise InputError(f"lower.compile: output_strides must map output indices 0..{len(graph.outputs) - 1} to "
                         f"strides, got {output_strides!r}"[:300])
    lay = layout_mod.solve(graph, use_z3=use_z3, input_strides=input_strides, output_strides=output_strides)
    steps, source = emit(graph, configs, lay, interpret=device == "cpu", pdl=use_pdl, smem_budget=smem_budget)

    # memory plan: intermediates of graph-defined kernels and kernel workspaces
    step_of = {s.op.id: i for i, s in enumerate(steps)}
    last_use: dict[int, int] = {}
    for i, s in enumerate(steps):
        for t in list(s.op.inputs) + (list(s.fused_matmul.inputs) if s.fused_matmul is not None else []):
            last_use[t.id] = i
    outs = {t.id for t in graph.outputs}
    bufs: list[Buffer] = []
    meta: dict[str, tuple[int, tuple, tuple, str]] = {}
    for s in steps:
        i = step_of[s.op.id]
        if s.kernel is None:
            continue
        for t in s.op.outputs:
            if t.id not in outs:
                bufs.append(Buffer(t.label(), t.nbytes, i, last_use.get(t.id, i)))
                meta[t.label()] = (0, t.shape, lay.strides[t.id], t.dtype)
        for name, nb in s.kernel.buffers.items():
            bufs.append(Buffer(name, nb, i, i))
            meta[name] = (0, (nb // 4,), (1,), "float32")
    mp = plan(bufs)
    buffers = {n: (mp.offsets[n],) + m[1:] for n, m in meta.items()}
    interpret = device == "cpu"
    mod = _load_module(source, interpret)
    for s in steps:
        if s.kernel is not None:
            s.fns = [getattr(mod, ln.fn) for ln in s.kernel.launches]
            s.options = [{"num_warps": ln.num_warps, "num_stages": ln.num_stages}
                         | ({"launch_pdl": True} if ln.pdl else {}) for ln in s.kernel.launches]
    return CompiledProgram(graph, device, steps, source, lay, mp, configs, mod, buffers, cuda_graphs,
                           poison, copy_outputs)
