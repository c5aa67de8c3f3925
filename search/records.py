"""The records the search's parts hand each other, and what ``search.run`` returns
per graph — named fields instead of positional tuples and stats entries.

* :class:`TaskDone` — what one root task of the enumeration produced (a worker's
  answer, or a checkpoint's record);
* :class:`Proposal` — a graph derived from other results (composed from pieces,
  fused, split-loop), with how it was made;
* :class:`Match` — a fingerprint-matching candidate waiting for full verification,
  ranked by :attr:`Match.key`;
* :class:`Found` — a verified μGraph the search returns, with how it was found and
  its verdict against the program (so the caller need not verify it again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mugraph.core.ir import KernelGraph


@dataclass(frozen=True)
class TaskDone:
    """One finished root task: its matches (``{"cost", "graph", "sig"}`` each, in DFS
    order), its search counters and its oracle counters (with ``timed_out``)."""

    results: list[dict]
    stats: dict[str, Any]
    oracle: dict[str, Any]

    @property
    def timed_out(self) -> bool:
        return bool(self.oracle.get("timed_out"))


@dataclass(frozen=True)
class Proposal:
    """A derived graph and how it was made: ``composed``, ``composed+fused``, ``split-loop``."""

    graph: KernelGraph
    origin: str


@dataclass(frozen=True)
class Match:
    """A candidate whose fingerprint matched the program's.

    ``cost`` is :func:`search.enumerate.cost_key` (kernels first); ``task`` and
    ``rank`` say where it was found (a derived graph ranks after every task), so
    :attr:`key` orders candidates deterministically."""

    cost: tuple
    task: int
    rank: int
    graph: dict          # μGraph JSON
    signature: str       # kernel signature, e.g. "gd+gd"
    origin: str          # "enumeration" or a Proposal's origin

    @property
    def key(self) -> tuple:
        return (self.cost, self.task, self.rank)

    @property
    def kernels(self) -> int:
        return self.cost[0]


@dataclass(frozen=True)
class Found:
    """A μGraph the search returns: its JSON, how it was found, and its verdict's JSON
    against the program (None when the search ran without verification)."""

    graph: dict
    origin: str
    verdict: Optional[dict] = None

    def to_json(self) -> dict:
        return {"graph": self.graph, "origin": self.origin, "verdict": self.verdict}

    @classmethod
    def from_json(cls, d: dict) -> "Found":
        return cls(d["graph"], d["origin"], d.get("verdict"))
