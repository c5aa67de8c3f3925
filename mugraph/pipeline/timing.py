"""Ranking candidates on a GPU: autotune and time the best predicted ones
(``lower.profile``), each checked against the program in float64 on the card.

How many candidates are timed, and how long each is tuned, follows the candidates
themselves (:func:`plan_rerank`), not a fixed top-k and a fixed 10 s:

* **which** — one of each dataflow (``mugraph.core.ir.dataflow_key``: graphs that differ only
  in the order of independent ops lower to the same kernels); of those the best of every
  *structure* (kernel count, and waves of the widest grid: :func:`structure`) predicted
  within :data:`STRUCTURE_SPREAD` of the best — a split-KV pair and a single kernel with the
  lowering's own split-K, or a pair of one wave and one of two, are priced by different
  terms of the model, so one may be wrong where the other is not; then, in turns, every
  candidate the model cannot tell from its structure's best — predicted within
  :data:`SPREAD` of it (the model's favourite among one μGraph's recorded configurations
  was up to 21 % slower than the measured best, and its rank agreement within a μGraph is
  about 0.5: ``lower/calibration.py``) — the second of each structure before the third of
  any, and within a structure every *grid family* (:func:`grids`: the same kernels' grids,
  other loop lengths, which the lowering re-chunks itself) once before a second of any.
  Turns, not the favourite structure's near-ties first: gqa b=1 on an H200 timed five
  single kernels predicted 6.2–6.6 μs (they ran 7.5–12.5) and one split pair predicted 8.7
  (10.2), not the pair predicted 8.8 that has the hand-written reference's structure (5.6
  μs). At least :data:`MIN_TIMED`, at most :data:`MAX_TIMED`. The unfused program is always
  timed too (the safety net).
* **how long** — each candidate's tuning time is its configuration space
  (``lower.profile.config_space``: first-round picks and sweeps, every kernel) times
  ``lower.profile.SECONDS_PER_CONFIG``, within [:data:`MIN_TUNE_S`, :data:`MAX_TUNE_S`];
  when the sum exceeds :data:`TOTAL_TUNE_S` every share is scaled down (not below
  :data:`SCOUT_S`; if even that does not fit, candidates are dropped from the last turn
  back, the best of each structure last: a row that can tune only two times a split-KV pair
  next to the best single kernel, not two variants of that kernel). ``SCOUT_S`` is a first
  look — the predicted configuration compiled and timed, and a few next to it — not a
  tuning: under the small budgets a model's pieces get, a floor of :data:`MIN_TUNE_S` a
  candidate timed one or two of them, and the cost model's favourite at decode could be a
  kernel of 4 blocks that ran 247 μs while a split-KV pair it ranked second was never
  timed (a grouped-query decode attention of 2,304 keys, 12 s of tuning, H200,
  2026-11-28). Scouting more structures is how the model's blind spots get caught; the
  leaders' phase below then tunes the ones that can win.

* **in two installments** — the shares above, planned with the whole budget (which
  candidates are timed does not change), are scaled to :data:`FIRST_PASS` of it (none below
  :data:`SCOUT_S`); what is left when every chosen candidate has had its share goes to
  the *leaders*: those whose
  tuning the share cut short and that measured within :data:`LEADER_SPREAD` of the fastest,
  each resuming its tuning where it stopped (``lower.profile.tune``'s ``history``: nothing
  is compiled or timed twice), by successive halving (:func:`halve`: rounds of equal
  parts, the faster half going on after each, the last one standing tuning longest). A
  candidate's first share decides whether it can win; the time that decides by how much
  goes to those that can, most of it to the one that does. Without
  it the winner of a crowded re-ranking got the same short share as the rest: at the
  default bench limits six candidates share 85–110 s, ~15 s each, about the first round
  of one kernel's configurations (rmsnorm_matmul b=1 ran the reference's own kernel at
  13.1 μs, where a full tuning of the same graph reaches 11.8; H200, 2026-11-26).

The documented bound: the tuning of one re-ranking takes at most ``total_s`` seconds
(default :data:`TOTAL_TUNE_S`) plus, per kernel, the one configuration running when its
share ends and the final re-timing of each candidate and of each resumed leader (a compile
and a timing: seconds) — unless none of the chosen search candidates runs on the card, when
the next best predicted are tried, :data:`MIN_TUNE_S` each, until one does. ``top_k`` and
``tune_seconds`` override the choice and the shares (``tune_seconds``: one installment).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

import lower
from lower.cost_model import H100
from lower.profile import SECONDS_PER_CONFIG, ProfileResult, config_space, rechunks
from lower.runtime import conform
from search.derive import kernel_shape
from verify.floatcheck import KernelFloatAlgebra, normal_inputs

from ..core.errors import MugraphError
from ..core.interpreter import evaluate
from ..core.ir import KernelGraph, dataflow_key
from ..core.text import kernel_structure

if TYPE_CHECKING:
    from .optimize import Phases
    from .results import Candidate

log = logging.getLogger("mugraph")

#: candidates predicted within this factor of the best are all timed
SPREAD = 1.3
#: the best candidate of another structure (:func:`structure`) is timed while predicted within this factor of
#: the best. In the recorded re-rankings (``lower/data/h200_candidates.jsonl.gz``, ``python -m lower.calibration``)
#: the fastest measured candidate was predicted at up to 2.02x the best prediction (gqa b=1: a split pair,
#: 6.3 μs, behind single kernels of 7.4–19.0; qknorm_gqa b=8: 1.93x, the norms apart, 23.6 μs, behind
#: fused kernels of 36–39), and within one program the measured/predicted ratio spans 0.8–3.7
STRUCTURE_SPREAD = 3.0
#: fewest and most candidates timed (the unfused program not counted)
MIN_TIMED, MAX_TIMED = 2, 6
#: tuning seconds one candidate is planned (and the unfused program gets), at least and at most
MIN_TUNE_S, MAX_TUNE_S = 10.0, 120.0
#: the least a planned candidate's share is cut to when the budget cannot give each
#: MIN_TUNE_S: enough to compile its predicted configuration and time it (module docstring)
SCOUT_S = 2.0
#: tuning seconds of one re-ranking, all candidates together (see the module docstring)
TOTAL_TUNE_S = 240.0
#: seconds of a call's budget kept back from the tuning for the final re-timing of each
#: timed candidate (a compile and a timing each) when ``superoptimize`` passes its phases: at
#: most RETIME_RESERVE_S, and for a short call RETIME_SHARE of what is left, not below
#: MIN_RETIME_RESERVE_S (:func:`retime_reserve`)
RETIME_RESERVE_S, RETIME_SHARE, MIN_RETIME_RESERVE_S = 10.0, 0.2, 2.5
#: share of the tuning budget the first installment plans with (the rest goes to the leaders)
FIRST_PASS = 0.5
#: candidates measured within this factor of the fastest after the first installment resume tuning
LEADER_SPREAD = 1.15


def program_share(total_s: float) -> float:
    """The unfused program's tuning share of a re-ranking of ``total_s`` seconds:
    :data:`MIN_TUNE_S`, but at most a third of the total (at least :data:`SCOUT_S`) — the
    program is the safety net, and under a short budget its full share would leave room
    for scouting only one candidate."""
    return max(SCOUT_S, min(MIN_TUNE_S, total_s / 3))


#: seconds past its share after which a tuning that has not returned says so, and again every as many
OVERRUN_LOG_S = 60.0


@contextmanager
def overrun_log(what: str, share_s: float | None, every_s: float = OVERRUN_LOG_S):
    """While the block runs, one warning line each ``every_s`` seconds once it has run that long
    past ``share_s`` (None: past 0). A tuning ends within its share plus the configuration
    running when the share ends — a compile and a timing, seconds — but neither a Triton
    compile nor a kernel has a bound of its own: a re-ranking that ran minutes past its
    budget left no trace of which candidate held it (a decode layer on an H200,
    2026-11-28). The line names it; the work is not interrupted."""
    done = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        wait = (share_s or 0.0) + every_s
        while not done.wait(wait):
            log.warning("mugraph: %s has run %.0f s (its share: %s)", what, time.monotonic() - t0,
                        "none" if share_s is None else f"{share_s:.0f} s")
            wait = every_s

    th = threading.Thread(target=watch, name="mugraph-overrun-log", daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


@dataclass
class RerankPlan:
    """What a re-ranking times: candidates (best predicted first) and each one's tuning seconds
    (None: no limit), and why."""

    timed: list[tuple["Candidate", float | None]]
    why: str

    def to_json(self) -> dict:
        return {"why": self.why, "timed": [{"predicted_us": None if c.predicted_s is None else c.predicted_s * 1e6,
                                            "kernels": c.num_kernels, "origin": c.origin, "found_by": c.found_by,
                                            "tune_s": s} for c, s in self.timed]}


def structure(c: "Candidate", sms: int = H100.sms) -> tuple[int, int]:
    """What :func:`plan_rerank` keeps one of: the kernel count, and how many waves of
    ``sms`` SMs the widest kernel's grid takes. The model prices both by the terms it gets
    most wrong: qknorm_gqa b=8's split pair of 128 blocks (one wave) was predicted 15.6 μs
    and measured 37.2, its hand-written 256-block pair (two waves) 19.5 and 28.5 (H200,
    2026-11-26) — within one kernel count the ranking by waves was backwards, and a
    256-block split of the search's fused kernel, predicted 17.1, could not be timed."""
    grids = [op.attrs["block"].num_blocks for op in c.graph.ops if op.kind == "graph_defined"]
    return c.num_kernels, -(-max(grids, default=0) // sms)


def grids(c: "Candidate") -> tuple:
    """A candidate's grid family: its kernels' grids (library ops by kind), loop lengths left
    out. Graphs of one family differ in how many steps their loops take, which the lowering
    re-chunks itself (``KernelConfig.chunk``), so they tune to nearly the same kernels: gqa
    b=1 on an H200 (2026-11-27) timed three split pairs of 64 blocks + 8, looping 2, 8 and 16
    times, at 6.17–6.36 μs, and not the pair of 128 blocks + 8 predicted 3 % behind them.

    A kernel whose loop the lowering cannot re-chunk (``lower.profile.rechunks``: an online
    softmax's, whose sums are rescaled step by step) keeps its loop length in the family:
    its key tile is fixed by the graph. A 2k-key prompt attention at head dim 128 (H200,
    2026-11-29) ran 177 μs with 64-key steps and 212 μs with 128-key steps at their best
    configurations; the re-ranking, counting them one family, timed only the latter."""
    out = []
    for op in c.graph.ops:
        if op.kind == "input":
            continue
        if op.kind != "graph_defined":
            out.append(op.kind)
            continue
        b = op.attrs["block"]
        out.append((b.grid, b.forloop) if b.forloop > 1 and not rechunks(b) else b.grid)
    return tuple(out)


def plan_rerank(alive: list["Candidate"], top_k: int | None = None, tune_seconds: float | None = None,
                total_s: float = TOTAL_TUNE_S, space=None) -> RerankPlan:
    """Which of ``alive`` (not rejected, any order) to time and how long to tune each
    (module docstring). ``space(graph) -> configurations`` sizes the tuning (default:
    ``lower.profile.config_space`` summed over kernels); the unfused program
    (``origin == "program"``) is always included, after the others."""
    space = space or (lambda g: sum(config_space(g).values()))
    cands, seen = [], set()
    for c in sorted((c for c in alive if c.origin != "program"), key=lambda c: c.predicted_s or 0.0):
        k = dataflow_key(c.graph)
        if k not in seen:  # another ordering of a graph already here lowers to the same kernels
            seen.add(k)
            cands.append(c)
    program = [c for c in alive if c.origin == "program"]
    if not cands:
        return RerankPlan([(c, tune_seconds) for c in program], "only the unfused program")
    prog_s = MIN_TUNE_S if tune_seconds is not None else program_share(total_s)
    p0 = cands[0].predicted_s or 0.0
    if top_k is not None:
        chosen = cands[:top_k]
        why = f"the {len(chosen)} best predicted (top_k={top_k})"
    else:
        best: dict[tuple, float] = {}  # structure -> its best prediction (cands run best first)
        for c in cands:
            best.setdefault(structure(c), c.predicted_s or 0.0)
        rank: dict[tuple, int] = {}
        family_rank: dict[tuple, int] = {}
        turn: dict[tuple, int] = {}
        ranked = []  # ((rank within its grid family, turn among those, its structure's best), candidate)
        for c in cands:
            s = structure(c)
            if best[s] > STRUCTURE_SPREAD * p0:  # a structure the model rules out
                continue
            r = rank[s] = rank.get(s, -1) + 1
            if r == 0 or (c.predicted_s or 0.0) <= SPREAD * best[s]:  # cannot tell it from its best
                g = grids(c)
                f = family_rank[g] = family_rank.get(g, -1) + 1
                t = turn[s, f] = turn.get((s, f), -1) + 1
                ranked.append(((f, t, best[s]), c))
        # the best of every structure, then the best of each other grid family of each, and only
        # then a second spelling of a family (another loop length of the same grids)
        chosen = [c for _, c in sorted(ranked, key=lambda x: x[0])][:MAX_TIMED]
        for c in cands:
            if len(chosen) >= MIN_TIMED:
                break
            if not _among(c, chosen):
                chosen.append(c)
        # kept in this order until the tuning budget is shared out: when it cannot tune them
        # all, the last dropped are the best of each structure, not a second of one
        why = (f"{len(chosen)} of {len(cands)}: the best of each structure (kernels, waves) predicted within "
               f"{STRUCTURE_SPREAD:g}x of the best, and in turns those within {SPREAD:g}x of their structure's "
               f"best (one per grid family before a second), {MIN_TIMED}..{MAX_TIMED} timed")
    if tune_seconds is not None:
        secs: list[float] = [float(tune_seconds)] * len(chosen)
        why += f"; {tune_seconds:g} s of tuning each (tune_seconds)"
    else:
        want = [min(MAX_TUNE_S, max(MIN_TUNE_S, SECONDS_PER_CONFIG * space(c.graph))) for c in chosen]
        # the unfused program is timed too, at its share (program_share): inside the total, not beside it
        # (a 20 s tuning timed two candidates and the program, 30 s, and ran 45–54 s past the
        # call's wall-time budget on an H100, 2026-11-28)
        total_s = max(SCOUT_S, total_s - prog_s * len(program))
        while len(chosen) > 1 and SCOUT_S * len(chosen) > total_s:
            chosen, want = chosen[:-1], want[:-1]
        f = min(1.0, total_s / sum(want))
        secs = [max(SCOUT_S, w * f) for w in want]
        while sum(secs) > total_s + 1e-9:  # the floors pushed it over: take it from the largest shares
            i = max(range(len(secs)), key=lambda k: secs[k])
            secs[i] = max(SCOUT_S, secs[i] - (sum(secs) - total_s))
            if all(s <= SCOUT_S for s in secs):
                break
        why += (f"; tuning sized by each configuration space ({SECONDS_PER_CONFIG:g} s a configuration, "
                f"{MIN_TUNE_S:g}..{MAX_TUNE_S:g} s each, at least {SCOUT_S:g} s when the total is short; "
                f"{sum(secs):.0f} of at most {total_s:g} s in all)")
    timed = sorted(zip(chosen, secs), key=lambda cs: cs[0].predicted_s or 0.0)
    return RerankPlan([*timed, *((c, prog_s) for c in program)], why)


def _among(c: "Candidate", xs: list["Candidate"]) -> bool:
    """``c`` is one of ``xs`` (by identity: two candidates may hold equal graphs)."""
    return any(c is x for x in xs)


def first_installment(timed: list[tuple["Candidate", float | None]], budget: float
                      ) -> list[tuple["Candidate", float | None]]:
    """The plan's shares scaled to ``budget`` in all, none below :data:`SCOUT_S` — the
    plan (made with the whole budget) decides which candidates are timed, so a tight budget
    keeps its breadth; the unfused program's share and unbounded ones stay as they are."""
    total = sum(s for c, s in timed if s is not None and c.origin != "program")
    f = min(1.0, budget / total) if total > 0 else 1.0
    return [(c, s if s is None or c.origin == "program" else max(SCOUT_S, s * f)) for c, s in timed]


#: outputs this many times larger than every input mean a near-cancelling denominator at the
#: draw (a 0/1 mask drawn as a normal input, multiplying exponentials, say)
CHECK_GROWTH = 64.0


def float64_reference(program: KernelGraph, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The program's outputs in float64 on ``inputs``, computed where they are: on a GPU
    there (as the float check computes its references), on the CPU if the card runs out of
    memory. The float check's algebra at float64 (``verify.floatcheck.KernelFloatAlgebra``)
    is the float facet's float64, bit for bit, with an ``exp`` that skips the CPU's slow
    path for results that underflow — every hidden score of a causal mask. On the CPU it
    took 3.8–4.0 s for 2k-token prompt attention (32 heads, d128) where the float facet took
    5.7–6.6 s (2 cores); on an H200 machine, where the CPU computed it, the 8k-token causal
    prompt's calls (8.6 GB of float64 scores) overran their wall-time budget by 21–24 s in
    this step."""
    device = next((v.device for v in inputs.values()), torch.device("cpu"))
    if device.type == "cuda":
        try:
            return evaluate(program, inputs, KernelFloatAlgebra("float64", device))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    return evaluate(program, inputs, KernelFloatAlgebra("float64", "cpu"))


def _check_inputs(program: KernelGraph, device: str = "cuda") -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The inputs every timed configuration is checked on, on ``device`` in each input's
    dtype, and the program's float64 outputs on them (:func:`float64_reference`): normal draws of std 0.25
    from ``device``'s generator (seed 0), or the same draws made non-negative where those
    leave every output finite and within :data:`CHECK_GROWTH` times the largest input while
    the normal ones do not — a program whose denominator sums signed terms (a mask
    multiplying exponentials) nearly cancels at a normal draw, and no fp16 candidate could
    match it there (the float check falls back the same way, §4.10). Drawn where they run:
    a CPU draws a 4096 × 14336 weight in float64 in about a second, a GPU in a millisecond."""
    # a filled input (mugraph.core.fills) is made by the kernels: the interpreter makes it too
    filled = {t.name for t in program.inputs if t.fill is not None}
    drawn = normal_inputs(program, 0.25, 0, device=device)
    inputs = {t.name: drawn[t.name].to(getattr(torch, t.dtype)) for t in program.inputs if t.name not in filled}

    ref = float64_reference(program, inputs)
    largest = max((float(v.abs().max()) for v in inputs.values() if v.numel()), default=1.0)

    def tame(outs: list[torch.Tensor]) -> bool:
        return all(bool(torch.isfinite(r).all()) and float(r.abs().max()) <= CHECK_GROWTH * largest
                   for r in outs if r.numel())

    if not tame(ref):
        pos = {k: v.abs() for k, v in inputs.items()}
        ref_pos = float64_reference(program, pos)
        if tame(ref_pos):
            return pos, ref_pos
    return inputs, ref


def time_on_gpu(program: KernelGraph, alive: list[Candidate], top_k: int | None = None,
                tune_seconds: float | None = None, timing: str = "graph",
                total_s: float = TOTAL_TUNE_S, phases: "Phases | None" = None,
                input_strides: dict[str, tuple[int, ...]] | None = None) -> tuple[Candidate, str]:
    """Autotune and time the candidates :func:`plan_rerank` chooses on the GPU; the fastest wins.

    ``input_strides`` (``OptimizeConfig.input_strides``): the inputs are laid out so for every
    timed configuration — each candidate is compiled to read them in place and tuned on that
    layout, the one the caller will run it on.

    Every timed configuration must match the program evaluated in float64 on the same
    inputs (rel. error ≤ 2e-2 for fp16/bf16, 1e-4 for fp32): a candidate that is wrong on
    the card — fp16 overflow of an intermediate the unfused program stores, say — is
    rejected, never shipped.

    ``phases`` (``superoptimize``'s wall-time record): the float64 reference and the tuning
    are timed as its ``gpu_reference`` and ``gpu_tuning`` phases, and the tuning gets at most
    what is left of the call's budget less :func:`retime_reserve` (never less than
    :data:`MIN_TUNE_S`, or ``total_s`` when that is smaller: the program and the best
    candidate are always timed, and a call that asked for a few seconds of tuning gets them,
    not ten — the ``torch.compile`` backend gives a small piece 2 s)."""
    with _phase(phases, "gpu_reference"):
        # the float check's smallest input scale: inside every benchmark's fp16 range (attention
        # without a max subtraction overflows fp16 for inputs of std ≳ 0.5 — the program itself does)
        inputs, ref = _check_inputs(program)
        ref = [r.to("cuda") for r in ref]
        for name, strides in (input_strides or {}).items():
            if name in inputs:  # a strided copy: the kernels are compiled to read this layout
                inputs[name] = conform(inputs[name], strides)
    tol = 1e-4 if program.inputs[0].dtype == "float32" else 2e-2
    if phases is not None:
        total_s = tuning_seconds(total_s, phases.left())

    def tune(c: "Candidate", secs: float | None, history: dict | None) -> ProfileResult:
        return lower.profile(c.graph, inputs=inputs, ref=ref, tol=tol, budget_s=secs, timing=timing, history=history,
                             log=_trial_log(c))

    with _phase(phases, "gpu_tuning"):
        why = rerank(alive, tune, top_k, tune_seconds, total_s)
    timed = [c for c in alive if c.measured_s is not None]
    if not timed:
        raise MugraphError("superoptimize: no candidate runs on this GPU: "
                           + "; ".join(c.rejected for c in alive if c.rejected))
    best = min(timed, key=lambda c: c.measured_s)
    return best, (f"fastest of {len(timed)} autotuned and timed on {device_name('cuda')} "
                  f"(median, {timing} timing: lower.profile.TIMINGS); {why}")


def _trial_log(c: "Candidate"):
    """Where the tuning of ``c`` says each configuration it times, in its order: the ``mugraph``
    logger at DEBUG, each line naming the candidate's grids (None when DEBUG is off — the lines
    are then not even formatted). What a short tuning share reached, and in what order, is what
    decides the configuration a piece ships; its INFO summary names only the fastest."""
    if not log.isEnabledFor(logging.DEBUG):
        return None
    name = kernel_structure(c.graph)
    return lambda line: log.debug("mugraph: tuning %s:%s", name, line)


def retime_reserve(left_s: float) -> float:
    """Seconds kept back from a tuning for what follows it when ``left_s`` are left: the
    final re-timing of each candidate tuned and the configuration running when a share ends.
    :data:`RETIME_RESERVE_S` for a long call, :data:`RETIME_SHARE` of a short one (at least
    :data:`MIN_RETIME_RESERVE_S`). Why: a piece of a ``torch.compile`` graph has 15–35 s in
    all, and the flat 10 s left its tuning at the 10 s floor, of which a third went to the
    program; every piece of Phi-3-mini's layer still ended 1–3 s before its cut (H200)."""
    return min(RETIME_RESERVE_S, max(MIN_RETIME_RESERVE_S, RETIME_SHARE * left_s))


def tuning_seconds(asked_s: float, left_s: float) -> float:
    """Seconds of tuning for a call that asked for ``asked_s`` with ``left_s`` of its budget
    left: what is left less :func:`retime_reserve`, at most what was asked, and at least
    :data:`MIN_TUNE_S` — or ``asked_s`` when that is less (a 2 s share got 10 s of tuning
    before: on a whole LLaMA-3-8B its RoPE piece tuned for 19.4 s, H200)."""
    return max(min(MIN_TUNE_S, asked_s), min(asked_s, left_s - retime_reserve(left_s)))


def _phase(phases: "Phases | None", name: str):
    """``phases.phase(name)``, or nothing to record."""
    return nullcontext() if phases is None else phases.phase(name)


def rerank(alive: list[Candidate], tune, top_k: int | None = None, tune_seconds: float | None = None,
           total_s: float = TOTAL_TUNE_S) -> str:
    """Tune the candidates :func:`plan_rerank` chooses, in two installments (module
    docstring), setting each one's ``measured_s`` and ``configs`` — or ``rejected`` when it
    does not run. ``tune(candidate, budget_s, history) -> lower.profile.ProfileResult``
    (``lower.profile`` on the card; raises for a candidate the card rejects). Returns why
    these were timed."""
    t_start = time.monotonic()
    installments = tune_seconds is None
    plan = plan_rerank(alive, top_k, tune_seconds, total_s)
    first = first_installment(plan.timed, total_s * FIRST_PASS) if installments else plan.timed
    tuned: dict[int, ProfileResult] = {}  # id(candidate) -> its latest tuning
    ahead = [0]  # configurations timed whose compile a worker had done ahead (lower.precompile)

    def time_one(c: "Candidate", secs: float | None) -> None:
        before = tuned.get(id(c))
        try:
            with overrun_log(f"the tuning of {c.origin} candidate {kernel_shape(c.graph)}", secs):
                res = tune(c, secs, None if before is None else before.timings)
        except Exception as e:  # the compiler or the card rejects it (resources): never ship it
            if before is None:
                c.rejected = f"does not run on this GPU: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            return
        tuned[id(c)] = res
        ahead[0] += res.compiled_ahead
        if before is None or res.time_s < c.measured_s:  # a resumed tuning keeps the better of the two
            c.measured_s = res.time_s
            c.configs = {k: asdict(v) for k, v in res.configs.items()}

    for c, secs in first:
        time_one(c, secs)
    leaders: list[Candidate] = []
    if installments:  # the rest of the budget to the leaders, by successive halving (module docstring)
        done = [c for c, _ in plan.timed if id(c) in tuned]
        fastest = min((c.measured_s for c in done), default=0.0)
        leaders = sorted((c for c in done if tuned[id(c)].cut and c.measured_s <= LEADER_SPREAD * fastest),
                         key=lambda c: c.measured_s)
        halve(leaders, lambda: total_s - (time.monotonic() - t_start), time_one,
              lambda c: tuned[id(c)].cut)
    # none of the planned search candidates runs on this card: the next best predicted, until one does
    rest = [c for c in sorted(alive, key=lambda c: c.predicted_s or 0.0)
            if c.origin != "program" and not _among(c, [x for x, _ in plan.timed])]
    for c in rest:
        if any(x.measured_s is not None for x in alive if x.origin != "program"):
            break
        time_one(c, tune_seconds or MIN_TUNE_S)
    why = plan.why
    if leaders:
        why += f"; then {len(leaders)} leader(s) within {LEADER_SPREAD:g}x tuned on with the rest (successive halving)"
    timed = sum(sum(t is not None for _, t, _ in r.trials) for r in tuned.values())
    if timed:
        why += f"; {timed} configurations timed" + (f", {ahead[0]} of them compiled ahead" if ahead[0] else "")
    return why


def halve(leaders: list["Candidate"], left, time_one, unfinished) -> None:
    """Share what is left of the budget (``left()``: seconds) among ``leaders`` (fastest
    first) by successive halving: in each round every leader still in resumes its tuning for
    an equal part of that round's budget; then the faster half of those whose tuning is
    still unfinished (``unfinished(c)``) go on, until one is left, which gets the rest. The
    rounds share the budget equally (⌈log2 n⌉ + 1 of them), so of three leaders the last
    one standing tunes for 0.61 of it, not the third an equal split gives — the time that
    decides by how much goes to the one that wins — while each of the others still gets a
    part to show whether more tuning moves it ahead. Unused time passes on within a round
    and to the next."""
    rounds = math.ceil(math.log2(len(leaders))) + 1 if leaders else 0
    while leaders and rounds > 0:
        at_start = left()
        budget = at_start / rounds
        for i, c in enumerate(leaders):
            if left() < 1.0:
                return
            share = (budget - (at_start - left())) / (len(leaders) - i)  # what this round has left, shared
            time_one(c, max(1.0, share))
        rounds -= 1
        still = sorted((c for c in leaders if unfinished(c)), key=lambda c: c.measured_s)
        leaders = still[:max(1, math.ceil(len(still) / 2))] if rounds > 1 else still[:1]


def predict_tuned(graph: KernelGraph, input_strides: dict[str, tuple[int, ...]] | None = None,
                  timing: str = "graph"):
    """The cost model's best kernel configs (``lower.tune`` ranking its configuration space
    by the model alone). Nothing is compiled, on a GPU machine either: a configuration the
    card cannot hold is the GPU re-ranking's to reject (:func:`time_on_gpu`).
    ``input_strides``: the layout the caller passes its inputs in
    (``OptimizeConfig.input_strides``): the space is then the one the re-ranking tunes — a
    decode attention reading its key-major Kᵀ is priced on ``tl.dot``, as it runs, not on
    the CUDA cores the tuner never times for it. ``timing``: the timing the re-ranking will
    time it under (``OptimizeConfig.timing``): a cold one prices every input from DRAM
    (``lower.cost_model.for_timing``)."""
    return lower.tune(graph, predict_only=True, input_strides=input_strides, timing=timing)
