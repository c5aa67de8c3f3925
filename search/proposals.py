"""Which op the enumeration may add next, and which it prunes before adding it: the search's
strategy (docs/design.md §6.1), apart from its state (:mod:`search.walk`).

:class:`OpProposer` proposes, in canonical order, every op whose key exceeds the last one
(:meth:`OpProposer.candidates`, :meth:`OpProposer.block_candidates`) with the attributes the
search enumerates, and gives each op's result — (shape, abstract expression, index labels) —
or the reason it is pruned (shape, labels, abstract expression; :meth:`OpProposer.op_result`).
:meth:`OpProposer.admit_block_op` applies the block-level prunes that depend on the block
state (phase, duplicates, the obligation bound, shared memory).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from mugraph.core.errors import MugraphError
from mugraph.core.ir import DTYPES, RESCALED, RUNNING_MAX, Program, broadcasts_to
from mugraph.core.ops import CATALOG, Category, adds_up, category

from . import expr as ex
from . import labels as lb
from .config import SearchConfig
from .oracle import SubexprOracle
from .walk import _Level

GD = "graph_defined"
ACC = "accum"
#: the statistic each prune reason of :meth:`OpProposer.op_result` counts in
_PRUNED = {r: f"pruned_{r}" for r in ("shape", "labels", "abstract")}
#: the producer of a block's seeded constant tiles (the program's constants, :attr:`OpProposer.consts`)
POOL = "constant pool"


def _attr_key(attrs: tuple) -> str:
    return repr(tuple((k, str(v)) for k, v in attrs))


def _shift(kind: str) -> bool:
    """Is ``kind`` (a producer: an op, an input, an accumulator) a free shift (docs/design.md §3.3)?"""
    return kind in CATALOG and CATALOG[kind].lax == "shift"


def _scales(kind: str) -> bool:
    """Is ``kind`` a constant factor (the search places one per reduction)?"""
    return kind in CATALOG and CATALOG[kind].constant_factor


@dataclass(frozen=True)
class _KindInfo:
    """What the candidate generator needs of one op kind, looked up once per search."""

    kind: str
    rank: int
    op: object  # the catalog's OpDef (None for the accumulator)
    arity: int
    commutative: bool
    constant_factor: bool
    #: a binary op whose ``x op x`` is a unary op of the level's kinds (``x*x`` is ``square(x)``)
    squared: bool
    accumulator: bool
    #: the binary op is ``a − b`` (the catalog's signs (1, −1)): a free shift's use
    subtracts: bool = False

    @classmethod
    def of(cls, kind: str, rank: int, kinds: tuple[str, ...]) -> "_KindInfo":
        if kind == ACC:
            return cls(kind, rank, None, 1, False, False, False, True)
        d = CATALOG[kind]
        squared = {CATALOG[k].squares for k in kinds if k in CATALOG}
        return cls(kind, rank, d, d.arity, d.commutative, d.constant_factor, kind in squared, False,
                   d.signs == (1, -1))


#: the attribute types the search draws values for (:meth:`OpProposer._attr_choices`)
ENUMERATED_ATTRS = ("dim", "rational", "perm", "index")


def generated(kind: str) -> bool:
    """Whether the search ever generates an op of ``kind``: not one with an attribute it does
    not enumerate (a ``reshape``'s shape, a ``repeat``'s counts), nor one of more than two
    operands (``concat``) — :meth:`OpProposer.combos`."""
    d = CATALOG[kind]
    return d.arity in (0, 1, 2) and all(a.type in ENUMERATED_ATTRS for a in d.attrs)


def ungenerated_on_computed(program: Program) -> Optional[str]:
    """The first op of ``program`` the search never generates (:func:`generated`) that reads
    a value an op computed — not an input, which a μGraph's iterators may reshape — as
    ``"kind of producer"``; None when there is none. Such a program has no μGraph in the
    search's space other than itself, in practice: every block op keeps its operand's rank
    and elements in place, so the program's layout change has to come from iterators over the
    inputs alone. Measured: ``reshape(x @ W) * c`` matched nothing in 108 s on 2 workers where
    ``(x @ W) * c`` matched in 0.2 s, and no such piece of five decoder layers ever matched."""
    made = {id(t): op.kind for op in program.ops if op.kind != "input" for t in op.outputs}
    for op in program.ops:
        if op.kind in CATALOG and not generated(op.kind):
            for t in op.inputs:
                if id(t) in made:
                    return f"{op.kind} of {made[id(t)]}"
    return None


def program_attr_values(program: Program) -> dict[tuple[str, str], list]:
    """(kind, attribute) -> the values the search tries: rational, permutation and index
    attributes take the program's own values of that attribute of that op."""
    attr_values: dict[tuple[str, str], set] = {}
    for op in program.ops:
        for a in CATALOG[op.kind].attrs if op.kind in CATALOG else ():
            if a.type == "rational":
                attr_values.setdefault((op.kind, a.name), set()).add(Fraction(op.attrs[a.name]))
            elif a.type == "perm":
                attr_values.setdefault((op.kind, a.name), set()).add(tuple(op.attrs[a.name]))
            elif a.type == "index":
                attr_values.setdefault((op.kind, a.name), set()).add(op.attrs[a.name])
    return {k: sorted(v) for k, v in attr_values.items()}


