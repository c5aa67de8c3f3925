"""The candidates of a search run (:mod:`search.driver`): the enumeration's fingerprint
matches in DFS order, the graphs derived outside it (pieces, and in the *split-loop*
phase the split variants and the tile variants of the cheapest matches), ranked for the
verification."""

from __future__ import annotations

import time
from dataclasses import replace

from mugraph.core.serialize import graph_from_json, graph_to_json

from .derive import MAX_SPLIT_SOURCES, retiles, sequential, splits
from .enumerate import cost_key, signature
from .records import Match, Proposal
from .run_state import RunState

#: derived graphs rank after every enumerated match
DERIVED = 1 << 40
#: share of the time left that the split-loop phase's fingerprints may take (the rest verifies)
SPLIT_SHARE = 0.25


def collect_matches(state: RunState) -> list[Match]:
    """Every unit's matches, in DFS order whatever the splitting — by root task, then by
    the path of the node that found it (a node's own results before its children's) —
    then the derived graphs, which rank after every task's matches."""
    found = sorted(((state.units[u][0], tuple(m.get("path", ())), u, j), m)
                   for u, d in state.done.items() for j, m in enumerate(d.results))
    matches: list[Match] = [Match(tuple(m["cost"]), n, 0, m["graph"], m.get("sig", ""), "enumeration")
                            for n, (_, m) in enumerate(found)]
    for p in state.derived:  # derived graphs rank after every task's matches
        propose(matches, p)
    return matches


def propose(matches: list[Match], p: Proposal) -> None:
    """Append a derived graph, ranked after every match before it."""
    matches.append(Match(tuple(cost_key(p.graph)), DERIVED + len(matches), 0, graph_to_json(p.graph),
                         signature(p.graph), p.origin))


#: a field test's program evaluation at most this long (seconds, on average) makes a full
#: verification cheap enough to need no fingerprint first (:func:`verifications_cheap`)
CHEAP_TEST_S = 0.01


def verifications_cheap(state: RunState) -> bool:
    """Whether this search's verifications run here on a GPU and each field test's evaluation
    of the program took at most :data:`CHEAP_TEST_S` on average: then a split variant is
    proposed for verification without a fingerprint first, as a tile variant is — a split
    preserves the function by construction, the verifier decides either way, and the
    fingerprints only spend the split phase's share. Why: a Phi-3-mini RMSNorm + qkv piece on
    an H200 verified candidates in 16 ms each, but its split variants' fingerprints answered
    none in the 0.85 s left them, so the split kernel that ran 19.1 μs (the torch ops 21.8) was
    never proposed and the piece stayed torch code; in another run of the same piece one
    fingerprint finished and that kernel shipped. Where tests are slow (an 8k-token prompt:
    about a second each) the fingerprints still filter what the verification spends on."""
    if not (state.verify_here and state.checker.on_gpu()):
        return False
    s = state.checker.seconds_per_test()
    if s is not None:
        state.dstats["test_s"] = round(s, 4)
    return s is not None and s <= CHEAP_TEST_S


def split_loops(state: RunState, matches: list[Match]) -> None:
    """The split-loop phase: propose the split variants of the cheapest matches, and
    credit a match the lowering can split with its best split's estimate."""
    if not state.cfg.split_loops:
        return
    state.set_phase("split-loop")
    # every match may be split (a one-block-per-head kernel ranks low alone, yet splits
    # best); derive.splits ranks the variants and fingerprints 4 per split_sources
    top = sorted(range(len(matches)), key=lambda k: matches[k].key)[:MAX_SPLIT_SOURCES]
    srcs = [graph_from_json(matches[k].graph) for k in top]
    # fingerprints take seconds each at full shapes, a verification about ten times one
    # (qknorm_gqa b=8 on two cores: 2.9 s and 37 s, 30 field tests): at most a quarter of
    # what is left, so the verification, which every proposal needs, keeps room for one
    t_end = state.clock.t_end
    t0 = time.monotonic()
    end = None if t_end is None else t0 + max(0.0, t_end - t0) * SPLIT_SHARE
    # the split variants get half of that, the tile variants what is left: a few-block
    # match (a composed projection on a grid of one) is fixed by its tile variants, which
    # spread it over the grid, and a split phase that used the whole share had left them
    # none (a 4096 × 5120 projection's composed forms, split but not retiled, timed 253 μs
    # against 34.9 for the program)
    split_end = None if end is None else t0 + (end - t0) / 2
    best: dict[int, float] = {}
    fingerprint = None if verifications_cheap(state) else sequential(state.checker)
    state.dstats["split_unfingerprinted"] = fingerprint is None
    proposals = splits(srcs, fingerprint, state.dstats, split_end, limit=4 * state.cfg.split_sources,
                       best=best, estimate=state.estimate)
    # the lowering splits a kernel's loop itself (split-K, its partials summed by the last
    # block of each tile, no second launch): a kernel of few blocks and a long loop is worth
    # what its best split is, and verified in that rank (decode_h32 on two cores: the
    # lowering's best, 16 blocks looping 16 times, 7.3 μs, ranked behind split pairs of
    # 10.3 and was never verified)
    for i, est in best.items():
        m = matches[top[i]]
        if est < m.cost[1]:
            matches[top[i]] = replace(m, cost=(m.cost[0], est, *m.cost[2:]))
    state.dstats["split_credited"] = len(best)
    t1 = time.monotonic()
    # the cheapest kernels on other tiles, in the same share of the time (search.derive.retiles)
    proposals += retiles(srcs, state.dstats, end, limit=2 * state.cfg.split_sources, estimate=state.estimate,
                         smem_budget=state.cfg.smem_budget)
    # where the phase's time went: its share ends at `end`, and every step past it is one
    # the verification no longer has
    state.dstats["split_s"], state.dstats["retile_s"] = round(t1 - t0, 3), round(time.monotonic() - t1, 3)
    for p in proposals:
        propose(matches, p)
