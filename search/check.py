"""Checking complete candidates against the program (docs/design.md §6.6, via ``verify``).

A candidate whose abstract expression is A_eq-equivalent to the program's is
first fingerprinted (one finite-field draw, a few blocks of its output kernels
first: :class:`verify.Fingerprinter`) and, if the fingerprint matches, verified to the configured error bound with ``verify.equivalent``.
``verify`` is the one stage ``search`` may import (the layering of docs/design.md §1.4).
"""

from __future__ import annotations

import logging
import threading

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
        self._preparing: threading.Thread | None = None  # prepare_in_background's thread, until it is joined
        self._stop = threading.Event()  # stop_preparing: the preparation ends before its next draw

    def serves(self, program: KernelGraph, error: float, seed: int) -> bool:
        """Whether this checker gives the verdicts a search of ``program`` with this error
        bound and seed asks for."""
        return self.program is program and self.error == error and self.seed == seed

    @staticmethod
    def on_gpu() -> bool:
        """Whether full verifications run on a CUDA GPU in this process (``verify``'s
        device ``"auto"``)."""
        return verify.field.resolve_device("auto").type == "cuda"

    def warm(self) -> None:
        """Prepare the program's side of every field test and of the float check
        (:meth:`verify.Reference.prepare`), kept for the candidates' verdicts — what the first
        verification would otherwise spend on it. A failure is a warning line at most: the
        first verdict then computes what it needs."""
        self._settle()
        try:
            self._ref().prepare(error=self.error, stop=self._stop.is_set)
        except MugraphError:
            pass
        except Exception as e:  # noqa: BLE001 — a verifier bug must not end the search
            log.warning("mugraph search: preparing the verification of %r failed (%s: %s)", self.program.name,
                        type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")

    def prepare_in_background(self, threads: int) -> None:
        """Run :meth:`warm` on a thread of its own, its torch and BLAS pools at ``threads``
        (:func:`on_threads`); every verdict waits for it first, so the two never evaluate at
        once. Why: a scouted search knows its program's side will be needed once the scout
        ends (the causal 8k-token prompt's first verification on an H200: 33 s of a 47 s
        search), and the scout's own verifications, at small sizes, leave the GPU idle."""
        if self._preparing is None:
            self._preparing = threading.Thread(target=lambda: on_threads(threads, self.warm),
                                               name="mugraph-verify-prepare", daemon=True)
            self._preparing.start()

    def stop_preparing(self) -> None:
        """End a preparation under way before its next draw (what it computed stays kept): the
        caller will not verify after all — Ctrl-C or an error during the scout — and its GPU
        work must not go on behind the caller's back. A later :meth:`warm` prepares again."""
        self._stop.set()
        try:
            self._settle()
        finally:
            self._stop.clear()

    def _settle(self) -> None:
        """Wait for :meth:`prepare_in_background`'s thread (in short waits: Ctrl-C still
        interrupts), unless called on that thread."""
        t = self._preparing
        if t is None or t is threading.current_thread():
            return
        while t.is_alive():
            t.join(0.5)
        self._preparing = None

    def seconds_per_test(self) -> float | None:
        """What one field test's evaluation of the program has cost (its inputs' draw aside:
        the candidates read the same draws), the median so far — the first pays for the
        process's first GPU and compiled-loop work: about what a candidate's costs too. None
        before any."""
        r = self._reference
        times = sorted(r.evaluation_times) if r is not None else []
        return times[len(times) // 2] if times else None

    def _ref(self) -> verify.Reference:
        if self._reference is None:
            self._reference = verify.Reference(self.program, seed=self.seed)
        return self._reference

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
        self._settle()
        try:
            return self._ref().equivalent(graph, error=self.error)
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


def on_threads(threads: int, fn) -> None:
    """``fn()`` with this process's torch, BLAS and OpenMP pools at ``threads`` threads, as
    they were after. The verification warm-up runs while the workers enumerate: at full
    width its pools would take the cores the workers were given (each worker has its share,
    :func:`search.worker.share_cores`); it gets those the workers leave, at least one."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            fn()
    finally:
        torch.set_num_threads(before)
