"""Pieces as mugraph Programs, and the captured graph rewritten around them
(docs/design.md §10.3–10.4).

A piece's Program has one input per tensor it reads from outside (in order of
first use), then one per constant a row asked for (RoPE's rotation matrix), and
one output per member value read outside it. Its name is a hash of its structure
and shapes, so equal pieces — the same block at the same shapes, in this model or
another — share one cached search. An input may be a strided view (a transposed
weight the partition left to torch, :func:`.partition.fold_views`): its strides are
recorded (``input_strides``) and the lowering reads it through them, which is not
part of the name — the search does not depend on it — but is part of the compiled
operator's (:attr:`BuiltPiece.layout_key`).
"""

from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx

from verify.equivalence import per_test_bound

from ..core import builder as B
from ..core.interpreter import evaluate
from ..core.ir import Program
from ..core.lax import check_lax
from ..core.serialize import graph_to_json
from .aten import VIEW_OPS, Context
from .capture import PIECE_CALL, _val, build_node, dtype_name, tensor_args
from .kernels import counters_of, returns_one
from .partition import Piece, piece_dtype
from .simplify import fold_reciprocals
from .trace_memo import lazy_module


@dataclass(eq=False)
class BuiltPiece:
    """One Lax piece: its nodes, its Program and how it connects to the graph."""

    piece: Piece
    program: Program
    inputs: list[fx.Node]
    constants: list[torch.Tensor]
    outputs: list[fx.Node]
    key: str
    info: dict = field(default_factory=dict)
    #: strides (elements) of each Program input as traced (a row's constants are row-major),
    #: and of each output as eager PyTorch laid the value out (row-major where that layout
    #: was not dense: an expand's stride 0)
    input_strides: list[tuple[int, ...]] = field(default_factory=list)
    output_strides: list[tuple[int, ...]] = field(default_factory=list)
    #: for each node of ``outputs``, the Program output holding its value (nodes equal
    #: in value and layout share one)
    output_index: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def strided(self) -> dict[str, tuple[int, ...]]:
        """Program input name -> strides, for the inputs that arrive as strided views
        (not row-major on some dim longer than 1): ``lower.compile(input_strides=)``."""
        return {t.name: st for t, st in zip(self.program.inputs, self.input_strides) if not _is_row_major(t.shape, st)}

    @property
    def strided_outputs(self) -> dict[int, tuple[int, ...]]:
        """Output index -> strides, for the outputs eager PyTorch did not lay out
        row-major (an element-wise op of a transposed view keeps its layout):
        ``lower.compile(output_strides=)``, so a torch view of the output behaves as in eager."""
        return {k: st for k, (t, st) in enumerate(zip(self.program.outputs, self.output_strides))
                if not _is_row_major(t.shape, st)}

    @property
    def layout_key(self) -> str:
        """A short hash of :attr:`strided` and :attr:`strided_outputs` ("" when all are
        row-major): pieces with one Program but other strides share a search, not kernels."""
        s = [sorted(self.strided.items()), sorted(self.strided_outputs.items())]
        return hashlib.sha256(json.dumps(s).encode()).hexdigest()[:8] if s != [[], []] else ""

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for op in self.program.ops:
            if op.kind != "input":
                kinds[op.kind] = kinds.get(op.kind, 0) + 1
        ins = ", ".join(f"{tuple(t.shape)}" for t in self.program.inputs)
        return (f"{self.name}: {sum(kinds.values())} ops ({', '.join(f'{k}×{n}' for k, n in sorted(kinds.items()))}); "
                f"inputs {ins}")


def _view_key(n: fx.Node, env: dict) -> tuple | None:
    """What identifies the value of view node ``n`` (its op, its input's tensor, its other
    arguments), or None for a node that is not a view."""
    if n.target not in VIEW_OPS:
        return None
    args = tuple(("t", id(env[a])) if isinstance(a, fx.Node) else a for a in n.args)
    return (n.target, repr(args), repr(sorted(n.kwargs.items())))


