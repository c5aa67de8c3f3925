"""A model's forward compiled by the backend once and saved to a folder, so that a later
process runs it without dynamo tracing the model again (docs/models.md, "Saved compiles").

Why: a warm ``torch.compile`` of a whole model — every piece in the result cache, every
kernel in Triton's and Inductor's caches — still begins with dynamo tracing the model's
Python code, which no cache serves: 8.1 of the 9.8 s a whole Phi-3-mini's warm start took on
an H200, where the backend's own part was 1.7 s. PyTorch saves a compile with its guards
and bytecode (``torch.compiler.save_compiled_function``, from ``aot_compile``); the backend's
result is saveable (:meth:`.backend.MugraphCompiled.serialize_compile_artifacts`), and this
module does the rest for a model:

* it traces a function of its own that calls the model's forward (:func:`call_forward`), so
  the saved code names nothing of the caller's, and returns a model output
  (``transformers``' ``ModelOutput``) as a plain dict with its class's name, rebuilt here —
  a saved compile cannot name the dict subclass's module by the address the trace saw;
* it keeps the guards a saved compile can hold (:func:`portable_guards`): every tensor's
  shape, strides, dtype and device, the constants read, the global state (grad mode), but
  not object identities, which no other process can check — instead the file's name holds
  the model's fingerprint (:func:`model_fingerprint`: class, configuration, every
  parameter's and buffer's name, shape, dtype and device — not their values, which the
  compiled graph reads as inputs, so a fine-tuned copy of the same architecture shares it),
  the call's signature (:func:`call_signature`), the options and mugraph's and torch's
  versions;
* one file per call signature: ``generate`` over a static cache makes two (the prompt's and
  a decode step's), each compiled at its first call and loaded by later processes.

A file that cannot be loaded, or whose guards refuse the call, is compiled again (one log
line says why). Inference only, static shapes (``dynamic=False``); the model's forward must
trace as one graph (``fullgraph=True``), and forward hooks on the model itself are not run
(its submodules' are).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.errors import ConfigError, first_line
from .graph import gc_paused
from .options import FrontendOptions

log = logging.getLogger("mugraph")

#: the file format; a file of another one is compiled again
FORMAT = 1
#: how deep :func:`call_signature` describes objects inside the call's arguments (a static
#: cache holds its layers, each its key and value tensors)
OBJECT_DEPTH = 3
#: what :func:`call_forward` returns in its first element
_MAPPING, _VALUE = "mapping", "value"


def call_forward(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
    """What a saved compile traces: ``model``'s forward (its class's, so that a forward the
    caller replaced by a :class:`SavedForward` is not called again), its output returned as
    ``(_VALUE, out)``, or — a mapping such as a ``ModelOutput`` — as ``(_MAPPING, module,
    class name, dict)``."""
    out = type(model).forward(model, *args, **kwargs)
    if isinstance(out, dict):
        cls = type(out)
        return _MAPPING, cls.__module__, cls.__qualname__, dict(out)
    return _VALUE, out


def portable_guards(entries: list, scope: dict | None = None) -> list[bool]:
    """The guards a saved compile keeps (a ``guard_filter_fn``): all but those on globals and
    those torch cannot save, which check an object's identity (a function, a class, a module,
    a closure's cells) — true only within the process that traced it — and, given ``scope``
    (the traced frame's locals), those reached through an object whose class is defined inside
    a function or a class (:func:`_nested_class`): torch saves such an object as a plain
    module, and a guard read through it cannot be built again in the loading process. What
    they guarded in the tracing process is covered by the file's key (:func:`model_fingerprint`,
    mugraph's and torch's versions)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    through = _ThroughNested(scope) if scope is not None else None
    return [not e.is_global and e.guard_type not in unsaved
            and not unsaved.intersection(getattr(e, "derived_guard_types", ()) or ())
            and not (e.guard_type in _TYPE_CHECKS and e.has_value and _nested_class(e.value))
            and not (through is not None and through(e))
            for e in entries]


