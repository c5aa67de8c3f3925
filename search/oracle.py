"""The subexpression oracle: is ``E ⊑ E(program output)``? (docs/design.md §5.3).

Decision procedure, in order:

1. answer cached for this term (cache keyed by term id; the id's canonical text
   is the cross-process key, see :func:`search.expr.text`);
2. look the term up, without inserting it, in the saturated e-graph of the
   targets: found in a class reachable from a root ⇒ *keep* (exact: e-graph
   equalities are A_eq consequences);
3. not found (or found unreachable) and the e-graph saturated ⇒ *prune* (exact);
4. the budget stopped saturation ⇒ ask Z3 to prove the keep; prune only if it
   cannot, and count that prune as *doubtful* in the statistics.

``cat`` terms (concatenations, see :mod:`search.expr`) are kept when every part
is; ``top`` (an expression we cannot describe) is kept — never prune on doubt.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from . import expr as ex
from .egraph import SaturatedEGraph
from .z3check import Z3Prover


@dataclass
class OracleStats:
    queries: int = 0
    cache_hits: int = 0
    keeps: int = 0
    prunes: int = 0
    doubtful_prunes: int = 0
    z3_calls: int = 0
    z3_proofs: int = 0
    seconds: float = 0.0
    saturation_seconds: float = 0.0
    egraph_nodes: int = 0
    saturated: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


class SubexprOracle:
    """Decides ``E ⊑ target`` for the output expressions of one program.

    ``enabled=False`` turns pruning off (every query answers *keep*) for ablations;
    equivalence checks (:meth:`equivalent`) still work.
    """

    def __init__(self, targets: list[ex.Term], *, max_nodes: int = 2_000_000, time_limit: float = 60.0,
                 z3_timeout_ms: int = 200, distribute: str = "factor", enabled: bool = True,
                 egraph: SaturatedEGraph | None = None) -> None:
        self.targets = list(targets)
        # an output E with a top part (a reshape of a concat, …) is unknown: anything may be
        # a subexpression of it, so nothing can be pruned against the targets
        self.opaque = any(ex.node(p)[0] == ex.TOP_KIND for t in self.targets for p in ex.leaves(t))
        self.enabled = enabled and not self.opaque
        self.stats = OracleStats()
        #: ``egraph``: one already saturated for these targets (a search worker gets the driver's)
        self.egraph = egraph or SaturatedEGraph(self.targets, max_nodes=max_nodes, time_limit=time_limit,
                                                distribute=distribute)
        self.stats.saturation_seconds = self.egraph.stats.seconds
        self.stats.egraph_nodes = self.egraph.stats.nodes
        self.stats.saturated = self.egraph.saturated
        self._z3: Z3Prover | None = None
        self._z3_timeout = z3_timeout_ms
        self._cache: dict[int, bool] = {}

    @property
    def saturated(self) -> bool:
        return self.egraph.saturated

    @property
    def z3(self) -> Z3Prover:
        if self._z3 is None:
            self._z3 = Z3Prover(self._z3_timeout)
        return self._z3

    # ------------------------------------------------------------------ queries
    def is_sub(self, t: ex.Term) -> bool:
        """Keep (True) or prune (False) a tensor whose abstract expression is ``t``."""
        if not self.enabled:
            return True
        st = self.stats
        st.queries += 1
        hit = self._cache.get(t)
        if hit is not None:
            st.cache_hits += 1
            return hit
        t0 = time.perf_counter()
        r = self._decide(t)
        st.seconds += time.perf_counter() - t0
        self._cache[t] = r
        if r:
            st.keeps += 1
        else:
            st.prunes += 1
        return r

    def _decide(self, t: ex.Term) -> bool:
        kind = ex.node(t)[0]
        if kind == "top":
            return True
        if kind == "cat":
            return all(self._decide(p) for p in ex.leaves(t))
        c = self.egraph.lookup(t)
        if c is not None and c in self.egraph.reachable:
            return True
        if self.egraph.saturated:
            return False
        return self._z3_keep(t)

    def _z3_keep(self, t: ex.Term) -> bool:
        st = self.stats
        for root in (p for t in self.targets for p in ex.leaves(t)):
            st.z3_calls += 1
            if self.z3.proves_sub(t, root):
                st.z3_proofs += 1
                return True
        st.doubtful_prunes += 1
        return False

    def egraph_answer(self, t: ex.Term) -> bool:
        """The e-graph's own answer (no Z3, no cache): used by the agreement test."""
        c = self.egraph.lookup(t)
        return c is not None and c in self.egraph.reachable

    def equivalent(self, t: ex.Term, output: int = 0) -> bool | None:
        """Is ``t`` A_eq-equivalent to target ``output``? None when undecided (budget hit,
        or a target that is a concatenation or unknown: no single e-class to compare with)."""
        if self.egraph.roots[output] is None:
            return None
        c = self.egraph.lookup(t)
        if c is not None:
            return c == self.egraph.roots[output]
        return False if self.egraph.saturated else None
