"""The op catalog: each op's definition and its traits.

An :class:`OpDef` says what an op *is*, once: its category, how its output dims
follow its input dims, its attributes, what its padding must hold, its Lax class.
Every stage reads these traits instead of testing op names: lowering unifies tile
dims from :func:`dim_map`, the search enumerates attributes from the schema, the
reduce emitter pads with the reduction's identity. What an op *does* on one kind of
value is a stage's business: each stage keeps one facet table per concern, keyed by
op name (float, magnitude and field evaluation, degree bound, abstract expression,
Triton emission, torch call; README "Adding an operator" lists them), and
``tests/mugraph/test_catalog.py`` walks every (op, facet) pair. Shape and dim rules
are in :mod:`mugraph.core.oprules`.

Levels: ``"K"`` kernel graph (a pre-defined kernel op run by a library),
``"B"`` block graph (an op on tiles inside a graph-defined kernel).

Lax classes (paper §5): ``linear``, ``multilinear``, ``division``,
``exponentiation`` (at most one exp-like op on any path), ``sqrt`` and ``silu``
(supported by the field algebra but outside the theorem's class; silu contains an
exp and counts as one for the path rule), and ``none`` (outside the Lax fragment:
programs using it can only be compared in floating point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from .errors import MugraphError, UnsupportedOpError
from .oprules import (DimMap, DimRule, Shape, ShapeRule, broadcast_shape, broadcast_shapes, concat_shape, const_shape,
                      dims_concat, dims_elementwise, dims_matmul, dims_none, dims_permute, dims_reduce, dims_repeat,
                      dims_reshape, dims_slice, matmul_shape, permute_shape, reduce_shape, repeat_shape,
                      reshape_shape, same_shape, slice_shape)

__all__ = ["ATTR_TYPES", "Attr", "CATALOG", "COMBINE_IDENTITY", "Category", "CatalogError", "DimMap", "LAX_CLASSES",
           "MAX_RANK", "OpDef", "Padding", "Reduction", "STRUCTURAL", "adds_up", "broadcast_shapes", "category",
           "dim_map", "exp_like", "folds", "get_op", "is_contraction", "is_elementwise", "is_pointwise", "is_rearrangement", "joins",
           "lax_classes", "reduction", "register", "reorders", "selects", "strided_view", "unregister"]

MAX_RANK = 4


class CatalogError(MugraphError):
    """A catalog entry whose traits contradict each other, or a second entry of one name."""


# ---------------------------------------------------------------------------- traits


class Category(str, Enum):
    """What kind of function an op computes; most traits follow from it."""

    UNARY = "unary"                  # element-wise, one input
    BINARY = "binary"                # element-wise, two inputs, numpy broadcasting
    REDUCTION = "reduction"          # folds one dim (``attrs["dim"]``, kept as size 1) with a combine op
    CONTRACTION = "contraction"      # sums products over a shared dim (matmul)
    REARRANGEMENT = "rearrangement"  # moves elements without arithmetic (concat, reshape, repeat, permute)
    CONSTANT = "constant"            # no inputs


#: combine op of a reduction -> its identity (what padding must hold so it changes nothing)
COMBINE_IDENTITY: dict[str, float] = {"add": 0.0, "max": -math.inf, "min": math.inf}


@dataclass(frozen=True)
class Reduction:
    """A reduction's fold: ``combine`` (a key of :data:`COMBINE_IDENTITY`) and its identity."""

    combine: str
    identity: float


@dataclass(frozen=True)
class Padding:
    """How an op treats the padding of a register tile (lowering pads tiles to powers of two).

    ``reads``: what a padded element must hold before the op reads it along the dims
    it folds — ``"any"`` (element-wise: padding only reaches padding), ``"zero"``
    (a contraction's shared dim: 0·x adds nothing), ``"identity"`` (a reduction's dim:
    :attr:`Reduction.identity`).
    ``zero``: whether zero padding stays zero — ``"keeps"`` (f(0) = 0; a reduction: along
    the dims it does not fold), ``"all"`` (binary: where every operand spanning the dim
    is zero, 0 ± 0 = 0), ``"any"`` (binary: where one spanning operand is zero and all
    are finite, 0·x = 0), ``"none"`` (nothing is claimed).
    ``finite``: whether finite padding stays finite — ``"keeps"``, ``"if_zero"`` (only
    when the padding read is zero: sqrt of a negative is NaN), ``"never"`` (exp
    overflows, a division may divide by zero).
    """

    reads: str = "any"
    zero: str = "none"
    finite: str = "keeps"


