"""Partition: the captured graph cut into Lax pieces and library ops (docs/design.md §10.3).

A *piece* is a set of mapped, Lax nodes that (1) is connected through its own
edges, (2) has at most one exponentiation on any path inside it, and (3) can run
as one call: contracting every piece to a single node leaves the graph acyclic.

The algorithm is Mirage's greedy growth of Lax subprograms, made safe for
stitching: visit the nodes in topological order; a Lax node joins the union of the
pieces of its Lax producers if the union still satisfies (1)–(3), else the largest
one of them that does, else it starts a piece. Non-Lax and unmapped nodes
(indexing, comparisons, casts to integers) are library ops between pieces; a safe
softmax's ``amax`` is a free shift (design §3.3), inside its piece. Pieces larger
than the size limits are cut on their cheapest edges, never inside a softmax's core
(:func:`softmax_cores`). Pieces with fewer than ``min_ops`` catalog ops, or only
data movement (reshapes, concats), are not worth a search and go back to torch.

What it optimizes: the size of each piece — the μGraph search can only fuse what
one piece holds — subject to the Lax rule the verifier needs. It is local and
greedy, and so is its cycle check (:func:`_closes_cycle` walks the region a new
cycle could pass, not the graph: a deep model's partition grows with its depth,
not its square). SOUFFLE's global analysis partitions by data reuse across the
whole program instead; here the cut points are forced by the Lax rule, not chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.fx as fx

from ..core.ops import CATALOG, Category, category, is_contraction, is_elementwise, is_rearrangement, lax_classes
from .aten import CAST_DTYPES, VIEW_OPS
from .capture import NodeInfo, slice_span, slices_meet



@dataclass(eq=False)
class Piece:
    """Nodes of one Lax subprogram, in graph order; ``views``: the views at its boundary
    that were folded off it (:func:`fold_views`) and run as torch views instead."""

    nodes: list[fx.Node] = field(default_factory=list)
    views: list[fx.Node] = field(default_factory=list)

    def num_ops(self, info: dict[fx.Node, NodeInfo]) -> int:
        return sum(info[n].num_ops for n in self.nodes)

    def worth(self, info: dict[fx.Node, NodeInfo], min_ops: int) -> bool:
        if min_ops == 0:  # everything (tests of the mapping)
            return True
        # data movement (the catalog's rearrangements, casts built as the identity) is free:
        # a lone element-wise op with its reshapes is not worth a search, nor a lone matmul
        # a library GEMM runs near its best — but a skinny one is (:func:`skinny_product`)
        compute = [k for n in self.nodes for k in info[n].kinds if not is_rearrangement(k)]
        if len(compute) >= min_ops:
            return True
        return len(compute) == 1 and is_contraction(compute[0]) and _holds_skinny_product(self.nodes, info)


#: a lone product is searched when it has at most this many rows (a decode step's 1–64 new
#: tokens) ...
SKINNY_ROWS = 64
#: ... and its other operand at least this many elements (a 1024 × 1024 weight: 2 MB in
#: bf16, a microsecond of the copy floor and more)
SKINNY_MIN_WEIGHT = 1 << 20


def skinny_product(node: fx.Node) -> bool:
    """Whether ``node``'s matmul multiplies a few rows by a large operand: a projection of a
    decode step. A library GEMM is tuned for large products; on these it leaves bandwidth
    unused (cuBLAS moved a 3072 × 3072 bf16 weight at 1.7 TB/s of an H200's 4.8, with a
    split-K reduce of its own, where a searched GEMV kernel reached 2.4), so a lone one is
    worth a search — the v projection that the norm's piece leaves out (it holds two
    matmuls), a projection whose output a norm reads whole. Whether the answer ships is the
    never-slower rule's timing, as for every piece."""
    ins = [a.meta.get("val") for a in node.all_input_nodes]
    out = node.meta.get("val")
    if out is None or len(ins) < 2 or any(not isinstance(t, torch.Tensor) for t in (*ins, out)) or out.dim() < 2:
        return False
    rows = out.numel() // max(1, out.shape[-1])
    return rows <= SKINNY_ROWS and max(t.numel() for t in ins) >= SKINNY_MIN_WEIGHT


def _holds_skinny_product(nodes: Any, info: dict[fx.Node, NodeInfo]) -> bool:
    return any(skinny_product(n) for n in nodes if _contracts(info[n]))


