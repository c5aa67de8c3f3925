"""lower.precompile: compiles run ahead of the tuner in worker processes. No GPU here, so the
GPU-only steps are pretended: what is checked is that a worker's job is the very module the
tuner's own compile loads (so the compile cache serves it), that the tuner hands over what it
will time next and claims each before timing it, and that the pool never changes what is
timed or chosen."""

import concurrent.futures as cf
import importlib
import threading

import pytest

import lower
from lower import precompile as pc
from lower.config import KernelConfig
from mugraph.core.benchmarks import reference

prof = importlib.import_module("lower.profile")  # the module (``lower.profile`` is also a function)
runtime = importlib.import_module("lower.runtime")


def _kernel(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


class _Loaded(Exception):
    """Raised by the pretend module loader: ``compile`` got as far as loading its source."""


def _source_compile_loads(monkeypatch, g, configs, **kw) -> str:
    """The module text ``lower.compile(g, "cuda", configs, **kw)`` would load on a GPU."""
    seen = []

    def load(source, interpret):
        assert interpret is False
        seen.append(source)
        raise _Loaded

    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "pdl_supported", lambda device: False)
    monkeypatch.setattr(runtime, "_load_module", load)
    with pytest.raises(_Loaded):
        lower.compile(g, device="cuda", configs=configs, **kw)
    return seen[0]


@pytest.mark.parametrize("name,b,cfg", [
    ("rmsnorm_matmul", 8, KernelConfig(num_warps=2, num_stages=4)),
    ("gqa", 1, KernelConfig(num_warps=4, num_stages=2, split=2, combine="last")),
])
def test_a_job_is_the_module_the_tuners_own_compile_loads(monkeypatch, name, b, cfg):
    """Triton keys a compiled kernel by its module's name (here a digest of the whole text) and
    the line the kernel starts on: the worker's module must be the tuner's, byte for byte."""
    g = reference(name, b, small=True)
    op = _kernel(g)
    configs = {o.id: cfg if o is op else KernelConfig() for o in g.ops if o.kind == "graph_defined"}
    job = pc.kernel_job(g, configs, op.id, pdl=False)
    assert job.source == _source_compile_loads(monkeypatch, g, configs)
    # and strided inputs: the layout the tuner's inputs have
    t = g.inputs[-1]
    if len(t.shape) == 2:
        strides = {t.name: (1, t.shape[0])}
        job_t = pc.kernel_job(g, configs, op.id, pdl=False, input_strides=strides)
        assert job_t.source == _source_compile_loads(monkeypatch, g, configs, input_strides=strides)
        assert job_t.source != job.source


def test_a_jobs_launches_type_every_argument():
    """Every argument of a launch gets its dtype: tensors their own, workspaces float32, the
    split-K tile counters int32 — the pointer types Triton's compile key holds."""
    g = reference("gqa", 1, small=True)
    op = _kernel(g)
    job = pc.kernel_job(g, {op.id: KernelConfig(split=2, combine="last")}, op.id, pdl=False)
    (step,) = [s for s in runtime.emit(g, {op.id: KernelConfig(split=2, combine="last")},
                                       lower.layout.solve(g, use_z3=True), interpret=False, pdl=False)[0]
               if s.kernel is not None and s.op is op]
    for spec, ln in zip(job.launches, step.kernel.launches):
        assert (spec.fn, spec.grid, spec.num_warps, spec.num_stages) == (ln.fn, ln.grid, ln.num_warps, ln.num_stages)
        assert len(spec.dtypes) == len(ln.args)
    dtypes = {d for spec in job.launches for d in spec.dtypes}
    assert "int32" in dtypes and dtypes <= {"float16", "bfloat16", "float32", "int32"}


