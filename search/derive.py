"""Candidates derived from other searches' results, for the driver to rank and verify.

* :func:`composed` — the compositional search of :mod:`search.compose`: search
  each piece of a cut program (fingerprint matches only: the pieces are not
  what the user asked for), splice the pieces' cheapest graphs into graphs of
  the whole program, and fuse their kernels (:func:`search.rewrite.fuse_all`).
* :func:`splits` — split-loop variants (:func:`search.rewrite.split_variants`)
  of the matches (enumerated, composed or fused), the cheapest variants by
  :func:`search.enumerate.cost_key`.
* :func:`retiles` — the cheapest matches' kernels on other tiles
  (:func:`search.rewrite.tile_variants`: twice or half the blocks along a grid axis,
  twice or half the loop's steps; :func:`search.loops.loop_variants`: a loop-free kernel
  with a loop over its contracted dims; :func:`search.grids.grid_variants`: a one-block
  kernel on a grid), one per kernel shape, proposed without a fingerprint.

Every derived graph but a tile variant is fingerprinted against the whole program (by
the :data:`Fingerprint` the driver passes), and every one is fully verified by the driver
with the enumeration's own matches; nothing derived ships unverified.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from mugraph.core.ir import KernelGraph, Program

from .check import EvaluationStopped
from .compose import compose, partition, pointwise_kernel, separate_contractions
from .config import SearchConfig
from .enumerate import cost_key
from .records import Proposal
from .grids import grid_variants
from .loops import loop_variants
from .rewrite import fuse_all, graph_key, split_variants, tile_variants

if TYPE_CHECKING:
    from .driver import SearchResult

#: ``fingerprint(graphs, end)``: whether each graph's fingerprint matches the program's —
#: None for one not answered by ``end`` (monotonic seconds; None: no limit). The driver
#: passes :func:`sequential`: its own checker, with all of this process's threads. (Run on the
#: search workers instead — one thread each — a 60 s qknorm_gqa b=8 search on 16 workers
#: verified no candidate, where fingerprinting here had verified 16; measured once, 2026-11-26.)
Fingerprint = Callable[[list[KernelGraph], Optional[float]], list[Optional[bool]]]


def sequential(checker) -> Fingerprint:
    """A :data:`Fingerprint` that asks ``checker`` (:class:`search.check.Checker`) in turn."""
    def fingerprint(graphs: list[KernelGraph], end: Optional[float]) -> list[Optional[bool]]:
        out: list[Optional[bool]] = []
        for g in graphs:
            try:
                out.append(None if _past(end) else checker.fingerprint_matches(g, stop_at=end))
            except EvaluationStopped:
                out.append(None)
        return out
    return fingerprint


def composed(program: Program, cfg: SearchConfig, budget: float, fingerprint: Fingerprint, stats: dict,
             run: Callable[[Program, SearchConfig], SearchResult],
             deadline: Optional[float] = None,
             estimate: Optional[Callable[[KernelGraph], float]] = None) -> list[Proposal]:
    """Fingerprint-matching graphs of ``program`` built from separately searched pieces.

    ``run`` searches one piece: the driver passes its own ``search.run`` (the piece
    searches are ordinary searches, nested in this one).

    The spliced and fused graphs are fingerprinted cheapest first by
    :func:`~search.enumerate.cost_key`, one per kernel shape (grids and loop lengths)
    before a second spelling of any: the piece searches return several spellings of one
    kernel, and at full shapes one fingerprint takes seconds (qknorm_gqa b=8 on two
    cores: 60 graphs × 3.3 s, more than the whole time limit). The first of each shape
    is fingerprinted while ``deadline`` (monotonic; None: no limit) allows, the other
    spellings only while ``budget`` lasts.

    Each piece offers its :data:`PIECE_RESULTS` cheapest graphs by ``cost_key``, one
    per kernel shape first; with ``estimate`` (the lowering's model), those take turns
    with the :data:`PIECE_RESULTS` it prices best among :data:`SHORTLIST` times as many
    (:func:`_piece_graphs`)."""
    t0 = time.monotonic()
    n_ops = sum(1 for op in program.ops if op.kind != "input")
    if n_ops <= cfg.compose_above and not (n_ops > cfg.piece_ops and separate_contractions(program)):
        return []
    pieces = None
    for max_ops in range(cfg.piece_ops, max(cfg.piece_ops, n_ops)):
        pieces = partition(program, max_ops, max_inputs=cfg.max_block_inputs)
        if pieces:
            break
    if not pieces:
        return []
    stats["pieces"] = [{"ops": len(p.op_ids), "inputs": [t.label() for t in p.inputs],
                        "outputs": [list(t.shape) for t in p.outputs]} for p in pieces]
    per_piece: list[list[KernelGraph]] = []
    for i, piece in enumerate(pieces):
        direct = pointwise_kernel(piece.program)
        if direct is not None:  # element-wise work: its kernel is known, not searched for
            stats[f"piece{i}"] = {"seconds": 0.0, "matches": 1, "complete": True, "constructed": True}
            per_piece.append([direct])
            continue
        producer = any(t not in program.outputs for t in piece.outputs)
        # a producer piece is fused into its consumer only if its kernel has no for-loop
        # (:func:`search.rewrite.fuse`): search it loop-free first, with loops if that finds nothing
        tries = [(), cfg.forloop_ranges] if producer and cfg.forloop_ranges else [cfg.forloop_ranges]
        graphs: list[KernelGraph] = []
        for loops in tries:
            left = budget - (time.monotonic() - t0)
            share = max(5.0, left / (len(pieces) - i))
            pricing = 0.0 if estimate is None else share * PIECE_ESTIMATE_SHARE
            sub = replace(cfg, compose=False, split_loops=False, verify=False, checkpoint=None,
                          max_kernel_ops=1, time_limit=share - pricing, verify_reserve=0.0,
                          max_results=PIECE_RESULTS * (1 if estimate is None else SHORTLIST),
                          forloop_ranges=tuple(loops))
            res, seconds, serial_s = _search_piece(run, piece.program, sub)
            stats[f"piece{i}"] = {"seconds": seconds, "matches": res.stats["num_graphs"],
                                  "complete": res.stats["complete"], "loop_free_only": not loops,
                                  "executor": res.stats["executor"], "serial_first_s": serial_s}
            if deadline is not None and not res.stats["complete"]:
                note_cut(stats, "pieces")
            graphs = _piece_graphs(res.graphs, estimate, time.monotonic() + pricing, stats[f"piece{i}"])
            if graphs:
                break
        if not graphs:
            return []
        per_piece.append(graphs)
    combos = sorted(itertools.product(*[range(len(c)) for c in per_piece]), key=lambda ix: (sum(ix), ix))
    cands: dict[str, tuple[tuple, int, KernelGraph, str]] = {}
    for ix in combos[:cfg.compose_combinations]:
        try:
            whole = compose(program, pieces, [per_piece[p][j] for p, j in enumerate(ix)])
        except Exception as e:  # noqa: BLE001 - a piece graph that does not splice is skipped, counted
            stats["compose_failed"] = stats.get("compose_failed", 0) + 1
            stats.setdefault("compose_error", str(e)[:200])
            continue
        for g, origin in [(whole, "composed")] + [(f, "composed+fused") for f in fuse_all(whole)]:
            k = graph_key(g)
            if k not in cands:
                cands[k] = (cost_key(g), len(cands), g, origin)
    ranked = [(g, origin) for _, _, g, origin in sorted(cands.values(), key=lambda v: v[:2])]
    first, rest = one_per_shape(ranked, key=lambda c: kernel_shape(c[0]))
    out: list[Proposal] = []
    tried = 0
    for batch, end in ((first, deadline), (rest, _earlier(deadline, t0 + budget))):
        answers = fingerprint([g for g, _ in batch], end) if batch else []
        tried += sum(a is not None for a in answers)
        if deadline is not None and any(a is None for a in answers):
            note_cut(stats, "pieces")
        out += [Proposal(g, origin) for (g, origin), a in zip(batch, answers) if a]
    stats["composed_graphs"] = len(ranked)
    stats["composed_fingerprinted"] = tried
    stats["composed_matches"] = len(out)
    stats["compose_seconds"] = round(time.monotonic() - t0, 3)
    return out


def _piece_graphs(graphs: list[KernelGraph], estimate: Optional[Callable[[KernelGraph], float]],
                  end: float, stats: dict) -> list[KernelGraph]:
    """What one piece offers the composition: ``graphs`` (its search's results, ranked by
    ``cost_key``, one per kernel shape first) cut to :data:`PIECE_RESULTS`; with
    ``estimate``, those in turns with the :data:`PIECE_RESULTS` it prices best among all
    of ``graphs`` (priced until ``end``, monotonic), the key's first at index 0 and the
    model's at 1 — the compositions are tried by index sum, so both favourites meet the
    other pieces' first.

    Why both: the key prices a block as written and under-rates few wide blocks, which the
    lowering sub-tiles and splits (qknorm_gqa b=1's attention piece: the per-head kernel
    that the hand-written reference splits, 2 blocks × 64 steps, is 31st of 395 by the key
    and its model's best, 2026-11-27); the model alone prices a piece as if it ran alone,
    and prefers norm kernels of few blocks that fuse worse with their consumer than the
    key's (ranked by the model only, qknorm_gqa b=1's best composition so far, a 256-block
    K-norm beside the attention, was no longer offered)."""
    keyed = graphs[:PIECE_RESULTS]
    if estimate is None or len(graphs) <= 1:
        return keyed
    ranked, stats["priced"] = _by_estimate(graphs, estimate, end)
    out, seen = [], set()
    for g in itertools.chain.from_iterable(itertools.zip_longest(keyed, ranked[:PIECE_RESULTS])):
        if g is None:
            continue
        k = graph_key(g)
        if k not in seen:
            seen.add(k)
            out.append(g)
    return out


def _search_piece(run: Callable[[Program, SearchConfig], "SearchResult"], program: Program,
                  cfg: SearchConfig) -> tuple["SearchResult", float, Optional[float]]:
    """A composition's piece searched: in this process first, serially, for up to
    :data:`SERIAL_FIRST_S` (its share of ``cfg.time_limit`` at most a half), then — when
    that did not search its space to completion — on ``cfg``'s executor for the rest of its
    time; when the workers find nothing, what the serial search found stands. Returns the
    result, the seconds both took and those of a serial start the workers followed (None:
    none). Why: a piece's space is small (an RMSNorm's statistics, a product with its
    residual, two projections of one activation: complete in 0.03–1.5 s on one core), and
    the worker processes cost more than searching it: on an H200 machine's 15 workers the
    same pieces took 1.5–3.8 s each, of a decoder layer piece's 17 s share; and the 4 s the
    workers had left after a 2 s serial start found none of the two projections' kernels
    that one core finds in 1.3 s. A share that would leave the workers less than
    :data:`WORKERS_MIN_S` is searched serially whole: LLaMA-3-8B's two projections, with
    5.3 s, went 2.6 s serially (the process's first search of those weights, its draws made on
    the way) and 2.6 s on the workers, and found nothing; the same piece in another layer's
    process completed serially in 1.9 s."""
    t0 = time.monotonic()
    first = SERIAL_FIRST_S if cfg.time_limit is None else min(SERIAL_FIRST_S, cfg.time_limit / 2)
    if cfg.time_limit is not None and cfg.time_limit - first < WORKERS_MIN_S:
        cfg = replace(cfg, executor="serial")  # too little would be left to start the workers
    serial, serial_s = None, None
    if cfg.executor != "serial":
        serial = run(program, replace(cfg, executor="serial", time_limit=first))
        if serial.stats["complete"]:
            return serial, round(time.monotonic() - t0, 3), None
        serial_s = round(time.monotonic() - t0, 3)
        left = None if cfg.time_limit is None else max(0.5, cfg.time_limit - serial_s)
        cfg = replace(cfg, time_limit=left)
    res = run(program, cfg)
    if serial is not None and serial.graphs and not res.graphs:
        res = serial
    return res, round(time.monotonic() - t0, 3), serial_s


def _past(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() > deadline


def note_cut(stats: dict, phase: str) -> None:
    """Record in ``stats["cut"]`` that ``phase`` stopped at its deadline with work left.

    Why: what such a phase proposes depends on the machine's speed, so a search whose
    enumeration finished is still not complete (:attr:`search.SearchResult.complete`) —
    more time, or a resume, can give more graphs. Without the record a loaded machine's
    run reported itself complete with one tile variant fewer than an unhurried one."""
    cuts = stats.setdefault("cut", [])
    if phase not in cuts:
        cuts.append(phase)


def _earlier(a: Optional[float], b: float) -> float:
    return b if a is None else min(a, b)


def one_per_shape(ranked: list, key: Callable) -> tuple[list, list]:
    """``ranked`` cut in two, order kept: the first item of each ``key`` (a kernel shape),
    and the others — so a budget that runs out reaches every shape before a second
    spelling of any (searches return one kernel in several equivalent spellings)."""
    seen: set = set()
    first, rest = [], []
    for x in ranked:
        k = key(x)
        (rest if k in seen else first).append(x)
        seen.add(k)
    return first, rest


#: at most this many matches are split (the cheapest by :func:`~search.enumerate.cost_key`)
MAX_SPLIT_SOURCES = 256
#: with an ``estimate``, this many times the fingerprint limit of split variants (the best
#: by ``cost_key``, one per kernel shape first) are priced by it
SHORTLIST = 8
#: share of the time left before the split phase's deadline that pricing may take
ESTIMATE_SHARE = 0.5
#: graphs each piece of a composition offers by ``cost_key`` (as many again by an estimate)
PIECE_RESULTS = 6
#: share of a piece's time that pricing its graphs may take (with an estimate)
PIECE_ESTIMATE_SHARE = 0.2
#: seconds a composition's piece is first searched in this process, serially, before its
#: search on the worker processes (:func:`_search_piece`)
SERIAL_FIRST_S = 3.0
#: the least time left after the serial start worth starting the worker processes for
WORKERS_MIN_S = 4.0


def kernel_shape(g: KernelGraph) -> tuple:
    """Each kernel's grid and loop length, in order (pre-defined ops by kind)."""
    return tuple((op.attrs["block"].grid, op.attrs["block"].forloop) if op.kind == "graph_defined" else op.kind
                 for op in g.ops if op.kind != "input")


