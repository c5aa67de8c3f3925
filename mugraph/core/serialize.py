"""Versioned JSON for programs and μGraphs.

Ops are stored by their string names (never enum numbers), tensors by their index
in creation order. Loading rebuilds the graph through the same builder calls a
user makes, so every validity rule is checked again: a hand-edited file cannot
smuggle in an invalid graph. Loading never executes code from the file.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from .errors import ArgumentTypeError, MugraphError, SerializationError
from .files import as_path, read_json, write_text_atomic
from .fills import fill_from_json
from .ir import ACCUM_MONOIDS, RESCALED, RUNNING_MAX, SUM, BlockGraph, KernelGraph, Program, Tensor, rational, short
from .limits import MAX_CONSTANT_DIGITS
from .ops import CATALOG

FORMAT = "mugraph"
VERSION = 1


def _enc_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, Fraction):
            v = str(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
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
            if not op.inputs:  # an op without inputs carries its dtype
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
            d_in: dict[str, Any] = {"op": "input", "name": t.name, "shape": list(t.shape), "dtype": t.dtype}
            if t.fill is not None:
                d_in["fill"] = t.fill.to_json()
            ops.append(d_in)
        elif op.kind == "graph_defined":
            ops.append({"op": "graph_defined", "block": _enc_block(op.attrs["block"], ids)})
        else:
            d: dict[str, Any] = {"op": op.kind, "inputs": [ids[t] for t in op.inputs]}
            if op.attrs:
                d["attrs"] = _enc_attrs(op.attrs)
            if not op.inputs:  # an op without inputs carries its dtype
                d["dtype"] = op.outputs[0].dtype
            ops.append(d)
    return {"format": FORMAT, "version": VERSION, "kind": type(graph).__name__, "name": graph.name,
            "ops": ops, "outputs": [ids[t] for t in graph.outputs]}


# ------------------------------------------------------------------ decoding
# Every field is checked for its type and range before the builder sees it, and
# the error names where in the document it is (``ops[3].inputs[1]``): a float dim
# is refused (not truncated), a negative tensor index is refused (not counted from
# the end), an unknown key is refused (not ignored), a constant's size is bounded.

_CONST_RE = re.compile(r"[+-]?[0-9]+(?:/[0-9]+)?|[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?")


def _bad(where: str, msg: str) -> SerializationError:
    return SerializationError(f"{where}: {msg}")


def _obj(v: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(v, dict):
        raise _bad(where, f"expected an object, got {_json_type(v)}")
    missing = [k for k in required if k not in v]
    if missing:
        raise _bad(where, f"missing key(s) {missing}")
    unknown = [k for k in v if k not in required and k not in optional]
    if unknown:
        raise _bad(where, f"unknown key(s) {', '.join(short(k, 30) for k in unknown[:5])}; "
                          f"allowed: {', '.join(required + optional)}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise _bad(where, f"expected a list, got {_json_type(v)}")
    return v


def _int(v: Any, where: str) -> int:
    if type(v) is not int:
        raise _bad(where, f"expected an integer, got {_json_type(v)} {short(v, 30)}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _bad(where, f"expected a string, got {_json_type(v)}")
    return v


def _index(v: Any, n: int, where: str) -> int:
    i = _int(v, where)
    if not 0 <= i < n:
        raise _bad(where, f"tensor index {i} out of range: {n} tensors are defined before this point")
    return i


def _opt_int(v: Any, where: str) -> int | None:
    return None if v is None else _int(v, where)


def _json_type(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _constant(v: Any, where: str) -> Fraction:
    """A constant attribute: a string ``"p/q"`` (what :func:`save` writes) or decimal
    ``"0.5"``, ``"1e-3"``, or a JSON integer or number; its exponent and digits bounded."""
    if isinstance(v, str):
        m = _CONST_RE.fullmatch(v) if len(v) <= 2 * MAX_CONSTANT_DIGITS + 8 else None
        if m is None:
            raise _bad(where, f"constant {short(v, 30)} is not a rational 'p/q' or a decimal of at most "
                              f"{MAX_CONSTANT_DIGITS} digits")
        if m.group(1) is not None and abs(int(m.group(1))) > MAX_CONSTANT_DIGITS:
            raise _bad(where, f"constant {short(v, 30)}: exponent beyond ±{MAX_CONSTANT_DIGITS} "
                              "(mugraph.core.limits.MAX_CONSTANT_DIGITS)")
        if re.fullmatch(r"[+-]?[0-9]+/0+", v):
            raise _bad(where, f"constant {short(v, 30)} divides by zero")
        v = Fraction(v)
    try:
        return rational(v, where)
    except MugraphError as e:
        raise SerializationError(str(e)) from None


def _dec_attrs(kind: str, d: dict, where: str) -> dict:
    """The attributes of a ``kind`` op, each decoded by its type in the catalog schema
    (names the op does not take are left for the builder to refuse)."""
    attrs = dict(_obj(d, where, (), tuple(d) if isinstance(d, dict) else ()))
    opdef = CATALOG.get(kind)
    for a in opdef.attrs if opdef is not None else ():
        k = a.name
        if k not in attrs:
            continue
        if a.type == "rational":
            attrs[k] = _constant(attrs[k], f"{where}.{k}")
        elif a.type in ("shape", "counts", "perm"):
            attrs[k] = tuple(_int(x, f"{where}.{k}[{i}]") for i, x in enumerate(_list(attrs[k], f"{where}.{k}")))
        elif a.type in ("dim", "index"):
            _int(attrs[k], f"{where}.{k}")
    return attrs


def _dec_op(graph, d: dict, tensors: list[Tensor], where: str) -> Tensor:
    _obj(d, where, ("op", "inputs"), ("attrs", "dtype"))
    kind = _str(d["op"], f"{where}.op")
    ins = [tensors[_index(i, len(tensors), f"{where}.inputs[{j}]")]
           for j, i in enumerate(_list(d["inputs"], f"{where}.inputs"))]
    attrs = _dec_attrs(kind, d.get("attrs", {}), f"{where}.attrs")
    if "dtype" in d:
        attrs["dtype"] = _str(d["dtype"], f"{where}.dtype")
    return graph.add_op(kind, ins, attrs)


def _map_list(v: Any, where: str) -> tuple:
    return tuple(_opt_int(x, f"{where}[{i}]") for i, x in enumerate(_list(v, where)))


def _dec_block(d: dict, kernel_tensors: list[Tensor], where: str) -> BlockGraph:
    _obj(d, where, ("grid", "forloop", "ops", "savers"))
    grid = tuple(_int(g, f"{where}.grid[{i}]") for i, g in enumerate(_list(d["grid"], f"{where}.grid")))
    block = BlockGraph(grid, _int(d["forloop"], f"{where}.forloop"))
    for j, od in enumerate(_list(d["ops"], f"{where}.ops")):
        w = f"{where}.ops[{j}]"
        kind = _str(_obj(od, w, ("op",), ("inputs", "attrs", "dtype", "source", "imap", "fmap"))["op"], f"{w}.op")
        if kind == "iterator":
            _obj(od, w, ("op", "source", "imap", "fmap"))
            src = kernel_tensors[_index(od["source"], len(kernel_tensors), f"{w}.source")]
            block.input(src, _map_list(od["imap"], f"{w}.imap"), _opt_int(od["fmap"], f"{w}.fmap"))
        elif kind == "accum":
            _obj(od, w, ("op", "inputs"), ("attrs",))
            ins = _list(od["inputs"], f"{w}.inputs")
            attrs = _obj(od.get("attrs", {}), f"{w}.attrs", (), ("monoid",))
            monoid = _str(attrs.get("monoid", SUM), f"{w}.attrs.monoid")
            if monoid not in ACCUM_MONOIDS:
                raise _bad(f"{w}.attrs.monoid", f"unknown accumulator {short(monoid, 30)}; one of {', '.join(ACCUM_MONOIDS)}")
            want = 2 if monoid == RESCALED else 1
            if len(ins) != want:
                raise _bad(f"{w}.inputs", f"a {monoid} accumulator takes {want} input(s), got {len(ins)}")
            tiles = [block.tensors[_index(x, len(block.tensors), f"{w}.inputs[{i}]")] for i, x in enumerate(ins)]
            if monoid == RUNNING_MAX:
                block.accum_max(tiles[0])
            else:
                block.accum(tiles[0], tiles[1] if monoid == RESCALED else None)
        else:
            _dec_op(block, od, block.tensors, w)
    for j, sv in enumerate(_list(d["savers"], f"{where}.savers")):
        w = f"{where}.savers[{j}]"
        _obj(sv, w, ("tensor", "omap"))
        block.output(block.tensors[_index(sv["tensor"], len(block.tensors), f"{w}.tensor")],
                     _map_list(sv["omap"], f"{w}.omap"))
    return block


def graph_from_json(d: dict) -> KernelGraph:
    """Rebuild a graph from :func:`graph_to_json`'s document, checking every field
    (see above) and every validity rule; a :class:`SerializationError` names the
    place in the document."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise SerializationError("not a mugraph document (missing \"format\": \"mugraph\")")
    if d.get("version") != VERSION:
        raise SerializationError(f"unsupported mugraph format version {short(d.get('version'), 30)}; "
                                 f"this build reads {VERSION}")
    kinds = {"Program": Program, "KernelGraph": KernelGraph}
    if d.get("kind") not in kinds:
        raise SerializationError(f"unknown document kind {short(d.get('kind'), 30)}; expected one of {sorted(kinds)}")
    _obj(d, "document", ("format", "version", "kind", "ops", "outputs"), ("name",))
    where = "document"
    try:
        g = kinds[d["kind"]](_str(d.get("name", "graph"), "name"))
        for i, od in enumerate(_list(d["ops"], "ops")):
            where = f"ops[{i}]"
            kind = _str(_obj(od, where, ("op",), ("inputs", "attrs", "dtype", "name", "shape", "block", "fill"))["op"],
                        f"{where}.op")
            if kind == "input":
                _obj(od, where, ("op", "name", "shape", "dtype"), ("fill",))
                g.input(_str(od["name"], f"{where}.name"), _list(od["shape"], f"{where}.shape"),
                        _str(od["dtype"], f"{where}.dtype"),
                        fill_from_json(od["fill"], f"{where}.fill") if "fill" in od else None)
            elif kind == "graph_defined":
                _obj(od, where, ("op", "block"))
                g.kernel(_dec_block(od["block"], g.tensors, f"{where}.block"))
            else:
                _dec_op(g, od, g.tensors, where)
        where = "outputs"
        for j, i in enumerate(_list(d["outputs"], "outputs")):
            g.output(g.tensors[_index(i, len(g.tensors), f"outputs[{j}]")])
    except SerializationError:
        raise
    except MugraphError as e:
        raise SerializationError(f"invalid graph in document: {where}: {e}") from None
    return g


