"""Disjoint sets (union-find), the one implementation the stages share.

Four analyses group things that an op ties together: element-wise block ops
fused into thread graphs (:func:`mugraph.core.ir.build_thread_graphs`), program ops
into pieces of a cut (:mod:`search.compose`), tensor dims into index classes
(:mod:`search.labels`) and tile dims into dim classes (:mod:`lower.tiles`).

Keys are hashable and ordered (ints, tuples of ints). A union makes the smaller
root the root of the merged set, so a set's root — and anything keyed or sorted
by roots — depends only on the sets, never on the order of the unions. Paths are
halved on every :meth:`find`.
"""

from __future__ import annotations

from typing import Generic, Hashable, Iterable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)


class UnionFind(Generic[K]):
    def __init__(self, keys: Iterable[K] = ()) -> None:
        self._parent: dict[K, K] = {}
        for k in keys:
            self.add(k)

    def add(self, k: K) -> None:
        """Make ``k`` a set of its own (nothing if it is known already)."""
        self._parent.setdefault(k, k)

    def find(self, k: K) -> K:
        """The root of ``k``'s set (``k`` is added first if it is new)."""
        parent = self._parent
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def union(self, a: K, b: K) -> K:
        """Merge the sets of ``a`` and ``b``; returns the merged set's root (the smaller one)."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            ra, rb = (ra, rb) if ra < rb else (rb, ra)  # type: ignore[operator]
            self._parent[rb] = ra
        return ra

    def __contains__(self, k: object) -> bool:
        return k in self._parent

    def __iter__(self) -> Iterator[K]:
        """Every key, in the order it was first added."""
        return iter(self._parent)

    def __len__(self) -> int:
        return len(self._parent)

    def groups(self) -> dict[K, list[K]]:
        """root → the keys of its set, each list in the order the keys were added."""
        out: dict[K, list[K]] = {}
        for k in self._parent:
            out.setdefault(self.find(k), []).append(k)
        return out
