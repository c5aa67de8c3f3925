"""The readable text form of programs and μGraphs (``str(graph)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the IR's classes print themselves through this module
    from .ir import BlockGraph, KernelGraph, Op, Tensor


def _map(m) -> str:
    return "(" + ", ".join("-" if d is None else str(d) for d in m) + ")"


def _attrs(op: Op) -> str:
    parts = []
    for k, v in op.attrs.items():
        if k in ("block", "source", "name"):
            continue
        if k in ("imap", "omap"):
            v = _map(v)
        parts.append(f"{k}={v}")
    return (" " + " ".join(parts)) if parts else ""


def _t(t: Tensor) -> str:
    return f"{t.label()}: {t.shape} {t.dtype}"


def format_block(block: BlockGraph, indent: str = "  ") -> list[str]:
    lines = [f"{indent}block grid={block.grid} forloop={block.forloop}"]
    sources = block.sources
    tg_of = {op.id: i for i, tg in enumerate(block.thread_graphs) for op in tg.ops}
    for op in block.ops:
        out = op.outputs[0]
        phase = ("post" if out.acc == 1 else "const" if out.acc is None
                 else "invariant" if block.loop_invariant(out) and block.forloop > 1 else "loop")
        tg = f"  [thread graph {tg_of[op.id]}]" if op.id in tg_of else ""
        if op.kind == "iterator":
            src = sources[op.attrs["source"]].label()
            rhs = f"iterator {src} imap={_map(op.attrs['imap'])} fmap={op.attrs['fmap']}"
        else:
            rhs = f"{op.kind}({', '.join(t.label() for t in op.inputs)}){_attrs(op)}"
        lines.append(f"{indent}  {_t(out)} = {rhs}   # {phase}{tg}")
    for i, sv in enumerate(block.savers):
        lines.append(f"{indent}  save {i}: {sv.tensor.label()} omap={_map(sv.omap)} -> {sv.shape}")
    return lines


def format_graph(graph: KernelGraph) -> str:
    kind = type(graph).__name__
    lines = [f"{kind} {graph.name}"]
    for op in graph.ops:
        outs = ", ".join(_t(t) for t in op.outputs)
        if op.kind == "input":
            fill = op.attrs.get("fill")
            lines.append(f"  {outs} = input {op.attrs['name']!r}" + (f" filled {fill}" if fill is not None else ""))
        elif op.kind == "graph_defined":
            lines.append(f"  {outs} = kernel#{op.id}({', '.join(t.label() for t in op.inputs)})")
            lines.extend(format_block(op.attrs["block"], "    "))
        else:
            lines.append(f"  {outs} = {op.kind}({', '.join(t.label() for t in op.inputs)}){_attrs(op)}")
    lines.append(f"  outputs: {', '.join(t.label() for t in graph.outputs)}")
    return "\n".join(lines)


def kernel_structure(graph: KernelGraph) -> str:
    """A μGraph's kernels in order: ``blocks×loop`` per graph-defined kernel (``lib`` for a
    pre-defined op) — what split-loop changes (a split-KV pair: many blocks × a short loop,
    then a combining kernel looping over the chunks), e.g. ``32x4 + 8x16``."""
    out = []
    for op in graph.ops:
        if op.kind == "graph_defined":
            b = op.attrs["block"]
            out.append(f"{b.num_blocks}x{b.forloop}")
        elif op.kind != "input":
            out.append("lib")
    return " + ".join(out)


__all__ = ["format_graph", "format_block", "kernel_structure"]
