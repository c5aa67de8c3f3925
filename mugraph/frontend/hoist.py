"""Views moved up and down through element-wise ops (docs/design.md §10.1).

A ``linear`` of a ``(batch, seq, hidden)`` activation traces as ``view`` to
``(batch·seq, hidden)``, ``mm``, ``view`` back. When the activation is computed by
element-wise ops — an RMSNorm's products — the first ``view`` sits between them and
the matmul, inside the piece, and the search never generates a ``reshape``: such a
piece had no candidate but itself. An element-wise op commutes with a view that only
regroups the *leading* dims (those in front of a common suffix), provided every operand
either spans those dims exactly or is broadcast along all of them:
``view(x · r, (b·s, h)) = view(x, (b·s, h)) · view(r, (b·s, 1))``; so does a reduction
that keeps its dims and folds only suffix dims (a norm's mean over the hidden dim). So
such a view is
moved above the op, onto its operands, again and again: it reaches the piece's inputs,
where the partition leaves it to torch (a view of an input, read in place), or stops at
an op that is not element-wise (a matmul). Only where every reader of the op is that
same view, so nothing is computed twice. The values are the same; every node keeps its
traced shape, dtype and strides (computed on the fake tensors as they are built).

The other way (:func:`sink_views`): a ``linear``'s view *back* to ``(b, s, out)`` read by
element-wise ops — the residual add after an output or down projection — sits between
the matmul and those ops, where no view can move above the matmul. It moves below each
such reader instead, the reader's other operands taking the inverse regrouping
(``view(m, (b, s, o)) + r = view(m + view(r, (b·s, o)), (b, s, o))``), again and again:
it reaches the piece's outputs, where the partition leaves it to torch, or meets the next
``linear``'s view and the two cancel. Only views of what no view moves above (a matmul, a
library op) move down, and only views that merge no dims (a ``linear``'s view back splits
them), so the two passes never undo each other: the view that flattens an attention's heads
for the output projection, moved above the element-wise op between them, stays there.
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

#: the views that regroup dims in row-major order (what a ``linear`` of a 3-d input traces)
_REGROUP = (aten.view.default, aten._unsafe_view.default)
#: reductions ``(x, dims, keepdim, …)``: a view passes one that keeps its dims and folds only
#: dims of the common suffix (a norm's mean over the hidden dim)
_REDUCE = (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default)


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def pointwise(n: fx.Node) -> bool:
    """An element-wise op (torch's own ``pointwise`` tag), or a plain dtype cast."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if n.target == aten._to_copy.default:  # a cast: ``type_as`` spells out the layout and the device
        src = _val(n.args[0]) if n.args else None
        return (set(n.kwargs) <= {"dtype", "layout", "device"}
                and n.kwargs.get("layout", torch.strided) == torch.strided
                and (n.kwargs.get("device") is None
                     or (isinstance(src, torch.Tensor) and _same_device(torch.device(n.kwargs["device"]), src.device))))
    return torch.Tag.pointwise in n.target.tags


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` alike: an index left out is the current device's."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _keepdim_reduction(n: fx.Node) -> bool:
    return (n.op == "call_function" and n.target in _REDUCE and len(n.args) >= 3 and n.args[2] is True
            and isinstance(n.args[1], (list, tuple)) and len(n.args[1]) > 0)


def _new_shape(shape: tuple, rank: int, k: int, p_in: tuple, p_out: tuple) -> tuple | None:
    """An operand's shape after the view moves above the op (the op's output has rank
    ``rank`` and a common suffix of ``k`` dims): unchanged when it has no leading dims,
    its suffix when it is broadcast along all of them, ``p_out`` + its suffix when it spans
    them as ``p_in``; None when neither. A suffix of no dims is ``(1,)``, not a 0-d
    scalar: the catalog's tensors have at least one dim, and a 0-d operand kept an
    element-wise op out of every piece (the attention's all-masked-row factor, multiplied
    into its output before the output projection's view, stayed torch code of its own)."""
    if len(shape) <= k:
        return shape
    full = (1,) * (rank - len(shape)) + tuple(shape)
    pre, suf = full[:rank - k], full[rank - k:]
    if all(d == 1 for d in pre):
        return suf or (1,)
    if pre == p_in:
        return tuple(p_out) + suf
    return None


def _leading(s_a: tuple, s_b: tuple) -> tuple[int, tuple, tuple]:
    """``(k, p_a, p_b)``: the length of the longest common suffix of two shapes, and the
    leading dims in front of it (what a row-major regrouping between them changes)."""
    k = 0
    while k < min(len(s_a), len(s_b)) and s_a[-1 - k] == s_b[-1 - k]:
        k += 1
    return k, s_a[:len(s_a) - k], s_b[:len(s_b) - k]


def _sub(x, m: dict):
    return m.get(x, x) if isinstance(x, fx.Node) else x


def _regrouped(e: fx.Node, rank: int, k: int, p_from: tuple, p_to: tuple, fixed: dict):
    """Element-wise (or suffix-reducing) op ``e``, of rank ``rank``, recomputed on operands
    regrouped from leading dims ``p_from`` to ``p_to`` (``k`` suffix dims kept);
    ``fixed`` maps an operand to the node that stands for it already (a view's source).
    Returns ``(args, shapes, vals, out)``: ``e``'s arguments (reduction dims counted from
    the end), each operand's new shape and fake value, and the result's fake value — built
    on the fake tensors first, so a view the strides do not allow, or an op torch refuses,
    leaves the graph as it was (None)."""
    args = list(e.args)
    if _keepdim_reduction(e):  # folds only suffix dims: the same fold of the regrouped operand
        dims = [d % rank for d in args[1]]
        if any(d < rank - k for d in dims) or (fixed and args[0] not in fixed):
            return None
        args[1] = [d - rank for d in dims]  # counted from the end: the same dims after the view
    shapes, vals = {}, {}
    for a in e.all_input_nodes:
        va = _val(a)
        if not isinstance(va, torch.Tensor):
            return None
        if a in fixed:
            shapes[a], vals[a] = tuple(_val(fixed[a]).shape), _val(fixed[a])
            continue
        new = _new_shape(tuple(va.shape), rank, k, p_from, p_to)
        if new is None:
            return None
        shapes[a] = new
    try:
        for a, sh in shapes.items():
            if a not in vals:
                vals[a] = _val(a) if tuple(_val(a).shape) == sh else aten.view.default(_val(a), list(sh))
        out = e.target(*[_sub(x, vals) for x in args], **{n: _sub(x, vals) for n, x in e.kwargs.items()})
    except Exception:  # noqa: BLE001 - torch refuses the view or the op: keep the graph
        return None
    if out.dtype != _val(e).dtype:
        return None
    return args, shapes, vals, out


def _rebuild(g: fx.Graph, e: fx.Node, plan, fixed: dict) -> tuple[fx.Node, list[fx.Node]]:
    """The nodes of a :func:`_regrouped` plan, at the graph's insertion point: ``e``
    recomputed, and the operand views it needed (an operand that is itself a regrouping
    of the wanted shape is read through, not viewed again)."""
    args, shapes, vals, out = plan
    made, new_args = [], dict(fixed)
    for a, sh in shapes.items():
        if a in fixed:
            continue
        if tuple(_val(a).shape) == sh:
            new_args[a] = a
        elif a.op == "call_function" and a.target in _REGROUP and tuple(_val(a.args[0]).shape) == sh:
            new_args[a] = a.args[0]
        else:
            nv = g.call_function(aten.view.default, (a, list(sh)))
            nv.meta["val"] = vals[a]
            new_args[a] = nv
            made.append(nv)
    ne = g.call_function(e.target, tuple(_sub(x, new_args) for x in args),
                         {n: _sub(x, new_args) for n, x in e.kwargs.items()})
    ne.meta["val"] = out
    return ne, made


def _hoist_one(g: fx.Graph, v: fx.Node, erased: set) -> list[fx.Node] | None:
    """Move view ``v`` above the element-wise op it reads, if it may: the views made of
    that op's operands (to try next), or None when nothing changed (the nodes removed are
    added to ``erased``)."""
    e = v.args[0] if v.args else None
    if isinstance(e, fx.Node) and e.op == "call_function" and e.target in _REGROUP:
        return _compose(g, v, e, erased)
    if not isinstance(e, fx.Node) or not (pointwise(e) or _keepdim_reduction(e)):
        return None
    s_in, s_out = tuple(_val(e).shape), tuple(_val(v).shape)
    readers = list(e.users)
    if any(u.target not in _REGROUP or tuple(_val(u).shape) != s_out for u in readers):
        return None  # another reader needs the op's own value: moving the view would compute it twice
    k, p_in, p_out = _leading(s_in, s_out)
    if p_in == p_out:
        return None
    plan = _regrouped(e, len(s_in), k, p_in, p_out, {})
    if plan is None or tuple(plan[3].shape) != s_out or plan[3].dtype != _val(v).dtype:
        return None
    with g.inserting_before(e.next):  # after the op: its operands are defined, every reader follows
        ne, made = _rebuild(g, e, plan, {})
    for u in readers:
        u.replace_all_uses_with(ne)
        g.erase_node(u)
        erased.add(u)
    g.erase_node(e)
    erased.add(e)
    return made


def merge_equal_views(g: fx.Graph) -> int:
    """One node for equal views of one value (moving views up makes one per reader, and
    make_fx traces one per ``linear``): a piece then reads that value once, as one input,
    not as two inputs the search would take for different tensors. Returns how many went."""
    seen: dict[tuple, fx.Node] = {}
    merged = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in _REGROUP:
            continue
        key = (n.target, repr(tuple(("node", a.name) if isinstance(a, fx.Node) else a for a in n.args)),
               repr(sorted(n.kwargs.items())))
        first = seen.setdefault(key, n)
        if first is not n:
            n.replace_all_uses_with(first)
            g.erase_node(n)
            merged += 1
    return merged


def view_node(g: fx.Graph, n: fx.Node, src: fx.Node, shape: list[int]) -> fx.Node | None:
    """A ``view`` of ``src`` to ``shape`` inserted before ``n`` (its fake value computed), or
    None when ``src``'s strides do not allow it."""
    try:
        val = aten.view.default(_val(src), list(shape))
    except Exception:  # noqa: BLE001 - the strides do not allow the view
        return None
    with g.inserting_before(n):
        v = g.call_function(aten.view.default, (src, list(shape)))
    v.meta["val"] = val
    return v


def _compose(g: fx.Graph, v: fx.Node, e: fx.Node, erased: set) -> list[fx.Node] | None:
    """A regrouping view of a regrouping view is one view of the first one's input (row-major
    regroupings compose), or that input itself when the shapes agree — a ``linear``'s view
    back to ``(b, s, out)`` read by the next ``linear``'s view to ``(b·s, out)`` goes away."""
    src = e.args[0]
    if not isinstance(src, fx.Node) or not isinstance(_val(src), torch.Tensor):
        return None
    s_out = tuple(_val(v).shape)
    if tuple(_val(src).shape) == s_out:
        v.replace_all_uses_with(src)
    else:
        nv = view_node(g, v, src, list(s_out))
        if nv is None:  # the source's strides do not allow it: keep both views
            return None
        v.replace_all_uses_with(nv)
    g.erase_node(v)
    erased.add(v)
    if not e.users:
        g.erase_node(e)
        erased.add(e)
    return [] if tuple(_val(src).shape) == s_out else [nv]


def _unit_moves_only(perm: list[int], shape: tuple) -> bool:
    """Whether permuting ``shape`` by ``perm`` keeps every dim longer than 1 in its order —
    it only moves dims of size 1, so the elements keep their row-major order."""
    big = [d for d in perm if shape[d] != 1]
    return big == sorted(big)


def _spelled_view(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    """The view ``n`` is, spelled as a view (inserted before it), or None: a permute or
    transpose that only moves dims of size 1, an ``expand`` that adds only leading dims of
    size 1 (or none), a ``bmm`` of a batch of one (a ``view`` of an ``mm`` of views)."""
    src, val = (n.args[0] if n.args else None), _val(n)
    if not isinstance(src, fx.Node) or not isinstance(_val(src), torch.Tensor) or val is None:
        return None
    shape = tuple(_val(src).shape)
    if n.target in (aten.permute.default, aten.transpose.int):
        if n.target == aten.permute.default:
            perm = [d % len(shape) for d in n.args[1]]
        else:
            perm = list(range(len(shape)))
            i, j = (d % len(shape) for d in n.args[1:3])
            perm[i], perm[j] = perm[j], perm[i]
        return view_node(g, n, src, list(val.shape)) if _unit_moves_only(perm, shape) else None
    if n.target == aten.expand.default:
        new = len(val.shape) - len(shape)
        if new < 0 or any(d != 1 for d in val.shape[:new]) or tuple(val.shape[new:]) != shape:
            return None
        return view_node(g, n, src, list(val.shape))
    if n.target == aten.bmm.default:
        other = n.args[1]
        if not isinstance(other, fx.Node) or _val(other) is None or shape[0] != 1:
            return None
        (_, m, k), (_, _, w) = shape, tuple(_val(other).shape)
        a, b = view_node(g, n, src, [m, k]), view_node(g, n, other, [k, w])
        if a is None or b is None:
            return None
        with g.inserting_before(n):
            mm = g.call_function(aten.mm.default, (a, b))
        mm.meta["val"] = aten.mm.default(_val(a), _val(b))
        return view_node(g, n, mm, list(val.shape))
    return None


def respell_views(gm: fx.GraphModule) -> int:
    """Spell the views traced as other ops as views (:func:`_spelled_view`), chiefly a
    ``permute``/``transpose`` that only moves dims of size 1.

    A decode step's attention output ``(b, heads, 1, d)`` is transposed to ``(b, 1, heads, d)``
    before the output projection's reshape to ``(b, heads·d)``: with one token that transpose
    moves nothing in memory, but as a ``permute`` it stopped the views at a piece's edge —
    the projection's piece read ``reshape(permute(reshape(attn)))`` and its search found no
    kernel through it. As a view it composes with the reshapes around it, moves up through
    element-wise ops (:func:`hoist_views`) and leaves the piece, which then reads the
    ``(b, heads·d)`` activation a fused projection + residual kernel takes. Likewise a
    ``linear`` of such a view, traced as ``expand`` and a ``bmm`` of one batch, becomes the
    views of an ``mm`` it is. Only where the input's strides allow each view; returns how
    many nodes were rewritten."""
    g = gm.graph
    n_done = 0
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        v = _spelled_view(g, n)
        if v is None:
            continue
        n.replace_all_uses_with(v)
        g.erase_node(n)
        n_done += 1
    if n_done:
        g.lint()
        gm.recompile()
    return n_done


def hoist_views(gm: fx.GraphModule) -> int:
    """Move every row-major regrouping view above the element-wise ops it may pass (the
    module doc), then merge equal views; returns how many moves were made."""
    work = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _REGROUP]
    return _move_views(gm, work, _hoist_one)


def _move_views(gm: fx.GraphModule, work: list[fx.Node], step) -> int:
    """Apply ``step(graph, view, erased)`` — the views it made, or None when it changed
    nothing — to every view of ``work`` and to the views it makes, then merge equal views
    and recompile; returns how many steps changed the graph."""
    g = gm.graph
    erased: set[fx.Node] = set()
    moves = 0
    while work:
        v = work.pop()
        if v in erased:
            continue
        made = step(g, v, erased)
        if made is not None:
            moves += 1
            work += made
    if moves + merge_equal_views(g):
        g.lint()
        gm.recompile()
    return moves


def _merges_dims(v: fx.Node) -> bool:
    """Whether view ``v`` has fewer dims than its source (a ``linear``'s input view, which
    :func:`hoist_views` moves up, never down)."""
    out, src = _val(v), _val(v.args[0])
    return isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor) and out.ndim < src.ndim


def _sinks_from(src) -> bool:
    """Whether views of ``src`` may move down: ``src`` is computed by an op no view moves
    above (not element-wise, not a suffix reduction, not a view)."""
    return (isinstance(src, fx.Node) and src.op == "call_function" and isinstance(_val(src), torch.Tensor)
            and not (pointwise(src) or _keepdim_reduction(src) or src.target in _REGROUP))


def _sink_into(g: fx.Graph, v: fx.Node, e: fx.Node, erased: set) -> fx.Node | None:
    """Move view ``v`` below its element-wise reader ``e``: ``e`` computed on ``v``'s source
    (its other operands regrouped the inverse way), then viewed as before. Returns the new
    view, or None when ``e`` cannot take it (the graph unchanged)."""
    src = v.args[0]
    s_v, s_e = tuple(_val(v).shape), tuple(_val(e).shape)
    k, p_src, p_v = _leading(tuple(_val(src).shape), s_v)
    if p_src == p_v or len(s_e) != len(s_v) or s_e[:len(s_v) - k] != p_v:
        return None  # nothing to regroup, or the reader broadcasts v to more leading dims
    plan = _regrouped(e, len(s_v), k, p_v, p_src, {v: src})
    if plan is None:
        return None
    try:
        back = aten.view.default(plan[3], list(s_e))
    except Exception:  # noqa: BLE001 - the result's strides do not allow the view back
        return None
    with g.inserting_before(e):
        ne, _ = _rebuild(g, e, plan, {v: src})
        view = g.call_function(aten.view.default, (ne, list(s_e)))
        view.meta["val"] = back
    e.replace_all_uses_with(view)
    g.erase_node(e)
    erased.add(e)
    return view


def _sink_one(g: fx.Graph, v: fx.Node, erased: set) -> list[fx.Node] | None:
    """Move view ``v`` below every element-wise reader that can take it, and cancel it
    against every regrouping reader: the views made (to try next), or None when nothing
    changed. ``v`` goes when nothing reads it any more."""
    made: list[fx.Node] = []
    changed = False
    for u in list(v.users):
        if u.op == "call_function" and u.target in _REGROUP:
            got = _compose(g, u, v, erased)
        elif pointwise(u) or _keepdim_reduction(u):
            nv = _sink_into(g, v, u, erased)
            got = None if nv is None else [nv]
        else:
            got = None
        if got is not None:
            changed = True
            made += got
        if v in erased:
            break
    if v not in erased and not v.users:
        g.erase_node(v)
        erased.add(v)
    return made if changed else None


def sink_views(gm: fx.GraphModule) -> int:
    """Move every row-major regrouping view of a matmul's (or a library op's) result below
    the element-wise ops that read it (the module doc), and cancel it against a regrouping
    reader; then merge equal views. Returns how many views moved."""
    work = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _REGROUP and n.args
            and _sinks_from(n.args[0]) and not _merges_dims(n)]
    return _move_views(gm, work, _sink_one)
