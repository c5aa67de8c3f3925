"""``from_torch``: a captured program — the ATen graph, what each node maps to,
the Lax pieces — and its runs: the float64 reference and the superoptimized form."""

from __future__ import annotations

import gc
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from .capture import NodeInfo, probe_all, trace, unfold_column_slices_in
from .options import (MAX_PIECE_MATMULS, MAX_PIECE_OPS, MIN_PIECE_S, PIECE_AFTER_SEARCH_S, FrontendOptions,
                      GraphClock, repeat_weights, search_weight)
from .partition import partition
from .pieces import BuiltPiece, build_piece, provable, reference_call, rewrite

log = logging.getLogger("mugraph")


class gc_paused:
    """``with gc_paused() as pause:`` Python's cyclic garbage collector paused for the block,
    or until ``pause.resume()`` (then as it was before).

    Why: building a graph allocates tens of thousands of objects (fx nodes, fake tensors,
    pieces), which sets off full collections, and a full collection walks every object the
    process holds — the model, dynamo's state — so a capture's time grew with the size of
    the process around it. Paused, the objects are walked once, after the block, instead of
    several times inside it (a tiny 32-layer Phi-3's warm part on a CPU: median 1.21 → 0.95 s
    over eight compiles; a whole Phi-3-mini's capture on an H200 machine 1.3 → 0.3 s, the one
    collection left then falling in Inductor's part). Only graph building and work served
    from caches run paused (seconds at most), never a search or a tuning, so what it leaves
    uncollected is bounded."""

    def __enter__(self) -> "gc_paused":
        self._was = gc.isenabled()
        gc.disable()
        return self

    def resume(self) -> None:
        """Collect as before the block from here on."""
        if self._was:
            gc.enable()

    def __exit__(self, *exc: Any) -> None:
        self.resume()


@dataclass
class SearchPlan:
    """How a graph's searches share its budget (:meth:`Captured.plan`): each distinct piece
    (by name and input layout) its options (``shares``), its place in the order the pieces
    are searched (``position``) and the seconds its first search asks for (``nominal_s``, in
    that order; 0 when the result cache or this process has it)."""

    shares: dict[tuple, FrontendOptions]
    position: dict[tuple, int]
    nominal_s: list[float]
    #: seconds of search and tuning for the graph (:meth:`FrontendOptions.search_budget`)
    budget_s: float | None = None

    @property
    def new_search_s(self) -> float:
        """Seconds the new searches ask for in all (0: a warm compile)."""
        return sum(self.nominal_s)

    def least_search_s(self) -> float:
        """Seconds the new searches take whatever the clock does: their time limits (the graph
        clock cuts checks and tuning, never a search)."""
        return sum(self.shares[k].time_limit for k, i in self.position.items() if self.nominal_s[i] > 0)