def _exp_ok(members: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> bool:
    """At most one exponentiation on any path inside ``members`` (walked in graph order:
    fx nodes sort topologically)."""
    if sum(info[n].exps for n in members) <= 1:  # no path holds more than all of them: nothing to walk
        return True
    depth: dict[fx.Node, int] = {}
    for n in sorted(members):
        d = info[n].exps + max((depth[a] for a in n.all_input_nodes if a in depth), default=0)
        if d > 1:
            return False
        depth[n] = d
    return True


def _closes_cycle(merged: set[fx.Node], group: dict[fx.Node, Any], members: dict[Any, set[fx.Node]],
                  walk: Callable[[fx.Node], bool]) -> bool:
    """Whether contracting ``merged`` to one node would close a cycle in a graph whose
    groups (``group`` maps a node to its group, ``members`` a group to its nodes) are
    already contracted — that graph being acyclic, a new cycle leaves ``merged`` and comes
    back. Walked forward from ``merged``'s users; a group reached is entered at all its
    members (contracted, they are one node). Only nodes ``walk`` admits are walked: its
    caller knows that no path through the others returns (:func:`_grow`, :func:`_cut`), so
    the walk stays local and the partition of a deep model does not pay its depth per node."""
    todo = [u for m in merged for u in m.users if u not in merged]
    seen: set[fx.Node] = set()
    while todo:
        v = todo.pop()
        if v in merged:
            return True
        if v in seen or not walk(v):
            continue
        g = group.get(v)
        same = members[g] if g is not None else (v,)
        seen.update(same)
        todo += [u for w in same for u in w.users if u not in seen]
    return False


def _grow(order: list[fx.Node], info: dict[fx.Node, NodeInfo], refused: set[fx.Node],
          max_ops: int | None = None) -> list[set[fx.Node]]:
    """Greedy growth of Lax pieces (the module doc); nodes in ``refused`` stay outside.

    A node with products inside that has ``max_ops`` catalog ops or more (an attention: its
    whole softmax in one node) fills a piece alone: once it joins a piece, no later node
    joins that piece. Its ops would be cut from any that did, and a piece grown through it
    carries its exponential downstream — the output projection's piece, reached through
    the element-wise op between them, could then not take the gated MLP's SiLU (a second
    exponential on one path), and the layer's last three projections were cut apart
    differently. An element-wise node as large (a GeLU-tanh) stays open: what follows it
    (the gate's product with the up projection) belongs with it."""
    group: dict[fx.Node, int] = {}
    members: dict[int, set[fx.Node]] = {}
    closed: set[int] = set()
    next_id = 0
    for n in order:
        i = info.get(n)
        if i is None or not (i.mapped and i.lax) or n in refused:
            continue
        producers = sorted({group[a] for a in n.all_input_nodes if a in group and group[a] not in closed},
                           key=lambda g: -len(members[g]))
        choices = ([producers] if len(producers) > 1 else []) + [[g] for g in producers] + [[]]
        for gs in choices:
            merged = set().union(*(members[g] for g in gs)) | {n}
            if not _exp_ok(merged, info):
                continue
            # nothing after n is in a piece yet: a path past n never jumps back and never returns
            if len(merged) > 1 and _closes_cycle(merged, group, members, lambda v: v < n):
                continue
            target = gs[0] if gs else next_id
            if not gs:
                next_id += 1
            for g in gs:
                members.pop(g, None)
            members[target] = merged
            for m in merged:
                group[m] = target
            if max_ops is not None and i.num_ops >= max_ops and _contracts(i):
                closed.add(target)
            break
    return [m for _, m in sorted(members.items())]


def _bytes(n: fx.Node) -> int:
    v = n.meta.get("val")
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def _moves(kinds) -> bool:
    """Whether a node of these catalog ``kinds`` only moves its value: a view, or a float cast
    (no kinds at all)."""
    return all(is_rearrangement(k) for k in kinds)


def _size(nodes, info: dict[fx.Node, NodeInfo]) -> tuple[int, int]:
    """(catalog ops, matmuls) of a set of nodes, as hard to search as they make a piece.
    Constants are not counted: the search hands a program's constants to every block graph
    as operands, outside its op budget (an RMSNorm's epsilon, ``rsqrt``'s 1). The
    element-wise ops that compute a function of *one* value — an activation written out,
    GeLU's nine ops of ``x``; the ``scale, add, sqrt`` of a norm's sum — count as one op
    together: the compositional search builds such a chain as one element-wise kernel
    instead of searching it (``search.compose.pointwise_kernel``, design §6.8), so it costs
    the search what one op does. Without this a GeLU-gated MLP's gate and up projections
    (12 ops) never shared a piece, and no search could fuse them (Gemma-2B: each projection
    a piece of its own)."""
    members = set(nodes)
    sources: dict[fx.Node, frozenset] = {}  # element-wise node -> the values it is a function of
    unary: set[fx.Node] = set()  # values some element-wise chain of the set is a function of alone
    ops = mms = 0
    for n in sorted(members):
        kinds = [k for k in info[n].kinds if category(k) is not Category.CONSTANT]
        mms += kinds.count("matmul")
        moves = _moves(kinds)  # a view, or a float cast (no kinds)
        pointwise = not moves and all(is_elementwise(k) or is_rearrangement(k) for k in kinds)
        if moves or pointwise:  # the values it is a function of: through moves and pointwise ops
            src: set[fx.Node] = set()
            for a in n.all_input_nodes:
                src |= sources.get(a, {a}) if a in members else {a}
            sources[n] = frozenset(src)
            if pointwise and len(src) == 1:
                unary |= src
                continue
        ops += len(kinds)
    return ops + len(unary), mms


def _free_shift(i: NodeInfo) -> bool:
    """A node that computes a free shift (design §3.3) — a softmax's ``amax`` — and
    nothing else but rearrangements."""
    ops = [k for k in i.kinds if not is_rearrangement(k)]
    return bool(ops) and lax_classes(ops) == {"shift"}


def _contracts(i: NodeInfo) -> bool:
    return any(category(k) is Category.CONTRACTION for k in i.kinds)


def softmax_cores(piece: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> set[fx.Node]:
    """The nodes of ``piece`` between each free shift and the contractions around it: up
    from the shift through its scores' ops to the matmul that makes them, down through
    the exp, sum and division to the matmul that reads the probabilities (each walk stops
    at a contraction, which it includes). The size cut never cuts inside (:func:`_cut`):
    a cut there leaves a piece whose output depends on the max's value — ``exp(s − m)``,
    its sum — which the verifier cannot prove (design §3.3), and a written-out attention
    (matmul, softmax, matmul) stays one piece as an SDPA call does."""
    core: set[fx.Node] = set()
    for n in piece:
        if not _free_shift(info[n]):
            continue
        core.add(n)
        for step in (lambda m: m.all_input_nodes, lambda m: m.users):  # up, then down
            seen: set[fx.Node] = set()
            todo = [m for m in step(n) if m in piece]
            while todo:
                m = todo.pop()
                if m in seen:
                    continue
                seen.add(m)
                if not _contracts(info[m]):
                    todo += [x for x in step(m) if x in piece]
            core |= seen
    return core


def _reduced_row(n: fx.Node) -> int:
    """The length of the last dim a reduction node folds (its input's last dim, when its
    ATen call's ``dim`` — every dim when it names none — includes it), else 0."""
    x = n.args[0] if n.args else None
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(v, torch.Tensor) or v.ndim == 0:
        return 0
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    dims = range(v.ndim) if dims is None or dims == [] else [dims] if isinstance(dims, int) else dims
    return v.shape[-1] if (v.ndim - 1) in {d % v.ndim for d in dims} else 0


#: a product's output rows at most this long may share a piece with a reduction over them
#: (:func:`_reduces_product_rows`): one block's tile can hold such a row whole, so the search
#: can fuse the reduction as the product's epilogue. A decode projection's longer rows are
#: spread over ~100 blocks, as many as it takes to read its weight at the memory's speed.
ONE_BLOCK_ROW = 256


def _reduces_product_rows(members: set[fx.Node], info: dict[fx.Node, NodeInfo], core: set[fx.Node]) -> bool:
    """Whether ``members`` holds a reduction over the last dim (longer than
    :data:`ONE_BLOCK_ROW`) of a value computed, inside ``members``, from a contraction's
    output — a norm of a projection's output, outside a softmax's core (``core``: there the
    next contraction walks that dim as its loop).

    Why such a piece is cut: a skinny projection's μGraph spreads its output's columns over
    the grid's blocks, so a reduction over them needs every block's result — a second
    kernel and a third to apply it (Phi-3-mini's output projection, residual and RMSNorm
    shipped as 3 kernels, 2.4 μs of them small). The same reduction at the *consumer*
    projection is a prologue: each block reads the whole row it contracts and reduces it
    itself (the fused RMSNorm + projection kernels of design §7.13). Cut so, a whole
    model's pieces are its layers' pieces: the down projection and its residual in one,
    the next layer's norm with the projections that read it in the next; without the cut,
    the down projection, the norm and the next layer's QKV projection were one piece
    whose search and tuning overran their share, and which stayed torch code."""
    derived: set[fx.Node] = set()
    for n in sorted(members):
        kinds = info[n].kinds
        if any(category(k) is Category.CONTRACTION for k in kinds):
            derived.add(n)
            continue
        from_product = any(a in derived for a in n.all_input_nodes)
        if not from_product:
            continue
        derived.add(n)
        if (n not in core and any(category(k) is Category.REDUCTION for k in kinds)
                and _reduced_row(n) > ONE_BLOCK_ROW):
            return True
    return False


#: the most matmuls a part holds unless all of them project one activation
#: (:func:`_projections_of_one_activation`): past two, products that read each other's results
#: or different operands make the search's space deep (a SiLU-gated MLP with its down
#: projection), while siblings of one activation are one pass over it (an RMSNorm's q, k and
#: v projections: one kernel in 8.3 s of 2 CPU workers, where its q and k alone took 14.0)
MAX_MIXED_MATMULS = 2


def _source(n: fx.Node, info: dict[fx.Node, NodeInfo]) -> fx.Node:
    """The value ``n`` rearranges (through views and casts), or ``n`` itself."""
    while n in info and _moves(info[n].kinds) and len(n.all_input_nodes) == 1:
        n = n.all_input_nodes[0]
    return n


def _projections_of_one_activation(members: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> bool:
    """Whether every matmul of ``members`` reads one value in common (through views and
    casts) and none reads another's result within ``members``: projections of one
    activation, which one kernel computes in one pass over it."""
    mms = [n for n in members if _contracts(info[n])]
    common = set.intersection(*({_source(a, info) for a in n.all_input_nodes} for n in mms)) if mms else set()
    if not common:
        return False
    made = set(mms)
    for n in mms:  # no product downstream of another inside the part
        todo, seen = [u for u in n.users if u in members], set()
        while todo:
            u = todo.pop()
            if u in made:
                return False
            if u not in seen:
                seen.add(u)
                todo += [v for v in u.users if v in members]
    return True


def _breaks(members: set[fx.Node], info: dict[fx.Node, NodeInfo], core: set[fx.Node],
            max_ops: int | None, max_matmuls: int | None) -> bool:
    """Whether ``members`` cannot be one part of a cut: more catalog ops or matmuls than the
    limits allow (:func:`_size`; past :data:`MAX_MIXED_MATMULS` only projections of one
    activation), or a reduction over a product's rows (:func:`_reduces_product_rows`)."""
    ops, mms = _size(members, info)
    too_many = max_matmuls is not None and (
        mms > max_matmuls or (mms > MAX_MIXED_MATMULS and not _projections_of_one_activation(members, info)))
    return (max_ops is not None and ops > max_ops) or too_many or _reduces_product_rows(members, info, core)


def _cut(piece: set[fx.Node], info: dict[fx.Node, NodeInfo],
         max_ops: int | None, max_matmuls: int | None) -> list[set[fx.Node]]:
    """``piece`` cut into parts of at most ``max_ops`` catalog ops and ``max_matmuls``
    matmuls (§10.3): every node starts alone; the piece's internal edges, heaviest
    first (bytes of the value carried, ties in graph order), merge the parts at their
    ends while the merged part keeps to the limits and the contracted graph stays
    acyclic. The edges left uncut are the heaviest, so the cut ones are the cheapest:
    a matmul keeps the element-wise/reduction work next to it (its normalized input, its
    activation, its residual add), and two matmuls meet only within ``max_matmuls``."""
    core = softmax_cores(piece, info)
    if not _breaks(piece, info, core, max_ops, max_matmuls):
        return [piece]
    # a part is named by a node of it (fx nodes sort in graph order)
    group: dict[fx.Node, fx.Node] = {n: n for n in piece}
    part: dict[fx.Node, set[fx.Node]] = {n: {n} for n in piece}
    d = piece_dtype(piece)

    def atomic(a: fx.Node, n: fx.Node) -> bool:
        """Never cut: a float32 region between an upcast and its downcast (a cut inside it
        would move a float32 value between parts and break the cast rule), and a softmax's
        core (:func:`softmax_cores`). Such edges merge first, whatever the limits."""
        return (d is not None and d != "float32" and _dtype(a) == "float32") or (a in core and n in core)

    edges = sorted(((a, n) for n in piece for a in n.all_input_nodes if a in piece),
                   key=lambda e: (not atomic(*e), -_bytes(e[0]), e[0], e[1]))
    for a, n in edges:
        ga, gn = group[a], group[n]
        if ga == gn:
            continue
        merged = part[ga] | part[gn]
        if _breaks(merged, info, core, max_ops, max_matmuls) and not atomic(a, n):
            continue
        # the piece contracted whole is acyclic with every other piece: a path
        # leaving it never comes back, so only the piece's own nodes are walked
        if _closes_cycle(merged, group, part, lambda v: v in piece):
            continue
        for m in part[gn]:
            group[m] = ga
        part[ga] = merged
        del part[gn]
    _sink_into_consumers(part, group, info, core, max_ops, max_matmuls)
    return [part[k] for k in sorted(part) if part[k]]


def _sink_into_consumers(part: dict[fx.Node, set[fx.Node]], group: dict[fx.Node, fx.Node],
                         info: dict[fx.Node, NodeInfo], core: set[fx.Node],
                         max_ops: int | None, max_matmuls: int | None) -> None:
    """Move each element-wise operand of a reduction into the reduction's part when all its
    users lie there (last nodes first, where the limits allow): its value then never leaves
    one part only to be reduced in the next. Why: the cut merges equal-byte edges in graph
    order, so the ``x²`` of a norm whose sum :func:`_reduces_product_rows` keeps from the
    producer's part stayed there, an output of its own (a float32 norm: a narrower one's
    float32 core moves as one, :func:`_cut`'s ``atomic``). A product's own epilogue (an op
    reading the product in its part: the residual add) stays, else the product would be
    left alone, to the library. The move closes no cycle — every user of the node is in the
    part it joins, which the part it leaves already fed."""
    def epilogue(n: fx.Node) -> bool:
        return any(a in part[group[n]] and _contracts(info[a]) for a in n.all_input_nodes)

    def reduced(n: fx.Node) -> bool:
        return any(u in info and any(category(k) is Category.REDUCTION for k in info[u].kinds) for u in n.users)

    for n in sorted(group, reverse=True):
        kinds = info[n].kinds
        if (n in core or info[n].cast or not kinds or epilogue(n) or not reduced(n)
                or not all(category(k) in (Category.UNARY, Category.BINARY) for k in kinds)):
            continue
        to = {group.get(u) for u in n.users}
        if len(to) != 1 or None in to or group[n] in to:
            continue
        (q,) = to
        merged = part[q] | {n}
        if _breaks(merged, info, core, max_ops, max_matmuls):
            continue
        part[group[n]].discard(n)
        part[q] = merged
        group[n] = q


def fold_views(members: set[fx.Node], info: dict[fx.Node, NodeInfo]
               ) -> tuple[set[fx.Node], set[fx.Node]]:
    """``members`` without the views at the piece's boundary, and those views.

    A torch view (``NodeInfo.view``: a transpose, ``view``, ``unsqueeze``, a slice, …)
    whose tensor inputs all lie outside the piece — or, for a view that keeps every
    element (not a slice: the piece would compute what it drops), whose users all do —
    is left to torch:
    the piece then reads the view itself as an input — the runtime passes it with its
    strides and the lowering loads through them (``lower.compile(input_strides=)``),
    so a weight's transpose costs no copy — or writes the tensor the view is of. Its
    Program then says ``X @ W`` where the capture said ``X @ permute(W)``, and no
    ``reshape`` whose only input is a piece input: ops the search would have had to
    place (it never generates a ``reshape``; a ``permute`` only as a kernel op of its
    own). Repeated to a fixpoint (a transpose of a view of an input goes too).
    Folding never makes the contracted graph cyclic: a folded view's producers are
    outside the piece and not after it (they fed it), or its users are."""
    members = set(members)
    folded: set[fx.Node] = set()
    changed = True
    while changed:
        changed = False
        for n in sorted(members):
            if not info[n].view:
                continue
            if (all(a not in members for a in n.all_input_nodes)
                    or (info[n].view == "view" and all(u not in members for u in n.users))
                    or (info[n].view == "select" and _covering_slices(n, members))):
                members.discard(n)
                folded.add(n)
                changed = True
    return members, folded


def _covering_slices(n: fx.Node, members: set[fx.Node]) -> bool:
    """Whether ``n`` is one of slices along one dim that are all its input's readers, read
    only outside ``members``, and together keep every element: the piece then writes the
    whole value and the slices cut it as torch views, computing nothing they drop (a fused
    projection's q, k and v, :func:`.capture.fold_column_slices`)."""
    src = n.args[0] if n.args else None
    val = src.meta.get("val") if isinstance(src, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.ndim == 0:
        return False
    spans, dims = [], set()
    for r in src.users:
        span = slice_span(r)
        if span is None or any(u in members for u in r.users):
            return False
        dims.add(span[1])
        spans.append(span[2:])
    covered = 0
    for start, end in sorted(spans):
        if start > covered:
            return False
        covered = max(covered, end)
    return len(dims) == 1 and covered >= val.shape[dims.pop()]


def _parts_of_products(order: list[fx.Node]) -> set[fx.Node]:
    """The slices that cut a product (a matmul's, through views) into parts covering it, read
    apart (:func:`.capture.slices_meet`): q, k and v of a fused projection
    (:func:`.capture.fold_column_slices` leaves them as slices). They stay outside every
    piece, as torch views of the product the piece before them writes whole: inside, the
    piece would hold slices no block graph spells — the projection's piece grew through q's
    slice into its RoPE and could not be searched (Phi-3-mini)."""
    out: set[fx.Node] = set()
    seen: set[fx.Node] = set()  # the values whose slices were looked at (each once)
    for n in order:
        if n.op != "call_function" or n.target != torch.ops.aten.slice.Tensor or n.args[0] in seen:
            continue
        seen.add(n.args[0])
        src = n.args[0]
        while isinstance(src, fx.Node) and src.op == "call_function" and src.target in VIEW_OPS:
            src = src.args[0]
        parts = list(n.args[0].users)
        if isinstance(src, fx.Node) and src.op == "call_function" and _contracting(src) \
                and _covering_slices(n, set()) and not slices_meet(parts):
            out |= set(parts)
    return out


def _contracting(n: fx.Node) -> bool:
    """A matrix product (what a projection traces as)."""
    return n.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
                        torch.ops.aten.matmul.default)


def _layout_changes_of_computed(members: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> set[fx.Node]:
    """The nodes of ``members`` that change the layout of a value another member computed in
    a way the search never generates (a reshape, a concat: ``search.proposals.generated``)."""
    from search.proposals import generated

    def changes_layout(kind: str) -> bool:  # a constant (arity 0) reads nothing
        return not generated(kind) and CATALOG[kind].arity != 0

    return {n for n in members
            if any(changes_layout(k) for k in info[n].kinds) and any(a in members for a in n.all_input_nodes)}


def _split_off_projections(members: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> list[set[fx.Node]]:
    """``members`` cut at its layout changes of computed values when it holds a skinny
    product: the projection's part and the rest, the changes left to torch between them
    (views, a concat). Why: a piece holding such a change has no μGraph but its program op
    by op and is not searched (``run.unsearched``), so a projection with a bias, viewed into
    heads and rotated in one piece (Phi-2's, StarCoder2's q and k: no norm's piece takes
    them, the LayerNorm before them being a piece of its own) stayed a library GEMV. Cut,
    the projection is a piece the search fuses its bias into. Kept whole when the cut parts
    would form a cycle once contracted."""
    cut = _layout_changes_of_computed(members, info)
    if not cut or not _holds_skinny_product(members, info):
        return [members]
    parts = _components(members - cut)
    where = {n: i for i, c in enumerate(parts) for n in c}
    # a path between two parts runs through the cut nodes inside ``members`` (none leaves
    # it and comes back: ``members`` was a valid piece), so the parts' order is read there
    edges: dict[Any, set] = {}
    for n in members:
        src = where.get(n, n)
        for u in n.users:
            if u in members:
                dst = where.get(u, u)
                if dst != src:
                    edges.setdefault(src, set()).add(dst)
    state: dict[Any, int] = {}

    def cyclic(v: Any) -> bool:
        state[v] = 1
        for w in edges.get(v, ()):
            if state.get(w) == 1 or (w not in state and cyclic(w)):
                return True
        state[v] = 2
        return False

    if any(v not in state and cyclic(v) for v in list(edges)):
        return [members]
    return parts


def _fed_by(members: set[fx.Node], start: Callable[[fx.Node], bool]) -> set[fx.Node]:
    """The nodes of ``members`` for which ``start`` holds, and those that read one of them,
    inside ``members``, however indirectly (walked in graph order: fx nodes sort
    topologically)."""
    fed: set[fx.Node] = set()
    for n in sorted(members):
        if start(n) or any(a in fed for a in n.all_input_nodes):
            fed.add(n)
    return fed


def _contractions_after_exp(members: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> set[fx.Node]:
    """The contractions of ``members`` that read, inside ``members``, a value an
    exponentiation made (``exp``, ``silu``, a tanh GeLU written with ``exp``), outside a
    softmax's core (:func:`softmax_cores`: the matmul that reads the probabilities stays with
    them)."""
    core = softmax_cores(members, info)
    tainted = _fed_by(members, lambda n: info[n].exps > 0)
    return {n for n in members - core
            if _contracts(info[n]) and any(a in tainted for a in n.all_input_nodes)}


def _cut_unprovable(members: set[fx.Node], info: dict[fx.Node, NodeInfo],
                    provable: Callable[[set[fx.Node]], bool] | None) -> list[set[fx.Node]]:
    """``members`` cut before the contractions that read an exponentiation's values, when the
    verifier could prove no μGraph of it (``provable(members)`` false) — and kept whole when
    it could, or when nothing is cut so.

    Why: a product that sums, along its contracted dim, values each divided by its own
    exponential — a tanh GeLU's or a sigmoid's ``x / (1 + exp(−u))`` between an MLP's two
    projections (GPT-2's, StarCoder2's) — is a rational function whose common denominator
    multiplies out one factor per summed element: 2¹²⁸ terms at a width of 128, and a
    per-test bound of 1 (design §4.6). No number of passing field tests proves such a piece,
    so its search could ship nothing (a μGraph that passed every test is set aside, by
    default) and took its share of the budget for it: StarCoder2-3B's MLP piece (15 ops)
    searched 16 s and shipped no μGraph. Cut, the first projection with its bias and
    activation (one division per output element: bound 1.7·10⁻⁵ at 3072 → 12288) and the
    second with its bias and residual are each provable, and each is a skinny product the
    search fuses its epilogue into. A softmax's division is not cut off its ``@ V``: its
    divisor is the same along the summed dim, and the verifier counts it once.

    The two parts are what lies above the cut contractions and what lies at or below them;
    every edge between them runs downward, and no path leaves ``members`` and comes back
    (it was a piece), so contracting them leaves the graph acyclic."""
    if provable is None:
        return [members]
    after = _contractions_after_exp(members, info)
    if not after or provable(members):
        return [members]
    below = _fed_by(members, after.__contains__)
    above = members - below
    if not above:
        return [members]
    return [c for part in (above, below) for c in _components(fold_views(part, info)[0])]


def _components(members: set[fx.Node]) -> list[set[fx.Node]]:
    """``members`` split into its connected parts (through edges between members). A fold
    can disconnect a piece (two ops that met only at a view of one input); each part is a
    piece of its own — no path outside the piece joins two of them, else the piece would
    have been on a cycle — and a smaller one for the search."""
    seen: set[fx.Node] = set()
    out = []
    for start in sorted(members, key=lambda n: n.name):
        if start in seen:
            continue
        comp, todo = set(), [start]
        while todo:
            n = todo.pop()
            if n in comp:
                continue
            comp.add(n)
            todo += [m for m in (*n.all_input_nodes, *n.users) if m in members and m not in comp]
        seen |= comp
        out.append(comp)
    return out


def _boundary_views(members: set[fx.Node], inside: set[fx.Node], info: dict[fx.Node, NodeInfo]) -> list[fx.Node]:
    """The mapped views outside every piece that feed ``members`` or read one of them,
    directly or through a chain of such views (a transpose of a transpose of an input), in
    graph order."""
    def free_view(n: fx.Node) -> bool:
        return n not in inside and n in info and info[n].mapped and info[n].view

    found: set[fx.Node] = set()
    for step in (lambda n: n.all_input_nodes, lambda n: n.users):  # upstream, then downstream
        todo = [a for m in members for a in step(m) if free_view(a)]
        while todo:
            n = todo.pop()
            if n not in found:
                found.add(n)
                todo += [a for a in step(n) if free_view(a)]
    return sorted(found)  # graph order (fx nodes sort by it), not a scan of the graph per piece


def _outside_inputs(members: set[fx.Node]) -> set[fx.Node]:
    return {a for n in members for a in n.all_input_nodes if a not in members
            and isinstance(a.meta.get("val"), torch.Tensor)}


def _dtype(n: fx.Node) -> str:
    return str(n.meta["val"].dtype).removeprefix("torch.")


def piece_dtype(members: set[fx.Node]) -> str | None:
    """The dtype a piece's Program runs at: the one dtype of its values, or with float
    casts inside it the narrow float dtype ``D`` — provided the cast rule holds (§10.3):
    its values are float32 and at most one narrower float dtype ``D``, and every value
    entering or leaving the piece has dtype ``D``. ``None`` when the rule fails."""
    inputs = _outside_inputs(members)
    dts = {_dtype(n) for n in members | inputs}
    if len(dts) == 1:
        return dts.pop()
    narrow = dts - {"float32"}
    if not dts <= set(CAST_DTYPES) or len(narrow) != 1:
        return None
    d = narrow.pop()
    leaving = {n for n in members if any(u not in members for u in n.users)}
    if any(_dtype(n) != d for n in inputs | leaving):
        return None
    return d


def _casts_to_refuse(members: set[fx.Node], info: dict[fx.Node, NodeInfo], only_culprits: bool = False
                     ) -> list[fx.Node]:
    """The casts a piece that breaks the cast rule gives up: the culprits — a narrowing cast
    reached from a float32 value entering the piece through float32 ops inside it, a widening
    cast whose float32 value reaches the piece's boundary the same way — or, where none is at
    fault, all its casts (``only_culprits``: none). Only the culprits go: a rotary table's
    cosine, scaled and narrowed once for every layer, must not take the first layer's norm
    casts with it, which would cut that norm from the projections that read it."""
    def f32(n: fx.Node) -> bool:
        return _dtype(n) == "float32"

    def walk(start: list[fx.Node], step: Callable[[fx.Node], Iterable[fx.Node]], culprit: Callable[[fx.Node], bool]
             ) -> set[fx.Node]:
        found, seen, todo = set(), set(), list(start)
        while todo:
            n = todo.pop()
            if n in seen or n not in members:
                continue
            seen.add(n)
            if info[n].cast and culprit(n):
                found.add(n)
            elif f32(n):
                todo += step(n)
        return found

    entering = [u for a in _outside_inputs(members) if f32(a) for u in a.users]
    leaving = [n for n in members if f32(n) and any(u not in members for u in n.users)]
    culprits = (walk(entering, lambda n: n.users, lambda n: not f32(n))
                | walk(leaving, lambda n: n.all_input_nodes, f32))
    if culprits or only_culprits:
        return sorted(culprits)
    return [n for n in members if info[n].cast]


def partition(graph: fx.Graph, info: dict[fx.Node, NodeInfo], min_ops: int = 2, max_ops: int | None = None,
              max_matmuls: int | None = None, provable: Callable[[set[fx.Node]], bool] | None = None
              ) -> list[Piece]:
    """The pieces worth a search, in graph order (see the module doc and §10.3): grown,
    cut to the size limits, cut where the verifier could prove none of a piece's μGraphs
    (``provable``: whether it could, asked only of a piece with a contraction after an
    exponentiation; :func:`_cut_unprovable`), and checked against the cast rule — a piece
    that breaks it gives up its casts (they become library ops) and the partition is redone."""
    order = list(graph.nodes)
    refused: set[fx.Node] = _parts_of_products(order)
    while True:
        # views at a grown piece's boundary are folded off before the size limits count
        # its ops, and again after the cut (a view next to a cut edge is at a boundary now)
        grown = [fold_views(m, info)[0] for m in _grow(order, info, refused, max_ops)]
        grown = [m for m in grown if m]
        # a grown piece's own culprits go before it is cut: a cut made around a cast that
        # will go anyway can split a norm's float32 region, and take its casts with it
        bad = {n for m in grown if piece_dtype(m) is None for n in _casts_to_refuse(m, info, only_culprits=True)}
        if bad:
            refused |= bad
            continue
        parts: list[set[fx.Node]] = []
        for m in grown:
            parts += _cut(m, info, max_ops, max_matmuls)
        parts = [c for m in parts for c in _components(fold_views(m, info)[0])]
        parts = [c for m in parts for c in _split_off_projections(m, info)]
        parts = [c for m in parts for c in _cut_unprovable(m, info, provable)]
        bad = {n for m in parts if piece_dtype(m) is None for n in _casts_to_refuse(m, info)}
        if not bad:  # (a piece without casts has one dtype: the builder's ops require it)
            break
        refused |= bad
    inside = set().union(*parts) if parts else set()
    pieces = [Piece(sorted(m), _boundary_views(m, inside, info)) for m in parts]
    pieces = [p for p in pieces if p.worth(info, min_ops)]
    pieces.sort(key=lambda p: p.nodes[0])  # graph order
    return pieces