def splits(graphs: list[KernelGraph], fingerprint: Fingerprint, stats: dict,
           deadline: Optional[float] = None, limit: int = 8,
           best: Optional[dict[int, float]] = None,
           estimate: Optional[Callable[[KernelGraph], float]] = None) -> list[Proposal]:
    """Fingerprint-matching split-loop variants of ``graphs`` (matches, cheapest first).

    The variants of every graph (:func:`~search.rewrite.split_variants`: chunk counts
    that fill the GPU, the combine on its own grid or re-gridded) are ranked together by
    :func:`~search.enumerate.cost_key` — combine kernel included — so a kernel with few
    blocks, which ranks low alone (one block per attention head), can give the best
    split; a variant not predicted faster than its source is dropped (a small kernel
    gains nothing from a second launch). With ``estimate`` (a finer price: the
    pipeline's lowering cost model), the :data:`SHORTLIST` ``× limit`` best by that key
    are ranked again by it (:func:`_by_estimate`). The ``limit`` first distinct ones are
    fingerprinted, one per kernel shape
    (grids and loop lengths) before a second of any. A split preserves the
    function by construction, yet each variant is fingerprinted here and verified by the
    driver like any candidate.

    ``best`` (when given) receives, per index of ``graphs``, the cheapest estimate among
    its variants that beat it: what the lowering, which splits a kernel's loop itself
    (its split-K), can make of that graph (:func:`search.candidates.split_loops`)."""
    variants: dict[str, tuple[tuple, int, KernelGraph]] = {}
    for i, g in enumerate(graphs[:MAX_SPLIT_SOURCES]):
        if _past(deadline):  # the variants of the cheapest sources so far are enough
            note_cut(stats, "split")
            break
        est = cost_key(g)[1]
        for h in split_variants(g):
            key = cost_key(h)
            if key[1] >= est:  # not predicted faster than the kernel it splits: not worth a proposal
                continue
            if best is not None:
                best[i] = min(best.get(i, key[1]), key[1])
            k = graph_key(h)
            if k not in variants:
                variants[k] = (key, len(variants), h)
    stats["split_variants"] = len(variants)
    return _propose(variants, fingerprint, stats, "split", "split-loop", deadline, limit, estimate)


