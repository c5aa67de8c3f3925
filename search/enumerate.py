"""Depth-first μGraph generation in canonical form (paper Algorithm 1, docs/design.md §6.1).

State. The search does not grow ``mugraph`` IR objects op by op (they cannot be
popped); it keeps a light, append/pop state per level — shapes, abstract
expressions, index labels, use counts — and materializes IR graphs (which
re-check every validity rule) only when it closes a block graph (exact
shared-memory check) and for complete candidates.

Canonical form. Tensors are numbered in creation order; an op's key is
``(max input index, input indices, kind rank, attributes)``; ops are appended in
strictly increasing key order and commutative ops take inputs in non-decreasing
order. Each DAG then has exactly one generation order: two orders first differing
at ops P ≠ Q would need key(P) < key(Q) and key(Q) < key(P), both keys fixed by
the common prefix; and the greedy order "smallest ready key first" is strictly
increasing because a newly ready op's max input is the newest tensor. The same
rule orders block ops (input iterators come first, in the kernel op's input order).

Pruning before an op is added: shapes (catalog shape rules), loop phase (no mix of
loop-body and post-loop tiles), index labels (:mod:`search.labels`), abstract
expressions (the oracle), tile size against shared memory, and an *obligation
bound*: every loop-body tile must eventually be consumed and each op reduces the
number of unconsumed loop-body tiles by at most one. At the kernel level the
last allowed op must consume every tensor still unused.

Serializable work: a :class:`Task` is a kernel-op prefix (JSON-able tuples) plus,
optionally, a graph-defined op whose block graph the task grows; the driver hands
tasks to worker processes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from mugraph.core.errors import MugraphError
from mugraph.core.ir import DTYPES, RESCALED, RUNNING_MAX, SUM, BlockGraph, KernelGraph, Program
from mugraph.core.ops import is_contraction
from mugraph.core.serialize import graph_to_json

from . import expr as ex
from . import labels as lb
from .check import Checker, EvaluationStopped
from .config import SearchConfig
from .mappings import Mapping, mappings, omaps
from .oracle import SubexprOracle
from .proposals import ACC, GD, POOL, OpProposer, _attr_key, _scales
from .walk import LOADED, Walk, _Level

#: a block node's children: its close choices (ordinals ``c - _CLOSE``, negative, so they
#: sort first, as the DFS visits them first), then its block-op candidates (``0, 1, …``)
_CLOSE = 1 << 30


@dataclass
class Task:
    """A unit of work: a kernel prefix, and optionally a block start (inputs, mapping index)."""

    prefix: tuple
    block: Optional[tuple[tuple[int, ...], int]] = None
    #: iterative deepening phase: the task grows graphs of at most ``kops`` kernel ops and
    #: reports only those with exactly ``kops`` (None: up to ``max_kernel_ops``, all reported)
    kops: Optional[int] = None
    #: a node below the task's start: the child ordinals (:meth:`search.walk.Walk.descend`) leading
    #: to it; the task explores that node's subtree only (a piece of a split task)
    path: tuple[int, ...] = ()

    def to_json(self) -> list:
        return [_jsonable(self.prefix), None if self.block is None else [list(self.block[0]), self.block[1]],
                self.kops, list(self.path)]

    def sub(self, path) -> "Task":
        """The task of the node at ``path`` below this task's start."""
        return Task(self.prefix, self.block, self.kops, tuple(path))


def _jsonable(x):
    if isinstance(x, (tuple, list)):
        return [_jsonable(y) for y in x]
    if isinstance(x, Fraction):
        return str(x)
    return x


#: orders of a candidate's outputs fingerprinted at most (:meth:`Searcher._orders`)
MAX_ORDERS = 6


