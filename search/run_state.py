"""The state one search run hands from phase to phase (:mod:`search.driver`): prepare →
enumerate → candidates → verify → collect.

A search is a sequence of phases over one record, :class:`RunState`, rather than one
object whose methods share attributes: each phase is a function of the record (its
module says which fields it fills), so what a phase reads and writes is visible at its
signature. The few services every phase needs — the progress, the executor, the
checkpoint's save, the clock — are methods of the record.

A piece search (:func:`search.derive.composed`) is a search nested in another: what it
inherits from the search it serves — the end it may not outlive and the progress its
lines nest in — is passed to it explicitly as an :class:`Outer`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from mugraph.core.errors import ConfigError
from mugraph.core.ir import KernelGraph, Program
from mugraph.core.progress import Progress

from .check import Checker
from .checkpoint import Checkpoint
from .config import SearchConfig
from .enumerate import Searcher
from .executors import EXECUTORS, Executor, make_executor
from .records import Proposal, TaskDone
from .worker import WorkerState, shared_state

if TYPE_CHECKING:
    from .dispatch import FairTodo

#: seconds past ``time_limit`` after which running workers are terminated
GRACE = 4.0


@dataclass(frozen=True)
class Outer:
    """What a piece search inherits from the search it serves: a piece search never
    outlives it (``t_end``, monotonic; None: no limit), and its progress lines nest in
    the outer one's (``bar``), sharing its every-10-s budget."""

    t_end: Optional[float]
    bar: Optional[Progress]


@dataclass
class Clock:
    """The run's time points. ``t0``: :func:`time.perf_counter` at the start (the stats'
    seconds count from it); ``t_end``: when the whole call must be done; ``deadline``:
    when dispatching stops, ``verify_reserve`` (at most 30 %) before ``t_end`` — the
    verifications left get the rest (both monotonic; None: no limit) — or ``late_deadline``
    when nothing has matched by then."""

    t0: float
    t_end: Optional[float]
    deadline: Optional[float]
    #: how far dispatching goes on while the enumeration has matched nothing and nothing was
    #: derived (composed, seeded): a third of the reserve before ``t_end`` — the reserve is for
    #: verifying candidates, and with none found yet it would be spent on nothing
    #: (:func:`search.dispatch.enumerate_units`)
    late_deadline: Optional[float] = None

    @classmethod
    def start(cls, cfg: SearchConfig, outer: Optional[Outer]) -> "Clock":
        t0 = time.perf_counter()
        now = time.monotonic()
        t_end = None if cfg.time_limit is None else now + cfg.time_limit
        if outer is not None and outer.t_end is not None:  # a piece search never outlives the search it serves
            t_end = outer.t_end if t_end is None else min(t_end, outer.t_end)
        reserve = None if t_end is None else min(cfg.verify_reserve, 0.3 * (t_end - now))
        deadline = None if t_end is None else t_end - reserve
        late = None if t_end is None else t_end - reserve / 3
        return cls(t0, t_end, deadline, late)

    def since_start(self) -> float:
        """Seconds since the start, rounded as the stats show them."""
        return round(time.perf_counter() - self.t0, 3)

    @staticmethod
    def past(t: Optional[float], extra: float) -> bool:
        """Whether monotonic time ``t`` (None: never) is more than ``extra`` seconds ago."""
        return t is not None and time.monotonic() > t + extra

    @staticmethod
    def wall(t: Optional[float]) -> Optional[float]:
        """Monotonic ``t`` as wall-clock time: what a worker process can compare with."""
        return None if t is None else time.time() + (t - time.monotonic())

    @staticmethod
    def tick() -> float:
        """How long one wait may block: short, so the bar's clock and the deadlines stay live."""
        return 0.5


