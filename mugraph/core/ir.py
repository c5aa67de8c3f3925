"""The μGraph IR: tensors, ops, kernel graphs, block graphs, thread graphs.

A :class:`KernelGraph` is a DAG of kernels over the whole GPU; its edges are device
tensors. A node is a *pre-defined* op from the catalog (:mod:`mugraph.core.ops`) or a
*graph-defined* op whose meaning is a :class:`BlockGraph` — the program of one
thread block, with a grid, a for-loop, input iterators (imap/fmap), block ops,
accumulators and output savers (omap). A :class:`Program` is a kernel graph with
pre-defined ops only: the Lax program a user hands to the superoptimizer.

Every rule of docs/design.md §2.7 is checked when an op is added, so an invalid graph cannot
be built: shape rules, divisibility of imaps/fmaps, one accumulator on every path
from an input iterator to an output saver, distinct omap dims for grid axes > 1,
and (when a block graph is attached to its kernel graph) the shared-memory and
register budgets. Each violation raises a :mod:`mugraph.core.errors` exception naming
the rule, the op and the offending value.

Writing a μGraph by hand::

    kg = mg.KernelGraph("rmsnorm_matmul")
    X = kg.input("X", (2, 4096)); G = kg.input("G", (4096,)); W = kg.input("W", (4096, 6144))
    bg = mg.BlockGraph(grid=(96, 1, 1), forloop=64)
    x = bg.input(X, imap=(None,), fmap=1)         # grid axis x replicates X; loop walks dim 1
    g = bg.input(G, fmap=0)
    w = bg.input(W, imap=(1,), fmap=0)            # grid axis x splits W's columns
    acc = bg.accum(mg.matmul(x * g, w))           # Σ over the loop
    ss = bg.accum(mg.sum(mg.square(x), 1))
    bg.output(acc / mg.sqrt(ss * (1 / 4096)), omap=(1,))
    (Y,) = kg.kernel(bg)
    kg.output(Y)
"""

from __future__ import annotations

import hashlib
import keyword
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable, Sequence

from .builder import TensorOps
from .checks import DTYPES, _is_sequence, check_dtype, check_name, check_shape, rational, short, strict_int
from .fills import BandMask
from .errors import ArgumentTypeError, DTypeError, InvalidGraphError, ResourceError, ShapeError, UnsupportedOpError
from .limits import MAX_DIM, MAX_NAME_CHARS
from .ops import CATALOG, get_op
from .text import format_block, format_graph
from .unionfind import UnionFind

AXES = "xyz"

#: H100: 227 KB of shared memory per block, 64 K 32-bit registers per SM.
DEFAULT_SMEM_BUDGET = 227 * 1024
DEFAULT_REGISTER_BUDGET = 64 * 1024 * 4


#: names the IR gives unnamed tensors; an input of such a name would be confused with them
_AUTO_LABEL = re.compile(r"[tb][0-9]+")


class Tensor(TensorOps):
    """An edge of a graph: a device tensor (kernel graph) or a tile (block graph).

    ``acc`` (block graphs only) counts the accumulators on the paths from input
    iterators to this tile: 0 inside the loop, 1 after it, ``None`` for tiles that
    depend on constants only.
    """

    __slots__ = ("graph", "id", "shape", "dtype", "op", "name", "acc")

    def __init__(self, graph: "Graph", id: int, shape, dtype: str, op: "Op", name: str | None = None,
                 acc: int | None = None):
        self.graph, self.id, self.shape, self.dtype, self.op, self.name, self.acc = (
            graph, id, tuple(shape), dtype, op, name, acc)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype]

    def label(self) -> str:
        return self.name if self.name else f"{self.graph.tensor_prefix}{self.id}"

    @property
    def fill(self) -> "BandMask | None":
        """The position-dependent constant a kernel-graph input is filled with, if any
        (:mod:`mugraph.core.fills`)."""
        return self.op.attrs.get("fill") if self.op.kind == "input" else None

    def __repr__(self) -> str:
        return f"<{self.label()} {self.shape} {self.dtype}>"

    # Python's arithmetic operators build ops in the tensor's graph (scalars become
    # constants): they come from :class:`mugraph.core.builder.TensorOps`

    def __bool__(self):
        raise ArgumentTypeError(f"{self.label()}: a mugraph Tensor is symbolic; it has no truth value")

    # what the catalog has no op for: a one-line error naming the way to say it, not
    # Python's "unsupported operand" (and numpy must not broadcast an array over a Tensor)
    __array_ufunc__ = None

    def _unsupported(self, what: str, hint: str):
        raise UnsupportedOpError(f"{self.label()}: {what} is not a mugraph op; {hint}")

    def __pow__(self, o):
        self._unsupported(f"x ** {short(o)}", "use mg.square(x), mg.sqrt(x) or mg.exp")

    def __rpow__(self, o):
        self._unsupported(f"{short(o)} ** x", "use mg.exp(x * log(base))")

    def __abs__(self):
        self._unsupported("abs(x)", "the catalog has no absolute value (mg.sqrt(mg.square(x)) is |x|)")

    def __getitem__(self, key):
        self._unsupported(f"x[{short(key)}]", "tensors are not indexed or iterated; use mg.reshape, mg.concat or a "
                                            "BlockGraph iterator (imap/fmap)")

    def _compare(self, o):
        self._unsupported("a comparison", "mugraph programs have no comparisons (mg.max reduces along a dim)")

    __lt__ = __le__ = __gt__ = __ge__ = _compare

    __hash__ = object.__hash__


