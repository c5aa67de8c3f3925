"""Capture: PyTorch code as an ATen-level FX graph, each node probed for its
mugraph form (docs/design.md §10.1).

Tracing uses ``make_fx`` (the proxy-tensor tracer under ``torch.export`` and
AOTAutograd) with fake tensors at the example inputs' shapes, so nothing is
computed and every node carries its result's shape and dtype (``meta["val"]``).
The softmax and ``linear`` decompositions of :func:`.aten.decompositions` run
while tracing, and every ``F.scaled_dot_product_attention`` call is routed to
:func:`.aten.sdpa` (one ``mugraph::attention`` node; :class:`SdpaMode`). RoPE's
rotate-half (two slices, a negation, a cat) is then recognized and replaced by one
call of :func:`.aten.rotate_half`, and the Hugging Face ``repeat_kv`` of an
attention's keys and values by grouped-query heads (:func:`fold_repeat_kv`); a
grouped-query attention then takes its queries already grouped, the regroupings torch
views around it (:func:`group_query_rows`).

Each call node is then *probed*: its row of :data:`.aten.ROWS` is run on fresh
inputs of its argument shapes in a scratch Program; the node maps if the row
succeeds and the built tensor has the node's shape and dtype (so ATen conventions
the row misreads can never slip through). The probe records the catalog ops the
node became, whether they are Lax, and how many exponentiations lie on it.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import make_fx

from ..core.errors import ArgumentTypeError, MugraphError
from ..core.ir import DTYPES, Program, Tensor
from ..core.ops import CATALOG, exp_like
from .aten import (ROWS, SELECT_OPS, VIEW_OPS, Context, Unmapped, attention, attention_args, attention_call,
                   decompositions, regroup, rotate_half, sdpa, tile_rows)
from .hoist import hoist_views, pointwise, respell_views, sink_views, view_node

aten = torch.ops.aten


@dataclass
class NodeInfo:
    """What probing found for one FX node."""

    mapped: bool
    why: str = ""                  # why not, when not mapped
    kinds: tuple[str, ...] = ()    # catalog ops the node becomes
    lax: bool = False              # every op of a Lax class
    exps: int = 0                  # exp-like ops on its longest path
    cast: tuple[str, str] | None = None  # (from, to): a float cast built as the identity
    view: str = ""                 # "view" (aten.VIEW_OPS) or "select" (a slice, aten.SELECT_OPS): a torch
                                   # view that stays torch at a piece's boundary (a slice at its input side)

    @property
    def num_ops(self) -> int:
        return len(self.kinds)


def _leave_functorch_layers(depth: int) -> None:
    """Pop the functorch layers a failed trace left pushed, back to ``depth``. Why: an internal
    assert inside ``functionalize`` (Mamba's forward) leaves its layer on the stack, and every
    later trace of the process — Inductor's compile of the same graph, which the backend falls
    back to — then fails on another internal assert."""
    if torch._C._functorch.get_dynamic_layer_stack_depth() > depth:
        torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)


def trace(fn: Callable, example_inputs: tuple) -> fx.GraphModule:
    """``fn`` traced at ATen level with fake tensors shaped like ``example_inputs``."""
    if not callable(fn):
        raise ArgumentTypeError(f"from_torch: expected a function or nn.Module, got {type(fn).__name__}")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, (torch.Tensor, int, float, bool)):
            raise ArgumentTypeError(f"from_torch: example input {i} is a {type(x).__name__}, not a torch.Tensor")
    consts: dict[str, torch.Tensor] = {}
    if isinstance(fn, torch.nn.Module):  # weights enter as inputs while tracing, then become constants
        module = fn
        consts = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        names = list(consts)

        def fn(*xs):  # noqa: F811 - the module's call with its state passed in
            return torch.func.functional_call(module, dict(zip(names, xs[:len(names)])), xs[len(names):])
    inner = fn

    def fn(*xs):  # noqa: F811 - SDPA calls become mugraph::attention while tracing
        with SdpaMode():
            return inner(*xs)
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    try:
        # a lazy graph module: the passes below each edit the graph and ask for a recompile,
        # which generates its Python code only when the module is next run (a 32-layer
        # graph's seven recompiles took a fifth of its capture)
        with _use_lazy_graph_module(True):
            gm = make_fx(torch.func.functionalize(fn), decomposition_table=decompositions(),
                         tracing_mode="fake", _allow_non_fake_inputs=True)(*consts.values(), *example_inputs)
    except Exception as e:  # noqa: BLE001 - torch's tracer raises many kinds; one line names it
        _leave_functorch_layers(depth)
        if isinstance(e, MugraphError):
            raise
        raise Unmapped(f"from_torch: tracing failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None
    if consts:
        _lift_constants(gm, list(consts.values()))
    for n in gm.graph.nodes:  # constants (a module's weights) carry their value's shape and dtype
        if n.op == "get_attr" and "val" not in n.meta:
            v = getattr(gm, n.target, None)
            if isinstance(v, torch.Tensor):
                n.meta["val"] = v
    drop_empty_concat_inputs(gm)  # a partial RoPE whose pass-through part is empty
    fold_rotate_half(gm)
    fold_repeat_kv(gm)
    respell_views(gm)  # a transpose of a one-token dim is the view it is; a bmm of one batch an mm
    fold_column_slices(gm)  # a fused projection's q/k/v (gate/up) columns: projections by weight slices
    hoist_views(gm)  # a linear's view of an element-wise result moves onto that op's operands
    sink_views(gm)  # a linear's view back to 3-d moves below the element-wise ops reading it
    group_query_rows(gm)  # a grouped-query attention's regrouping of Q and of its result: views outside it
    merge_repeated_values(gm)  # a value computed again from the same inputs (a mask per attention): once
    # the graph is functional: values nothing reads (the unused parts of a split, an
    # unbind's other rows) are dropped rather than computed by a piece
    if gm.graph.eliminate_dead_code():
        gm.recompile()
    return gm


class SdpaMode(torch.overrides.TorchFunctionMode):
    """While tracing: ``F.scaled_dot_product_attention`` runs as :func:`.aten.sdpa`.

    Caught at the torch-function level, the call still has its own arguments — a
    boolean mask, ``enable_gqa``, ``is_causal`` — before the dispatcher picks a backend
    kernel for the device (flash, efficient, cuDNN, math: different ATen ops, tuple
    results, a boolean mask already turned into ``-inf``) or decomposes it. Every other
    call passes through unchanged."""

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch._C._nn.scaled_dot_product_attention:
            return sdpa(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _lift_constants(gm: fx.GraphModule, values: list[torch.Tensor]) -> None:
    """The first ``len(values)`` placeholders become constants of ``gm`` (get_attr)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"][:len(values)]
    last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    for i, (n, v) in enumerate(zip(phs, values)):
        name = f"_const{i}"
        gm.register_buffer(name, v.detach())
        with gm.graph.inserting_after(last):
            a = gm.graph.get_attr(name)
        a.meta["val"] = v.detach()
        n.replace_all_uses_with(a)
        gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()


def _val(n: Any):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def slice_span(n: Any) -> tuple[fx.Node, int, int, int] | None:
    """``(x, dim, start, end)`` if ``n`` is a step-1 ``aten.slice`` of ``x``: ``dim``
    non-negative, the bounds resolved against ``x``'s size as torch resolves them (negative
    from the end, clamped to the dim)."""
    if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target == aten.slice.Tensor):
        return None
    x, dim, start, end, step = (list(n.args) + [None, 0, None, None, 1][len(n.args):])[:5]
    v = _val(x)
    if v is None or v.ndim == 0 or step != 1:
        return None
    size = v.shape[dim]
    start = 0 if start is None else max(start + size, 0) if start < 0 else min(start, size)
    end = size if end is None else max(end + size, 0) if end < 0 else min(end, size)
    return x, dim % v.ndim, start, end


