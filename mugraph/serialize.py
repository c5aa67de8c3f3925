"""Versioned JSON for programs and μGraphs.

Ops are stored by their string names (never enum numbers), tensors by their index
in creation order. Loading rebuilds the graph through the same builder calls a
user makes, so every validity rule is checked again: a hand-edited file cannot
smuggle in an invalid graph. Loading never executes code from the file.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

from .errors import MugraphError, SerializationError
from .ir import BlockGraph, KernelGraph, Program, Tensor

FORMAT = "mugraph"
VERSION = 1
_FRACTION_ATTRS = ("c", "value")
_TUPLE_ATTRS = ("shape", "reps")


def _enc_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, Fraction):
            v = str(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


def _dec_attrs(attrs: dict) -> dict:
    out = dict(attrs)
    for k in _FRACTION_ATTRS:
        if k in out:
            out[k] = Fraction(out[k])
    for k in _TUPLE_ATTRS:
        if k in out:
            out[k] = tuple(out[k])
    return out


def _enc_block(block: BlockGraph, kernel_ids: dict[Tensor, int]) -> dict:
    ops = []
    for op in block.ops:
        if op.kind == "iterator":
            src = block.sources[op.attrs["source"]]
            ops.append({"op": "iterator", "source": kernel_ids[src], "imap": list(op.attrs["imap"]),
                        "fmap": op.attrs["fmap"]})
        else:
            d: dict[str, Any] = {"op": op.kind, "inputs": [t.id for t in op.inputs]}
            if op.attrs:
                d["attrs"] = _enc_attrs(op.attrs)
            if op.kind == "const":
                d["dtype"] = op.outputs[0].dtype
            ops.append(d)
    return {"grid": list(block.grid), "forloop": block.forloop, "ops": ops,
            "savers": [{"tensor": sv.tensor.id, "omap": list(sv.omap)} for sv in block.savers]}


def graph_to_json(graph: KernelGraph) -> dict:
    ids = {t: t.id for t in graph.tensors}
    ops = []
    for op in graph.ops:
        if op.kind == "input":
            t = op.outputs[0]
            ops.append({"op": "input", "name": t.name, "shape": list(t.shape), "dtype": t.dtype})
        elif op.kind == "graph_defined":
            ops.append({"op": "graph_defined", "block": _enc_block(op.attrs["block"], ids)})
        else:
            d: dict[str, Any] = {"op": op.kind, "inputs": [ids[t] for t in op.inputs]}
            if op.attrs:
                d["attrs"] = _enc_attrs(op.attrs)
            if op.kind == "const":
                d["dtype"] = op.outputs[0].dtype
            ops.append(d)
    return {"format": FORMAT, "version": VERSION, "kind": type(graph).__name__, "name": graph.name,
            "ops": ops, "outputs": [ids[t] for t in graph.outputs]}


def _dec_op(graph, d: dict, tensors: list[Tensor]) -> list[Tensor]:
    attrs = _dec_attrs(d.get("attrs", {}))
    if "dtype" in d:
        attrs["dtype"] = d["dtype"]
    return [graph.add_op(d["op"], [tensors[i] for i in d.get("inputs", [])], attrs)]


def _dec_block(d: dict, kernel_tensors: list[Tensor]) -> BlockGraph:
    block = BlockGraph(tuple(d["grid"]), d["forloop"])
    for od in d["ops"]:
        if od["op"] == "iterator":
            block.input(kernel_tensors[od["source"]], tuple(od["imap"]), od["fmap"])
        elif od["op"] == "accum":
            block.accum(block.tensors[od["inputs"][0]])
        else:
            _dec_op(block, od, block.tensors)
    for sv in d["savers"]:
        block.output(block.tensors[sv["tensor"]], tuple(sv["omap"]))
    return block


def graph_from_json(d: dict) -> KernelGraph:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise SerializationError("not a mugraph document (missing \"format\": \"mugraph\")")
    if d.get("version") != VERSION:
        raise SerializationError(f"unsupported mugraph format version {d.get('version')!r}; this build reads {VERSION}")
    kinds = {"Program": Program, "KernelGraph": KernelGraph}
    if d.get("kind") not in kinds:
        raise SerializationError(f"unknown document kind {d.get('kind')!r}; expected one of {sorted(kinds)}")
    g = kinds[d["kind"]](d.get("name", "graph"))
    try:
        for i, od in enumerate(d["ops"]):
            if od["op"] == "input":
                g.input(od["name"], tuple(od["shape"]), od["dtype"])
            elif od["op"] == "graph_defined":
                g.kernel(_dec_block(od["block"], g.tensors))
            else:
                _dec_op(g, od, g.tensors)
        for i in d["outputs"]:
            g.output(g.tensors[i])
    except MugraphError as e:
        raise SerializationError(f"invalid graph in document: {e}") from None
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise SerializationError(f"malformed mugraph document: {type(e).__name__}: {e}") from None
    return g


def save(obj: Any, path: str | Path) -> Path:
    """Write a Program or μGraph (or any object with ``to_json``) as versioned JSON."""
    path = Path(path)
    if isinstance(obj, KernelGraph):
        doc = graph_to_json(obj)
    elif hasattr(obj, "to_json"):
        doc = obj.to_json()
    else:
        raise SerializationError(f"save: cannot save a {type(obj).__name__}")
    path.write_text(json.dumps(doc, indent=1))
    return path


def load(path: str | Path) -> Any:
    """Read what :func:`save` wrote: a Program, a KernelGraph, or an ``Optimized`` result."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise SerializationError(f"{path}: cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SerializationError(f"{path}: not JSON: {e}") from None
    if isinstance(doc, dict) and doc.get("kind") == "Optimized":
        from .pipeline import Optimized  # a saved superoptimize result

        return Optimized.from_json(doc)
    try:
        return graph_from_json(doc)
    except SerializationError as e:
        raise SerializationError(f"{path}: {e}") from None
