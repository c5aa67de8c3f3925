"""Checking complete candidates against the program (docs/design.md §6.6, via ``verify``).

A candidate whose abstract expression is A_eq-equivalent to the program's is
first fingerprinted (one finite-field draw, a few blocks of its output kernels
first: :class:`verify.Fingerprinter`) and, if the fingerprint matches, verified to the configured error bound with ``verify.equivalent``.
``verify`` is the one stage ``search`` may import (the layering of docs/design.md §1.4).
"""

from __future__ import annotations

import logging

import verify
from verify import EvaluationStopped  # noqa: F401 - re-exported: a fingerprint cut at its deadline
from mugraph.core.errors import MugraphError
from mugraph.core.ir import KernelGraph

log = logging.getLogger("mugraph")


class Checker:
    """Verdicts on candidates for one program."""

    #: recorded in the search statistics
    method = "verify"

    def __init__(self, program: KernelGraph, error: float = 2.0 ** -40, seed: int = 0) -> None:
        self.program = program
        self.error = error
        self.seed = seed
        self._fingerprinter: verify.Fingerprinter | None = None
        self._reference = None  # verify.Reference: the program's side of every test, shared by the candidates

    @staticmethod
    def on_gpu() -> bool:
        """Whether full verifications run on a CUDA GPU in this process (``verify``'s
        device ``"auto"``)."""
        return verify.field.resolve_device("auto").type == "cuda"

    def warm(self) -> None:
        """Verify the program against itself: draws the residues, evaluates the program
        on them and prepares its float check, all kept for the candidates' verdicts —
        what the first verification would otherwise spend on the program's side."""
        self.verdict(self.program)

    def fingerprinter(self) -> verify.Fingerprinter:
        """The program's fingerprinter, made on first use."""
        if self._fingerprinter is None:
            self._fingerprinter = verify.Fingerprinter(self.program, seed=self.seed)
        return self._fingerprinter

    def prepare_fingerprints(self) -> None:
        """Draw the fingerprint's inputs and evaluate the program on them now — into the
        shared directory when one is set (:mod:`verify.shared_draws`), so the search's
        workers map them instead of each computing its own at its first candidate; on a GPU
        when there is one (the same residues, in a fraction of the time at long shapes)."""
        try:
            self.fingerprinter().target(compute_on="auto")
        except MugraphError:
            pass  # a failed draw (zero divisor): fingerprint_matches decides per candidate

    def fingerprint_matches(self, graph: KernelGraph, stop_at: float | None = None) -> bool:
        """Whether ``graph``'s fingerprint matches the program's. ``stop_at`` (monotonic; None:
        no limit): raises :class:`verify.EvaluationStopped` once past it, mid-evaluation."""
        try:
            return self.fingerprinter().matches(graph, stop_at)
        except MugraphError:
            return True  # a failed draw (zero divisor) decides nothing: let verification decide

    def verdict(self, graph: KernelGraph):
        """``verify.equivalent``'s Verdict (None when the verifier cannot evaluate the graph).
        An unexpected error inside the verifier is one warning line and no verdict for this
        candidate — never shipped, and the search goes on with the others."""
        try:
            if self._reference is None:
                self._reference = verify.Reference(self.program, seed=self.seed)
            return self._reference.equivalent(graph, error=self.error)
        except MugraphError:
            return None
        except Exception as e:  # noqa: BLE001 — a verifier bug must not end the search
            log.warning("mugraph search: the verifier failed on a candidate of %r (%s: %s); not verified",
                        self.program.name, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            return None

    def verified(self, graph: KernelGraph) -> bool:
        v = self.verdict(graph)
        return v is not None and bool(v.equivalent)

    def check(self, graph: KernelGraph) -> tuple[bool, bool]:
        """(fingerprint matched, verified)."""
        if not self.fingerprint_matches(graph):
            return False, False
        return True, self.verified(graph)
