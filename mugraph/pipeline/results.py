"""What ``superoptimize`` returns and how it is kept: :class:`Candidate` (one
verified μGraph and what the pipeline learnt about it), :class:`Optimized` (the
answer, callable like the program) and their JSON form.

``save``/``load`` here are the package's ``mg.save``/``mg.load``: graphs go
through :mod:`mugraph.core.serialize` (the IR's own format), a saved result through
:meth:`Optimized.from_json`. Loading never executes code from the file (the
Triton source is regenerated from the μGraph; kernel configurations are checked
field by field).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lower
from lower.profile import TIMINGS

from ..core.errors import ArgumentTypeError, CacheError, ConfigError, MugraphError, SerializationError
from ..core.files import as_path, read_json, write_text_atomic
from ..core.ir import KernelGraph, short
from ..core.serialize import graph_from_document, graph_from_json, graph_to_json
from .timing import TOTAL_TUNE_S, device_name, time_on_gpu

RESULT_VERSION = 1


#: where a candidate comes from: the search, the unfused program, or the hand-written reference
#: μGraph a benchmark row compares with (saved by ``bench`` beside the row's re-ranked result)
ORIGINS = ("search", "program", "reference")


@dataclass
class Candidate:
    """One verified μGraph and what the pipeline learnt about it."""

    graph: KernelGraph
    origin: str                      # "search", "program", or "reference" (a benchmark's hand-written μGraph)
    verified: dict | None = None     # the Verdict's JSON
    float_ok: bool | None = None
    float_summary: str = ""
    predicted_s: float | None = None
    measured_s: float | None = None
    configs: dict = field(default_factory=dict)  # op id -> KernelConfig fields (tuned)
    rejected: str = ""
    #: how the search found it: "enumeration", "composed", "composed+fused", "split-loop", "retile"
    found_by: str = ""

    @property
    def num_kernels(self) -> int:
        return self.graph.num_kernels

    @property
    def contending(self) -> bool:
        """Still in the running: not rejected, and its float check (if any) did not fail."""
        return not self.rejected and self.float_ok is not False

    @property
    def proven(self) -> bool:
        """Whether it may ship by default: the program itself or a hand-written reference
        (the input and the benchmark's own), or a μGraph whose verification reached its
        target error — not one whose field tests only passed (evidence, not a proof)."""
        if self.origin != "search":
            return True
        return bool(self.verified and self.verified.get("bound_met"))

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
        if d["origin"] not in ORIGINS:
            raise CacheError(f"candidate origin {short(d['origin'])} is not one of {', '.join(ORIGINS)}")
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
    if not isinstance(v, dict):
        raise CacheError(f"{where}: expected an object, got {type(v).__name__}")
    defaults = {f.name: f.default for f in dataclasses.fields(lower.KernelConfig)}
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
        if device is not None and device not in ("cpu", "cuda"):
            raise ConfigError(f"compiled: device={short(device)}: use 'cpu' or 'cuda'")
        dev = device or self.device
        if self._compiled is None or self._compiled.device != dev:
            configs = {k: lower.KernelConfig.from_dict(v) for k, v in self.best.configs.items()}
            self._compiled = lower.compile(self.graph, device=dev, configs=configs, input_strides=self.input_strides)
        return self._compiled

    def __call__(self, *args, **kwargs):
        return self.compiled()(*args, **kwargs)

    @property
    def input_strides(self) -> dict[str, tuple[int, ...]] | None:
        """The layout it was tuned for and is compiled to read (``OptimizeConfig.input_strides``)."""
        st = self.report.get("input_strides")
        return {k: tuple(v) for k, v in st.items()} if st else None

    def profile_on_gpu(self, top_k: int | None = None, tune_seconds: float | None = None,
                       timing: str = "graph", tune_total_s: float | None = None,
                       allow_unproven: bool = False) -> "Optimized":
        """Re-rank on this machine's GPU: a result searched on a CPU (cost-model choice)
        gets its candidates autotuned and timed here (``timing``: see
        ``lower.profile.TIMINGS``), and the fastest wins. Which candidates and how long
        each is tuned: ``mugraph.pipeline.timing.plan_rerank`` — by default those the cost
        model cannot tell apart, tuned in proportion to their configuration spaces within a
        total bound (``tune_total_s``, default ``timing.TOTAL_TUNE_S``); ``top_k`` (the best
        predicted) and ``tune_seconds`` (per candidate) override it. Unproven candidates (a
        result saved with ``allow_unproven``) are timed only with ``allow_unproven``."""
        if top_k is not None and (type(top_k) is not int or top_k < 1):
            raise ConfigError(f"profile_on_gpu: top_k={short(top_k)} must be a positive int or None")
        if tune_seconds is not None and (isinstance(tune_seconds, bool) or not isinstance(tune_seconds, (int, float))
                                         or not 0 < tune_seconds < float("inf")):
            raise ConfigError(f"profile_on_gpu: tune_seconds={short(tune_seconds)} must be seconds > 0 or None")
        if timing not in TIMINGS:
            raise ConfigError(f"profile_on_gpu: timing={short(timing)}: use one of {sorted(TIMINGS)}")
        if tune_total_s is not None and (isinstance(tune_total_s, bool) or not isinstance(tune_total_s, (int, float))
                                         or not 0 < tune_total_s < float("inf")):
            raise ConfigError(f"profile_on_gpu: tune_total_s={short(tune_total_s)} must be seconds > 0 or None")
        alive = sorted((c for c in self.candidates if c.contending and (allow_unproven or c.proven)),
                       key=lambda c: c.predicted_s or 0.0)
        if not alive:
            raise MugraphError(f"profile_on_gpu: {self.program.name!r} has no proven candidate to time "
                               "(allow_unproven=True times the unproven ones)")
        self.best, why = time_on_gpu(self.program, alive, top_k, tune_seconds, timing,
                                     TOTAL_TUNE_S if tune_total_s is None else tune_total_s,
                                     input_strides=self.input_strides)
        self.device = "cuda"
        self.report = {**self.report, "why": why, "device": device_name("cuda")}
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
            derived = (s.get("stats") or {}).get("derived") or {}
            if derived.get("transfer_seeds"):
                lines.append(f"  seeds carried from other sizes: {derived['transfer_seeds']}, "
                             f"{derived.get('transfer_verified', 0)} verified first "
                             f"({derived.get('transfer_verify_s', 0)} s)")
        scout = r.get("scout")
        if isinstance(scout, dict):
            sizes = ", ".join(f"{k} {tuple(v)}" for k, v in (scout.get("shapes") or {}).items())
            lines.append(f"  scout: searched at {sizes} for {scout.get('wall_s')} s: {scout.get('found')} verified "
                         f"there, {scout.get('seeds')} carried back as seeds")
        lines.append(f"  verification bound (worst candidate): {r.get('error_bound')}")
        v = self.best.verified if self.best.origin == "search" else None
        if isinstance(v, dict) and isinstance(v.get("error_bound"), (int, float)):
            lines.append(f"  the chosen μGraph: {v.get('tests')} field tests passed, false-accept bound "
                         f"{v['error_bound']:.3g} (target {v.get('target_error', float('nan')):.3g}"
                         + ("" if v.get("bound_met") else "; NOT MET: evidence, not a proof at that level") + ")")
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


def save(obj: Any, path: str | Path) -> Path:
    """Write a Program or μGraph, or an :class:`Optimized` result, as versioned JSON.

    The write is atomic (a unique temporary file renamed into place); the folder
    must exist."""
    if isinstance(obj, KernelGraph):
        doc = graph_to_json(obj)
    elif isinstance(obj, Optimized):
        doc = obj.to_json()
    else:
        raise ArgumentTypeError(f"save: cannot save a {type(obj).__name__}; save a Program, KernelGraph or "
                                "Optimized result")
    return write_text_atomic(path, json.dumps(doc, indent=1), "save")


def load(path: str | Path) -> Any:
    """Read what :func:`save` wrote: a Program, a KernelGraph, or an :class:`Optimized` result.

    The file is read within :mod:`mugraph.core.limits` (size, nesting, number length)
    and rebuilt through the builder; nothing in it is executed."""
    path = as_path(path, "load")
    doc = read_json(path, "load")
    if isinstance(doc, dict) and doc.get("kind") == "Optimized":
        return Optimized.from_json(doc)
    return graph_from_document(doc, path)
