"""``mg.superoptimize``: the stages composed into the product (DESIGN §1).

    Lax program ─► search ─► verify (field + float) ─► lower + cost model ─► profile ─► best

This is the one module of ``mugraph`` that imports the stages, and only inside
functions, so the IR never depends on them. Results are cached on disk as JSON,
keyed by the program, the configuration, the seed, the versions and the device.
An entry stores that key's contents and is served only if they, and the program
inside it, are what was asked for; anything else (a copy under another key, an
edit, a truncation) is recomputed and replaced with a warning. Entries are written
atomically under unique temporary names, so concurrent writers cannot collide.
Loading a cache or a saved result never executes code from it (the Triton source
is regenerated from the μGraph; kernel configurations are checked field by field).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ArgumentTypeError, CacheError, ConfigError, MugraphError, ResourceError, SerializationError
from ..files import as_path, read_json, safe_name, write_text_atomic
from ..interpreter import largest_value
from ..ir import DTYPES, KernelGraph, Program, short
from ..lax import check_lax
from ..limits import MAX_EVAL_ELEMENTS
from ..serialize import graph_from_json, graph_to_json

log = logging.getLogger("mugraph")

RESULT_VERSION = 1
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
    ``top_k``: how many candidates (by the cost model) are lowered and timed.
    ``float_dtypes``: dtypes of the float check (default: the program's dtype).
    ``keep_program``: let the unfused program itself (one library call per op)
    compete, so the answer is never slower than what came in.
    """

    search: dict = field(default_factory=dict)
    error: float = 2.0 ** -40
    top_k: int = 4
    float_dtypes: tuple[str, ...] | None = None
    keep_program: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field and every ``search`` key, before any work: a bad value is a
        one-line :class:`ConfigError` naming it, never a search that runs and fails."""
        from search.config import check_fields, check_keys

        e = self.error
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e < 1:
            raise ConfigError(f"error={short(e)}: the false-accept bound must lie in (0, 1)")
        if type(self.top_k) is not int or self.top_k < 1:
            raise ConfigError(f"top_k={short(self.top_k)}: must be a positive int (candidates lowered)")
        if not isinstance(self.keep_program, bool):
            raise ConfigError(f"keep_program={short(self.keep_program)}: must be True or False")
        fd = self.float_dtypes
        if fd is not None:
            if isinstance(fd, str) or not isinstance(fd, (tuple, list)) or not fd:
                raise ConfigError(f"float_dtypes={short(fd)}: must be None or a non-empty tuple of dtype names")
            for d in fd:
                if not isinstance(d, str) or d not in DTYPES:
                    raise ConfigError(f"float_dtypes={short(fd)}: {short(d)} is not a dtype the float check runs "
                                      f"({', '.join(sorted(DTYPES))})")
            self.float_dtypes = tuple(fd)
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
        return d


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
    from search import SearchConfig

    return k in {f.name for f in dataclasses.fields(SearchConfig)}


@dataclass
class Candidate:
    """One verified μGraph and what the pipeline learnt about it."""

    graph: KernelGraph
    origin: str                      # "search" or "program"
    verified: dict | None = None     # the Verdict's JSON
    float_ok: bool | None = None
    float_summary: str = ""
    predicted_s: float | None = None
    measured_s: float | None = None
    configs: dict = field(default_factory=dict)  # op id -> KernelConfig fields (tuned)
    rejected: str = ""
    #: how the search found it: "enumeration", "composed", "composed+fused", "split-loop"
    found_by: str = ""

    @property
    def num_kernels(self) -> int:
        return self.graph.num_kernels

    def to_json(self) -> dict:
        return {"graph": graph_to_json(self.graph), "origin": self.origin, "verified": self.verified,
                "float_ok": self.float_ok, "float_summary": self.float_summary, "predicted_s": self.predicted_s,
                "measured_s": self.measured_s, "configs": self.configs, "rejected": self.rejected,
                "found_by": self.found_by}

    @classmethod
    def from_json(cls, d: dict) -> "Candidate":
        """A saved candidate, every field checked: kernel configurations reach the code
        generator, so each must name a graph-defined op and hold plain values only."""
        if not isinstance(d, dict):
            raise CacheError(f"a candidate must be an object, got {type(d).__name__}")
        g = graph_from_json(d["graph"])
        if d["origin"] not in ("search", "program"):
            raise CacheError(f"candidate origin {short(d['origin'])} is not 'search' or 'program'")
        for k in ("predicted_s", "measured_s"):
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise CacheError(f"candidate {k}={short(v)} is not a number")
        for k in ("float_summary", "rejected", "found_by"):
            if not isinstance(d.get(k, ""), str):
                raise CacheError(f"candidate {k} is not a string")
        kernels = {str(op.id) for op in g.ops if op.kind == "graph_defined"}
        configs = d.get("configs", {})
        if not isinstance(configs, dict):
            raise CacheError("candidate configs must be an object {op id: kernel config}")
        for k, v in configs.items():
            if k not in kernels:
                raise CacheError(f"candidate configs: key {short(k, 20)} is not a graph-defined op of its graph "
                                 f"({sorted(kernels)})")
            _check_kernel_config(v, f"candidate configs[{k}]")
        return cls(g, d["origin"], d.get("verified"), d.get("float_ok"),
                   d.get("float_summary", ""), d.get("predicted_s"), d.get("measured_s"),
                   {int(k): v for k, v in configs.items()}, d.get("rejected", ""),
                   d.get("found_by", ""))


_CONFIG_WORD = re.compile(r"[A-Za-z0-9_]{1,16}")


def _check_kernel_config(v: Any, where: str) -> None:
    """A saved ``lower.KernelConfig`` as plain values of its fields' types (small ints,
    bools, short words, int pairs): nothing a code generator could be made to emit
    as code. Field names come from the dataclass itself."""
    from lower import KernelConfig

    if not isinstance(v, dict):
        raise CacheError(f"{where}: expected an object, got {type(v).__name__}")
    defaults = {f.name: f.default for f in dataclasses.fields(KernelConfig)}
    for k, x in v.items():
        if k not in defaults:
            raise CacheError(f"{where}: unknown field {short(k, 30)}")
        dflt = defaults[k]
        if isinstance(dflt, bool):
            ok = isinstance(x, bool)
        elif isinstance(dflt, int):
            ok = type(x) is int and 0 <= x <= 1024
        elif isinstance(dflt, str):
            ok = isinstance(x, str) and _CONFIG_WORD.fullmatch(x) is not None
        elif isinstance(dflt, tuple):
            ok = isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 and all(
                type(i) is int and 0 <= i <= 1024 for i in p) for p in x)
        else:
            ok = False
        if not ok:
            raise CacheError(f"{where}: {k}={short(x, 30)} is not a valid value")


class Optimized:
    """The superoptimizer's answer: call it like the program (torch tensors in, out)."""

    def __init__(self, program: KernelGraph, best: Candidate, candidates: list[Candidate], report: dict,
                 device: str) -> None:
        self.program = program
        self.best = best
        self.candidates = candidates
        self.report = report
        self.device = device
        self._compiled = None

    @property
    def graph(self) -> KernelGraph:
        return self.best.graph

    def compiled(self, device: str | None = None):
        """The lowered program (compiled on first use; the Triton source is regenerated)."""
        import lower

        if device is not None and device not in ("cpu", "cuda"):
            raise ConfigError(f"compiled: device={short(device)}: use 'cpu' or 'cuda'")
        dev = device or self.device
        if self._compiled is None or self._compiled.device != dev:
            configs = {k: lower.KernelConfig.from_dict(v) for k, v in self.best.configs.items()}
            self._compiled = lower.compile(self.graph, device=dev, configs=configs)
        return self._compiled

    def __call__(self, *args, **kwargs):
        return self.compiled()(*args, **kwargs)

    def profile_on_gpu(self, top_k: int = 4, tune_seconds: float | None = None,
                       timing: str = "graph") -> "Optimized":
        """Re-rank on this machine's GPU: a result searched on a CPU (cost-model choice)
        gets its ``top_k`` candidates autotuned (at most ``tune_seconds`` of trying
        configurations per kernel) and timed here (``timing``: see
        ``lower.profile.TIMINGS``), and the fastest wins."""
        import lower
        from lower.profile import TIMINGS

        if type(top_k) is not int or top_k < 1:
            raise ConfigError(f"profile_on_gpu: top_k={short(top_k)} must be a positive int")
        if tune_seconds is not None and (isinstance(tune_seconds, bool) or not isinstance(tune_seconds, (int, float))
                                         or not 0 < tune_seconds < float("inf")):
            raise ConfigError(f"profile_on_gpu: tune_seconds={short(tune_seconds)} must be seconds > 0 or None")
        if timing not in TIMINGS:
            raise ConfigError(f"profile_on_gpu: timing={short(timing)}: use one of {sorted(TIMINGS)}")
        alive = sorted((c for c in self.candidates if not c.rejected and c.float_ok is not False),
                       key=lambda c: c.predicted_s or 0.0)
        self.best, why = _time_on_gpu(lower, self.program, alive, top_k, tune_seconds, timing)
        self.device = "cuda"
        self.report = {**self.report, "why": why, "device": _device_name("cuda")}
        self._compiled = None
        return self

    def triton_source(self) -> str:
        return self.compiled().triton_source()

    def summary(self) -> str:
        r = self.report
        lines = [f"superoptimized {self.program.name!r} on {r.get('device', self.device)}: best = {self.best.origin} "
                 f"μGraph, {self.best.num_kernels} kernel(s)",
                 f"  why: {r.get('why', '(not recorded)')}"]
        s = r.get("search", {})
        if isinstance(s, dict) and s:
            wall = s.get("wall_s", 0)
            wall = f"{wall:.1f}" if isinstance(wall, (int, float)) else "?"
            lines.append(f"  search: {s.get('graphs', 0)} verified μGraphs in {wall} s")
        lines.append(f"  verification bound: {r.get('error_bound')}")
        lines.append("  candidates (predicted / measured μs):")
        for c in self.candidates:
            meas = f"{c.measured_s * 1e6:8.1f}" if c.measured_s is not None else "       -"
            pred = f"{c.predicted_s * 1e6:8.1f}" if c.predicted_s is not None else "       -"
            mark = "*" if c is self.best else " "
            why = f"  rejected: {c.rejected}" if c.rejected else ""
            how = f" ({c.found_by})" if c.found_by else ""
            lines.append(f"   {mark} {c.origin:8} kernels={c.num_kernels} {pred} {meas}{why}{how}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"format": "mugraph", "version": RESULT_VERSION, "kind": "Optimized", "device": self.device,
                "program": graph_to_json(self.program), "best": self.candidates.index(self.best),
                "candidates": [c.to_json() for c in self.candidates], "report": self.report}

    @classmethod
    def from_json(cls, d: dict) -> "Optimized":
        if not isinstance(d, dict) or d.get("kind") != "Optimized" or d.get("version") != RESULT_VERSION:
            kind, version = (d.get("kind"), d.get("version")) if isinstance(d, dict) else (None, None)
            raise CacheError(f"not a saved mugraph result of version {RESULT_VERSION} "
                             f"(kind={short(kind, 30)}, version={short(version, 30)})")
        try:
            program = graph_from_json(d["program"])
            if not isinstance(d["candidates"], list) or not d["candidates"]:
                raise CacheError("saved result holds no candidates")
            cands = [Candidate.from_json(c) for c in d["candidates"]]
            best = d["best"]
            if type(best) is not int or not 0 <= best < len(cands):
                raise CacheError(f"best={short(best)} is not the index of one of its {len(cands)} candidates")
            if d["device"] not in ("cpu", "cuda"):
                raise CacheError(f"device={short(d['device'])} is not 'cpu' or 'cuda'")
            if not isinstance(d["report"], dict):
                raise CacheError("report is not an object")
            return cls(program, cands[best], cands, d["report"], d["device"])
        except MugraphError as e:
            raise CacheError(f"saved result is invalid: {e}") from None
        except KeyError as e:
            raise CacheError(f"saved result is malformed: missing key {e}") from None

    def save(self, path: str | Path) -> Path:
        """Write the result as JSON (atomically; the folder must exist)."""
        return write_text_atomic(path, json.dumps(self.to_json(), indent=1), "Optimized.save")


