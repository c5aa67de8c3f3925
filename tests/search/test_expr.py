"""Abstract expressions: canonical text, normalization (the table's coverage: tests/mugraph/test_catalog.py)."""

import mugraph as mg
from mugraph.core.benchmarks import program
from search import expr as ex


def test_normalization_and_text():
    x, w = ex.var("X"), ex.var("W")
    assert ex.reduce("sum", 1, x) == x
    assert ex.reduce("sum", 4, ex.reduce("sum", 16, x)) == ex.reduce("sum", 64, x)
    assert ex.mul(x, w) == ex.mul(w, x)
    assert ex.text(ex.mul(x, w)) == "mul(W,X)"
    assert ex.text(ex.reduce("sum", 64, ex.mul(x, w))) == "sum(64,mul(W,X))"


def test_program_expressions():
    p = program("rmsnorm_matmul")
    (e,) = ex.output_exprs(p)
    assert ex.text(e) == "sum(4096,mul(W,div(mul(G,X),sqrt(sum(4096,mul(X,X))))))"
    p = program("lora")
    assert ex.text(ex.output_exprs(p)[0]) == "add(sum(16,mul(B,sum(256,mul(A,X)))),sum(256,mul(W,X)))"


def test_concat_matmul_pushes_into_parts():
    kg = mg.KernelGraph("c")
    X = kg.input("X", (4, 8)); A = kg.input("A", (8, 2)); W = kg.input("W", (8, 6)); B = kg.input("B", (2, 6))
    y = mg.matmul(mg.concat([X, mg.matmul(X, A)], 1), mg.concat([W, B], 0))
    kg.output(y)
    p = mg.Program("p")
    X2 = p.input("X", (4, 8)); A2 = p.input("A", (8, 2)); W2 = p.input("W", (8, 6)); B2 = p.input("B", (2, 6))
    p.output(X2 @ W2 + (X2 @ A2) @ B2)
    assert ex.output_exprs(kg) == ex.output_exprs(p)