def _propose(variants: dict[str, tuple[tuple, int, KernelGraph]], fingerprint: Optional[Fingerprint], stats: dict,
             prefix: str, origin: str, deadline: Optional[float], limit: int,
             estimate: Optional[Callable[[KernelGraph], float]]) -> list[Proposal]:
    """The fingerprint-matching ``limit`` first of ``variants`` (graph key -> (cost key,
    order, graph)) as proposals of ``origin``: ranked by the cost key, then — with an
    ``estimate`` — the :data:`SHORTLIST` ``× limit`` best of them by that price
    (:func:`_by_estimate`), one per kernel shape (grids and loop lengths) before a second of
    any: the sources are often one kernel in several equivalent spellings, whose variants
    would fill the limit alike. ``fingerprint`` None: every one chosen is proposed as it is.
    Counts go to ``stats`` under ``prefix``."""
    ranked = _key_order(variants)
    if estimate is not None:
        end = None if deadline is None else time.monotonic() + max(0.0, deadline - time.monotonic()) * ESTIMATE_SHARE
        priced, stats[f"{prefix}_priced"] = _by_estimate(ranked[:SHORTLIST * limit], estimate, end, stats, prefix)
        first, rest = one_per_shape(priced, key=kernel_shape)
        ranked = first + rest
    chosen = ranked[:limit]
    if fingerprint is None:  # proposed as they are: the verifier decides
        answers = [True] * len(chosen)
    else:
        answers = fingerprint(chosen, deadline) if chosen else []
        if any(a is None for a in answers):
            note_cut(stats, prefix)
        stats[f"{prefix}_fingerprinted"] = stats.get(f"{prefix}_fingerprinted", 0) + sum(a is not None for a in answers)
    out = [Proposal(h, origin) for h, a in zip(chosen, answers) if a]
    stats[f"{prefix}_matches"] = len(out)
    return out


