"""mugraph: a multi-level superoptimizer for tensor programs (the Mirage approach).

Build a Lax program, write or search μGraphs, evaluate them, save and draw them::

    import mugraph as mg
    p = mg.Program("gated_mlp")
    X = p.input("X", (8, 4096)); W1 = p.input("W1", (4096, 4096)); W2 = p.input("W2", (4096, 4096))
    p.output(mg.silu(X @ W1) * (X @ W2))
    mg.check_lax(p)
    (Y,) = mg.evaluate(p, {"X": x, "W1": w1, "W2": w2})

This module is the roof over three floors (docs/layout.md): the IR core
(:mod:`mugraph.core`), the stages (``search``, ``verify``, ``lower``) and the product
(:mod:`mugraph.pipeline`, :mod:`mugraph.frontend`, :mod:`mugraph.cli`). It re-exports the
core's names at once; the product's — ``superoptimize``, ``Optimized``, ``OptimizeConfig``,
``Candidate``, ``save`` / ``load`` (which also handle ``superoptimize`` results) and
``from_torch`` — on first use, so that ``import mugraph`` to build and evaluate a program
costs the core alone (torch), not the stages (Triton, Z3, egglog, numba: twice the import
time) — and Triton is first imported where the lowering chooses its interpreter mode on a CPU.
"""

from .core import (CATALOG, DTYPES, Algebra, ArgumentTypeError, BlockGraph, CacheError, ConfigError, ConstantError,
                   DTypeError, FloatAlgebra, InputError, InvalidGraphError, KernelGraph, MugraphError, NotLaxError,
                   Program, ResourceError, SerializationError, ShapeError, Tensor, ThreadGraph, UnsupportedOpError,
                   add, build_thread_graphs, causal_mask, check_lax, concat, constant, div, errors, evaluate, exp, gelu_tanh, is_lax,
                   limits, matmul, max, mean, mul, permute, render, repeat, reshape, rms_norm, scale, sigmoid, silu,
                   slice, sqrt, square, sub, sum, tanh, to_dot, transpose)
from .core.version import __version__  # noqa: F401 - the package version

#: the product's public names, imported from :mod:`mugraph.pipeline` when first used
_PRODUCT = ("superoptimize", "Optimized", "OptimizeConfig", "Candidate", "save", "load")
#: the PyTorch front door's public names, imported from :mod:`mugraph.frontend` when first used
_FRONTEND = ("from_torch",)


def __getattr__(name: str):
    if name in _PRODUCT or name == "pipeline":
        import mugraph.pipeline as pipeline  # lazy: see the module docstring

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
    "sigmoid", "tanh", "gelu_tanh",
    "concat", "reshape", "repeat", "permute", "transpose", "slice", "scale", "constant",
    "causal_mask", "check_lax", "is_lax", "evaluate", "Algebra", "FloatAlgebra", "save", "load", "render", "to_dot", "errors",
    "limits", "MugraphError", "ShapeError", "DTypeError", "NotLaxError", "InvalidGraphError", "ResourceError",
    "UnsupportedOpError", "SerializationError", "InputError", "ConfigError", "CacheError", "ArgumentTypeError",
    "ConstantError",
    "superoptimize", "Optimized", "OptimizeConfig", "Candidate", "from_torch",
]
