"""Finding programs and μGraphs in user files: saved JSON documents, or Python
files that build them (run as scripts; every top-level Program/KernelGraph, or
the return value of a top-level function named in ``name``)."""

from __future__ import annotations

import runpy
from pathlib import Path

from .errors import ArgumentTypeError, MugraphError
from .files import as_path
from .ir import KernelGraph
from .serialize import load


def graphs_in_file(path: str | Path) -> dict[str, KernelGraph]:
    """All graphs a file defines, by name (a JSON file holds exactly one)."""
    path = as_path(path, "graphs_in_file")
    if not path.exists():
        raise MugraphError(f"{path}: no such file")
    if path.is_dir():
        raise MugraphError(f"{path}: is a folder, not a .json or .py file")
    if path.suffix == ".py":
        try:
            ns = runpy.run_path(str(path), run_name="__mugraph_load__")
        except MugraphError:
            raise
        except Exception as e:  # the user's script failed: say where, in one line
            raise MugraphError(f"{path}: running the file failed: {type(e).__name__}: {e}") from None
        found = {k: v for k, v in ns.items() if isinstance(v, KernelGraph)}
        if not found:
            raise MugraphError(f"{path}: defines no top-level mugraph Program or KernelGraph")
        return found
    g = load(path)
    if not isinstance(g, KernelGraph):  # a saved superoptimize result: its program and its best μGraph
        return {g.program.name: g.program, f"{g.graph.name} (best)": g.graph}
    return {g.name: g}


def graph_from_file(path: str | Path, name: str | None = None) -> KernelGraph:
    """The one graph in ``path``, or the one called ``name`` (variable or graph name)."""
    if name is not None and not isinstance(name, str):
        raise ArgumentTypeError(f"graph_from_file: name must be a str, got {type(name).__name__}")
    found = graphs_in_file(path)
    if name is not None:
        for k, g in found.items():
            if name in (k, g.name):
                return g
        raise MugraphError(f"{path}: no graph named {name!r}; it defines {sorted(found)}")
    if len(found) > 1:
        raise MugraphError(f"{path}: defines several graphs {sorted(found)}; pick one with --name")
    return next(iter(found.values()))