def _key_order(variants: dict[str, tuple[tuple, int, KernelGraph]]) -> list[KernelGraph]:
    """``variants`` (graph key -> (cost key, order, graph)) by cost key, one per kernel shape
    before a second of any: the order an estimate prices them in (the first
    :data:`SHORTLIST` ``× limit``)."""
    first, rest = one_per_shape([h for _, _, h in sorted(variants.values(), key=lambda v: v[:2])], key=kernel_shape)
    return first + rest


def _price(estimate: Callable[[KernelGraph], float], g: KernelGraph) -> Optional[float]:
    """``estimate(g)``, None where it fails (``g`` is outside what the lowering prices): a
    price is a preference, never a reason to fail the search."""
    try:
        return float(estimate(g))
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _by_estimate(graphs: list[KernelGraph], estimate: Callable[[KernelGraph], float],
                 end: Optional[float], stats: Optional[dict] = None,
                 phase: str = "") -> tuple[list[KernelGraph], int]:
    """``graphs`` (ranked by ``cost_key``) ranked by ``estimate``, and how many were
    priced; those not priced by ``end`` (monotonic; None: no limit) follow, in their order
    (noted as ``phase`` cut in ``stats``, where given: :func:`note_cut`).

    Why: ``cost_key`` prices a block as written; the lowering sub-tiles a block's rows
    over several programs and splits its loop itself, so the key under-rates few wide
    blocks. gqa b=1's split variants (788 of 256 matches; 2026-11-27): the pair of 128
    blocks × 64 rows over 256 keys each, with an 8-block combine — the hand-written
    reference's kernels once lowered; 5.4 μs on an H200 — was 25th by the key and 7th by
    the lowering's model, the key's first (64x4 + 16x4, 8.5 μs) 33rd by the model. An
    ``estimate`` that fails on a graph (it is outside what the lowering prices) leaves that
    graph at the back, in key order."""
    priced: list[tuple[float, int, KernelGraph]] = []
    unpriced: list[KernelGraph] = []
    longest = 0.0  # one price takes 0.1-0.2 s (the lowering tunes each kernel's configs):
    late = False
    for i, g in enumerate(graphs):  # the next is not started when the longest so far would end past `end`
        if end is not None and time.monotonic() + longest > end:
            unpriced.append(g)
            late = True
            continue
        t0 = time.monotonic()
        p = _price(estimate, g)
        if p is None:
            unpriced.append(g)
        else:
            priced.append((p, i, g))
        longest = max(longest, time.monotonic() - t0)
    if late and stats is not None:
        note_cut(stats, phase)
    return [g for _, _, g in sorted(priced, key=lambda x: x[:2])] + unpriced, len(priced)