def _slice_of(n: Any) -> tuple[fx.Node, int, int] | None:
    """``(x, start, end)`` if ``n`` is ``x[..., start:end]`` on the last dim, step 1."""
    span = slice_span(n)
    if span is None or span[1] != _val(span[0]).ndim - 1:
        return None
    return span[0], span[2], span[3]


def drop_empty_concat_inputs(gm: fx.GraphModule) -> int:
    """Drop the empty inputs of each ``cat``; a ``cat`` left with one input becomes a contiguous
    copy of it (what ``cat`` returns). Returns how many ``cat`` nodes changed.

    Why: a partial RoPE concatenates its rotated part with the part it passes through, and a
    configuration rotating every column passes through an empty one (a tiny Phi-3's
    ``partial_rotary_factor``). The traced ``cat`` is contiguous, so the passes after it read it
    through views (Q regrouped by its KV heads); Inductor drops the empty input too, but keeps
    the other's strides — a transposed layout no view can read — and the compile failed."""
    count = 0
    for n in list(gm.graph.nodes):
        if not (n.op == "call_function" and n.target == aten.cat.default):
            continue
        parts = list(n.args[0])
        kept = [a for a in parts if not (isinstance(_val(a), torch.Tensor) and _val(a).numel() == 0)]
        if len(kept) == len(parts) or not kept:
            continue
        with gm.graph.inserting_before(n):
            if len(kept) == 1:
                r = gm.graph.call_function(aten.clone.default, (kept[0],), {"memory_format": torch.contiguous_format})
            else:
                r = gm.graph.call_function(aten.cat.default, (kept, *n.args[1:]), dict(n.kwargs))
        _replace(gm, n, r)
        count += 1
    return _edited(gm, count)


