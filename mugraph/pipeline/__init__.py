"""The product (docs/design.md §8.1): the stages composed into ``superoptimize``, its
results and their cache, and the benchmark table. The top layer: it imports the
IR core and the stages ``search``, ``verify`` and ``lower``; nothing imports it
but the CLI and the lazy names of the ``mugraph`` package."""

from .cache import default_cache_dir
from .optimize import DEFAULT_TIME_LIMIT, Interrupted, OptimizeConfig, cache_key, superoptimize
from .results import Candidate, Optimized, load, load_result, save

__all__ = ["superoptimize", "Optimized", "OptimizeConfig", "Candidate", "cache_key", "default_cache_dir",
           "load_result", "Interrupted", "DEFAULT_TIME_LIMIT", "save", "load"]
