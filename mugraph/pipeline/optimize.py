"""``mg.superoptimize``: the stages composed into the product (docs/design.md §8.1).

    Lax program ─► search ─► verify (field + float) ─► lower + cost model ─► profile ─► best

The product layer: it imports the IR core and the three stages; nothing below it
imports it. Results (:mod:`.results`) are cached on disk (:mod:`.cache`); on a GPU
the best predicted candidates are autotuned and timed (:mod:`.timing`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

import search
from lower.cost_model import default_params, estimate, for_timing
from lower.layout import check_strides
import verify
from search.checkpoint import fingerprint_of
from search.config import check_fields, check_keys
from verify.floatcheck import FloatReference

from ..core.errors import ArgumentTypeError, ConfigError, InputError, MugraphError, ResourceError
from ..core.files import as_path, safe_name
from ..core.sizing import too_large
from ..core.ir import DTYPES, KernelGraph, Program, short
from ..core.lax import check_lax
from ..core.limits import MAX_EVAL_ELEMENTS
from ..core.serialize import graph_from_json, graph_to_json
from .cache import cache_doc, cache_key, cache_path, cached, default_cache_dir, key_of, relatives, store, versions
from .results import Candidate, Optimized, load_result
from .timing import TOTAL_TUNE_S, device_name, predict_tuned, time_on_gpu

__all__ = ["superoptimize", "OptimizeConfig", "Optimized", "Candidate", "Interrupted", "DEFAULT_TIME_LIMIT",
           "cache_key", "default_cache_dir", "load_result"]


log = logging.getLogger("mugraph")

#: seconds of search when the config names no ``time_limit`` (``search.SearchConfig``'s default);
#: verification of the search's best candidates is inside it, the float check and lowering after it
DEFAULT_TIME_LIMIT = 300.0

class Interrupted(MugraphError):
    """Ctrl-C stopped ``superoptimize`` before any μGraph was verified."""

@dataclass
class OptimizeConfig:
    """What ``superoptimize`` may spend and how sure it must be.

    ``search``: fields of ``search.SearchConfig`` (limits, mapping candidates,
    workers, executor, time limit, …); the search's ``time_limit`` defaults to
    :data:`DEFAULT_TIME_LIMIT` (300 s, ending earlier when the space is exhausted).
    ``error``: the verifier's bound on a false accept.
    ``top_k``: how many candidates (best predicted first) are autotuned and timed on a GPU;
    None (default): as many as the cost model cannot tell apart, with tuning time sized
    by each one's configuration space (``mugraph.pipeline.timing.plan_rerank``).
    ``tune_s``: seconds the GPU re-ranking may spend tuning and timing in all (None:
    ``mugraph.pipeline.timing.TOTAL_TUNE_S``, 240 s; the unfused program's share is
    ``MIN_TUNE_S`` of it, and each timed candidate gets at least ``SCOUT_S``, so fewer are
    timed under a small bound).
    ``float_dtypes``: dtypes of the float check (default: the program's dtype).
    ``keep_program``: let the unfused program itself (one library call per op)
    compete, so the answer is never slower than what came in.
    ``time_program``: float-check, tune and time the unfused program on a GPU as a contender
    (default). ``False``: the caller runs its own ops wherever the program would be the
    answer, as the ``torch.compile`` backend does (``unfused="torch"``), and times them against
    the answer itself (its never-slower rule) — so the program is only priced by the cost
    model: it is the answer when no μGraph is verified (or none runs on the GPU), never
    checked or tuned. Measured on an H200: a LLaMA-3-8B gated MLP piece with nothing verified
    spent 2.9 s float-checking the program and 4.7 s computing its float64 reference for a
    GPU timing nobody used, and Phi-3-mini's decode attention piece gave a third of its
    10 s of tuning to the program, whose lowered time decides nothing a torch op runs.
    ``allow_unproven``: ship a searched μGraph whose verification did not reach ``error``
    (its field tests passed, but the bound on a false accept stayed above the target:
    evidence, not a proof) when no proven one is faster — with a warning line. Off by
    default: a superoptimizer's answer must equal what came in, so an unproven μGraph is
    set aside (``report["set_aside"]`` lists those faster than the answer, with their
    bounds) and the best proven candidate — or the program itself — ships.
    ``input_strides``: input name -> strides (in elements) for inputs the caller will pass as
    strided views — a weight handed in transposed, as ``nn.Linear`` stores it. The GPU
    re-ranking tunes and times every candidate on inputs laid out so, and the answer is
    compiled to read them in place: the tile shapes and split that stream a row-major weight
    at full bandwidth are not those that stream its transpose (a GEMV's best layouts differ),
    so tuning on another layout ships the wrong configs. Part of the cache key.
    ``timing``: how the GPU re-ranking times each configuration (``lower.profile.TIMINGS``):
    ``"graph"`` (default) back to back in a CUDA graph, the inputs warm in L2; ``"dram"``
    the same with the large inputs copied so each call reads them from DRAM — what a
    weight or a KV cache costs inside a model's step (the ``torch.compile`` backend's
    choice), and how the cost model prices the search's candidates and their configurations
    (``lower.cost_model.for_timing``). Part of the cache key: configurations ranked one way
    are not the other's.
    """

    search: dict = field(default_factory=dict)
    error: float = 2.0 ** -40
    top_k: int | None = None
    tune_s: float | None = None
    float_dtypes: tuple[str, ...] | None = None
    keep_program: bool = True
    time_program: bool = True
    allow_unproven: bool = False
    input_strides: dict[str, tuple[int, ...]] | None = None
    timing: str = "graph"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field and every ``search`` key, before any work: a bad value is a
        one-line :class:`ConfigError` naming it, never a search that runs and fails."""
        e = self.error
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e < 1:
            raise ConfigError(f"error={short(e)}: the false-accept bound must lie in (0, 1)")
        if self.top_k is not None and (type(self.top_k) is not int or self.top_k < 1):
            raise ConfigError(f"top_k={short(self.top_k)}: must be a positive int or None (candidates timed)")
        t = self.tune_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise ConfigError(f"tune_s={short(t)}: must be None or a number of seconds > 0 (GPU tuning in all)")
        for name in ("keep_program", "time_program", "allow_unproven"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={short(getattr(self, name))}: must be True or False")
        fd = self.float_dtypes
        if fd is not None:
            if isinstance(fd, str) or not isinstance(fd, (tuple, list)) or not fd:
                raise ConfigError(f"float_dtypes={short(fd)}: must be None or a non-empty tuple of dtype names")
            for d in fd:
                if not isinstance(d, str) or d not in DTYPES:
                    raise ConfigError(f"float_dtypes={short(fd)}: {short(d)} is not a dtype the float check runs "
                                      f"({', '.join(sorted(DTYPES))})")
            self.float_dtypes = tuple(fd)
        self.input_strides = _check_strides(self.input_strides)
        if self.timing not in ("graph", "dram"):
            raise ConfigError(f"timing={short(self.timing)}: must be 'graph' or 'dram' (lower.profile.TIMINGS)")
        if not isinstance(self.search, dict):
            raise ConfigError(f"search={short(self.search)}: must be a dict of search.SearchConfig fields")
        for k, arg in _SET_BY_SUPEROPTIMIZE.items():
            if k in self.search:
                raise ConfigError(f"search.{k}: set by superoptimize itself; pass {arg} instead")
        check_keys(self.search, "search: ", exclude=tuple(_SET_BY_SUPEROPTIMIZE))
        self.search = check_fields(self.search, "search.")
        for k in ("forloop_ranges", "tile_sizes"):
            if k in self.search and not self.search[k]:
                raise ConfigError(f"search.{k}=[]: must be a non-empty list of positive ints")

    def to_json(self) -> dict:
        d = asdict(self)
        d["search"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.search.items()}
        if self.input_strides is not None:
            d["input_strides"] = {k: list(v) for k, v in sorted(self.input_strides.items())}
        if self.timing == "graph":  # the default: cache keys made before the field existed still hold
            del d["timing"]
        return d


def _check_strides(strides: Any) -> dict[str, tuple[int, ...]] | None:
    """``OptimizeConfig.input_strides`` as a dict of input names to int tuples (``None`` or
    an empty dict: every input row-major). The names and ranks are checked against the
    program by :func:`check_strides_for`."""
    if strides is None or strides == {}:
        return None
    if not isinstance(strides, dict):
        raise ConfigError(f"input_strides={short(strides)}: must be None or a dict of input name -> strides")
    out = {}
    for k, v in strides.items():
        if not isinstance(k, str) or isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)) \
                or not all(type(x) is int and x >= 0 for x in v):
            raise ConfigError(f"input_strides[{short(k, 30)}]={short(v)}: must be a tuple of ints >= 0 "
                              "(strides in elements)")
        out[k] = tuple(v)
    return out


