"""Checking complete candidates against the program (DESIGN §4, via ``verify``).

A candidate whose abstract expression is A_eq-equivalent to the program's is
first fingerprinted (one finite-field draw, cheap) and, if the fingerprint
matches, verified to the configured error bound with ``verify.equivalent``.
``verify`` is a hard dependency of ``search`` (DESIGN's one allowed stage
import); the float64 comparison below is only used if it cannot be imported
(a broken install), and ``Checker.method`` records which check ran.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import mugraph as mg
from mugraph.ir import KernelGraph


class Checker:
    """Verdicts on candidates for one program."""

    def __init__(self, program: KernelGraph, error: float = 2.0 ** -40, seed: int = 0) -> None:
        self.program = program
        self.error = error
        self.seed = seed
        try:
            import verify  # noqa: PLC0415
        except ImportError:  # pragma: no cover
            verify = None
        self._verify: Any = verify if verify is not None and hasattr(verify, "equivalent") else None
        self._fp = getattr(self._verify, "fingerprint", None) if self._verify is not None else None
        self.method = "verify" if self._verify is not None else "float64-fallback"
        self._target_fp = None
        self._draws: list[tuple[dict, list]] | None = None

    def fingerprint_matches(self, graph: KernelGraph) -> bool:
        if self._fp is not None:
            try:
                if self._target_fp is None:
                    self._target_fp = self._fp(self.program, seed=self.seed)
                return self._fp(graph, seed=self.seed) == self._target_fp
            except mg.MugraphError:
                return True  # a failed draw (zero divisor) decides nothing: let verification decide
        return self._float_check(graph, draws=1)

    def verified(self, graph: KernelGraph) -> bool:
        if self._verify is not None:
            try:
                v = self._verify.equivalent(self.program, graph, error=self.error, seed=self.seed)
            except mg.MugraphError:
                return False
            return bool(v.equivalent)
        return self._float_check(graph, draws=2)

    def check(self, graph: KernelGraph) -> tuple[bool, bool]:
        """(fingerprint matched, verified)."""
        if not self.fingerprint_matches(graph):
            return False, False
        return True, self.verified(graph)

    # -- fallback without the verify package
    def _float_check(self, graph: KernelGraph, draws: int) -> bool:
        if self._draws is None:
            self._draws = []
            for k in range(2):
                rng = np.random.default_rng(self.seed * 1000 + k + 1)
                ins = {t.name: rng.uniform(0.25, 1.25, t.shape) for t in self.program.inputs}
                self._draws.append((ins, mg.evaluate(self.program, ins)))
        for ins, ref in self._draws[:draws]:
            try:
                out = mg.evaluate(graph, ins)
            except mg.MugraphError:
                return False
            for a, b in zip(out, ref):
                if a.shape != b.shape:
                    return False
                scale = max(float(np.max(np.abs(b))), 1e-300)
                if not np.all(np.isfinite(a)) or float(np.max(np.abs(a - b))) > 1e-9 * scale:
                    return False
        return True