def _row_major(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def _is_row_major(shape, strides) -> bool:
    return all(n == 1 or a == b for n, a, b in zip(shape, strides, _row_major(shape)))


def _dense_strides(v: torch.Tensor) -> tuple[int, ...]:
    """``v``'s strides if its elements fill a block of memory without overlap (a permuted
    row-major layout), else row-major."""
    st, shape = tuple(int(s) for s in v.stride()), tuple(int(n) for n in v.shape)
    span = 1
    for d in sorted((d for d in range(len(shape)) if shape[d] > 1), key=lambda d: st[d]):
        if st[d] != span:
            return _row_major(shape)
        span *= shape[d]
    return st


def structural_key(program: Program) -> str:
    doc = graph_to_json(program)
    doc.pop("name", None)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def constant_name(i: int) -> str:
    """The Program input that carries the piece's ``i``-th constant (:attr:`BuiltPiece.constants`)."""
    return f"c{i}"


def build_piece(piece: Piece) -> BuiltPiece:
    """The piece as a Program (checked to be Lax) and its connections. A piece with float
    casts inside runs at its narrow dtype (:func:`.partition.piece_dtype`): its inputs are
    made at that dtype and every row builds on them, the casts as the identity."""
    members = set(piece.nodes)
    dtype = piece_dtype(members)  # the partition kept only pieces with one (its cast rule)
    p = Program("piece")
    env: dict[fx.Node, Any] = {}
    inputs: list[fx.Node] = []
    for n in piece.nodes:
        for a in tensor_args(n):
            if a not in members and a not in env:
                v = _val(a)
                env[a] = p.input(f"x{len(inputs)}", tuple(int(s) for s in v.shape), dtype or dtype_name(v.dtype))
                inputs.append(a)
    ctx = Context(lambda i, t, fill=None: p.input(constant_name(i), tuple(t.shape), dtype_name(t.dtype), fill=fill))
    outputs = [n for n in piece.nodes if any(u not in members for u in n.users)]
    views: dict[tuple, Any] = {}
    for n in piece.nodes:
        # the same view of the same value twice (make_fx traces one per ``linear`` reading
        # it) is built once, so the search meets one reshape, not two equal ones
        key = _view_key(n, env) if n not in outputs else None
        if key is not None and key in views:
            env[n] = views[key]
            continue
        env[n] = build_node(n, env, ctx)
        if key is not None:
            views[key] = env[n]
    # a copy or cast builds no op (its row returns its input), so two output nodes may be
    # one tensor — written once when eager laid them out alike — or an output may be an
    # input, which only then costs an identity op (a Program's outputs are computed)
    out_tensors: list[tuple[Any, tuple[int, ...]]] = []
    index: list[int] = []
    for n in outputs:
        t, st = env[n], _dense_strides(_val(n))
        k = next((i for i, (u, ust) in enumerate(out_tensors) if u is t and ust == st), None)
        if k is None:
            if t.op.kind == "input" or any(u is t for u, _ in out_tensors):
                t = B.reshape(t, t.shape)
            p.output(t)
            out_tensors.append((t, st))
            k = len(out_tensors) - 1
        index.append(k)
    p = fold_reciprocals(p)  # x * (1/sqrt(v)) as x / sqrt(v): one op, no constant to carry
    check_lax(p)
    key = structural_key(p)
    p.name = f"piece_{key[:16]}"
    strides = [tuple(int(s) for s in _val(a).stride()) for a in inputs]
    strides += [_row_major(tuple(c.shape)) for c in ctx.constants]
    return BuiltPiece(piece, p, inputs, list(ctx.constants), outputs, key, input_strides=strides,
                      output_strides=[st for _, st in out_tensors], output_index=index)


#: per-test bounds of pieces' programs against themselves, by structural key: a model's
#: identical layers ask once
_SELF_BOUNDS: dict[str, float] = {}


def provable(members: set[fx.Node]) -> bool:
    """Whether the verifier could prove a μGraph of the piece ``members``: a field test of its
    program against itself has a per-test bound below 1 (design §4.6). A candidate computes
    the same function, so where the program's own bound is 1 — a sum of values each divided
    by its own exponential, whose common denominator has a term per summed element — no
    number of passing tests proves one either, and a search would ship nothing. The
    partition cuts such a piece (:func:`.partition._cut_unprovable`). A set of nodes that
    does not build as a piece counts as provable: the partition leaves it as it is."""
    try:
        p = build_piece(Piece(sorted(members))).program
    except Exception:  # noqa: BLE001 - not a piece the partition would cut
        return True
    key = structural_key(p)
    if key not in _SELF_BOUNDS:
        _SELF_BOUNDS[key] = per_test_bound(p, p)[0]
    return _SELF_BOUNDS[key] < 1.0


def torch_module(bp: BuiltPiece) -> fx.GraphModule:
    """The piece's own torch ops as a module: ``module(*inputs)`` (in :attr:`BuiltPiece.inputs`'
    order) returns the tuple of its outputs (in :attr:`BuiltPiece.outputs`' order). What the
    piece would run as torch code — the never-slower rule times it against the μGraph."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, a in enumerate(bp.inputs):
        env[a] = g.placeholder(f"x{i}")
        env[a].meta = dict(a.meta)
    for n in bp.piece.nodes:
        outside = [a.name for a in n.all_input_nodes if a not in env]
        if outside:
            raise ValueError(f"{bp.name}: node {n.name} reads {outside[0]}, neither in the piece nor one of its inputs")
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[n] for n in bp.outputs))
    gm = fx.GraphModule(torch.nn.Module(), g)
    gm.graph.lint()
    return gm


def example_inputs(bp: BuiltPiece, device: str, seed: int = 0) -> list[torch.Tensor]:
    """Random tensors shaped, strided and typed like the piece's inputs as traced, on
    ``device`` (a strided view — a transposed weight — is a view of the same kind here, so
    both forms read it as they will in the model); then the piece's constants (which only
    its Program reads: the torch ops build them themselves). Values are
    standard normal (integers: zeros): timing does not depend on them."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for a in bp.inputs:
        v = _val(a)
        shape, stride = tuple(int(s) for s in v.shape), tuple(int(s) for s in v.stride())
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
        base = (torch.randn(span, generator=gen).to(v.dtype) if v.dtype.is_floating_point
                else torch.zeros(span, dtype=v.dtype))
        out.append(base.to(device).as_strided(shape, stride))
    return out + [c.to(device) for c in bp.constants]