def check_strides_for(program: KernelGraph, strides: dict[str, tuple[int, ...]] | None) -> None:
    """Each name of ``strides`` is an input of ``program`` with one stride per dim, and the
    strides lay it out without overlap — ``lower.layout.check_strides``, the check
    ``lower.compile`` makes, said before the search."""
    if not strides:
        return
    inputs = {t.name: t for t in program.inputs}
    for k, st in strides.items():
        t = inputs.get(k)
        if t is None:
            raise ConfigError(f"input_strides: {short(k, 30)} is not an input of {program.name!r} "
                              f"(inputs: {', '.join(inputs)})")
        if len(st) != t.ndim:
            raise ConfigError(f"input_strides[{k!r}]={st}: {k} has {t.ndim} dims {t.shape}")
        try:
            check_strides(t, st)
        except InputError as e:
            raise ConfigError(str(e)) from None

#: SearchConfig fields superoptimize sets from its own arguments (a value in ``search``
#: would be overwritten silently, so it is refused)
_SET_BY_SUPEROPTIMIZE = {"seed": "superoptimize(seed=...)", "progress": "superoptimize(progress=...)",
                         "verify_error": "OptimizeConfig(error=...)"}

def make_config(config: Any) -> OptimizeConfig:
    """``config`` (an OptimizeConfig, a dict of its fields, or None) as a validated
    OptimizeConfig; an unknown key is a ConfigError naming it (and the likely one)."""
    if isinstance(config, OptimizeConfig):
        config.validate()
        return config
    if config is None:
        return OptimizeConfig()
    if not isinstance(config, dict):
        raise ArgumentTypeError(f"superoptimize: config must be an OptimizeConfig, a dict or None, "
                                f"got {type(config).__name__}")
    names = [f.name for f in dataclasses.fields(OptimizeConfig)]
    for k in config:
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if not close and isinstance(k, str) and _is_search_field(k):
                hint = f"; it is a search field: {{'search': {{{k!r}: ...}}}}"
            raise ConfigError(f"config: unknown key {short(k, 40)}{hint} (keys: {', '.join(names)})")
    return OptimizeConfig(**config)