class Captured:
    """A traced program cut into Lax pieces (``pieces``) and library ops (``library``)."""

    def __init__(self, gm: fx.GraphModule, min_ops: int = 2, max_piece_ops: int | None = MAX_PIECE_OPS,
                 max_piece_matmuls: int | None = MAX_PIECE_MATMULS, proven_only: bool = True) -> None:
        """``proven_only``: cut pieces whose μGraphs the verifier could not prove (the
        partition's ``provable``); off when unproven μGraphs may ship (``allow_unproven``)."""
        self.graph_module = gm
        self.info: dict[fx.Node, NodeInfo] = probe_all(gm.graph.nodes)
        self.pieces: list[BuiltPiece] = [build_piece(p) for p in partition(
            gm.graph, self.info, min_ops, max_piece_ops, max_piece_matmuls, provable if proven_only else None)]
        inside = {n for bp in self.pieces for n in bp.piece.nodes}
        #: call nodes that stay torch calls
        self.library: list[fx.Node] = [n for n in self.info if n not in inside]
        self.kept: list[BuiltPiece] = []
        self._calls: dict[int, Any] = {}
        #: the names of the pieces the whole-graph rule's form being timed runs as μGraphs (None:
        #: all of :attr:`kept`) — what a ``timer`` option may read of the graph it is handed
        self.trial: list[str] | None = None
        #: the never-slower verdict for the whole graph (``runs``, ``mugraph_s``, ``torch_s``,
        #: ``why``: :func:`.run.judge_graph`), set by the backend; empty before
        self.whole: dict = {}
        #: where the backend's compile of this graph went, in seconds (set by the backend):
        #: ``capture_s`` (ATen trace, partition), ``pieces_s`` (searches, lowering, the pieces'
        #: timings), ``inductor_with_pieces_s``/``inductor_without_s`` (the forms the whole-graph
        #: rule compiles), ``graph_rule_s`` (those and its timing), ``total_s``
        self.timings: dict[str, float] = {}

    def distinct(self) -> dict[tuple, BuiltPiece]:
        """The first piece of each name and input layout, by that key: what is searched once
        for all of them (identical layers share one search; run.optimize_piece)."""
        first: dict[tuple, BuiltPiece] = {}
        for bp in self.pieces:
            first.setdefault((bp.name, bp.layout_key), bp)
        return first

    def search_seconds(self) -> tuple[float, int]:
        """Seconds the searches of this compile took (each distinct piece once: identical
        layers share one) and how many of them were new, not served by the result cache."""
        seen = [bp.info for bp in self.distinct().values()]
        return (sum(i.get("search_s") or 0.0 for i in seen), sum(i.get("cached") is False for i in seen))

    def timing_summary(self) -> str:
        """One line: where the compile's seconds went (:attr:`timings`)."""
        t = self.timings
        searched, new = self.search_seconds()
        stored = " (the stored trace)" if t.get("stored_trace") else ""
        parts = [f"{t.get('total_s', 0.0):.1f} s: capture {t.get('capture_s', 0.0):.1f} s{stored}",
                 f"pieces {t.get('pieces_s', 0.0):.1f} s (searches {searched:.1f} s, {new} new)"]
        if "inductor_with_pieces_s" in t or "inductor_without_s" in t:
            parts.append(f"Inductor {t.get('inductor_with_pieces_s', 0.0):.1f} s with the pieces, "
                         f"{t.get('inductor_without_s', 0.0):.1f} s without")
        if "ahead_wait_s" in t:
            took = f"{t['ahead_s']:.1f} s there, " if t.get("ahead_s") else ""
            parts.append(f"the graph without them compiled ahead in a child process ({took}{t['ahead_wait_s']:.1f} s "
                         "waited for it)")
        if "graph_rule_s" in t:
            rest = t["graph_rule_s"] - t.get("inductor_with_pieces_s", 0.0) - t.get("inductor_without_s", 0.0)
            parts.append(f"whole-graph timing {rest:.1f} s")
        return ", ".join(parts)

    def summary(self) -> str:
        views = {n for bp in self.pieces for n in bp.piece.views}
        lines = [f"{len(self.pieces)} Lax pieces, {len(self.library)} library ops"
                 + (f" ({len(views)} of them views at a piece's boundary)" if views else "")]
        lines += [f"  {bp.describe()}" for bp in self.pieces]
        names: dict[str, int] = {}
        for n in self.library:
            t = getattr(n.target, "__name__", str(n.target))
            names[t] = names.get(t, 0) + 1
        lines.append("  library: " + ", ".join(f"{k}×{v}" for k, v in sorted(names.items())))
        return "\n".join(lines)

    def report(self) -> str:
        """One line per piece: what it runs (its μGraph or torch code) and why — the search's
        outcome and the never-slower rule's times (``bp.info``), after :meth:`compile`."""
        lines = []
        for bp in self.pieces:
            info = bp.info
            if not info:
                lines.append(f"{bp.name}: torch (not superoptimized: its search failed or did not start)")
                continue
            found = f" ({info['origin']}, {info.get('kernels')} kernels)" if info.get("origin") else ""
            lines.append(f"{bp.name}: {info.get('runs', 'mugraph')}{found} — {info.get('why', '')}")
        if self.whole:
            runs = {"mugraph": "with its μGraph pieces", "trace": "as traced, without μGraph pieces"}.get(
                self.whole["runs"], "without its μGraph pieces")
            lines.append(f"the graph: {runs} — {self.whole['why']}")
        return "\n".join(lines)

    def stitched(self, call_of: Callable[[BuiltPiece], Any], pieces: list[BuiltPiece] | None = None) -> fx.GraphModule:
        """The graph with each piece (of ``pieces``, default all) as one call of ``call_of(piece)``;
        the projections the capture split by weight columns join again where torch runs them all
        (:func:`.capture.unfold_column_slices`)."""
        with gc_paused():
            return rewrite(self.graph_module, self.pieces if pieces is None else pieces, call_of,
                           edit=unfold_column_slices_in)

    def reference(self) -> fx.GraphModule:
        """The pieces run by mugraph's float64 interpreter, the rest by torch: what the
        capture means (tests compare it with the original function). The graph's float
        constants (a module's weights) are float64 in it, so a torch op between pieces
        meets float64 on both sides."""
        gm = self.stitched(reference_call)
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                v = getattr(gm, n.target, None)
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    owner, _, name = n.target.rpartition(".")
                    mod = gm.get_submodule(owner) if owner else gm
                    delattr(mod, name)
                    mod.register_buffer(name, v.detach().double())
        return gm

    def plan(self, options: FrontendOptions | dict | None = None, device: str | None = None) -> "SearchPlan":
        """Each distinct piece's share of the graph's budget (by weight,
        :func:`.options.search_weight`, and by how often the graph calls it,
        :func:`.options.repeat_weights`) and the seconds its first search asks for (0 when
        cached): what :meth:`compile` runs, known before it starts."""
        from .run import device_of, new_search_s, unsearched

        opts = FrontendOptions.of(options)
        dev = device or device_of(self.example_devices)
        first = self.distinct()  # one search per piece name and input layout
        # the budget is shared by the pieces that will be searched (a piece the space cannot
        # hold stays torch code unsearched, whatever its share)
        weights = {k: search_weight(bp.program) for k, bp in first.items() if unsearched(bp, opts) is None}
        if not any(weights.values()):  # only small pieces (or none the space holds): equal shares
            weights = dict.fromkeys(weights, 1)
        calls = Counter((bp.name, bp.layout_key) for bp in self.pieces)
        weights = repeat_weights(weights, {k: calls[k] for k in weights})
        budget = opts.search_budget(len(self.info), len(first))
        shares = {**dict.fromkeys(first, opts), **opts.for_pieces(weights, budget)}
        return SearchPlan(shares, {k: i for i, k in enumerate(first)},
                          [new_search_s(bp, shares[k], dev) for k, bp in first.items()], budget)

    def compile(self, options: FrontendOptions | dict | None = None, device: str | None = None,
                plan: SearchPlan | None = None, end_hint: Callable[[], float | None] | None = None,
                **kw: Any) -> fx.GraphModule:
        """Superoptimize every piece and stitch its kernels in; the rest runs as torch
        (eagerly: ``torch.compile`` it, or use the ``"mugraph"`` backend, for Inductor).
        ``plan``: :meth:`plan` of the same options and device, where the caller made it.
        ``end_hint``: :class:`GraphClock`'s, a later measure of when the pieces must be done."""
        from .run import device_of, optimize_piece

        opts = FrontendOptions.of({**(options if isinstance(options, dict) else {}), **kw}
                                  if not isinstance(options, FrontendOptions) else options)
        dev = device or device_of(self.example_devices)
        plan = plan or self.plan(opts, dev)
        least = plan.least_search_s()
        if plan.budget_s is not None and least > plan.budget_s:
            said = f"graph_budget={opts.graph_budget:g} s" + ("" if plan.budget_s == opts.graph_budget else
                                                              f" (cut to {plan.budget_s:g} s by compile_budget)")
            log.warning("mugraph: %s is less than the %.0f s the %d new searches take at their least (a search "
                        "is never cut; each has at least %g s): the compile will run past it",
                        said, least, sum(n > 0 for n in plan.nominal_s), MIN_PIECE_S)
        elif plan.budget_s is not None and opts.graph_budget is not None and plan.budget_s < opts.graph_budget \
                and plan.new_search_s > 0:
            log.info("mugraph: %d ATen ops and %d distinct pieces: the searches get %.0f s of graph_budget=%g s, "
                     "what compile_budget=%g s leaves for them", len(self.info), len(plan.position),
                     plan.budget_s, opts.graph_budget, opts.compile_budget)
        clock = GraphClock(plan.budget_s, plan.nominal_s, PIECE_AFTER_SEARCH_S, end_hint)
        # by piece, not by name: pieces of one name read inputs of other strides are other
        # operators, and the never-slower rule may keep one and not the other
        done: dict[int, Any] = {}
        for bp in self.pieces:
            k = (bp.name, bp.layout_key)
            r = optimize_piece(bp, plan.shares[k], dev, stop_by=clock.stop_by(plan.position[k]))
            if r is not None:
                done[id(bp)] = r[0]
        if clock.moved_s > 0:
            log.info("mugraph: the pieces ended %.0f s earlier than their budget allowed, to leave Inductor the "
                     "time the compile ahead measured", clock.moved_s)
        if clock.overrun_s() > 0:
            log.warning("mugraph: the graph's pieces ran %.0f s past their end (searches and tuning %g s, %g s a "
                        "piece after its search%s; a phase that cannot stop midway: a verification, a kernel "
                        "compile)", clock.overrun_s(), plan.budget_s, PIECE_AFTER_SEARCH_S,
                        f", moved {clock.moved_s:.0f} s earlier by the compile ahead" if clock.moved_s else "")
        #: the pieces that run superoptimized in the last compiled graph (the others stay torch code)
        self.kept = [bp for bp in self.pieces if id(bp) in done]
        self._calls = done
        return self.stitched(lambda bp: done[id(bp)], self.kept)

    def stitched_with(self, pieces: list[BuiltPiece]) -> fx.GraphModule:
        """The last compiled graph with only ``pieces`` (of :attr:`kept`) as μGraphs — the
        whole-graph rule's forms that leave some kept pieces to torch (:func:`.run.judge_graph`)."""
        calls = self._calls
        return self.stitched(lambda bp: calls[id(bp)], pieces)

    @property
    def example_devices(self) -> list:
        out = []
        for n in self.graph_module.graph.nodes:
            v = n.meta.get("val")
            if n.op == "placeholder" and isinstance(v, torch.Tensor):
                out.append(v)
        return out


def from_torch(fn: Callable, *example_inputs: torch.Tensor, min_ops: int = 2,
               max_piece_ops: int | None = MAX_PIECE_OPS, max_piece_matmuls: int | None = MAX_PIECE_MATMULS,
               proven_only: bool = True) -> Captured:
    """Trace ``fn`` (a function or ``nn.Module``) at ATen level with inputs shaped like
    ``example_inputs``; probe every node; cut the graph into Lax pieces of at most
    ``max_piece_ops`` catalog ops and ``max_piece_matmuls`` matmuls (``None``: no limit;
    see :class:`FrontendOptions`), and where the verifier could prove none of a piece's
    μGraphs unless ``proven_only`` is off (:class:`Captured`)."""
    FrontendOptions(min_ops=min_ops, max_piece_ops=max_piece_ops, max_piece_matmuls=max_piece_matmuls)  # checks
    return Captured(trace(fn, example_inputs), min_ops, max_piece_ops, max_piece_matmuls, proven_only)
