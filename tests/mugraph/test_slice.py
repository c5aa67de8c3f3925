"""The ``slice`` op (``mg.slice``): builder checks, JSON, the float64 reference, the
field algebra and the verifier, abstract expressions, lowering (a torch view between
kernels, read through the strides from an offset, no copy) and the search."""

import numpy as np
import pytest
import torch

import lower
import mugraph as mg
import search.expr as ex
import verify
from mugraph.core.serialize import graph_from_json, graph_to_json
from verify.field import MIRAGE, FieldAlgebra, FieldInput, random_omega

R = np.random.default_rng(3)


def rnd(*s):
    return R.standard_normal(s)


# ------------------------------------------------------------------ builder and IR


@pytest.mark.parametrize("build,match", [
    (lambda x: mg.slice(x, 1, 2, 2), r"slice: \[2:2:1\] of dim 1 of x \(2, 6, 4\) is not a non-empty window"),
    (lambda x: mg.slice(x, 1, 0, 7), r"slice: \[0:7:1\] of dim 1 of x \(2, 6, 4\) .*0 <= start < end <= 6"),
    (lambda x: mg.slice(x, 2, 0, 4, 0), r"slice: \[0:4:0\] .*step >= 1"),
    (lambda x: mg.slice(x, 3, 0, 1), r"slice: dim 3 out of range for x \(2, 6, 4\)"),
    (lambda x: mg.slice(x, 0, 0.5, 1), r"slice: start: 0.5 is a float, not an int"),
    (lambda x: mg.slice(x, 0, 0, True), r"slice: end: True is a bool, not an int"),
])
def test_bad_windows_are_one_line_errors(build, match):
    p = mg.Program("p")
    x = p.input("x", (2, 6, 4))
    with pytest.raises(mg.MugraphError, match=match) as e:
        build(x)
    assert "\n" not in str(e.value)


def test_ir_checks_the_window_and_the_level():
    p = mg.Program("p")
    x = p.input("x", (2, 6))
    with pytest.raises(mg.ShapeError, match=r"slice \[4:9:1\] of dim 1 is not a non-empty window of \(2, 6\)"):
        p.add_op("slice", [x], {"dim": 1, "start": 4, "end": 9, "step": 1})
    with pytest.raises(mg.ShapeError, match=r"start -1 must be >= 0"):
        p.add_op("slice", [x], {"dim": 1, "start": -1, "end": 2, "step": 1})
    with pytest.raises(mg.InvalidGraphError, match=r"missing attribute\(s\) \['step'\]"):
        p.add_op("slice", [x], {"dim": 1, "start": 0, "end": 2})
    kg = mg.KernelGraph("k")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
    t = bg.input(kg.input("x", (2, 6)))
    with pytest.raises(mg.UnsupportedOpError, match=r"slice .*not available in a BlockGraph"):
        mg.slice(t, 1, 0, 2)


def test_negative_bounds_and_json_round_trip():
    p = mg.Program("p")
    x = p.input("x", (3, 10))
    y = mg.slice(x, -1, -8, -1, 3)
    assert y.shape == (3, 3) and y.op.attrs == {"dim": 1, "start": 2, "end": 9, "step": 3}
    p.output(y * 2)
    q = graph_from_json(graph_to_json(p))
    assert graph_to_json(q) == graph_to_json(p)
    v = {"x": rnd(3, 10)}
    np.testing.assert_allclose(mg.evaluate(q, v)[0], 2 * v["x"][:, 2:9:3], rtol=0, atol=0)


# ------------------------------------------------------------------ field algebra and verifier


def _prog(name, shapes, build):
    p = mg.Program(name)
    ins = [p.input(f"x{i}", s) for i, s in enumerate(shapes)]
    p.output(build(*ins))
    return p


def test_field_algebra_selects_the_residues():
    """Residues of a slice are the slice of the residues (selection is exact in the field),
    for the deferred parts of the verifier as for the direct evaluation."""
    p = _prog("s", [(4, 9)], lambda x: mg.slice(x * 3, 1, 1, 8, 2))
    q = _prog("id", [(4, 9)], lambda x: x * 3)
    for deferred in (False, True):
        alg = FieldAlgebra(MIRAGE, random_omega(MIRAGE, np.random.default_rng(0)), deferred=deferred)
        ins = {"x0": FieldInput(torch.randint(0, MIRAGE.p, (4, 9)), torch.randint(0, MIRAGE.q, (4, 9)))}
        (got,) = mg.evaluate(p, ins, alg)
        (full,) = mg.evaluate(q, ins, alg)
        if deferred:
            got, full = alg.realize([got, full])
        assert len(got) == 2
        for a, b in zip(got, full):
            assert torch.equal(a, b[:, 1:8:2])


