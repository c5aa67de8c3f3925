"""Triton compiles of the configurations a tuning will time next, run ahead in worker processes.

Why: a configuration's first launch compiles its kernel. On Phi-3-mini's decode pieces (H200,
16 cores) a tuning trial took 0.49 s: the lowering 0.004 s, the timing 0.12 s, and Triton's
compile with the float check at the first launch 0.36 s — three quarters of every tuning
budget went to compiles, one at a time, while the host's other cores sat idle.

The tuner knows what it will time next: its orders are the cost model's predictions
corrected by what it has measured (:mod:`lower.profile`). So before it times one
configuration it hands the next few to a pool of worker processes (:class:`Precompiler`);
each worker builds the program's module exactly as :func:`lower.runtime.compile` would
(:func:`lower.runtime.emit`) and compiles the tuned kernel's launches with Triton's
``warmup``, which compiles without launching and stores the binary in Triton's on-disk
cache. When the tuner reaches that configuration its own first launch finds the binary
there and only loads it.

Nothing a worker does decides a result. A worker only fills the compile cache, under the
key the tuner's own compile uses (the same module text — Triton keys a kernel by its
module and the line it starts on —, argument types, 16-byte-aligned pointers and launch
options). A compile that misses the key (an input that is an unaligned view), fails, or is
not done in time costs the tuner nothing but its own compile, as without the pool; the
tuner still checks and times every configuration itself.

Workers: ``MUGRAPH_PRECOMPILE_WORKERS`` (0: none), by default half the host's cores (none on fewer
than four), at most :data:`MAX_WORKERS`. Each worker imports torch and Triton once (a few seconds, while
the tuner's first configurations compile in the tuner itself) and holds a CUDA context
(Triton asks the device for its target). The pool lives while tunings use it and a minute
after (:data:`IDLE_S`), so the tunings of a ``torch.compile`` model's pieces share it and its
workers exit once the compile is over. Under ``bounded_compiles`` like the
tuner: a worker's ``ptxas`` that runs for minutes is stopped.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import logging
import multiprocessing
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, Mapping

from mugraph.core.ir import DEFAULT_SMEM_BUDGET, KernelGraph

from .config import KernelConfig
from .layout import LayoutPlan

log = logging.getLogger("mugraph")

#: the most worker processes a pool starts (each holds torch, Triton and a CUDA context)
MAX_WORKERS = 8
#: hosts with fewer cores run no pool: the tuner and the timing's host work need them
MIN_CORES = 4
#: configurations handed to the pool ahead of the one being timed, per worker
AHEAD_PER_WORKER = 2
#: the errors of a worker's compile that the tuner's own compile of the same job would raise
#: too (Triton's compiler on the kernel's source: its front end, or ``ptxas`` — failed, or
#: stopped by ``bounded_compiles``); any other error (the worker's own set-up) is not trusted
COMPILE_ERRORS = ("CompilationError", "PTXASError")
#: seconds without a tuning after which a pool's workers are stopped (the next tuning starts
#: them again, in a few seconds, while its first configurations compile in the tuner)
IDLE_S = 60.0
#: seconds the tuner waits for a worker's compile already under way of the configuration it
#: is about to time (a compile the tuner started itself would take as long again)
CLAIM_WAIT_S = 60.0


def default_workers() -> int:
    """Worker processes for a pool: ``MUGRAPH_PRECOMPILE_WORKERS`` where set (0: no pool),
    else half the cores this process may use, at most :data:`MAX_WORKERS` and none below
    :data:`MIN_CORES` cores — the rest are the
    tuner's own, the GPU timing's host work and whatever else the process runs beside it (a
    ``torch.compile`` compiles the graph without its pieces in a child process meanwhile)."""
    env = os.environ.get("MUGRAPH_PRECOMPILE_WORKERS")
    if env is not None:
        try:
            return max(0, int(env))
        except ValueError:
            log.warning("mugraph: MUGRAPH_PRECOMPILE_WORKERS=%r is not a whole number; no compiles run ahead", env)
            return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return 0 if cores < MIN_CORES else min(MAX_WORKERS, cores // 2)


@dataclass(frozen=True)
class LaunchSpec:
    """One launch of a kernel, as a worker compiles it: the module function, its grid, the
    dtype of each argument (``"float16"``, ``"int32"``…; every argument is a device buffer)
    and the launch options that are part of Triton's compile key."""

    fn: str
    grid: int
    dtypes: tuple[str, ...]
    num_warps: int
    num_stages: int
    pdl: bool