def _replace(gm: fx.GraphModule, old: fx.Node, new: fx.Node) -> None:
    """``new`` in ``old``'s place: its value's metadata, its readers; ``old`` erased."""
    new.meta = dict(old.meta)
    old.replace_all_uses_with(new)
    gm.graph.erase_node(old)


def _edited(gm: fx.GraphModule, count: int) -> int:
    """``count``, after a pass that made that many edits; the module recompiled if any."""
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _pure(target: Any) -> bool:
    """Whether a call of ``target`` gives the same value whenever its arguments are the same
    and changes nothing else: an ATen or ``mugraph::`` operator that mutates no argument and
    draws no random numbers, or an output of a multi-output call (``getitem``)."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not target._schema.is_mutable and not {torch.Tag.nondeterministic_seeded,
                                                   torch.Tag.nondeterministic_bitwise} & set(target.tags)


def _frozen(x: Any) -> Any:
    """``x`` (a node's arguments) with its lists as tuples, so that it can key a dict."""
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in x.items()))
    return x


def merge_repeated_values(gm: fx.GraphModule) -> int:
    """Every pure call (:func:`_pure`) that repeats an earlier one — the same operator on
    the same arguments — replaced by that earlier node; returns how many were merged.

    Why: the capture writes SDPA's boolean mask as an additive bias and a row factor at each
    attention call (:func:`.aten.sdpa`), so a 32-layer model's graph converted the one mask
    of its forward 32 times, and Inductor ran each conversion as kernels of their own between
    a layer's pieces. Merged, the mask is converted once. The graph is functional (``make_fx``
    of a functionalized call): no node changes a value another reads, so a call with equal
    arguments has an equal value wherever it is — and where a graph does write in place (the
    functionalized graph's copies back into its inputs, or any graph given here), a call that
    reads or is a value written in place is left as it is."""
    written = {a for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable for a in n.all_input_nodes}
    first: dict[tuple, fx.Node] = {}
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or not _pure(n.target) or n in written \
                or any(a in written for a in n.all_input_nodes):
            continue
        key = (n.target, _frozen(n.args), _frozen(n.kwargs))
        try:
            earlier = first.setdefault(key, n)
        except TypeError:  # an argument that cannot key a dict: left as it is
            continue
        if earlier is not n:
            n.replace_all_uses_with(earlier)
            gm.graph.erase_node(n)
            count += 1
    return _edited(gm, count)


