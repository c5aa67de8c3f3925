"""Superoptimize the pieces of a captured graph and stitch them back (docs/design.md §10.4).

Each piece is handed to ``mg.superoptimize`` (searched, verified, lowered; results
cached on disk by program — structure and shapes — configuration and device),
and its lowered program becomes a torch operator (:mod:`.kernels`). A piece
whose search raises a mugraph error stays torch code, with one log line saying
why; nothing is silently dropped.

The never-slower rule (``FrontendOptions.never_slower``, docs/models.md): where pieces
can be timed — on a GPU, or with a ``timer`` option — a piece's compiled μGraph and its
own torch ops are timed side by side on example inputs at its shapes, and the piece runs
the μGraph only if it is faster. A search proves a μGraph equal to the piece and the cost
model ranks candidates, but neither says it beats what Inductor makes of the same torch
ops; only a measurement on the card does. The verdict, both times and why go into
``bp.info`` (``runs``, ``mugraph_s``, ``torch_s``, ``why``) and one log line.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any, Callable

import torch

import lower
from lower.cold_inputs import cycling, rotated_sets

from ..core.errors import MugraphError, first_line
from ..core.ops import is_contraction
from ..core import limits
from ..core.sizing import too_large
from ..core.text import kernel_structure
from ..pipeline.cache import cached, default_cache_dir, locate
from ..pipeline.optimize import make_config, superoptimize
from ..core.files import as_path
from .inductor import compile_graph
from .kernels import call as call_op, make_op
from . import verdicts
from .agreement import FormsDisagree, agreeing
from .options import PIECE_TIMING, FrontendOptions, piece_seconds
from .pieces import BuiltPiece, constant_name, example_inputs, torch_module

log = logging.getLogger("mugraph")

#: (piece name, options key, device, kernel op kind, layout key, counters kept) -> (operator, Optimized). Why a
#: process-wide table: a torch operator can be registered once per process under its name,
#: and every identical layer of a model captures the same piece — each reuses the first's
#: registration (``None``: its lowering failed)
_DONE: dict[tuple, tuple[Any, Any] | None] = {}
#: (piece name, options key, device, kernel op kind, layout key, counters kept) -> each searched piece's result
#: and what ``bp.info`` says of it (a later capture of the same piece gets a copy). Why: one search
#: per process, piece and input layout, whatever the number of identical layers, without reading
#: the disk cache again for each; empty when the search failed. The layout is in the key because
#: the GPU re-ranking tunes on it (``OptimizeConfig.input_strides``)
_INFO: dict[tuple, dict] = {}
#: (piece name, options key, device, kernel op kind, layout key, counters kept, timer) -> the never-slower
#: verdict (:func:`_judge`). Why: a piece is timed once per process, kernels and timer, not
#: once per identical layer; the timer is part of the key (held, so never confused with another)
_VERDICTS: dict[tuple, dict] = {}
#: the keys of pieces that are not searched (:func:`unsearched`) -> why
_UNSEARCHED: dict[tuple, str] = {}
#: the keys of ``_DONE`` whose lowering failed -> why (for ``bp.info`` of later captures)
_LOWER_FAILED: dict[tuple, str] = {}
#: (result-cache entry, its modification time and size, the asking code's versions) -> whether
#: it serves the piece asked (:func:`_is_cached`). Why: a compile asks twice per distinct
#: piece — its plan, then its search — and each answer read and parsed the whole entry; a
#: changed file, or other code asking, is answered again
_SERVED: dict[tuple, bool] = {}


def _is_cached(bp: BuiltPiece, opts: FrontendOptions, device: str) -> bool:
    """Whether ``superoptimize`` will serve this piece from the cache: the same lookup
    (:func:`~mugraph.pipeline.cache.locate`) and the same checks it makes — an entry computed
    by other code is not a hit, so such a piece is announced and bounded by the deadline as
    the new search it is. Quiet: ``superoptimize`` says why an entry is recomputed, once."""
    if opts.cache_dir is False:
        return False
    root = default_cache_dir() if opts.cache_dir is None else as_path(opts.cache_dir, "cache_dir")
    path, doc = locate(root, bp.program, make_config(optimize_config(bp, opts)), opts.seed, device)
    try:
        st = path.stat()
    except OSError:  # no entry (or none readable): not served
        return False
    # what the entry is checked against besides its file: the code and versions asking now
    k = (str(path), st.st_mtime_ns, st.st_size, tuple(sorted((doc.get("versions") or {}).items())))
    if k not in _SERVED:
        _SERVED[k] = cached(path, bp.program, doc, quiet=True) is not None
    return _SERVED[k]


def _key(bp: BuiltPiece, opts: FrontendOptions, device: str) -> tuple:
    """The piece's key in this module's tables (``_INFO``, ``_DONE``)."""
    kind = opts.kernel_op if opts.kernel_op != "auto" else ("triton_op" if device == "cuda" else "custom_op")
    return (bp.name, opts.key(), device, kind, bp.layout_key, _keeps_counters(opts, device))


def _keeps_counters(opts: FrontendOptions, device: str) -> bool:
    """Whether a piece's operator keeps its split-K counters in a buffer of the graph that it
    mutates (:func:`.kernels.make_op`): not where Inductor compiles repeated layers once
    (:meth:`.FrontendOptions.outlines`), since a mutating call cannot go into their subgraph;
    there the operator holds its counters itself (design §10.5)."""
    return not opts.outlines(device)


def forget() -> None:
    """Forget this process's tables of searched, compiled, timed and unsearched pieces, so the
    next compile finds its pieces as a fresh process would: in the caches on disk (a
    benchmark's warm start, a test's second compile)."""
    for table in (_INFO, _DONE, _VERDICTS, _LOWER_FAILED, _UNSEARCHED, _SERVED):
        table.clear()


def unsearched(bp: BuiltPiece, opts: FrontendOptions) -> str | None:
    """Why the piece is not searched at all, or None when it is: a value of its program is
    too large for the verifier to evaluate, even in slices (a large vocabulary's LM head:
    LLaMA-3-8B's 4096 × 128256 weight; its share of a whole model's budget went unused and
    a warm compile counted it as a new search); or its program changes the
    layout of a value it computes in a way the search never generates
    (``search.proposals.ungenerated_on_computed``: a q/k projection's head split before its
    RoPE, the LM head's reshape pair), so the search's space holds no μGraph of it but the
    program op by op — which stays torch code under ``unfused="torch"`` whatever the search
    does. Measured: no such piece of five decoder layers ever matched, and a whole
    LLaMA-3-8B's four of them took 8–19 s of its cold compile (H200). Under
    ``unfused="lower"`` they are searched, for the program's own lowering."""
    from search.proposals import ungenerated_on_computed

    big = too_large(bp.program, limits.MAX_EVAL_ELEMENTS)
    if big is not None:  # superoptimize refuses it at once: it takes no share of the budget
        return f"not searched: {big.clause} (mugraph.core.limits.MAX_EVAL_ELEMENTS), too large to verify"
    if opts.unfused != "torch":
        return None
    lower = "; option unfused='lower' searches it"
    if _only_permutes(bp):
        return ("not searched: its only products multiply by a signed permutation the capture wrote as a "
                "matrix (RoPE's rotate-half), which a μGraph runs as a matmul and its torch ops as an index" + lower)
    what = ungenerated_on_computed(bp.program)
    return None if what is None else \
        f"not searched: its program holds a {what}, which no μGraph but the program op by op can hold{lower}"


def _only_permutes(bp: BuiltPiece) -> bool:
    """Whether every product of the piece multiplies by one of its capture-made constants that
    is a signed permutation (each row and column one ±1): RoPE's ``x @ R`` for rotate-half
    (``aten._rotate_half``). Such a piece is element-wise work around data movement: its torch
    ops run the permutation as an index, fused by Inductor into one kernel of about a
    microsecond, while any μGraph multiplies by ``R``. Measured on an H200 (2026-12-02), the
    RoPE pieces of five decoder layers: their μGraphs 3.1–31.8 μs against 1.07–1.17 of torch
    ops, none shipped, 4.4–11.3 s of search and tuning each in every cold compile."""
    perms = {constant_name(i) for i, c in enumerate(bp.constants) if _signed_permutation(c)}
    products = [op for op in bp.program.ops if is_contraction(op.kind)]
    return bool(products) and all(any(t.op.kind == "input" and t.name in perms for t in op.inputs)
                                  for op in products)


def _signed_permutation(c: torch.Tensor) -> bool:
    """Whether ``c`` is a square matrix with one ±1 in each row and column, zeros elsewhere."""
    if c.dim() != 2 or c.shape[0] != c.shape[1]:
        return False
    nonzero = c != 0
    return bool((c[nonzero].abs() == 1).all() and (nonzero.sum(0) == 1).all() and (nonzero.sum(1) == 1).all())


def new_search_s(bp: BuiltPiece, opts: FrontendOptions, device: str) -> float:
    """Seconds the piece's first :func:`optimize_piece` asks for by its limits — its search's
    time limit and, on a GPU, its tuning (:meth:`~.options.FrontendOptions.tune_s`) — or 0
    when this process has searched it already, the result cache holds it or it is not
    searched (:func:`unsearched`;
    :class:`~.options.GraphClock` reserves these)."""
    if _key(bp, opts, device) in _INFO or unsearched(bp, opts) or _is_cached(bp, opts, device):
        return 0.0
    return piece_seconds(opts.time_limit) if device == "cuda" else opts.time_limit


def optimize_piece(bp: BuiltPiece, opts: FrontendOptions, device: str, stop_by: float | None = None):
    """``(operator, Optimized)`` for the piece, or ``None`` when it stays torch code;
    ``bp.info`` says which (``runs``) and why. The search runs once per process and key
    (its checks and tuning done by ``stop_by``, a ``time.time()``: ``superoptimize``);
    the operator is built only for a piece that runs lowered (not for one that
    ``opts.unfused`` leaves to torch), then judged by the never-slower rule (:func:`_judge`)."""
    k = _key(bp, opts, device)
    kind = k[3]
    if k not in _UNSEARCHED and k not in _INFO:
        why = unsearched(bp, opts)
        if why is not None:
            _UNSEARCHED[k] = why
            log.info("mugraph: %s stays torch code: %s", bp.name, why)
    if k in _UNSEARCHED:
        bp.info = {"runs": "torch", "mugraph_s": None, "torch_s": None, "why": _UNSEARCHED[k],
                   "search_s": 0.0, "cached": None}
        return None
    first = k not in _INFO  # the verdict of a search is said once, not once per identical layer
    if first:
        if not _search(bp, opts, device, k, stop_by):
            return None
    elif not _INFO[k]:  # failed before
        return None
    opt = _INFO[k]["optimized"]
    bp.info = {n: v for n, v in _INFO[k].items() if n != "optimized"}
    if not first:  # served by an earlier piece's search in this process: none of its seconds are this one's
        bp.info.update(search_s=0.0, cached="memo")
    if opt.best.origin == "program" and opts.unfused == "torch":
        why = f"the search found nothing better than the program op by op ({program_won(opt)})"
        if first:
            log.info("mugraph: %s stays torch code: %s; option unfused='lower' runs it lowered", bp.name, why)
        bp.info.update(runs="torch", mugraph_s=None, torch_s=None, why=why)
        return None
    if k not in _DONE:
        try:
            # no CUDA graph of its own (the caller may capture one around it) and no PDL launch
            # option (wrap_triton passes launch options through only for warps and stages);
            # inputs that are strided views (a transposed weight) are read through their strides,
            # and outputs are written in the layout eager gave them
            configs = {i: lower.KernelConfig.from_dict(v) for i, v in opt.best.configs.items()}
            prog = lower.compile(opt.graph, device=device, configs=configs, cuda_graphs=False, pdl=False,
                                 input_strides=bp.strided, output_strides=bp.strided_outputs)
            suffix = f"_{bp.layout_key}" if bp.layout_key else ""
            # the kernels' source in the name: Inductor's autograd cache keys a graph by the
            # operators it calls, and a stored graph holds the kernels it traced through
            kernels = hashlib.sha256(prog.triton_source().encode()).hexdigest()[:10]
            keep = _keeps_counters(opts, device)
            _DONE[k] = (make_op(f"{bp.name}_{opts.key()}_{kind[0]}{suffix}_{kernels}{'' if keep else '_own'}", prog,
                                kind, keep), opt)
        except Exception as e:  # noqa: BLE001 - a piece that fails stays torch code; the model still runs
            _LOWER_FAILED[k] = _stays_torch(bp, e)
            _DONE[k] = None
    if _DONE[k] is None:
        bp.info.update(runs="torch", mugraph_s=None, torch_s=None, why=f"its lowering failed: {_LOWER_FAILED[k]}")
        return None
    bp.info.update(_judge(bp, _DONE[k][0], opts, device, k))
    return _DONE[k] if bp.info["runs"] == "mugraph" else None


def program_won(opt: Any) -> str:
    """Why the program op by op is ``opt``'s best, in a few words for the log: how many
    μGraphs the search proved in how long, and — when they were timed — the fastest one's
    time against the program's. A user reading "stays torch code" needs to know whether a
    longer search (nothing proven yet) or a better kernel (proven but slower) would help."""
    stats = (opt.report.get("search") or {}).get("stats") or {}
    others = [c for c in opt.candidates if c.origin != "program" and c.contending]
    secs = stats.get("wall_seconds", stats.get("search_seconds"))
    took = f" in {secs:.0f} s" if isinstance(secs, (int, float)) else ""
    if not others:
        first = stats.get("first_match_seconds")
        seen = f"; its first fingerprint match came at {first:.0f} s" if isinstance(first, (int, float)) else \
            "; no candidate matched the program's fingerprint"
        return f"no μGraph proven{took}{seen}{_why_unproven(opt, stats.get('search') or {})}"
    timed = [c for c in others if c.measured_s is not None]
    if timed and opt.best.measured_s is not None:
        fastest = min(timed, key=lambda c: c.measured_s)
        return (f"{len(others)} μGraph(s) proven{took}; the fastest timed {fastest.measured_s * 1e6:.3g} μs, "
                f"the program {opt.best.measured_s * 1e6:.3g} μs")
    return f"{len(others)} μGraph(s) proven{took}; the program ranked first"


#: how much faster a μGraph (a piece's, or a graph's with its pieces) must time than its torch
#: form to run: within it the two are a tie, and ties go to torch code. Why: replays of one
#: pair differ by about 1 % from run to run, and a near-tie decided by that noise flips between
#: a cold and a warm compile (seen: a Gemma-2B attention piece at 15.8 against 15.7 μs stayed
#: torch code cold and ran its μGraph warm, so the two compiles gave different outputs)
TIE_MARGIN = 0.02


def faster_by_margin(mugraph_s: float, torch_s: float) -> bool:
    """Whether ``mugraph_s`` beats ``torch_s`` by more than :data:`TIE_MARGIN`."""
    return mugraph_s < torch_s * (1.0 - TIE_MARGIN)


def gpu_timer(bp: BuiltPiece, launches: dict[str, Callable[[], object]]) -> dict[str, float]:
    """The default timer on a GPU: each form's median over CUDA-graph replays
    (``lower.profile.measure_together``: the forms timed in turns, so clock drift
    between them does not decide)."""
    from lower.profile import measure_together

    return measure_together(launches, "graph", rounds=3)


#: what the default timer measures: its verdicts are kept on disk (:mod:`.verdicts`)
gpu_timer.cache_key = ("CUDA-graph replays, medians of the forms timed in turns, 3 rounds, "
                       "large inputs rotated (from DRAM)")


def _judge(bp: BuiltPiece, op: Any, opts: FrontendOptions, device: str, key: tuple) -> dict:
    """The never-slower verdict for a piece whose μGraph is compiled as ``op``: ``runs``
    ("mugraph" or "torch"), both times in seconds (None when not timed) and ``why``."""
    timer = opts.timer or (gpu_timer if device == "cuda" else None)
    if not opts.never_slower or timer is None:
        why = "not timed (never_slower=False)" if not opts.never_slower else \
            "not timed (no GPU to time on, and no timer option)"
        return {"runs": "mugraph", "mugraph_s": None, "torch_s": None, "why": why}
    k = key + (timer,)
    if k not in _VERDICTS:
        subject = {"piece": bp.name, "layout": bp.layout_key, "kernel_op": key[3], "inductor": opts.inductor,
                   "margin": TIE_MARGIN, "operator": op.name()}  # its name holds its kernels' digest
        kept = verdicts.entry(opts.cache_dir, "piece", bp.name, subject, opts.key(), device, timer)
        v = kept.load()
        if v is None:
            v = _time_both(bp, op, opts, device, timer)
            if v["mugraph_s"] is not None:  # a comparison that failed is tried again next time
                kept.save(v)
        else:
            log.info("mugraph: %s %s: %s (timed at an earlier compile)", bp.name,
                     "runs its μGraph" if v["runs"] == "mugraph" else "stays torch code", v["why"])
        _VERDICTS[k] = v
    return dict(_VERDICTS[k])


def _time_both(bp: BuiltPiece, op: Any, opts: FrontendOptions, device: str,
               timer: Callable[..., dict]) -> dict:
    """Time the μGraph and the torch ops of ``bp`` with ``timer`` and decide (one log line).
    Ties (within :data:`TIE_MARGIN`) go to torch code, which Inductor may still fuse with its
    neighbours; a comparison
    that fails keeps the piece torch code too (never slower, never broken)."""
    try:
        xs = example_inputs(bp, device, opts.seed)
        n = len(bp.inputs)
        torch_fn = torch_form(bp, xs[:n], opts.inductor)
        # on a GPU the calls cycle through copies of the large inputs (PIECE_TIMING): a weight
        # comes from DRAM in the model's step, and each form is timed so
        sets = rotated_sets(xs) if device == "cuda" and PIECE_TIMING == "dram" else [xs]
        launches = {"mugraph": cycling([lambda s=s: call_op(op, s) for s in sets]),
                    "torch": cycling([lambda s=s: torch_fn(*s[:n]) for s in sets])}
        with torch.no_grad():
            times = timer(bp, launches)
        mu, tt = _seconds(times, "mugraph"), _seconds(times, "torch")
    except Exception as e:  # noqa: BLE001 - the model still runs, as torch code
        why = f"timing failed: {first_line(e)}"
        log.warning("mugraph: %s stays torch code: %s", bp.name, why)
        return {"runs": "torch", "mugraph_s": None, "torch_s": None, "why": why}
    faster = faster_by_margin(mu, tt)
    why = (f"its μGraph takes {mu * 1e6:.3g} μs, its torch ops {tt * 1e6:.3g} μs: "
           + ("the μGraph is faster" if faster else
              f"the μGraph is not faster by more than {TIE_MARGIN:.0%} (never-slower rule)"))
    log.info("mugraph: %s %s: %s", bp.name, "runs its μGraph" if faster else "stays torch code", why)
    return {"runs": "mugraph" if faster else "torch", "mugraph_s": mu, "torch_s": tt, "why": why}


#: the most forms the whole-graph rule times beyond the first once the graph with all its
#: pieces lost (:func:`_fewer_pieces`; each a compile of the graph and a timing, 2–4 s)
MAX_GRAPH_TRIALS = 6

#: seconds those forms may take in all. A form costs what the first one did — an Inductor
#: compile of the whole graph and a timing: 2–4 s for a decoder layer, 30–40 s for a whole
#: model, where six of them took 270 s of a Phi-3-mini's 474 s cold compile (H200). A form
#: is not started when the time spent on them and its own expected cost would pass this
MAX_GRAPH_TRIALS_S = 30.0


def judge_graph(cap: Any, stitched: Callable[[], Callable], plain: Callable[[], Callable], args: tuple,
                opts: FrontendOptions, device: str,
                subset: Callable[[list[BuiltPiece]], Callable] | None = None) -> Callable:
    """The never-slower rule for a whole graph: ``stitched()`` (its kept pieces as μGraphs,
    the rest as the backend compiles it) against ``plain()`` (the graph as torch.compile
    would run it without mugraph), timed side by side on the call's own ``args``; the
    faster runs. Both are made only when needed.

    Why a second rule above the pieces': a piece is timed against its own torch ops, but
    cutting it out costs the fusions Inductor would have made across its boundary, and a
    kept piece can win alone while the graph loses. With no piece kept, the graph is
    ``plain()`` untimed: the capture's rewriting (SDPA as an operator, the cuts) gains
    nothing then and can lose (measured: Phi-3-mini's decode step at 0.96–0.97×
    torch.compile with no μGraph running). Ties (within :data:`TIE_MARGIN`) go to
    ``plain``; so does a comparison that fails (``stitched`` if ``plain`` fails to compile). Not timed — ``stitched`` runs — when
    nothing can time (no GPU and no ``timer``) and when ``never_slower`` is off. A graph that
    writes into its inputs (a static KV cache updated in place) is timed on copies of those
    inputs, one set per form: the caller's tensors see only the call's own write. The verdict is
    ``cap.whole`` (``runs``, ``mugraph_s``, ``torch_s``, ``why``; ``dropped``: the pieces left
    to torch) and one log line.

    ``subset(pieces)``: the graph with only those kept pieces as μGraphs. Given it, a graph that
    loses with all its pieces is tried with fewer (:func:`_fewer_pieces`) before it gives them
    all up: Phi-3-mini's decode step lost by 0.5 % with five pieces that each won alone (7 μs
    for its RMSNorm with the q and k projections, whose weight torch.compile reads as one fused
    qkv product), and ran without any of them.

    The last form tried, where no kept piece runs (none was kept, or the graph lost with
    them and with fewer): the backend's own trace with every piece as its torch ops
    (``runs: "trace"``), against ``plain()``. Its rewriting alone can win: Mistral-7B's decode
    step as the backend traces it, no μGraph, ran 164.0 μs against 184.3 for dynamo's graph (an
    H200; dynamo's materializes ``repeat_kv``, the trace's attention operator reads the grouped
    heads in place) — and it can lose (Phi-3-mini's, 0.96–0.97×): timed, not assumed.

    Every form is run once before it is timed and runs only if its outputs are
    torch.compile's (:mod:`.agreement`): a NaN where torch.compile's form has a number, or
    outputs far off, and the graph runs without its pieces."""
    timer = opts.timer or (gpu_timer if device == "cuda" else None)
    written = written_inputs(cap.graph_module, len(args))
    why = ("never_slower=False" if not opts.never_slower else "no GPU to time on, and no timer option"
           if timer is None else "the graph writes into inputs it cannot tell apart" if written is None else None)
    if not cap.kept and (why is not None or not cap.pieces):
        cap.whole = {"runs": "torch", "mugraph_s": None, "torch_s": None,
                     "why": "no piece runs a μGraph: the graph runs as torch.compile compiles it"}
        return plain()
    kept = verdicts.Entry(None, None) if why is not None else \
        verdicts.entry(opts.cache_dir, "graph", "graph", _graph_subject(cap, args, opts, device), opts.key(), device,
                       timer)
    if timer is not None:
        timer = agreeing(timer)  # a form runs only if it computes what torch.compile's does
    known = kept.load()
    if known is not None:  # timed at an earlier compile: only the form that runs is compiled
        cap.whole = known
        dropped = set(known.get("dropped") or ()) if known["runs"] == "mugraph" and subset is not None else set()
        if dropped:
            _leave_to_torch(cap, dropped)
        runs = f"with {len(cap.kept)} of its μGraph pieces" if dropped else _runs_text(known["runs"])
        log.info("mugraph: the graph runs %s: %s (timed at an earlier compile)", runs, known["why"])
        if known["runs"] == "trace":
            _leave_to_torch(cap, {bp.name for bp in cap.kept})
            return subset([]) if subset is not None else stitched()
        if known["runs"] != "mugraph":
            return plain()
        fn = subset(cap.kept) if dropped else stitched()
        # its identical layers compiled once computed otherwise at the cold compile: one by one
        return fn.one_by_one() if known.get("one_by_one") and hasattr(fn, "one_by_one") else fn
    try:
        mine = stitched()
    except Exception as e:  # noqa: BLE001 - the model still runs, as torch.compile compiles it
        failed = f"compiling the graph as the backend traced it failed: {first_line(e)}"
        log.warning("mugraph: the graph runs without its μGraph pieces: %s", failed)
        _leave_to_torch(cap, {bp.name for bp in cap.kept})
        cap.whole = {"runs": "torch", "mugraph_s": None, "torch_s": None, "why": failed}
        return plain()
    if why is not None:
        cap.whole = {"runs": "mugraph", "mugraph_s": None, "torch_s": None, "why": f"not timed ({why})"}
        if opts.repeats_once is None and hasattr(mine, "one_by_one"):
            return mine.one_by_one()  # by default the layers are compiled once only where checked
        return mine
    if not cap.kept:  # the trace is the only form besides torch.compile's
        return _trace_or_plain(cap, kept, lambda: mine, plain, args, written, timer, None)
    base = None
    try:
        base = plain()
        t0 = time.perf_counter()
        times, mine, one_by_one = _timed_against(cap, timer, mine, base, args, written)
        mu, tt = _seconds(times, "mugraph"), _seconds(times, "torch")
        # what one more form costs: a compile like the first one's, and a timing like this one
        form_s = cap.timings.get("inductor_with_pieces_s", 0.0) + time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the model still runs: without the pieces where that compiled
        why = f"with them {e}" if isinstance(e, FormsDisagree) else f"timing failed: {first_line(e)}"
        log.warning("mugraph: the graph runs %s: %s", "without its μGraph pieces" if base else "untimed", why)
        cap.whole = {"runs": "torch" if base else "mugraph", "mugraph_s": None, "torch_s": None, "why": why}
        return base or mine
    faster = faster_by_margin(mu, tt)
    timed = f"with its {len(cap.kept)} μGraph pieces it takes {mu * 1e6:.4g} μs, without them {tt * 1e6:.4g} μs"
    why = timed + ("" if faster else f": not faster by more than {TIE_MARGIN:.0%}, it runs without them "
                                     "(never-slower rule)")
    fewer = None
    if not faster and subset is not None and len({bp.name for bp in cap.kept}) > 1:
        try:
            fewer = _fewer_pieces(cap, subset, base, args, written, timer, mu / tt, form_s)
        except Exception as e:  # noqa: BLE001 - the verdict without any piece stands
            log.warning("mugraph: timing the graph with fewer pieces failed: %s", first_line(e))
    if fewer is not None:
        fn, dropped, mu2, tt2 = fewer
        why = f"{timed}; leaving {', '.join(sorted(dropped))} to torch, {mu2 * 1e6:.4g} μs against {tt2 * 1e6:.4g}"
        _leave_to_torch(cap, dropped)
        log.info("mugraph: the graph runs with %d of its μGraph pieces: %s", len(cap.kept), why)
        cap.whole = {"runs": "mugraph", "mugraph_s": mu2, "torch_s": tt2, "why": why, "dropped": sorted(dropped)}
        kept.save(cap.whole)
        return fn
    if not faster and subset is not None:
        spent = time.perf_counter() - t0
        if spent + form_s <= MAX_GRAPH_TRIALS_S:
            return _trace_or_plain(cap, kept, lambda: subset([]), lambda: base, args, written, timer, why)
        log.info("mugraph: the graph is not tried as traced without its pieces: a form costs about %.0f s, "
                 "past the rule's %g s", form_s, MAX_GRAPH_TRIALS_S)
    log.info("mugraph: the graph runs %s its μGraph pieces: %s", "with" if faster else "without", why)
    cap.whole = {"runs": "mugraph" if faster else "torch", "mugraph_s": mu, "torch_s": tt, "why": why,
                 **({"one_by_one": True} if one_by_one else {})}
    kept.save(cap.whole)
    return mine if faster else base


def _timed_against(cap: Any, timer: Callable[..., dict], mine: Callable, base: Callable, args: tuple,
                   written: frozenset[int]) -> tuple[dict, Callable, bool]:
    """``timer``'s times of ``mine`` against ``base``, the form of ``mine`` timed, and whether
    that is the graph compiled one layer after another: where ``mine`` fails to run or its
    outputs are not ``base``'s (:class:`.agreement.FormsDisagree`) and its repeated layers were
    compiled once (:func:`.inductor.compile_graph`'s ``one_by_one``), the graph
    compiled one layer after another instead — the outlining is the step of that form no
    proof covers (one warning line)."""
    def timed(fn: Callable) -> dict:
        with torch.no_grad():
            return timer(cap, {"mugraph": _replayable(fn, args, written), "torch": _replayable(base, args, written)})
    try:
        return timed(mine), mine, False
    except Exception as e:  # noqa: BLE001 - the outlined form's fault: the layers one by one
        again = getattr(mine, "one_by_one", None)
        if again is None:
            raise
        log.warning("mugraph: the graph's identical layers are compiled one by one: compiled once, %s",
                    e if isinstance(e, FormsDisagree) else f"it failed to run: {first_line(e)}")
        mine = again()
        return timed(mine), mine, True


def _runs_text(runs: str) -> str:
    """How a log line says which form of a graph runs."""
    return {"mugraph": "with its μGraph pieces", "trace": "as the backend traces it, without μGraph pieces"}.get(
        runs, "without its μGraph pieces")


def _trace_or_plain(cap: Any, kept: Any, trace: Callable[[], Callable], plain: Callable[[], Callable], args: tuple,
                    written: frozenset[int], timer: Callable[..., dict], before: str | None) -> Callable:
    """The whole-graph rule's last form: the backend's trace with no piece as a μGraph
    (``trace()``) against ``plain()``, timed side by side; the trace runs only if faster by
    :data:`TIE_MARGIN`. ``before``: what the graph with its pieces measured (None: none was
    kept). The verdict goes to ``cap.whole`` and ``kept`` (one log line)."""
    base = plain()
    lead = f"{before}; " if before else "no piece runs a μGraph; "
    try:
        fn = trace()
        cap.trial = []
        with torch.no_grad():
            times = timer(cap, {"mugraph": _replayable(fn, args, written), "torch": _replayable(base, args, written)})
        mu, tt = _seconds(times, "mugraph"), _seconds(times, "torch")
    except Exception as e:  # noqa: BLE001 - the graph runs as torch.compile compiles it
        why = (f"{lead}as traced {e}" if isinstance(e, FormsDisagree)
               else f"{lead}timing the graph as traced failed: {first_line(e)}")
        log.warning("mugraph: the graph runs without its μGraph pieces: %s", why)
        cap.whole = {"runs": "torch", "mugraph_s": None, "torch_s": None, "why": why}
        return base
    finally:
        cap.trial = None
    faster = faster_by_margin(mu, tt)
    why = (f"{lead}as traced it takes {mu * 1e6:.4g} μs, as torch.compile compiles it {tt * 1e6:.4g} μs"
           + ("" if faster else f": not faster by more than {TIE_MARGIN:.0%}"))
    runs = "trace" if faster else "torch"
    if faster:
        _leave_to_torch(cap, {bp.name for bp in cap.kept})
    log.info("mugraph: the graph runs %s: %s", _runs_text(runs), why)
    cap.whole = {"runs": runs, "mugraph_s": mu, "torch_s": tt, "why": why}
    kept.save(cap.whole)
    return fn if faster else base


def _fewer_pieces(cap: Any, subset: Callable[[list[BuiltPiece]], Callable], base: Callable, args: tuple,
                  written: frozenset[int], timer: Callable[..., dict], ratio: float, form_s: float = 0.0
                  ) -> tuple[Callable, set[str], float, float] | None:
    """The graph with some of its kept pieces left to torch, if one such form beats ``base``
    (by :data:`TIE_MARGIN`): greedily, each round times the current form less each piece name in
    turn (identical pieces go together: a whole model's layers share theirs) and keeps the best
    if it improves on ``ratio`` (the current form's time over ``base``'s), at most
    :data:`MAX_GRAPH_TRIALS` forms and :data:`MAX_GRAPH_TRIALS_S` seconds — a form is not
    started when the seconds spent and its expected cost (``form_s`` for the first: the first
    form's compile and timing; then the last form's) would pass them. Returns (the form, the
    names left to torch, its time, ``base``'s time in the same timing), or None. Each form is
    timed against ``base`` side by side, as the first was; ``cap.trial`` names the pieces of the
    form being timed."""
    names = list(dict.fromkeys(bp.name for bp in cap.kept))
    dropped: set[str] = set()
    trials = 0
    t0 = time.perf_counter()

    def affordable() -> bool:
        if time.perf_counter() - t0 + form_s <= MAX_GRAPH_TRIALS_S:
            return True
        log.info("mugraph: the graph is not tried with fewer pieces%s: a form costs about %.0f s (an Inductor "
                 "compile of the graph and a timing), past the rule's %g s", " than that" if trials else "",
                 form_s, MAX_GRAPH_TRIALS_S)
        return False

    try:
        while len(dropped) < len(names) - 1 and trials < MAX_GRAPH_TRIALS:
            best = None
            for name in names:
                if name in dropped or trials >= MAX_GRAPH_TRIALS:
                    continue
                if not affordable():  # the round so far: its best form, if it already wins
                    won = best is not None and faster_by_margin(best[3], best[4])
                    return (best[2], best[1], best[3], best[4]) if won else None
                t_form = time.perf_counter()
                drop = dropped | {name}
                keep = [bp for bp in cap.kept if bp.name not in drop]
                cap.trial = [n for n in names if n not in drop]
                fn = subset(keep)
                with torch.no_grad():
                    times = timer(cap, {"mugraph": _replayable(fn, args, written),
                                        "torch": _replayable(base, args, written)})
                trials += 1
                form_s = time.perf_counter() - t_form
                mu, tt = _seconds(times, "mugraph"), _seconds(times, "torch")
                if best is None or mu / tt < best[0]:
                    best = (mu / tt, drop, fn, mu, tt)
            if best is None or best[0] >= ratio:
                return None
            ratio, dropped = best[0], best[1]
            if faster_by_margin(best[3], best[4]):
                return best[2], dropped, best[3], best[4]
        return None
    finally:
        cap.trial = None


def _leave_to_torch(cap: Any, dropped: set[str]) -> None:
    """Mark the kept pieces named in ``dropped`` torch code: they won alone, not in the graph."""
    for bp in cap.kept:
        if bp.name in dropped:
            bp.info = {**bp.info, "runs": "torch",
                       "why": (bp.info.get("why") or "") + "; but the graph is faster with it as torch code "
                              "(whole-graph rule)"}
    cap.kept = [bp for bp in cap.kept if bp.name not in dropped]


def _graph_subject(cap: Any, args: tuple, opts: FrontendOptions, device: str) -> dict:
    """What the whole-graph rule timed: the traced graph's code, the call's tensors (shapes,
    strides, dtypes), the pieces kept as μGraphs (by name and layout), whether Inductor
    compiled its identical layers once (another form, whose outputs were checked apart) and
    the Inductor settings of the graph with its pieces (``inductor_config``: other kernels)."""
    code = hashlib.sha256(cap.graph_module.code.encode()).hexdigest()[:24]
    tensors = [[list(a.shape), list(a.stride()), str(a.dtype)] if isinstance(a, torch.Tensor) else repr(a)[:40]
               for a in args]
    return {"graph": code, "args": tensors, "kept": sorted(f"{bp.name}:{bp.layout_key}" for bp in cap.kept),
            "margin": TIE_MARGIN, "repeats_once": opts.outlines(device),
            "inductor_config": sorted(opts.inductor_config.items())}


def written_inputs(gm: torch.fx.GraphModule, n_args: int) -> frozenset[int] | None:
    """The positions of the call's arguments the traced (functionalized) graph copies results
    back into — a KV cache's in-place update — or None when its placeholders do not line up
    with the ``n_args`` arguments (then which argument is written cannot be told)."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    hit = {n.args[0] for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
           and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"}
    if hit and len(places) != n_args:
        return None
    return frozenset(i for i, n in enumerate(places) if n in hit)


#: a written input of at most this many elements is put back before every timed call
#: (:func:`_replayable`): a write position or a step counter, never a cache's buffers
RESTORED_ELEMENTS = 1 << 16


def _replayable(fn: Callable, args: tuple, written: frozenset[int]) -> Callable[[], Any]:
    """A launch of ``fn`` for a timer, which runs it hundreds of times: on its own copies of
    the inputs the graph writes into (a static KV cache's in-place update: the caller's
    tensors must see the one write of the one call; the copies keep the inputs' strides),
    the small ones among them (:data:`RESTORED_ELEMENTS`) put back before each call.

    Why put back: a cache that counts the tokens written (transformers' static cache keeps
    that count in a tensor per layer) advances its write position at every call, and a
    2-layer LLaMA-3-8B, whose step is short enough for the timer to run it over 256 times,
    wrote past its 2,304 slots — an out-of-bounds index in a kernel, which ends the process
    on a GPU (a device-side assert). Both forms pay the same copies."""
    mine = _copies(args, written)
    restore = [(mine[i], args[i].clone()) for i in sorted(written)
               if isinstance(args[i], torch.Tensor) and args[i].numel() <= RESTORED_ELEMENTS]

    def launch() -> Any:
        for dst, src in restore:
            dst.copy_(src)
        return fn(*mine)
    return launch


def _copies(args: tuple, written: frozenset[int]) -> tuple:
    """``args`` with a copy (same strides) of each tensor at a position in ``written``."""
    return tuple(a.clone() if i in written and isinstance(a, torch.Tensor) else a for i, a in enumerate(args))


def torch_form(bp: BuiltPiece, xs: list[torch.Tensor], inductor: bool) -> Callable:
    """The piece's torch ops as they would run in the model: compiled by Inductor (when the
    backend uses it), else eagerly."""
    gm = torch_module(bp)
    return compile_graph(gm, xs) if inductor else gm


def _seconds(times: Any, form: str) -> float:
    """``times[form]`` as positive seconds, or a one-line error naming what the timer returned."""
    v = times.get(form) if isinstance(times, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise ValueError(f"timer returned {str(times)[:80]}: want {{'mugraph': s, 'torch': s}}, seconds > 0")
    return float(v)


def _why_unproven(opt: Any, counts: dict) -> str:
    """What became of the fingerprint matches of a search that shipped none, for the log
    line (empty when there were none): not verified (the verification's preparation or
    the time ran out), verified but not proven (every field test passed, the bound stayed
    above the target), or set aside later (float check, lowering). Without it, a piece
    whose matches all passed their field tests with a bound of 1 read the same as one
    whose search found nothing."""
    parts = []
    if counts.get("verify_skipped_warm_up"):
        parts.append(f"{counts['verify_skipped_warm_up']} not verified: the program's side of the verification "
                     "was not ready by the limit")
    if counts.get("verify_skipped_time"):
        parts.append(f"{counts['verify_skipped_time']} not verified for lack of time")
    if counts.get("verify_failed"):
        parts.append(f"{counts['verify_failed']} failed verification")
    if counts.get("verify_unevaluated"):
        parts.append(f"{counts['verify_unevaluated']} could not be evaluated by the verifier")
    rejected = [c.rejected for c in opt.candidates if c.origin != "program" and c.rejected]
    unproven = [r for r in rejected if r.startswith("not proven")]
    if unproven:
        parts.append(f"{len(unproven)} passed every field test but were not proven ({unproven[0].split('; OptimizeConfig')[0]})")
    other = [r for r in rejected if not r.startswith("not proven")]
    if other:
        parts.append(f"{len(other)} set aside ({other[0][:120]})")
    return "; of the matches, " + ", ".join(parts) if parts else ""


def optimize_config(bp: BuiltPiece, opts: FrontendOptions) -> dict:
    """The piece's ``superoptimize`` config: the options', with the strides its inputs arrive
    in (a transposed ``nn.Linear`` weight), so the GPU re-ranking tunes each candidate on the
    layout the model passes — a GEMV over ``W.T`` wants other tiles than over ``W``."""
    return {**opts.optimize_config(), "input_strides": bp.strided or None}


def _search(bp: BuiltPiece, opts: FrontendOptions, device: str, k: tuple, stop_by: float | None = None) -> bool:
    """Superoptimize the piece into ``_INFO[k]``; False (and one log line) when it stays torch code."""
    cached = _is_cached(bp, opts, device)
    if not cached and opts.deadline is not None and time.time() > opts.deadline:
        log.warning("mugraph: %s stays torch code: the deadline for searches has passed", bp.name)
        return False
    if not cached:
        log.info("mugraph: new search for %s, ≤ %g s", bp.describe(), opts.time_limit)
    t0 = time.perf_counter()
    try:
        opt = superoptimize(bp.program, optimize_config(bp, opts), device=device, cache_dir=opts.cache_dir,
                            progress=False, seed=opts.seed, stop_by=stop_by)
    except Exception as e:  # noqa: BLE001 - a piece that fails stays torch code; the model still runs
        _stays_torch(bp, e)
        _INFO[k] = {}
        return False
    stats = (opt.report.get("search") or {}).get("stats") or {}
    counts = stats.get("search") or {}
    if opt.report.get("cut_to_s") is not None:
        log.info("mugraph: %s: its search, checks and tuning had %.0f s in all, less than its share's own "
                 "slack allows: graph_budget keeps the time of the searches after it", bp.name, opt.report["cut_to_s"])
    _INFO[k] = {"search_s": time.perf_counter() - t0, "cached": cached, "kernels": opt.best.num_kernels,
                "origin": opt.best.origin, "found_by": opt.best.found_by,
                "predicted_s": opt.best.predicted_s,
                # what the search did in its share, for a piece that ships nothing as much as for one
                # that ships: when its first match came, how many matched and were proven
                "first_match_s": stats.get("first_match_seconds"),
                "matches": counts.get("fingerprint_matches", 0), "verified": counts.get("verified", 0),
                # where superoptimize's seconds went (search, check, gpu_reference, gpu_tuning, ...)
                "phases": dict(opt.report.get("phases") or {}),
                # seconds the call had when the graph's clock cut its budget (None: its own)
                "cut_to_s": opt.report.get("cut_to_s"),
                # the shipped graph's kernels (blocks x loop steps), and where the search's time went
                "structure": kernel_structure(opt.best.graph) if opt.best.origin == "search" else opt.best.origin,
                **search_digest(stats),
                "candidates": candidates_digest(opt.candidates, opt.best),
                # which candidates the GPU re-ranking timed and with what tuning shares, and why
                "ranking": opt.report.get("why"),
                "optimized": opt}
    if not cached and _INFO[k]["candidates"]:
        log.info("mugraph: %s: candidates (μs, p predicted, m measured): %s", bp.name, _INFO[k]["candidates"])
    return True


def search_digest(stats: dict) -> dict[str, Any]:
    """One line each of what a piece's search did with its share, from its stats: when each
    phase started, what the compositional pieces found, how many split and tile variants were
    proposed, and what a verification cost — so a row's table shows why a piece verified
    nothing (an enumeration that ran out the clock, a composition that found one graph)
    without a rerun."""
    d = stats.get("derived") or {}
    pieces = [d.get(f"piece{i}") or {} for i in range(len(d.get("pieces") or []))]
    return {
        "phases_started": ", ".join(f"{k} {v:g}" for k, v in (stats.get("phase_started") or {}).items()),
        "composed": ("; ".join(f"piece {i}: {p.get('matches', 0)} in {p.get('seconds', 0):g} s"
                               + _piece_how(p) for i, p in enumerate(pieces))
                     + f"; {d.get('composed_matches', 0)} of {d.get('composed_graphs', 0)} composed matched"
                     if pieces else None),
        "variants": (f"split {d.get('split_matches', 0)}/{d.get('split_variants', 0)} "
                     f"({d.get('split_priced', 0)} priced, {_fingerprinted(d)}, "
                     f"{d.get('split_s', 0)} s), "
                     f"retile {d.get('retile_matches', 0)}/{d.get('retile_variants', 0)} "
                     f"({_climbed(d)}{d.get('retile_s', 0)} s)"
                     if "split_variants" in d or "retile_variants" in d else None),
        "warm_up_s": stats.get("warm_up_seconds"),
        "verify_s_median": stats.get("verify_seconds_median"),
    }


def _fingerprinted(d: dict) -> str:
    """How the split variants were screened, for :func:`search_digest`: fingerprinted (how many),
    or proposed without (verifications cheap: a field test's median seconds)."""
    if d.get("split_unfingerprinted"):
        return f"not fingerprinted: a test {d.get('test_s', 0) * 1e3:.1f} ms"
    return f"{d.get('split_fingerprinted', 0)} fingerprinted" + (f" (a test {d['test_s'] * 1e3:.1f} ms)"
                                                                if "test_s" in d else "")


def _climbed(d: dict) -> str:
    """The retile climb's steps for :func:`search_digest` (nothing where it did not run)."""
    n = d.get("retile_climbed")
    return "" if n is None else f"climbed {n}, "


#: the most candidates :func:`candidates_digest` lists
DIGEST_CANDIDATES = 12


def candidates_digest(candidates: list, best=None, most: int = DIGEST_CANDIDATES) -> str | None:
    """One clause per candidate of a piece's call, in the order the call lists them: where it came from, its
    kernels (``blocks×loop``), the model's price and the GPU's time in μs, and why it was set
    aside, and a timed one's kernel configs (``[w4s3k4L]``) — ``*`` marks the one chosen; None
    without candidates. Why: a decoder layer's row
    says which form a piece shipped, not what else was proven and how it timed, and a form
    that timed 10.6 μs alone but lost in the layer could not be told from one never timed."""
    if not candidates:
        return None

    def us(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e6:.3g}"

    out = []
    for c in candidates[:most]:
        what = c.found_by or c.origin
        shape = kernel_structure(c.graph) if c.origin == "search" else f"{c.num_kernels} kernels"
        why = f" ({c.rejected.split(':')[0][:40]})" if c.rejected else ""
        tuned = f" [{config_labels(c.configs)}]" if c.configs and c.measured_s is not None else ""
        out.append(f"{'*' if c is best else ''}{what} {shape} p{us(c.predicted_s)} m{us(c.measured_s)}{tuned}{why}")
    more = len(candidates) - most
    return "; ".join(out) + (f"; +{more} more" if more > 0 else "")


def config_labels(configs: dict) -> str:
    """A timed candidate's kernel configs as their labels (``w4s3k4L``), kernel by kernel."""
    try:
        return ", ".join(lower.KernelConfig.from_dict(v).label() for _, v in sorted(configs.items()))
    except Exception:  # noqa: BLE001 - a digest never fails the compile
        return "?"


def _piece_how(p: dict) -> str:
    """How a composition's piece was answered, for :func:`search_digest`: searched to
    completion or not, serially in the search's process or on its workers (and after how
    long a serial start), or built."""
    if p.get("constructed"):
        return " (built)"
    how = ["complete"] if p.get("complete") else []
    executor, after = p.get("executor"), p.get("serial_first_s")
    if executor:
        how.append(executor if after is None or executor == "serial" else f"{executor} after {after:.3g} s serial")
    return f" ({', '.join(how)})" if how else ""


def _stays_torch(bp: BuiltPiece, e: Exception) -> str:
    """Log why ``bp`` stays torch code (one warning line); returns that why."""
    what = str(e).splitlines()[0][:300] if str(e) else ""
    why = ("" if isinstance(e, MugraphError) else f"{type(e).__name__}: ") + what
    log.warning("mugraph: %s stays torch code: %s", bp.name, why)
    return why


def device_of(example_inputs) -> str:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return "cuda"
    return "cpu"