class Searcher:
    """Grows μGraphs for one program; reports verified ones to ``self.results``.

    The depth-first walk itself: its state is the levels it pushes and pops (:class:`_Level`)
    and the task's :class:`search.walk.Walk`; which op comes next, and what is pruned before it
    is added, is the strategy's (:class:`search.proposals.OpProposer`)."""

    def __init__(self, program: Program, cfg: SearchConfig, oracle: Optional[SubexprOracle] = None,
                 checker: Optional[Checker] = None) -> None:
        self.program, self.cfg = program, cfg
        self.dtype = program.inputs[0].dtype
        self.itemsize = DTYPES[self.dtype]
        self.in_labels, self.out_labels, self.reduced = lb.program_labels(program)
        self.targets = ex.output_exprs(program)
        self.out_shapes = [t.shape for t in program.outputs]
        #: the most tiles a block saves: ``max_block_outputs``, or the program's outputs where
        #: it has more — below that no one-kernel μGraph of it exists (an RMSNorm with its q,
        #: k and v projections, three outputs, found nothing under the limit of 2; at 3 its
        #: one pass over the activations in 8.3 s of 2 CPU workers, 4096 → 4096 + 1024 + 1024)
        self.max_outputs = max(cfg.max_block_outputs, len(program.outputs))
        #: the outputs the program also reads (a projection's result that a later op scales): a
        #: block may save such a tile while it goes on using it, and a graph may read such a
        #: tensor after writing it out (:meth:`_reread_output`)
        readers = program.consumers()
        self.reread = tuple(k for k, t in enumerate(program.outputs) if readers.get(t))
        #: the inputs no output depends on: used from the start (:func:`read_inputs`)
        read = read_inputs(program)
        self.unread = tuple(i for i, t in enumerate(program.inputs) if t.name not in read)
        self.oracle = oracle or SubexprOracle(
            self.targets, max_nodes=cfg.egraph_max_nodes, time_limit=cfg.egraph_time_limit,
            z3_timeout_ms=cfg.z3_timeout_ms, distribute=cfg.distribute, enabled=cfg.prune_abstract)
        self.checker = checker or Checker(program, cfg.verify_error, cfg.seed)
        #: the strategy: which op may come next, and which are pruned
        self.proposer = OpProposer(program, cfg, self.oracle, self.reduced)
        self.rank = self.proposer.rank
        #: the program's constants (:attr:`search.proposals.OpProposer.consts`)
        self.consts = self.proposer.consts
        #: what every task adds to (a worker resets them between tasks)
        self.stats: Counter = Counter()
        self.results: list[dict] = []
        self._close_cache: dict[str, bool] = {}
        self._interned: dict[tuple, int] = {}
        #: the current task's walk: its position in the tree, its budgets, what it defers
        self.walk = Walk(kops=cfg.max_kernel_ops)

    @property
    def canonical(self) -> bool:
        """False only in tests: drop the ordering rule (brute force, for comparison)."""
        return self.proposer.canonical

    @canonical.setter
    def canonical(self, value: bool) -> None:
        self.proposer.canonical = value

    @property
    def deferred(self) -> list[tuple[int, ...]]:
        """The paths of the children the last task handed back (:meth:`Task.sub`)."""
        return self.walk.deferred



    def _reduced(self) -> Optional[frozenset]:
        return self.reduced if self.cfg.prune_labels else None

    # ----------------------------------------------------------------- state
    def initial(self) -> _Level:
        ks = _Level(self._interned)
        for t in self.program.inputs:
            ks.add_tensor(t.shape, ex.var(t.name), self.in_labels[t.name])
        for i in self.unread:  # no output depends on it: no μGraph need read it
            ks.uses[i] = 1
        return ks


    # ----------------------------------------------------------------- kernel
    def kernel_dfs(self, ks: _Level, new: int) -> None:
        """Explore the subtree of kernel state ``ks`` whose last op made ``new`` tensors."""
        if self.walk.stopped():
            return
        replay = self.walk.replaying()
        if not replay:
            self.stats["kernel_states"] += 1
            if new and len(ks.ops) >= self.walk.emit_kops:
                self._complete(ks, new)
        if len(ks.ops) >= self.walk.kops:
            return
        for k, child in enumerate(self.kernel_children(ks)):
            if replay and k != self.walk.target():
                continue
            self.run_child(ks, child, k)
            if replay:
                return

    def kernel_children(self, ks: _Level):
        """Children of a kernel state: ('op', key, kind, inputs, attrs) and ('block', inputs, mapping index, mapping)."""
        last_op = len(ks.ops) == self.walk.kops - 1
        unused = {i for i, u in enumerate(ks.uses) if u == 0}
        for key, kind, inputs, attrs, _ in self.proposer.candidates(ks):
            if last_op and not unused <= set(inputs):
                if not self.walk.replaying():
                    self.stats["pruned_last_op"] += 1
                continue
            yield ("op", key, kind, inputs, attrs)
        if sum(1 for op in ks.ops if op[0] == "block") >= self.cfg.max_graph_defined:
            return
        n = len(ks.shapes)
        last = ks.last_key
        for size in range(1, min(self.cfg.max_block_inputs, n) + 1):
            for inputs in itertools.combinations(range(n), size):
                if (inputs[-1], inputs, self.rank[GD]) < last[:3]:
                    continue
                if last_op and not unused <= set(inputs):
                    continue
                ins = [(ks.shapes[i], ks.labs[i]) for i in inputs]
                for mi, mp in enumerate(mappings(ins, self.itemsize, self.cfg, self._reduced())):
                    yield ("block", inputs, mi, mp)

    def run_child(self, ks: _Level, child: tuple, k: int = 0) -> None:
        if child[0] == "op":
            _, key, kind, inputs, attrs = child
            r = self.proposer.op_result(ks, kind, inputs, attrs)
            if isinstance(r, str):
                self.stats[f"pruned_{r}"] += 1
                return
            shape, term, lab = r
            spec = ("op", kind, inputs, tuple(sorted(attrs.items())))
            ks.push(spec, key, inputs, [(shape, term, lab, None, _scales(kind), kind)])
            self.walk.descend(k, self.kernel_dfs, ks, 1)
            ks.pop(inputs)
        else:
            _, inputs, mi, mp = child
            self.walk.descend(k, self.block_start, ks, inputs, mp)

    # ----------------------------------------------------------------- block
    def block_start(self, ks: _Level, inputs: tuple, mp: Mapping) -> None:
        if not self.walk.replaying():
            self.stats["block_starts"] += 1
        bs = _Level(self._interned)
        for j, i in enumerate(inputs):
            # a tile a loop of several steps does not walk is the same every iteration (phase
            # None, as a constant's): it may feed the loop body or, after the loop, an
            # accumulator's result. With one step an accumulator is its input, so reading a
            # tile after it adds no graph the loop body cannot spell: those stay loop-body tiles
            acc = None if mp.fmaps[j] is None and mp.forloop > 1 else 0
            bs.add_tensor(mp.tiles[j], ks.terms[i], mp.tile_labels[j], acc=acc)
            bs.seen[(mp.tiles[j], ks.terms[i], mp.tile_labels[j], acc, False)] = 1
        bs.iters = len(inputs)  # type: ignore[attr-defined]
        for spec in self.consts:  # the program's constants, as operands (acc None: either phase)
            bs.push(spec, (-1,), (), [((1,), ex.const(dict(spec[2])["value"]), ((),), None, False, POOL)])
        self.block_dfs(ks, inputs, mp, bs, pending=len(inputs))

    def block_dfs(self, ks: _Level, inputs: tuple, mp: Mapping, bs: _Level, pending: int) -> None:
        if self.walk.stopped():
            return
        replay = self.walk.replaying()
        target = self.walk.target() if replay else None
        if not replay:
            self.stats["block_states"] += 1
        if pending == 0 and (not replay or target < 0):
            self._close(ks, inputs, mp, bs)
        remaining = self.cfg.max_block_ops - (len(bs.ops) - len(self.consts))
        if remaining <= 0 or (replay and target < 0):
            return
        for j, (key, kind, ins, attrs, akey, r) in enumerate(
                self.proposer.block_candidates(bs, None if replay else self.stats)):
            if replay and j != target:
                continue
            admitted = self.proposer.admit_block_op(bs, kind, ins, r, mp.forloop, pending, remaining, self.stats,
                                                    akey)
            if admitted is None:
                continue
            out, dup, new_pending = admitted
            spec = (kind, ins, tuple(sorted(attrs.items())))
            bs.push(spec, key, ins, [out])
            bs.seen[dup] = 1
            self.walk.descend(j, self.block_dfs, ks, inputs, mp, bs, new_pending)
            del bs.seen[dup]
            bs.pop(ins)
            if replay:
                return

    def _close(self, ks: _Level, inputs: tuple, mp: Mapping, bs: _Level) -> None:
        """Try to finish the block graph: save its frontier (post-loop tiles nobody uses), and
        beside it, where :attr:`max_outputs` leaves room, the post-loop tiles read on whose
        expression is an output's the program reads again (:attr:`reread`)."""
        frontier, kept = [], []
        for i, (a, u) in enumerate(zip(bs.accs, bs.uses)):
            if u == 0 and bs.producer[i] != POOL:
                if a != 1:
                    return
                frontier.append(i)
            elif a == 1 and bs.producer[i] not in (POOL, LOADED) and self._reread_output(bs.terms[i]):
                kept.append(i)  # an output the block reads on: saved beside the frontier
        if not frontier:
            return
        if len(frontier) + len(kept) <= self.max_outputs:
            frontier += kept
        elif len(frontier) > self.max_outputs:
            return
        options = [list(omaps(bs.shapes[i], bs.labs[i], mp.grid, mp.axis_classes)) for i in frontier]
        last = ks.last_key
        replay = self.walk.replaying()
        target = self.walk.target() + _CLOSE if replay else None
        final = len(ks.ops) + 1 >= self.walk.kops  # this block is the graph's last kernel op
        ops, index = _without_unused_constants(bs, len(inputs))
        for c, choice in enumerate(itertools.product(*options)):
            if replay and c != target:
                continue
            savers = tuple((index[i], om) for i, (om, _, _) in zip(frontier, choice))
            bspec = (mp.grid, mp.forloop, tuple((j, mp.imaps[j], mp.fmaps[j]) for j in range(len(inputs))),
                     ops, savers)
            key = (inputs[-1], inputs, self.rank[GD], repr(bspec))
            if key <= last:
                continue
            outs = [(shape, bs.terms[i], lab, None, False, GD) for i, (_, shape, lab) in zip(frontier, choice)]
            ks.push(("block", inputs, bspec), key, inputs, outs)
            try:
                if final and (len(ks.ops) < self.walk.emit_kops or not self._orders(ks, len(outs), most=1)):
                    # the kernel graph's last op, and what it leaves are not the program's
                    # outputs: a dead end, known before the costly validity check
                    if not replay:
                        self.stats["pruned_dead_end"] += 1
                    continue
                if not self._block_valid(ks, inputs, bspec):
                    self.stats["pruned_block_invalid"] += 1
                    continue
                if not replay:
                    self.stats["blocks_closed"] += 1
                self.walk.descend(c - _CLOSE, self.kernel_dfs, ks, len(outs))
            finally:
                ks.pop(inputs)

    def _block_valid(self, ks: _Level, inputs: tuple, bspec: tuple) -> bool:
        """Exact validity (shared memory by tile lifetime, registers) through the IR."""
        k = repr((tuple(ks.shapes[i] for i in inputs), bspec))
        hit = self._close_cache.get(k)
        if hit is None:
            kg = KernelGraph("scratch")
            srcs = [kg.input(f"i{j}", ks.shapes[i], self.dtype) for j, i in enumerate(inputs)]
            try:
                kg.kernel(build_block(bspec, srcs), smem_budget=self.cfg.smem_budget)
                hit = True
            except MugraphError:
                hit = False
            self._close_cache[k] = hit
        return hit

    # ------------------------------------------------------------- candidates
    def _complete(self, ks: _Level, new: int) -> None:
        for order in self._orders(ks, new):
            if self._emit(ks, order):
                return

    def _orders(self, ks: _Level, new: int, most: int = MAX_ORDERS) -> list[tuple[int, ...]]:
        """The tensors that could be the program's outputs, in order, if the graph ended
        here (its last op made ``new`` tensors): each a tuple of tensor indices, the orders
        most outputs match for certain first; none where the graph cannot end here. The
        unused tensors must be exactly as many as the outputs (with those written out and
        read again, where the program reads an output: :attr:`reread`), one of them new,
        each matching its output in shape, index labels and abstract expression.

        Several orders where expressions cannot tell outputs apart: an output and the same
        output scaled have one abstract expression (constant factors are abstracted away),
        and only the fingerprint tells which is which — a graph fingerprinted in one order
        alone was lost whenever that order was the wrong one. At most ``most`` orders, the
        first found (a permutation is checked only until then, as one was before)."""
        n = len(ks.shapes)
        unused = [i for i in range(n) if ks.uses[i] == 0]
        m = len(self.out_shapes)
        if len(unused) > m or not any(i >= n - new for i in unused):
            return []
        if len(unused) < m:  # the rest: tensors written out and read again, each an output the program reads
            read = [i for i in range(len(self.program.inputs), n)
                    if ks.uses[i] and self._reread_output(ks.terms[i])]
            if len(unused) + len(read) != m:
                return []
            unused += read
        found = []
        for perm in itertools.permutations(unused):
            known = 0  # outputs the abstract expressions match for certain (not merely undecided)
            for k, i in enumerate(perm):
                if ks.shapes[i] != self.out_shapes[k]:
                    break
                if self.cfg.prune_labels and not lb.compatible(ks.labs[i], self.out_labels[k]):
                    break
                same = self.oracle.equivalent(ks.terms[i], k)
                if same is False:
                    break
                known += same is True
            else:
                found.append((-known, len(found), perm))
                if len(found) >= most:
                    break
        return [perm for _, _, perm in sorted(found)]

    def _reread_output(self, term) -> bool:
        """Whether abstract expression ``term`` is that of an output the program also reads
        (none to ask of in most programs: every closed block asks)."""
        return bool(self.reread) and any(self.oracle.equivalent(term, k) is True for k in self.reread)

    def _emit(self, ks: _Level, outputs: tuple) -> bool:
        """Fingerprint a complete candidate; a match is reported with its cost key (True).

        Full verification (many field tests and the float check, seconds each at
        full shapes) is left to the driver, which verifies a bounded number of the
        cheapest matches (:func:`search.driver.run`)."""
        self.stats["candidates"] += 1
        try:
            g = materialize(self.program, ks.ops, outputs)
        except MugraphError:
            self.stats["candidates_invalid"] += 1
            return False
        self.stats["fingerprints"] += 1
        try:
            # cut mid-evaluation at the walk's deadline: at a large weight one candidate's
            # fingerprint takes seconds, and the task would hold its worker that long past it
            if not self.checker.fingerprint_matches(g, stop_at=self.walk.deadline):
                return False
        except EvaluationStopped:
            self.stats["fingerprints_stopped"] += 1
            return False
        self.stats["fingerprint_matches"] += 1
        self.results.append({"graph": graph_to_json(g), "cost": list(cost_key(g)), "sig": signature(g),
                             "path": list(self.walk.path)})
        return True


    # ------------------------------------------------------------------ tasks
    def root_tasks(self, kops: Optional[int] = None) -> list[Task]:
        """The root's children as serializable tasks (the driver's work queue).

        With ``kops`` the tasks belong to that iterative-deepening phase (graphs of
        exactly ``kops`` kernel ops)."""
        ks = self.initial()
        out = []
        saved = self.walk.kops
        if kops is not None:
            self.walk.kops = kops
        try:
            for child in self.kernel_children(ks):
                if child[0] == "op":
                    _, key, kind, inputs, attrs = child
                    if isinstance(self.proposer.op_result(ks, kind, inputs, attrs), str):
                        continue
                    out.append(Task((("op", kind, inputs, tuple(sorted(attrs.items()))),), None, kops))
                else:
                    out.append(Task((), (child[1], child[2]), kops))
        finally:
            self.walk.kops = saved
        return out

    def run_task(self, task: Task, deadline: Optional[float] = None, split_after: Optional[float] = None) -> None:
        """Explore ``task``'s subtree. With ``split_after`` (seconds), children not yet
        entered when that time has passed are left unexplored and listed in
        ``self.deferred`` (paths for :meth:`Task.sub`), so a long task hands its
        frontier back to the driver to share among idle workers."""
        self.walk = Walk.for_task(task.path, task.kops, self.cfg.max_kernel_ops, deadline, split_after)
        ks = self.initial()
        for spec in task.prefix:
            self._replay(ks, spec)
        if task.block is None:
            self.kernel_dfs(ks, 1 if task.prefix else 0)
        else:
            inputs, mi = task.block
            ins = [(ks.shapes[i], ks.labs[i]) for i in inputs]
            mp = next(itertools.islice(mappings(ins, self.itemsize, self.cfg, self._reduced()), mi, None))
            self.block_start(ks, tuple(inputs), mp)

    def _replay(self, ks: _Level, spec: tuple) -> None:
        if spec[0] != "op":
            raise ValueError("task prefixes hold pre-defined ops only")
        _, kind, inputs, attrs = spec
        inputs = tuple(inputs)
        attrs_d = dict(attrs)
        r = self.proposer.op_result(ks, kind, inputs, attrs_d)
        if isinstance(r, str):
            raise ValueError(f"task prefix op {spec} is pruned ({r})")
        key = (max(inputs), inputs, self.rank[kind], _attr_key(tuple(sorted(attrs_d.items()))))
        ks.push(("op", kind, inputs, tuple(sorted(attrs_d.items()))), key, inputs,
                [(*r, None, _scales(kind), kind)])


