"""The ATen trace of a dynamo graph, kept on disk beside the result cache (docs/design.md
§10.5, "A warm start"), so that a warm start rebuilds it instead of tracing again.

Why: on a warm start every piece comes from the result cache, and what is left of the
backend's own time is mostly the trace — ``make_fx`` dispatching each op through
functionalization and the decompositions: 4.7–8.5 s of a tiny 32-layer LLaMA's 5.4 s warm
compile on a 2-core CPU. Rebuilding the same graph from its stored nodes takes a small
fraction of that (no op runs: each node's value is a fake tensor made from its stored shape).

What is stored: the traced graph after the capture's own passes — per node its kind, name,
target (an ATen or mugraph operator by its qualified name, or a Python function by module
and name), arguments, and its value's shape, strides, storage offset, dtype and device (what
the capture and the partition read of a node: ``meta["val"]``, exactly as the trace left
it); nothing of the model's weights (dynamo passes them as inputs). A graph holding anything
else (a constant tensor, a target that has no importable name, a value that is not a tensor)
is not stored: it is traced at every compile, as before. The key is a hash of dynamo's graph
code, the inputs' shapes, strides and dtypes, the versions of torch and of mugraph's code
(``pipeline.cache.versions``) and the front end's own code (``core.version.frontend_fingerprint``:
the result cache's fingerprint leaves the front end out), so a change to any pass that shapes
the trace misses it.
Anything that fails on a load (a file cut short, a target gone) falls back to tracing, with
one log line.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import pickle
import uuid
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx

log = logging.getLogger("mugraph")

#: the memo's file format; a file of another one is not read
FORMAT = 1


class _Ref:
    """A reference to an earlier node, by name, inside a stored node's arguments."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class NotStorable(Exception):
    """The graph holds something the memo does not store (it is then traced every time)."""


def graph_text(gm: fx.GraphModule) -> str:
    """``gm``'s nodes one per line as torch.fx prints them (each node's name, op, target by
    qualified name, arguments and users): what its generated code says, without generating
    it — dynamo hands the backend a graph whose code is not generated yet, and generating it
    for a whole 32-layer model took most of the key's time. :class:`NotStorable` where the
    text holds an object known only by its address (``<... at 0x...>``): no key of it would
    be found again by another process."""
    text = "\n".join(n.format_node() or "" for n in gm.graph.nodes)
    if " at 0x" in text:
        raise NotStorable("an object known only by its address")
    return text


