"""The order :func:`lower.profile.tune` times configurations in, learned from what it measured.

The cost model ranks configurations of one kernel by terms it gets roughly right, but some
choices cost far more on the card than it predicts, and which ones depends on the kernel:
decode_h32 with a batch of 8 (one 64-program kernel, a 64-step loop) measured 1.7–4.7 ms
for every configuration that re-chunks its loop — twenty to seventy times their predictions
(47–52 μs) — while the unchunked ones measured 38–81 μs; the model ranked a dozen chunked
ones among the first round's first twenty (H200, 2026-11-26). Timing them all cost a
60 s tuning budget its chance to reach the split-K factors that fill the SMs.

Two mechanisms, both functions of the times measured so far only — so a tuning resumed
with its history (``tune(history=...)``) walks the same path:

* :class:`ErrorModel` — the model's error as one factor per field value (chunk 2, split 8,
  combine "last", a sub-tiling, small-matmul lowering "v", warps, stages, …), fitted by
  ridge regression of log(measured / predicted) on those values after every measurement;
  the first round's remaining picks are timed in the order of their corrected
  predictions. A value never measured keeps the model's own prediction; the ridge keeps
  one measurement from condemning a value outright.
* :func:`layout_steps` — the layouts one step from a config's (split-K or chunk ×2 or ÷2,
  split-K to the next factor the loop offers, the other combine, one sub-tiled class ×2 or
  ÷2, another small-matmul lowering): the tuner climbs through them from the first round's
  winner before it sweeps warps and stages, so a layout the first round did not pick
  (split-K 8 without sub-tiles, where the first round picked split-K 8 only with them) is
  reached when its neighbour wins.
"""

from __future__ import annotations

import math

import numpy as np

from .config import KernelConfig

#: ridge penalty of :class:`ErrorModel` (in log units: one measurement of a value moves its
#: factor by 1 / (1 + RIDGE) of its log error, when it is that value's only evidence)
RIDGE = 1.0


def _features(c: KernelConfig) -> list[tuple[str, object]]:
    """The field values :class:`ErrorModel` gives a factor each."""
    return [("split", c.split), ("combine", c.combine if c.split > 1 else None), ("chunk", c.chunk),
            ("sub", c.sub), ("small_mm", c.small_mm), ("staging", c.stage_all_loads),
            ("loads", c.split_loads), ("warps", c.num_warps), ("stages", c.num_stages)]


class ErrorModel:
    """The cost model's measured error on one kernel, as a product of per-field-value factors.

    ``observe`` each measurement; ``corrected(config, predicted)`` is the prediction times
    the factors of its field values (those measured at least once). Values that so far
    appear only together share the blame (the ridge splits it): on decode attention the
    first configurations measured re-chunked the loop exactly where they also combined
    split-K in a second launch, and both were marked down until a measurement told them
    apart — an order, never a verdict: everything deferred is still timed if the budget
    lasts."""

    def __init__(self, ridge: float = RIDGE) -> None:
        self.ridge = ridge
        self._rows: list[tuple[list[tuple[str, object]], float]] = []
        self._weights: dict[tuple[str, object], float] = {}
        self._mean = 0.0

    def observe(self, config: KernelConfig, predicted: float, measured: float) -> None:
        if not (0 < predicted < math.inf and 0 < measured < math.inf):
            return  # no prediction (or no time) to learn the error of
        self._rows.append((_features(config), math.log(measured / predicted)))
        self._fit()

    def _fit(self) -> None:
        values = sorted({v for feats, _ in self._rows for v in feats}, key=repr)
        col = {v: i for i, v in enumerate(values)}
        x = np.zeros((len(self._rows), len(values)))
        y = np.array([e for _, e in self._rows])
        for i, (feats, _) in enumerate(self._rows):
            x[i, [col[v] for v in feats]] = 1.0
        self._mean = float(y.mean())
        w = np.linalg.solve(x.T @ x + self.ridge * np.eye(len(values)), x.T @ (y - self._mean))
        self._weights = {v: float(w[col[v]]) for v in values}

    def corrected(self, config: KernelConfig, predicted: float) -> float:
        if not self._rows or not math.isfinite(predicted):
            return predicted
        return predicted * math.exp(self._mean + sum(self._weights.get(v, 0.0) for v in _features(config)))


def _ratio_step(a: int, b: int) -> bool:
    return a != b and max(a, b) == 2 * min(a, b)


def _sub_step(a: tuple, b: tuple) -> bool:
    """One sub-tiled class ×2 or ÷2 (an absent class counts as 1), the rest equal."""
    da, db = dict(a), dict(b)
    diff = [k for k in set(da) | set(db) if da.get(k, 1) != db.get(k, 1)]
    return len(diff) == 1 and _ratio_step(da.get(diff[0], 1), db.get(diff[0], 1))


def _adjacent(a: int, b: int, factors: tuple[int, ...]) -> bool:
    """``a`` and ``b`` are neighbours in the sorted ``factors`` (both in it, none between)."""
    return a in factors and b in factors and not any(min(a, b) < f < max(a, b) for f in factors)


def is_layout_step(a: KernelConfig, b: KernelConfig, splits: tuple[int, ...] = ()) -> bool:
    """``b``'s layout is one step from ``a``'s: one of split-K (×2/÷2, or to the next factor
    up or down among ``splits`` — the factors the kernel's loop offers; from or to no split the
    combine comes with it), combine, chunk (×2/÷2), one sub-tiled class (×2/÷2) or the
    small-matmul lowering differs, and nothing else of the layout.

    Why the next factor: a loop of 264 steps splits 2, 3, 4, 6, 8, 11, 12, 22 or 24 ways, and
    Phi-3-mini's decode attention over 8,448 keys in 32-key steps ran 51.5, 43.1, 33.6, 32.4,
    30.6, 41.8 and 44.2 μs at 4, 6, 8, 11, 12, 22 and 24 (H200, from DRAM): one valley, which
    a climb by doubling left at 8 — from 8 it reached only 4 (16 does not divide 264)."""
    def split_step() -> bool:
        if a.split == b.split:
            return True  # the combine alone
        near = _ratio_step(a.split, b.split) or _adjacent(a.split, b.split, splits)
        return near and (a.combine == b.combine or 1 in (a.split, b.split))

    fields = [  # (same in a and b, whether b's value is one step from a's)
        (a.split == b.split and (a.split == 1 or a.combine == b.combine), split_step),
        (a.chunk == b.chunk, lambda: _ratio_step(a.chunk, b.chunk)),
        (a.sub == b.sub, lambda: _sub_step(a.sub, b.sub)),
        (a.small_mm == b.small_mm, lambda: True),  # any other small-matmul lowering
    ]
    differing = [step for same, step in fields if not same]
    return len(differing) == 1 and differing[0]()


def layout_steps(base: KernelConfig, layouts: list[KernelConfig]) -> list[KernelConfig]:
    """The configs of ``layouts`` (the first round's: every layout at 4 warps and 3 stages,
    with each of its staging choices) one step from ``base``'s layout (:func:`is_layout_step`):
    per layout, the one staged as ``base`` is where the layout has that choice."""
    splits = tuple(sorted({c.split for c in layouts} | {base.split}))
    by_layout: dict[tuple, list[KernelConfig]] = {}
    for c in layouts:
        if is_layout_step(base, c, splits):
            by_layout.setdefault((c.split, c.sub, c.chunk, c.combine, c.small_mm), []).append(c)
    return [next((c for c in cs if c.stage_all_loads == base.stage_all_loads), cs[0]) for cs in by_layout.values()]
