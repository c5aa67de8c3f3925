"""Argument checks for the verifier's public entry points: every bad argument is a
one-line :class:`~mugraph.core.errors.ConfigError` naming the function, the argument and
the rule — never a traceback from numpy or torch, never a silent coercion
(``True`` is not an int here, ``"3"`` not a number, a float not a seed)."""

from __future__ import annotations

import math

import numpy as np

from mugraph.core.errors import ConfigError


def integer(where: str, name: str, v, lo: int | None, hi: int | None = None) -> int:
    """``v`` as an int in ``[lo, hi]`` (no bound where None; bools and floats refused)."""
    if (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or (lo is not None and v < lo)
            or (hi is not None and v > hi)):
        rng = "" if lo is None and hi is None else f" >= {lo}" if hi is None else f" in [{lo}, {hi}]"
        raise ConfigError(f"{where}: {name} must be an int{rng}, got {v!r}")
    return int(v)


def number(where: str, name: str, v, *, lo: float, hi: float = math.inf, lo_open: bool = True,
           hi_open: bool = True) -> float:
    """``v`` as a finite real number in the interval (open ends by default)."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v)
          and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi))
    if not ok:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ConfigError(f"{where}: {name} must be a finite number in {left}{lo:g}, {hi:g}{right}, got {v!r}")
    return float(v)


def generator(where: str, rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"{where}: rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
                          f"got {type(rng).__name__}")
    return rng


def int_list(where: str, name: str, v, lo: int | None) -> list[int]:
    """A list (or tuple, set) of ints ``>= lo`` (any int where None)."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise ConfigError(f"{where}: {name} must be a list of ints, got {v!r}")
    return [integer(where, f"every entry of {name}", x, lo) for x in v]