def _is_search_field(k: str) -> bool:
    return k in {f.name for f in dataclasses.fields(search.SearchConfig)}

def _resolve_device(device: str) -> str:
    if not isinstance(device, str) or device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"device={short(device)}: use 'auto', 'cuda' or 'cpu'")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device")
    return device

def superoptimize(program: Program, config: OptimizeConfig | dict | None = None, *, device: str = "auto",
                  cache_dir: str | Path | None = None, progress: bool = True, seed: int = 0,
                  stop_by: float | None = None) -> Optimized:
    """Search, verify, lower and time μGraphs for ``program``; return the fastest.

    ``cache_dir``: where results are cached (default ``$MUGRAPH_CACHE_DIR`` or
    ``~/.cache/mugraph``); pass ``False`` to neither read nor write the cache. An
    entry is used only if the program, configuration, seed, versions and device
    stored in it are the ones asked for; a foreign or corrupt entry is recomputed
    and replaced, with a one-line warning on the ``mugraph`` logger.

    Every argument is checked before any work starts.

    Time: the search takes at most ``config.search["time_limit"]`` seconds (default
    :data:`DEFAULT_TIME_LIMIT`, 300 s; less when its space is exhausted), then each verified
    candidate is float-checked and lowered (seconds each). With the cache on, the search is
    checkpointed under ``cache_dir/checkpoints/`` (unless ``search.checkpoint`` names a file),
    so a search cut short — by Ctrl-C or a crash — resumes where it stopped on the next call.

    ``stop_by``: a ``time.time()`` value by which the call should return, sooner than its
    own budget (``time_limit + tune_s`` + :func:`slack_s`) would end — a caller sharing one
    wall-clock budget among many calls (the ``torch.compile`` backend) passes it. The search
    keeps its whole ``time_limit`` (its result is what the cache key names); the float checks
    and the GPU tuning after it are cut to end by ``stop_by``. Not part of the cache key: the
    answer is cached as the one of these limits; ``report["cut_to_s"]`` records the seconds
    the call had when ``stop_by`` cut its budget (None when it did not).

    Ctrl-C returns an :class:`Optimized` built from the candidates verified so far
    (``report["interrupted"]`` is True; it is not cached), or raises :class:`Interrupted` when
    none was.
    """
    if not isinstance(program, KernelGraph):
        raise ArgumentTypeError(f"superoptimize: expected a mugraph Program, got {type(program).__name__}")
    if any(op.kind == "graph_defined" for op in program.ops):
        raise ConfigError(f"superoptimize: {program.name!r} already holds graph-defined kernels; "
                          "hand it the plain program (use verify.equivalent to check a hand-written μGraph)")
    if not program.outputs:
        raise ConfigError(f"superoptimize: {program.name!r} has no outputs")
    check_lax(program)
    cfg = make_config(config)
    check_strides_for(program, cfg.input_strides)
    if not isinstance(progress, bool):
        raise ArgumentTypeError(f"superoptimize: progress={short(progress)} must be True or False")
    if type(seed) is not int or seed < 0:
        raise ConfigError(f"superoptimize: seed={short(seed)} must be an int >= 0")
    if not (cache_dir is None or cache_dir is False or isinstance(cache_dir, (str, os.PathLike))):
        raise ArgumentTypeError(f"superoptimize: cache_dir={short(cache_dir)} must be a folder path, None or False")
    if stop_by is not None and (isinstance(stop_by, bool) or not isinstance(stop_by, (int, float))
                                or stop_by != stop_by):
        raise ConfigError(f"superoptimize: stop_by={short(stop_by)} must be a time.time() value or None")
    big = too_large(program, MAX_EVAL_ELEMENTS)  # the verifier evaluates the program at its shapes
    if big is not None:
        raise ResourceError(f"superoptimize: {program.name!r}: {big.clause} (mugraph.core.limits.MAX_EVAL_ELEMENTS), "
                            "too large to verify; reduce the shapes")
    dev = _resolve_device(device)
    path = key_doc = None
    if cache_dir is not False:
        root = default_cache_dir() if cache_dir is None else as_path(cache_dir, "superoptimize: cache_dir")
        key_doc = cache_doc(program, cfg, seed, dev)
        path = cache_path(root, program, key_of(key_doc))
        hit = cached(path, program, key_doc)
        if hit is not None:
            return hit
    ckpt_dir = None if path is None else path.parent / "checkpoints"
    seeds = [] if path is None else _transferred(path.parent, program, key_doc)
    if dev == "cuda":  # the cost model prices for the GPU this process uses (lower.cost_model.default_params)
        torch.cuda.init()
    try:
        result = _run_pipeline(program, cfg, dev, progress, seed, ckpt_dir, stop_by, seeds)
    except KeyboardInterrupt:  # before the search started, or while it was setting up
        raise Interrupted(f"superoptimize: interrupted before any μGraph of {program.name!r} was verified") from None
    if path is not None and not result.report.get("interrupted"):
        store(path, result, key_doc)
    return result