def fold_rotate_half(gm: fx.GraphModule) -> int:
    """Replace ``cat([-x[..., h:], x[..., :h]], -1)`` by ``rotate_half(x)``; the
    slices and the negation go if nothing else reads them. Returns how many."""
    count = 0
    for n in list(gm.graph.nodes):
        if not (n.op == "call_function" and n.target == aten.cat.default and len(n.args[0]) == 2):
            continue
        v = _val(n)
        if v is None or v.ndim == 0 or (n.args[1] if len(n.args) > 1 else 0) % v.ndim != v.ndim - 1:
            continue
        d = v.shape[-1]
        first, second = n.args[0]
        if not (first.op == "call_function" and first.target == aten.neg.default):
            continue
        hi, lo = _slice_of(first.args[0]), _slice_of(second)
        if hi is None or lo is None or hi[0] is not lo[0] or d % 2 or hi[1:] != (d // 2, d) or lo[1:] != (0, d // 2):
            continue
        if _val(hi[0]).shape[-1] != d:  # halves of a window of x, not of x: not x's rotate-half
            continue
        with gm.graph.inserting_before(n):
            r = gm.graph.call_function(rotate_half, (hi[0],))
        _replace(gm, n, r)
        for dead in (first, first.args[0], second):
            if not dead.users:
                gm.graph.erase_node(dead)
        count += 1
    return _edited(gm, count)


def fold_column_slices(gm: fx.GraphModule) -> int:
    """Slices of a projection's output columns become projections by slices of its weight:
    ``(x @ W)[..., a:b]`` is ``x @ W[:, a:b]``, where every reader of the product is such a
    slice (through views that keep its last dim).

    A fused projection — Phi-3's ``qkv_proj`` and ``gate_up_proj`` — is one ``mm`` whose
    output is cut into q, k, v (or gate and up) by slices. As slices of a computed value they
    sat inside the piece, between the matmul and what reads each part, and no block graph
    spells them: the gate/up piece of Phi-3 found nothing. Sliced weights are views of an
    input (read in place through their strides, §10.3), and the piece is the separate
    projections' — the form the search fuses. Only slices that do not overlap move, so each
    weight byte is still read once.

    Only where two of the slices meet again in an element-wise op (gate and up in
    ``silu(gate) * up``; :func:`slices_meet`): that is the fusion the fold opens. Parts
    read apart — q, k and v, each going its own way to RoPE or the KV cache — stay slices
    of the one product, which a piece writes whole (the partition folds slices covering a
    piece's output off it, :func:`.partition.fold_views`). Folded, the piece held the
    RMSNorm with the q and k projections and v ran alone: Phi-3-mini's piece beat its own
    torch ops (two projections) by 8 μs, but not the graph's, where torch.compile runs the
    fused weight as one product (H200). Returns how many slices moved."""
    g = gm.graph
    count = 0
    for m in list(g.nodes):
        if not (m.op == "call_function" and m.target == aten.mm.default):
            continue
        a, w = m.args
        vm = _val(m)
        if vm is None or not isinstance(w, fx.Node) or _val(w) is None:
            continue
        n_cols = vm.shape[-1]
        # the product, read through views that keep its last dim, then only by column slices
        views, readers = [], list(m.users)
        if len(readers) == 1 and readers[0].target in (aten.view.default, aten._unsafe_view.default) \
                and _val(readers[0]) is not None and _val(readers[0]).shape[-1] == n_cols:
            views = [readers[0]]
            readers = list(readers[0].users)
        top = views[-1] if views else m
        slices = [(u, _slice_of(u)) for u in readers]
        if not readers or any(sl is None or sl[0] is not top for _, sl in slices):
            continue
        spans = sorted(sl[1:] for _, sl in slices)
        if any(e0 > s1 for (_, e0), (s1, _) in zip(spans, spans[1:])):
            continue  # overlapping slices would read those weight columns twice
        if not slices_meet([u for u, _ in slices]):
            continue
        for u, (_, start, end) in slices:
            with g.inserting_before(u):
                ws = g.call_function(aten.slice.Tensor, (w, 1, start, end))
                ws.meta["val"] = aten.slice.Tensor(_val(w), 1, start, end)
                out = g.call_function(aten.mm.default, (a, ws))
                out.meta["val"] = aten.mm.default(_val(a), ws.meta["val"])
            for v in views:  # a fresh product is row-major: its view always exists
                out = view_node(g, u, out, list(_val(v).shape[:-1]) + [end - start])
            u.replace_all_uses_with(out)
            g.erase_node(u)
            count += 1
        for v in reversed(views):
            g.erase_node(v)
        g.erase_node(m)
    if count:
        g.lint()
        gm.recompile()
    return count


def slices_meet(slices: list[fx.Node]) -> bool:
    """Whether some op reads values computed from two of ``slices`` through views and
    element-wise ops alone (``silu(gate) * up`` reads both of gate/up's parts)."""
    reached: dict[fx.Node, int] = {}
    for i, sl in enumerate(slices):
        todo = [sl]
        while todo:
            n = todo.pop()
            for u in n.users:
                if u.op != "call_function":  # the graph's output reads every result
                    continue
                if u in reached:
                    if reached[u] != i:
                        return True
                    continue
                reached[u] = i
                if u.target in VIEW_OPS or pointwise(u):
                    todo.append(u)
    return False


#: the ``meta`` key :func:`.pieces.rewrite` marks each piece's call node with (the piece's name)
PIECE_CALL = "mugraph_piece"


def unfold_column_slices(gm: fx.GraphModule) -> int:
    """:func:`fold_column_slices` undone where torch runs the parts: projections ``x @ W[:, a:b]``
    of one ``x`` by adjacent column slices of one ``W`` that are all still torch code (no
    piece holding them runs a μGraph) become one ``x @ W[:, a0:bn]`` cut by column slices of
    its product. Called on a stitched graph (:meth:`.graph.Captured.stitched`).

    Why: the fold serves the search, which fuses a slice's projection with what reads it.
    Where that piece stays torch code, the fold's only effect is one library matmul per
    slice instead of one for the fused weight: Phi-3-mini's decode step ran q, k and v as
    three 3072-wide GEMVs (22.5 μs) where its ``qkv_proj`` is one (16.8 μs), gate and up as
    two (29.0 μs) against one (25.9), and its step with its kept pieces lost 14 μs of kernel
    time to torch.compile (H200). Slices separated by a gap (a kept piece reads those
    columns) stay apart: joined, they would read the gap's weight columns twice; so do parts
    of several rows a kept piece reads (:func:`_read_by_piece`) — a column slice of a joined
    product is not laid out as the part the piece was compiled for, and would be copied
    before each call. Returns how many projections were joined."""
    count = unfold_column_slices_in(gm.graph)
    if count:
        gm.recompile()
    return count


def unfold_column_slices_in(g: fx.Graph) -> int:
    """:func:`unfold_column_slices` on a graph (linted when changed), its module's code left
    to the caller: a stitched graph is unfolded before its module is made, whose code is then
    generated once (a 32-layer graph's code took a tenth of a second to generate)."""
    index = {n: i for i, n in enumerate(g.nodes)}
    groups: dict[tuple, list] = {}
    for n in g.nodes:
        if not (n.op == "call_function" and n.target == aten.mm.default):
            continue
        a, ws = n.args
        if isinstance(ws, fx.Node) and ws.op == "call_function" and ws.target == aten.slice.Tensor \
                and len(ws.args) == 4 and ws.args[1] == 1 and _val(ws.args[0]) is not None:
            w, _, start, end = ws.args
            groups.setdefault((a, w), []).append((start, end, n, ws))
    count = 0
    for (a, w), parts in groups.items():
        parts.sort(key=lambda p: p[0])
        if len(parts) < 2 or any(p[1] != q[0] for p, q in zip(parts, parts[1:])):
            continue
        if math.prod(_val(parts[0][2]).shape[:-1]) > 1 and any(_read_by_piece(p[2]) for p in parts):
            continue
        lo, hi, vw = parts[0][0], parts[-1][1], _val(w)
        first = min((p[2] for p in parts), key=index.__getitem__)
        with g.inserting_before(first):
            src = w
            if (lo, hi) != (0, vw.shape[1]):
                src = g.call_function(aten.slice.Tensor, (w, 1, lo, hi))
                src.meta["val"] = aten.slice.Tensor(vw, 1, lo, hi)
            prod = g.call_function(aten.mm.default, (a, src))
            prod.meta["val"] = aten.mm.default(_val(a), _val(src))
            cuts = []
            for start, end, n, ws in parts:
                cut = g.call_function(aten.slice.Tensor, (prod, 1, start - lo, end - lo))
                cut.meta["val"] = aten.slice.Tensor(prod.meta["val"], 1, start - lo, end - lo)
                cuts.append((n, ws, cut))
        for n, ws, cut in cuts:
            n.replace_all_uses_with(cut)
            g.erase_node(n)
            if not ws.users:
                g.erase_node(ws)
        count += len(parts)
    if count:
        g.lint()
    return count


def _read_by_piece(n: fx.Node) -> bool:
    """Whether a piece's call (:data:`PIECE_CALL`) reads ``n``, directly or through views."""
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        for u in m.users:
            if u.meta.get(PIECE_CALL) is not None:
                return True
            if u.op == "call_function" and u.target in VIEW_OPS and u not in seen:
                seen.add(u)
                todo.append(u)
    return False


def _arg(n: fx.Node, i: int, default: Any = None) -> Any:
    return n.args[i] if len(n.args) > i else default


def _repeated_heads(n: Any) -> tuple[fx.Node, int] | None:
    """``(x, g)`` if ``n`` is Hugging Face's ``repeat_kv(x, g)``: ``x[:, :, None]``
    expanded to ``g`` copies and reshaped to ``(…, heads · g, seq, dim)`` (each head
    repeated ``g`` times in place: ``repeat_interleave`` on the head dim), traced as
    ``unsqueeze``, ``expand``, an optional ``clone`` and a ``view``/``_unsafe_view``."""
    if not (isinstance(n, fx.Node) and n.op == "call_function"
            and n.target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default)):
        return None
    e = n.args[0]
    if isinstance(e, fx.Node) and e.target == aten.clone.default:
        e = e.args[0]
    if not (isinstance(e, fx.Node) and e.target == aten.expand.default):
        return None
    u = e.args[0]
    if not (isinstance(u, fx.Node) and u.target == aten.unsqueeze.default):
        return None
    x, vx, ve, vn = u.args[0], _val(u.args[0]), _val(e), _val(n)
    if any(v is None for v in (vx, ve, vn)) or vx.ndim < 3 or _arg(u, 1) % (vx.ndim + 1) != vx.ndim - 2:
        return None
    g = ve.shape[-3]
    lead, (h, seq, dim) = tuple(vx.shape[:-3]), tuple(vx.shape[-3:])
    if tuple(ve.shape) != lead + (h, g, seq, dim) or tuple(vn.shape) != lead + (h * g, seq, dim):
        return None
    return x, g


