"""Algebras the interpreter evaluates over.

An algebra supplies the meaning of every catalog op on its own kind of value.
The interpreter only moves values around (slicing for input iterators, reshaping
for output savers, broadcasting), through the structural hooks below, so the same
evaluator gives float results (:class:`FloatAlgebra`, the numerical ground truth)
and finite-field fingerprints (``verify``'s field algebra).

A value may be a single array or a tuple of arrays (e.g. a value mod p and mod q);
:meth:`Algebra.lift` applies a structural function to each component.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from .errors import InputError, UnsupportedOpError

Value = Any
#: a facet row: (the algebra, input values, the op's attributes) -> the output value
Row = Callable[["Algebra", list, dict], Any]


def window(at: dict) -> tuple:
    """The index of a ``slice`` op's window (its attributes ``dim``, ``start``, ``end``,
    ``step``), for numpy and torch alike."""
    return (slice(None),) * at["dim"] + (slice(at["start"], at["end"], at["step"]),)


def _permute(a, perm):
    return a.permute(*perm) if isinstance(a, torch.Tensor) else np.transpose(a, perm)


def _expand(a, shape):
    return a.expand(*shape) if isinstance(a, torch.Tensor) else np.broadcast_to(a, shape)


def _concat(arrs, axis):
    return torch.cat(list(arrs), dim=axis) if isinstance(arrs[0], torch.Tensor) else np.concatenate(arrs, axis)


def _select(a, axis, index):
    if isinstance(a, torch.Tensor):  # slices of a strided view: index_select would copy all of it first
        return torch.cat([a.narrow(axis, i, 1) for i in index], axis)
    return np.take(a, index, axis=axis)


def _tile(a, reps):
    return a.repeat(*reps) if isinstance(a, torch.Tensor) else np.tile(a, reps)


class Algebra:
    """Base class: structural hooks shared by all algebras, op dispatch by name.

    Subclasses set :attr:`ops`, their facet table (op name -> row(algebra, inputs,
    attrs) -> value, one row per op of :data:`mugraph.core.ops.CATALOG` the algebra gives a
    meaning), plus :meth:`input`, :meth:`output` and :meth:`accumulate`. The table is
    the class's, not the instance's, so an op registered later needs one row there.
    """

    name = "abstract"
    ops: ClassVar[dict[str, Row]] = {}
    #: whether a value holds one entry per element: :func:`~mugraph.core.interpreter.evaluate`
    #: bounds those (``max_elements``) and runs large kernels in chunks of blocks; a summary
    #: algebra (the verifier's degrees) holds a few numbers per value, at any shape
    per_element: ClassVar[bool] = True

    # --- structure (components mapped by lift)
    def lift(self, v: Value, fn: Callable) -> Value:
        return tuple(fn(c) for c in v) if isinstance(v, tuple) else fn(v)

    def lift_many(self, vs: Sequence[Value], fn: Callable) -> Value:
        if isinstance(vs[0], tuple):
            return tuple(fn([v[i] for v in vs]) for i in range(len(vs[0])))
        return fn(list(vs))

    def shape(self, v: Value) -> tuple[int, ...]:
        return tuple((v[0] if isinstance(v, tuple) else v).shape)

    def reshape(self, v: Value, shape) -> Value:
        return self.lift(v, lambda a: a.reshape(tuple(shape)))

    def permute(self, v: Value, perm) -> Value:
        return self.lift(v, lambda a: _permute(a, tuple(perm)))

    def expand(self, v: Value, shape) -> Value:
        return self.lift(v, lambda a: _expand(a, tuple(shape)))

    def concat(self, vs: Sequence[Value], axis: int) -> Value:
        return self.lift_many(vs, lambda arrs: _concat(arrs, axis))

    def tile(self, v: Value, reps) -> Value:
        return self.lift(v, lambda a: _tile(a, tuple(reps)))

    def select(self, v: Value, axis: int, index) -> Value:
        """The entries at ``index`` (a list of positions) along ``axis``, in that order."""
        return self.lift(v, lambda a: _select(a, axis, list(index)))

    # --- semantics
    def apply(self, kind: str, inputs: list[Value], attrs: dict) -> Value:
        fn = self.ops.get(kind)
        if fn is None:
            raise UnsupportedOpError(f"{kind}: the {self.name} algebra has no meaning for this op")
        return fn(self, inputs, attrs)

    def block_apply(self, kind: str, inputs: list[Value], attrs: dict) -> Value:
        """An op inside a block graph. The same as :meth:`apply` unless the algebra
        models where a kernel keeps its values (registers vs device memory)."""
        return self.apply(kind, inputs, attrs)

    def to_memory(self, v: Value) -> Value:
        """A block graph's output tile as written to device memory (a saver)."""
        return v

    def input(self, name: str, value: Any, shape: tuple[int, ...], dtype: str) -> Value:
        raise NotImplementedError

    def output(self, v: Value, as_torch: bool) -> Any:
        return v

    def accumulate(self, v: Value, axis: int) -> Value:
        """Sum over the loop axis, keeping it (size 1)."""
        raise NotImplementedError