def _checkpoint_path(folder: Path, program: Program, scfg) -> Path:
    """The default checkpoint of a search: named by the program and a hash of what decides
    its result (program, result-relevant config), so a rerun — with another time limit or
    worker count too — finds it, and no other search does."""
    return folder / f"{safe_name(program.name, 48)}-{fingerprint_of(graph_to_json(program), scfg.key())[:24]}.ckpt.json"

def _lowered_estimate(graph, input_strides: dict[str, tuple[int, ...]] | None = None,
                      timing: str = "graph") -> float:
    """Seconds the lowering's cost model predicts for ``graph`` at its best predicted
    configs, its inputs laid out as ``input_strides`` (``OptimizeConfig.input_strides``) and
    read as ``timing`` reads them (``OptimizeConfig.timing``) — what the search's split-loop
    variants are ranked by (``search.derive.splits``), the price this pipeline ranks the
    verified ones by too."""
    return predict_tuned(graph, input_strides, timing).predicted_s


def _estimator(cfg: OptimizeConfig) -> Callable:
    """:func:`_lowered_estimate` for ``cfg``'s input layout and timing (a picklable callable:
    the search's workers price with it)."""
    given: dict[str, Any] = {}
    if cfg.input_strides:
        given["input_strides"] = cfg.input_strides
    if cfg.timing != "graph":
        given["timing"] = cfg.timing
    return functools.partial(_lowered_estimate, **given) if given else _lowered_estimate

def _search(program: Program, scfg, own_checkpoint: bool, seeds: list[KernelGraph], estimate: Callable,
            checker=None):
    """``search.run`` (``seeds``: :func:`_transferred`; ``checker``: :func:`search.prepared_checker`);
    a default checkpoint that cannot be read is replaced (with a warning): it is the cache's
    own file, and the search can only start over."""
    try:
        return search.run(program, scfg, estimate=estimate, seeds=seeds, checker=checker)
    except search.CheckpointError as e:
        if not own_checkpoint:
            raise
        log.warning("mugraph checkpoint: %s: starting the search over", str(e)[:300])
        Path(scfg.checkpoint).unlink(missing_ok=True)
        return search.run(program, scfg, estimate=estimate, seeds=seeds)

#: why a searched candidate was not float-checked: the call's time ran out first (it is still
#: listed as set aside when it is unproven)
UNCHECKED = "not checked: the wall-time budget was spent"
#: seconds ``superoptimize`` may run past ``time_limit + tune_s`` (the float check, the
#: cost model, the GPU's float64 reference, compiling): the documented bound on its wall time
#: — for a short call, less (:func:`slack_s`)
SLACK_S = 30.0
#: the least slack of a call, however short its limits
MIN_SLACK_S = 5.0


def slack_s(time_limit: float, tune: float) -> float:
    """Seconds a call with these limits may run past them: :data:`SLACK_S`, or for a short
    call half its limits (at least :data:`MIN_SLACK_S`). Why in proportion: the backend cuts
    a model's pieces to shares of one graph budget, and a fixed 30 s past each share added up
    — measured on whole models (H200, 9–12 distinct pieces), searches and tuning took
    200–238 s against a 160 s budget, a gated MLP's piece spending 20 s float-checking
    candidates after a 13 s search."""
    return min(SLACK_S, max(MIN_SLACK_S, (time_limit + tune) / 2))