def fold_repeat_kv(gm: fx.GraphModule) -> int:
    """An attention whose keys and values are ``repeat_kv(k, g)``, ``repeat_kv(v, g)`` reads
    ``k`` and ``v`` themselves with grouped-query heads (``enable_gqa``; its row reads K
    and V once per KV head, as SDPA's own GQA does); the repeats go if nothing else
    reads them. Returns how many attentions changed."""
    count = 0
    for n in list(gm.graph.nodes):
        if not (n.op == "call_function" and n.target == attention):
            continue
        kt, v = n.args[1], n.args[2]
        rank = getattr(_val(kt), "ndim", 0)
        if not (isinstance(kt, fx.Node) and kt.target == aten.transpose.int and rank >= 2
                and sorted(d % rank for d in kt.args[1:3]) == [rank - 2, rank - 1]):
            continue
        rk, rv = _repeated_heads(kt.args[0]), _repeated_heads(v)
        if rk is None or rv is None or rk[1] != rv[1]:
            continue
        with gm.graph.inserting_before(n):
            new_kt = gm.graph.call_function(aten.transpose.int, (rk[0], -2, -1))
        new_kt.meta["val"] = _val(rk[0]).transpose(-2, -1)
        n.args, n.kwargs = attention_call({**attention_args(n), "kt": new_kt, "v": rv[0], "enable_gqa": True}), {}
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return count