class Op:
    """A node: ``kind`` is a catalog op name or a structural kind
    (``input``, ``graph_defined``, ``iterator``, ``accum``)."""

    __slots__ = ("kind", "inputs", "outputs", "attrs", "id")

    def __init__(self, kind: str, inputs: list[Tensor], attrs: dict, id: int):
        self.kind, self.inputs, self.attrs, self.id = kind, inputs, attrs, id
        self.outputs: list[Tensor] = []

    def label(self) -> str:
        return f"{self.kind}#{self.id}"

    def __repr__(self) -> str:
        return f"<op {self.label()}>"


class Graph:
    """Shared machinery of kernel and block graphs: ops in insertion (topological) order."""

    level = "?"
    tensor_prefix = "t"

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.tensors: list[Tensor] = []
        self.frozen = False

    def _check_open(self, what: str) -> None:
        if self.frozen:
            raise InvalidGraphError(f"{what}: this block graph is already attached to a kernel; build a new one")

    def _new_op(self, kind: str, inputs: list[Tensor], attrs: dict) -> Op:
        op = Op(kind, list(inputs), attrs, len(self.ops))
        self.ops.append(op)
        return op

    def _new_tensor(self, op: Op, shape, dtype: str, name: str | None = None, acc: int | None = None) -> Tensor:
        t = Tensor(self, len(self.tensors), shape, dtype, op, name, acc)
        self.tensors.append(t)
        op.outputs.append(t)
        return t

    def _own(self, t: Tensor, what: str) -> None:
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{what}: expected a mugraph Tensor, got {type(t).__name__}")
        if t.graph is not self:
            raise InvalidGraphError(f"{what}: tensor {t.label()} belongs to another graph")

    def add_op(self, kind: str, inputs: Sequence[Tensor], attrs: dict | None = None) -> Tensor:
        """Append a catalog op; checks level, arity, shapes and dtypes; returns its output."""
        if not isinstance(kind, str):
            raise ArgumentTypeError(f"add_op: the op kind must be a str, got {type(kind).__name__}")
        if attrs is not None and not isinstance(attrs, dict):
            raise ArgumentTypeError(f"add_op {kind}: attrs must be a dict, got {type(attrs).__name__}")
        if type(inputs) not in (list, tuple):
            raise ArgumentTypeError(f"add_op {kind}: inputs must be a list of Tensors, got {type(inputs).__name__}")
        attrs = dict(attrs or {})
        self._check_open(kind)
        opdef = get_op(kind)
        where = f"{kind} (op #{len(self.ops)})"
        if self.level not in opdef.levels:
            raise UnsupportedOpError(f"{where}: not available in a {type(self).__name__}")
        for t in inputs:
            self._own(t, where)
        _check_attrs(opdef, attrs, bool(inputs), where)
        if opdef.arity >= 0 and len(inputs) != opdef.arity:
            raise ShapeError(f"{where}: takes {opdef.arity} inputs, got {len(inputs)}")
        if opdef.arity < 0 and not inputs:
            raise ShapeError(f"{where}: needs at least one input")
        dtypes = {t.dtype for t in inputs}
        if len(dtypes) > 1:
            raise DTypeError(f"{where}: inputs have different dtypes {sorted(dtypes)}")
        dtype = inputs[0].dtype if inputs else check_dtype(attrs.pop("dtype", "float16"), where)
        try:
            shape = opdef.shape_rule([t.shape for t in inputs], attrs)
        except ShapeError as e:
            raise ShapeError(f"{where}: {e}") from None
        shape = check_shape(shape, where)
        acc = self._acc_of(kind, inputs, where)
        op = self._new_op(kind, inputs, attrs)
        return self._new_tensor(op, shape, dtype, acc=acc)

    def _acc_of(self, kind: str, inputs: Sequence[Tensor], where: str) -> int | None:
        return None

    # ------------------------------------------------------------------ views
    def consumers(self) -> dict[Tensor, list[Op]]:
        out: dict[Tensor, list[Op]] = {t: [] for t in self.tensors}
        for op in self.ops:
            for t in op.inputs:
                out[t].append(op)
        return out