_WHY = {"c": " (complex: the imaginary part would be lost)", "b": " (bool: say 0.0/1.0 if you mean numbers)",
        "U": " (strings)", "S": " (bytes)", "O": " (Python objects)"}

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}


#: float evaluation, the numerical reference: op name -> row(algebra, inputs in the compute dtype, attrs)
FLOAT_OPS: dict[str, Row] = {
    "matmul": lambda alg, xs, at: torch.matmul(xs[0], xs[1]),
    "add": lambda alg, xs, at: xs[0] + xs[1],
    "sub": lambda alg, xs, at: xs[0] - xs[1],
    "mul": lambda alg, xs, at: xs[0] * xs[1],
    "div": lambda alg, xs, at: xs[0] / xs[1],
    "exp": lambda alg, xs, at: torch.exp(xs[0]),
    "sqrt": lambda alg, xs, at: torch.sqrt(xs[0]),
    "square": lambda alg, xs, at: xs[0] * xs[0],
    "silu": lambda alg, xs, at: xs[0] * torch.sigmoid(xs[0]),
    "scale": lambda alg, xs, at: xs[0] * float(at["c"]),
    "const": lambda alg, xs, at: torch.full(tuple(at["shape"]), float(at["value"]), dtype=alg.compute,
                                            device=getattr(alg, "device", None)),  # where the algebra runs
    "sum": lambda alg, xs, at: xs[0].sum(dim=at["dim"], keepdim=True),
    "max": lambda alg, xs, at: xs[0].amax(dim=at["dim"], keepdim=True),
    "concat": lambda alg, xs, at: torch.cat(xs, dim=at["dim"]),
    "reshape": lambda alg, xs, at: xs[0].reshape(tuple(at["shape"])),
    "repeat": lambda alg, xs, at: xs[0].repeat(*at["reps"]),
    "permute": lambda alg, xs, at: xs[0].permute(*at["perm"]),
    "slice": lambda alg, xs, at: xs[0][window(at)],
}


class FloatAlgebra(Algebra):
    """Real arithmetic on torch tensors.

    ``dtype="float64"`` (default) is the reference. With a lower-precision dtype
    values are *stored* in that dtype while each op computes in at least float32,
    as a GPU kernel with fp32 accumulation does.
    """

    name = "float"
    ops = FLOAT_OPS

    def __init__(self, dtype: str = "float64") -> None:
        if not isinstance(dtype, str) or dtype not in _TORCH_DTYPES:
            raise InputError(f"FloatAlgebra: unknown dtype {dtype!r}; use one of {sorted(_TORCH_DTYPES)}")
        self.dtype = dtype
        self.store = _TORCH_DTYPES[dtype]
        self.compute = torch.float64 if dtype == "float64" else torch.float32

    def apply(self, kind, inputs, attrs):
        """Each op computes in :attr:`compute` and stores its result in the storage dtype."""
        ins = [x.to(self.compute) for x in inputs]
        return super().apply(kind, ins, attrs).to(self.store)

    def input(self, name, value, shape, dtype):
        """A real array as this algebra's value. Floating and integer arrays are
        taken by value; complex (the imaginary part would be lost), bool, string and
        object arrays are refused, as are tensors that are not dense CPU/CUDA ones."""
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "fiu":
                raise InputError(f"input {name!r}: numpy dtype {value.dtype} is not real numbers{_WHY.get(value.dtype.kind, '')}")
            value = torch.from_numpy(np.asarray(value, dtype=np.float64))
        elif isinstance(value, torch.Tensor):
            if value.is_complex() or value.dtype == torch.bool:
                raise InputError(f"input {name!r}: torch dtype {value.dtype} is not real numbers"
                                 f"{_WHY['c'] if value.is_complex() else _WHY['b']}")
            if value.layout != torch.strided or value.device.type not in ("cpu", "cuda"):
                raise InputError(f"input {name!r}: a {value.layout} tensor on {value.device}; pass a dense CPU or "
                                 "CUDA tensor")
        else:
            raise InputError(f"input {name!r}: expected a numpy array or torch tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            value = value.to(torch.float64)
        return value.detach().to("cpu", self.store)

    def output(self, v, as_torch):
        if as_torch:
            return v
        if v.dtype == torch.bfloat16:
            v = v.to(torch.float32)
        return v.numpy()

    def accumulate(self, v, axis):
        return v.to(self.compute).sum(dim=axis, keepdim=True).to(self.store)