PieceCall = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def reference_call(bp: BuiltPiece) -> PieceCall:
    """The piece evaluated by mugraph's float64 interpreter: the captured form's meaning,
    for tests. Results are float64, laid out as the compiled piece lays them out (as
    eager did: :attr:`BuiltPiece.output_strides`)."""
    def call(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        feed = {t.name: x.detach().double().cpu().numpy() for t, x in zip(bp.program.inputs, xs)}
        outs = evaluate(bp.program, feed)
        dev = xs[0].device if xs else torch.device("cpu")
        res = []
        for o, st in zip(outs, bp.output_strides):
            o = torch.from_numpy(np.asarray(o, dtype=np.float64))
            res.append(torch.empty_strided(tuple(o.shape), st, dtype=o.dtype, device=dev).copy_(o))
        return res
    call.__name__ = f"ref_{bp.name}"
    return call


def rewrite(gm: fx.GraphModule, pieces: list[BuiltPiece], call_of: Callable[[BuiltPiece], Any],
            edit: Callable[[fx.Graph], Any] | None = None) -> fx.GraphModule:
    """A new graph in which each piece is one call of ``call_of(piece)`` (taking the
    list of its inputs, returning the list of its outputs) and every other node is
    copied. Nodes are emitted in a topological order of the contracted graph that
    keeps the original order wherever it can (the graph is functional, so any
    topological order computes the same values). ``edit``: applied to the new graph
    before its module is made, so that the module's code is generated once."""
    owner: dict[fx.Node, BuiltPiece] = {n: bp for bp in pieces for n in bp.piece.nodes}
    order = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(order)}
    units: list[Any] = []
    seen: set[int] = set()
    for n in order:
        bp = owner.get(n)
        if bp is None:
            units.append(n)
        elif id(bp) not in seen:
            seen.add(id(bp))
            units.append(bp)

    def unit_of(n: fx.Node):
        return owner.get(n, n)

    def deps(u) -> set:
        nodes = u.piece.nodes if isinstance(u, BuiltPiece) else [u]
        return {unit_of(a) for m in nodes for a in m.all_input_nodes} - {u}

    import heapq

    pos = {id(u): (index[u.piece.nodes[0]] if isinstance(u, BuiltPiece) else index[u]) for u in units}
    waiting = {id(u): len(deps(u)) for u in units}
    users: dict[int, list] = {}
    for u in units:
        for d in deps(u):
            users.setdefault(id(d), []).append(u)
    heap = [(pos[id(u)], k, u) for k, u in enumerate(units) if waiting[id(u)] == 0]
    heapq.heapify(heap)
    tie = len(units)
    g = fx.Graph()
    new: dict[fx.Node, fx.Node] = {}

    def buffer(name: str, make: Callable[[], torch.Tensor]) -> fx.Node:
        """A ``get_attr`` of ``gm``'s buffer ``name``, registered from ``make()`` the first time."""
        if not hasattr(gm, name):
            gm.register_buffer(name, make())
        return g.get_attr(name)

    emitted = 0
    while heap:
        _, _, u = heapq.heappop(heap)
        emitted += 1
        if isinstance(u, BuiltPiece):
            # a row's constants (RoPE's rotation matrix) are built on the CPU: they go where the piece runs
            device = next((a.meta["val"].device for a in u.inputs if isinstance(a.meta.get("val"), torch.Tensor)),
                          None)
            cnodes = [buffer(f"_mugraph_{u.name}_c{j}", lambda c=c: c if device is None else c.to(device))
                      for j, c in enumerate(u.constants)]
            target = call_of(u)
            args: tuple = ([new[a] for a in u.inputs] + cnodes,)
            slots = counters_of(target)
            if slots:  # split-K counters: one buffer per operator and device, left zero by every call
                # (kernels.counter_slots)
                name = "_mugraph_counters_" + hashlib.sha256(f"{target} {device}".encode()).hexdigest()[:16]
                args = (*args, buffer(name, lambda: torch.zeros(slots, dtype=torch.int32, device=device)))
            call = g.call_function(target, args)
            call.meta[PIECE_CALL] = u.name  # what later passes on the stitched graph tell from torch code
            one = returns_one(target)
            for k, o in zip(u.output_index, u.outputs):
                new[o] = call if one else g.call_function(operator.getitem, (call, k))
                new[o].meta.update(o.meta)
        else:
            new[u] = g.node_copy(u, lambda a: new[a])
        for v in users.get(id(u), ()):
            waiting[id(v)] -= 1
            if waiting[id(v)] == 0:
                tie += 1
                heapq.heappush(heap, (pos[id(v)], tie, v))
    if emitted != len(units):
        raise AssertionError("the contracted graph has a cycle (the partition must prevent this)")
    if edit is not None:
        edit(g)
    out = lazy_module(g, gm)  # its code is generated where it is called or keyed, once
    out.graph.lint()
    return out