def _check_attrs(opdef, attrs: dict, has_inputs: bool, where: str) -> None:
    """The attributes an op carries, exactly, as its catalog schema says: none unknown
    (a misspelt ``dims`` must not be ignored), none missing, each of its type.
    Normalizes ``attrs`` in place (dims to ints, shapes to tuples, constants to Fractions)."""
    names = opdef.attr_names
    allowed = set(names) | ({"dtype"} if not has_inputs else set())
    unknown = sorted(str(k) for k in attrs if k not in allowed)
    if unknown:
        raise InvalidGraphError(f"{where}: unknown attribute(s) {unknown}; {opdef.name} takes {list(names)}")
    missing = [k for k in names if k not in attrs]
    if missing:
        raise InvalidGraphError(f"{where}: missing attribute(s) {missing}")
    for a in opdef.attrs:
        what = f"{where}: attribute {a.name}" if a.type == "shape" else f"{where}: {a.name}"
        attrs[a.name] = _ATTR_CHECKS[a.type](attrs[a.name], what)


def _counts(v: Any, what: str) -> tuple[int, ...]:
    if not _is_sequence(v):
        raise ArgumentTypeError(f"{what} {short(v)} must be a sequence of ints")
    return tuple(strict_int(r, what) for r in v)


def _index(v: Any, what: str) -> int:
    i = strict_int(v, what)
    if i < 0:
        raise ShapeError(f"{what} {i} must be >= 0")
    return i


def _rational_attr(v: Any, what: str) -> Fraction:
    if type(v) is Fraction and v.denominator.bit_length() < 1000 and v.numerator.bit_length() < 1000:
        return v
    return rational(v, what)


#: attribute type (:data:`mugraph.core.ops.ATTR_TYPES`) -> its check: the value normalized, or a MugraphError
_ATTR_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "dim": strict_int,
    "shape": check_shape,
    "counts": _counts,
    "perm": _counts,       # ints; the shape rule checks it is a permutation of the input's dims
    "index": _index,       # an int >= 0; the shape rule checks it against the dim
    "rational": _rational_attr,
}


# ---------------------------------------------------------------------------- kernel level


class KernelGraph(Graph):
    """A kernel graph: device tensors between pre-defined and graph-defined kernels."""

    level = "K"
    tensor_prefix = "t"

    def __init__(self, name: str = "graph") -> None:
        super().__init__()
        self.name = check_name(name, type(self).__name__)
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []

    def input(self, name: str, shape, dtype: str = "float16", fill: "BandMask | None" = None) -> Tensor:
        """A graph input. ``fill``: a position-dependent constant (:mod:`mugraph.core.fills`)
        the kernels make from indices instead of reading; callers may leave it out."""
        what = f"input {short(name)}"
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise InvalidGraphError(f"{what}: input names must be Python identifiers (not keywords): they name "
                                    "the compiled program's arguments")
        if len(name) > MAX_NAME_CHARS:
            raise InvalidGraphError(f"{what[:40]}...: input names have at most {MAX_NAME_CHARS} characters")
        if _AUTO_LABEL.fullmatch(name):
            raise InvalidGraphError(f"{what}: names of the form t<N>/b<N> label unnamed tensors; pick another")
        if any(t.name == name for t in self.inputs):
            raise InvalidGraphError(f"{what}: an input of that name already exists")
        shape = check_shape(shape, what)
        check_dtype(dtype, what)
        attrs: dict = {"name": name}
        if fill is not None:
            if not isinstance(fill, BandMask):
                raise ArgumentTypeError(f"{what}: fill must be a mugraph fill (mg.causal_mask(...)), got "
                                        f"{type(fill).__name__}")
            fill.check(shape, what)
            attrs["fill"] = fill
        op = self._new_op("input", [], attrs)
        t = self._new_tensor(op, shape, dtype, name=name)
        self.inputs.append(t)
        return t

    def output(self, t: Tensor) -> Tensor:
        self._own(t, "output")
        if t.op.kind == "input":
            raise InvalidGraphError(f"output: {t.label()} is an input; an output must be computed by an op")
        if t in self.outputs:
            raise InvalidGraphError(f"output: {t.label()} is already an output")
        self.outputs.append(t)
        return t

    def kernel(self, block: "BlockGraph", *, smem_budget: int = DEFAULT_SMEM_BUDGET,
               register_budget: int = DEFAULT_REGISTER_BUDGET) -> list[Tensor]:
        """Attach ``block`` as a graph-defined kernel; returns one device tensor per output saver.

        Checks the block graph as a whole (it has outputs; every iterator reads this
        graph's tensors; its tiles fit shared memory and its thread graphs fit
        registers) and freezes it.
        """
        if not isinstance(block, BlockGraph):
            raise ArgumentTypeError(f"kernel: expected a BlockGraph, got {type(block).__name__}")
        where = f"graph_defined (op #{len(self.ops)})"
        for k, v in (("smem_budget", smem_budget), ("register_budget", register_budget)):
            if strict_int(v, f"{where}: {k}") < 1:
                raise InvalidGraphError(f"{where}: {k}={v} must be a positive number of bytes")
        block._check_open(where)
        if not block.savers:
            raise InvalidGraphError(f"{where}: block graph has no output saver")
        for s in block.sources:
            self._own(s, where)
        block.check_resources(smem_budget, register_budget, where)
        block.frozen = True
        op = self._new_op("graph_defined", list(block.sources), {"block": block})
        return [self._new_tensor(op, sv.shape, sv.tensor.dtype) for sv in block.savers]

    def ops_of_kind(self, kind: str) -> list[Op]:
        return [op for op in self.ops if op.kind == kind]

    @property
    def num_kernels(self) -> int:
        """Kernel launches: every op but inputs (reshape-free graphs launch each op)."""
        return sum(1 for op in self.ops if op.kind != "input")

    def __str__(self) -> str:
        return format_graph(self)


