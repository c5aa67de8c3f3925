"""mugraph: a multi-level superoptimizer for tensor programs (the Mirage approach).

Build a Lax program, write or search μGraphs, evaluate them, save and draw them::

    import mugraph as mg
    p = mg.Program("gated_mlp")
    X = p.input("X", (8, 4096)); W1 = p.input("W1", (4096, 4096)); W2 = p.input("W2", (4096, 4096))
    p.output(mg.silu(X @ W1) * (X @ W2))
    mg.check_lax(p)
    (Y,) = mg.evaluate(p, {"X": x, "W1": w1, "W2": w2})

Importing ``mugraph`` imports the IR core only. The product's names —
``superoptimize``, ``Optimized``, ``OptimizeConfig``, ``Candidate`` and ``save`` /
``load`` (which also handle ``superoptimize`` results) — are served lazily from
:mod:`mugraph.pipeline` on first use, and ``from_torch`` (capture PyTorch code into
Lax pieces) from :mod:`mugraph.frontend`, because the product imports the stages
``search``, ``verify`` and ``lower``, which import the core.
"""

from . import errors, limits
from .algebra import Algebra, FloatAlgebra
from .builder import (add, concat, constant, div, exp, matmul, max, mean, mul, permute, repeat, reshape,
                      rms_norm, scale, silu, slice, sqrt, square, sub, sum, transpose)
from .errors import (ArgumentTypeError, CacheError, ConfigError, ConstantError, DTypeError, InputError, InvalidGraphError,
                     MugraphError, NotLaxError, ResourceError, SerializationError, ShapeError, UnsupportedOpError)
from .interpreter import evaluate
from .ir import DTYPES, BlockGraph, KernelGraph, Program, Tensor, ThreadGraph, build_thread_graphs
from .lax import check_lax, is_lax
from .ops import CATALOG
from .render import render, to_dot
from .version import __version__  # noqa: F401 - the package version

#: the product's public names, imported from :mod:`mugraph.pipeline` when first used
_PRODUCT = ("superoptimize", "Optimized", "OptimizeConfig", "Candidate", "save", "load")
#: the PyTorch front door's public names, imported from :mod:`mugraph.frontend` when first used
_FRONTEND = ("from_torch",)


def __getattr__(name: str):
    if name in _PRODUCT or name == "pipeline":
        import mugraph.pipeline as pipeline  # the core's one import of the product: lazy, so the core stays below it

        value = pipeline if name == "pipeline" else getattr(pipeline, name)
        globals()[name] = value
        return value
    if name in _FRONTEND:
        import mugraph.frontend as frontend  # product layer (imports torch's tracer): lazy like the pipeline

        value = getattr(frontend, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mugraph' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PRODUCT) | set(_FRONTEND))

__all__ = [
    "Program", "KernelGraph", "BlockGraph", "Tensor", "ThreadGraph", "build_thread_graphs", "DTYPES", "CATALOG",
    "matmul", "add", "sub", "mul", "div", "exp", "sqrt", "square", "silu", "sum", "max", "mean", "rms_norm",
    "concat", "reshape", "repeat", "permute", "transpose", "slice", "scale", "constant",
    "check_lax", "is_lax", "evaluate", "Algebra", "FloatAlgebra", "save", "load", "render", "to_dot", "errors",
    "limits", "MugraphError", "ShapeError", "DTypeError", "NotLaxError", "InvalidGraphError", "ResourceError",
    "UnsupportedOpError", "SerializationError", "InputError", "ConfigError", "CacheError", "ArgumentTypeError",
    "ConstantError",
    "superoptimize", "Optimized", "OptimizeConfig", "Candidate", "from_torch",
]
