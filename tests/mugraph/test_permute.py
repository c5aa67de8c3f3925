"""The ``permute`` op (``mg.permute`` / ``mg.transpose``): builder checks, JSON, the
float64 reference, the verifier, abstract expressions, lowering (folded into the
strides of the load that reads it) and the search."""

import numpy as np
import pytest
import torch

import lower
import mugraph as mg
import search.expr as ex
import verify
from mugraph.core.serialize import graph_from_json, graph_to_json

R = np.random.default_rng(0)


def rnd(*s):
    return R.standard_normal(s)


# ------------------------------------------------------------------ builder


@pytest.mark.parametrize("build,match", [
    (lambda x: mg.permute(x, (0, 0, 1)), r"permute: dims \(0, 0, 1\) repeat a dim of .*\(2, 3, 4\)"),
    (lambda x: mg.permute(x, (1, 0)), r"permute: dims \(1, 0\) name 2 dims, .* has 3"),
    (lambda x: mg.permute(x, (0, 1, 3)), r"permute: dim 3 out of range"),
    (lambda x: mg.permute(x, (0, 1.0, 2)), r"permute: dims"),
    (lambda x: mg.transpose(x, 0, 5), r"transpose: dim 5 out of range"),
    (lambda x: mg.transpose(x, 0, True), r"transpose: dim True is a bool"),
])
def test_bad_dims_are_one_line_errors(build, match):
    p = mg.Program("p")
    x = p.input("x", (2, 3, 4))
    with pytest.raises(mg.MugraphError, match=match) as e:
        build(x)
    assert "\n" not in str(e.value)


def test_ir_checks_the_permutation():
    p = mg.Program("p")
    x = p.input("x", (2, 3))
    with pytest.raises(mg.ShapeError, match=r"perm \(0, 2\) is not a permutation of the 2 dims"):
        p.add_op("permute", [x], {"perm": (0, 2)})
    with pytest.raises(mg.InvalidGraphError, match="missing attribute"):
        p.add_op("permute", [x], {})


def test_negative_dims_and_shapes():
    p = mg.Program("p")
    x = p.input("x", (2, 3, 4))
    assert mg.transpose(x, -1, -2).shape == (2, 4, 3)
    y = mg.permute(x, (-1, 0, 1))
    assert y.shape == (4, 2, 3) and y.op.attrs["perm"] == (2, 0, 1)


def test_json_round_trip():
    p = mg.Program("p")
    x = p.input("x", (2, 3, 4))
    p.output(mg.permute(x, (2, 0, 1)) * 2)
    q = graph_from_json(graph_to_json(p))
    assert graph_to_json(q) == graph_to_json(p)
    v = {"x": rnd(2, 3, 4)}
    np.testing.assert_allclose(mg.evaluate(q, v)[0], 2 * v["x"].transpose(2, 0, 1))


# ------------------------------------------------------------------ verifier


def _prog(name, shapes, build):
    p = mg.Program(name)
    ins = [p.input(f"x{i}", s) for i, s in enumerate(shapes)]
    p.output(build(*ins))
    return p


def test_verifier_accepts_transpose_identities():
    a = _prog("tt", [(4, 6)], lambda x: mg.transpose(mg.transpose(x, 0, 1), 0, 1) * 3)
    b = _prog("id", [(4, 6)], lambda x: x * 3)
    assert verify.equivalent(a, b, seed=0).equivalent
    c = _prog("abt", [(4, 5), (5, 3)], lambda x, y: mg.transpose(x @ y, 0, 1))
    d = _prog("btat", [(4, 5), (5, 3)], lambda x, y: mg.transpose(y, 0, 1) @ mg.transpose(x, 0, 1))
    assert verify.equivalent(c, d, seed=0).equivalent
    # abstract expressions agree too (the search's pruning sees them as one)
    assert ex.output_exprs(c) == ex.output_exprs(d)


def test_verifier_rejects_a_wrong_permutation():
    a = _prog("p1", [(3, 3, 3)], lambda x: mg.exp(mg.permute(x, (1, 0, 2))))
    b = _prog("p2", [(3, 3, 3)], lambda x: mg.exp(mg.permute(x, (0, 2, 1))))
    assert verify.equivalent(a, b, seed=0).equivalent is False
    c = _prog("t", [(4, 4)], lambda x: mg.transpose(x, 0, 1) @ x)
    d = _prog("n", [(4, 4)], lambda x: x @ x)
    assert verify.equivalent(c, d, seed=0).equivalent is False