def _regrouped(g: fx.Graph, x: fx.Node, shape: tuple, strides: tuple | None = None,
               copy: bool = True) -> fx.Node | None:
    """A node for ``x`` in ``shape``: a torch ``view`` where ``x``'s strides allow one (and it
    gives ``strides``, when asked) — at a piece's boundary the partition leaves it to torch
    (:func:`.partition.fold_views`), read or written in place — else, with ``copy``, a copy by
    :func:`.aten.regroup` (torch code between pieces), else None."""
    v = _val(x)
    try:
        val = v.view(shape)
        target, args = aten.view.default, (x, list(shape))
        if strides is not None and tuple(val.stride()) != tuple(strides):
            raise ValueError("other strides")
    except (RuntimeError, ValueError):  # (fake tensors raise the latter)
        if not copy:
            return None
        val = regroup(v, shape, strides)
        target, args = regroup, (x, tuple(shape)) + ((tuple(strides),) if strides is not None else ())
    n = g.call_function(target, args)
    n.meta["val"] = val
    return n


def group_query_rows(gm: fx.GraphModule) -> int:
    """Each grouped-query attention (``enable_gqa``, ``H = groups · Hkv`` query heads) as
    its grouped form: Q regrouped to ``(…, Hkv, groups · L, D)`` before the call (the query
    heads of each KV head as rows), the result regrouped back after it, a per-head mask
    regrouped as Q where a view can do it, a mask shared by the heads over several query
    rows tiled to the grouped rows by torch (:func:`.aten.tile_rows`; one row broadcasts).

    Why the shared mask's tiling is torch code, not the piece's: a ``repeat`` in the
    piece's Program leaves the search a rearrangement to place inside a block, and it
    found no μGraph for such decode steps (8 new tokens over a static cache, 6–8 s); the
    copy is a few hundred KB, made once per step.

    The regroupings are views of the operands and the result (a copy by torch only where
    Q's strides allow none), so the partition leaves them at the piece's boundary and its
    Program is the attention alone: ``matmul``, ``scale``, the softmax, ``matmul``, ``div``
    — no ``reshape`` for the search to place. Returns how many attentions changed."""
    count = 0
    g = gm.graph
    for n in list(g.nodes):
        if not (n.op == "call_function" and n.target == attention):
            continue
        a = attention_args(n)
        if a["groups"] != 1:  # grouped already
            continue
        q, kt, v = a["q"], a["kt"], a["v"]
        vq, vk, vo = _val(q), _val(kt), _val(n)
        if not all(isinstance(t, torch.Tensor) for t in (vq, vk, vo)) or not (vq.ndim == vk.ndim >= 3):
            continue
        heads, kv_heads = vq.shape[-3], vk.shape[-3]
        if not a["enable_gqa"] or kv_heads < 1 or heads == kv_heads or heads % kv_heads:
            continue
        groups, lead, queries = heads // kv_heads, tuple(vq.shape[:-3]), vq.shape[-2]
        with g.inserting_before(n):
            qg = _regrouped(g, q, lead + (kv_heads, groups * queries, vq.shape[-1]))
            m, vm = a["bias"], _val(a["bias"])
            if isinstance(m, fx.Node) and vm is not None and vm.ndim >= 3 and vm.shape[-3] == heads \
                    and vm.shape[-2] == queries:
                m = _regrouped(g, m, tuple(vm.shape[:-3]) + (kv_heads, groups * queries, vm.shape[-1]),
                               copy=False) or m
            elif isinstance(m, fx.Node) and vm is not None and vm.ndim >= 3 and vm.shape[-3] == 1 \
                    and vm.shape[-2] == queries > 1:
                m = g.call_function(tile_rows, (m, groups))
                m.meta["val"] = tile_rows(vm, groups)
            grouped = {**a, "q": qg, "bias": m, "groups": groups}
            att = g.call_function(attention, attention_call(grouped))
        att.meta = dict(n.meta)
        att.meta["val"] = attention(*attention_call({**grouped, "q": _val(qg), "kt": vk, "v": _val(v),
                                                     "bias": _val(m)}))
        with g.inserting_after(att):
            out = _regrouped(g, att, tuple(vo.shape), tuple(vo.stride()))
        n.replace_all_uses_with(out)
        g.erase_node(n)
        count += 1
    if count:
        g.lint()
        gm.recompile()
    return count


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The node's tensor-valued inputs, in order of first use."""
    seen: dict[fx.Node, None] = {}
    for a in node.all_input_nodes:
        if isinstance(_val(a), torch.Tensor):
            seen[a] = None
    return list(seen)


