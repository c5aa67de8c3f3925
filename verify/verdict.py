"""What the verifier answers: a :class:`Verdict`, with its counterexample and float
check, readable as text (``str``) and as JSON (``to_json``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Counterexample:
    """Where two graphs differed in a field test: ``output`` (its position),
    ``index`` (the element), the two residues, which part was compared
    (``"mod p"`` or ``"mod q"``) and the test's primes ``p``, ``q``.
    ``reference_float``/``candidate_float`` give the same element of a float64 run
    on normal random inputs, for a human reader."""

    output: int
    index: tuple[int, ...]
    reference_value: int
    candidate_value: int
    part: str
    test: int
    reference_float: float | None = None
    candidate_float: float | None = None
    p: int | None = None
    q: int | None = None

    def __str__(self) -> str:
        primes = f", p={self.p}, q={self.q}" if self.p is not None else ""
        s = (f"output {self.output} element {list(self.index)} differs in test {self.test} ({self.part}{primes}): "
             f"reference {self.reference_value}, candidate {self.candidate_value}")
        if self.reference_float is not None and self.candidate_float is not None:
            s += (f"; in float64 on random inputs: reference {self.reference_float:.6g}, "
                  f"candidate {self.candidate_float:.6g}")
        return s


@dataclass
class FloatCase:
    """One float-check run: the candidate in ``dtype`` on inputs of magnitude ``scale``.

    Errors are per element, each scaled by that element's own magnitude
    (:mod:`verify.floatcheck`); ``rel_error`` is the worst over every element of
    every output (``output``, ``index``: where), ``errors`` the worst per output,
    ``reference_rel_error`` the reference graph's own worst in the dtype, and
    ``tolerance`` the limit the case was held to."""

    dtype: str
    scale: float
    rel_error: float | None
    reference_rel_error: float | None
    tolerance: float
    passed: bool | None  # None: skipped (the reference itself is not meaningful here)
    note: str = ""
    output: int | None = None
    index: list[int] | None = None
    errors: list[float | None] | None = None

    def __str__(self) -> str:
        if self.passed is None:
            return f"{self.dtype:>8} scale {self.scale:g}: skipped — {self.note}"
        err = "non-finite" if self.rel_error is None else f"{self.rel_error:.2e}"
        where = "" if self.output is None else f" at output {self.output}" + \
            ("" if self.index is None else f" element {self.index}")
        ref = "" if self.reference_rel_error is None else f" (reference graph in {self.dtype}: {self.reference_rel_error:.2e})"
        verdict = "ok" if self.passed else "FAIL"
        extra = f" — {self.note}" if self.note else ""
        return (f"{self.dtype:>8} scale {self.scale:g}: worst element error {err}{where} vs tol "
                f"{self.tolerance:.1e}{ref}: {verdict}{extra}")


@dataclass
class FloatReport:
    """Result of :func:`verify.float_check`: passed when no case failed and at
    least one case ran."""

    cases: list[FloatCase]

    @property
    def passed(self) -> bool:
        ran = [c for c in self.cases if c.passed is not None]
        return bool(ran) and all(c.passed for c in ran)

    def __str__(self) -> str:
        head = "float check: " + ("passed" if self.passed else "FAILED")
        return "\n".join([head] + ["  " + str(c) for c in self.cases])

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "cases": [asdict(c) for c in self.cases]}


#: outcomes of a check that count as passing
PASS = frozenset({"passed", "met"})


@dataclass
class Verdict:
    """The answer of :func:`verify.equivalent`.

    ``equivalent``: True when every field test passed, False when one found a
    counterexample (exact arithmetic: a mismatch proves the graphs differ; through
    ``sqrt`` the float64 fallback must confirm it — see ``notes``), None when
    undecided (a float-only comparison of non-Lax graphs, a field mismatch through
    ``sqrt`` that float64 does not confirm, or a constant with no meaning under
    fixed primes). ``error_bound`` is the probability bound that a non-equivalent
    pair passes all ``tests`` (``per_test_bound ** tests``, or with ``voids_counted``
    the bound that pays for ``failed_draws``); ``bound_met`` says
    whether it reached ``target_error``. ``primes`` says how the primes were drawn
    (a fresh random pair per test, or fixed); ``pairs`` is the number of equally
    likely pairs a test drew from, ``constant_bits`` the largest coefficient height
    (bits) of the compared functions and ``constant_term`` what constants sharing
    a factor with a drawn prime add to the per-test bound (:mod:`verify.bound`).
    ``conjecture``: the bound relies on the Li–Wu conjecture (exp); ``heuristic``:
    on the sqrt heuristic. ``float_check`` is the numerical check of the
    candidate (None when not run).

    ``checks`` records every check that ran and its outcome (``"passed"``,
    ``"failed"``, ``"met"``, ``"not met"``, ``"undecided"``, …); ``failed_checks``
    lists those that did not pass, and ``ok`` is True only when the graphs are
    equivalent and every check passed — what the command line's exit status says.
    """

    reference: str
    candidate: str
    equivalent: bool | None
    method: str = "field"
    tests: int = 0
    failed_draws: int = 0
    per_test_bound: float = 1.0
    error_bound: float = 1.0
    target_error: float = 2.0 ** -40
    bound_met: bool = False
    conjecture: bool = False
    heuristic: bool = False
    #: how the per-test bound was argued: "polynomial" (no exp), "exponent atoms"
    #: (Schwartz–Zippel in independent roots of unity) or "Li–Wu conjecture"
    argument: str = ""
    #: the draws that met a zero divisor were counted against the bound (design §4.5)
    #: rather than conditioned on: ``error_bound`` is then ``verify.bound.counted_bound``
    voids_counted: bool = False
    p: int | None = None
    q: int | None = None
    seed: int | None = None
    counterexample: Counterexample | None = None
    float_check: FloatReport | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    primes: str = ""
    pairs: float = 1.0
    constant_bits: float = 0.0
    constant_term: float = 0.0
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def failed_checks(self) -> list[str]:
        """Names of the checks that ran and did not pass."""
        return [k for k, v in self.checks.items() if v not in PASS]

    @property
    def ok(self) -> bool:
        return self.equivalent is True and not self.failed_checks and \
            (self.float_check is None or self.float_check.passed)

    def __str__(self) -> str:
        name = f"{self.reference} vs {self.candidate}"
        if self.method == "float-only":
            head = f"{name}: EQUIVALENCE UNPROVEN (float-only comparison)"
        elif self.equivalent is None:
            head = f"{name}: UNDECIDED"
        elif self.equivalent:
            head = f"{name}: EQUIVALENT"
            if not self.bound_met:
                head += " (all tests passed, but the error bound was not reached)"
            if self.failed_checks:
                head += " — but not ok: " + ", ".join(self.failed_checks) + " did not pass"
        else:
            head = f"{name}: NOT EQUIVALENT"
        lines = [head]
        if self.method == "field":
            lines.append(f"  field tests: {self.tests} passed" if self.equivalent else
                         f"  field tests: stopped at test {self.tests}")
            if self.primes:
                lines.append(f"  primes: {self.primes}")
            lines.append(f"  last pair: p={self.p}, q={self.q}; seed {self.seed}; failed draws {self.failed_draws}")
            if self.equivalent:
                lines.append(f"  false-accept bound: {_p2(self.error_bound)} (per test {_p2(self.per_test_bound)}; "
                             f"target {_p2(self.target_error)})"
                             + (" — relies on the Li–Wu conjecture" if self.conjecture else "")
                             + (" — by exponent atoms" if self.argument == "exponent atoms" else "")
                             + (" — heuristic (sqrt)" if self.heuristic else "")
                             + (f" — {self.failed_draws} void draws counted" if self.voids_counted else ""))
                lines.append(f"  constants: coefficients of up to {self.constant_bits:.0f} bits; a drawn prime "
                             f"dividing one adds {_p2(self.constant_term)} per test (of {self.pairs:,.0f} pairs)")
        if self.counterexample is not None:
            lines.append(f"  counterexample: {self.counterexample}")
        if self.float_check is not None:
            lines.extend("  " + s for s in str(self.float_check).splitlines())
        if self.checks:
            lines.append("  checks: " + ", ".join(f"{k} {v if v in PASS else v.upper()}"
                                                  for k, v in self.checks.items()))
        for n in self.notes:
            lines.append(f"  note: {n}")
        lines.append(f"  time: {self.seconds:.2f} s")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict (``json.dumps(v.to_json())``); :meth:`from_json`
        reads it back."""
        d = asdict(self)
        d["ok"] = self.ok
        d["failed_checks"] = self.failed_checks
        d["float_check"] = None if self.float_check is None else self.float_check.to_json()
        if self.counterexample is not None:
            d["counterexample"]["index"] = list(self.counterexample.index)
        for k in ("per_test_bound", "error_bound", "target_error", "pairs", "constant_bits", "constant_term"):
            d[k] = float(d[k])
        return d

    def dumps(self, **kw) -> str:
        return json.dumps(self.to_json(), **kw)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Verdict":
        d = dict(d)
        d.pop("ok", None)
        d.pop("failed_checks", None)
        if d.get("counterexample") is not None:
            ce = dict(d["counterexample"])
            ce["index"] = tuple(ce["index"])
            d["counterexample"] = Counterexample(**ce)
        if d.get("float_check") is not None:
            d["float_check"] = FloatReport([FloatCase(**c) for c in d["float_check"]["cases"]])
        return cls(**d)


def _p2(x: float) -> str:
    """A probability as ``2^-k`` (and its decimal)."""
    if x <= 0:
        return "0"
    if x >= 1:
        return "1 (no bound)"
    return f"2^{math.log2(x):.1f} ({x:.2e})"
