"""Repeated layers compiled once (docs/design.md §10.5): the runs of a graph that repeat
node for node — a model's identical decoder layers — become calls of one shared subgraph
(``torch.ops.higher_order.invoke_subgraph``), which Inductor lowers and generates code for
once, not once per layer.

Why: Inductor's time on a graph grows with its nodes, and a 32-layer model's graph is its
layer 32 times over. A whole LLaMA-3-8B's graph with its μGraph pieces took 43–56 s of
Inductor in a compile budgeted at 170 s (H200, 2026-12-01/02), where the layer alone takes a few seconds.
PyTorch's own way to compile a region once, ``torch.compiler.nested_compile_region``, marks
the region before dynamo traces it, in the model's source; the backend meets the graph
after that trace, so it finds the repeats itself:

1. :func:`_period`: each call node gets a signature — its target and constant arguments,
   its node arguments unnamed — and the graph's longest stretch in which that sequence
   repeats with one period is the candidate.
2. :func:`_windows`: the stretch is cut into windows of one period at the phase where the
   fewest values cross from window to window (a layer's own start), and a window joins
   only if it matches the first node for node: the same targets and constants, arguments
   inside the window at the same positions, arguments outside it in the same pattern.
3. :func:`_outline`: the first window becomes the subgraph — or, where a layer writes
   values back into its inputs (a functional graph's KV-cache update, ``copy_`` at its end),
   one subgraph for each run of nodes between those values, which stay in the graph so that
   Inductor still updates the cache in place. Each window is one call of each subgraph, its
   outside arguments as operands and every value the rest of the graph reads as a result.

Nothing that writes (an in-place or ``out=`` op) goes into a region, nor does a window whose
results would alias its operands or each other (what ``invoke_subgraph`` does not allow); a
result that is a view of a value made inside the window leaves as that value, the view made
again outside (:func:`_views_inside`). A graph with no repeat of at least
:data:`MIN_REGION_NODES` nodes comes back unchanged."""

from __future__ import annotations

import logging
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

log = logging.getLogger("mugraph")

#: the least nodes a repeated region holds: a shorter one saves Inductor less than its
#: call's boundary costs (its operands realized, its outputs made buffers)
MIN_REGION_NODES = 24
#: the least nodes of a run between the values a layer writes back that becomes a subgraph
MIN_SEGMENT_NODES = 8
#: how many of the most common gaps (of at least MIN_REGION_NODES) between equal signatures
#: are tried as the period
PERIOD_CANDIDATES = 6


@dataclass(frozen=True)
class Repeats:
    """What :func:`outline_repeats` found: ``windows`` repeats of ``length`` nodes, each made
    of ``segments`` calls (one subgraph each) with ``inputs`` operands and ``outputs`` results
    in all."""

    windows: int
    length: int
    segments: int
    inputs: int
    outputs: int

    def line(self) -> str:
        return (f"{self.windows} repeats of {self.length} nodes compiled once, as {self.segments} "
                f"subgraph{'s' if self.segments > 1 else ''} ({self.inputs} operands, {self.outputs} results a repeat)")


def outline_repeats(gm: fx.GraphModule) -> tuple[fx.GraphModule, Optional[Repeats]]:
    """``gm`` with its longest run of identical windows as calls of one subgraph, and what was
    outlined (``None``, ``gm`` itself: no repeat worth it)."""
    nodes, best = _candidate(gm)
    if best is None:
        return gm, None
    start, stop, length = best
    index = {n: i for i, n in enumerate(nodes)}
    found = _windows(nodes, index, start, stop, length)
    if found is None:
        return gm, None
    first, count = found
    try:
        out, info = _outline(gm, nodes, index, first, count, length)
    except _Refused as e:
        log.info("mugraph: repeated layers compiled as they are: %s", e)
        return gm, None
    return out, info