#: the cheapest matches whose kernels :func:`retiles` offers on other tiles
MAX_RETILE_SOURCES = 8


def retiles(graphs: list[KernelGraph], stats: dict, deadline: Optional[float] = None, limit: int = 4,
            estimate: Optional[Callable[[KernelGraph], float]] = None,
            smem_budget: Optional[int] = None) -> list[Proposal]:
    """Tile variants (:func:`near_tilings`: a loop's step up to two doublings or halvings
    away; a loop-free kernel with a loop introduced, :func:`~search.loops.loop_variants`; a
    one-block kernel spread over a grid, :func:`~search.grids.grid_variants`) of the :data:`MAX_RETILE_SOURCES`
    first of ``graphs`` (matches, cheapest first): ranked by ``estimate`` where given (else
    by :func:`~search.enumerate.cost_key`), one per kernel shape before a second spelling of
    any, the ``limit`` first proposed; tiles beyond ``smem_budget`` (the search's) are not
    offered.

    Proposed without a fingerprint: a retiled kernel computes its source's function wherever
    its steps add up, so the fingerprint would almost always match, and at full shapes it
    costs seconds the verification needs — the verifier decides each one. (A 2k-key prompt
    attention at head dim 128, H200, 60 s: 4 variants fingerprinted, 3 matched, none left
    time to be verified.)

    Why the variants: the enumeration reaches a kernel's other tilings slowly (each is
    another walk of the same ops), and the lowering cannot make them — it never changes a
    grid or cuts a loop step, and never re-chunks an online softmax's loop. That attention
    returned only 64-row tiles over 128-key steps (212–225 μs) where 64 × 64 and 128 × 128
    tiles of the same kernel ran 177 μs."""
    variants: dict[str, tuple[tuple, int, KernelGraph]] = {}

    def add(h: KernelGraph) -> None:
        k = graph_key(h)
        if k not in variants:
            variants[k] = (tuple(cost_key(h)), len(variants), h)

    for g in graphs[:MAX_RETILE_SOURCES]:
        if _past(deadline):
            note_cut(stats, "retile")
            break
        for h in near_tilings(g, smem_budget) + loop_variants(g, smem_budget) + grid_variants(g, smem_budget):
            add(h)
    if estimate is not None and variants:
        estimate = _remembered(estimate)
        end = None if deadline is None else time.monotonic() + max(0.0, deadline - time.monotonic()) * CLIMB_SHARE
        # from the shortlist the proposals' ranking prices, so those prices serve it again
        for h in climb(_key_order(variants)[:SHORTLIST * limit], estimate, end, smem_budget, stats):
            add(h)
    stats["retile_variants"] = len(variants)
    return _propose(variants, None, stats, "retile", "retile", deadline, limit, estimate)