def test_a_job_that_cannot_compile_returns_its_error_in_one_line(monkeypatch):
    """A worker never raises: a compile that fails (here Triton's warm-up, pretended: out of
    shared memory, in a message of several lines) is one line back; the tuner compiles that
    configuration itself and meets the error. The job's launch options reach the warm-up."""
    import types

    g = reference("rmsnorm_matmul", 1, small=True)
    op = _kernel(g)
    job = pc.kernel_job(g, {op.id: KernelConfig(num_warps=2, num_stages=4)}, op.id, pdl=False)
    seen = []

    class Fn:
        def warmup(self, *args, grid, **options):
            seen.append((len(args), grid, options))
            raise RuntimeError("out of resource: shared memory, Required: 262144\nHardware limit: 232448")

    monkeypatch.setattr(runtime, "_load_module", lambda source, interpret: types.SimpleNamespace(
        **{ln.fn: Fn() for ln in job.launches}))
    err = pc.compile_job(job)
    assert err == "RuntimeError: out of resource: shared memory, Required: 262144"
    ln = job.launches[0]
    assert seen == [(len(ln.dtypes), (ln.grid,), {"num_warps": 2, "num_stages": 4})]


def test_workers_follow_the_environment(monkeypatch):
    monkeypatch.setenv("MUGRAPH_PRECOMPILE_WORKERS", "3")
    assert pc.default_workers() == 3
    monkeypatch.setenv("MUGRAPH_PRECOMPILE_WORKERS", "0")
    assert pc.default_workers() == 0
    monkeypatch.setenv("MUGRAPH_PRECOMPILE_WORKERS", "many")
    assert pc.default_workers() == 0
    monkeypatch.delenv("MUGRAPH_PRECOMPILE_WORKERS")
    assert 0 <= pc.default_workers() <= pc.MAX_WORKERS


def test_a_claim_waits_for_a_started_compile_and_withdraws_a_waiting_one(monkeypatch):
    """One worker: the first job runs, the second waits. Claiming the second withdraws it (the
    tuner compiles it now anyway); claiming the first waits for it."""
    started, release = threading.Event(), threading.Event()
    done = []

    def fake_compile(job):
        started.set()
        release.wait(5)
        done.append(job)
        return None

    monkeypatch.setattr(pc, "compile_job", fake_compile)
    pre = pc.Precompiler(1, pool=cf.ThreadPoolExecutor(1))
    job = pc.KernelJob("", ())
    pre.ahead([("a", lambda: job), ("b", lambda: job), ("c", lambda: job)])
    assert pre.stats["submitted"] == 2  # two per worker at most under way or waiting
    started.wait(5)
    pre.claim("b")
    assert pre.stats["withdrawn"] == 1
    threading.Timer(0.2, release.set).start()
    pre.claim("a")
    assert pre.stats["compiled"] == 1 and pre.stats["waited"] == 1 and done == [job]
    # a withdrawn key can be handed over again; one that fails to build is skipped
    pre.ahead([("b", lambda: job), ("x", lambda: 1 / 0)])
    assert pre.stats["submitted"] == 3 and pre.futures["x"].result() is None
    pre.withdraw_all()
    pre.pool.shutdown(wait=True)
    assert pc.summary(pre.stats).startswith("compiled ahead: ")


class _Recorder:
    """A pretend pool: records what is handed over and claimed, compiles nothing."""

    def __init__(self):
        self.events, self.jobs = [], []
        self.stats = {k: 0 for k in ("submitted", "compiled", "failed", "waited", "withdrawn")}

    def ahead(self, jobs):
        for key, make in jobs[:4]:
            if ("ahead", key) not in self.events:
                self.events.append(("ahead", key))
                self.jobs.append(make())

    def claim(self, key, until=None):
        self.events.append(("claim", key))

    def withdraw_all(self):
        pass

    def in_use(self):
        import contextlib

        return contextlib.nullcontext(self)


def _fake_gpu(monkeypatch, calls):
    def fake_time(graph, configs, inputs, ref=None, tol=2e-2, timing="graph", sets=None):
        c = list(configs.values())[-1]
        calls.append(c)
        return 1e-5 * (1.0 + 0.1 * c.num_warps + 0.03 * c.num_stages + (0.2 if c.split > 1 else 0.0)), None, 0.0

    monkeypatch.setattr(prof, "_time", fake_time)
    monkeypatch.setattr(prof.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "pdl_supported", lambda device: False)