class Program(KernelGraph):
    """A Lax program: a kernel graph of pre-defined ops only (the superoptimizer's input)."""

    def kernel(self, block, **kw):  # type: ignore[override]
        raise InvalidGraphError("kernel: a Program holds pre-defined ops only; write μGraphs with mg.KernelGraph")


# ---------------------------------------------------------------------------- block level


def broadcasts_to(small: tuple, big: tuple) -> bool:
    """Does ``small`` broadcast to ``big`` (right-aligned, each dim 1 or equal)?"""
    if len(small) > len(big):
        return False
    return all(a in (1, b) for a, b in zip(reversed(small), reversed(big)))


#: what an accumulator folds over the loop: a sum, a running max, a sum rescaled to the running max
SUM, RUNNING_MAX, RESCALED = "sum", "max", "rescaled"
ACCUM_MONOIDS = (SUM, RUNNING_MAX, RESCALED)


def accum_monoid(op: Op) -> str:
    """``"sum"``, ``"max"`` or ``"rescaled"``: what accumulator ``op`` folds over the loop."""
    return op.attrs.get("monoid", SUM)


def _norm_map(m, n_axes: int, what: str) -> tuple:
    """An imap/omap as one entry per grid axis: a dim (int) or None. Given as a
    sequence (missing trailing axes are None) or a dict keyed by axis name; an
    unknown key (``'w'``) is refused, not ignored."""
    if m is None:
        m = ()
    if isinstance(m, dict):
        unknown = [k for k in m if k not in AXES[:n_axes]]
        if unknown:
            raise InvalidGraphError(f"{what}: unknown grid axis key(s) {', '.join(short(k, 20) for k in unknown)}; "
                                    f"keys are {list(AXES[:n_axes])}")
        m = tuple(m.get(a) for a in AXES[:n_axes])
    if not _is_sequence(m):
        raise InvalidGraphError(f"{what}: {short(m)} must be a tuple of dims (int or None), one per grid axis, "
                                "or a dict {'x': dim, ...}")
    m = tuple(m)
    if len(m) > n_axes:
        raise InvalidGraphError(f"{what}: {m} has more than {n_axes} entries (one per grid axis x, y, z)")
    m = m + (None,) * (n_axes - len(m))
    for d in m:
        if d is not None and (type(d) is not int):
            raise InvalidGraphError(f"{what}: entries must be dims (int) or None, got {short(m)}")
    return m


@dataclass
class Saver:
    """An output saver: writes ``tensor`` (a post-loop tile) to a device tensor of ``shape``."""

    tensor: Tensor
    omap: tuple
    shape: tuple[int, ...]


@dataclass
class ThreadGraph:
    """A fused chain of element-wise block ops; its ``intermediates`` stay in registers."""

    ops: list[Op]
    inputs: list[Tensor]
    outputs: list[Tensor]
    intermediates: list[Tensor]