#: tile steps :func:`climb` takes at most from the best priced tile variant
CLIMB_STEPS = 3
#: the share of the retile phase's remaining time the climb may price in (the proposals'
#: own ranking prices the rest, from the same remembered prices)
CLIMB_SHARE = 0.5


def climb(graphs: list[KernelGraph], estimate: Callable[[KernelGraph], float], end: Optional[float],
          smem_budget: Optional[int], stats: dict) -> list[KernelGraph]:
    """The tile variants (:func:`~search.rewrite.tile_variants`) reached by following the
    lowering's price downhill from the cheapest of ``graphs``: each step prices the current
    graph's variants and moves to the cheapest while it is cheaper than the current one, at
    most :data:`CLIMB_STEPS` steps and none started past ``end`` (monotonic; None: no
    limit). Returns the graphs it moved to, in order (empty when no variant is cheaper).

    Why: one step of tile variants halves or doubles one axis, and the best tiling can be
    two steps from any match. Phi-3-mini's one-query decode attention over 2,304 cache slots
    (32 heads, head dim 96): the enumeration's 256-key steps price at 21.3 μs, 128-key steps
    at 14.9, 64-key steps at 14.7; on an H200 the 64-key steps ran 10.6 μs (split-K 4 by the
    lowering), the 128-key ones 14.1, its SDPA 13.2 — and the 64-key form was two steps away.
    A price that fails (outside what the lowering prices) counts as no better."""
    def price(h: KernelGraph) -> float:
        p = _price(estimate, h)
        return float("inf") if p is None else p

    # the starting point is priced in the first half of the time, the steps in the rest
    half = None if end is None else time.monotonic() + max(0.0, end - time.monotonic()) / 2
    priced = []
    for g in graphs:
        if _past(half):
            note_cut(stats, "climb")
            break
        priced.append((price(g), len(priced), g))
    stats["retile_climbed"] = 0
    if not priced:
        return []
    here_price, _, here = min(priced, key=lambda x: x[:2])
    path: list[KernelGraph] = []
    for _ in range(CLIMB_STEPS):
        best: Optional[tuple[float, KernelGraph]] = None
        for h in tile_variants(here, smem_budget):
            if _past(end):
                note_cut(stats, "climb")
                break
            p = price(h)
            if p < here_price and (best is None or p < best[0]):
                best = (p, h)
        if best is None:
            break
        here_price, here = best
        path.append(here)
    stats["retile_climbed"] = len(path)
    return path