def test_the_tuner_hands_over_what_it_times_next_and_chooses_the_same(monkeypatch):
    """With the pool, the tuner times the same configurations in the same order and chooses
    the same one; it claims each configuration just before timing it, and most of what it
    timed had been handed over before (not: the first step of a climb from a best just measured)."""
    g = reference("rmsnorm_matmul", 8, small=True)
    plain: list = []
    _fake_gpu(monkeypatch, plain)
    r0 = prof.tune(g, inputs={}, top=3, precompile=False)

    rec = _Recorder()
    monkeypatch.setattr(prof, "shared_precompiler", lambda: rec)
    ahead: list = []
    _fake_gpu(monkeypatch, ahead)
    r1 = prof.tune(g, inputs={}, top=3)
    assert ahead == plain and r1.configs == r0.configs
    op = _kernel(g)
    keys = [prof.program_key([op], {op.id: c}) for c in ahead]
    claims = [i for i, (what, _) in enumerate(rec.events) if what == "claim"]
    assert [rec.events[i][1] for i in claims] == keys[:-1]  # the final re-time is no trial
    handed_before = [("ahead", rec.events[i][1]) in rec.events[:i] for i in claims]
    # misses: a climb's first step from a new best, the combine sibling (decided by a timing)
    assert sum(handed_before) >= 0.9 * len(claims), handed_before
    assert rec.jobs and all(isinstance(j, pc.KernelJob) and j.launches for j in rec.jobs)


def test_tune_checks_the_precompile_flag():
    from mugraph.core.errors import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match="precompile"):
        prof.tune(reference("rmsnorm_matmul", 1, small=True), precompile="yes")


def test_no_pool_on_a_small_host(monkeypatch):
    monkeypatch.delenv("MUGRAPH_PRECOMPILE_WORKERS", raising=False)
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert pc.default_workers() == 0
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert pc.default_workers() == pc.MAX_WORKERS


def test_a_claim_does_not_wait_past_the_kernels_share(monkeypatch):
    """A worker's compile under way when the tuner reaches it is waited for only until the
    kernel's share of the budget ends (a stuck ``ptxas`` runs up to 45 s before it is stopped)."""
    import time

    release = threading.Event()
    monkeypatch.setattr(pc, "compile_job", lambda job: release.wait(5))
    pre = pc.Precompiler(1, pool=cf.ThreadPoolExecutor(1))
    pre.ahead([("a", lambda: pc.KernelJob("", ()))])
    time.sleep(0.1)
    t0 = time.monotonic()
    pre.claim("a", until=time.monotonic() + 0.2)
    assert time.monotonic() - t0 < 1.0 and pre.stats["waited"] == 1 and pre.stats["compiled"] == 0
    release.set()
    pre.pool.shutdown(wait=True)


def test_the_tuning_speed_example_makes_its_row(monkeypatch, tmp_path):
    """examples/tuning_speed.py's row from one tuning, on a pretend GPU (no pool here)."""
    import sys
    from pathlib import Path

    monkeypatch.setenv("MUGRAPH_PRECOMPILE_WORKERS", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # restored after: the example sets its own
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "examples"))
    sys.modules.pop("tuning_speed", None)
    import tuning_speed

    calls: list = []
    _fake_gpu(monkeypatch, calls)
    monkeypatch.setattr(prof, "random_inputs", lambda graph, seed, device: {})
    row = tuning_speed.tune_once(reference("rmsnorm_matmul", 1, small=True), 5.0, True, "graph")
    assert row["timed"] == len(calls) - 1 and row["final_us"] > 0 and row["best_trial_us"] > 0
    assert "pool_counts" not in row  # no pool on this host