ATTR_TYPES: dict[str, str] = {
    "dim": "a dim index of the (first) input; the IR takes an int, the builders also count from the end",
    "shape": "a shape: a tuple of positive ints",
    "counts": "one positive int per dim of the input",
    "perm": "a permutation of the input's dims (output dim o is input dim perm[o])",
    "index": "a non-negative int position along a dim (a slice's start, end or step)",
    "rational": "an exact rational constant (a Fraction; floats by their shortest decimal form)",
}
"""Attribute types: the IR normalizes and checks each by type, the interpreter shifts
``dim``/``shape``/``counts``/``perm`` past its batch axes (an ``index`` counts along its
dim and stays), the search enumerates ``dim`` over the input's dims, ``rational``,
``perm`` and ``index`` over the program's own values of that attribute (a permutation
or a window is a program's layout decision, not something to invent)."""


@dataclass(frozen=True)
class Attr:
    """One attribute of an op: its name, its type (a key of :data:`ATTR_TYPES`)."""

    name: str
    type: str
    doc: str = ""


#: per category: (arity, shape rule, dim rule) unless the entry gives its own
_DEFAULTS: dict[Category, tuple[int | None, ShapeRule | None, DimRule | None]] = {
    Category.UNARY: (1, same_shape, dims_elementwise),
    Category.BINARY: (2, broadcast_shape, dims_elementwise),
    Category.REDUCTION: (1, reduce_shape, dims_reduce),
    Category.CONTRACTION: (2, matmul_shape, dims_matmul),
    Category.REARRANGEMENT: (None, None, None),
    Category.CONSTANT: (0, const_shape, dims_none),
}

_PADDING_WORDS = {"reads": ("any", "zero", "identity"), "zero": ("keeps", "all", "any", "none"),
                  "finite": ("keeps", "if_zero", "never")}

#: "shift": a free shift (max): its value is abstracted as a fresh variable, so a graph is
#: proven equal for every value it could take (docs/design.md §3.3)
LAX_CLASSES = ("linear", "multilinear", "division", "exponentiation", "sqrt", "silu", "shift", "none")


# ---------------------------------------------------------------------------- the entry