class Phases:
    """Seconds spent per phase of one ``superoptimize`` call (``report["phases"]``), and the
    wall-time budget the call keeps: ``time_limit + tune_s`` + :func:`slack_s` from its start. A
    phase that finds the budget spent says so in one warning line (which phase, by how much)
    and the phases after it do only what the answer needs (no more candidates checked, no
    tuning)."""

    def __init__(self, budget_s: float | None) -> None:
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.seconds: dict[str, float] = {}
        self.overran: str | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        """Seconds left of the budget (inf without a time limit)."""
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed()

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)
            if self.overran is None and self.left() < 0:
                self.overran = name
                log.warning("mugraph: the %s phase overran the wall-time budget (%.0f s = time_limit + tune_s + "
                            "slack) by %.0f s: %s", name, self.budget_s, -self.left(),
                            _WHY_SLOW.get(name, "see report['phases']"))

    def to_json(self) -> dict:
        return {k: round(v, 3) for k, v in self.seconds.items()}


#: what a phase that overran the budget spent its time on (the warning line's reason)
_WHY_SLOW = {
    "scout": "the search of the program at smaller sizes (its share of the time limit, then its verifications)",
    "search": "the search's workers outlived its time limit (a verification or task past the deadline)",
    "check": "float-checking and pricing the verified candidates (large weights: float64 on the CPU)",
    "gpu_reference": "the float64 reference of the GPU re-ranking (large weights)",
    "gpu_tuning": "compiling, tuning and timing candidates on the GPU",
}


def _budget(cfg: OptimizeConfig, device: str, scfg, stop_by: float | None = None) -> float | None:
    """The wall-time budget of one call: search time limit + GPU tuning + :func:`slack_s` —
    or less, to end by ``stop_by`` (a ``time.time()`` value), but never less than the search's
    time limit and :data:`MIN_SLACK_S` after it: the search is what the cached answer stands for."""
    if scfg.time_limit is None:
        return None if stop_by is None else max(MIN_SLACK_S, stop_by - time.time())
    tune = _tune_s(cfg, device)
    own = float(scfg.time_limit) + tune + slack_s(float(scfg.time_limit), tune)
    if stop_by is None:
        return own
    return min(own, max(float(scfg.time_limit) + MIN_SLACK_S, stop_by - time.time()))


def _timed_on_gpu(program: Program, alive: list[Candidate], cfg: OptimizeConfig, phases: "Phases"
                  ) -> tuple[Candidate, str]:
    """The fastest of ``alive`` on the GPU (:func:`.timing.time_on_gpu`) and why. With
    ``time_program=False`` the program is not among those timed: its caller runs its own ops
    wherever it would win and times them against the answer itself, so the program is the
    answer only, as priced, when none of the μGraphs runs on the card."""
    priced_only = not cfg.time_program
    contenders = [c for c in alive if not (priced_only and c.origin == "program")]
    fallback = next((c for c in alive if c.origin == "program"), None)
    if not contenders and fallback is not None:  # every μGraph was set aside: no reference to compute
        return fallback, "the program, priced, not timed (time_program=False): no μGraph left to time"
    try:
        best, why = time_on_gpu(program, contenders, cfg.top_k, timing=cfg.timing, total_s=_tune_s(cfg, "cuda"),
                                phases=phases, input_strides=cfg.input_strides)
    except MugraphError as e:
        if not priced_only or fallback is None:
            raise
        return fallback, f"the program, priced, not timed (time_program=False): {str(e).splitlines()[0][:300]}"
    if priced_only:
        why += "; the program priced, not timed: its caller runs its own ops (time_program=False)"
    return best, why


def _tune_s(cfg: OptimizeConfig, device: str) -> float:
    """Seconds of GPU tuning the call may spend (none without a GPU)."""
    return (TOTAL_TUNE_S if cfg.tune_s is None else float(cfg.tune_s)) if device == "cuda" else 0.0


def _transferred(root: Path, program: Program, key_doc: dict) -> list[KernelGraph]:
    """The cached winners of ``program``'s structure at other sizes, carried to its sizes
    (:func:`cache.relatives`, :func:`search.transfer.transfer`): seeds of its search, which
    verifies each from scratch. Why: a decode step over 2k and over 8k cached keys, a prompt
    of 2k and of 8k tokens, are one program at two sizes, and the larger one's search can
    take far longer to reach what the smaller one found (an 8k prompt's attention matched
    nothing in 60 s where its 2k form matched at 34 s)."""
    from search.transfer import transfer

    out = []
    for g in relatives(root, key_doc)[:MAX_SEEDS]:
        h = transfer(g, program)
        if h is not None:
            out.append(h)
    return out


#: the most cached relatives a search is seeded with
MAX_SEEDS = 4
#: the share of a search's time limit its scout takes (:func:`_scouted`)
SCOUT_SHARE = 0.4
#: seconds the search of the program itself keeps at least after its scout
MIN_SEARCH_AFTER_SCOUT_S = 5.0


def scouts(program: Program, scfg) -> bool:
    """Whether ``program``'s search is scouted at smaller sizes first (:func:`_scouted`): it has a
    time limit, no checkpoint to resume (a resumed search has its own matches), and a tensor
    of more than :data:`search.transfer.SCOUT_ELEMENTS` elements."""
    from search.transfer import SCOUT_ELEMENTS, largest_tensor

    return (scfg.time_limit is not None and not (scfg.checkpoint and Path(scfg.checkpoint).exists())
            and largest_tensor(program) > SCOUT_ELEMENTS)


