"""Partition: the captured graph cut into Lax pieces and library ops (docs/design.md §10.3).

A *piece* is a set of mapped, Lax nodes that (1) is connected through its own
edges, (2) has at most one exponentiation on any path inside it, and (3) can run
as one call: contracting every piece to a single node leaves the graph acyclic.

The algorithm is Mirage's greedy growth of Lax subprograms, made safe for
stitching: visit the nodes in topological order; a Lax node joins the union of the
pieces of its Lax producers if the union still satisfies (1)–(3), else the largest
one of them that does, else it starts a piece. Non-Lax and unmapped nodes (the
``amax`` of a safe softmax, indexing, casts, slices) are library ops between
pieces. Pieces with fewer than ``min_ops`` catalog ops, or only data movement
(reshapes, concats), are not worth a search and go back to torch.

What it optimizes: the size of each piece — the μGraph search can only fuse what
one piece holds — subject to the Lax rule the verifier needs. It is local and
greedy (linear in the graph, up to the cycle check): SOUFFLE's global analysis
partitions by data reuse across the whole program instead; here the cut points
are forced by the Lax rule, not chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from ..ops import is_rearrangement
from .capture import NodeInfo



@dataclass(eq=False)
class Piece:
    """Nodes of one Lax subprogram, in graph order."""

    nodes: list[fx.Node] = field(default_factory=list)

    def num_ops(self, info: dict[fx.Node, NodeInfo]) -> int:
        return sum(info[n].num_ops for n in self.nodes)

    def worth(self, info: dict[fx.Node, NodeInfo], min_ops: int) -> bool:
        if min_ops == 0:  # everything (tests of the mapping)
            return True
        kinds = [k for n in self.nodes for k in info[n].kinds]
        # a piece that only moves data (the catalog's rearrangements) is not searched
        return len(kinds) >= min_ops and any(not is_rearrangement(k) for k in kinds)


def _exp_ok(members: set[fx.Node], order: list[fx.Node], info: dict[fx.Node, NodeInfo]) -> bool:
    depth: dict[fx.Node, int] = {}
    for n in order:
        if n in members:
            d = info[n].exps + max((depth[a] for a in n.all_input_nodes if a in depth), default=0)
            if d > 1:
                return False
            depth[n] = d
    return True


def _acyclic(group: dict[fx.Node, int], order: list[fx.Node]) -> bool:
    """Whether contracting each group (piece) to one node leaves a DAG."""
    index = {n: i for i, n in enumerate(order)}
    succ: dict[int, set[int]] = {}
    indeg: dict[int, int] = {}
    for n in order:
        g = group.get(n, -1 - index[n])
        indeg.setdefault(g, 0)
        for u in n.users:
            h = group.get(u, -1 - index[u])
            if h != g and h not in succ.setdefault(g, set()):
                succ[g].add(h)
                indeg[h] = indeg.get(h, 0) + 1
    ready = [g for g, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        g = ready.pop()
        seen += 1
        for h in succ.get(g, ()):
            indeg[h] -= 1
            if indeg[h] == 0:
                ready.append(h)
    return seen == len(indeg)


def partition(graph: fx.Graph, info: dict[fx.Node, NodeInfo], min_ops: int = 2) -> list[Piece]:
    """The pieces worth a search, in graph order (see the module doc)."""
    order = list(graph.nodes)
    group: dict[fx.Node, int] = {}
    members: dict[int, set[fx.Node]] = {}
    next_id = 0
    for n in order:
        i = info.get(n)
        if i is None or not (i.mapped and i.lax):
            continue
        producers = sorted({group[a] for a in n.all_input_nodes if a in group},
                           key=lambda g: -len(members[g]))
        choices = ([producers] if len(producers) > 1 else []) + [[g] for g in producers] + [[]]
        for gs in choices:
            merged = set().union(*(members[g] for g in gs)) | {n}
            if not _exp_ok(merged, order, info):
                continue
            target = gs[0] if gs else next_id
            trial = dict(group)
            for m in merged:
                trial[m] = target
            if gs and not _acyclic(trial, order):
                continue
            if not gs:
                next_id += 1
            for g in gs:
                members.pop(g, None)
            members[target] = merged
            group = trial
            break
    pieces = [Piece([n for n in order if n in m]) for _, m in sorted(members.items())]
    pieces = [p for p in pieces if p.worth(info, min_ops)]
    pieces.sort(key=lambda p: order.index(p.nodes[0]))
    return pieces