@dataclass(frozen=True)
class OpDef:
    """One catalog entry (see the module docstring).

    ``arity`` is the number of tensor inputs (``-1``: one or more); with ``shape_rule``
    and ``dims`` it defaults from the category (a rearrangement gives all three).
    ``reduction`` is set exactly for reductions; ``padding`` defaults from the category
    where one rule fits all (reductions, contractions, rearrangements, constants) and is
    required for element-wise ops. Search traits: ``commutative`` (inputs taken in one
    order), ``constant_factor`` (multiplies by a ``rational`` attribute: it commutes with
    every linear op, so the search places it once, after a reduction), ``squares`` (the
    binary op this unary op applies to one operand twice: the search spells ``mul(x, x)``
    as ``square(x)``). ``joins``: the output is the inputs laid side by side along
    ``dim`` (concat: lowering computes a matmul of two joins as a sum of matmuls).
    ``reorders``: the output is the input with its dims reordered by ``attrs["perm"]``
    (permute: lowering reads it through permuted strides instead of moving elements).
    ``selects``: the output is the window ``start:end:step`` of the input along ``dim``
    (slice: lowering reads it through the input's strides from an offset).
    ``exp_like``: counts as one exponentiation for the Lax path rule.
    ``signs``: the output is the sum of the inputs with these signs (add ``(1, 1)``, sub
    ``(1, -1)``): how a value far below the data passes through it (:mod:`lower.skipping`).
    """

    name: str
    category: Category
    lax: str
    doc: str
    attrs: tuple[Attr, ...] = ()
    arity: int | None = None
    levels: str = "KB"
    shape_rule: ShapeRule | None = None
    dims: DimRule | None = None
    reduction: Reduction | None = None
    padding: Padding | None = None
    exp_like: bool = False
    commutative: bool = False
    constant_factor: bool = False
    squares: str | None = None
    joins: bool = False
    reorders: bool = False
    selects: bool = False
    signs: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        where = f"catalog entry {self.name!r}"
        if not isinstance(self.category, Category):
            raise CatalogError(f"{where}: category {self.category!r} is not a Category")
        arity, rule, dims = _DEFAULTS[self.category]
        for k, v in (("arity", arity), ("shape_rule", rule), ("dims", dims)):
            if getattr(self, k) is None:
                if v is None:
                    raise CatalogError(f"{where}: a {self.category.value} op must give its {k}")
                object.__setattr__(self, k, v)
        object.__setattr__(self, "attrs", tuple(self.attrs))
        if self.padding is None:
            object.__setattr__(self, "padding", self._default_padding(where))
        self._validate(where)

    def _default_padding(self, where: str) -> Padding:
        c = self.category
        if c is Category.REDUCTION:
            return Padding(reads="identity", zero="keeps")
        if c is Category.CONTRACTION:
            return Padding(reads="zero", zero="keeps")
        if c is Category.REARRANGEMENT:
            return Padding(zero="keeps")
        if c is Category.CONSTANT:
            return Padding()
        raise CatalogError(f"{where}: an element-wise op must give its padding rule (does f(0) = 0?)")

    def _validate(self, where: str) -> None:
        if self.lax not in LAX_CLASSES:
            raise CatalogError(f"{where}: Lax class {self.lax!r} is not one of {LAX_CLASSES}")
        if not self.levels or set(self.levels) - {"K", "B"}:
            raise CatalogError(f"{where}: levels {self.levels!r} must be made of 'K' and 'B'")
        for a in self.attrs:
            if not isinstance(a, Attr) or a.type not in ATTR_TYPES:
                raise CatalogError(f"{where}: attribute {a!r} needs a type of {sorted(ATTR_TYPES)}")
        if (self.reduction is not None) != (self.category is Category.REDUCTION):
            raise CatalogError(f"{where}: a reduction trait goes with the reduction category, and only there")
        if self.reduction is not None:
            r = self.reduction
            if COMBINE_IDENTITY.get(r.combine, None) != r.identity:
                raise CatalogError(f"{where}: reduction {r} needs a combine of {sorted(COMBINE_IDENTITY)} and its "
                                   "identity")
            if [a.name for a in self.attrs if a.type == "dim"] != ["dim"]:
                raise CatalogError(f"{where}: a reduction folds the dim named by its attribute 'dim'")
        for k, allowed in _PADDING_WORDS.items():
            if getattr(self.padding, k) not in allowed:
                raise CatalogError(f"{where}: padding {k}={getattr(self.padding, k)!r} is not one of {allowed}")
        if self.constant_factor and [a.type for a in self.attrs] != ["rational"]:
            raise CatalogError(f"{where}: a constant factor carries exactly one rational attribute")
        if self.reorders and (self.category is not Category.REARRANGEMENT or self.attr_names != ("perm",)):
            raise CatalogError(f"{where}: an op that reorders dims is a rearrangement with one attribute 'perm'")
        if self.selects and (self.category is not Category.REARRANGEMENT
                             or self.attr_names != ("dim", "start", "end", "step")):
            raise CatalogError(f"{where}: an op that selects a window is a rearrangement with attributes "
                               "'dim', 'start', 'end', 'step'")
        if self.signs is not None and (self.category is not Category.BINARY or len(self.signs) != 2
                                       or set(self.signs) - {1, -1}):
            raise CatalogError(f"{where}: signs {self.signs!r}: a binary op's two signs, each 1 or -1")
        if self.squares is not None and self.category is not Category.UNARY:
            raise CatalogError(f"{where}: only a unary op can square a binary one")

    # -- derived views
    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    @property
    def elementwise(self) -> bool:
        """Element-wise in the thread-graph sense: unary, binary and constants fuse."""
        return self.category in (Category.UNARY, Category.BINARY, Category.CONSTANT)

    @property
    def pointwise(self) -> bool:
        """An element-wise function of its inputs (unary or binary)."""
        return self.category in (Category.UNARY, Category.BINARY)

    @property
    def broadcasts(self) -> bool:
        """Its inputs broadcast numpy-style against each other (right-aligned)."""
        return self.category in (Category.BINARY, Category.CONTRACTION)

    @property
    def adds_up(self) -> bool:
        """It adds terms up: a contraction, or a reduction whose combine is addition."""
        return self.category is Category.CONTRACTION or (self.reduction is not None and self.reduction.combine == "add")


