"""verify: finite-field probabilistic equivalence of programs and μGraphs (docs/design.md §4).

Public API::

    import verify
    v = verify.equivalent(program, ugraph)          # -> Verdict (exact field tests + float check)
    ref = verify.Reference(program, seed=0)         # many candidates: the program's side of each test once
    vs = ref.equivalent_many([g1, g2])              # the verdicts equivalent(program, g, seed=0) would give
    print(v); v.equivalent; v.ok; v.checks; v.error_bound; v.counterexample; v.to_json()
    verify.float_check(program, ugraph)             # -> FloatReport (numerics alone)
    verify.fingerprint(ugraph)                      # -> str, equal for equivalent graphs
    verify.Fingerprinter(program).matches(ugraph)   # fingerprints equal? (many candidates, sampled blocks first)
    verify.verify_files("ref.json", "cand.py")      # the CLI: python -m mugraph verify REF CAND

Modules: :mod:`verify.family` (the random primes: a fresh pair per test),
:mod:`verify.field` (one pair of primes, modular arithmetic, the field algebra),
:mod:`verify.bound` (the per-test error bound and its derivation),
:mod:`verify.equivalence`, :mod:`verify.floatcheck`, :mod:`verify.standalone`,
:mod:`verify.fuzz` (random Lax programs and mutations, reused by the search).
"""

from .equivalence import DEFAULT_ERROR, Fingerprinter, Reference, equivalent, field_test, fingerprint, per_test_bound
from .family import DEFAULT, PrimeFamily
from .field import MIRAGE, EvaluationStopped, Field, FieldAlgebra, FieldError, ZeroDivisorDraw
from .floatcheck import float_check
from .standalone import verify_files
from .verdict import Counterexample, FloatCase, FloatReport, Verdict

__all__ = [
    "equivalent", "Reference", "float_check", "fingerprint", "Fingerprinter", "verify_files", "field_test", "per_test_bound",
    "Verdict", "Counterexample", "FloatReport", "FloatCase",
    "Field", "PrimeFamily", "FieldAlgebra", "DEFAULT", "MIRAGE", "DEFAULT_ERROR", "FieldError", "ZeroDivisorDraw", "EvaluationStopped",
]