def _without_unused_constants(bs: _Level, n_iters: int) -> tuple[tuple, dict[int, int]]:
    """The block's op specs without the seeded constants nothing read, and each kept
    tile's new index (tiles are numbered iterators first, then ops in order)."""
    index: dict[int, int] = {i: i for i in range(n_iters)}
    ops = []
    for k, spec in enumerate(bs.ops):
        i = n_iters + k
        if bs.producer[i] == POOL and bs.uses[i] == 0:
            continue
        index[i] = n_iters + len(ops)
        kind, ins, attrs = spec
        ops.append((kind, tuple(index[j] for j in ins), attrs))
    return tuple(ops), index


# --------------------------------------------------------------- materialize

def build_block(bspec: tuple, sources: list) -> BlockGraph:
    grid, forloop, iters, ops, savers = bspec
    bg = BlockGraph(grid, forloop)
    tiles = [bg.input(sources[j], imap, fmap) for j, imap, fmap in iters]
    for kind, ins, attrs in ops:
        args = [tiles[i] for i in ins]
        if kind == ACC:
            monoid = dict(attrs).get("monoid", SUM)
            tiles.append(bg.accum_max(args[0]) if monoid == RUNNING_MAX
                         else bg.accum(args[0], args[1] if monoid == RESCALED else None))
        else:
            tiles.append(bg.add_op(kind, args, dict(attrs)))
    for i, om in savers:
        bg.output(tiles[i], om)
    return bg