def _scouted(program: Program, scfg, estimate: Callable | None) -> tuple[list[KernelGraph], dict | None]:
    """Seeds for the search of a program too large to search well at its sizes: the same
    program at smaller sizes (:func:`search.transfer.shrunk`) searched for
    :data:`SCOUT_SHARE` of the time limit, and its verified μGraphs carried back to the
    program's sizes (:func:`search.transfer.transfer`), where the search verifies them from
    scratch before its own enumeration — as it does a cached relative's (:func:`_transferred`).
    Why: every fingerprint and verification evaluates the program at its sizes, so a large
    one's search tries few candidates (an 8k-token prompt's attention, 2^30 scores: 645
    candidates and no match in 60 s on an H200, where at 2k tokens the first matched at 34 s),
    while its μGraphs at small sizes carry up tile for tile. Returns the seeds and what the
    report says of the scout (None when no smaller copy replays)."""
    from search.transfer import largest_tensor, shrunk, transfer

    small = shrunk(program)
    if small is None:
        return [], None
    share = SCOUT_SHARE * float(scfg.time_limit)
    shapes = {t.name: list(t.shape) for t in small.inputs}
    log.info("mugraph: %r holds %d elements in one tensor: its search is scouted for %.0f s at smaller sizes (%s)",
             program.name, largest_tensor(program), share,
             ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items()))
    # its finds are seeds at full size: the program's own fused form is proposed there, not carried up
    small_cfg = dataclasses.replace(scfg, time_limit=share, checkpoint=None, pointwise_runs=False)
    t0 = time.perf_counter()
    try:
        graphs = search.run(small, small_cfg, estimate=estimate).graphs
    except MugraphError as e:  # the scout only helps: whatever stops it, the program's own search runs
        log.warning("mugraph: the scout of %r stopped: %s", program.name, str(e).splitlines()[0][:300])
        graphs = []
    seeds = [h for h in (transfer(g, program) for g in graphs[:MAX_SEEDS]) if h is not None]
    return seeds, {"shapes": shapes, "found": len(graphs), "seeds": len(seeds),
                   "wall_s": round(time.perf_counter() - t0, 3)}


