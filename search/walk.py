"""What one enumeration holds as it walks the tree of μGraphs (docs/design.md §6.1): the
per-level tensor tables that are the partial μGraph (:class:`_Level`, append/pop), and the
walk's position and budgets (:class:`Walk`: the path from the task's start, the node it
replays down to, its deadline, its kernel-op bounds, the children it hands back as tasks).

These are the search's state; :mod:`search.proposals` is its strategy (which op may come
next, and which are pruned), and :class:`search.enumerate.Searcher` walks with both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import labels as lb


#: the producer of the tensors a level starts with: the program's inputs, a block's loaded tiles
LOADED = "input"


class _Level:
    """Per-level tensor table with append/pop.

    ``sigs`` numbers each distinct (shape, abstract expression, index labels) once per
    search (``interned``, shared by every level of a :class:`search.enumerate.Searcher`): an op's result
    depends on its inputs through these alone, so the op cache is keyed on the numbers."""

    def __init__(self, interned: dict[tuple, int]) -> None:
        self.interned = interned
        self.sigs: list[int] = []
        self.shapes: list[tuple] = []
        self.terms: list[int] = []
        self.labs: list[lb.Labels] = []
        self.uses: list[int] = []
        self.accs: list[Optional[int]] = []
        self.scaled: list[bool] = []
        self.producer: list[str] = []
        self.args: list[tuple] = []   # the input indices of the op that made each tensor (() for inputs)
        self.seen: dict[tuple, int] = {}
        self.ops: list[tuple] = []
        self.keys: list[tuple] = []
        self.nout: list[int] = []

    def add_tensor(self, shape, term, lab, acc=None, scaled=False, producer=LOADED) -> None:
        sig = (shape, term, lab)
        n = self.interned.get(sig)
        if n is None:
            n = self.interned[sig] = len(self.interned)
        self.sigs.append(n)
        self.producer.append(producer)
        self.args.append(())
        self.shapes.append(shape)
        self.terms.append(term)
        self.labs.append(lab)
        self.uses.append(0)
        self.accs.append(acc)
        self.scaled.append(scaled)

    def push(self, op: tuple, key: tuple, inputs: tuple, outs: list[tuple]) -> None:
        for i in set(inputs):
            self.uses[i] += 1
        for o in outs:
            self.add_tensor(*o)
            self.args[-1] = tuple(inputs)
        self.ops.append(op)
        self.keys.append(key)
        self.nout.append(len(outs))

    def pop(self, inputs: tuple) -> None:
        n = self.nout.pop()
        self.ops.pop()
        self.keys.pop()
        for lst in (self.sigs, self.shapes, self.terms, self.labs, self.uses, self.accs, self.scaled, self.producer,
                    self.args):
            del lst[len(lst) - n:]
        for i in set(inputs):
            self.uses[i] -= 1

    @property
    def last_key(self) -> tuple:
        return self.keys[-1] if self.keys else (-2,)


@dataclass
class Walk:
    """Where one task's depth-first walk stands, and what bounds it.

    Splitting (docs/design.md §6): ``path`` holds the child ordinals from the task's start to
    the current node, ``guide`` the path to the task's own node (its ancestors are replayed,
    not explored), and, past ``split_at``, children are deferred as new tasks (``deferred``).
    A walk lives for one task (:meth:`for_task`); the searcher's counters outlive it."""

    #: the kernel graphs grown have at most this many kernel ops
    kops: int
    #: only graphs of at least this many kernel ops are reported (an iterative-deepening phase)
    emit_kops: int = 0
    #: ``time.monotonic()`` after which the walk stops (None: never)
    deadline: Optional[float] = None
    path: list[int] = field(default_factory=list)
    guide: tuple[int, ...] = ()
    #: ``time.monotonic()`` after which children not yet entered are deferred (None: never)
    split_at: Optional[float] = None
    deferred: list[tuple[int, ...]] = field(default_factory=list)

    @classmethod
    def for_task(cls, path: tuple[int, ...], kops: Optional[int], max_kernel_ops: int,
                 deadline: Optional[float], split_after: Optional[float]) -> "Walk":
        """The walk of a task whose node is at ``path`` below its start, in the
        iterative-deepening phase ``kops`` (None: up to ``max_kernel_ops``, all reported)."""
        split_at = None if split_after is None else time.monotonic() + split_after
        return cls(kops=max_kernel_ops if kops is None else kops, emit_kops=0 if kops is None else kops,
                   deadline=deadline, guide=tuple(path), split_at=split_at)

    def replaying(self) -> bool:
        """Is the current node a strict ancestor of the task's node (replayed, not explored)?"""
        return len(self.path) < len(self.guide)

    def target(self) -> int:
        """The child ordinal a replayed node descends to."""
        return self.guide[len(self.path)]

    def stopped(self) -> bool:
        """Has the deadline passed?"""
        return self.deadline is not None and time.monotonic() > self.deadline

    def descend(self, k: int, fn: Callable[..., None], *args) -> None:
        """Explore child ``k`` of the current node — or, once the task has run past its split
        time, hand it back as a task of its own (``deferred``). Children are deferred only
        after every check that admits them, so the deferred task counts nothing twice."""
        if (self.split_at is not None and not self.replaying()
                and time.monotonic() > self.split_at):
            self.deferred.append(tuple(self.path) + (k,))
            return
        self.path.append(k)
        try:
            fn(*args)
        finally:
            self.path.pop()