def test_abstract_expression_moves_a_concatenated_dim():
    p = mg.Program("p")
    a, b = p.input("a", (2, 3)), p.input("b", (2, 5))
    y = mg.transpose(mg.concat([a, b], 1), 0, 1)
    env = ex.abstract_expr(p)
    t = ex.node(env[y])
    assert t[0] == ex.CAT and t[1] == -2 and [n for n, _ in t[2]] == [3, 5]


# ------------------------------------------------------------------ lowering


def _inputs(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in g.inputs}


def _check(g, ins, tol=1e-4):
    prog = lower.compile(g, device="cpu", poison=True)
    got = prog(**{k: v.float() for k, v in ins.items()})
    (want,) = mg.evaluate(g, ins)
    want = torch.as_tensor(want)
    assert (got.double() - want).abs().max().item() <= tol * max(1.0, want.abs().max().item())
    return prog


def test_program_with_a_transposed_matmul_operand_lowers():
    p = mg.Program("p")
    a, w = p.input("A", (8, 5), "float32"), p.input("W", (8, 3), "float32")
    p.output(mg.transpose(a, 0, 1) @ w)
    _check(p, _inputs(p))


def test_kernel_level_permute_is_read_through_strides():
    """A permute between kernels is a torch view: no copy; the matmul kernel reading it
    loads through the permuted strides (the DevArg says so)."""
    kg = mg.KernelGraph("k")
    a, w = kg.input("A", (8, 6), "float32"), kg.input("W", (8, 4), "float32")
    at = mg.transpose(a, 0, 1)                      # (6, 8), strides (1, 6)
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=2)
    x = bg.input(at, imap=(0, None, None), fmap=1)  # (3, 4) tiles of A^T
    y = bg.input(w, imap=(None, None, None), fmap=0)
    bg.output(bg.accum(x @ y), omap=(0, None, None))
    (out,) = kg.kernel(bg)
    kg.output(out)
    prog = _check(kg, _inputs(kg))
    src = prog.triton_source()
    assert f"reads  {at.label()}: (6, 8) float32 strides (1, 6)" in src
    assert "torch:permute" in src and not any(s.op.kind == "permute" and s.kernel for s in prog.steps)


def test_block_level_permute_folds_into_the_load_or_permutes_registers():
    kg = mg.KernelGraph("b")
    a, w = kg.input("A", (8, 6), "float32"), kg.input("W", (8, 4), "float32")
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=2)
    x = bg.input(a, imap=(1, None, None), fmap=0)    # (4, 3) tiles of A, read only by the permute
    x2 = bg.input(a, imap=(1, None, None), fmap=0)
    y = bg.input(w, imap=(None, None, None), fmap=0)  # (4, 4)
    folded = mg.transpose(x, 0, 1) @ y                # the load reads A^T's tile directly
    reg = mg.transpose(mg.exp(x2 * 0.5), 0, 1) @ y    # a register permute of a computed tile
    bg.output(bg.accum(folded + reg), omap=(0, None, None))
    (out,) = kg.kernel(bg)
    kg.output(out)
    src = _check(kg, _inputs(kg)).triton_source()
    assert src.count("read through strides") == 1 and src.count("tl.permute(") == 1


# ------------------------------------------------------------------ search


def test_search_finds_verified_ugraphs_of_a_program_with_a_transpose():
    """The search places a permute with the program's own permutations, at either level."""
    import search
    from search.config import SearchConfig

    p = mg.Program("tmm")
    x, w = p.input("X", (8, 4)), p.input("W", (8, 4))
    p.output(mg.exp(mg.transpose(x, 0, 1) @ w))
    r = search.run(p, SearchConfig(time_limit=10, executor="serial", max_kernel_ops=1, progress=False))
    assert r.found
    gs = [graph_from_json(f.graph) for f in r.found]
    assert verify.equivalent(p, gs[0], seed=1).equivalent