class BlockGraph(Graph):
    """The program of one thread block of a graph-defined kernel.

    ``grid`` blocks run it; each runs ``forloop`` iterations of the loop body.
    Tiles computed before any accumulator belong to the loop body; everything
    downstream of an accumulator runs once, after the loop.
    """

    level = "B"
    tensor_prefix = "b"

    def __init__(self, grid=(1, 1, 1), forloop: int = 1) -> None:
        super().__init__()
        if not _is_sequence(grid) or not 1 <= len(grid) <= 3 or any(type(g) is not int or g < 1 for g in grid):
            raise InvalidGraphError(f"grid {short(grid)}: must be a tuple of 1 to 3 positive ints (x, y, z)")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if math.prod(grid) > MAX_DIM:
            raise InvalidGraphError(f"grid {grid}: {math.prod(grid)} blocks > {MAX_DIM} (one 32-bit launch axis)")
        if type(forloop) is not int or not 1 <= forloop <= MAX_DIM:
            raise InvalidGraphError(f"forloop {short(forloop)}: must be a positive int (at most {MAX_DIM})")
        self.grid: tuple[int, int, int] = grid  # type: ignore[assignment]
        self.forloop = forloop
        self.sources: list[Tensor] = []
        self.savers: list[Saver] = []
        self._thread_graphs: list[ThreadGraph] | None = None

    @property
    def num_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    # -- input iterators
    def input(self, source: Tensor, imap=None, fmap: int | None = None) -> Tensor:
        """An input iterator over the device tensor ``source`` (see docs/design.md §2.3)."""
        where = f"iterator (op #{len(self.ops)})"
        self._check_open(where)
        if not isinstance(source, Tensor) or not isinstance(source.graph, KernelGraph):
            raise InvalidGraphError(f"{where}: source must be a tensor of a kernel graph")
        shape = source.shape
        imap = _norm_map(imap, 3, f"{where}: imap")
        tile = list(shape)
        used: dict[int, str] = {}
        for a, (d, g) in enumerate(zip(imap, self.grid)):
            ax = AXES[a]
            if d is None:
                continue
            if g == 1:
                raise InvalidGraphError(f"{where}: imap {imap}: grid axis {ax} has size 1 and must map to None")
            if not 0 <= d < len(shape):
                raise InvalidGraphError(f"{where}: imap {imap}: dim {d} out of range for {source.label()} {shape}")
            if d in used:
                raise InvalidGraphError(f"{where}: imap {imap}: grid axes {used[d]} and {ax} both map to dim {d}")
            used[d] = ax
            if shape[d] % g:
                raise InvalidGraphError(
                    f"{where}: imap {imap}: dim {d} of {source.label()} {shape} (size {shape[d]}) "
                    f"is not divisible by grid axis {ax} = {g}")
            tile[d] //= g
        if fmap is not None:
            if type(fmap) is not int:
                raise InvalidGraphError(f"{where}: fmap {short(fmap)} must be a dim (int) or None")
            if self.forloop == 1:
                raise InvalidGraphError(f"{where}: fmap {fmap}: forloop is 1, so fmap must be None")
            if not isinstance(fmap, int) or not 0 <= fmap < len(shape):
                raise InvalidGraphError(f"{where}: fmap {fmap} out of range for {source.label()} {shape}")
            if tile[fmap] % self.forloop:
                raise InvalidGraphError(
                    f"{where}: fmap {fmap}: dim {fmap} of {source.label()} {shape} (block slice {tile[fmap]}) "
                    f"is not divisible by forloop {self.forloop}")
            tile[fmap] //= self.forloop
        if source not in self.sources:
            self.sources.append(source)
        op = self._new_op("iterator", [], {"source": self.sources.index(source), "imap": imap, "fmap": fmap})
        return self._new_tensor(op, tile, source.dtype, acc=0)

    # -- accumulators
    def accum(self, x: Tensor, shift: Tensor | None = None) -> Tensor:
        """``Σ_{i<forloop} x_i``: closes the loop for every path through it.

        With ``shift`` (a loop-body tile that broadcasts to ``x``, typically a per-row max
        of the iteration's tile), the *rescaled* sum ``Σ_i x_i·exp(m_i − M)`` with
        ``M = max_i m_i``: the accumulator of an online softmax, which keeps every
        iteration's terms on the common scale of the running maximum (docs/design.md
        §3.4). ``x_i`` was computed as if shifted by ``m_i``; the result is what a single
        shift by ``M`` would have given. Two rescaled accumulators of one ``shift`` share
        their ``M`` (:meth:`accum_max` of it)."""
        where = f"accum (op #{len(self.ops)})"
        self._check_open(where)
        self._own(x, where)
        self._check_body(x, where)
        if shift is None:
            op = self._new_op("accum", [x], {})
            return self._new_tensor(op, x.shape, x.dtype, acc=1)
        self._own(shift, where)
        self._check_body(shift, where)
        if not broadcasts_to(shift.shape, x.shape):
            raise InvalidGraphError(f"{where}: shift {shift.label()} {shift.shape} does not broadcast to "
                                    f"{x.label()} {x.shape} (a rescale multiplies x by exp(m_i − M) element-wise)")
        op = self._new_op("accum", [x, shift], {"monoid": RESCALED})
        return self._new_tensor(op, x.shape, x.dtype, acc=1)

    def accum_max(self, m: Tensor) -> Tensor:
        """``max_{i<forloop} m_i``: the running maximum of a loop-body tile (the ``M`` a
        rescaled :meth:`accum` of ``m`` scales to). To the verifier it is a max, a free
        shift (docs/design.md §3.3)."""
        where = f"accum_max (op #{len(self.ops)})"
        self._check_open(where)
        self._own(m, where)
        self._check_body(m, where)
        op = self._new_op("accum", [m], {"monoid": RUNNING_MAX})
        return self._new_tensor(op, m.shape, m.dtype, acc=1)

    def accum_like(self, op: Op, inputs: Sequence[Tensor]) -> Tensor:
        """An accumulator of ``op``'s monoid over ``inputs`` (replaying or decoding a graph)."""
        monoid = accum_monoid(op)
        if monoid not in ACCUM_MONOIDS:
            raise InvalidGraphError(f"accum (op #{len(self.ops)}): unknown monoid {short(monoid)}; "
                                    f"one of {', '.join(ACCUM_MONOIDS)}")
        want = 2 if monoid == RESCALED else 1
        if len(inputs) != want:
            raise InvalidGraphError(f"accum (op #{len(self.ops)}): a {monoid} accumulator takes {want} "
                                    f"input{'s' if want > 1 else ''}, got {len(inputs)}")
        if monoid == RUNNING_MAX:
            return self.accum_max(inputs[0])
        return self.accum(inputs[0], inputs[1] if monoid == RESCALED else None)

    def _check_body(self, x: Tensor, where: str) -> None:
        if x.acc == 1:
            raise InvalidGraphError(
                f"{where}: {x.label()} is already downstream of an accumulator; "
                "a path from an input to an output must pass through exactly one accumulator")

    def loop_invariant(self, t: Tensor) -> bool:
        """Whether loop-body tile ``t`` is the same at every iteration: made of iterators
        without an fmap (or of a loop of one step) and constants only. Such a tile may also
        be read after the loop (a residual or bias added to an accumulator: §2.4)."""
        if t.acc == 1:
            return False
        if t.op.kind == "iterator":
            return t.op.attrs["fmap"] is None or self.forloop == 1
        return all(self.loop_invariant(x) for x in t.op.inputs)

    def _acc_of(self, kind: str, inputs: Sequence[Tensor], where: str) -> int | None:
        accs = {t.acc for t in inputs if t.acc is not None}
        if accs == {0, 1} and all(self.loop_invariant(t) for t in inputs if t.acc == 0):
            return 1  # a loop-invariant tile read after the loop: the same tile as in it
        if len(accs) > 1:
            inside = [t.label() for t in inputs if t.acc == 0]
            after = [t.label() for t in inputs if t.acc == 1]
            raise InvalidGraphError(
                f"{where}: mixes loop-body tiles {inside} with post-loop tiles {after}; "
                "a path from an input iterator to an output saver would have no accumulator "
                "(only a loop-invariant tile — iterators without an fmap — may be read after the loop)")
        return accs.pop() if accs else None

    # -- output savers
    def output(self, x: Tensor, omap=None) -> None:
        """An output saver writing post-loop tile ``x``; every grid axis > 1 maps to a distinct dim."""
        where = f"output saver {len(self.savers)}"
        self._check_open(where)
        self._own(x, where)
        if x.acc != 1:
            raise InvalidGraphError(
                f"{where}: {x.label()} has no accumulator on its path from the inputs; "
                "every path from an input iterator to an output saver must pass through exactly one accumulator")
        omap = _norm_map(omap, 3, f"{where}: omap")
        out = list(x.shape)
        used: dict[int, str] = {}
        for a, (d, g) in enumerate(zip(omap, self.grid)):
            ax = AXES[a]
            if d is None:
                if g > 1:
                    raise InvalidGraphError(
                        f"{where}: omap {omap}: grid axis {ax} (size {g}) is missing; "
                        "blocks along it would overwrite each other's output")
                continue
            if g == 1:
                raise InvalidGraphError(f"{where}: omap {omap}: grid axis {ax} has size 1 and must map to None")
            if not 0 <= d < len(out):
                raise InvalidGraphError(f"{where}: omap {omap}: dim {d} out of range for tile {x.shape}")
            if d in used:
                raise InvalidGraphError(f"{where}: omap {omap}: grid axes {used[d]} and {ax} both map to dim {d}")
            used[d] = ax
            out[d] *= g
        shape = check_shape(out, where)
        self.savers.append(Saver(x, omap, shape))

    # -- thread graphs and resources
    @property
    def thread_graphs(self) -> list[ThreadGraph]:
        """Maximal groups of element-wise ops fused by rule (paper §4.2), in op order."""
        if self._thread_graphs is None or not self.frozen:
            self._thread_graphs = build_thread_graphs(self)
        return self._thread_graphs

    def register_tensors(self) -> set[Tensor]:
        return {t for tg in self.thread_graphs for t in tg.intermediates}

    def shared_memory_bytes(self) -> tuple[int, Tensor | None]:
        """Peak shared memory over the block's program, by tile lifetime.

        Tiles live from the op that makes them to their last use; loop-body tiles die
        at the end of each iteration; accumulators are fp32 and live from the loop's
        start to their last use after it. Thread-graph intermediates live in
        registers and do not count. Returns (peak bytes, the largest tile live then).
        """
        regs = self.register_tensors()
        last_use: dict[Tensor, int] = {t: t.op.id for t in self.tensors}
        for op in self.ops:
            for t in op.inputs:
                last_use[t] = op.id
        saved = {sv.tensor for sv in self.savers}
        n = len(self.ops)
        for t in saved:
            last_use[t] = n

        def size(t: Tensor) -> int:
            return t.numel * 4 if t.op.kind == "accum" else t.nbytes

        accs = [t for t in self.tensors if t.op.kind == "accum"]
        body_end = max((t.op.id for t in self.tensors if t.acc == 0), default=-1)
        peak, peak_t = 0, None
        for step in range(n + 1):
            live = [t for t in self.tensors
                    if t not in regs and t.op.kind != "accum" and t.op.id <= step <= last_use[t]]
            live += [t for t in accs if step <= max(last_use[t], body_end)]
            total = sum(size(t) for t in live)
            if total > peak:
                peak, peak_t = total, max(live, key=size)
        return peak, peak_t

    def check_resources(self, smem_budget: int, register_budget: int, where: str = "block graph") -> None:
        peak, biggest = self.shared_memory_bytes()
        if peak > smem_budget:
            raise ResourceError(
                f"{where}: tiles need {peak} bytes of shared memory (largest: {biggest.label()} "
                f"{biggest.shape} {biggest.dtype}) > budget {smem_budget}")
        for i, tg in enumerate(self.thread_graphs):
            for t in tg.intermediates:
                if t.numel * 4 > register_budget:
                    raise ResourceError(
                        f"{where}: thread graph {i} keeps {t.label()} {t.shape} in registers: "
                        f"{t.numel * 4} bytes > register budget {register_budget}")

    def __str__(self) -> str:
        return "\n".join(format_block(self))