def key(gm: fx.GraphModule, example_inputs: tuple) -> str:
    """The memo's key for ``gm`` traced with inputs like ``example_inputs``."""
    from ..core.version import frontend_fingerprint
    from ..pipeline.cache import versions

    specs = [(tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device), x.requires_grad)
             if isinstance(x, torch.Tensor) else ("value", repr(x)) for x in example_inputs]
    state = [(n, tuple(v.shape), str(v.dtype)) for n, v in [*gm.named_parameters(), *gm.named_buffers()]]
    doc = {"format": FORMAT, "graph": graph_text(gm), "inputs": specs, "state": state, "versions": versions(),
           "frontend": frontend_fingerprint()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _target_name(t: Any) -> tuple[str, str, str]:
    if isinstance(t, torch._ops.OpOverload):
        return ("op", t.namespace, f"{t._schema.name.split('::', 1)[1]}.{t._overloadname}")
    if callable(t) and getattr(t, "__module__", None) and getattr(t, "__qualname__", None) \
            and "<" not in t.__qualname__:
        mod = t.__module__
        if _resolve(("py", mod, t.__qualname__)) is t:
            return ("py", mod, t.__qualname__)
    raise NotStorable(f"target {t!r} has no importable name")


def _resolve(name: tuple[str, str, str]) -> Callable:
    kind, where, what = name
    if kind == "op":
        packet, overload = what.rsplit(".", 1)
        return getattr(getattr(getattr(torch.ops, where), packet), overload)
    obj: Any = importlib.import_module(where)
    for part in what.split("."):
        obj = getattr(obj, part)
    return obj


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _encode(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return _Ref(a.name)
    if isinstance(a, (list, tuple)):
        return type(a)(_encode(x) for x in a)
    if isinstance(a, dict):
        return {k: _encode(v) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_encode(a.start), _encode(a.stop), _encode(a.step))
    if isinstance(a, _PLAIN):
        return a
    raise NotStorable(f"an argument of type {type(a).__name__}")


def _decode(a: Any, env: dict[str, fx.Node]) -> Any:
    if isinstance(a, _Ref):
        return env[a.name]
    if isinstance(a, (list, tuple)):
        return type(a)(_decode(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _decode(v, env) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_decode(a.start, env), _decode(a.stop, env), _decode(a.step, env))
    return a


def _spec(v: Any) -> tuple | None:
    """A node value's stored form: a tensor's shape, strides, storage offset, dtype and
    device; ``None`` for none (the output node)."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype, str(v.device))
    raise NotStorable(f"a value of type {type(v).__name__}")


def _fake(spec: tuple, mode: Any) -> torch.Tensor:
    """A fake tensor of exactly ``spec``'s layout (its storage as long as the layout needs):
    a meta tensor of that layout wrapped as ``mode``'s fake tensor on the spec's device — no
    op is dispatched through the fake mode (that way 2,148 nodes took 2.2 s; this way a tenth)."""
    from torch._subclasses.fake_tensor import FakeTensor

    shape, stride, offset, dtype, device = spec
    span = offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else offset
    base = torch.empty(max(span, 1), dtype=dtype, device="meta")
    return FakeTensor(mode, torch.as_strided(base, shape, stride, offset), torch.device(device))


def dumps(traced: fx.GraphModule) -> bytes:
    """The stored form of a traced graph (:class:`NotStorable` where it holds more than nodes)."""
    nodes = []
    for n in traced.graph.nodes:
        if n.op in ("get_attr", "call_module", "call_method"):
            raise NotStorable(f"a {n.op} node ({n.name})")
        target = _target_name(n.target) if n.op == "call_function" else n.target
        nodes.append((n.op, n.name, target, _encode(n.args), _encode(n.kwargs), _spec(n.meta.get("val"))))
    if any(True for _ in traced.named_buffers()) or any(True for _ in traced.named_parameters()):
        raise NotStorable("the graph holds tensors of its own")
    return pickle.dumps({"format": FORMAT, "nodes": nodes}, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes, example_inputs: tuple) -> fx.GraphModule:
    """The graph :func:`dumps` stored, every node's ``meta["val"]`` a fake tensor of its stored
    layout (``example_inputs`` must be laid out as the placeholders were)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    doc = pickle.loads(data)  # noqa: S301 - a file this module wrote, under the user's own cache folder
    if doc.get("format") != FORMAT:
        raise ValueError(f"format {doc.get('format')!r}, not {FORMAT}")
    mode = FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True)
    inputs = iter(example_inputs)
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, spec in doc["nodes"]:
        args, kwargs = _decode(args, env), _decode(kwargs, env)
        if op == "placeholder":
            n = g.placeholder(target)
            x = next(inputs)
            if spec is not None:
                if not isinstance(x, torch.Tensor) or (tuple(x.shape), tuple(x.stride()), x.dtype) != \
                        (spec[0], spec[1], spec[3]):
                    raise ValueError(f"input {target} is not laid out as the stored trace's")
                n.meta["val"] = _fake(spec, mode)
        elif op == "output":
            n = g.output(args[0])
        else:
            n = g.create_node(op, _resolve(target), args, kwargs, name=name)
            if spec is not None:
                n.meta["val"] = _fake(spec, mode)
        env[name] = n
    return lazy_module(g)


def lazy_module(g: fx.Graph, root: torch.nn.Module | None = None) -> fx.GraphModule:
    """A module of ``g`` (its attributes from ``root``) whose Python code is generated when it
    is first needed — called, or keyed by Inductor's caches — not now: the backend reads a
    rebuilt trace as a graph (the partition, the stitching) and never calls it, and
    generating the code of a 32-layer model's trace took about 0.15 s of a 1.4 s warm compile
    (CPU); a stitched graph's code is generated again anyway where Inductor keys it. torch's
    own lazy module where this torch has it, else a plain one."""
    root = torch.nn.Module() if root is None else root
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover - a torch without it: generated now
        return fx.GraphModule(root, g)
    return _LazyGraphModule(root, g)


def folder_of(cache_dir: Any) -> Path | None:
    """Where the memo keeps traces for the backend's ``cache_dir`` option: ``traces/`` in the
    result cache's folder (``None``: mugraph's default one); ``False`` (no cache): nowhere."""
    if cache_dir is False:
        return None
    from ..pipeline.cache import default_cache_dir

    return (default_cache_dir() if cache_dir is None else Path(cache_dir)) / "traces"


def traced(gm: fx.GraphModule, example_inputs: tuple, folder: Path | None,
           trace: Callable[[fx.GraphModule, tuple], fx.GraphModule]) -> tuple[fx.GraphModule, bool]:
    """``trace(gm, example_inputs)``, or the same graph rebuilt from ``folder`` when an
    earlier compile stored it there (and stored there now when it was not); ``folder`` None:
    traced, nothing stored. Returns the graph and whether it came from the memo."""
    if folder is None:
        return trace(gm, example_inputs), False
    try:
        path = Path(folder) / f"{key(gm, example_inputs)}.trace"
    except NotStorable as e:
        log.debug("mugraph: the trace is not stored: %s", e)
        return trace(gm, example_inputs), False
    if path.exists():
        try:
            return loads(path.read_bytes(), example_inputs), True
        except Exception as e:  # noqa: BLE001 - any failure: traced, as without the memo
            log.info("mugraph: the stored trace %s could not be rebuilt (%s: %s); tracing again", path.name,
                     type(e).__name__, str(e).splitlines()[0][:120] if str(e) else "")
    out = trace(gm, example_inputs)
    try:
        data = dumps(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: a concurrent compile reads a whole file or none
    except NotStorable as e:
        log.debug("mugraph: the trace is not stored: %s", e)
    except OSError as e:
        log.info("mugraph: the trace could not be stored in %s: %s", path.parent, e)
    return out, False


__all__ = ["traced", "folder_of", "dumps", "loads", "key", "graph_text", "lazy_module", "NotStorable"]