#: guards that check a value's type by the type's identity
_TYPE_CHECKS = ("TYPE_MATCH", "BUILTIN_MATCH", "FAKE_SCRIPT_TYPE_MATCH")


def _nested_class(value: Any) -> bool:
    """Whether ``value``'s class is defined inside a function or a class, which no other
    process can name: transformers 5.25 wraps functions such as ``apply_rotary_pos_emb`` in a
    module of a class made per wrapped function (a tuple subclass is saved by its fields)."""
    t = type(value)
    return t.__qualname__ != t.__name__ and not isinstance(value, tuple)


class _ThroughNested:
    """Whether a guard's source passes through an object of a nested class
    (:func:`_nested_class`), each prefix of its source evaluated once in the traced frame's
    ``scope`` (a source that does not evaluate here is taken as not passing through one)."""

    def __init__(self, scope: dict) -> None:
        self.scope = scope
        self.seen: dict[str, bool] = {}

    def __call__(self, entry: Any) -> bool:
        src = getattr(getattr(entry, "orig_guard", None), "originating_source", None)
        src = getattr(src, "base", None)  # the guarded value's owners, not the value itself
        while src is not None:
            name = src.name() if callable(src.name) else src.name
            if name not in self.seen:
                try:
                    self.seen[name] = _nested_class(eval(name, {"__builtins__": __builtins__}, {"L": self.scope}))
                except Exception:  # noqa: BLE001 - a source torch builds with helpers of its own
                    self.seen[name] = False
            if self.seen[name]:
                return True
            src = getattr(src, "base", None)
        return False


def bytecode_missing() -> bool:
    """Whether this process writes no bytecode (``PYTHONDONTWRITEBYTECODE``, ``python -B``)
    and torch's Inductor has none to read: then every new process compiles the modules a
    compile imports from source — about 550 of them, 2–3 s of a whole Phi-3-mini's 5–7 s
    first step loaded from a saved compile on an H200 host — before it runs anything.
    Container images often set that variable; an installed torch otherwise has its bytecode."""
    if not sys.dont_write_bytecode:
        return False
    source = Path(torch.__file__).parent / "_inductor" / "compile_fx.py"
    try:
        return source.exists() and not Path(importlib.util.cache_from_source(str(source))).exists()
    except (NotImplementedError, ValueError):  # no bytecode caching at all in this Python
        return False


@functools.lru_cache(maxsize=1)
def _say_bytecode_missing() -> None:
    """One log line per process where :func:`bytecode_missing` holds."""
    if bytecode_missing():
        log.warning("mugraph: Python writes no bytecode here (PYTHONDONTWRITEBYTECODE) and torch's modules have "
                    "none: each new process compiles Inductor's from source at its first compile (2-3 s); set "
                    "PYTHONPYCACHEPREFIX to a writable folder, or run `python -m compileall` on torch's folder once")


def _qualname(x: Any) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def describe(x: Any, depth: int = 0) -> Any:
    """``x`` as the saved compile's key sees it: a tensor by shape, strides, dtype, device and
    whether it needs gradients; a plain value by itself; containers by their items; any other
    object by its class and, to :data:`OBJECT_DEPTH`, its attributes (a static cache's
    layers and their tensors)."""
    if isinstance(x, torch.Tensor):
        return ["tensor", list(x.shape), list(x.stride()), str(x.dtype), x.device.type, x.requires_grad]
    if x is None or isinstance(x, (bool, int, float, str)):
        return [type(x).__name__, x]
    if isinstance(x, (torch.dtype, torch.device)):
        return [type(x).__name__, str(x)]
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [describe(v, depth) for v in x]]
    if isinstance(x, dict):
        return ["dict", sorted([str(k), describe(v, depth)] for k, v in x.items())]
    if depth < OBJECT_DEPTH and hasattr(x, "__dict__"):
        attrs = {k: v for k, v in vars(x).items() if not callable(v) and not isinstance(v, torch.nn.Module)}
        return [_qualname(x), describe(attrs, depth + 1)]
    return [_qualname(x)]