def materialize(program: Program, ops: list[tuple], outputs: tuple) -> KernelGraph:
    """Build the IR graph of a kernel-op list (every validity rule is re-checked)."""
    kg = KernelGraph(program.name)
    tensors = [kg.input(t.name, t.shape, t.dtype, fill=t.fill) for t in program.inputs]
    for spec in ops:
        if spec[0] == "op":
            _, kind, inputs, attrs = spec
            tensors.append(kg.add_op(kind, [tensors[i] for i in inputs], dict(attrs)))
        else:
            _, inputs, bspec = spec
            tensors.extend(kg.kernel(build_block(bspec, [tensors[i] for i in inputs])))
    for i in outputs:
        kg.output(tensors[i])
    return kg


#: the ranking cost model's GPU (an H100 SXM's round figures): SMs, DRAM bytes/s, bytes/s one
#: SM pulls, L2 bytes/s, dense fp16 flop/s, launch seconds inside a CUDA graph, and the L2
#: size below which an input re-read by several blocks is served by L2
GPU_SMS = 132
_BW, _SM_BW, _L2_BW, _FLOPS, _LAUNCH, _L2 = 3.0e12, 6.0e10, 9.0e12, 4.0e14, 2.0e-6, 25e6
#: seconds one loop step costs a block at least (a memory round trip that a two-deep pipeline
#: halves: the lowering's cost model charges 0.3 μs from DRAM, less from L2), and the blocks
#: one SM runs at once
_ITER, _RESIDENT = 0.2e-6, 2


