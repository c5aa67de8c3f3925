"""Exponent sets: which ``exp`` results an element's exponents come from.

The per-test bound (:mod:`verify.bound`) counts the distinct exponents of the compared
function ``F = Na·Db − Nb·Da``. An attention's numerator ``N = E@V`` and denominator
``D = ΣE`` draw theirs from one set per row; knowing that halves the count. A
:class:`Support` records it: the source ``exp`` result, and which components of the
source index each element fixes or sums over — moved through reshapes, permutes,
broadcasts and sums exactly as the values are (anything else forgets it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

#: one component of an index: ``(d, size, step)`` — ``size`` values of source dim ``d``
#: spaced ``step`` apart — or ``(-1, size, 0)``, a component the set does not depend on
Atom = tuple[int, int, int]
FREE = -1


def _merged(atoms: Sequence[Atom]) -> tuple[Atom, ...]:
    """Adjacent atoms (row-major, high first) joined where they form one range: two of one
    source dim with ``step_1 = size_2·step_2``, or two free ones."""
    out: list[Atom] = []
    for a in atoms:
        if a[1] == 1:
            continue
        if out:
            d, s, t = out[-1]
            if d == a[0] and (d == FREE or t == a[1] * a[2]):
                out[-1] = (d, s * a[1], a[2] if d != FREE else 0)
                continue
        out.append(a)
    return tuple(out)


@dataclass(frozen=True)
class Support:
    """Where an element's exponents come from: each is the exponent of one element of a
    single ``exp`` result, the *source* (``key``), and the elements it may be are those
    whose index has the *bound* components fixed by the element's own index (``dims``:
    per dim of the value, its index's components in row-major order) and the *reduced*
    components free. So two values with equal supports draw their exponents, element by
    element, from the same set of at most :attr:`size` functions.

    This is what halves the term count of an attention's comparison: its output is
    ``N/D`` with ``N = E@V`` and ``D = Σ E`` — both over the same set ``A`` of row
    exponents — so ``Na·Db`` and ``Nb·Da`` both have exponents in ``A + B``, at most
    ``|A|·|B|`` of them, not ``2·|A|·|B|`` (:func:`compared`). Any move this class does
    not model (a slice, a tile, a concat, a reshape that cuts a component unevenly)
    forgets the support (None), which only loses that gain."""

    key: int
    dims: tuple[tuple[Atom, ...], ...]
    reduced: tuple[Atom, ...] = ()

    @staticmethod
    def source(key: int, shape: Sequence[int]) -> "Support":
        return Support(key, tuple(((d, int(n), 1),) if n > 1 else () for d, n in enumerate(shape)))

    @property
    def size(self) -> int:
        """How many source elements the set has (a bound on its distinct exponents)."""
        return math.prod(a[1] for a in self.reduced)

    def reshape(self, old: Sequence[int], new: Sequence[int]) -> "Support | None":
        dims: list[tuple[Atom, ...]] = []
        for gi, gj in reshape_groups(tuple(old), tuple(new)):
            atoms = [a for i in gi for a in self.dims[i]]
            if math.prod(a[1] for a in atoms) != math.prod(int(old[i]) for i in gi):
                return None
            for j in gj:
                need, take = int(new[j]), []
                while need > 1:
                    if not atoms:
                        return None
                    d, s, t = atoms.pop(0)
                    if s <= need:
                        if need % s:
                            return None
                        take.append((d, s, t))
                        need //= s
                    else:  # the high part of this component fills the dim, the rest goes on
                        if s % need:
                            return None
                        take.append((d, need, t * (s // need) if d != FREE else 0))
                        atoms.insert(0, (d, s // need, t))
                        need = 1
                dims.append(_merged(take))
            if atoms:
                return None
        return Support(self.key, tuple(dims), self.reduced)

    def permute(self, perm: Sequence[int]) -> "Support":
        return Support(self.key, tuple(self.dims[i] for i in perm), self.reduced)

    def broadcast(self, old: Sequence[int], new: Sequence[int]) -> "Support":
        pad = len(new) - len(old)
        dims = ((),) * pad + self.dims
        return Support(self.key, tuple(((FREE, int(n), 0),) if n > 1 and not dims[i] else dims[i]
                                       for i, n in enumerate(new)), self.reduced)

    def reduce(self, dim: int) -> "Support":
        """Summed along ``dim``: its bound components join the reduced ones."""
        red = sorted(set(self.reduced) | {a for a in self.dims[dim] if a[0] != FREE},
                     key=lambda a: (a[0], -a[2]))
        dims = tuple(() if i == dim else x for i, x in enumerate(self.dims))
        return Support(self.key, dims, _merged(red))

    def constant_along(self, dim: int) -> bool:
        return all(a[0] == FREE for a in self.dims[dim])

    def shifted(self, by: "Support") -> "Support | None":
        """The support of this value times a value of one exp term per element whose own
        support is ``by`` (both of one shape): an online softmax's partial sums times their
        rescale ``exp(m_i − M)``. Where ``by`` varies along a dim, this support's atoms
        there must all be bound (none free): the index along that dim, and so the factor's
        element, is then a function of the source element ``σ`` (and of the components the
        element fixes), so each exponent is ``g_σ + c(σ)`` for one fixed function ``c`` and
        the set keeps its size. The key names ``c``: the source, and which of its atoms meet
        which of ``by``'s — two values rescaled by one factor (a numerator and its
        denominator) get equal supports. None where ``by`` varies along a dim this support is
        free along (then one source element meets several factors)."""
        if len(by.dims) != len(self.dims):
            return None
        meets = []
        for i, (mine, theirs) in enumerate(zip(self.dims, by.dims)):
            if all(a[0] == FREE for a in theirs):
                continue
            if not mine or any(a[0] == FREE for a in mine):
                return None
            meets.append((i, mine, theirs))
        return Support(hash(("shifted", self.key, by.key, by.reduced, tuple(meets))), self.dims, self.reduced)


def reshape_groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Match the dims of a row-major reshape ``old → new`` into groups of equal
    element count (size-1 dims may form groups of their own)."""
    out, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj, po, pn = [], [], 1, 1
        if i < len(old):
            po *= old[i]; gi.append(i); i += 1
        if j < len(new):
            pn *= new[j]; gj.append(j); j += 1
        while po != pn:
            if po < pn:
                po *= old[i]; gi.append(i); i += 1
            else:
                pn *= new[j]; gj.append(j); j += 1
        out.append((gi, gj))
    return out