def test_verifier_accepts_slice_identities_and_rejects_wrong_windows():
    # a slice commutes with a matmul along the other operand's dim: (X @ W)[:, a:b] = X @ W[:, a:b]
    a = _prog("sw", [(4, 6), (6, 10)], lambda x, w: mg.exp(mg.slice(x @ w, 1, 2, 7)))
    b = _prog("ws", [(4, 6), (6, 10)], lambda x, w: mg.exp(x @ mg.slice(w, 1, 2, 7)))
    assert verify.equivalent(a, b, seed=0).equivalent
    assert ex.output_exprs(a) == ex.output_exprs(b)
    # a window of a concatenation that covers one part is that part
    c = _prog("cat", [(4, 3), (4, 5)], lambda x, y: mg.slice(mg.concat([x, y], 1), 1, 3, 8) * 2)
    d = _prog("part", [(4, 3), (4, 5)], lambda x, y: y * 2)
    assert verify.equivalent(c, d, seed=0).equivalent
    assert ex.output_exprs(c) == ex.output_exprs(d)
    # another window, another step, another dim: not equivalent
    # another window or another step (same shapes): not equivalent
    for wrong in (lambda x, w: mg.exp(x @ mg.slice(w, 1, 3, 8)), lambda x, w: mg.exp(x @ mg.slice(w, 1, 1, 6)),
                  lambda x, w: mg.exp(mg.slice(x @ w, 1, 0, 10, 2))):
        e = _prog("wrong", [(4, 6), (6, 10)], wrong)
        assert verify.equivalent(a, e, seed=0).equivalent is False
    f = _prog("step", [(4, 9)], lambda x: mg.slice(x, 1, 0, 9, 2))
    g = _prog("step2", [(4, 9)], lambda x: mg.slice(x, 1, 1, 9, 2))
    assert verify.equivalent(f, _prog("same", [(4, 9)], lambda x: mg.slice(x, 1, 0, 9, 2)), seed=0).equivalent
    with pytest.raises(mg.InputError, match="shape"):  # 5 vs 4 elements: refused before any test
        verify.equivalent(f, g, seed=0)


def test_abstract_expression_of_a_window_of_a_concat():
    p = mg.Program("p")
    a, b, c = p.input("a", (2, 3)), p.input("b", (2, 5)), p.input("c", (2, 4))
    cat = mg.concat([a, b, c], 1)
    env_of = lambda y: ex.node(ex.abstract_expr(p)[y])  # noqa: E731
    two = mg.slice(cat, 1, 3, 12)
    t = env_of(two)
    assert t[0] == ex.CAT and [n for n, _ in t[2]] == [5, 4]
    assert env_of(mg.slice(cat, 1, 2, 6))[0] == ex.TOP_KIND      # cuts a part: unknown, never pruned on
    assert env_of(mg.slice(cat, 0, 0, 1))[0] == ex.CAT          # along another dim: into every part


# ------------------------------------------------------------------ lowering


def _inputs(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in g.inputs}


def _check(g, ins, tol=1e-4):
    prog = lower.compile(g, device="cpu", poison=True)
    got = prog(**{k: v.float() for k, v in ins.items()})
    got = got if isinstance(got, tuple) else (got,)
    wants = mg.evaluate(g, ins)
    for x, w in zip(got, wants):
        w = torch.as_tensor(w)
        assert (x.double() - w).abs().max().item() <= tol * max(1.0, w.abs().max().item())
    return prog


def test_program_with_slices_lowers():
    p = mg.Program("p")
    x, w = p.input("X", (4, 10), "float32"), p.input("W", (6, 9), "float32")
    p.output(mg.exp(mg.slice(x, 1, 2, 8) @ mg.slice(w, 1, 0, 9, 2)) * 0.5)
    _check(p, _inputs(p))


def test_kernel_level_slice_is_read_in_place():
    """A slice of a kernel input, and of a kernel's output, read by the next kernel: torch
    views from an offset (no copy), the kernels loading through the strides."""
    kg = mg.KernelGraph("k")
    a, w = kg.input("A", (8, 10), "float32"), kg.input("W", (6, 4), "float32")
    av = mg.slice(a, 1, 3, 9)                          # (8, 6): strides (10, 1), offset 3
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=2)
    x = bg.input(av, imap=(0, None, None), fmap=1)
    y = bg.input(w, imap=(None, None, None), fmap=0)
    bg.output(bg.accum(x @ y), omap=(0, None, None))
    (h,) = kg.kernel(bg)                               # (8, 4)
    hv = mg.slice(h, 0, 1, 8, 2)                       # (4, 4): every other row from row 1
    bg2 = mg.BlockGraph(grid=(1, 1, 1), forloop=1)
    z = bg2.input(hv)
    bg2.output(bg2.accum(mg.exp(z * 0.25)))
    (out,) = kg.kernel(bg2)
    kg.output(out)
    prog = _check(kg, _inputs(kg))
    src = prog.triton_source()
    assert f"reads  {av.label()}: (8, 6) float32 strides (10, 1)" in src
    assert f"reads  {hv.label()}: (4, 4) float32 strides (8, 1)" in src
    assert src.count("torch:slice") == 2
    assert not any(s.op.kind == "slice" and s.kernel for s in prog.steps)


def test_a_slice_output_of_the_graph_is_written_out():
    p = mg.Program("o")
    x = p.input("X", (5, 6), "float32")
    p.output(mg.slice(x * 2, 0, 1, 5, 3))
    _check(p, _inputs(p))


# ------------------------------------------------------------------ search


def test_search_finds_verified_ugraphs_of_a_program_with_a_slice():
    """The search places a slice at the kernel level with the program's own window: after
    the kernel (the program's order), and on the weight before it — ``X @ W[:, 8:16]``, the
    kernel reading the window in place and computing only what is kept."""
    import search
    from search.config import SearchConfig

    p = mg.Program("smm")
    x, w = p.input("X", (8, 4)), p.input("W", (4, 24))
    p.output(mg.exp(mg.slice(x @ w, 1, 8, 16)))
    r = search.run(p, SearchConfig(time_limit=40, max_block_ops=3, executor="serial", progress=False))
    assert r.stats["complete"] and r.found
    gs = [graph_from_json(f.graph) for f in r.found]
    firsts = set()
    for g in gs:
        assert verify.equivalent(p, g, seed=1).equivalent
        kops = [op for op in g.ops if op.kind != "input"]
        firsts.add(kops[0].kind)
        for op in kops:
            if op.kind == "graph_defined":
                assert all(b.kind != "slice" for b in op.attrs["block"].ops)
    assert firsts == {"slice", "graph_defined"}
