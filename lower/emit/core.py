"""The op emitter's state: register values, their padding bookkeeping, index helpers.

Every tile lives in registers with power-of-two extents (:mod:`lower.tiles`); a
:class:`Val` is one such register tile: its name in the generated code, its padded
(``pshape``) and real (``rshape``) per-program shape, and whether it is held in fp32.

Padding bookkeeping: each value records the dims along which its padding is known to
be zero (``clean``) and whether its padding is finite (``finite``). Loads give zeros
(masked ``other=0.0``); each op propagates what it can prove, by its padding rule in
the catalog (:class:`mugraph.core.ops.Padding`) — element-wise ops keep a dim clean when
zero maps to zero (``square``, ``silu``, ``scale``, ``sqrt``; ``add`` and ``sub`` of
operands clean along it; ``mul`` by a clean operand when both are finite), ``exp`` and
``div`` make padding non-zero or non-finite; a reduction sets the padding along its
dim to its identity and a dot contraction zeroes it first (:meth:`Emitter.read_padding`).
So the common paths (load → dot, load → square → sum) carry no extra masks, and no
path can leak padding into a real element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from mugraph.core.ir import Op, Tensor
from mugraph.core.ops import get_op, reduction

from ..plan import KernelPlan

TL_DTYPE = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}


@dataclass
class Val:
    """A tile in registers (see the module docstring)."""

    name: str
    pshape: tuple[int, ...]
    rshape: tuple[int, ...]
    f32: bool                     # register dtype is fp32 (else the storage dtype)
    clean: frozenset = frozenset()
    finite: bool = True


def fmt_number(c) -> str:
    """A constant (int, float or ``Fraction``) as a Python float literal."""
    return repr(float(Fraction(c)))


def _literal(x: float) -> str:
    """A padding value as a Triton (Python) float expression (infinities included)."""
    if math.isinf(x):
        return "float('-inf')" if x < 0 else "float('inf')"
    return fmt_number(x)


def describe(op: Op) -> str:
    """A readable description of ``op`` for the comment above its code."""
    args = ", ".join(t.label() for t in op.inputs)
    attrs = {k: v for k, v in op.attrs.items() if k not in ("source",)}
    if op.kind == "iterator":
        return f"iterator(source {op.attrs['source']}, imap={attrs['imap']}, fmap={attrs['fmap']})"
    extra = "".join(f", {k}={v}" for k, v in attrs.items() if k != "dtype")
    return f"{op.kind}({args}{extra})"


def row_major_strides(shape) -> list[int]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return st[::-1]


class Emitter:
    """Emission state for one plan: the values made so far, the lines of every op, the
    ``tl.arange`` extents used. The op categories (:mod:`lower.emit`) write through it."""

    def __init__(self, plan: KernelPlan, sources: list, interpret: bool = False) -> None:
        self.p = plan
        self.b, self.cfg, self.info = plan.block, plan.config, plan.info
        self.src = sources                     # DevArg of each block source
        self.interpret = interpret
        self.dtype = plan.dtype
        self.vals: dict[int, Val] = {}
        self.lines: dict[int, list[str]] = {}   # op id -> lines
        self.cur: list[str] = []
        self.aranges: set[int] = set()
        self.dup_vals: dict[int, Val] = {}     # tensor id -> its second load (for a tl.dot operand)

    # -- writing
    def emit(self, line: str) -> None:
        self.cur.append(line)

    def val(self, t: Tensor, **kw) -> Val:
        """A new value for tile ``t`` at its planned padded and real shapes."""
        v = Val(self.name_of(t), self.info.padded(t), self.info.shape(t), **kw)
        self.vals[t.id] = v
        return v

    @staticmethod
    def name_of(t: Tensor) -> str:
        return t.label() if t.op.kind != "accum" else f"acc_{t.label()}"

    def lines_of(self, ops: list[Op]) -> list[str]:
        out = []
        for op in ops:
            out += self.lines.get(op.id, [])
        return out

    # -- index expressions
    def r(self, p: int) -> str:
        """The ``tl.arange(0, p)`` vector (declared once per kernel)."""
        self.aranges.add(p)
        return f"r{p}"

    @staticmethod
    def ex(expr: str, d: int, rank: int) -> str:
        """``expr`` (a vector) expanded along dim ``d`` of a rank-``rank`` tile."""
        if rank == 1:
            return expr
        return f"{expr}[{', '.join(':' if i == d else 'None' for i in range(rank))}]"

    def terms(self, idx: list[str], strides: list[int], rank: int) -> list[str]:
        return [self.ex(i, d, rank) + ("" if s == 1 else f" * {s}") for d, (i, s) in enumerate(zip(idx, strides))]

    @staticmethod
    def align(expr: str, rank: int, target: int) -> str:
        """``expr`` of rank ``rank`` with leading unit dims up to rank ``target`` (broadcasting)."""
        if rank >= target:
            return expr
        return f"{expr}[{', '.join(['None'] * (target - rank) + [':'] * rank)}]"

    # -- padding
    def mask_dim(self, v: Val, d: int) -> str:
        return self.ex(f"({self.r(v.pshape[d])} < {v.rshape[d]})", d, len(v.pshape))

    @staticmethod
    def padded_dims(v: Val) -> list[int]:
        return [d for d in range(len(v.pshape)) if v.pshape[d] > v.rshape[d]]

    @staticmethod
    def f32(v: Val) -> str:
        return v.name if v.f32 else f"{v.name}.to(tl.float32)"

    def read_padding(self, v: Val, dims, kind: str) -> str:
        """``v`` as op ``kind`` must read it along the dims it folds (``dims``), by the
        op's padding rule (:attr:`mugraph.core.ops.Padding.reads`): zero padding for a
        contraction (and a reduction whose identity is 0), the identity of a reduction's
        combine op, or anything."""
        rule = get_op(kind).padding
        fill = reduction(kind).identity if rule.reads == "identity" else 0.0 if rule.reads == "zero" else None
        if fill == 0:
            return self.clean_only(v, dims)
        src = self.f32(v)
        padded = [d for d in dims if v.pshape[d] > v.rshape[d]]
        if fill is None or not padded:
            return src
        m = " & ".join(self.mask_dim(v, d) for d in padded)
        return f"tl.where({m}, {src}, {_literal(fill)})"

    def clean_only(self, v: Val, dims) -> str:
        """``v`` as an expression whose padding along ``dims`` is zero."""
        need = [d for d in dims if v.pshape[d] > v.rshape[d] and d not in v.clean]
        if not need:
            return self.f32(v) if v.f32 else v.name
        m = " & ".join(self.mask_dim(v, d) for d in need)
        return f"tl.where({m}, {v.name}, 0.0)"
