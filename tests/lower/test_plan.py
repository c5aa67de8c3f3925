"""Lowering as plan → render: ``lower.plan.plan`` makes every decision once; the code
generator, the cost model, the shared-memory estimate and the tuner read the plan."""

from __future__ import annotations

import ast
import pathlib

import pytest

import lower
import lower.plan as plan_mod
import mugraph as mg
from lower import cost_model
from lower.codegen import DevArg, generate
from lower.config import KernelConfig, KernelConfigError
from lower.emit import EMITTERS
from lower.emit.reduce import TL_REDUCE
from lower.plan import plan
from lower.testing import random_graph
from mugraph.core.benchmarks import reference
from mugraph.core.errors import MugraphError, UnsupportedOpError

LOWER = pathlib.Path(lower.__file__).parent


def _block_op(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


def _args(op):
    def arg(t):
        st, acc = [], 1
        for s in reversed(t.shape):
            st.insert(0, acc)
            acc *= s
        return DevArg(t.label(), t.shape, tuple(st), t.dtype)

    return [arg(t) for t in op.inputs], [arg(t) for t in op.outputs]


def _calls(name: str) -> list[str]:
    """``module:line`` of every call of a function named ``name`` in lower/ (definitions aside)."""
    out = []
    for f in sorted(LOWER.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if called == name:
                    out.append(f"{f.relative_to(LOWER)}:{node.lineno}")
    return out


def test_tiles_and_schedule_are_computed_in_the_plan_only():
    assert [c.split(":")[0] for c in _calls("analyze")] == ["plan.py"]
    assert [c.split(":")[0] for c in _calls("schedule_block")] == ["plan.py"]


def test_one_analysis_per_kernel_and_config(monkeypatch):
    """Rendering a kernel, or costing a two-kernel graph, plans each kernel once."""
    counts = {"analyze": 0, "schedule_block": 0}
    for name in counts:
        real = getattr(plan_mod, name)

        def counted(*a, _real=real, _name=name, **kw):
            counts[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(plan_mod, name, counted)
    g = reference("rmsnorm_matmul", small=True)
    op = _block_op(g)
    generate(op.attrs["block"], "k", *_args(op), KernelConfig(split=2, combine="last", stage_all_loads=True))
    assert counts == {"analyze": 1, "schedule_block": 1}
    gqa = reference("gqa", small=True)
    counts.update(analyze=0, schedule_block=0)
    cost_model.estimate(gqa)
    assert counts == {"analyze": 2, "schedule_block": 2}


def test_no_module_takes_decisions_from_the_code_generator():
    """Only the runtime (and the digest check, which renders) import the code generator;
    it and the emitters import no analysis from anywhere but the plan."""
    importers = {}
    for f in sorted(LOWER.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("codegen"):
                importers[str(f.relative_to(LOWER))] = sorted(a.name for a in node.names)
    assert set(importers) == {"runtime.py", "digests.py"}
    assert set(importers["runtime.py"]) | set(importers["digests.py"]) <= {
        "BlockKernel", "DevArg", "KernelConfig", "generate"}
    for f in [LOWER / "codegen.py", *(LOWER / "emit").glob("*.py")]:
        taken = {a.name for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom)
                 and (n.module or "").rsplit(".", 1)[-1] in ("tiles", "schedule", "memory", "cost_model")
                 for a in n.names}
        assert taken <= {"TileInfo"}, (f.name, taken)


def test_plan_geometry_and_workspace():
    """rmsnorm_matmul (reduced: 8 column blocks, 64 iterations) split 4 ways with the last
    program of each tile combining, chunk 2, the row class cut in 2: 16 programs per
    split, 16 iterations and 8 generated steps each; the partials of the matmul (64 per
    program) and of Σx² (1), and one counter per output tile."""
    g = reference("rmsnorm_matmul", small=True)
    op = _block_op(g)
    b = op.attrs["block"]
    cfg = KernelConfig(split=4, chunk=2, combine="last", sub=((0, 2),))
    p = plan(b, cfg)
    assert (p.iterations, p.steps, p.programs, p.axes) == (16, 8, 16, [("bx", 8), ("s0", 2)])
    assert [a.kind for a in p.accumulators] == ["accum", "accum"]
    assert p.buffers("k") == {"k_part0": 4 * 16 * 64 * 4, "k_part1": 4 * 16 * 1 * 4}
    assert p.locks("k") == {"k_lock": 16} and plan(b, KernelConfig(split=4)).locks("k") == {}
    k = generate(b, "k", *_args(op), cfg)
    assert k.buffers == p.buffers("k") and k.locks == p.locks("k")
    assert [(ln.fn, ln.grid) for ln in k.launches] == [("k", 64)]
    k2 = generate(b, "k", *_args(op), KernelConfig(split=4))
    assert [(ln.fn, ln.grid) for ln in k2.launches] == [("k_partial", 32), ("k_combine", 8)]


def test_scratch_is_sized_by_the_plan():
    """Random μGraphs with concat/reshape/repeat: every op the emitter stages was planned
    (the emitter refuses one that was not), and the workspace is the plan's."""
    hit = 0
    for seed in range(60):
        g = random_graph(seed)
        for op in g.ops:
            if op.kind != "graph_defined":
                continue
            p = plan(op.attrs["block"])
            k = generate(op.attrs["block"], "k", *_args(op))
            assert k.buffers == p.buffers("k")
            if p.staged:
                hit += 1
                assert f"scratch = scratch_ptr + pid * {p.scratch}" in k.source
                assert k.source.count("tl.store(scratch") >= len(p.staged)
    assert hit >= 3


def test_bad_configs_are_one_line_errors_naming_the_kernel():
    g = reference("rmsnorm_matmul", small=True)
    op = _block_op(g)
    for cfg, words in ((KernelConfig(split=3), "split 3 must divide forloop 64"),
                       (KernelConfig(sub=((1, 2),)), "cannot be split")):
        with pytest.raises(KernelConfigError, match=words) as e:
            generate(op.attrs["block"], "rms_k3", *_args(op), cfg)
        assert isinstance(e.value, MugraphError) and isinstance(e.value, ValueError)
        assert str(e.value).startswith("rms_k3: ") and "\n" not in str(e.value)
        with pytest.raises(KernelConfigError, match=f"rmsnorm_matmul k{op.id}: .*{words}"):
            cost_model.estimate(g, configs={op.id: cfg})
    # what no block can take is refused when the config is made, naming the field
    for kw, words in (({"combine": "first"}, "combine='first': must be one of"),
                      ({"small_mm": "x"}, "small_mm='x': must be one of")):
        with pytest.raises(KernelConfigError, match=words) as e:
            KernelConfig(**kw)
        assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_a_reduction_without_a_triton_fold_is_refused_not_computed_as_another(monkeypatch):
    """The reduce emitter folds with the catalog's combine op; one Triton has no
    reduction for is a clear error, never another reduction's result (a ``min`` that
    really folds with ``tl.min``: tests/mugraph/test_catalog.py)."""
    kg = mg.KernelGraph("r")
    X = kg.input("X", (4, 8), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
    bg.output(bg.accum(mg.max(bg.input(X), 1)), omap=(None, None, None))
    (o,) = kg.kernel(bg)
    kg.output(o)
    assert "tl.max(" in generate(bg, "k", *_args(_block_op(kg))).source
    monkeypatch.delitem(TL_REDUCE, "max")
    with pytest.raises(UnsupportedOpError, match="'max'.*no Triton reduction"):
        generate(bg, "k", *_args(_block_op(kg)))


def test_an_op_without_an_emitter_is_refused(monkeypatch):
    kg = mg.KernelGraph("u")
    X = kg.input("X", (4, 8), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
    bg.output(bg.accum(mg.exp(bg.input(X))), omap=(None, None, None))
    (o,) = kg.kernel(bg)
    kg.output(o)
    monkeypatch.delitem(EMITTERS, "exp")
    with pytest.raises(UnsupportedOpError, match="'exp'.*no emitter"):
        generate(bg, "k", *_args(_block_op(kg)))
