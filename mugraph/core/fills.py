"""Position-dependent constants: inputs whose values a kernel computes from the element's
position instead of reading them from memory.

A causal attention adds a bias that is 0 where query ``i`` sees key ``j`` and very
negative elsewhere. As data that bias is a ``q × kv`` tensor every attention kernel reads
once per head: at 1k × 1k, d 64 the read made a prompt attention 2.3× slower than the
same kernel without it. The values depend on ``(i, j)`` only, so a kernel can make them
in registers from the indices it already has.

A program says so by giving an input a *fill* (``p.input("bias", (q, kv), fill=
mg.causal_mask())``). Everything above the lowering treats that input as an input like
any other: the search tiles it, the field test draws it at random and the float check
draws it like data, so a verdict holds for *every* value of it — in particular for the
fill's. Only three places read the fill itself: the interpreter and the runtime (which
make the tensor when the caller does not pass it) and the lowering (which generates a
tile instead of loading it; see ``lower.emit.loads``).

The catalog has one fill, a band of visible keys; causal masks, offset causal masks
(a query block at the end of a longer key sequence) and sliding windows are all bands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidGraphError

#: the value a masked position gets, per dtype: the dtype's lowest finite value, so the sum
#: with a score stays finite (no ``-inf - -inf = NaN`` in a max-subtracted row) and its
#: exponential is 0 once the row's max is a visible score
MASKED_VALUE: dict[str, float] = {
    "float16": float(np.finfo(np.float16).min),
    "bfloat16": -3.3895313892515355e38,
    "float32": float(np.finfo(np.float32).min),
}


@dataclass(frozen=True)
class BandMask:
    """An additive attention mask over the last two dims (rows ``i``, columns ``j``): 0
    where ``j − i ≤ offset`` (and, with a ``window``, ``j − i > offset − window``), the
    dtype's lowest finite value elsewhere; leading dims repeat it.

    ``offset=0``: SDPA's ``is_causal`` (key ``j`` is visible to query ``i`` when
    ``j ≤ i``). ``offset=kv − q``: the same for ``q`` queries that are the last of ``kv``
    positions. ``window=w``: each query sees its ``w`` latest keys (a sliding window).
    ``period=q``: row ``r`` is query ``r mod q`` — the grouped-query layout, where the
    query heads sharing a KV head are stacked as rows."""

    offset: int = 0
    window: int | None = None
    period: int | None = None

    kind = "band_mask"

    def check(self, shape: tuple[int, ...], what: str) -> None:
        """A one-line error when ``shape`` cannot hold this fill."""
        if len(shape) < 2:
            raise InvalidGraphError(f"{what}: a band mask fills a tensor of at least 2 dims (rows, keys), "
                                    f"got shape {shape}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int):
            raise InvalidGraphError(f"{what}: a band mask's offset must be an int, got {self.offset!r}")
        for k in ("window", "period"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidGraphError(f"{what}: a band mask's {k} must be a positive int or None, got {v!r}")

    def values(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """The filled tensor (float64, values exactly representable in ``dtype``)."""
        i = np.arange(shape[-2])[:, None]
        if self.period is not None:
            i = i % self.period
        j = np.arange(shape[-1])[None, :]
        d = j - i
        visible = d <= self.offset
        if self.window is not None:
            visible &= d > self.offset - self.window
        band = np.where(visible, 0.0, MASKED_VALUE[dtype])
        return np.broadcast_to(band, shape).copy()

    def triton(self, rows: str, cols: str, dtype: str) -> str:
        """The Triton expression of the tile at row indices ``rows`` and column indices
        ``cols`` (expressions already shaped to broadcast against each other)."""
        if self.period is not None:
            rows = f"({rows}) % {self.period}"
        d = f"({cols}) - ({rows})"
        cond = f"({d} <= {self.offset})"
        if self.window is not None:
            cond = f"{cond} & ({d} > {self.offset - self.window})"
        return f"tl.where({cond}, 0.0, {MASKED_VALUE[dtype]!r})"

    def every_row_sees(self, rows: int, keys: int) -> bool:
        """Whether each of ``rows`` rows has a visible key among ``keys``: the first query
        sees key 0 or later, the last one's window starts before the end."""
        last = min(rows, self.period or rows) - 1
        if self.offset < 0:
            return False
        return self.window is None or last + self.offset - self.window + 1 <= keys - 1

    def step_bounds(self, row0: str, rows: int, key0: str, width: int, keys: int) -> tuple[str, str]:
        """The loop steps that see a visible position, as Triton expressions ``(first,
        end)``: a program holds rows ``row0 … row0 + rows − 1``, and step ``i`` keys
        ``key0 + i·width`` … ``+ keys − 1`` (``row0`` and ``key0`` non-negative). Step
        ``i`` sees one iff the keys minus the queries, an interval, meets the band's
        ``(offset − window, offset]``; with a ``period`` the queries are bounded by the
        rows' span modulo it. The same expressions evaluate on Python ints
        (:func:`eval_bounds`)."""
        if self.period is None:
            q_lo, q_hi = f"({row0})", f"({row0} + {rows - 1})"
        else:
            p = self.period
            wraps = f"(({row0}) // {p} != ({row0} + {rows - 1}) // {p})"
            q_lo = f"tl.where({wraps}, 0, ({row0}) % {p})"
            q_hi = f"tl.where({wraps}, {p - 1}, ({row0} + {rows - 1}) % {p})"
        # the last step: its first key minus the highest query is at most the offset
        less_key0 = "" if key0 == "0" else f" - ({key0})"
        end = f"tl.maximum({self.offset + width} + {q_hi}{less_key0}, 0) // {width}"
        if self.window is None:
            return "0", end
        # the first step: its last key minus the lowest query is above offset − window
        first = f"tl.maximum({self.offset - self.window - keys + 1 + width} + {q_lo}{less_key0}, 0) // {width}"
        return first, end

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "offset": self.offset, "window": self.window, "period": self.period}

    def __str__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)}" for k in ("window", "period") if getattr(self, k) is not None)
        return f"band_mask(offset={self.offset}{extra})"


def eval_bounds(expr: str, env: dict[str, Any]) -> Any:
    """The value of a :meth:`BandMask.step_bounds` expression at the indices ``env``, with
    numpy standing in for ``tl``: an int for int indices, an array for index arrays (every
    program's bounds at once, the cost model's count of the steps programs run)."""
    value = eval(expr, {"__builtins__": {}, "tl": np}, dict(env))
    return int(value) if np.ndim(value) == 0 else value


#: every fill, by its JSON ``kind``
FILLS = {BandMask.kind: BandMask}


def causal_mask(offset: int = 0, window: int | None = None, period: int | None = None) -> BandMask:
    """The additive mask of a causal attention (see :class:`BandMask`): give it to an
    input as ``fill=`` and the kernels make it from positions instead of reading it."""
    m = BandMask(offset, window, period)
    m.check((1, 1), "causal_mask")
    return m


def fill_from_json(d: Any, where: str) -> BandMask:
    """The fill a JSON document describes; a one-line error naming ``where`` otherwise."""
    if not isinstance(d, dict) or d.get("kind") not in FILLS:
        raise InvalidGraphError(f"{where}: a fill is an object with kind one of {sorted(FILLS)}, got {d!r}")
    try:
        return causal_mask(d.get("offset", 0), d.get("window"), d.get("period"))
    except InvalidGraphError as e:
        raise InvalidGraphError(f"{where}: {e}") from None