def _versions() -> dict:
    import torch
    import triton

    from .. import __version__

    return {"mugraph": __version__, "torch": torch.__version__, "triton": triton.__version__}


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def cache_doc(program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> dict:
    """Everything a cached result depends on; stored in the entry and compared on use."""
    doc = {"program": graph_to_json(program), "config": config.to_json(), "seed": seed,
           "versions": _versions(), "device": _device_name(device)}
    return json.loads(json.dumps(doc, sort_keys=True))  # as it reads back from JSON (lists, not tuples)


def cache_key(program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> str:
    return _key_of(cache_doc(program, config, seed, device))


def _key_of(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def cache_path(root: Path, program: KernelGraph, key: str) -> Path:
    """The entry's file: the program's name made safe (``../../x`` becomes ``x``),
    then the key; always directly inside ``root``."""
    path = root / f"{safe_name(program.name, 48)}-{key}.mug.json"
    if path.parent != root:  # safe_name leaves no separator; checked all the same
        raise CacheError(f"cache entry name {path.name!r} leaves the cache folder")
    return path


def default_cache_dir() -> Path:
    return Path(os.environ.get("MUGRAPH_CACHE_DIR", Path.home() / ".cache" / "mugraph"))


def _resolve_device(device: str) -> str:
    import torch

    if not isinstance(device, str) or device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"device={short(device)}: use 'auto', 'cuda' or 'cpu'")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device")
    return device


def superoptimize(program: Program, config: OptimizeConfig | dict | None = None, *, device: str = "auto",
                  cache_dir: str | Path | None = None, progress: bool = True, seed: int = 0) -> Optimized:
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
    if not isinstance(progress, bool):
        raise ArgumentTypeError(f"superoptimize: progress={short(progress)} must be True or False")
    if type(seed) is not int or seed < 0:
        raise ConfigError(f"superoptimize: seed={short(seed)} must be an int >= 0")
    if not (cache_dir is None or cache_dir is False or isinstance(cache_dir, (str, os.PathLike))):
        raise ArgumentTypeError(f"superoptimize: cache_dir={short(cache_dir)} must be a folder path, None or False")
    n, where = largest_value(program)
    if n > MAX_EVAL_ELEMENTS:  # the verifier and the float check evaluate the program at its shapes
        raise ResourceError(f"superoptimize: {program.name!r}: {where} has {n} elements > {MAX_EVAL_ELEMENTS} "
                            "(mugraph.limits.MAX_EVAL_ELEMENTS), too large to verify; reduce the shapes")
    dev = _resolve_device(device)
    path = key_doc = None
    if cache_dir is not False:
        root = default_cache_dir() if cache_dir is None else as_path(cache_dir, "superoptimize: cache_dir")
        key_doc = cache_doc(program, cfg, seed, dev)
        path = cache_path(root, program, _key_of(key_doc))
        hit = _cached(path, program, key_doc)
        if hit is not None:
            return hit
    ckpt_dir = None if path is None else path.parent / "checkpoints"
    try:
        result = _run_pipeline(program, cfg, dev, progress, seed, ckpt_dir)
    except KeyboardInterrupt:  # before the search started, or while it was setting up
        raise Interrupted(f"superoptimize: interrupted before any μGraph of {program.name!r} was verified") from None
    if path is not None and not result.report.get("interrupted"):
        _store(path, result, key_doc)
    return result


def _cached(path: Path, program: KernelGraph, key_doc: dict) -> Optimized | None:
    """The entry at ``path`` if it is sound and is the one asked for; else None (with
    a warning line saying why it is recomputed)."""
    if not path.exists():
        return None
    try:
        doc = read_json(path, "cache")
        if not isinstance(doc, dict) or doc.get("cache_key") != key_doc:
            why = "it was written for another program or configuration"
        else:
            opt = Optimized.from_json(doc)
            if graph_to_json(opt.program) == key_doc["program"]:
                return opt
            why = "the program inside it is not the one asked for"
    except MugraphError as e:
        why = f"it is unreadable ({e})"
    log.warning("mugraph cache: recomputing %s: %s", path.name, why[:300])
    return None


def _store(path: Path, result: Optimized, key_doc: dict) -> None:
    """Write the entry atomically (unique temporary name, then rename): concurrent
    writers of one key each write a whole file and the last rename wins. A cache that
    cannot be written costs a warning, never the result."""
    doc = {**result.to_json(), "cache_key": key_doc}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(doc, indent=1), "cache")
    except (OSError, SerializationError) as e:
        log.warning("mugraph cache: not saved in %s: %s", path.parent, str(e).splitlines()[0][:200])


def load_result(path: str | Path) -> Optimized:
    path = as_path(path, "load_result")
    try:
        doc = read_json(path, "load_result")
    except SerializationError as e:
        raise CacheError(f"unreadable cached result: {e}") from None
    try:
        return Optimized.from_json(doc)
    except CacheError as e:
        raise CacheError(f"{path}: {e}") from None


def _checkpoint_path(folder: Path, program: Program, scfg) -> Path:
    """The default checkpoint of a search: named by the program and a hash of what decides
    its result (program, result-relevant config), so a rerun — with another time limit or
    worker count too — finds it, and no other search does."""
    from search.checkpoint import fingerprint_of

    return folder / f"{safe_name(program.name, 48)}-{fingerprint_of(graph_to_json(program), scfg.key())[:24]}.ckpt.json"


def _search(search, program: Program, scfg, own_checkpoint: bool):
    """``search.run``; a default checkpoint that cannot be read is replaced (with a warning):
    it is the cache's own file, and the search can only start over."""
    try:
        return search.run(program, scfg)
    except search.CheckpointError as e:
        if not own_checkpoint:
            raise
        log.warning("mugraph checkpoint: %s: starting the search over", str(e)[:300])
        Path(scfg.checkpoint).unlink(missing_ok=True)
        return search.run(program, scfg)


def _run_pipeline(program: Program, cfg: OptimizeConfig, device: str, progress: bool, seed: int,
                  checkpoint_dir: Path | None = None) -> Optimized:
    import lower
    import search
    import verify

    t0 = time.perf_counter()
    scfg = search.SearchConfig(**{**cfg.search, "seed": seed, "progress": progress,
                                  "verify_error": cfg.error})
    own_checkpoint = checkpoint_dir is not None and not scfg.checkpoint
    if own_checkpoint:
        scfg.checkpoint = str(_checkpoint_path(checkpoint_dir, program, scfg))
    found = _search(search, program, scfg, own_checkpoint)
    interrupted = found.interrupted
    t_search = time.perf_counter() - t0
    origins = found.stats.get("origins") or [""] * len(found.graphs)
    cands = [Candidate(g, "search", found_by=o) for g, o in zip(found.graphs, origins)]
    if cfg.keep_program:
        cands.append(Candidate(program, "program"))
    dtypes = cfg.float_dtypes or (program.inputs[0].dtype,)  # validated before the search
    bound = None
    try:
        for c, vj in itertools.zip_longest(cands, found.stats.get("verdicts") or []):
            bound = _check_candidate(lower, verify, program, cfg, seed, dtypes, c, vj, bound)
    except KeyboardInterrupt:  # keep what is fully checked; the rest is not shipped
        interrupted = True
        for c in cands:
            if c.predicted_s is None and not c.rejected:
                c.rejected = "not checked (interrupted)"
    alive = sorted((c for c in cands if not c.rejected), key=lambda c: c.predicted_s)
    if interrupted and not any(c.origin == "search" for c in alive):
        raise Interrupted(f"superoptimize: interrupted before any μGraph of {program.name!r} was verified"
                          + (f"; rerun to resume the search from {scfg.checkpoint}" if scfg.checkpoint else ""))
    if not alive:
        raise MugraphError(f"superoptimize: no candidate of {program.name!r} survived verification")
    best, why = alive[0], ("no GPU: ranked by the analytic cost model (H100 parameters, best predicted kernel "
                           "configs), not timed")
    if device == "cuda" and not interrupted:
        try:
            best, why = _time_on_gpu(lower, program, alive, cfg.top_k)
        except KeyboardInterrupt:
            interrupted = True
            why = "interrupted while timing on the GPU: ranked by the analytic cost model, not timed"
    if interrupted:
        why += "; interrupted: the best of the candidates verified so far"
    elif own_checkpoint and found.complete:  # nothing left to resume; the result cache holds the answer
        Path(scfg.checkpoint).unlink(missing_ok=True)
    report = {"device": _device_name(device), "why": why, "error_bound": bound, "interrupted": interrupted,
              "checkpoint": scfg.checkpoint if interrupted or not found.complete else None,
              "search": {"graphs": len(found.graphs), "wall_s": t_search, "stats": _jsonable(found.stats)},
              "total_s": time.perf_counter() - t0, "versions": _versions()}
    return Optimized(program, best, cands, report, device)


def _check_candidate(lower, verify, program: Program, cfg: OptimizeConfig, seed: int, dtypes, c: Candidate,
                     vj: dict | None, bound: float | None) -> float | None:
    """Verdict, float check and predicted time of one candidate (``c.rejected`` says why not)."""
    if c.origin == "search":
        # the search ran verify.equivalent on this very graph with the same program, error
        # and seed; its verdict is reused (deterministic), and computed here only if absent
        v = verify.Verdict.from_json(vj) if vj else verify.equivalent(program, c.graph, error=cfg.error, seed=seed)
        c.verified = v.to_json()
        bound = v.error_bound if bound is None else max(bound, v.error_bound)
        if not v.equivalent:  # the search verified it already; never ship on a disagreement
            c.rejected = "verification failed"
            return bound
    fr = verify.float_check(program, c.graph, dtypes=dtypes, seed=seed)
    c.float_ok, c.float_summary = bool(fr.passed), str(fr).splitlines()[0] if str(fr) else ""
    if not c.float_ok:
        c.rejected = "float check failed"
        return bound
    choice = lower.profile(c.graph, tune_configs=False)  # default configs, predicted only
    tuned = _predict_tuned(lower, c.graph)
    c.predicted_s = min(choice.predicted_s, tuned.predicted_s)
    c.configs = {k: asdict(v) for k, v in (tuned if tuned.predicted_s <= choice.predicted_s
                                           else choice).configs.items()}
    return bound


def _time_on_gpu(lower, program: KernelGraph, alive: list[Candidate], top_k: int,
                 tune_seconds: float | None = None, timing: str = "graph") -> tuple[Candidate, str]:
    """Autotune and time the ``top_k`` candidates (by prediction) on the GPU; the fastest wins.

    Every timed configuration must match the program evaluated in float64 on the same
    inputs (rel. error ≤ 2e-2 for fp16/bf16, 1e-4 for fp32): a candidate that is wrong on
    the card — fp16 overflow of an intermediate the unfused program stores, say — is
    rejected, never shipped."""
    import torch
    from verify.floatcheck import float_inputs

    from .. import evaluate

    # the float check's smallest input scale: inside every benchmark's fp16 range (attention
    # without a max subtraction overflows fp16 for inputs of std ≳ 0.5 — the program itself does)
    inputs = float_inputs(program, program.inputs[0].dtype, 0.25, 0)
    ref = [r.to("cuda") for r in evaluate(program, inputs)]
    inputs = {t.name: inputs[t.name].to(getattr(torch, t.dtype)).to("cuda") for t in program.inputs}
    tol = 1e-4 if program.inputs[0].dtype == "float32" else 2e-2
    tried = 0
    for c in alive:
        if c.origin != "program" and tried >= top_k and any(x.measured_s is not None for x in alive):
            continue  # past the top_k; the unfused program is always timed as the safety net
        tried += 1
        try:
            res = lower.profile(c.graph, inputs=inputs, ref=ref, tol=tol, budget_s=tune_seconds, timing=timing)
        except Exception as e:  # the compiler or the card rejects it (resources): never ship it
            c.rejected = f"does not run on this GPU: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        c.measured_s = res.time_s
        c.configs = {k: asdict(v) for k, v in res.configs.items()}
    timed = [c for c in alive if c.measured_s is not None]
    if not timed:
        raise MugraphError("superoptimize: no candidate runs on this GPU: "
                           + "; ".join(c.rejected for c in alive if c.rejected))
    best = min(timed, key=lambda c: c.measured_s)
    return best, (f"fastest of {len(timed)} autotuned and timed on {_device_name('cuda')} "
                  f"(median, {timing} timing: lower.profile.TIMINGS)")


def _predict_tuned(lower, graph: KernelGraph):
    """The cost model's best kernel configs without a GPU (``lower.tune`` ranks its
    configuration space by the model and times nothing when there is no CUDA)."""
    import torch

    if torch.cuda.is_available():
        return lower.profile(graph, tune_configs=False)
    return lower.profile(graph)


def _jsonable(x: Any) -> Any:
    try:
        return json.loads(json.dumps(x, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    except (TypeError, ValueError):
        return str(x)
