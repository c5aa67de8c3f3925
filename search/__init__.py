"""search: the μGraph generator with abstract-expression pruning (docs/design.md §5, §6).

    import search
    res = search.run(program, search.SearchConfig(max_block_ops=9, workers=2))
    res.graphs        # verified μGraphs (mugraph.KernelGraph), res.stats
    # executor="processes" (default) | "serial" | "ray" (ray_address=...); time_limit=300 s by default

Modules: ``expr`` (abstract expressions), ``egraph`` + ``z3check`` + ``oracle``
(the subexpression oracle), ``labels`` (index classes), ``mappings`` (grid/loop/
imap/fmap/omap candidates), ``enumerate`` (canonical DFS), ``check`` (fingerprint
and verification), ``driver`` (schedule, deadlines, retries, merge), ``executors``
(serial / local processes / Ray), ``worker`` (what a worker runs), ``checkpoint``.
"""

from .config import SearchConfig
from .checkpoint import CheckpointError
from .driver import SearchResult, prepared_checker, run
from .executors import WorkerError
from .expr import abstract_expr
from .oracle import SubexprOracle

__all__ = ["run", "prepared_checker", "SearchConfig", "SearchResult", "abstract_expr", "SubexprOracle", "CheckpointError",
           "WorkerError"]