# ---------------------------------------------------------------------------- the catalog

_DIM = (Attr("dim", "dim", "the dim it acts along"),)

CATALOG: dict[str, OpDef] = {}


def register(d: OpDef) -> OpDef:
    """Add an entry to the catalog (a second entry of the same name is refused)."""
    if not isinstance(d, OpDef):
        raise CatalogError(f"register: expected an OpDef, got {type(d).__name__}")
    if d.name in CATALOG or d.name in STRUCTURAL:
        raise CatalogError(f"register: the catalog already has an op {d.name!r}")
    CATALOG[d.name] = d
    return d


def unregister(name: str) -> None:
    """Remove an entry (tests that register an op of their own take it out again)."""
    CATALOG.pop(name, None)


#: structural kinds of the IR that are not catalog entries (they have no meaning on
#: their own outside a graph): kernel input, graph-defined op, input iterator,
#: accumulator. Output savers are records of a block graph, not ops.
STRUCTURAL = ("input", "graph_defined", "iterator", "accum")

_U, _B, _R = Category.UNARY, Category.BINARY, Category.REDUCTION
_KEEPS = Padding(zero="keeps")

for _d in [
    OpDef("matmul", Category.CONTRACTION, "multilinear", "(…,m,k)@(…,k,n) -> (…,m,n); leading dims broadcast"),
    OpDef("add", _B, "linear", "element-wise a+b; size-1 dims broadcast", commutative=True,
          padding=Padding(zero="all"), signs=(1, 1)),
    OpDef("sub", _B, "linear", "element-wise a-b", padding=Padding(zero="all"), signs=(1, -1)),
    OpDef("mul", _B, "multilinear", "element-wise a*b", commutative=True, padding=Padding(zero="any")),
    OpDef("div", _B, "division", "element-wise a/b", padding=Padding(finite="never")),
    OpDef("exp", _U, "exponentiation", "e**x; at most one per path", exp_like=True,
          padding=Padding(finite="never")),
    OpDef("sqrt", _U, "sqrt", "square root", padding=Padding(zero="keeps", finite="if_zero")),
    OpDef("square", _U, "multilinear", "x*x", squares="mul", padding=_KEEPS),
    OpDef("silu", _U, "silu", "x/(1+e**-x); counts as an exp", exp_like=True, padding=_KEEPS),
    OpDef("scale", _U, "linear", "x*c for a rational constant c", attrs=(Attr("c", "rational", "the factor"),),
          constant_factor=True, padding=_KEEPS),
    OpDef("const", Category.CONSTANT, "linear", "a rational constant filling `shape` (all-ones dims; it broadcasts)",
          attrs=(Attr("value", "rational", "the constant"), Attr("shape", "shape", "its shape"))),
    OpDef("sum", _R, "linear", "sum along dim; dim becomes 1", attrs=_DIM, reduction=Reduction("add", 0.0)),
    # max keeps zero padding zero along the other dims, but the lowering does not rely on it
    OpDef("max", _R, "shift", "max along dim; dim becomes 1 (a free shift: proven for any value, §3.3)", attrs=_DIM,
          reduction=Reduction("max", -math.inf), padding=Padding(reads="identity")),
    OpDef("concat", Category.REARRANGEMENT, "linear", "join along dim", attrs=_DIM, arity=-1,
          shape_rule=concat_shape, dims=dims_concat, joins=True),
    OpDef("reshape", Category.REARRANGEMENT, "linear", "row-major reshape",
          attrs=(Attr("shape", "shape", "the new shape"),), arity=1, shape_rule=reshape_shape, dims=dims_reshape),
    OpDef("repeat", Category.REARRANGEMENT, "linear", "tile each dim reps[d] times",
          attrs=(Attr("reps", "counts", "copies per dim"),), arity=1, shape_rule=repeat_shape, dims=dims_repeat),
    # a permute moves no axis out of itself (its dim map is all "same"): lowering reads
    # it through permuted strides instead of copying (lower/layout.py, lower/emit/rearrange.py)
    OpDef("permute", Category.REARRANGEMENT, "linear", "reorder the dims: output dim o is input dim perm[o]",
          attrs=(Attr("perm", "perm", "the input dim of each output dim"),), arity=1, shape_rule=permute_shape,
          dims=dims_permute, reorders=True),
    # a slice is a view too (the input's strides, from an offset): kernel level only — a
    # torch view between kernels, which the kernels reading it load through; a tile cannot
    # be sliced in registers, and a window of a kernel input read by a kernel is the same
    # view (lower/layout.py, lower/torch_ops.py)
    OpDef("slice", Category.REARRANGEMENT, "linear", "the window start:end:step of dim (a selection: linear)",
          attrs=(Attr("dim", "dim", "the dim it selects along"), Attr("start", "index", "first index"),
                 Attr("end", "index", "one past the last index"), Attr("step", "index", "stride, >= 1")),
          arity=1, levels="K", shape_rule=slice_shape, dims=dims_slice, selects=True),
]:
    register(_d)
