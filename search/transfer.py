"""A μGraph found for one program, carried to the same program at other sizes.

Programs that differ only in their sizes — a decode step over 2k and over 8k cached keys,
a prompt of 2k and of 8k tokens, one token and eight — have the same μGraphs up to their
grids and loop lengths: a kernel that reads its keys in tiles of 64 over 32 loop steps
reads four times the keys in 128 steps of the same tiles. :func:`transfer` replays a found
graph on the other program's inputs, every graph-defined kernel's grid axes and loop
scaled by the growth of the dims they cut, so each tile keeps its shape. The result is a
candidate like any other: the driver verifies it against the new program from scratch
(origin ``"transfer"``) and derives its split and tile variants; nothing is assumed about
it. :func:`structure_key` names what must agree for a transfer to be tried: the programs'
ops, attributes, dtypes and ranks, everything but sizes.

The other direction serves a program too large to search well at its own sizes
(:func:`shrunk`): the same program at smaller sizes is searched first, and what it finds
is carried up as seeds (``mugraph.pipeline.optimize``, the scout).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Optional

from mugraph.core.errors import MugraphError
from mugraph.core.ops import CATALOG
from mugraph.core.ir import BlockGraph, KernelGraph, Op, Program, Tensor
from mugraph.core.rewrite import GD, Rebuild, splice
from mugraph.core.serialize import graph_to_json

from .rewrite import _replay_block


def structure_key(program: Program) -> str:
    """A hash of ``program`` with its sizes left out (its inputs' and reshapes' shapes by
    rank only, and its name): equal for the same program at other sizes."""
    return structure_key_of(graph_to_json(program))


def structure_key_of(doc: dict) -> str:
    """:func:`structure_key` of a program's JSON (``graph_to_json``), for a caller that has
    it already (the result cache's key document holds it)."""
    ops = []
    for op in doc["ops"]:
        op = dict(op)
        op.pop("name", None)
        if "shape" in op:
            op["shape"] = len(op["shape"])
        if isinstance(op.get("attrs"), dict) and "shape" in op["attrs"]:
            op["attrs"] = {**op["attrs"], "shape": len(op["attrs"]["shape"])}
        ops.append(op)
    text = json.dumps({"ops": ops, "outputs": doc["outputs"]}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _ratio(old: int, new: int) -> Optional[tuple[int, int]]:
    """How a dim of ``old`` elements became one of ``new``: (multiply, divide) by whole factors."""
    if new % old == 0:
        return new // old, 1
    if old % new == 0:
        return 1, old // new
    return None


def _scaled(n: int, r: tuple[int, int]) -> Optional[int]:
    m, d = r
    return n * m // d if (n * m) % d == 0 else None


def _grid_and_loop(bg: BlockGraph, rb: Rebuild) -> Optional[tuple[tuple, int]]:
    """The grid and loop length that keep every tile of ``bg`` its shape on the new
    sources: each grid axis (and the loop) scaled as the source dims it cuts grew — one
    factor per axis, whatever iterator reads it — or None where they disagree or a count
    would not be whole."""
    factors: dict[object, tuple[int, int]] = {}
    for op in bg.ops:
        if op.kind != "iterator":
            continue
        src = bg.sources[op.attrs["source"]]
        new = rb.get(src)
        cuts = [(a, d) for a, d in enumerate(op.attrs["imap"]) if d is not None] + \
            ([("loop", op.attrs["fmap"])] if op.attrs["fmap"] is not None else [])
        for axis, d in cuts:
            r = _ratio(src.shape[d], new.shape[d])
            if r is None or factors.setdefault(axis, r) != r:
                return None
    grid = []
    for a, n in enumerate(bg.grid):
        g = _scaled(n, factors.get(a, (1, 1)))
        if g is None or g < 1:
            return None
        grid.append(g)
    loop = _scaled(bg.forloop, factors.get("loop", (1, 1)))
    if loop is None or loop < 1:
        return None
    return tuple(grid), loop


def transfer(graph: KernelGraph, target: Program) -> Optional[KernelGraph]:
    """``graph`` (a μGraph of a program of ``target``'s structure) replayed on ``target``'s
    inputs, matched by name, each graph-defined kernel on the grid and loop that keep its
    tiles' shapes (:func:`_grid_and_loop`); kernel-level ops replay as they are. None when
    the inputs do not line up or any step is illegal at the new sizes (a count that is not
    whole, a reshape to the old sizes, a rule of the IR)."""
    new_inputs = {t.name: t for t in target.inputs}
    if sorted(new_inputs) != sorted(t.name for t in graph.inputs):
        return None
    if any(len(t.shape) != len(new_inputs[t.name].shape) or t.dtype != new_inputs[t.name].dtype
           for t in graph.inputs):
        return None
    if all(t.shape == new_inputs[t.name].shape for t in graph.inputs):
        return None  # the same sizes: nothing to carry
    ng = type(graph)(target.name)
    m: dict[Tensor, Tensor] = {}
    try:
        for t in graph.inputs:  # in the graph's own order: its kernels name inputs by position
            n = new_inputs[t.name]
            m[t] = ng.input(n.name, n.shape, n.dtype, fill=n.op.attrs.get("fill"))
        splice(ng, graph, m, replace={(op.id, None): _kernel_builder(op) for op in graph.ops if op.kind == GD})
        for t in graph.outputs:
            ng.output(m[t])
    except (MugraphError, ValueError, KeyError, IndexError):
        return None
    if [t.shape for t in ng.outputs] != [t.shape for t in target.outputs]:
        return None
    return ng


def _kernel_builder(op: Op):
    bg: BlockGraph = op.attrs["block"]

    def build(rb: Rebuild, _: Op) -> list[Tensor]:
        shape = _grid_and_loop(bg, rb)
        if shape is None:
            raise ValueError("the kernel's grid and loop do not scale to the new sizes")
        k = BlockGraph(*shape)
        return _replay_block(rb, bg, k, lambda o: k.input(rb.get(bg.sources[o.attrs["source"]]), o.attrs["imap"],
                                                          o.attrs["fmap"]))
    return build


#: a program one of whose tensors holds more elements than this is worth scouting at smaller
#: sizes first: an 8k-token prompt's attention (scores of 2^30 elements) matched nothing in a
#: 60 s search on an H200, where its 2k form (2^27) matched at 34 s
SCOUT_ELEMENTS = 2 ** 28
#: the scaled-down copy's largest tensor holds at most this many elements (where the dims allow):
#: an 8k-token prompt of 16 heads is scouted at 512 tokens. What a search there finds is a tile
#: structure (the rows and keys of a block's step), which carries up unchanged; each of its
#: fingerprints and verifications costs a 256th of one at full size
SCOUT_TARGET = 2 ** 22
#: dims of at least this many elements shrink; none shrinks below :data:`MIN_SHRUNK`
SHRINK_FROM = 1024
MIN_SHRUNK = 256


def largest_tensor(program: KernelGraph) -> int:
    """Elements of ``program``'s largest tensor (an input or an op's result)."""
    return max((math.prod(t.shape) for op in program.ops for t in op.outputs), default=0)


def shrunk(program: Program, target: Optional[int] = None) -> Optional[Program]:
    """``program`` at smaller sizes: every input dim of at least :data:`SHRINK_FROM` elements
    divided by one power of two — by value, so dims that were equal stay equal and the ops
    still agree — the smallest that brings its largest tensor to ``target`` elements
    (default :data:`SCOUT_TARGET`) or below (or the largest the dims allow: none below
    :data:`MIN_SHRUNK`, none left fractional); reshape targets and other shape-valued
    attributes follow by value. None when no dim can shrink or the program does not replay
    at the new sizes.

    Nothing rests on the copy being the same function: it is only searched, and what is
    found for it is carried back to ``program``'s sizes (:func:`transfer`) and verified
    there from scratch. Its constants are ``program``'s own (a mean's 1/N keeps the old N),
    so a μGraph found for it holds the constants ``program`` needs."""
    target = SCOUT_TARGET if target is None else target
    sizes = sorted({d for t in program.inputs for d in t.shape if d >= SHRINK_FROM})
    best = None
    f = 2
    while sizes:
        by = {d: d // f for d in sizes if d % f == 0 and d // f >= MIN_SHRUNK}
        if not by:
            break
        small = _resized(program, by)
        if small is not None:
            best = small
            if largest_tensor(small) <= target:
                break
        f *= 2
    return best


def _shape_attrs(kind: str) -> tuple[str, ...]:
    """The attributes of ``kind`` that hold a shape (a reshape's target, a constant's
    broadcast shape), from the catalog."""
    return tuple(a.name for a in CATALOG[kind].attrs if a.type == "shape") if kind in CATALOG else ()


def _resized(program: Program, by: dict[int, int]) -> Optional[Program]:
    """``program`` replayed on inputs whose dims are mapped by ``by`` (by value), every
    shape-valued attribute alike (:func:`_shape_attrs`); None where a rule of the IR refuses
    the new sizes."""
    def size(shape) -> tuple[int, ...]:
        return tuple(by.get(d, d) for d in shape)

    def resized_attrs(rb, op: Op) -> list[Tensor]:
        attrs = {**op.attrs, **{a: size(op.attrs[a]) for a in _shape_attrs(op.kind) if a in op.attrs}}
        return [rb.add(op, rb.inputs(op), attrs=attrs)]

    small = Program(f"{program.name}_scout")
    m: dict[Tensor, Tensor] = {}
    try:
        replace = {(op.id, None): resized_attrs for op in program.ops if _shape_attrs(op.kind)}
        splice(small, program, m, replace=replace, input_shape=lambda t: size(t.shape))
        for t in program.outputs:
            small.output(m[t])
    except (MugraphError, ValueError, KeyError, IndexError):
        return None
    return small
