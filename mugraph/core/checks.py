"""Argument checks shared by the IR and the builder: every value a user hands
to mugraph (a shape, a dim, a constant, a name, a dtype) is checked here and
refused with a one-line :mod:`mugraph.core.errors` exception naming it — never
truncated, converted or passed on to fail deep inside a stage.

They sit below both :mod:`mugraph.core.ir` and :mod:`mugraph.core.builder` (the tensor's
Python operators come from the builder), so neither imports the other for them.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any, Sequence

from .errors import ArgumentTypeError, ConstantError, DTypeError, InvalidGraphError, ShapeError
from .limits import MAX_CONSTANT_DIGITS, MAX_DIM, MAX_NAME_CHARS, MAX_NUMEL
from .ops import MAX_RANK

DTYPES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}
"""Supported dtypes and their sizes in bytes."""


def short(value: Any, n: int = 60) -> str:
    """``repr(value)`` cut to ``n`` characters: messages quote what the user passed
    without printing a million-element list."""
    r = repr(value)
    return r if len(r) <= n else r[:n - 3] + "..."


def check_dtype(dtype: str, what: str) -> str:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise DTypeError(f"{what}: unknown dtype {short(dtype)}; use one of {sorted(DTYPES)}")
    return dtype


def strict_int(v: Any, what: str) -> int:
    """``v`` as an int if it is one (a Python or numpy integer; never a bool, a float
    or a string: ``2.7``, ``True`` and ``'8'`` are refused, not converted)."""
    if type(v) is int:
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ArgumentTypeError(f"{what}: {short(v)} is a {type(v).__name__}, not an int")
    return int(v)


def _is_sequence(v: Any) -> bool:
    return type(v) in (tuple, list) or (isinstance(v, Sequence) and not isinstance(v, (str, bytes)))


def check_shape(shape, what: str) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, or a :class:`ShapeError` naming the rule: a
    sequence of 1 to ``MAX_RANK`` ints (a float dim or a string is refused, never
    truncated), each in [1, ``MAX_DIM``], at most ``MAX_NUMEL`` elements in all."""
    if not _is_sequence(shape):
        raise ShapeError(f"{what}: shape {short(shape)} is not a sequence of ints")
    if not 1 <= len(shape) <= MAX_RANK:
        raise ShapeError(f"{what}: shape {short(tuple(shape))} has {len(shape)} dims; tensors have 1 to {MAX_RANK}")
    dims = []
    for i, s in enumerate(shape):
        if type(s) is not int and (isinstance(s, bool) or not isinstance(s, numbers.Integral)):
            raise ShapeError(f"{what}: shape {short(tuple(shape))}: dim {i} is {short(s)} "
                             f"({type(s).__name__}), not an int")
        dims.append(int(s))
    shape = tuple(dims)
    if any(s < 1 for s in shape):
        raise ShapeError(f"{what}: shape {shape} has a dim < 1")
    if any(s > MAX_DIM for s in shape):
        raise ShapeError(f"{what}: shape {shape} has a dim > {MAX_DIM} (mugraph.core.limits.MAX_DIM)")
    if math.prod(shape) > MAX_NUMEL:
        raise ShapeError(f"{what}: shape {shape} has {math.prod(shape)} elements > {MAX_NUMEL} "
                         "(mugraph.core.limits.MAX_NUMEL: 32-bit element offsets)")
    return shape


def rational(c: Any, what: str) -> Fraction:
    """A scalar constant as an exact rational: an int, a Fraction, or a finite float
    (by its shortest decimal form, so ``0.1`` is 1/10). Bools, complex numbers, NaN,
    infinities and constants of more than ``MAX_CONSTANT_DIGITS`` digits are refused:
    every stage computes with the constant exactly (the verifier in a finite field)."""
    if isinstance(c, bool) or isinstance(c, complex) or (
            not isinstance(c, (numbers.Rational, float)) and not _is_real_numpy(c)):
        raise ConstantError(f"{what}: {short(c)} ({type(c).__name__}) is not a real scalar constant")
    if isinstance(c, numbers.Rational):  # numpy integers too: made Python ints
        f = Fraction(int(c.numerator), int(c.denominator))
    else:
        c = float(c)
        if not math.isfinite(c):
            raise ConstantError(f"{what}: constant {c} is not finite")
        f = Fraction(repr(c))
    for part, n in (("numerator", abs(f.numerator)), ("denominator", f.denominator)):
        bits = n.bit_length()  # str() of a huge int is slow: count its digits from its bits when far over
        digits = len(str(n)) if bits <= 4 * MAX_CONSTANT_DIGITS else int(bits * math.log10(2)) + 1
        if digits > MAX_CONSTANT_DIGITS:
            raise ConstantError(f"{what}: the constant's {part} has {digits} digits > {MAX_CONSTANT_DIGITS} "
                                "(mugraph.core.limits.MAX_CONSTANT_DIGITS)")
    return f


def _is_real_numpy(c: Any) -> bool:
    """A numpy real scalar (``np.float32(0.5)``), found without importing numpy."""
    return type(c).__module__ == "numpy" and isinstance(c, numbers.Real)


def check_name(name: Any, what: str) -> str:
    """A graph name: a string of 1 to ``MAX_NAME_CHARS`` printable characters (it
    appears in messages, pictures and, made safe, in cache file names)."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{what}: the name must be a str, got {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise InvalidGraphError(f"{what}: name {short(name)} must be 1 to {MAX_NAME_CHARS} printable characters")
    return name