@dataclass(frozen=True)
class KernelJob:
    """What a worker needs to compile one kernel of one program: the whole module text (the
    kernel's key depends on the module and on where in it the kernel starts) and its launches."""

    source: str
    launches: tuple[LaunchSpec, ...]
    #: the tuner's ``TRITON_CACHE_DIR`` when the job was made (None: Triton's default): the
    #: worker compiles into the cache the tuner will read
    cache_dir: str | None = None


def kernel_job(graph: KernelGraph, configs: Mapping[int, KernelConfig], op_id: int, *,
               input_strides: Mapping[str, tuple[int, ...]] | None = None, use_z3: bool = True,
               pdl: bool | None = None, smem_budget: int = DEFAULT_SMEM_BUDGET,
               layout: LayoutPlan | None = None) -> KernelJob:
    """The job that compiles kernel ``op_id`` of ``graph`` lowered with ``configs`` for the
    GPU, as ``lower.compile(graph, "cuda", configs, use_z3=…, input_strides=…)`` would build
    it (:func:`lower.runtime.emit`). ``layout``: that call's layout, solved already (it does
    not depend on the configs; the tuner solves it once for all its jobs). A config the
    kernel cannot take raises as ``compile`` does."""
    from . import layout as layout_mod
    from .runtime import emit, pdl_supported

    use_pdl = pdl_supported("cuda") if pdl is None else pdl
    lay = layout if layout is not None else layout_mod.solve(
        graph, use_z3=use_z3, input_strides=dict(input_strides) if input_strides else None)
    steps, source = emit(graph, configs, lay, interpret=False, pdl=use_pdl, smem_budget=smem_budget)
    step = next(s for s in steps if s.op.id == op_id and s.kernel is not None)
    kernel = step.kernel
    dtypes = {t.label(): t.dtype for t in (*step.op.inputs, *step.op.outputs)}
    dtypes.update({name: "float32" for name in kernel.buffers})   # workspaces are float32 views
    dtypes.update({name: "int32" for name in kernel.locks})       # split-K tile counters
    launches = tuple(LaunchSpec(ln.fn, ln.grid, tuple(dtypes[a] for a in ln.args), ln.num_warps, ln.num_stages,
                                ln.pdl) for ln in kernel.launches)
    return KernelJob(source, launches, os.environ.get("TRITON_CACHE_DIR"))


def compile_job(job: KernelJob) -> str | None:
    """Compile ``job``'s launches into Triton's cache without running them (in a worker).
    None when done, else the error in one line — the tuner will meet it again itself."""
    import torch

    from .compile_guard import bounded_compiles
    from .runtime import TORCH_DTYPE, _load_module

    dtype = {**TORCH_DTYPE, "int32": torch.int32}
    if job.cache_dir is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = job.cache_dir
    try:
        with bounded_compiles():
            module = _load_module(job.source, interpret=False)
            for ln in job.launches:
                options = {"num_warps": ln.num_warps, "num_stages": ln.num_stages}
                if ln.pdl:
                    options["launch_pdl"] = True
                getattr(module, ln.fn).warmup(*[dtype[d] for d in ln.dtypes], grid=(ln.grid,), **options)
    except Exception as e:  # noqa: BLE001 - the tuner compiles it again and reports the failure
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def _warm_worker(hold_s: float) -> None:
    """Load Triton and make the CUDA context a compile asks for; held ``hold_s`` so that each
    worker of a starting pool gets one."""
    import torch
    import triton  # noqa: F401

    from . import runtime  # noqa: F401

    if torch.cuda.is_available():
        torch.cuda.init()
    time.sleep(hold_s)