def build_thread_graphs(block: BlockGraph) -> list[ThreadGraph]:
    """Fuse element-wise block ops into thread graphs.

    Rule: an element-wise op joins the thread graph of each element-wise producer
    whose output it alone consumes (in the same loop phase); groups that meet are
    merged. A tile is an intermediate (kept in registers) when it is made inside a
    group, consumed only inside it, and not saved.
    """
    if not isinstance(block, BlockGraph):
        raise ArgumentTypeError(f"build_thread_graphs: expected a BlockGraph, got {type(block).__name__}")
    consumers = block.consumers()
    saved = {sv.tensor for sv in block.savers}
    uf: UnionFind[int] = UnionFind()
    for op in block.ops:
        if op.kind not in CATALOG or not CATALOG[op.kind].elementwise:
            continue
        uf.add(op.id)
        for t in op.inputs:
            p = t.op
            if p.id in uf and len(consumers[t]) == 1 and t not in saved and t.acc == op.outputs[0].acc:
                uf.union(p.id, op.id)
    groups = [[block.ops[i] for i in ids] for ids in uf.groups().values()]
    out = []
    for ops in sorted(groups, key=lambda g: g[0].id):
        if len(ops) < 2:
            continue
        members = {op.id for op in ops}
        made = [t for op in ops for t in op.outputs]
        inter = [t for t in made if t not in saved and consumers[t]
                 and all(c.id in members for c in consumers[t])]
        outs = [t for t in made if t not in inter]
        ins = []
        for op in ops:
            for t in op.inputs:
                if t.op.id not in members and t not in ins:
                    ins.append(t)
        out.append(ThreadGraph(ops, ins, outs, inter))
    return out