def call_signature(model: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """What of a call its saved compile is specialized on: its arguments (:func:`describe`),
    the grad mode and whether the model is in training mode (dropout, for one, reads it)."""
    return {"args": describe(args), "kwargs": describe(kwargs), "grad": torch.is_grad_enabled(),
            "training": [m.training for m in model.modules()]}


def model_fingerprint(model: torch.nn.Module) -> dict:
    """What of ``model`` a saved compile depends on: its class and the version of the library
    that defines it (its code is what was traced), its configuration (a
    ``transformers`` model's ``config``), and every parameter's and buffer's name, shape,
    dtype and device — not their values, which the compiled graph reads at each call."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    library = sys.modules.get(type(model).__module__.partition(".")[0])
    return {"class": _qualname(model), "library": getattr(library, "__version__", None),
            "config": to_json(use_diff=False) if callable(to_json) else None,
            "state": [[n, list(t.shape), str(t.dtype), t.device.type]
                      for n, t in [*model.named_parameters(), *model.named_buffers()]]}


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:20]


@functools.lru_cache(maxsize=64)
def _class(module: str, qualname: str) -> Any:
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return cls


def _rebuild(result: tuple) -> Any:
    """The model's output from what :func:`call_forward` returned."""
    if result[0] == _VALUE:
        return result[1]
    _, module, qualname, items = result
    cls = _class(module, qualname)
    try:
        return cls(**items)
    except TypeError:  # a mapping that is not built from keywords
        return cls(items)


class SavedForward:
    """``model``'s forward, compiled by the mugraph backend at the first call of each
    signature and saved in ``folder``, or loaded from there when an earlier process saved it
    (:func:`saved_forward`). ``info`` says, per signature, whether it was ``"loaded"`` or
    ``"compiled"`` and in how many seconds (the first call included: a load's first call
    rebuilds the backend's callable from its caches)."""

    def __init__(self, model: torch.nn.Module, folder: str | Path, options: dict | None = None) -> None:
        self.model = model
        self.folder = Path(folder)
        self.options = dict(options or {})
        # a bad option is said now, not at the first call; the options' text is part of each file's key
        self._options_text = repr(FrontendOptions.of(self.options))
        self._fingerprint = model_fingerprint(model)
        # what inspect.signature says of it: the forward's own parameters (``generate`` reads
        # them to decide which arguments to pass, e.g. ``cache_position``)
        self.__signature__ = inspect.signature(type(model).forward.__get__(model))
        self._functions: dict[str, Callable] = {}
        self.info: dict[str, dict] = {}

    def __getstate__(self) -> dict:
        """Pickled without the compiled functions (they hold torch's guard managers, which do
        not pickle): an unpickled one loads them from its folder again. A saved compile of a
        model whose ``forward`` is this one pickles it with the model's attributes."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_functions", "info")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _functions={}, info={})

    def path_of(self, args: tuple, kwargs: dict) -> Path:
        """The file that holds (or will hold) the compile of a call like this one."""
        from ..pipeline.cache import versions

        doc = {"format": FORMAT, "model": self._fingerprint, "call": call_signature(self.model, args, kwargs),
               "options": self._options_text, "versions": versions()}
        name = type(self.model).__name__.lower()
        return self.folder / f"{name}-{_digest(doc)}.pt2"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the compiles this process holds, last used first, asked by their guards (torch's
        # compiled check: 0.2 ms on a 32-layer model, where the file's key takes 1.9 ms on a CPU)
        for key in reversed(self._functions):
            fn = self._functions[key]
            if fn.guard_check(self.model, args, kwargs):
                if key != next(reversed(self._functions)):
                    self._functions[key] = self._functions.pop(key)
                return _rebuild(fn(self.model, args, kwargs))
        path = self.path_of(args, kwargs)
        t0 = time.perf_counter()
        fn = self._load(path, args, kwargs)
        how = "loaded" if fn is not None else "compiled"
        if fn is None:
            fn = self._compile(path, args, kwargs)
        t1 = time.perf_counter()
        # its guards hold for this call (a load checked them, a compile was traced from it), and
        # every later call checks them above
        fn.disable_guard_check()
        out = fn(self.model, args, kwargs)  # a compile's searches, a load's rebuild from the caches
        t2 = time.perf_counter()
        if how == "compiled":
            self._save(fn, path)
        self._functions[path.name] = fn
        self.info[path.name] = {"how": how, "seconds": time.perf_counter() - t0,
                                f"{'load' if how == 'loaded' else 'trace'}_s": t1 - t0, "first_call_s": t2 - t1}
        log.info("mugraph: %s's forward %s in %.1f s (%s)", type(self.model).__name__, how,
                 self.info[path.name]["seconds"], path)
        return _rebuild(out)

    def _load(self, path: Path, args: tuple, kwargs: dict) -> Callable | None:
        """The saved compile at ``path``, or None: none there, or one that does not load or
        whose guards refuse this call (said in one log line; it is compiled again)."""
        if not path.exists():
            return None
        _say_bytecode_missing()
        try:
            # paused: unpickling a graph and building its guards allocate objects by the hundred
            # thousand, and each full collection they set off walks the whole model's process
            with gc_paused(), open(path, "rb") as f:
                fn = torch.compiler.load_compiled_function(f, f_globals=globals())
        except Exception as e:  # noqa: BLE001 - torch's many load errors: compiled again
            log.warning("mugraph: the saved compile %s did not load (%s); compiling again", path.name, first_line(e))
            return None
        if not fn.guard_check(self.model, args, kwargs):
            log.warning("mugraph: the saved compile %s does not fit this call (its guards: %s); compiling again",
                        path.name, _first_failure(fn, self.model, args, kwargs))
            return None
        return fn

    def _compile(self, path: Path, args: tuple, kwargs: dict) -> Callable:
        """The forward traced by dynamo as one graph and compiled by the backend (searched at
        its first call)."""
        try:
            # torch releases that hide aot_compile behind a flag read it when torch.compile runs
            with torch._dynamo.config.patch(enable_aot_compile=True):
                compiled = torch.compile(call_forward, backend="mugraph", fullgraph=True, dynamic=False,
                                         options={**self.options, "guard_filter_fn": functools.partial(
                                             portable_guards, scope={"model": self.model, "args": args, "kwargs": kwargs})})
            return compiled.aot_compile(((self.model, args, kwargs), {}))
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - dynamo's errors: said in one line
            raise ConfigError(f"mugraph: {type(self.model).__name__}'s forward could not be compiled to be saved "
                              f"({first_line(e, 300)}); torch.compile(model, backend=\"mugraph\") compiles it "
                              "without saving") from None

    def _save(self, fn: Any, path: Path) -> None:
        """Writes ``fn`` to ``path`` (atomically); a failure is said in one log line — the
        compile still runs, it is only not saved."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fn.save_compiled_function(str(path))
        except Exception as e:  # noqa: BLE001 - pickling's many errors: the compile runs unsaved
            log.warning("mugraph: the compile of %s's forward could not be saved (%s)", type(self.model).__name__,
                        first_line(e))


def _first_failure(fn: Any, model: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    """The first guard of a loaded compile that refuses a call, in torch's words."""
    try:
        f_locals = fn.prepare_f_locals(model, args, kwargs)
        return str(fn._artifacts.guard_manager.check_verbose(f_locals).failed_reason)[:200]
    except Exception:  # noqa: BLE001 - torch's private surface: the reason is only a hint
        return "unknown"


def saved_forward(model: torch.nn.Module, folder: str | Path, options: dict | None = None) -> SavedForward:
    """``model``'s forward under the mugraph backend, compiled once per call signature and
    saved in ``folder`` — a later process loads it without dynamo's trace. ``options`` are
    the backend's (``torch.compile(..., options=...)``). For ``generate``::

        model.forward = saved_forward(model, "compiled/", {"cache_dir": "pieces/"})
        model.generate(ids, cache_implementation="static", disable_compile=True, ...)
    """
    return SavedForward(model, folder, options)


__all__ = ["saved_forward", "SavedForward", "call_forward", "portable_guards", "model_fingerprint",
           "call_signature", "describe", "bytecode_missing"]