def build_node(node: fx.Node, env: dict[fx.Node, Any], ctx: Context):
    """Apply the node's row with ``env`` mapping its tensor inputs to mugraph tensors."""
    row = ROWS.get(node.target)
    if row is None:
        raise Unmapped(f"{node.target} has no row")

    def sub(a):
        if isinstance(a, fx.Node):
            if a not in env:
                raise Unmapped(f"argument {a.name} is not a tensor")
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        if isinstance(a, torch.dtype):
            return a
        if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
            return None
        return a
    return row(ctx, *sub(tuple(node.args)), **{k: sub(v) for k, v in node.kwargs.items()})


def dtype_name(t: torch.dtype) -> str:
    return str(t).removeprefix("torch.")


#: argument values a probe's key spells by their ``repr`` (their type named beside it: ``1``,
#: ``1.0`` and ``True`` are equal in Python but not to a row)
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyed(Exception):
    """An argument :func:`probe_key` cannot spell: the node is probed on its own."""


def probe_key(node: fx.Node) -> tuple | None:
    """What :func:`probe` reads of ``node``: its target, its arguments with each tensor input
    named by its place among :func:`tensor_args` (with its shape and dtype) and each other
    value spelled out, and its result's shape and dtype — or None when an argument is not
    one of those (a tensor literal, a node of no tensor: the row's refusal names it)."""
    out = _val(node)
    if node.op != "call_function" or not isinstance(out, torch.Tensor):
        return None
    inputs = tensor_args(node)
    place = {a: i for i, a in enumerate(inputs)}

    def spell(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a not in place:
                raise _Unkeyed
            return ("t", place[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(spell(x) for x in a))
        if isinstance(a, _PLAIN):
            return (type(a).__name__, repr(a))
        raise _Unkeyed
    try:
        key = (node.target, spell(tuple(node.args)), tuple(sorted((k, spell(v)) for k, v in node.kwargs.items())),
               tuple((tuple(_val(a).shape), _val(a).dtype) for a in inputs), tuple(out.shape), out.dtype)
        hash(key)  # a symbolic size does not hash
    except (_Unkeyed, TypeError):
        return None
    return key


def probe_all(nodes: Iterable[fx.Node]) -> dict[fx.Node, NodeInfo]:
    """:func:`probe` of each call node of ``nodes``, nodes of one :func:`probe_key` probed
    once. Why: what a probe finds depends on that key alone (a row sees shapes, dtypes and
    argument values, never the node), and a model's identical layers repeat a few dozen
    keys over thousands of nodes — probing each node built thousands of scratch Programs."""
    found: dict[tuple, NodeInfo] = {}
    out: dict[fx.Node, NodeInfo] = {}
    for n in nodes:
        if n.op != "call_function":
            continue
        key = probe_key(n)
        if key is None:
            out[n] = probe(n)
        else:
            if key not in found:
                found[key] = probe(n)
            out[n] = dataclasses.replace(found[key])  # a record of its own per node
    return out


def probe(node: fx.Node) -> NodeInfo:
    """Whether ``node`` maps to catalog ops, and what it becomes (see the module doc)."""
    if node.op != "call_function":
        return NodeInfo(False, node.op)
    if node.target is operator.getitem or node.target not in ROWS:
        return NodeInfo(False, f"{getattr(node.target, '__name__', node.target)} has no row")
    out = _val(node)
    if not isinstance(out, torch.Tensor):
        return NodeInfo(False, "result is not one tensor")
    p = Program("probe")
    env: dict[fx.Node, Any] = {}
    try:
        for i, a in enumerate(tensor_args(node)):
            v = _val(a)
            if dtype_name(v.dtype) not in DTYPES:
                return NodeInfo(False, f"input dtype {v.dtype}")
            env[a] = p.input(f"a{i}", tuple(int(s) for s in v.shape), dtype_name(v.dtype))
        ctx = Context(lambda i, t, fill=None: p.input(f"c{i}", tuple(t.shape), dtype_name(t.dtype), fill=fill))
        y = build_node(node, env, ctx)
    except MugraphError as e:
        return NodeInfo(False, str(e)[:200])
    cast = None
    if node.target == aten._to_copy.default and isinstance(y, Tensor) and y.dtype != dtype_name(out.dtype):
        cast = (y.dtype, dtype_name(out.dtype))  # _copy accepted it: both float dtypes absorbable (§10.3)
    want_dtype = cast[0] if cast else dtype_name(out.dtype)
    if not isinstance(y, Tensor) or tuple(y.shape) != tuple(out.shape) or y.dtype != want_dtype:
        return NodeInfo(False, f"built {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}, "
                               f"node is {tuple(out.shape)} {out.dtype}")
    kinds = tuple(op.kind for op in p.ops if op.kind != "input")
    depth: dict[int, int] = {}
    for op in p.ops:
        d = max((depth.get(t.id, 0) for t in op.inputs), default=0) + exp_like(op.kind)
        for t in op.outputs:
            depth[t.id] = d
    view = "view" if node.target in VIEW_OPS else "select" if node.target in SELECT_OPS else ""
    return NodeInfo(True, "", kinds, all(CATALOG[k].lax != "none" for k in kinds), depth.get(y.id, 0), cast, view)

