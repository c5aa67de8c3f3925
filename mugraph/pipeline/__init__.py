"""The stages composed into the product (DESIGN §1): ``superoptimize`` and the
benchmark table. The only part of ``mugraph`` that imports ``search``,
``verify`` and ``lower`` — lazily, inside functions."""

from .optimize import (DEFAULT_TIME_LIMIT, Candidate, Interrupted, OptimizeConfig, Optimized, cache_key,
                       default_cache_dir, load_result, superoptimize)

__all__ = ["superoptimize", "Optimized", "OptimizeConfig", "Candidate", "cache_key", "default_cache_dir",
           "load_result", "Interrupted", "DEFAULT_TIME_LIMIT"]