def read_inputs(program: Program) -> set[str]:
    """The names of the inputs some output of ``program`` depends on.

    Why: a graph ends only when every tensor it made or loaded is used (the enumeration's
    last-op rule), so an input no output reads — a bias a variant of the program leaves
    out — would leave no μGraph at all, the search complete and empty. Such an input counts
    as used from the start; a μGraph may still load it, and gains nothing by it."""
    seen, todo, names = set(), list(program.outputs), set()
    while todo:
        t = todo.pop()
        if t.id in seen:
            continue
        seen.add(t.id)
        if t.op.kind == "input":
            names.add(t.name)
        todo.extend(t.op.inputs)
    return names


def cost_key(g: KernelGraph) -> tuple[int, float, int, int]:
    """A cheap ranking of candidates: kernels, an analytic time estimate, shared memory, block ops.

    Per kernel, a launch plus the largest of memory, serial and compute time:

    * memory: device bytes moved (inputs read, outputs written — a split loop's partials
      once each way: they are the first kernel's outputs and the combine's inputs) over
      the bandwidth the grid can pull: ``blocks × per-SM bandwidth``, at most DRAM's. An
      input that a block does not split along some grid axis (imap ``None``) is read by
      every block along it; those re-reads come from L2 at its bandwidth when the input
      fits there (a third of a DRAM byte each), from DRAM otherwise.
    * serial: the loop's steps, :data:`_ITER` each, once per wave of blocks — a loop of 64
      steps run by 2 blocks (one per attention head) cannot finish sooner however few
      bytes it moves; what split-loop shortens.
    * compute: matmul flops of *all* blocks (loop-body ones once per iteration) over the
      tensor-core rate of the SMs the grid occupies, ``min(1, blocks / SMs)`` of the
      GPU — redundant work (attention's Q·K recomputed by every block of a grid over its
      output columns) and too few blocks for the work (a loop over 4096 keys run by 2
      blocks) both show.

    Ties (same bytes, same grid) go to the smaller peak shared memory per block: a block
    that stages a whole 4096-long operand at once leaves the SM nothing to overlap, where
    a loop over it streams. It orders candidates for verification (kernel count first)
    and chooses which split-loop variants are proposed; the lowering's cost model and
    profiler rank what is verified."""
    kernels = 0
    est = 0.0
    nblock = 0
    smem = 0
    for op in g.ops:
        if op.kind == "input":
            continue
        kernels += 1
        wbytes = sum(_numel(t.shape) * DTYPES[t.dtype] for t in op.outputs)
        flops = 0.0
        if op.kind == GD:
            b = op.attrs["block"]
            nblock += len(b.ops)
            smem = max(smem, b.shared_memory_bytes()[0])
            blocks = b.grid[0] * b.grid[1] * b.grid[2]
            rbytes = 0.0
            for bop in b.ops:
                if is_contraction(bop.kind):
                    per = 2.0 * _numel(bop.outputs[0].shape) * bop.inputs[0].shape[-1]
                    flops += per * blocks * (b.forloop if bop.outputs[0].acc == 0 else 1)
                if bop.kind != "iterator":
                    continue
                src = b.sources[bop.attrs["source"]]
                if src.fill is not None:  # made in registers (mugraph.core.fills): no bytes move
                    continue
                rep = 1
                for a, d in enumerate(bop.attrs["imap"]):
                    if d is None:
                        rep *= b.grid[a]
                nbytes = _numel(src.shape) * DTYPES[src.dtype]
                rbytes += nbytes * (1 + (rep - 1) * (_BW / _L2_BW if nbytes <= _L2 else 1.0))
            bw = min(_BW, blocks * _SM_BW)
            occ = min(1.0, blocks / GPU_SMS)
            # the loop's steps run one after another in every block, each paying a latency
            # pipelining hides only in part; blocks beyond what the SMs hold run in later waves
            serial = b.forloop * _ITER * -(-blocks // (_RESIDENT * GPU_SMS))
        else:
            rbytes = sum(_numel(t.shape) * DTYPES[t.dtype] for t in op.inputs)
            if is_contraction(op.kind):
                flops = 2.0 * _numel(op.outputs[0].shape) * op.inputs[0].shape[-1]
            bw, occ, serial = _BW, 1.0, 0.0
        est += max((rbytes + wbytes) / bw, flops / (_FLOPS * occ), serial) + _LAUNCH
    return kernels, round(est * 1e6, 3), smem, nblock


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def signature(g: KernelGraph) -> str:
    """The kernel sequence's op kinds (``gd`` for graph-defined), e.g. ``gd+gd``."""
    return "+".join("gd" if op.kind == GD else op.kind for op in g.ops if op.kind != "input")