def save(graph: KernelGraph, path: str | Path) -> Path:
    """Write a Program or μGraph as versioned JSON.

    The write is atomic (a unique temporary file renamed into place); the folder
    must exist. (``mg.save`` also writes ``superoptimize`` results.)"""
    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"save: cannot save a {type(graph).__name__}; save a Program or KernelGraph")
    return write_text_atomic(path, json.dumps(graph_to_json(graph), indent=1), "save")


def load(path: str | Path) -> KernelGraph:
    """Read what :func:`save` wrote: a Program or a KernelGraph.

    The file is read within :mod:`mugraph.core.limits` (size, nesting, number length)
    and rebuilt through the builder; nothing in it is executed. (``mg.load`` also
    reads ``superoptimize`` results.)"""
    path = as_path(path, "load")
    return graph_from_document(read_json(path, "load"), path)


def graph_from_document(doc: Any, path: Path) -> KernelGraph:
    """:func:`graph_from_json` of a document read from ``path`` (named in errors)."""
    if isinstance(doc, dict) and doc.get("kind") == "Optimized":
        raise SerializationError(f"{path}: a saved superoptimize result, not a graph; read it with mg.load")
    try:
        return graph_from_json(doc)
    except SerializationError as e:
        raise SerializationError(f"{path}: {e}") from None