def has_repeats(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` has a run of identical windows worth a subgraph (what
    :func:`outline_repeats` looks for first; it may still refuse one). Reading the graph the
    backend traced, before its pieces are made: a graph with none keeps its pieces' split-K
    counters in a buffer of its own (``run._keeps_counters``)."""
    return _candidate(gm)[1] is not None


def _candidate(gm: fx.GraphModule) -> tuple[list[fx.Node], Optional[tuple[int, int, int]]]:
    """``gm``'s call nodes in order and the stretch of them that repeats (:func:`_period`;
    None: none, or a submodule call, which cannot move into a subgraph of its own)."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    if any(n.op == "call_module" for n in gm.graph.nodes):
        return nodes, None
    return nodes, _period([_signature(n, i) for i, n in enumerate(nodes)])


class _Refused(Exception):
    """A window that cannot be a region (why in the message)."""


# -- signatures and the period ---------------------------------------------------------------

def _writes(n: fx.Node) -> bool:
    """Whether ``n`` writes into one of its arguments (``copy_``, ``index_copy_``, ``out=``,
    ``inplace=True``)."""
    if "out" in n.kwargs or n.kwargs.get("inplace") is True:
        return True
    schema = getattr(n.target, "_schema", None)
    if schema is not None:
        return schema.is_mutable
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _constant(v: Any) -> Any:
    """A hashable stand-in for a constant argument (its repr where it is not hashable)."""
    try:
        hash(v)
        return (type(v).__name__, v)
    except TypeError:
        return ("repr", repr(v))


def _arg_key(a: Any, node_key: Callable[[fx.Node], Any]) -> Any:
    """A hashable form of a node's argument ``a``: its structure and constants, each node in it
    as ``node_key`` names it."""
    if isinstance(a, fx.Node):
        return node_key(a)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg_key(x, node_key) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((k, _arg_key(v, node_key)) for k, v in a.items())))
    return _constant(a)


def _signature(n: fx.Node, i: int) -> tuple:
    """The node's target and constant arguments, its node arguments unnamed: equal for the same
    node of two identical layers, whether it reads a value of its own layer or one all layers
    share (the rotary tables, the mask); the windows are checked exactly afterwards
    (:func:`_pattern`)."""
    if _writes(n):
        return ("writes", i)  # never equal to another: a write breaks every repeat
    return (n.target, _arg_key(n.args, _unnamed), _arg_key(n.kwargs, _unnamed))


def _unnamed(_: fx.Node) -> str:
    return "node"


def _period(sigs: list[tuple]) -> Optional[tuple[int, int, int]]:
    """``(start, stop, length)``: the stretch ``sigs[start:stop]`` that repeats with period
    ``length`` and covers the most nodes in whole periods (the shortest such period), or None."""
    where: dict[Any, list[int]] = {}
    for i, c in enumerate(sigs):
        where.setdefault(c, []).append(i)
    # a layer's period is a gap between equal signatures; shorter gaps (a layer's own repeated
    # getitems and transposes) are far more common, so they are dropped before the ranking
    gaps = Counter(b - a for places in where.values() for a, b in zip(places, places[1:])
                   if b - a >= MIN_REGION_NODES)
    best: Optional[tuple[int, int, int]] = None
    for length, _ in gaps.most_common(PERIOD_CANDIDATES):
        run_start, span = None, None
        for i in range(len(sigs) - length + 1):
            same = i + length < len(sigs) and sigs[i] == sigs[i + length]
            if same and run_start is None:
                run_start = i
            if not same and run_start is not None:
                # sigs[run_start:i + length] repeats with period `length`
                if span is None or i + length - run_start > span[1] - span[0]:
                    span = (run_start, i + length)
                run_start = None
        if span is None or span[1] - span[0] < 2 * length:
            continue
        if best is None or _whole(span, length) > _whole(best[:2], best[2]) * 1.05:
            best = (span[0], span[1], length)
    return best


def _whole(span: tuple[int, int], length: int) -> int:
    """The nodes of ``span`` in whole periods of ``length``."""
    return (span[1] - span[0]) // length * length


# -- windows ---------------------------------------------------------------------------------

def _windows(nodes: list[fx.Node], index: dict[fx.Node, int], start: int, stop: int,
             length: int) -> Optional[tuple[int, int]]:
    """``(first, count)``: ``count`` consecutive windows of ``length`` nodes from
    ``nodes[first]``, each matching the first exactly (:func:`_pattern`), at the phase inside
    the stretch where the fewest values cross a window's edge; None if fewer than two."""
    phase = _quietest_phase(nodes, index, start, stop, length)
    first = start + phase
    count = (stop - first) // length
    if count < 2:
        return None
    pattern = _pattern(nodes, index, first, length)
    if pattern is None:
        return None
    n = 1
    while n < count and _pattern(nodes, index, first + n * length, length) == pattern:
        n += 1
    return (first, n) if n >= 2 else None


def _quietest_phase(nodes: list[fx.Node], index: dict[fx.Node, int], start: int, stop: int, length: int) -> int:
    """The offset in ``[0, length)`` at which the most whole windows fit in the stretch and,
    among those, the fewest values are read across a window's edge (a value crosses at phase
    ``p`` when a window boundary lies between it and its last reader); ties: the smallest."""
    cuts = [0] * length
    for i in range(start, stop):
        last = max((index.get(u, -1) for u in nodes[i].users), default=-1)
        if last <= i:
            continue
        if last - i >= length:
            continue  # read a window or more later: an operand at every phase alike
        # a value that is not one tensor (a multi-output call before its getitems) cannot be a result
        weight = 1 if isinstance(nodes[i].meta.get("val"), torch.Tensor) else len(nodes)
        for b in range(i + 1, min(last, stop - 1) + 1):
            cuts[(b - start) % length] += weight
    fits = [(stop - start - p) // length for p in range(length)]
    return min(range(length), key=lambda p: (-fits[p], cuts[p], p))


def _pattern(nodes: list[fx.Node], index: dict[fx.Node, int], first: int, length: int) -> Optional[tuple]:
    """What must be equal for two windows to be one subgraph: each node's target and constant
    arguments, arguments inside the window by position, arguments outside by the order they
    are first read in (the same outside node twice is one operand); None where the window
    holds a write."""
    outside: dict[fx.Node, int] = {}

    def place(a: fx.Node) -> tuple:
        j = index.get(a)
        if j is not None and first <= j < first + length:
            return ("at", j - first)
        return ("operand", outside.setdefault(a, len(outside)))

    out = []
    for n in nodes[first:first + length]:
        if _writes(n):
            return None
        out.append((n.target, _arg_key(n.args, place), _arg_key(n.kwargs, place)))
    return tuple(out)


# -- the outlined graph ----------------------------------------------------------------------

def _outline(gm: fx.GraphModule, nodes: list[fx.Node], index: dict[fx.Node, int], first: int,
             count: int, length: int) -> tuple[fx.GraphModule, Repeats]:
    """The graph with each window's :func:`_segments` as calls of one subgraph per segment;
    the nodes between them (the values a layer writes back into its inputs) stay as they are."""
    holes = {k - first for k in range(first, first + length) if _feeds_write(nodes[k])}
    segments = [seg for seg in _segments(length, holes) if len(seg) >= MIN_SEGMENT_NODES]
    if not segments:
        raise _Refused("the values a layer writes back leave no run of nodes long enough between them")
    # first node -> its call: subgraph, part, operands, results, views made again outside
    calls: dict[int, tuple[str, range, list[fx.Node], list[int], dict[int, int]]] = {}
    root: dict[str, Any] = {n.target: operator.attrgetter(n.target)(gm) for n in gm.graph.nodes if n.op == "get_attr"}
    operands_n = results_n = 0
    for seg in segments:
        parts = [range(first + w * length + seg.start, first + w * length + seg.stop) for w in range(count)]
        # the positions any window's value is read at from outside its part
        results = sorted({k - part.start for part in parts for k in part
                          if any(index.get(u) is None or index[u] not in part for u in nodes[k].users)})
        operands = [_operands(nodes, index, part) for part in parts]
        # a view of a value made inside leaves as that value, the view made again outside
        inside = _views_inside(nodes, parts[0])
        views = {k: inside[k] for k in results if k in inside}
        returned = sorted((set(results) - set(views)) | set(views.values()))
        for part, ops in zip(parts, operands):
            _check_results(gm, nodes, part, returned, ops)
        attr = _free_name(root, "mugraph_repeat")
        root[attr] = _subgraph(nodes, parts[0], operands[0], returned)
        for part, ops in zip(parts, operands):
            calls[part.start] = (attr, part, ops, returned, views)
        operands_n, results_n = operands_n + len(operands[0]), results_n + len(returned)
    inside = {nodes[k] for _, part, *_ in calls.values() for k in part}
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in gm.graph.nodes:  # placeholders, then every constant: a window may read one defined inside its span
        if n.op in ("placeholder", "get_attr"):
            env[n] = new.node_copy(n, lambda a: env[a])
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            continue
        i = index.get(n)
        if i in calls:
            attr, part, ops, results, views = calls[i]
            call = new.call_function(torch.ops.higher_order.invoke_subgraph,
                                     (new.get_attr(attr), attr, *[env[o] for o in ops]))
            for pos, k in enumerate(results):
                got = new.call_function(operator.getitem, (call, pos))
                got.meta.update(nodes[part.start + k].meta)
                env[nodes[part.start + k]] = got
            for k in views:
                _view_again(new, env, nodes[part.start + k])
        elif n not in inside:
            env[n] = new.node_copy(n, lambda a: env[a])
    out = fx.GraphModule(root, new, gm.__class__.__name__)
    return out, Repeats(count, length, len(segments), operands_n, results_n)


def _feeds_write(n: fx.Node) -> bool:
    """Whether ``n``'s value is written into another tensor (the source of a ``copy_`` into a
    graph input: a functional graph's KV-cache update). Such a value stays outside any
    subgraph: made inside one it would be a fresh tensor — a copy of the whole cache slot —
    where Inductor, seeing it beside its write, updates the input in place."""
    return any(_writes(u) and n in u.all_input_nodes and (not u.args or u.args[0] is not n) for u in n.users)


def _segments(length: int, holes: set[int]) -> list[range]:
    """The runs of positions in ``[0, length)`` between ``holes``."""
    out, begin = [], 0
    for k in sorted(holes) + [length]:
        if k > begin:
            out.append(range(begin, k))
        begin = k + 1
    return out


def _operands(nodes: list[fx.Node], index: dict[fx.Node, int], w: range) -> list[fx.Node]:
    """The window's outside arguments in the order its nodes first read them."""
    seen: dict[fx.Node, None] = {}
    for k in w:
        for a in nodes[k].all_input_nodes:  # in the order the arguments hold them, as _pattern numbers them
            j = index.get(a)
            if j is None or j not in w:
                seen.setdefault(a)
    return list(seen)


def _check_results(gm: fx.GraphModule, nodes: list[fx.Node], w: range, results: list[int], operands: list[fx.Node]) -> None:
    """Refuses a window whose operands or results are not plain tensors, or whose results are
    views (:func:`_view_base`: of an operand, or of a value made inside that :func:`_outline`
    does not make again outside): ``invoke_subgraph`` returns fresh tensors only. Aliasing is
    read from the operators' schemas, never from the example values' storages, which the
    backend's graphs make one node at a time and never share."""
    for o in operands:
        v = operator.attrgetter(o.target)(gm) if o.op == "get_attr" else o.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise _Refused(f"{o.name}, read by a layer, is not a tensor")
    for k in results:
        n = nodes[w.start + k]
        if not isinstance(n.meta.get("val"), torch.Tensor):
            raise _Refused(f"{n.name} is read across a layer's edge and is not one tensor")
        base = _view_base(n)
        if base is not n:
            raise _Refused(f"{n.name} is read across a layer's edge as a view of {base.name}")


def _subgraph(nodes: list[fx.Node], w: range, operands: list[fx.Node], results: list[int]) -> fx.GraphModule:
    """The first window as a graph of its own: a placeholder per operand, its results as a tuple."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, o in enumerate(operands):
        p = g.placeholder(f"arg{i}")
        p.meta.update(o.meta)
        env[o] = p
    for k in w:
        env[nodes[k]] = g.node_copy(nodes[k], lambda a: env[a])
    g.output(tuple(env[nodes[w.start + k]] for k in results))
    return fx.GraphModule(torch.nn.Module(), g, "repeated_layer")


def _view_again(new: fx.Graph, env: dict[fx.Node, fx.Node], n: fx.Node) -> None:
    """View node ``n``, read outside its window, made again in ``new`` after the call that
    returns its base (:func:`_view_base`, whose copy ``env`` holds): each view of the chain
    copied in order, ``env[n]`` the last."""
    chain = []
    while n not in env:
        chain.append(n)
        n = n.args[0]
    for c in reversed(chain):
        env[c] = new.node_copy(c, lambda a: env[a])


def _views_inside(nodes: list[fx.Node], w: range) -> dict[int, int]:
    """The positions in window ``w`` whose values are views of a value made inside it, through
    views whose other arguments are constants, each with its base's position
    (:func:`_view_chain`).

    Why such a value, read outside the window, leaves the subgraph as its base, the view made
    again outside (:func:`_view_again`): Inductor's subgraph returned the view of a buffer of
    its own, and the graph around it read another place (a Phi-3's v, a slice of its fused q/k/v
    product, copied into the KV cache as zeros and NaN; torch 2.13 on the CPU, and the same NaN
    on an H200, torch 2.11). A copy made inside the subgraph does not help: Inductor removes a
    clone whose strides equal its source's, whatever its offset."""
    at = {nodes[k]: k - w.start for k in w}
    out = {}
    for k in w:
        chain = _view_chain(nodes[k])
        if chain and chain[-1].args[0] in at and all(a is c.args[0] for c in chain for a in c.all_input_nodes):
            out[k - w.start] = at[chain[-1].args[0]]
    return out


def _view_chain(n: fx.Node) -> list[fx.Node]:
    """The views from ``n`` back to the value they view, ``n`` first (an operator whose schema
    says its result aliases its first argument; a getitem of such a call's list); empty where
    ``n`` is no view. Read from the schemas, not the example values' storages: the graph's
    example values are made one node at a time and share no storage."""
    chain = []
    while True:
        src = n.args[0] if n.target is operator.getitem and n.args and isinstance(n.args[0], fx.Node) else n
        schema = getattr(src.target, "_schema", None)
        aliases = schema is not None and schema.returns and schema.returns[0].alias_info is not None
        if not (aliases and not schema.is_mutable and src.args and isinstance(src.args[0], fx.Node)):
            return chain
        chain += [n] if src is n else [n, src]
        n = src.args[0]


def _view_base(n: fx.Node) -> fx.Node:
    """The value ``n`` is a view of (:func:`_view_chain`); ``n`` itself when it is no view."""
    chain = _view_chain(n)
    return chain[-1].args[0] if chain else n


def _free_name(taken: dict[str, Any], stem: str) -> str:
    name, i = stem, 0
    while name in taken:
        i += 1
        name = f"{stem}_{i}"
    return name