def _run_pipeline(program: Program, cfg: OptimizeConfig, device: str, progress: bool, seed: int,
                  checkpoint_dir: Path | None = None, stop_by: float | None = None,
                  seeds: list[KernelGraph] | None = None) -> Optimized:
    # where the program itself would run, the search also offers it with its element-wise runs fused
    scfg = search.SearchConfig(**{"pointwise_runs": cfg.time_program, **cfg.search, "seed": seed,
                                  "progress": progress, "verify_error": cfg.error})
    phases = Phases(_budget(cfg, device, scfg, stop_by))
    own_checkpoint = checkpoint_dir is not None and not scfg.checkpoint
    if own_checkpoint:
        scfg.checkpoint = str(_checkpoint_path(checkpoint_dir, program, scfg))
    scout = None
    # the search's own limit, before a scout takes its share: the checks' end is counted
    # from the call's start, scout included
    search_limit = None if scfg.time_limit is None else float(scfg.time_limit)
    checker = None
    if not seeds and scouts(program, scfg):
        # the program's side of its verifications prepared on the GPU while the scout runs
        # (design §6.10): the scout's seeds are verified first thing after it
        checker = search.prepared_checker(program, scfg)
        try:
            with phases.phase("scout"):
                seeds, scout = _scouted(program, scfg, None if cfg.input_strides else _estimator(cfg))
        except BaseException:  # Ctrl-C or a failure: no search follows, so nothing is prepared for it
            if checker is not None:
                checker.stop_preparing()
            raise
        scfg.time_limit = max(MIN_SEARCH_AFTER_SCOUT_S, float(scfg.time_limit) - phases.seconds["scout"])
    with phases.phase("search"):
        found = _search(program, scfg, own_checkpoint, seeds or [], _estimator(cfg), checker)
    interrupted = found.interrupted
    t_search = phases.seconds["search"]
    # the search verified each graph against this program with the same error and seed;
    # its verdict is kept (the check below recomputes it only when absent)
    cands = [Candidate(graph_from_json(f.graph), "search", verified=f.verdict, found_by=f.origin)
             for f in found.found]
    if cfg.keep_program:
        cands.append(Candidate(program, "program"))
    dtypes = cfg.float_dtypes or (program.inputs[0].dtype,)  # validated before the search
    bound = None
    # the caller runs its own ops in the program's place: no numbers of the program are needed
    priced_only = not cfg.time_program
    program_alone = priced_only and not any(c.origin == "search" for c in cands)
    # the checks end where the GPU's share of the budget begins (half the slack left for them,
    # or half of what a stop_by leaves after the search)
    check_until = None if search_limit is None else search_limit + min(
        slack_s(search_limit, _tune_s(cfg, device)), phases.budget_s - search_limit) / 2
    try:
        with phases.phase("check"):
            # the program's side of every float check computed once, on the GPU when there is one
            prepared = FloatReference(program, seed=seed, dtypes=dtypes, device=device)
            checked_search = False  # whether a searched candidate has been float-checked
            # the proven ones first: an unproven candidate is only checked for the report
            # when it cannot ship, so it never takes the budget from one that can
            for c in sorted(cands, key=lambda c: not _proven(c)):
                if c.origin == "program" and priced_only:
                    _price(c, cfg.input_strides, cfg.timing)  # the caller runs its own ops: priced, not checked
                    continue
                # past the checks' end, a searched candidate is checked only while none has been:
                # the first (the proven come first) is checked late rather than not at all — an
                # 8k-token causal prompt's one proven μGraph, its first verification 41 s long,
                # came 0.8 s past the end, and the program shipped at 0.09× SDPA (H200)
                late = check_until is not None and phases.elapsed() > check_until
                if c.origin == "search" and late and checked_search:
                    c.rejected = UNCHECKED
                    continue
                if not cfg.allow_unproven and not _proven(c):
                    _price(c, cfg.input_strides, cfg.timing)  # it cannot ship: priced for the report, never float-checked
                    continue
                try:
                    bound = _check_candidate(program, cfg, seed, dtypes, c, bound, prepared)
                except torch.cuda.OutOfMemoryError as e:
                    # one candidate's float check too large for the GPU's memory (an 8k-token
                    # causal prompt's scores, evaluated whole): that candidate is not shipped
                    c.rejected = f"float check: out of GPU memory ({str(e).splitlines()[0][:80]})"
                    torch.cuda.empty_cache()
                checked_search = checked_search or (c.origin == "search" and c.float_ok is not None)
    except KeyboardInterrupt:  # keep what is fully checked; the rest is not shipped
        interrupted = True
        for c in cands:
            if c.predicted_s is None and not c.rejected:
                c.rejected = "not checked (interrupted)"
    set_aside = _set_aside_unproven(cands, cfg)
    alive = sorted((c for c in cands if not c.rejected), key=lambda c: c.predicted_s)
    if interrupted and not any(c.origin == "search" for c in alive):
        raise Interrupted(f"superoptimize: interrupted before any μGraph of {program.name!r} was verified"
                          + (f"; rerun to resume the search from {scfg.checkpoint}" if scfg.checkpoint else ""))
    if not alive:
        prog = next((c for c in cands if c.origin == "program"), None)
        why_prog = f"; the program itself: {prog.rejected} ({prog.float_summary})" if prog is not None else ""
        raise MugraphError(f"superoptimize: no candidate of {program.name!r} survived verification"
                           + (f" ({len(set_aside)} unproven set aside; OptimizeConfig(allow_unproven=True) "
                              "ships the best of them)" if set_aside else "") + why_prog[:400])
    best, why = alive[0], (f"no GPU: ranked by the analytic cost model ({default_params().name} parameters, best "
                           "predicted kernel configs), not timed")
    if program_alone:
        why = "no μGraph verified: the program, priced by the cost model, not checked or timed (time_program=False)"
    elif device == "cuda" and not interrupted:
        try:
            best, why = _timed_on_gpu(program, alive, cfg, phases)
        except KeyboardInterrupt:
            interrupted = True
            why = "interrupted while timing on the GPU: ranked by the analytic cost model, not timed"
    if cfg.allow_unproven:
        _warn_if_unproven(program, best, cfg.error)
    if set_aside:
        why += f"; {len(set_aside)} unproven μGraph(s) set aside (report['set_aside'])"
    if interrupted:
        why += "; interrupted: the best of the candidates verified so far"
    elif own_checkpoint and found.complete:  # nothing left to resume; the result cache holds the answer
        Path(scfg.checkpoint).unlink(missing_ok=True)
    report = {"device": device_name(device), "why": why, "error_bound": bound, "interrupted": interrupted,
              "checkpoint": scfg.checkpoint if interrupted or not found.complete else None,
              "search": {"graphs": len(found.graphs), "wall_s": t_search, "stats": _jsonable(found.stats)},
              "set_aside": [_set_aside_entry(c, best) for c in set_aside],
              "phases": phases.to_json(), "budget_s": phases.budget_s, "overran": phases.overran,
              "cut_to_s": phases.budget_s if stop_by is not None and phases.budget_s is not None
              and phases.budget_s < _budget(cfg, device, scfg) else None,
              "total_s": phases.elapsed(), "versions": versions()}
    if scout is not None:
        report["scout"] = scout
    if cfg.input_strides:
        report["input_strides"] = {k: list(v) for k, v in cfg.input_strides.items()}
    return Optimized(program, best, cands, report, device)

def _verdict(c: Candidate) -> "verify.Verdict | None":
    return verify.Verdict.from_json(c.verified) if c.verified else None


