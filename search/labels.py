"""Index labels: a shape-aware filter on top of abstract expressions (docs/design.md §5.5).

The axioms A_eq are blind to dimensions, so they keep meaningless prefixes (an
element-wise product of two equally-shaped tiles that index different things).
Labels restore that information, in the spirit of Mirage's range propagation.

Every dim of the program is given an *index class* by unification (the two
contracted dims of a matmul are one class, the dims an element-wise op lines up
are one class, …). A dim of any tensor the search builds is labelled by a tuple
of parts ``((class, size), …)``, major to minor, whose sizes multiply to the
dim's size: a device tensor's dim is usually one part; an output saver that lays
grid blocks side by side along a dim prepends the grid axis' part (a split-KV
kernel writes its chunks of ``s`` next to each other along the head dim:
``((s, 16), (h, 64))``). Size-1 dims have the empty label ``()``; ``None`` is
unknown and matches anything (reshape, concat).

Rules: ops combine dims only when their labels agree (or one is unknown); an
input iterator splitting a dim by ``g`` takes the dim's major part (so a grid
axis or the loop walks one index class, the same for every input it splits).

This filter is sound for the hand-written reference μGraphs (tested, Theorem 1),
but it is a restriction we chose, not an axiom: a μGraph that combines dims of
different classes, or reduces a class the program never reduces, is never generated.
"""

from __future__ import annotations

from typing import Optional, Sequence

from mugraph.core.ir import KernelGraph
from mugraph.core.ops import dim_map
from mugraph.core.unionfind import UnionFind

Part = tuple[int, int]
Label = Optional[tuple[Part, ...]]
Labels = tuple[Label, ...]


class LabelError(Exception):
    """Labels of the dims an op lines up differ."""


def norm(parts: Sequence[Part]) -> tuple[Part, ...]:
    """Merge adjacent parts of one class, drop size-1 parts."""
    out: list[Part] = []
    for c, s in parts:
        if s == 1:
            continue
        if out and out[-1][0] == c:
            out[-1] = (c, out[-1][1] * s)
        else:
            out.append((c, s))
    return tuple(out)


def agree(a: Label, b: Label) -> Label:
    if a is None:
        return b
    if b is None or a == b:
        return a
    raise LabelError(f"{a} != {b}")


def op_labels(kind: str, labels: list[Labels], shapes: list[tuple], attrs: dict, out_shape: tuple) -> Labels:
    """Labels of a catalog op's output, from its :func:`~mugraph.core.ops.dim_map`: a dim
    takes the labels of the input dims that are the same axis (they must agree;
    broadcast size-1 dims do not count), the dims of a contracted axis must agree,
    a reduced dim has size 1, a dim whose elements move is unknown. Raises
    :class:`LabelError` on a mismatch."""
    dm = dim_map(kind, shapes, attrs, out_shape)
    for (i, d), *rest in dm.contracted:
        if shapes[i][d] != 1:
            for j, e in rest:
                agree(labels[i][d], labels[j][e])
    out: list[Label] = [()] * len(out_shape)
    for i, dx, do in dm.same:
        if shapes[i][dx] == 1:
            continue
        cur, lab = out[do], labels[i][dx]
        out[do] = lab if cur == () else agree(cur, lab)
    for d in dm.moved_out:
        out[d] = None if out_shape[d] > 1 else ()
    return tuple(out)


def reduced_dims(kind: str, shapes: list[tuple], attrs: dict, out_shape: tuple) -> list[tuple[int, int]]:
    """``(input, dim)`` of the dims ``kind`` adds terms up along (a reduction's dim, one
    dim of each contracted axis longer than 1)."""
    dm = dim_map(kind, shapes, attrs, out_shape)
    return list(dm.reduced) + [g[0] for g in dm.contracted if shapes[g[0][0]][g[0][1]] > 1]


def split(label: Label, g: int) -> tuple[Optional[int], Label] | None:
    """Split a dim by ``g`` along its major part: (class walked, remaining label), or
    None when ``g`` does not split the major part (it would mix index classes)."""
    if g == 1:
        return -1, label
    if label is None:
        return None, None
    if not label:
        return None
    (c, s), rest = label[0], label[1:]
    if s % g:
        return None
    return c, norm(((c, s // g),) + rest)


def saved(label: Label, cls: Optional[int], g: int) -> Label:
    """Label of a dim an output saver multiplies by grid axis (class ``cls``, size ``g``)."""
    if label is None or cls is None:
        return None
    return norm(((cls, g),) + label)


def compatible(a: Labels, b: Labels) -> bool:
    try:
        for x, y in zip(a, b):
            agree(x, y)
        return len(a) == len(b)
    except LabelError:
        return False


def program_labels(program: KernelGraph) -> tuple[dict[str, Labels], list[Labels], frozenset]:
    """Index classes of a program by unification: labels of its inputs and outputs, and
    the classes it reduces (contracted by a matmul or folded by a reduction). A μGraph can only
    add terms up along a reduced class, so sums, matmul contractions and loops
    (whose accumulators sum over iterations) are restricted to those classes."""
    uf: UnionFind[tuple] = UnionFind()
    find, union = uf.find, uf.union

    slot = {}  # tensor id -> list of slot keys (None for size-1 dims)
    for op in program.ops:
        for t in op.outputs:
            slot[t.id] = [(t.id, d) if s > 1 else None for d, s in enumerate(t.shape)]
            for k in slot[t.id]:
                if k is not None:
                    find(k)
        if op.kind == "input":
            continue
        out = op.outputs[0]
        ins = [slot[t.id] for t in op.inputs]
        so = slot[out.id]

        def tie(a, b):
            if a is not None and b is not None:
                union(a, b)

        dm = dim_map(op.kind, [t.shape for t in op.inputs], op.attrs, out.shape)
        for i, dx, do in dm.same:
            tie(so[do], ins[i][dx])
        for (i, d), *rest in dm.contracted:
            for j, e in rest:
                tie(ins[i][d], ins[j][e])
    # outputs of one shape are tiled alike: one grid axis may cut a dim of each (two
    # projections of one activation computed side by side, a piece of a composition whose
    # outputs nothing ties; as separate classes no axis could cut both, and only a kernel
    # holding each output whole was generated)
    by_shape: dict[tuple, list] = {}
    for t in program.outputs:
        by_shape.setdefault(tuple(t.shape), []).append(t)
    for same in by_shape.values():
        for t in same[1:]:
            for a, b in zip(slot[same[0].id], slot[t.id]):
                if a is not None and b is not None:
                    union(a, b)
    ids: dict[tuple, int] = {}

    def labels_of(t) -> Labels:
        out = []
        for k, s in zip(slot[t.id], t.shape):
            if k is None:
                out.append(())
            else:
                r = find(k)
                out.append(((ids.setdefault(r, len(ids)), s),))
        return tuple(out)

    ins = {t.name: labels_of(t) for t in program.inputs}
    outs = [labels_of(t) for t in program.outputs]
    reduced = set()
    for op in program.ops:
        if op.kind == "input":
            continue
        for i, d in reduced_dims(op.kind, [t.shape for t in op.inputs], op.attrs, op.outputs[0].shape):
            k = slot[op.inputs[i].id][d]
            if k is not None:
                reduced.add(ids.setdefault(find(k), len(ids)))
    return ins, outs, frozenset(reduced)


def reduces_only(label: Label, reduced: frozenset) -> bool:
    """Does a dim with this label index only classes the program reduces?"""
    return label is None or all(c in reduced for c, _ in label)