def _start_worker() -> None:
    """A worker ignores Ctrl-C (the tuner's process decides) and runs at a lower priority
    than the tuner, whose timings' host work must not wait for a compile."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(5)
    except OSError:
        pass


@dataclass
class Precompiler:
    """A pool of worker processes compiling kernels ahead of the tuner (module docstring).

    :meth:`ahead` hands over the configurations the tuner will time next, by key (the
    tuner's :func:`lower.profile.program_key`) and a way to build each job; :meth:`claim`,
    called just before the tuner compiles a configuration itself, waits for that key's
    compile if a worker has started it and withdraws it if none has."""

    workers: int
    pool: cf.ProcessPoolExecutor | None = None
    futures: dict[Hashable, cf.Future] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"submitted": 0, "compiled": 0, "failed": 0,
                                                           "waited": 0, "withdrawn": 0})
    #: seconds without a tuning after which the workers are stopped (:meth:`in_use`)
    idle_s: float = IDLE_S
    _users: int = 0
    _timer: threading.Timer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _warming: list = field(default_factory=list)
    #: keys whose job could not be built (the config's lowering failed): marked handed over, so
    #: not built again, but never counted as compiled
    unbuilt: set = field(default_factory=set)
    #: keys the tuner has claimed since the last :meth:`withdraw_all`
    claimed: set = field(default_factory=set)

    def _pool(self) -> cf.ProcessPoolExecutor:
        """The running pool; a new one (its workers warmed: :meth:`start`) when there is none."""
        if self.pool is None:
            # spawned, never forked: the tuner's process holds a CUDA context
            self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                               initializer=_start_worker)
            self._warming = [self.pool.submit(_warm_worker, 0.2) for _ in range(self.workers)]
        return self.pool

    def start(self, wait: bool = False) -> None:
        """Start the workers and have each load Triton and make its CUDA context now, not at
        its first job (seconds each); ``wait``: return when they have."""
        self._pool()
        if wait:
            cf.wait(self._warming)

    @contextmanager
    def in_use(self) -> Iterator["Precompiler"]:
        """The pool while a tuning uses it: started now (the first configurations compile in
        the tuner meanwhile); when the block ends, what was not started is withdrawn, and the
        workers are stopped once no tuning has used them for :attr:`idle_s` seconds — each
        holds torch, Triton and a CUDA context, which a model compiled by the backend should
        get back once its compile is over, not at the process's exit."""
        with self._lock:
            self._users += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self.start()
        try:
            yield self
        finally:
            self.withdraw_all()
            with self._lock:
                self._users -= 1
                if self._users == 0 and self.idle_s is not None:
                    self._timer = threading.Timer(self.idle_s, self._stop_if_idle)
                    self._timer.daemon = True
                    self._timer.start()

    def _stop_if_idle(self) -> None:
        with self._lock:
            if self._users == 0:
                self.shutdown()

    def ahead(self, jobs: list[tuple[Hashable, Callable[[], KernelJob]]]) -> None:
        """Hand the pool each ``(key, make_job)`` not handed over yet, in order, until
        :data:`AHEAD_PER_WORKER` per worker are waiting or under way. ``make_job`` runs here
        (a lowering: milliseconds); a job that cannot be built is skipped."""
        room = AHEAD_PER_WORKER * self.workers - sum(not f.done() for f in self.futures.values())
        for key, make in jobs:
            if room <= 0:
                return
            f = self.futures.get(key)
            if f is not None and not f.cancelled():
                continue
            try:
                job = make()
            except Exception:  # noqa: BLE001 - the tuner meets the config's error itself
                self.futures[key] = _done(None)
                self.unbuilt.add(key)
                continue
            self.futures[key] = self._pool().submit(compile_job, job)
            self.stats["submitted"] += 1
            room -= 1

    def claim(self, key: Hashable, until: float | None = None) -> str | None:
        """Just before the tuner compiles ``key`` itself: wait for a worker's compile of it
        that has started — at most :data:`CLAIM_WAIT_S`, and not past ``until`` (monotonic:
        the end of the kernel's share of the tuning budget) — and withdraw one that has not.
        Why the bound: a worker's ``ptxas`` can run until ``bounded_compiles`` stops it (45 s),
        and a tuner waiting for it past its share would overrun the budget.

        Returns the worker's error when its compile failed in the kernel's own compiler
        (:data:`COMPILE_ERRORS`: the same source, options and Triton fail the same way in the
        tuner, which need not compile it a second time), else None."""
        self.claimed.add(key)
        f = self.futures.get(key)
        if f is None or key in self.unbuilt:  # nothing compiled: the tuner compiles it and meets its error
            return None
        if not f.done() and f.cancel():
            self.stats["withdrawn"] += 1
            return None
        if not f.done():
            self.stats["waited"] += 1
        wait = CLAIM_WAIT_S if until is None else max(0.0, min(CLAIM_WAIT_S, until - time.monotonic()))
        try:
            err = f.result(timeout=wait)
        except Exception:  # noqa: BLE001 - a broken pool or a late compile: the tuner compiles
            return None
        self.stats["compiled" if err is None else "failed"] += 1
        return err if err is not None and err.split(":", 1)[0] in COMPILE_ERRORS else None

    def withdraw_all(self) -> None:
        """Withdraw every compile not started and forget those done (the tuning they were for
        has ended; what they compiled stays in Triton's cache). A compile that failed and the
        tuner never claimed is named at DEBUG: its error was met only in a worker (a ``ptxas``
        that ``bounded_compiles`` stopped, say), and the summary's counts do not say which."""
        for key, f in self.futures.items():
            if f.cancel():
                self.stats["withdrawn"] += 1
            elif f.done() and key not in self.claimed and key not in self.unbuilt:
                err = f.exception() or f.result()
                if err is not None:
                    log.debug("mugraph: compiled ahead, failed, not timed: %s: %s", key, str(err).splitlines()[0][:200])
        self.futures = {k: f for k, f in self.futures.items() if not f.done()}
        self.claimed.clear()

    def shutdown(self) -> None:
        """Stop the workers (a compile under way is let finish; nothing waits for it)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
            self.futures = {}


def _done(value: object) -> cf.Future:
    f: cf.Future = cf.Future()
    f.set_result(value)
    return f


_shared: Precompiler | None = None
_shared_lock = threading.Lock()


def shared(workers: int | None = None) -> Precompiler | None:
    """The process's pool (started at its first job), or None when it would have no worker;
    ``workers``: its size when it is made here (default :func:`default_workers`)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            n = default_workers() if workers is None else workers
            if n <= 0:
                return None
            _shared = Precompiler(n)
            atexit.register(_shared.shutdown)
        return _shared


def summary(stats: Mapping[str, int], seconds: float | None = None) -> str:
    """One log line of a pool's counts."""
    s = (f"compiled ahead: {stats['compiled']} of {stats['submitted']} handed over "
         f"({stats['waited']} waited for, {stats['withdrawn']} withdrawn, {stats['failed']} failed)")
    return s if seconds is None else f"{s} in {seconds:.1f} s"


__all__ = ["Precompiler", "KernelJob", "LaunchSpec", "kernel_job", "compile_job", "shared", "default_workers",
           "summary", "MAX_WORKERS", "AHEAD_PER_WORKER",
           "CLAIM_WAIT_S", "IDLE_S", "COMPILE_ERRORS"]
