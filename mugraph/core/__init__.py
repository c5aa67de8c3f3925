"""The IR core: tensors, kernel/block/thread graphs, the op catalog, the builder, the
interpreter and its algebras, the Lax check, serialization, text and pictures.

The ground floor: it imports nothing of the stages (``search``, ``verify``, ``lower``)
or of the product (``mugraph.pipeline``, ``mugraph.frontend``, ``mugraph.cli``), and
every floor above imports it (docs/layout.md).
"""

from . import errors, limits
from .algebra import Algebra, FloatAlgebra
from .builder import (add, concat, constant, div, exp, gelu_tanh, matmul, max, mean, mul, permute, repeat,
                      reshape, rms_norm, scale, sigmoid, silu, slice, sqrt, square, sub, sum, tanh, transpose)
from .errors import (ArgumentTypeError, CacheError, ConfigError, ConstantError, DTypeError, InputError, InvalidGraphError,
                     MugraphError, NotLaxError, ResourceError, SerializationError, ShapeError, UnsupportedOpError)
from .fills import causal_mask
from .interpreter import evaluate
from .ir import DTYPES, BlockGraph, KernelGraph, Program, Tensor, ThreadGraph, build_thread_graphs
from .lax import check_lax, is_lax
from .ops import CATALOG
from .render import render, to_dot
from .version import __version__  # noqa: F401 - the package version

__all__ = [
    "causal_mask",
    "Program", "KernelGraph", "BlockGraph", "Tensor", "ThreadGraph", "build_thread_graphs", "DTYPES", "CATALOG",
    "matmul", "add", "sub", "mul", "div", "exp", "sqrt", "square", "silu", "sum", "max", "mean", "rms_norm",
    "sigmoid", "tanh", "gelu_tanh",
    "concat", "reshape", "repeat", "permute", "transpose", "slice", "scale", "constant",
    "check_lax", "is_lax", "evaluate", "Algebra", "FloatAlgebra", "render", "to_dot", "errors",
    "limits", "MugraphError", "ShapeError", "DTypeError", "NotLaxError", "InvalidGraphError", "ResourceError",
    "UnsupportedOpError", "SerializationError", "InputError", "ConfigError", "CacheError", "ArgumentTypeError",
    "ConstantError",
]