def test_the_workers_stop_once_no_tuning_has_used_them_for_a_while(monkeypatch):
    """The pool is started for a tuning and stopped ``idle_s`` after the last one ended (its
    workers hold CUDA contexts a compiled model should get back); a tuning in between keeps it."""
    import time

    monkeypatch.setattr(pc, "_warm_worker", lambda hold_s: None)
    made = []

    class Pool(cf.ThreadPoolExecutor):
        def __init__(self, *a, **kw):
            super().__init__(1)
            made.append(self)

    monkeypatch.setattr(pc.cf, "ProcessPoolExecutor", Pool)
    pre = pc.Precompiler(1, idle_s=1.0)  # seconds a loaded test machine does not stall for
    with pre.in_use():
        assert pre.pool is made[0]
    time.sleep(0.05)
    with pre.in_use():          # within idle_s: the same pool
        time.sleep(1.3)         # a long tuning: no stop while it runs
        assert pre.pool is made[0]
    deadline = time.monotonic() + 10
    while pre.pool is not None and time.monotonic() < deadline:  # idle_s after, give or take the scheduler
        time.sleep(0.05)
    assert pre.pool is None and made[0]._shutdown
    with pre.in_use():          # the next tuning starts a new one
        assert pre.pool is made[1]
    pre.shutdown()


def test_a_compile_error_a_worker_met_is_not_compiled_again(monkeypatch):
    """A configuration whose compile failed in a worker in Triton's own compiler (``ptxas``
    out of registers) counts as failed without the tuner compiling it again; a worker's other
    errors (its own set-up) are not trusted — the tuner compiles those itself."""
    errors = iter(["PTXASError: ptxas fatal: (C7602) Insufficient registers", "RuntimeError: no CUDA driver"])
    monkeypatch.setattr(pc, "compile_job", lambda job: next(errors))
    pre = pc.Precompiler(1, pool=cf.ThreadPoolExecutor(1))
    job = pc.KernelJob("", ())
    pre.ahead([("a", lambda: job)])
    pre.futures["a"].result()
    assert pre.claim("a").startswith("PTXASError")
    pre.ahead([("b", lambda: job)])
    pre.futures["b"].result()
    assert pre.claim("b") is None and pre.stats["failed"] == 2
    pre.pool.shutdown(wait=True)

    g = reference("rmsnorm_matmul", 8, small=True)
    calls: list = []
    _fake_gpu(monkeypatch, calls)
    rec = _Recorder()
    bad = []

    def claim(key, until=None):
        rec.events.append(("claim", key))
        if len(bad) < 2:  # the first two configurations timed failed in a worker
            bad.append(key)
            return "PTXASError: ptxas fatal"
        return None

    rec.claim = claim
    monkeypatch.setattr(prof, "shared_precompiler", lambda: rec)
    r = prof.tune(g, inputs={}, top=3)
    op = _kernel(g)
    timed = {prof.program_key([op], {op.id: c}) for c in calls}
    assert len(bad) == 2 and not timed & set(bad)
    assert all(r.timings[k] is None for k in bad)


def test_a_compile_that_failed_in_a_worker_and_was_never_timed_is_named_at_debug(monkeypatch, caplog):
    """The pool's summary counts failures; which configurations failed only in a worker (a
    ``ptxas`` the bound stopped for one the tuner never reached) is said at DEBUG, by key, when
    the tuning ends — a claimed one is the tuner's to report, and is not said twice."""
    import logging

    monkeypatch.setattr(pc, "compile_job", lambda job: "PTXASError: `ptxas` failed with error code -9")
    pre = pc.Precompiler(1, pool=cf.ThreadPoolExecutor(1))
    job = pc.KernelJob("", ())
    pre.ahead([("k3:w4s3c4va", lambda: job), ("k3:w4s3c4", lambda: job)])
    for f in list(pre.futures.values()):
        f.result()
    pre.claim("k3:w4s3c4")
    with caplog.at_level(logging.DEBUG, logger="mugraph"):
        pre.withdraw_all()
    said = [r.getMessage() for r in caplog.records if "compiled ahead, failed" in r.getMessage()]
    assert said == ["mugraph: compiled ahead, failed, not timed: k3:w4s3c4va: PTXASError: `ptxas` failed with "
                    "error code -9"]
    pre.pool.shutdown(wait=True)
