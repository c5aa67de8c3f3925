"""Pictures of μGraphs: kernel level, each block graph as a cluster, thread graphs
as nested clusters. :func:`to_dot` needs only the ``graphviz`` Python package;
:func:`render` also needs Graphviz's ``dot`` program (``apt-get install graphviz``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from typing import TYPE_CHECKING

from .errors import ArgumentTypeError, MugraphError, SerializationError
from .files import as_path, write_text_atomic
from .ir import BlockGraph, KernelGraph, Op, Tensor
from .text import _map

if TYPE_CHECKING:  # imported lazily: the IR must load where graphviz is not installed
    import graphviz


def _shape(t: Tensor) -> str:
    return "×".join(map(str, t.shape))


def _block_cluster(dot: "graphviz.Digraph", op: Op, kid: dict[Tensor, str]) -> None:
    block: BlockGraph = op.attrs["block"]
    pre = f"k{op.id}_"
    with dot.subgraph(name=f"cluster_k{op.id}") as c:
        c.attr(label=f"kernel#{op.id}  grid={block.grid}  forloop={block.forloop}", style="rounded,filled",
               fillcolor="#eef3fb", color="#4a6fa5")
        in_tg = {}
        for i, tg in enumerate(block.thread_graphs):
            with c.subgraph(name=f"cluster_k{op.id}_tg{i}") as tc:
                tc.attr(label=f"thread graph {i}", style="dashed,filled", fillcolor="#fdf6e3", color="#b58900")
                for bop in tg.ops:
                    in_tg[bop.id] = tc
        for bop in block.ops:
            t = bop.outputs[0]
            where = in_tg.get(bop.id, c)
            if bop.kind == "iterator":
                label = f"iter imap={_map(bop.attrs['imap'])} fmap={bop.attrs['fmap']}\n{_shape(t)}"
                where.node(pre + str(t.id), label, shape="invhouse", fillcolor="#dbe8d4", style="filled")
                dot.edge(kid[block.sources[bop.attrs["source"]]], pre + str(t.id))
            else:
                shape = "box3d" if bop.kind == "accum" else "box"
                where.node(pre + str(t.id), f"{bop.kind}\n{_shape(t)}", shape=shape,
                           style="filled", fillcolor="#ffffff" if t.acc != 1 else "#f2e6f7")
                for x in bop.inputs:
                    dot.edge(pre + str(x.id), pre + str(t.id))
        for i, sv in enumerate(block.savers):
            c.node(f"{pre}save{i}", f"save omap={_map(sv.omap)}", shape="house", style="filled", fillcolor="#dbe8d4")
            dot.edge(pre + str(sv.tensor.id), f"{pre}save{i}")
            kid[op.outputs[i]] = f"{pre}save{i}"


def to_dot(graph: KernelGraph) -> "graphviz.Digraph":
    """The Graphviz description of ``graph`` (its ``.source`` is DOT text)."""
    import graphviz

    if not isinstance(graph, KernelGraph):
        raise ArgumentTypeError(f"to_dot: expected a Program or KernelGraph, got {type(graph).__name__}")

    dot = graphviz.Digraph(graph.name, graph_attr={"rankdir": "TB", "fontname": "Helvetica"},
                           node_attr={"fontname": "Helvetica", "fontsize": "10"})
    kid: dict[Tensor, str] = {}
    for op in graph.ops:
        if op.kind == "input":
            t = op.outputs[0]
            kid[t] = f"t{t.id}"
            filled = f"\nmade: {t.fill}" if t.fill is not None else ""  # computed in-kernel, never read
            dot.node(kid[t], f"{t.name}\n{_shape(t)} {t.dtype}{filled}", shape="ellipse",
                     style="dashed" if t.fill is not None else "solid")
        elif op.kind == "graph_defined":
            _block_cluster(dot, op, kid)
        else:
            t = op.outputs[0]
            kid[t] = f"t{t.id}"
            dot.node(kid[t], f"{op.kind}\n{_shape(t)}", shape="box")
            for x in op.inputs:
                dot.edge(kid[x], kid[t])
    for i, t in enumerate(graph.outputs):
        dot.node(f"out{i}", f"output {i}\n{_shape(t)}", shape="doublecircle")
        dot.edge(kid[t], f"out{i}")
    return dot


FORMATS = ("png", "svg", "pdf", "dot", "gv")


def render(graph: KernelGraph, path: str | Path) -> Path:
    """Draw ``graph`` to ``path``; the suffix picks the format (.png, .svg, .pdf, .dot).
    The folder must exist; ``.dot`` text is written atomically."""
    path = as_path(path, "render")
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise SerializationError(f"render: {str(path)!r}: the suffix picks the format; use one of "
                                 f"{', '.join('.' + f for f in FORMATS)}")
    if not path.parent.is_dir():
        raise SerializationError(f"render: folder {str(path.parent)!r} does not exist")
    dot = to_dot(graph)
    if fmt in ("dot", "gv"):
        return write_text_atomic(path, dot.source, "render")
    if shutil.which("dot") is None:
        raise MugraphError("render: Graphviz's 'dot' program is not installed (apt-get install graphviz); "
                           "save a .dot file instead")
    out = dot.render(outfile=str(path), format=fmt, cleanup=True)
    return Path(out)
