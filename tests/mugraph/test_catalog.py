"""The op catalog and its facets: every (op, facet) pair has its row, the traits are
consistent, and an op added by one catalog entry plus one row per facet works in
every stage — ``neg`` (element-wise and linear: searched, verified in the field and
lowered), ``tanh`` (element-wise, outside the field's class) and ``min`` (a reduction
whose lowering must fold with min, not max)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np
import pytest
import torch

import lower
import mugraph as mg
import search
import verify
from lower.emit import EMITTERS
from lower.emit.elementwise import unary
from lower.emit.reduce import TL_REDUCE, emit_reduce
from lower.plan import SCRATCH
from lower.testing import check
from lower.torch_ops import TORCH_OPS, TorchOp
from mugraph.core import ops
from mugraph.core.algebra import FLOAT_OPS, FloatAlgebra
from mugraph.core.errors import NotLaxError, UnsupportedOpError
from mugraph.core.ir import graph_ops
from mugraph.core.ops import CATALOG, Attr, Category, CatalogError, OpDef, Padding, Reduction
from search import expr as ex
from search.egraph import SaturatedEGraph, datatype
from search.oracle import SubexprOracle
from search.z3check import Z3Prover
from verify.bound import DEGREE_OPS
from verify.field import FIELD_OPS, unary_row
from verify.floatcheck import MAGNITUDE_OPS


@dataclass(frozen=True)
class Facet:
    """One facet table of one stage: which ops need a row, and under which key."""

    name: str
    where: str
    table: Callable[[], dict]
    applies: Callable[[OpDef], bool] = lambda d: True
    key: Callable[[OpDef], str] = lambda d: d.name


FACETS = [
    Facet("float evaluation", "mugraph/core/algebra.py FLOAT_OPS", lambda: FLOAT_OPS),
    Facet("magnitude evaluation", "verify/floatcheck.py MAGNITUDE_OPS", lambda: MAGNITUDE_OPS),
    Facet("field evaluation", "verify/field.py FIELD_OPS", lambda: FIELD_OPS),
    Facet("degree bound", "verify/bound.py DEGREE_OPS", lambda: DEGREE_OPS),
    Facet("abstract expression", "search/expr.py EXPR_RULES", lambda: ex.EXPR_RULES),
    Facet("Triton emission", "lower/emit/__init__.py EMITTERS", lambda: EMITTERS, lambda d: "B" in d.levels),
    Facet("torch call", "lower/torch_ops.py TORCH_OPS", lambda: TORCH_OPS, lambda d: "K" in d.levels),
    Facet("scratch staging", "lower/plan.py SCRATCH", lambda: SCRATCH,
          lambda d: d.category is Category.REARRANGEMENT),
    Facet("Triton reduction", "lower/emit/reduce.py TL_REDUCE", lambda: TL_REDUCE,
          lambda d: d.reduction is not None, lambda d: d.reduction.combine),
]
FACET = {f.name: f for f in FACETS}


def missing_rows(name: str) -> list[str]:
    """The facets catalog op ``name`` lacks a row in, each named with its table."""
    d = CATALOG[name]
    return [f"op {name!r} has no row in facet {f.name!r} ({f.where}, key {f.key(d)!r})"
            for f in FACETS if f.applies(d) and f.key(d) not in f.table()]


PAIRS = [(n, f.name) for n, d in CATALOG.items() for f in FACETS if f.applies(d)]


@pytest.mark.parametrize("op,facet", PAIRS, ids=[f"{o}-{f.replace(' ', '_')}" for o, f in PAIRS])
def test_every_op_has_a_row_in_every_facet(op, facet):
    f = FACET[facet]
    d = CATALOG[op]
    assert f.key(d) in f.table(), f"op {op!r} has no row in facet {facet!r} ({f.where}, key {f.key(d)!r})"


def test_no_facet_has_rows_for_unknown_ops():
    for f in FACETS[:-1]:
        stale = set(f.table()) - set(CATALOG) - set(ops.STRUCTURAL)
        assert not stale, f"facet {f.name!r} ({f.where}) has rows for ops the catalog lacks: {sorted(stale)}"


def test_the_walk_names_the_missing_pairs():
    """An op registered without its rows is reported pair by pair."""
    with registered(OpDef("bare", Category.UNARY, "none", "no rows anywhere", padding=Padding()), {}):
        got = missing_rows("bare")
    assert len(got) == 7 and all("'bare'" in m for m in got)
    assert any("'Triton emission' (lower/emit/__init__.py EMITTERS" in m for m in got)


# ---------------------------------------------------------------------------- traits


def test_traits_are_consistent():
    for name, d in CATALOG.items():
        assert d.name == name and d.doc and d.lax in ops.LAX_CLASSES
        assert (d.reduction is not None) == (d.category is Category.REDUCTION)
        assert d.arity == {Category.UNARY: 1, Category.BINARY: 2, Category.CONTRACTION: 2, Category.CONSTANT: 0,
                           Category.REDUCTION: 1}.get(d.category, d.arity)
        if d.reduction is not None:  # the identity is the combine's: folding it in changes nothing
            fold = {"add": lambda a, b: a + b, "max": max, "min": min}[d.reduction.combine]
            assert all(fold(d.reduction.identity, x) == x for x in (-3.5, 0.0, 2.0))
    assert {n for n, d in CATALOG.items() if d.exp_like} == {"exp", "silu"}


@pytest.mark.parametrize("bad,why", [
    (dict(name="r", category=Category.REDUCTION, lax="none", doc="d", attrs=(Attr("dim", "dim"),)), "reduction"),
    (dict(name="r", category=Category.REDUCTION, lax="none", doc="d", attrs=(Attr("dim", "dim"),),
          reduction=Reduction("mul", 1.0)), "combine"),
    (dict(name="r", category=Category.REDUCTION, lax="none", doc="d", attrs=(Attr("dim", "dim"),),
          reduction=Reduction("min", -math.inf)), "identity"),
    (dict(name="u", category=Category.UNARY, lax="none", doc="d"), "padding rule"),
    (dict(name="u", category=Category.UNARY, lax="odd", doc="d", padding=Padding()), "Lax class"),
    (dict(name="u", category=Category.UNARY, lax="none", doc="d", padding=Padding(zero="mostly")), "zero"),
    (dict(name="u", category=Category.UNARY, lax="none", doc="d", padding=Padding(),
          attrs=(Attr("k", "complex"),)), "type"),
    (dict(name="c", category=Category.REARRANGEMENT, lax="linear", doc="d"), "arity"),
])
def test_contradicting_traits_are_refused(bad, why):
    with pytest.raises(CatalogError, match=why):
        OpDef(**bad)


def test_a_second_entry_of_one_name_is_refused():
    with pytest.raises(CatalogError, match="already has an op 'exp'"):
        ops.register(CATALOG["exp"])
    with pytest.raises(CatalogError, match="already has an op 'accum'"):
        ops.register(OpDef("accum", Category.UNARY, "none", "d", padding=Padding()))


def test_dim_maps():
    mm = ops.dim_map("matmul", [(2, 3, 4), (4, 5)], {}, (2, 3, 5))
    assert mm.same == ((0, 0, 0), (0, 1, 1), (1, 1, 2)) and mm.contracted == (((0, 2), (1, 0)),)
    add = ops.dim_map("add", [(3, 4), (4,)], {}, (3, 4))
    assert add.same == ((0, 0, 0), (0, 1, 1), (1, 0, 1))
    s = ops.dim_map("sum", [(2, 3)], {"dim": 1}, (2, 1))
    assert s.same == ((0, 0, 0),) and s.reduced == ((0, 1),)
    rep = ops.dim_map("repeat", [(2, 3)], {"reps": (1, 2)}, (2, 6))
    assert rep.same == ((0, 0, 0),) and rep.moved_in == ((0, 1),) and rep.moved_out == (1,)
    assert ops.dim_map("reshape", [(2, 3)], {"shape": (6,)}, (6,)).moved_out == (0,)
    with pytest.raises(UnsupportedOpError, match="unknown op 'nope'"):
        ops.dim_map("nope", [], {}, ())


def test_queries_take_structural_kinds():
    for k in ops.STRUCTURAL:
        assert ops.category(k) is None and ops.reduction(k) is None
        assert not (ops.is_pointwise(k) or ops.is_contraction(k) or ops.adds_up(k) or ops.exp_like(k))
    assert ops.adds_up("sum") and ops.adds_up("matmul") and not ops.adds_up("max")


def test_attributes_are_checked_by_their_schema_type():
    p = mg.Program("a")
    x = p.input("x", (2, 3))
    with pytest.raises(mg.ArgumentTypeError, match="repeat .*reps 5 must be a sequence of ints"):
        p.add_op("repeat", [x], {"reps": 5})
    with pytest.raises(mg.InvalidGraphError, match=r"unknown attribute\(s\) \['dims'\]"):
        p.add_op("sum", [x], {"dims": 1})
    assert p.add_op("scale", [x], {"c": 0.5}).op.attrs["c"] == Fraction(1, 2)
    assert p.add_op("repeat", [x], {"reps": [2, 1]}).shape == (4, 3)


# ---------------------------------------------------------------------------- registering an op


@contextlib.contextmanager
def registered(d: OpDef, rows: dict[str, object]):
    """``d`` in the catalog and ``rows`` (facet name -> row) in their tables, for the
    duration; everything is taken out again afterwards."""
    ops.register(d)
    added = []
    try:
        for facet, row in rows.items():
            f = FACET[facet]
            table, key = f.table(), f.key(d)
            if key not in table:
                table[key] = row
                added.append((table, key))
        yield d
    finally:
        for table, key in added:
            del table[key]
        ops.unregister(d.name)


def _outside_field(name):
    def row(alg, xs, at):
        raise NotLaxError(f"{name}: outside the field's class (no finite-field meaning); compare in floating point")
    return row


NEG = OpDef("neg", Category.UNARY, "linear", "element-wise -x", padding=Padding(zero="keeps"))
NEG_ROWS = {
    "float evaluation": lambda alg, xs, at: -xs[0],
    "magnitude evaluation": lambda alg, xs, at: (-xs[0][0], xs[0][1]),
    "field evaluation": unary_row(lambda x, m: (-x) % m),
    "degree bound": lambda alg, xs, at: xs[0],  # -x has the degree of x
    "abstract expression": ex.OWN,
    "Triton emission": unary(lambda a, op: f"(-{a})"),
    "torch call": TorchOp(lambda x, at, dt, dev: -x[0]),
}

TANH = OpDef("tanh", Category.UNARY, "none", "hyperbolic tangent (not Lax: float comparison only)",
             padding=Padding(zero="keeps"))
TANH_ROWS = {
    "float evaluation": lambda alg, xs, at: torch.tanh(xs[0]),
    "magnitude evaluation": lambda alg, xs, at: (torch.tanh(xs[0][0]), torch.tanh(xs[0][0]).abs() + xs[0][1]),
    "field evaluation": _outside_field("tanh"),
    "degree bound": _outside_field("tanh"),
    "abstract expression": ex.OWN,
    "Triton emission": unary(lambda a, op: f"(2.0 * tl.sigmoid(2.0 * {a}) - 1.0)"),
    "torch call": TorchOp(lambda x, at, dt, dev: torch.tanh(x[0])),
}

MIN = OpDef("min", Category.REDUCTION, "none", "min along dim; dim becomes 1 (not Lax)",
            attrs=(Attr("dim", "dim", "the dim it folds"),), reduction=Reduction("min", math.inf),
            padding=Padding(reads="identity"))
MIN_ROWS = {
    "float evaluation": lambda alg, xs, at: xs[0].amin(dim=at["dim"], keepdim=True),
    "magnitude evaluation": lambda alg, xs, at: (xs[0][0].amin(dim=at["dim"], keepdim=True),
                                                 xs[0][1].amax(dim=at["dim"], keepdim=True)),
    "field evaluation": _outside_field("min"),
    "degree bound": _outside_field("min"),
    "abstract expression": ex.OWN,
    "Triton emission": emit_reduce,
    "torch call": TorchOp(lambda x, at, dt, dev: x[0].amin(dim=at["dim"], keepdim=True)),
}


def neg(x: mg.Tensor) -> mg.Tensor:
    return x.graph.add_op("neg", [x])


def tanh(x: mg.Tensor) -> mg.Tensor:
    """The builder of the worked example (``mugraph/core/builder.py`` would hold it)."""
    return x.graph.add_op("tanh", [x])


def min_(x: mg.Tensor, dim: int) -> mg.Tensor:
    return x.graph.add_op("min", [x], {"dim": dim % x.ndim})


@pytest.fixture
def neg_op():
    with registered(NEG, NEG_ROWS) as d:
        yield d


@pytest.fixture
def tanh_op():
    with registered(TANH, TANH_ROWS) as d:
        yield d


@pytest.fixture
def min_op():
    with registered(MIN, MIN_ROWS) as d:
        yield d


def _tanh_mm(M=24, K=40, N=20, grid=2, loop=4):
    """``tanh(X) @ W`` as a program and as a μGraph: a grid over X's rows, a loop over
    K, tiles (12, 10) @ (10, 20) padded to powers of two (and to 16 for ``tl.dot``)."""
    p = mg.Program("tanh_mm")
    X, W = p.input("X", (M, K), "float32"), p.input("W", (K, N), "float32")
    p.output(tanh(X) @ W)
    g = mg.KernelGraph("tanh_mm")
    X2, W2 = g.input("X", (M, K), "float32"), g.input("W", (K, N), "float32")
    b = mg.BlockGraph(grid=(grid, 1, 1), forloop=loop)
    x = b.input(X2, imap=(0, None, None), fmap=1)
    w = b.input(W2, imap=(None, None, None), fmap=0)
    b.output(b.accum(tanh(x) @ w), omap=(0, None, None))
    (y,) = g.kernel(b)
    g.output(y)
    return p, g


def _inputs(graph, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=gen, dtype=torch.float32) for t in graph.inputs}


def test_neg_is_searched_verified_and_lowered(neg_op):
    """A Lax op added by its entry and rows goes through the whole pipeline: the search
    finds single-kernel μGraphs of ``neg(X) @ W`` and the field test verifies them,
    the verifier tells ``neg(X) @ W`` from ``X @ W``, and the found μGraph lowers."""
    assert missing_rows("neg") == []
    p = mg.Program("negmm")
    X, W = p.input("X", (8, 64), "float32"), p.input("W", (64, 32), "float32")
    p.output(neg(X) @ W)
    mg.check_lax(p)
    r = search.run(p, search.SearchConfig(max_kernel_ops=1, max_block_ops=4, tile_sizes=(16,),
                                          forloop_ranges=(4,), executor="serial", verify_error=1e-3,
                                          progress=False))
    assert r.graphs and all(g.num_kernels == 1 for g in r.graphs) and r.stats["search"]["verified"] >= 1
    g = r.graphs[0]
    assert any(op.kind == "neg" for op, _ in graph_ops(g))
    assert verify.equivalent(p, g).equivalent
    q = mg.Program("mm")
    q.output(q.input("X", (8, 64), "float32") @ q.input("W", (64, 32), "float32"))
    v = verify.equivalent(p, q)
    assert not v.equivalent and v.method == "field"
    ins = _inputs(p)
    assert max(check(lower.compile(g, device="cpu", poison=True), g, ins)) <= 1e-4
    assert "(-" in lower.compile(g, device="cpu").triton_source()


def test_added_ops_serialize_render_and_cost(tanh_op, min_op):
    """The IR core's generic parts need no row: JSON round trip (attributes decoded by
    the schema), text form, and the cost model."""
    from lower.cost_model import estimate
    from mugraph.core.serialize import graph_from_json, graph_to_json

    p = mg.Program("m")
    X = p.input("X", (4, 6), "float32")
    p.output(min_(tanh(X), 1))
    back = graph_from_json(graph_to_json(p))
    assert [op.kind for op in back.ops] == ["input", "tanh", "min"] and back.ops[2].attrs == {"dim": 1}
    assert "min(t1) dim=1" in str(p)
    _, g = _tanh_mm()
    assert str(graph_from_json(graph_to_json(g))) == str(g)
    assert estimate(g) > 0 and estimate(p) > 0


def test_tanh_has_every_row(tanh_op):
    assert missing_rows("tanh") == []


def test_tanh_evaluates_and_lowers(tanh_op):
    p, g = _tanh_mm()
    ins = _inputs(p)
    (ref,) = mg.evaluate(p, {k: v.double() for k, v in ins.items()})
    np.testing.assert_allclose(ref, np.tanh(ins["X"].double().numpy()) @ ins["W"].double().numpy(), rtol=1e-12)
    (blk,) = mg.evaluate(g, {k: v.double() for k, v in ins.items()})
    np.testing.assert_allclose(blk, ref, rtol=1e-12)
    for graph in (g, p):   # the μGraph through Triton (interpreter), the program through torch
        prog = lower.compile(graph, device="cpu", poison=True)
        assert max(check(prog, graph, ins)) <= 1e-4
    assert "tl.sigmoid(2.0 *" in lower.compile(g, device="cpu").triton_source()


def test_tanh_in_the_verifier(tanh_op):
    p, g = _tanh_mm()
    with pytest.raises(NotLaxError, match="'tanh' is outside the Lax fragment"):
        verify.equivalent(p, g)
    v = verify.equivalent(p, g, non_lax="float", seed=1)
    assert v.method == "float-only" and v.float_check.passed
    from verify.field import MIRAGE, FieldAlgebra
    with pytest.raises(NotLaxError, match="tanh: outside the field's class"):
        FieldAlgebra(MIRAGE, 3).apply("tanh", [(np.ones(2, np.int64), np.ones(2, np.int64))], {})


def test_tanh_in_the_search(tanh_op):
    """E(tanh(X)) is the generated symbol ``tanh``: the e-graph's datatype and Z3's
    signatures include it, and both accept it as a subexpression of the program."""
    p, _ = _tanh_mm(M=4, K=8, N=4)
    targets = ex.output_exprs(p)
    X, W = ex.var("X"), ex.var("W")
    t = ex.unary("tanh", X)
    assert ex.text(targets[0]) == "sum(8,mul(W,tanh(X)))"
    assert "(Tanh E)" in datatype()
    oracle = SubexprOracle(targets)
    assert oracle.saturated and oracle.is_sub(t) and oracle.is_sub(ex.reduce("sum", 2, ex.mul(t, W)))
    assert not oracle.is_sub(ex.unary("tanh", W)) and not oracle.is_sub(ex.mul(X, W))
    assert Z3Prover(timeout_ms=2000).proves_sub(t, targets[0])
    assert SaturatedEGraph(targets).lookup(t) is not None


def test_min_lowers_with_its_own_fold(min_op):
    """min over a dim padded from 10 to 16: the padding must read +inf; neither zero
    padding nor a max fold would give these numbers (positive inputs)."""
    g = mg.KernelGraph("rowmin")
    X = g.input("X", (24, 10), "float32")
    b = mg.BlockGraph(grid=(2, 1, 1), forloop=1)
    x = b.input(X, imap=(0, None, None))
    b.output(b.accum(min_(x, 1)), omap=(0, None, None))
    (y,) = g.kernel(b)
    g.output(y)
    ins = {"X": torch.rand(24, 10, generator=torch.Generator().manual_seed(0)) + 1.0}
    prog = lower.compile(g, device="cpu", poison=True)
    got = prog(ins["X"])
    torch.testing.assert_close(got, ins["X"].amin(dim=1, keepdim=True), rtol=0, atol=0)
    src = prog.triton_source()
    assert "tl.min(" in src and "float('inf')" in src and "tl.max(" not in src


def test_min_refused_where_triton_has_no_fold(min_op, monkeypatch):
    monkeypatch.delitem(TL_REDUCE, "min")
    g = mg.KernelGraph("rowmin")
    X = g.input("X", (16, 16), "float32")
    b = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
    b.output(b.accum(min_(b.input(X), 1)))
    (y,) = g.kernel(b)
    g.output(y)
    with pytest.raises(UnsupportedOpError, match="'min'.*no Triton reduction"):
        lower.compile(g, device="cpu")


def test_min_in_the_other_stages(min_op):
    p = mg.Program("m")
    X = p.input("X", (4, 6), "float32")
    p.output(min_(X, 1))
    x = torch.randn(4, 6)
    (ref,) = mg.evaluate(p, {"X": x.double()})
    np.testing.assert_allclose(ref, x.double().amin(1, keepdim=True).numpy())
    assert ex.text(ex.output_exprs(p)[0]) == "min(6,X)"
    assert ex.Symbol("min", 1, True) in ex.symbols() and "(Min i64 E)" in datatype()
    with pytest.raises(NotLaxError, match="'min' is outside the Lax fragment"):
        mg.check_lax(p)
    prog = lower.compile(p, device="cpu")
    torch.testing.assert_close(prog(x), x.amin(1, keepdim=True))
    assert isinstance(FloatAlgebra().apply("min", [x.double()], {"dim": 0}), torch.Tensor)


# ---------------------------------------------------------------------------- no names in the stages

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
#: the random μGraph generators choose ops by name and model each one's numeric range
#: (which inputs keep exp finite, sqrt real): per-op knowledge of a test generator
GENERATORS = {"verify/fuzz.py", "lower/testing.py", "mugraph/core/randgraph.py"}


def _op_name_comparisons(path) -> list[str]:
    """``==``/``!=``/``in`` comparisons of a catalog op name in a module, as
    ``file:line``; a comparison against a Lax class or a combine op (``.lax``,
    ``.combine``, ``lax_classes(...)``), whose names some ops share, is not one."""
    import ast

    tree = ast.parse(path.read_text())
    names = set(CATALOG)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(isinstance(s, ast.Attribute) and s.attr in ("lax", "combine") for s in sides) or any(
                isinstance(s, ast.Call) and getattr(s.func, "id", None) == "lax_classes" for s in sides):
            continue
        consts = set()
        for s in sides:
            elts = s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s]
            consts |= {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if consts & names:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} compares {sorted(consts & names)}")
    return out


def test_stages_read_traits_not_op_names():
    """No module of the packages tests an op's name to learn its category: they ask
    the catalog (``ops.reduction(kind)``, ``ops.is_contraction(kind)``, …)."""
    found = []
    for pkg in ("mugraph", "search", "verify", "lower"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if str(path.relative_to(ROOT)) not in GENERATORS:
                found += _op_name_comparisons(path)
    assert not found, "op names compared instead of catalog traits: " + "; ".join(found)