#: a seed's tile variant is verified before the seeds only when priced below this factor of
#: the cheapest seed (the price ranks close tilings no better than chance: design §7.10)
VARIANT_MARGIN = 0.8


@dataclass
class SeedOrder:
    """The seeds and their tile variants in the order a search verifies them (``graphs``), and
    the remembered price they were ranked by (None: no price given) — for :meth:`near_ties`."""

    graphs: list[KernelGraph]
    price: Optional[Callable[[KernelGraph], float]] = None
    smem_budget: Optional[int] = None

    def near_ties(self, proven: KernelGraph, end: Optional[float], stats: dict) -> list[KernelGraph]:
        """What to verify beside ``proven`` (the first of :attr:`graphs` proven), so that the
        GPU's timing, not the price, chooses among tilings the price cannot tell apart: the
        graphs of the order and ``proven``'s near tilings (:func:`near_tilings`) priced within :data:`NEAR_TIE`
        of it, at most :data:`NEAR_TIES` — those whose loops step differently from
        ``proven``'s first (the lowering sub-tiles a block's rows itself but never cuts or,
        for a running max, merges a step, so only the μGraph offers another step), each group
        cheapest first. Prices are computed until ``end`` (monotonic; None: no limit).

        Why: the price ranks close tilings no better than chance (design §7.10). The causal
        8k-token prompt shipped a 64-row kernel stepping over 128 keys (1,012 μs on an H200,
        0.96× SDPA), priced 2 % below the same kernel over 64-key steps, which had run 876 μs."""
        if self.price is None:
            return []
        p0 = _price(self.price, proven)
        if p0 is None:
            return []
        key0, loops0 = graph_key(proven), _loops(proven)
        pool = {graph_key(g): g for g in self.graphs}
        for h in near_tilings(proven, self.smem_budget):
            pool.setdefault(graph_key(h), h)
        ties = []
        for k, g in pool.items():
            if k == key0 or _past(end):
                continue
            p = _price(self.price, g)
            if p is not None and p <= NEAR_TIE * p0:
                ties.append((_loops(g) == loops0, p, len(ties), g))
        ties.sort(key=lambda t: t[:3])
        stats["transfer_near_ties"] = len(ties)
        return [g for *_, g in ties[:NEAR_TIES]]


def near_tilings(g: KernelGraph, smem_budget: Optional[int]) -> list[KernelGraph]:
    """``g``'s tile variants (:func:`~search.rewrite.tile_variants`: each grid axis and loop
    doubled or halved) and, for those that change only a loop, that loop's step doubled or
    halved once more in the same grid: a seed two steps from the best step has it among its
    near ties. Why: a step is the one tile the lowering never changes (above), and the
    price tells neighbouring steps apart no better than it tells tilings apart. Phi-3-mini's
    decode attention over 8k keys (H200) was proven at 128-key steps, its 64-key variant
    shipped (32.7 μs, torch 33.2), and the 32-key steps that run 30.6 were never offered."""
    def grids(h: KernelGraph) -> tuple:
        return tuple(s[0] if isinstance(s, tuple) else s for s in kernel_shape(h))

    first = tile_variants(g, smem_budget)
    out = {graph_key(h): h for h in first}
    for h in first:
        if grids(h) == grids(g):
            for v in tile_variants(h, smem_budget):
                if grids(v) == grids(g):
                    out.setdefault(graph_key(v), v)
    out.pop(graph_key(g), None)
    return list(out.values())