def graph_ops(graph: KernelGraph) -> Iterable[tuple[Op, "BlockGraph | None"]]:
    """Every op of a kernel graph and of its block graphs (with the block graph it lives in)."""
    for op in graph.ops:
        yield op, None
        if op.kind == "graph_defined":
            for bop in op.attrs["block"].ops:
                yield bop, op.attrs["block"]


def propagate(graph: KernelGraph, on_input: Callable[[Op], Any],
              on_op: Callable[[Op, list, "Op | None"], Any],
              on_accum: Callable[[Op, list, BlockGraph], Any] = lambda op, vs, block: vs[0]) -> dict[Tensor, Any]:
    """Fold a value through ``graph`` in op order, graph-defined ops inlined.

    The one traversal the stages share (Lax check, the verifier's dependency
    analysis, …): an input gets ``on_input(op)``; a catalog op gets
    ``on_op(op, input values, enclosing graph-defined op or None)``; an input
    iterator passes its source's value on, an accumulator ``on_accum(op, input values,
    block)`` (by default its first input's value: the summed or maximized tile), and
    each kernel output of a graph-defined op its saver's value.
    Returns the value of every kernel tensor and every block tile.
    """
    env: dict[Tensor, Any] = {}
    for op in graph.ops:
        if op.kind == "input":
            env[op.outputs[0]] = on_input(op)
        elif op.kind == "graph_defined":
            block: BlockGraph = op.attrs["block"]
            for bop in block.ops:
                out = bop.outputs[0]
                if bop.kind == "iterator":
                    env[out] = env[block.sources[bop.attrs["source"]]]
                elif bop.kind == "accum":
                    env[out] = on_accum(bop, [env[t] for t in bop.inputs], block)
                else:
                    env[out] = on_op(bop, [env[t] for t in bop.inputs], op)
            for t, sv in zip(op.outputs, block.savers):
                env[t] = env[sv.tensor]
        else:
            env[op.outputs[0]] = on_op(op, [env[t] for t in op.inputs], None)
    return env