class OpProposer:
    """Proposes the next op of a kernel or block graph in canonical order and prunes it:
    the op kinds of each level and their ranks, the attribute values tried, and the caches
    of op results and attribute sets (an op's result depends on its inputs only through
    their interned signatures, so one search reuses it across states)."""

    def __init__(self, program: Program, cfg: SearchConfig, oracle: SubexprOracle, reduced: frozenset) -> None:
        self.cfg, self.oracle, self.reduced = cfg, oracle, reduced
        self.itemsize = DTYPES[program.inputs[0].dtype]
        #: the program's constants, each a ``const`` tile every block graph starts with (an
        #: operand, never an obligation: unused ones are dropped when the block closes); a
        #: constant has no inputs, so the DFS, which grows ops on tensors, never makes one
        self.consts: list[tuple] = [
            (kind, (), (("dtype", program.inputs[0].dtype), ("shape", (1,)), ("value", v)))
            for kind, v in sorted({(op.kind, Fraction(op.attrs["value"])) for op in program.ops
                                   if category(op.kind) is Category.CONSTANT})]
        kinds = sorted({op.kind for op in program.ops if op.kind in CATALOG})
        # each kind where the catalog lets it be (a slice is a kernel-level view only)
        self.kernel_kinds = tuple(k for k in (cfg.kernel_ops or sorted(set(kinds) | {"sum"})) if "K" in CATALOG[k].levels)
        self.block_kinds = tuple(k for k in (cfg.block_ops or kinds) if "B" in CATALOG[k].levels) + (ACC,)
        #: the program has a free shift (``max``): offer the running max and rescaled sums
        self.shifts = any(_shift(k) for k in self.block_kinds)
        self.rank = {k: i for i, k in enumerate(sorted(set(self.kernel_kinds) | set(self.block_kinds)))}
        self.rank[GD] = len(self.rank)
        self.attr_values = program_attr_values(program)
        self.op_cache: dict[tuple, object] = {}
        self.count_hits = oracle.enabled
        #: (kind, input shape) -> the attribute assignments the search tries, with their keys
        self.attr_cache: dict[tuple, Optional[list[tuple[dict, str]]]] = {}
        #: per op kind of each level, what the candidate generator asks of the catalog
        self.kinds = {block: [_KindInfo.of(k, self.rank[k], kinds) for k in kinds]
                      for block, kinds in ((False, self.kernel_kinds), (True, self.block_kinds))}
        #: False only in tests: drop the ordering rule (brute force, for comparison)
        self.canonical = True

    def op_result(self, lv: _Level, kind: str, inputs: tuple, attrs: dict, akey: str = ""):
        """(shape, term, labels) of a catalog op on level tensors, or a prune reason string.

        Memoized on (kind, attrs, the inputs' shapes, terms and labels): the answer
        depends on nothing else, and block states share most of their tensors."""
        sigs = lv.sigs
        ak = akey or _attr_key(tuple(sorted(attrs.items())))
        n = len(inputs)
        ck = ((kind, ak, sigs[inputs[0]]) if n == 1 else (kind, ak, sigs[inputs[0]], sigs[inputs[1]]) if n == 2
              else (kind, ak) + tuple(sigs[i] for i in inputs))
        r = self.op_cache.get(ck)
        if r is None:
            if len(self.op_cache) > 2_000_000:
                self.op_cache.clear()
            r = self.op_cache[ck] = self._op_result_uncached(lv, kind, inputs, attrs)
        elif r.__class__ is not str and self.count_hits:
            stats = self.oracle.stats  # keep the query count comparable
            stats.queries += 1
            stats.cache_hits += 1
        return r

    def _op_result_uncached(self, lv: _Level, kind: str, inputs: tuple, attrs: dict):
        shapes = [lv.shapes[i] for i in inputs]
        try:
            shape = CATALOG[kind].shape_rule(shapes, attrs)
        except MugraphError:
            return "shape"
        if not 1 <= len(shape) <= 4:
            return "shape"
        try:
            lab = lb.op_labels(kind, [lv.labs[i] for i in inputs], shapes, attrs, shape)
        except lb.LabelError:
            if self.cfg.prune_labels:
                return "labels"
            lab = tuple(None for _ in shape)
        if self.cfg.prune_labels:
            for i, d in lb.reduced_dims(kind, shapes, attrs, shape):
                if not lb.reduces_only(lv.labs[inputs[i]][d], self.reduced):
                    return "labels"
        term = ex.op_expr(kind, [lv.terms[i] for i in inputs], shapes, attrs)
        if not self.oracle.is_sub(term):
            return "abstract"
        return shape, term, lab

    def candidates(self, lv: _Level, block: bool = False):
        """(key, kind, inputs, attrs, akey) for every op whose key exceeds the last one,
        in generation order (by max input, then kind, then :meth:`combos`' order)."""
        last = lv.last_key
        canonical = self.canonical
        for m in range(max(last[0], 0), len(lv.shapes)):
            for info in self.kinds[block]:
                rank = info.rank
                for inputs, attrs, akey in self.combos(lv, info, m, block):
                    key = (m, inputs, rank, akey)
                    if key <= last if canonical else key in lv.keys:
                        continue
                    yield key, info.kind, inputs, attrs, akey

    def combos(self, lv: _Level, info: "_KindInfo", m: int, block: bool) -> list[tuple]:
        """(inputs, attrs, akey) of every op of kind ``info`` whose newest input is ``m``.

        Attributes come from the op's schema: a ``dim`` ranges over the input's dims
        longer than 1, a ``rational``, ``perm`` or ``index`` over the program's values of
        that attribute; an op with any other attribute (a shape, per-dim counts) is not
        generated. Two
        placement rules cut ops that E cannot see as redundant: a constant factor
        (``scale``, erased in E) only follows an op that adds terms up (``sum``,
        ``matmul``, ``accum``) and never another constant factor — a rational factor
        commutes with every linear op, so one placement per reduction suffices — and,
        in a block graph, binary ops never mix loop-body and post-loop tiles.
        """
        am = lv.accs[m]
        if info.accumulator:
            return self._accumulators(lv, m) if am != 1 else []
        if info.constant_factor and (lv.scaled[m] or not self._after_reduction(lv, m)):
            return []
        attr_sets = self._attr_sets(info, lv.shapes[m])
        if not attr_sets:
            return []
        if info.arity == 1:
            return [((m,), at, ak) for at, ak in attr_sets]
        if info.arity != 2:
            return []
        accs = lv.accs
        ok = [a for a in range(m + 1) if not block or am is None or accs[a] is None or accs[a] == am]
        if info.squared:
            ok = [a for a in ok if a != m]  # x*x is spelled square(x)
        combos = [((a, m), at, ak) for a in ok for at, ak in attr_sets]
        if not info.commutative:
            combos += [((m, a), at, ak) for a in ok if a != m for at, ak in attr_sets]
        if info.subtracts and self.shifts:
            combos = [c for c in combos if self._shifts_its_own(lv, *c[0])]
        return combos

    @staticmethod
    def _shifts_its_own(lv: _Level, a: int, b: int) -> bool:
        """``a − b`` where either is a free shift (a ``max``'s result): only ``x − max(x)``,
        a tile shifted by its own max. Any per-row shift is exact in real arithmetic (the
        verifier proves it, §3.3), but a shift by the max of another tile — the unscaled
        scores' max taken from the scaled scores — underflows or overflows every exponential,
        and the float check rejects it after a full verification: a 2k-key prompt attention
        (H200, 60 s) spent 4 of its 8 verifications on such graphs, a 32k-key decode 9 of 15,
        every split-KV pair among them. A shift from the left is no shift at all."""
        if _shift(lv.producer[a]):
            return False
        return not _shift(lv.producer[b]) or lv.args[b] == (a,)

    def _accumulators(self, lv: _Level, m: int) -> list[tuple]:
        """The accumulators whose newest input is loop-body tile ``m``: its sum; where the
        program has a ``max`` (a free shift), also the running max of a tile a ``max``
        produced, and the sum of ``m`` rescaled to the running max of an earlier such
        tile ``s`` it broadcasts against and whose term it contains (docs/design.md §3.4: the online softmax's
        accumulators, offered for any shift, never for a named pattern)."""
        out = [((m,), {}, "()")]
        if not self.shifts:
            return out
        if _shift(lv.producer[m]):
            out.append(((m,), {"monoid": RUNNING_MAX}, RUNNING_MAX))
        for s in range(m):  # only a tile computed from that shift can be on its scale
            if (_shift(lv.producer[s]) and lv.accs[s] != 1
                    and broadcasts_to(lv.shapes[s], lv.shapes[m]) and ex.contains(lv.terms[m], lv.terms[s])):
                out.append(((m, s), {"monoid": RESCALED}, RESCALED))
        return out

    def block_candidates(self, bs: _Level, stats: Optional[Counter]) -> list[tuple]:
        """The block ops that may follow ``bs``'s last op, in :meth:`candidates`' order,
        each with its result: ``(key, kind, inputs, attrs, akey, result)``, ``result``
        being (shape, term, labels), or None for an accumulator (checked by the caller).

        Ops whose result is a prune reason (shape, labels, abstract expression) are
        dropped here, counted in ``stats`` when given. This is the search's innermost loop —
        tens of ops tried per block state, nearly all pruned — so the op cache is read
        inline, keyed on the inputs' interned signatures."""
        last = bs.last_key
        canonical = self.canonical
        sigs = bs.sigs
        cache = self.op_cache
        out: list[tuple] = []
        pruned: Counter = Counter()
        hits = 0
        for m in range(max(last[0], 0), len(bs.shapes)):
            tie = m == last[0] or not canonical  # keys with this m must still exceed the last one
            sm = sigs[m]
            for info in self.kinds[True]:
                kind, rank = info.kind, info.rank
                for ins, at, ak in self.combos(bs, info, m, True):
                    if tie:
                        key = (m, ins, rank, ak)
                        if key <= last if canonical else key in bs.keys:
                            continue
                    if info.accumulator:
                        out.append(((m, ins, rank, ak), kind, ins, at, ak, None))
                        continue
                    r = cache.get((kind, ak, sm) if len(ins) == 1 else (kind, ak, sigs[ins[0]], sigs[ins[1]]))
                    if r is None:
                        r = self.op_result(bs, kind, ins, at, ak)
                    elif r.__class__ is not str:
                        hits += 1
                    if r.__class__ is str:
                        pruned[r] += 1
                        continue
                    out.append(((m, ins, rank, ak), kind, ins, at, ak, r))
        if stats is not None:
            for r, k in pruned.items():
                stats[_PRUNED[r]] += k
        if hits and self.count_hits:
            self.oracle.stats.queries += hits  # keep the query count comparable
            self.oracle.stats.cache_hits += hits
        return out

    def _attr_sets(self, info: "_KindInfo", shape: tuple) -> Optional[list[tuple[dict, str]]]:
        """:meth:`_attr_choices` with each assignment's key, cached per (kind, shape)."""
        ck = (info.kind, shape)
        r = self.attr_cache.get(ck, False)
        if r is False:
            sets = self._attr_choices(info.op, shape)
            r = self.attr_cache[ck] = (None if sets is None else
                                        [(at, _attr_key(tuple(sorted(at.items())))) for at in sets])
        return r

    def _attr_choices(self, d, shape: tuple) -> list[dict] | None:
        """Every attribute assignment the search tries for op ``d`` on an input of
        ``shape`` (one empty one for an op without attributes), or None when an
        attribute is not one the search enumerates."""
        if any(a.type not in ENUMERATED_ATTRS for a in d.attrs):
            return None
        out: list[dict] = [{}]
        for a in d.attrs:
            if a.type == "dim":
                values = [k for k, s in enumerate(shape) if s > 1]
            elif a.type == "rational":
                values = self.attr_values.get((d.name, a.name), [])
            elif a.type == "perm":
                values = [v for v in self.attr_values.get((d.name, a.name), []) if len(v) == len(shape)]
            else:  # "index" (a window the input's dim cannot hold is refused by the shape rule)
                values = self.attr_values.get((d.name, a.name), [])
            out = [{**at, a.name: v} for at in out for v in values]
        return out

    def _after_reduction(self, lv: _Level, i: int) -> bool:
        return lv.producer[i] == ACC or adds_up(lv.producer[i])

    def admit_block_op(self, bs: _Level, kind: str, ins: tuple, r: Optional[tuple], forloop: int, pending: int,
                       remaining: int, stats: Counter, akey: str = "()") -> Optional[tuple[tuple, tuple, int]]:
        """The prunes of a proposed block op (:meth:`block_candidates`' ``kind``, ``ins`` and
        result ``r``) that depend on the block state ``bs``: an op of constants alone, a mix
        of loop phases, an accumulator of a post-loop tile or of a term E cannot reach, a tile
        the block already has, more unconsumed loop-body tiles (``pending``) than the
        ``remaining`` ops can consume (the obligation bound), a tile beyond shared memory.

        Returns the op's output tile (shape, term, labels, phase, scaled, producer), its
        duplicate key and the pending count after it; or None, the prune counted in ``stats``."""
        if self.consts and all(bs.producer[i] == POOL for i in ins):
            stats["pruned_constant"] += 1  # an op of constants alone is a constant
            return None
        acc = bs.accs[ins[0]]
        if len(ins) > 1:  # a binary op's phase: the inputs' (None: loop-invariant) must agree
            other = bs.accs[ins[1]]
            if acc is None:
                acc = other
            elif other is not None and other != acc:
                stats["pruned_phase"] += 1
                return None
        if kind == ACC:
            if acc == 1:
                return None
            i = ins[0]
            shape, lab = bs.shapes[i], bs.labs[i]
            # a running max is the shift itself to E (a max's extent is erased); a rescaled
            # sum is a sum to E (its factor exp(m_i − M) is a shift's, erased like a constant)
            term = bs.terms[i] if akey == RUNNING_MAX \
                else ex.accum_expr(bs.terms[i], forloop)
            if not self.oracle.is_sub(term):
                stats["pruned_abstract"] += 1
                return None
            out = (shape, term, lab, 1, False, ACC)
        else:
            shape, term, lab = r
            out = (shape, term, lab, acc, _scales(kind), kind)
        dup = (out[0], out[1], out[2], out[3], out[4])
        if dup in bs.seen:
            stats["pruned_duplicate"] += 1
            return None
        # obligations: every unconsumed tile not after the loop (loop-body or loop-invariant,
        # constants aside) must still reach an accumulator or a post-loop op
        consumed = sum(1 for i in set(ins) if bs.accs[i] != 1 and bs.producer[i] != POOL and bs.uses[i] == 0)
        new_pending = pending - consumed + (1 if out[3] != 1 else 0)
        if new_pending > remaining - 1:
            stats["pruned_obligation"] += 1
            return None
        nbytes = self.itemsize if out[3] != 1 or kind != ACC else 4
        for s in shape:
            nbytes *= s
        if nbytes > self.cfg.smem_budget:
            stats["pruned_smem"] += 1
            return None
        return out, dup, new_pending