#: a graph priced within this factor of a proven seed is one the price cannot tell from it
#: (the re-ranking's own spread is 1.3, ``mugraph.pipeline.timing.SPREAD``; within one μGraph
#: the model's favourite configuration was up to 21 % slower than the best, ``lower.calibration``)
NEAR_TIE = 1.1
#: how many near ties of a proven seed are verified beside it (each a full verification of
#: the candidate's side: seconds at an 8k-token prompt's size)
NEAR_TIES = 2


def _loops(g: KernelGraph) -> tuple:
    """The loop lengths of ``g``'s kernels, in order (``kernel_shape``'s loop part)."""
    return tuple(s[1] if isinstance(s, tuple) else s for s in kernel_shape(g))


def seed_order(seeds: Sequence[KernelGraph], estimate: Optional[Callable[[KernelGraph], float]],
               end: Optional[float], smem_budget: Optional[int], stats: dict) -> SeedOrder:
    """The order a search verifies its seeds in (``search.driver._verify_seeds``). With a price
    (``estimate``, the lowering's): the tile variants reached by following it down from the
    cheapest seed (:func:`climb`) priced below :data:`VARIANT_MARGIN` × the cheapest seed's
    price, cheapest first; then the seeds, cheapest first; then the other variants — all priced
    until ``end`` (monotonic; those not priced by then follow in ``cost_key`` order). Without a
    price: the seeds by :func:`~search.enumerate.cost_key`. Counts go to ``stats``.

    Why: a seed is carried from another size tile for tile (:mod:`search.transfer`), and a
    tile that suited the smaller size can be far from the best at this one. A causal
    8k-token prompt attention's scout, at 512 tokens, found kernels stepping over 8 keys a
    loop step; carried up they loop 1,024 times, and the first one proven (75 s at 8k on an
    H200) shipped at 0.42× SDPA. Its variants of longer steps are the same kernel on other
    tiles — verified from scratch like every seed, and ranked with them by price. The margin:
    a tiling measured best at the other size is kept over one the price barely prefers
    (Phi-3-mini's decode attention: 32-key steps priced 37.1 μs against 36.6 for 64-key
    steps, measured 30.0 against 34.8 on an H200)."""
    by_key = sorted(seeds, key=cost_key)
    if estimate is None or not by_key:
        return SeedOrder(by_key)
    price = _remembered(estimate)
    seen = {graph_key(g) for g in by_key}
    fresh = list({k: h for h in climb(by_key, price, end, smem_budget, stats)
                  if (k := graph_key(h)) not in seen}.values())
    ranked, priced = _by_estimate(by_key + fresh, price, end, stats, "transfer")  # the priced first, cheapest first
    stats["transfer_priced"], stats["transfer_variants"] = priced, len(fresh)
    variant = [any(g is h for h in fresh) for g in ranked]
    seed_prices = [price(g) for g, v in zip(ranked[:priced], variant) if not v]  # remembered
    if not seed_prices:
        return SeedOrder(ranked, price, smem_budget)
    bar = VARIANT_MARGIN * min(seed_prices)

    def group(i: int) -> int:  # 0: a variant clearly cheaper than every seed; 1: a seed; 2: the rest
        if not variant[i]:
            return 1
        return 0 if i < priced and price(ranked[i]) < bar else 2
    return SeedOrder([ranked[i] for i in sorted(range(len(ranked)), key=lambda i: (group(i), i))], price, smem_budget)


def _remembered(estimate: Callable[[KernelGraph], float]) -> Callable[[KernelGraph], float]:
    """``estimate`` remembering its prices by graph (:func:`~search.rewrite.graph_key`), so a
    graph the climb priced is not priced again by the proposals' ranking (0.1–0.2 s each at
    full shapes). A failure is not remembered: it raises again, as the caller expects."""
    seen: dict[str, float] = {}

    def remembered(g: KernelGraph) -> float:
        k = graph_key(g)
        if k not in seen:
            seen[k] = estimate(g)
        return seen[k]
    return remembered