del _d


# ---------------------------------------------------------------------------- queries
# They take any op kind (structural kinds included) and answer False/None for kinds
# that are not catalog ops, so a stage can ask about ``op.kind`` directly.


def get_op(name: str) -> OpDef:
    try:
        return CATALOG[name]
    except (KeyError, TypeError):
        raise UnsupportedOpError(f"unknown op {name!r}; the catalog has {sorted(CATALOG)}") from None


def _flag(kind: str, trait: str) -> bool:
    """A boolean trait of ``kind``'s catalog entry (False for names outside the catalog:
    structural kinds such as ``input`` or ``accum``)."""
    d = CATALOG.get(kind)
    return d is not None and getattr(d, trait)


def category(kind: str) -> Category | None:
    d = CATALOG.get(kind)
    return d.category if d is not None else None


def is_pointwise(kind: str) -> bool:
    return _flag(kind, "pointwise")


def is_elementwise(kind: str) -> bool:
    """Unary, binary or a constant: what fuses into a thread graph (:attr:`OpDef.elementwise`)."""
    return _flag(kind, "elementwise")


def is_contraction(kind: str) -> bool:
    return category(kind) is Category.CONTRACTION


def is_rearrangement(kind: str) -> bool:
    return category(kind) is Category.REARRANGEMENT


def reduction(kind: str) -> Reduction | None:
    """The reduction trait of ``kind`` (None: not a reduction)."""
    d = CATALOG.get(kind)
    return d.reduction if d is not None else None


def folds(kind: str) -> bool:
    """It folds a dim away: a reduction or a contraction."""
    return category(kind) in (Category.REDUCTION, Category.CONTRACTION)


def adds_up(kind: str) -> bool:
    return _flag(kind, "adds_up")


def joins(kind: str) -> bool:
    """The output is the inputs laid side by side along ``attrs["dim"]`` (concat)."""
    return _flag(kind, "joins")


def reorders(kind: str) -> bool:
    """The output is the input with its dims reordered by ``attrs["perm"]`` (permute)."""
    return _flag(kind, "reorders")


def selects(kind: str) -> bool:
    """The output is the window ``start:end:step`` of the input along ``dim`` (slice)."""
    return _flag(kind, "selects")


def strided_view(kind: str) -> bool:
    """Lowering keeps the op's result as a torch view of its input and hands the kernels
    that read it the strides derived from the input's (permute, slice): no copy."""
    return reorders(kind) or selects(kind)


def exp_like(kind: str) -> bool:
    return _flag(kind, "exp_like")


def lax_classes(kinds) -> set[str]:
    """The Lax classes of the catalog ops among ``kinds``."""
    return {CATALOG[k].lax for k in kinds if k in CATALOG}


def dim_map(kind: str, shapes: Sequence[Shape], attrs: dict, out: Shape) -> DimMap:
    """:class:`DimMap` of a catalog op on inputs of ``shapes`` with output shape ``out``."""
    return get_op(kind).dims(shapes, attrs, tuple(out))