def _proven(c: Candidate) -> bool:
    """Whether ``c`` is the program itself or its verification reached the target error."""
    return c.proven


def _set_aside_unproven(cands: list[Candidate], cfg: OptimizeConfig) -> list[Candidate]:
    """A proof beats a faster guess: a searched μGraph whose field tests passed but whose
    bound on a false accept stayed above ``cfg.error`` (evidence, not a proof) is not
    shipped — the best proven candidate or the program itself is. With
    ``cfg.allow_unproven`` the old rule holds: unproven ones are set aside only while some
    searched μGraph is proven, and :func:`_warn_if_unproven` names a chosen unproven one.
    Returns those set aside."""
    if cfg.allow_unproven and not any(c.origin == "search" and not c.rejected and _proven(c) for c in cands):
        return []
    out = []
    for c in cands:
        if c.rejected and c.rejected != UNCHECKED:
            continue
        if not _proven(c):
            v = _verdict(c)
            why = ("not proven: " + (f"bound {v.error_bound:.3g} after {v.tests} passing field tests "
                                    f"(target {cfg.error:.3g}; per-test bound {v.per_test_bound:.3g})"
                                    if v else "no verdict"))
            c.rejected = why + ("; OptimizeConfig(allow_unproven=True) would ship it" if not cfg.allow_unproven
                                else " while other μGraphs are")
            out.append(c)
    return out


def _set_aside_entry(c: Candidate, best: Candidate) -> dict:
    """One row of ``report["set_aside"]``: the unproven candidate, its bound, its
    predicted time against the answer's, and why it was not shipped."""
    v = _verdict(c)
    return {"kernels": c.num_kernels, "found_by": c.found_by,
            "error_bound": v.error_bound if v else None, "per_test_bound": v.per_test_bound if v else None,
            "tests": v.tests if v else 0, "predicted_s": c.predicted_s,
            "faster_than_answer": (c.predicted_s is not None and best.predicted_s is not None
                                   and c.predicted_s < best.predicted_s),
            "why": c.rejected}


def _warn_if_unproven(program: Program, best: Candidate, error: float) -> None:
    """One warning line when the chosen μGraph's verification did not reach the target
    error (only with ``allow_unproven``): its field tests all passed, but the per-test
    bound is too weak for the number of tests, so passing is evidence, not a proof."""
    v = _verdict(best) if best.origin == "search" else None
    if v is not None and not v.bound_met:
        log.warning("mugraph: %s: the chosen μGraph passed %d field tests, but the verifier's bound on a false "
                    "accept is %.3g (target %.3g; per-test bound %.3g): evidence, not a proof at that level "
                    "(allow_unproven=True)", program.name, v.tests, v.error_bound, error, v.per_test_bound)


def _check_candidate(program: Program, cfg: OptimizeConfig, seed: int, dtypes, c: Candidate,
                     bound: float | None, prepared: FloatReference | None = None) -> float | None:
    """Verdict, float check and predicted time of one candidate (``c.rejected`` says why not)."""
    if c.origin == "search":
        # a verdict the search computed (same program, error and seed: deterministic) is
        # reused; one is computed here only if absent
        v = (verify.Verdict.from_json(c.verified) if c.verified
             else verify.equivalent(program, c.graph, error=cfg.error, seed=seed))
        c.verified = v.to_json()
        bound = v.error_bound if bound is None else max(bound, v.error_bound)
        if not v.equivalent:  # the search verified it already; never ship on a disagreement
            c.rejected = "verification failed"
            return bound
    fr = verify.float_check(program, c.graph, dtypes=dtypes, seed=seed, prepared=prepared,
                            device=None if prepared is None else prepared.device)
    c.float_ok, c.float_summary = bool(fr.passed), str(fr).splitlines()[0] if str(fr) else ""
    if not c.float_ok:
        c.rejected = "float check failed"
        return bound
    _price(c, cfg.input_strides, cfg.timing)
    return bound


def _price(c: Candidate, input_strides: dict[str, tuple[int, ...]] | None = None, timing: str = "graph") -> None:
    """``c``'s predicted time and configs by the lowering's cost model — predicted only,
    never compiled here (lower.profile would compile and time the default configs on a GPU
    machine, where one the card cannot hold stopped the whole call): the GPU re-ranking
    (time_on_gpu) compiles, checks and times, and rejects what fails there. Priced as
    ``timing`` reads the inputs (:func:`lower.cost_model.for_timing`)."""
    default_s = estimate(c.graph, for_timing(default_params(), timing))
    tuned = predict_tuned(c.graph, input_strides, timing)
    c.predicted_s = min(default_s, tuned.predicted_s)
    c.configs = {k: asdict(v) for k, v in tuned.configs.items()} if tuned.predicted_s <= default_s else {}

def _jsonable(x: Any) -> Any:
    try:
        return json.loads(json.dumps(x, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    except (TypeError, ValueError):
        return str(x)