def dataflow_key(graph: KernelGraph) -> str:
    """A digest of what ``graph`` computes and how, equal for two graphs that differ only in
    the order independent ops were added in (in the kernel graph or inside a block graph),
    in tensor numbering, in the order of a kernel's sources, or in the operand order of a
    commutative op (``OpDef.commutative``: ``x*g`` and ``g*x``).

    Every tensor's key is its op's kind and attributes, its shape and dtype, and its inputs'
    keys (an input iterator: its source's key, imap and fmap; a kernel input: its name);
    a block graph adds its grid, loop and savers. The lowering emits such graphs as the
    same kernels up to the order of independent statements, so the GPU re-ranking times
    one of them, and the fingerprint's program outputs are keyed by it."""
    def digest(*parts: object) -> str:
        return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()

    def attrs(op: Op) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in op.attrs.items() if k not in ("block", "source", "name")))

    key: dict[Tensor, str] = {}

    def operands(op: Op) -> tuple:
        ks = tuple(key[x] for x in op.inputs)
        return tuple(sorted(ks)) if op.kind in CATALOG and get_op(op.kind).commutative else ks

    for op in graph.ops:
        if op.kind == "input":
            t = op.outputs[0]
            key[t] = digest("input", t.name, t.shape, t.dtype, repr(t.fill))
        elif op.kind == "graph_defined":
            block: BlockGraph = op.attrs["block"]
            for bop in block.ops:
                t = bop.outputs[0]
                ins = ((key[block.sources[bop.attrs["source"]]],) if bop.kind == "iterator"
                       else operands(bop))
                key[t] = digest(bop.kind, attrs(bop), t.shape, t.dtype, ins)
            k = digest("kernel", block.grid, block.forloop,
                       tuple((key[sv.tensor], sv.omap, sv.shape) for sv in block.savers))
            for i, t in enumerate(op.outputs):
                key[t] = digest(k, i, t.dtype)
        else:
            k = digest(op.kind, attrs(op), operands(op))
            for i, t in enumerate(op.outputs):
                key[t] = digest(k, i, t.shape, t.dtype)
    return digest(tuple(key[t] for t in graph.outputs))