@dataclass
class VerifyCost:
    """What full verifications cost in this run (dispatch to answer, seconds), against
    the end they must fit before: the number verified scales with what one costs on this
    machine."""

    t_end: Optional[float]
    seconds: list[float] = field(default_factory=list)
    #: the first verification runs even past the time limit (verifications here, on a GPU)
    first_past_end: bool = False

    def median(self) -> Optional[float]:
        return sorted(self.seconds)[len(self.seconds) // 2] if self.seconds else None

    def fits(self) -> bool:
        """Whether a verification started now ends before the time limit, at the median
        cost measured so far (before the first answer: whether any time is left).

        With ``first_past_end``, the first one always fits: on a GPU one costs 0.01–0.05 s
        once the warm-up has prepared the program's side, and a search whose earlier phases
        ran to the limit had otherwise nothing to show for its matches (an H200 search of a
        14336 × 4096 projection: 335 matches, none verified, the split phase 1.7 s past its
        share)."""
        if self.t_end is None or (self.first_past_end and not self.seconds):
            return True
        return time.monotonic() + (self.median() or 0.0) <= self.t_end


@dataclass
class RunState:
    """One search run, from its start to its result; each phase fills its part."""

    program: Program
    cfg: SearchConfig
    #: the caller's finer price of a graph (seconds), for the split-loop shortlist
    estimate: Optional[Callable[[KernelGraph], float]]
    clock: Clock
    #: the search this one serves (None: a top-level search)
    outer: Optional[Outer]
    checker: Checker
    #: full verifications run in this process (serial search, or a GPU here)
    verify_here: bool
    verify_cost: VerifyCost
    # --- prepare: the oracle's searcher and the units of work
    root: Optional[Searcher] = None
    tasks: list = field(default_factory=list)
    #: units of work: (root task index, path below it) — the root tasks, then the pieces
    #: that tasks running past ``split_seconds`` handed back — and their payload JSON
    units: list[tuple[int, tuple]] = field(default_factory=list)
    unit_json: list[list] = field(default_factory=list)
    ckpt: Optional[Checkpoint] = None
    last_save: float = field(default_factory=time.monotonic)
    #: units whose results came from the checkpoint
    resumed: int = 0
    #: graphs proposed outside the enumeration (pieces, split-loop), and their stats
    derived: list[Proposal] = field(default_factory=list)
    dstats: dict[str, Any] = field(default_factory=dict)
    #: verdicts already computed, by the candidate's graph JSON (the seeds, verified before
    #: the enumeration: ``driver._verify_seeds``); the verify phase does not compute them again
    known_verdicts: dict[str, Any] = field(default_factory=dict)
    #: the thread preparing the program's side of the verification (GPU only)
    warming: Optional[threading.Thread] = None
    #: seconds the warm-up took (None: none ran, or it had not finished when the time ran out)
    warm_up_seconds: Optional[float] = None
    #: seconds from the start at which each phase began (the stats' ``phase_started``)
    phase_started: dict[str, float] = field(default_factory=dict)
    # --- enumerate
    #: units still to dispatch (None outside the enumeration: nothing is queued then)
    todo: Optional["FairTodo"] = None
    #: units left per iterative-deepening phase (kernel ops)
    phase_left: Counter = field(default_factory=Counter)
    done: dict[int, TaskDone] = field(default_factory=dict)
    #: seconds each finished unit took in its worker
    unit_seconds: list[float] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    first_match: Optional[float] = None
    phase_done: dict[int, float] = field(default_factory=dict)
    failed: list[dict] = field(default_factory=list)
    worker_failures: list[dict] = field(default_factory=list)
    tasks_cut: int = 0
    search_seconds: float = 0.0
    executor: Optional[Executor] = None
    # --- verify, and the whole run
    bar: Optional[Progress] = None
    #: the running verification's counts (verified, verifications), for the progress
    vcounts: Counter = field(default_factory=Counter)
    interrupted: bool = False

    @classmethod
    def start(cls, program: Program, cfg: SearchConfig,
              estimate: Optional[Callable[[KernelGraph], float]] = None,
              outer: Optional[Outer] = None, checker: Optional[Checker] = None) -> "RunState":
        """The state at the start: the clock running and the config's executor checked.
        ``checker``: one made for this program, error and seed ahead of the search (its
        program's side perhaps prepared: :meth:`Checker.prepare_in_background`); any other
        is not used."""
        clock = Clock.start(cfg, outer)
        if cfg.executor not in EXECUTORS:
            raise ConfigError(f"executor={cfg.executor!r}: use one of {', '.join(EXECUTORS)}")
        if checker is None or not checker.serves(program, cfg.verify_error, cfg.seed):
            checker = Checker(program, cfg.verify_error, cfg.seed)
        return cls(program, cfg, estimate, clock, outer, checker,
                   verify_here=cfg.executor == "serial" or checker.on_gpu(),
                   verify_cost=VerifyCost(clock.t_end, first_past_end=checker.on_gpu()))

    @property
    def nested(self) -> bool:
        """A piece search: Ctrl-C is the outer search's to handle."""
        return self.outer is not None

    # ------------------------------------------------------------- executor
    def running_executor(self) -> Executor:
        """The executor, started on first use (the enumeration, or verifications on workers)."""
        if self.executor is None:
            cfg = self.cfg
            assert self.root is not None
            ex = make_executor(cfg.executor, cfg.workers, ray_address=cfg.ray_address,
                               state=WorkerState(searcher=self.root))
            if cfg.executor != "serial":  # once here, not once per worker (verify.shared_draws)
                self.checker.prepare_fingerprints()
            ex.start(shared_state(self.program, cfg, self.root))
            self.executor = ex
        return self.executor

    def stop_executor(self) -> None:
        if self.executor is not None:
            ex, self.executor = self.executor, None
            ex.close()

    # ----------------------------------------------------------- checkpoint
    def save(self) -> None:
        if self.ckpt:
            self.ckpt.save()
            self.last_save = time.monotonic()

    # ------------------------------------------------------------- progress
    def set_phase(self, phase: str) -> None:
        self.phase_started.setdefault(phase, self.clock.since_start())
        if self.bar is not None:
            self.bar.phase(phase, counts=self.shown_counts())

    def note(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)

    def verdict_seen(self, st: Counter) -> None:
        """One more verdict committed (``st``: the verification's counts so far)."""
        self.vcounts = Counter(st)
        self.refresh()

    def shown_counts(self) -> dict[str, int]:
        """What the progress shows besides the tasks: states, candidates, fingerprint
        matches, and once there are any, verified graphs, failed tasks, lost workers."""
        c = self.counts
        post = {"states": c["block_states"] + c["kernel_states"], "cand": c["candidates"],
                "matches": c["fingerprint_matches"]}
        if self.vcounts["verifications"]:
            post["verified"] = self.vcounts["verified"]
        if self.failed:
            post["failed"] = len(self.failed)
        if self.worker_failures:
            post["lost_workers"] = len(self.worker_failures)
        return post

    def refresh(self) -> None:
        """Show the counts now (a plain line only when one is due: :mod:`mugraph.core.progress`)."""
        if self.bar is not None:
            self.bar.update(counts=self.shown_counts())
