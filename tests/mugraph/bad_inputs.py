"""The bad-input table: every public entry of mugraph misused, one row per kind.

Each row is (category, name, a call that misuses an API, the error class expected,
a substring the one-line message must contain). ``test_bad_inputs.py`` runs every
row; ``python tests/mugraph/bad_inputs.py`` measures the README's table: for each
category, how many kinds got the expected one-line ``MugraphError``, another
``MugraphError``, a raw exception (a traceback), or were silently accepted.

Error classes are named by string, so the same table can be measured against a
build that lacks some of them. CLI rows run the command in-process (click's test
runner) and expect exactly one line on stderr, ``error: …``, and a non-zero exit.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import mugraph as mg


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    fn: Callable[[], Any]
    err: str          # class name in mugraph.core.errors, or "cli"
    msg: str          # substring of the one-line message


CASES: list[Case] = []


def case(category: str, name: str, err: str, msg: str):
    def add(fn):
        CASES.append(Case(category, name, fn, err, msg))
        return fn
    return add


def row(category: str, name: str, fn: Callable[[], Any], err: str, msg: str) -> None:
    CASES.append(Case(category, name, fn, err, msg))


# ------------------------------------------------------------------ shared objects

_WORK: list[Path] = []


def work() -> Path:
    """A scratch folder for file rows (removed at exit)."""
    if not _WORK:
        _WORK.append(Path(tempfile.mkdtemp(prefix="mugraph-bad-inputs-")))
        atexit.register(shutil.rmtree, _WORK[0], True)
    return _WORK[0]


def prog(dtype="float16"):
    """x (4, 8), w (8, 4) -> exp(x @ w): the small program most rows misuse."""
    p = mg.Program("p")
    x = p.input("x", (4, 8), dtype)
    w = p.input("w", (8, 4), dtype)
    y = mg.exp(x @ w)
    p.output(y)
    return p, x, w, y


def kg_block(shape=(8, 64), grid=(1, 1, 1), forloop=1):
    kg = mg.KernelGraph("k")
    X = kg.input("X", shape)
    return kg, X, mg.BlockGraph(grid=grid, forloop=forloop)


def x_():
    return prog()[1]


def ins(p, **over):
    rng = np.random.default_rng(0)
    d = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
    d.update(over)
    return d


_COMPILED: list = []


def compiled():
    """The small program lowered for the CPU (pre-defined ops only: compiles at once)."""
    if not _COMPILED:
        import lower

        p = prog()[0]
        _COMPILED.append((p, lower.compile(p, device="cpu")))
    return _COMPILED[0]


def targs(**over):
    p, _ = compiled()
    d = {t.name: torch.randn(t.shape, dtype=torch.float16) for t in p.inputs}
    d.update(over)
    return d


SMALL_SEARCH = {"workers": 1, "time_limit": 20, "max_kernel_ops": 1, "max_block_ops": 3, "tile_sizes": [16],
                "forloop_ranges": [4], "max_results": 1}


def tiny():
    p = mg.Program("tiny")
    x = p.input("x", (8, 16), "float32")
    w = p.input("w", (16, 16), "float32")
    p.output(mg.exp(x @ w))
    return p


def sopt(config=None, **kw):
    """superoptimize the tiny program with a small search (a build that validates late
    still finishes in seconds)."""
    if isinstance(config, dict) and isinstance(config.get("search"), dict):
        config = {**config, "search": {**SMALL_SEARCH, **config["search"]}}
    elif config is None:
        config = {"search": dict(SMALL_SEARCH)}
    return mg.superoptimize(kw.pop("program", None) or tiny(), config,
                            **{"device": "cpu", "cache_dir": False, "progress": False, **kw})


def doc_of(g) -> dict:
    return json.loads(json.dumps(mg.core.serialize.graph_to_json(g)))


def load_doc(doc: Any, name="doc.json"):
    path = work() / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return mg.load(path)


def edited(build, edit) -> Callable[[], Any]:
    """A row that saves ``build()``, edits its JSON with ``edit(doc)`` and loads it."""
    def fn():
        doc = doc_of(build())
        edit(doc)
        return load_doc(doc)
    return fn


def _set(path: str, value):
    """``edit`` that sets doc[path] (path like 'ops.1.inputs.0')."""
    def edit(doc):
        *head, last = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
        d = doc
        for k in head:
            d = d[k]
        d[last] = value
    return edit


def ref_lora():
    from mugraph.core.benchmarks import reference

    return reference("lora", small=True)


# ================================================================== builder

B = "builder"
for fn_name in ("exp", "sqrt", "square", "silu"):
    for bad, label in (([1, 2], "list"), (3.0, "float"), (None, "NoneType")):
        row(B, f"{fn_name}({label})", (lambda f=fn_name, b=bad: getattr(mg, f)(b)), "ArgumentTypeError",
            f"{fn_name}: expected a mugraph Tensor, got {label}")
row(B, "sum(x, True)", lambda: mg.sum(x_(), True), "ArgumentTypeError", "dim True is a bool")
row(B, "sum(x, 1.0)", lambda: mg.sum(x_(), 1.0), "ArgumentTypeError", "dim 1.0 is a float")
row(B, "sum(x, '0')", lambda: mg.sum(x_(), "0"), "ArgumentTypeError", "dim '0' is a str")
row(B, "sum dim out of range", lambda: mg.sum(x_(), 2), "ShapeError", "sum: dim 2 out of range")
row(B, "sum dim -3", lambda: mg.sum(x_(), -3), "ShapeError", "dim -3 out of range")
row(B, "max(x, None)", lambda: mg.max(x_(), None), "ArgumentTypeError", "dim None")
row(B, "mean dim 5", lambda: mg.mean(x_(), 5), "ShapeError", "mean: dim 5")
row(B, "rms_norm dim 2.5", lambda: mg.rms_norm(x_(), 2.5), "ArgumentTypeError", "rms_norm: dim 2.5")
row(B, "matmul(x, 2)", lambda: mg.matmul(x_(), 2), "ArgumentTypeError", "matmul: b: expected a mugraph Tensor")
row(B, "matmul(array, w)", lambda: mg.matmul(np.ones((4, 8)), prog()[2]), "ArgumentTypeError", "matmul: a")
row(B, "x @ 2", lambda: x_() @ 2, "ArgumentTypeError", "matmul")
row(B, "matmul inner dims", lambda: (lambda x: x @ x)(x_()), "ShapeError", "inner dims differ")
row(B, "matmul rank 1", lambda: (lambda p: p.input("v", (8,)) @ p.input("w", (8, 2)))(mg.Program("p")),
    "ShapeError", "rank >= 2")
row(B, "x + 'a'", lambda: x_() + "a", "ArgumentTypeError", "got Tensor, str")
row(B, "x + True", lambda: x_() + True, "ArgumentTypeError", "got Tensor, bool")
row(B, "x * 1j", lambda: x_() * 1j, "ArgumentTypeError", "complex")
row(B, "x * nan", lambda: x_() * float("nan"), "ConstantError", "not finite")
row(B, "x + inf", lambda: x_() + float("inf"), "ConstantError", "not finite")
row(B, "x / 0", lambda: x_() / 0, "ConstantError", "divided by the constant 0")
row(B, "x / 0.0", lambda: x_() / 0.0, "ConstantError", "divided by the constant 0")
row(B, "x * 10**500", lambda: x_() * Fraction(10**500), "ConstantError", "digits > 400")
row(B, "x * 1/10**500", lambda: x_() * Fraction(1, 10**500), "ConstantError", "denominator has")
row(B, "scale(x, '2')", lambda: mg.scale(x_(), "2"), "ConstantError", "'2' (str) is not a real scalar")
row(B, "scale(x, None)", lambda: mg.scale(x_(), None), "ConstantError", "None")
row(B, "scale(5, 2)", lambda: mg.scale(5, 2), "ArgumentTypeError", "scale: expected a mugraph Tensor")
row(B, "constant(1, like=3)", lambda: mg.constant(1, 3), "ArgumentTypeError", "const: like")
row(B, "constant(nan)", lambda: mg.constant(float("nan"), x_()), "ConstantError", "not finite")
row(B, "sub(1, 2)", lambda: mg.sub(1, 2), "ArgumentTypeError", "needs at least one mugraph Tensor")
row(B, "concat([])", lambda: mg.concat([], 0), "ArgumentTypeError", "non-empty list of Tensors")
row(B, "concat(x)", lambda: mg.concat(x_(), 0), "ArgumentTypeError", "concat")
row(B, "concat([x, 3])", lambda: mg.concat([x_(), 3], 0), "ArgumentTypeError", "concat: xs[1]")
row(B, "concat shapes", lambda: (lambda p: mg.concat([p.input("a", (2, 3)), p.input("b", (3, 3))], 1))(
    mg.Program("p")), "ShapeError", "differ outside dim 1")
row(B, "concat dim 1.0", lambda: (lambda x: mg.concat([x, x], 1.0))(x_()), "ArgumentTypeError", "dim 1.0")
row(B, "reshape dim 2.7", lambda: mg.reshape(x_(), (2.7, 8)), "ArgumentTypeError", "2.7 is a float")
row(B, "reshape dim '8'", lambda: mg.reshape(x_(), ("8", 4)), "ArgumentTypeError", "'8' is a str")
row(B, "reshape(x, 32)", lambda: mg.reshape(x_(), 32), "ArgumentTypeError", "must be a sequence of ints")
row(B, "reshape numel", lambda: mg.reshape(x_(), (5, 7)), "ShapeError", "cannot reshape (4, 8)")
row(B, "reshape -1", lambda: mg.reshape(x_(), (-1, 8)), "ShapeError", "has a dim < 1")
row(B, "repeat rank", lambda: mg.repeat(x_(), (2,)), "ShapeError", "one positive count per dim")
row(B, "repeat 0", lambda: mg.repeat(x_(), (0, 1)), "ShapeError", "one positive count per dim")
row(B, "repeat True", lambda: mg.repeat(x_(), (True, 1)), "ArgumentTypeError", "True is a bool")
row(B, "x ** 2", lambda: x_() ** 2, "UnsupportedOpError", "x ** 2 is not a mugraph op")
row(B, "2 ** x", lambda: 2 ** x_(), "UnsupportedOpError", "2 ** x")
row(B, "abs(x)", lambda: abs(x_()), "UnsupportedOpError", "abs(x)")
row(B, "x[0]", lambda: x_()[0], "UnsupportedOpError", "x[0]")
row(B, "list(x)", lambda: list(x_()), "UnsupportedOpError", "not indexed or iterated")
row(B, "x < y", lambda: x_() < x_(), "UnsupportedOpError", "comparison")
row(B, "bool(x)", lambda: bool(x_()), "ArgumentTypeError", "no truth value")
row(B, "array + x", lambda: np.ones((4, 8)) + x_(), "ArgumentTypeError", "ndarray")
row(B, "x + array", lambda: x_() + np.ones((4, 8)), "ArgumentTypeError", "ndarray")
row(B, "tensors of two graphs", lambda: x_() + x_(), "InvalidGraphError", "belongs to another graph")
row(B, "dtypes differ", lambda: (lambda p: p.input("a", (2, 2), "float16") + p.input("b", (2, 2), "float32"))(
    mg.Program("p")), "DTypeError", "different dtypes ['float16', 'float32']")
row(B, "broadcast", lambda: (lambda p: p.input("a", (2, 3)) + p.input("b", (4, 3)))(mg.Program("p")),
    "ShapeError", "(2, 3) and (4, 3) do not broadcast")
row(B, "add_op unknown op", lambda: (lambda p, x, *_: p.add_op("softmax", [x]))(*prog()), "UnsupportedOpError",
    "unknown op 'softmax'")
row(B, "add_op misspelt attr", lambda: (lambda p, x, *_: p.add_op("sum", [x], {"dims": 1}))(*prog()),
    "InvalidGraphError", "unknown attribute(s) ['dims']")
row(B, "add_op missing attr", lambda: (lambda p, x, *_: p.add_op("sum", [x]))(*prog()), "InvalidGraphError",
    "missing attribute(s) ['dim']")
row(B, "add_op inputs not a list", lambda: (lambda p, x, *_: p.add_op("sum", x, {"dim": 1}))(*prog()),
    "ArgumentTypeError", "inputs must be a list")
row(B, "add_op kind 3", lambda: (lambda p, x, *_: p.add_op(3, [x]))(*prog()), "ArgumentTypeError",
    "op kind must be a str")
row(B, "add_op attrs list", lambda: (lambda p, x, *_: p.add_op("sum", [x], [1]))(*prog()), "ArgumentTypeError",
    "attrs must be a dict")
row(B, "const dtype int8", lambda: prog()[0].add_op("const", [], {"value": 1, "shape": (1, 1), "dtype": "int8"}),
    "DTypeError", "unknown dtype 'int8'")
row(B, "dtype attr on scale", lambda: (lambda p, x, *_: p.add_op("scale", [x], {"c": 2, "dtype": "float32"}))(
    *prog()), "InvalidGraphError", "unknown attribute(s) ['dtype']")
row(B, "exp of two inputs", lambda: (lambda p, x, *_: p.add_op("exp", [x, x]))(*prog()), "ShapeError",
    "takes 1 inputs, got 2")
row(B, "check_lax('p')", lambda: mg.check_lax("p"), "ArgumentTypeError", "check_lax: expected a Program")


@case(B, "second exp on a path", "NotLaxError", "second exponentiation")
def _():
    p, x, w, y = prog()
    p.output(mg.exp(mg.sum(y, 1)))
    mg.check_lax(p)


@case(B, "exp of a sum of exps is not Lax", "NotLaxError", "second exponentiation")
def _():
    p, x, *_ = prog()
    p.output(mg.exp(mg.sum(mg.exp(x), 1)))
    mg.check_lax(p)


# ================================================================== μGraph construction

G = "μGraph construction"
row(G, "Program(None)", lambda: mg.Program(None), "ArgumentTypeError", "name must be a str")
row(G, "Program('')", lambda: mg.Program(""), "InvalidGraphError", "1 to 128 printable characters")
row(G, "Program('a\\nb')", lambda: mg.Program("a\nb"), "InvalidGraphError", "printable characters")
row(G, "Program(200 chars)", lambda: mg.Program("x" * 200), "InvalidGraphError", "1 to 128")
row(G, "KernelGraph(3)", lambda: mg.KernelGraph(3), "ArgumentTypeError", "KernelGraph: the name must be a str")
for shape, msg in [((2.7, 3), "dim 0 is 2.7 (float), not an int"), (("8", 3), "dim 0 is '8' (str)"),
                   ((True, 3), "dim 0 is True (bool)"), ((8.0, 3), "dim 0 is 8.0"), (8, "is not a sequence"),
                   ("83", "is not a sequence"), ({8, 3}, "is not a sequence"), ((), "has 0 dims"),
                   ((1, 2, 3, 4, 5), "has 5 dims"), ((0, 3), "has a dim < 1"), ((-2, 3), "has a dim < 1"),
                   (None, "not a sequence"), (([2], 3), "dim 0 is [2]")]:
    row(G, f"input shape {shape!r}", (lambda s=shape: mg.Program("p").input("x", s)), "ShapeError", msg)
row(G, "input dtype int8", lambda: mg.Program("p").input("x", (2,), "int8"), "DTypeError", "unknown dtype 'int8'")
row(G, "input dtype list", lambda: mg.Program("p").input("x", (2,), ["float16"]), "DTypeError", "unknown dtype")
row(G, "input dtype None", lambda: mg.Program("p").input("x", (2,), None), "DTypeError", "unknown dtype None")
row(G, "input name '1x'", lambda: mg.Program("p").input("1x", (2,)), "InvalidGraphError", "Python identifiers")
row(G, "input name keyword", lambda: mg.Program("p").input("lambda", (2,)), "InvalidGraphError", "not keywords")
row(G, "input name 5", lambda: mg.Program("p").input(5, (2,)), "InvalidGraphError", "Python identifiers")
row(G, "input name 200 chars", lambda: mg.Program("p").input("a" * 200, (2,)), "InvalidGraphError",
    "at most 128 characters")
row(G, "duplicate input", lambda: (lambda p: (p.input("a", (2,)), p.input("a", (3,))))(mg.Program("p")),
    "InvalidGraphError", "an input of that name already exists")
row(G, "output(3)", lambda: mg.Program("p").output(3), "ArgumentTypeError", "output: expected a mugraph Tensor")
row(G, "output an input", lambda: (lambda p, x, *_: p.output(x))(*prog()), "InvalidGraphError", "is an input")
row(G, "output twice", lambda: (lambda p, x, w, y: p.output(y))(*prog()), "InvalidGraphError",
    "already an output")
row(G, "Program.kernel", lambda: mg.Program("p").kernel(mg.BlockGraph()), "InvalidGraphError",
    "a Program holds pre-defined ops only")
row(G, "kernel('bg')", lambda: mg.KernelGraph("k").kernel("bg"), "ArgumentTypeError", "expected a BlockGraph")
row(G, "kernel without saver", lambda: (lambda kg, X, bg: (bg.input(X), kg.kernel(bg)))(*kg_block()),
    "InvalidGraphError", "block graph has no output saver")


def _saved_block(smem=None, reg=None):
    kg, X, bg = kg_block()
    bg.output(bg.accum(bg.input(X)))
    kw = {k: v for k, v in (("smem_budget", smem), ("register_budget", reg)) if v is not None}
    return kg.kernel(bg, **kw)


row(G, "smem_budget -1", lambda: _saved_block(smem=-1), "InvalidGraphError", "smem_budget=-1 must be a positive")
row(G, "smem_budget 1.5", lambda: _saved_block(smem=1.5), "ArgumentTypeError", "smem_budget: 1.5 is a float")
row(G, "register_budget '8'", lambda: _saved_block(reg="8"), "ArgumentTypeError", "register_budget")


@case(G, "shared memory over budget", "ResourceError", "bytes of shared memory")
def _():
    kg = mg.KernelGraph("k")
    W = kg.input("W", (4096, 4096))
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=1)
    w = bg.input(W, imap=(1,))
    bg.output(bg.accum(mg.sum(w, 0)), omap=(1,))
    kg.kernel(bg)


@case(G, "registers over budget", "ResourceError", "in registers")
def _():
    kg, X, bg = kg_block((64, 64))
    x = bg.input(X)
    bg.output(bg.accum(mg.sum(mg.exp(mg.exp(x) * 2), 1)))
    kg.kernel(bg, register_budget=1024)


@case(G, "iterator over another graph's tensor", "InvalidGraphError", "belongs to another graph")
def _():
    kg, X, bg = kg_block()
    bg.output(bg.accum(bg.input(X)))
    mg.KernelGraph("other").kernel(bg)


for grid, msg in [(None, "grid None"), (4, "grid 4"), ((2.0, 1, 1), "grid (2.0, 1, 1)"), ((0, 1, 1), "grid (0, 1, 1)"),
                  ((1, 1, 1, 1), "grid (1, 1, 1, 1)"), ((True,), "grid (True,)"), ("2", "grid '2'"),
                  ((2**16, 2**16, 1), "blocks > 2147483647")]:
    row(G, f"BlockGraph(grid={grid!r})", (lambda g=grid: mg.BlockGraph(grid=g)), "InvalidGraphError", msg)
for loop in (0, -1, 2.0, True, "4", None):
    row(G, f"BlockGraph(forloop={loop!r})", (lambda f=loop: mg.BlockGraph(forloop=f)), "InvalidGraphError",
        f"forloop {loop!r}: must be a positive int")
row(G, "iterator over an array", lambda: mg.BlockGraph().input(np.ones(3)), "InvalidGraphError",
    "source must be a tensor of a kernel graph")
row(G, "iterator over a tile", lambda: (lambda kg, X, bg: bg.input(bg.input(X)))(*kg_block()), "InvalidGraphError",
    "source must be a tensor of a kernel graph")
for imap, msg in [({"w": 0}, "unknown grid axis key(s) 'w'"), ("01", "must be a tuple of dims"),
                  (0, "must be a tuple of dims"), ((0.0,), "entries must be dims"), ((True,), "entries must be dims"),
                  ((0, 1, 0, 1), "more than 3 entries"), ((-1,), "dim -1 out of range"), ((5,), "dim 5 out of range"),
                  ((1,), "is not divisible by grid axis x = 8")]:
    row(G, f"imap {imap!r}", (lambda m=imap: (lambda kg, X, bg: bg.input(X, imap=m))(
        *kg_block((8, 60), grid=(8, 1, 1)))), "InvalidGraphError", msg)
row(G, "imap same dim twice", lambda: (lambda kg, X, bg: bg.input(X, imap=(0, 0)))(*kg_block(grid=(2, 2, 1))),
    "InvalidGraphError", "grid axes x and y both map to dim 0")
row(G, "imap on a size-1 axis", lambda: (lambda kg, X, bg: bg.input(X, imap=(0,)))(*kg_block()),
    "InvalidGraphError", "grid axis x has size 1 and must map to None")
for fmap, msg in [(True, "fmap True must be a dim"), (1.0, "fmap 1.0 must be a dim"), (-1, "fmap -1 out of range"),
                  (2, "fmap 2 out of range"), ("1", "fmap '1'")]:
    row(G, f"fmap {fmap!r}", (lambda f=fmap: (lambda kg, X, bg: bg.input(X, fmap=f))(*kg_block(forloop=4))),
        "InvalidGraphError", msg)
row(G, "fmap without a loop", lambda: (lambda kg, X, bg: bg.input(X, fmap=1))(*kg_block()), "InvalidGraphError",
    "forloop is 1, so fmap must be None")
row(G, "fmap not divisible", lambda: (lambda kg, X, bg: bg.input(X, fmap=1))(*kg_block(forloop=3)),
    "InvalidGraphError", "not divisible by forloop 3")
row(G, "build_thread_graphs(kernel graph)", lambda: mg.build_thread_graphs(prog()[0]), "ArgumentTypeError",
    "expected a BlockGraph, got Program")
row(G, "accum('x')", lambda: mg.BlockGraph().accum("x"), "ArgumentTypeError", "expected a mugraph Tensor")


@case(G, "two accumulators on a path", "InvalidGraphError", "already downstream of an accumulator")
def _():
    kg, X, bg = kg_block(forloop=2)
    bg.accum(bg.accum(bg.input(X, fmap=1)) * 2)


@case(G, "loop tile mixed with post-loop tile", "InvalidGraphError", "mixes loop-body tiles")
def _():
    kg, X, bg = kg_block(forloop=2)
    x = bg.input(X, fmap=1)
    x + bg.accum(x)


@case(G, "saver without accumulator", "InvalidGraphError", "has no accumulator on its path")
def _():
    kg, X, bg = kg_block()
    bg.output(mg.exp(bg.input(X)))


def _omap(omap, grid=(2, 4, 1)):
    kg, X, bg = kg_block(grid=grid)
    x = bg.input(X, imap=(0, 1) if grid[1] > 1 else (0,))
    bg.output(bg.accum(x), omap=omap)


for omap, msg in [((0, None), "grid axis y (size 4) is missing"), ({"q": 1}, "unknown grid axis key(s) 'q'"),
                  ((1, 1), "both map to dim 1"), ((5, 1), "dim 5 out of range"), ((0, 1, 0), "axis z has size 1"),
                  ("01", "must be a tuple of dims"), ((0.0, 1), "entries must be dims")]:
    row(G, f"omap {omap!r}", (lambda m=omap: _omap(m)), "InvalidGraphError", msg)
row(G, "output('x')", lambda: mg.BlockGraph().output("x"), "ArgumentTypeError", "expected a mugraph Tensor")


@case(G, "block reused after attaching", "InvalidGraphError", "already attached to a kernel")
def _():
    kg, X, bg = kg_block()
    bg.output(bg.accum(bg.input(X)))
    kg.kernel(bg)
    bg.input(X)


# ================================================================== evaluate

E = "evaluate"
row(E, "graph 'p'", lambda: mg.evaluate("p", {}), "ArgumentTypeError", "expected a Program or KernelGraph")
row(E, "inputs as a list", lambda: (lambda p: mg.evaluate(p, list(ins(p).values())))(prog()[0]),
    "ArgumentTypeError", "inputs must be a dict")
row(E, "inputs None", lambda: mg.evaluate(prog()[0], None), "ArgumentTypeError", "inputs must be a dict")
row(E, "value a nested list", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.ones((4, 8)).tolist())))(prog()[0]),
    "InputError", "input 'x' is a list, not an array")
row(E, "value a float", lambda: (lambda p: mg.evaluate(p, ins(p, x=3.0)))(prog()[0]), "InputError",
    "input 'x' is a float, not an array")
row(E, "string array", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.full((4, 8), "a"))))(prog()[0]),
    "InputError", "is not real numbers (strings)")
row(E, "complex array", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.ones((4, 8)) * 1j)))(prog()[0]),
    "InputError", "imaginary part would be lost")
row(E, "bool array", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.ones((4, 8), bool))))(prog()[0]),
    "InputError", "numpy dtype bool")
row(E, "object array", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.full((4, 8), None))))(prog()[0]),
    "InputError", "Python objects")
row(E, "complex tensor", lambda: (lambda p: mg.evaluate(p, ins(p, x=torch.ones(4, 8, dtype=torch.complex64))))(
    prog()[0]), "InputError", "torch dtype torch.complex64")
row(E, "bool tensor", lambda: (lambda p: mg.evaluate(p, ins(p, x=torch.ones(4, 8, dtype=torch.bool))))(prog()[0]),
    "InputError", "torch dtype torch.bool")
row(E, "meta tensor", lambda: (lambda p: mg.evaluate(p, ins(p, x=torch.ones(4, 8, device="meta"))))(prog()[0]),
    "InputError", "on meta")
row(E, "sparse tensor", lambda: (lambda p: mg.evaluate(p, ins(p, x=torch.ones(4, 8).to_sparse())))(prog()[0]),
    "InputError", "torch.sparse_coo")
row(E, "missing input", lambda: (lambda p: mg.evaluate(p, {"x": np.ones((4, 8))}))(prog()[0]), "InputError",
    "missing ['w']")
row(E, "unexpected input", lambda: (lambda p: mg.evaluate(p, ins(p, z=np.ones(2))))(prog()[0]), "InputError",
    "unexpected ['z']")
row(E, "input keyed by position", lambda: (lambda p: mg.evaluate(p, {0: np.ones((4, 8)), 1: np.ones((8, 4))}))(
    prog()[0]), "InputError", "missing ['x', 'w']")
row(E, "wrong shape", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.ones((4, 7)))))(prog()[0]), "InputError",
    "input 'x' has shape (4, 7), expected (4, 8)")
row(E, "transposed", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.ones((8, 4)))))(prog()[0]), "InputError",
    "has shape (8, 4)")
row(E, "0-d array", lambda: (lambda p: mg.evaluate(p, ins(p, x=np.float64(1))))(prog()[0]), "InputError",
    "has shape ()")
row(E, "algebra 'float16'", lambda: (lambda p: mg.evaluate(p, ins(p), "float16"))(prog()[0]), "ArgumentTypeError",
    "algebra must be a mugraph Algebra")
row(E, "FloatAlgebra('float8')", lambda: mg.FloatAlgebra("float8"), "InputError", "unknown dtype 'float8'")
row(E, "FloatAlgebra(16)", lambda: mg.FloatAlgebra(16), "InputError", "unknown dtype 16")
row(E, "max_elements 0", lambda: (lambda p: mg.evaluate(p, ins(p), max_elements=0))(prog()[0]),
    "ArgumentTypeError", "max_elements=0")
row(E, "max_elements True", lambda: (lambda p: mg.evaluate(p, ins(p), max_elements=True))(prog()[0]),
    "ArgumentTypeError", "max_elements=True")

# ================================================================== superoptimize configs

S = "superoptimize config"
row(S, "program 'gated_mlp'", lambda: mg.superoptimize("gated_mlp"), "ArgumentTypeError",
    "expected a mugraph Program")
row(S, "config a list", lambda: sopt([1]), "ArgumentTypeError", "config must be an OptimizeConfig, a dict or None")
row(S, "config 'fast'", lambda: sopt("fast"), "ArgumentTypeError", "got str")
row(S, "unknown key 'serch'", lambda: sopt({"serch": {}}), "ConfigError", "unknown key 'serch'; did you mean 'search'")
row(S, "search field at top level", lambda: sopt({"workers": 1}), "ConfigError", "it is a search field")
row(S, "search a str", lambda: sopt({"search": "fast"}), "ConfigError", "search='fast'")
for search, msg in [
        ({"max_blok_ops": 3}, "unknown key 'max_blok_ops'; did you mean 'max_block_ops'"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"time_limit": "10"}, "search.time_limit='10': must be a number of seconds > 0"),
        ({"time_limit": -5}, "search.time_limit=-5"), ({"time_limit": 0}, "search.time_limit=0"),
        ({"time_limit": float("nan")}, "search.time_limit=nan"), ({"time_limit": float("inf")}, "time_limit=inf"),
        ({"time_limit": True}, "time_limit=True"),
        ({"max_block_ops": -1}, "search.max_block_ops=-1: must be a positive int"),
        ({"max_block_ops": 0}, "search.max_block_ops=0"), ({"max_block_ops": 2.5}, "max_block_ops=2.5"),
        ({"max_block_ops": True}, "max_block_ops=True"), ({"max_kernel_ops": "2"}, "max_kernel_ops='2'"),
        ({"workers": 0}, "search.workers=0"), ({"workers": -2}, "search.workers=-2"),
        ({"tile_sizes": [0]}, "tile_sizes=[0]"), ({"tile_sizes": "16"}, "tile_sizes='16'"),
        ({"tile_sizes": []}, "tile_sizes=[]: must be a non-empty"), ({"forloop_ranges": [4.0]}, "forloop_ranges"),
        ({"forloop_ranges": []}, "search.forloop_ranges=[]"), ({"kernel_ops": ["softmax"]}, "kernel_ops"),
        ({"block_ops": "exp"}, "block_ops='exp'"), ({"max_grid_axes": 4}, "max_grid_axes=4: must be 1, 2 or 3"),
        ({"min_blocks": 8, "max_blocks": 2}, "min_blocks=8 > max_blocks=2"),
        ({"compose_share": 1.5}, "compose_share=1.5"), ({"distribute": "all"}, "distribute='all'"),
        ({"prune_labels": "yes"}, "prune_labels='yes': must be True or False"),
        ({"max_results": 0}, "max_results=0"), ({"egraph_time_limit": 0}, "egraph_time_limit=0"),
        ({"verify_reserve": -1}, "verify_reserve=-1"), ({"checkpoint": 5}, "checkpoint=5"),
        ({"seed": 3}, "search.seed: set by superoptimize itself; pass superoptimize(seed=...)"),
        ({"verify_error": 0.1}, "pass OptimizeConfig(error=...)"), ({"progress": False}, "search.progress")]:
    row(S, f"search {search!r}"[:60], (lambda s=search: sopt({"search": s})), "ConfigError", msg)
for cfg, msg in [({"error": 0}, "error=0: the false-accept bound must lie in (0, 1)"), ({"error": 1.5}, "error=1.5"),
                 ({"error": "1e-9"}, "error='1e-9'"), ({"error": True}, "error=True"),
                 ({"top_k": 0}, "top_k=0: must be a positive int"), ({"top_k": 2.5}, "top_k=2.5"),
                 ({"float_dtypes": ("int8",)}, "'int8' is not a dtype the float check runs"),
                 ({"float_dtypes": "float16"}, "float_dtypes='float16': must be None or a non-empty tuple"),
                 ({"float_dtypes": ()}, "float_dtypes=()"), ({"float_dtypes": (16,)}, "16 is not a dtype"),
                 ({"keep_program": "no"}, "keep_program='no'"), ({"tune_s": 0}, "tune_s=0: must be None or"),
                 ({"tune_s": "30"}, "tune_s='30'")]:
    row(S, f"config {cfg!r}", (lambda c=cfg: sopt({**c, "search": {}})), "ConfigError", msg)
row(S, "OptimizeConfig(top_k=-1)", lambda: mg.OptimizeConfig(top_k=-1), "ConfigError", "top_k=-1")
row(S, "OptimizeConfig(search workers 0)", lambda: mg.OptimizeConfig(search={"workers": 0}), "ConfigError",
    "search.workers=0")
row(S, "device 'tpu'", lambda: sopt(device="tpu"), "ConfigError", "device='tpu': use 'auto', 'cuda' or 'cpu'")
row(S, "device None", lambda: sopt(device=None), "ConfigError", "device=None")
row(S, "seed -1", lambda: sopt(seed=-1), "ConfigError", "seed=-1 must be an int >= 0")
row(S, "seed 1.5", lambda: sopt(seed=1.5), "ConfigError", "seed=1.5")
row(S, "seed True", lambda: sopt(seed=True), "ConfigError", "seed=True")
row(S, "progress 'yes'", lambda: sopt(progress="yes"), "ArgumentTypeError", "progress='yes' must be True or False")
row(S, "cache_dir 3", lambda: sopt(cache_dir=3), "ArgumentTypeError", "cache_dir=3 must be a folder path")
row(S, "cache_dir ''", lambda: sopt(cache_dir=""), "ArgumentTypeError", "cache_dir: expected a file path")
row(S, "no outputs", lambda: sopt(program=(lambda p: (p.input("x", (2, 2)), p)[1])(mg.Program("e"))),
    "ConfigError", "has no outputs")
row(S, "graph-defined kernels", lambda: sopt(program=ref_lora()), "ConfigError", "already holds graph-defined kernels")
row(S, "not Lax", lambda: sopt(program=(lambda p: (p.output(mg.exp(mg.exp(p.input("x", (4, 4))))), p)[1])(
    mg.Program("t"))), "NotLaxError", "second exponentiation")
row(S, "SearchConfig(time_limit='10')", lambda: __import__("search").SearchConfig(time_limit="10"), "ConfigError",
    "SearchConfig.time_limit='10'")
row(S, "SearchConfig(workers=0)", lambda: __import__("search").SearchConfig(workers=0), "ConfigError",
    "SearchConfig.workers=0")
row(S, "SearchConfig.from_json unknown key", lambda: __import__("search").SearchConfig.from_json({"bogus": 1}),
    "ConfigError", "unknown key 'bogus'")
row(S, "SearchConfig.from_json list", lambda: __import__("search").SearchConfig.from_json([1]), "ConfigError",
    "expected an object")

# ================================================================== compiled-program calls

C = "compiled-program call"


def call(*args, **kw):
    return compiled()[1](*args, **kw)


row(C, "too many positional", lambda: call(*targs().values(), torch.ones(1)), "InputError", "got 3 positional")
row(C, "missing input", lambda: call(torch.ones(4, 8, dtype=torch.float16)), "InputError", "missing inputs ['w']")
row(C, "unexpected keyword", lambda: call(**targs(z=torch.ones(1))), "InputError", "unexpected input 'z'")
row(C, "given twice", lambda: call(targs()["x"], **targs()), "InputError", "input 'x' given twice")
row(C, "numpy array", lambda: call(**targs(x=np.ones((4, 8), np.float16))), "InputError",
    "input 'x' must be a torch.Tensor, got ndarray")
row(C, "list", lambda: call(**targs(x=[[1.0] * 8] * 4)), "InputError", "got list")
row(C, "None", lambda: call(**targs(x=None)), "InputError", "got NoneType")
row(C, "wrong shape", lambda: call(**targs(x=torch.ones(4, 7, dtype=torch.float16))), "InputError",
    "input 'x' has shape (4, 7), expected (4, 8)")
row(C, "transposed", lambda: call(**targs(x=torch.ones(8, 4, dtype=torch.float16))), "InputError", "(8, 4)")
row(C, "batch dim added", lambda: call(**targs(x=torch.ones(1, 4, 8, dtype=torch.float16))), "InputError",
    "(1, 4, 8)")
row(C, "float32 for float16", lambda: call(**targs(x=torch.ones(4, 8))), "InputError",
    "dtype torch.float32, expected torch.float16")
row(C, "float64", lambda: call(**targs(x=torch.ones(4, 8, dtype=torch.float64))), "InputError", "torch.float64")
row(C, "int tensor", lambda: call(**targs(x=torch.ones(4, 8, dtype=torch.int32))), "InputError", "torch.int32")
row(C, "complex tensor", lambda: call(**targs(x=torch.ones(4, 8, dtype=torch.complex64))), "InputError",
    "complex64")
row(C, "meta device", lambda: call(**targs(x=torch.ones(4, 8, dtype=torch.float16, device="meta"))), "InputError",
    "is on meta")
row(C, "sparse tensor", lambda: call(**targs(x=torch.ones(4, 8, dtype=torch.float16).to_sparse())), "InputError",
    "sparse_coo tensor")
row(C, "out= a tensor", lambda: call(**targs(), out=torch.empty(4, 4, dtype=torch.float16)), "InputError",
    "out= takes a list")
row(C, "out= 5", lambda: call(**targs(), out=5), "InputError", "out= must be a list")
row(C, "out= wrong shape", lambda: call(**targs(), out=[torch.empty(4, 5, dtype=torch.float16)]), "InputError",
    "out[0] must be a contiguous (4, 4) float16")
row(C, "out= wrong dtype", lambda: call(**targs(), out=[torch.empty(4, 4)]), "InputError", "out[0]")
row(C, "out= not contiguous", lambda: call(**targs(), out=[torch.empty(4, 4, dtype=torch.float16).t()]),
    "InputError", "contiguous")
row(C, "out= two tensors", lambda: call(**targs(), out=[torch.empty(4, 4, dtype=torch.float16)] * 2), "InputError",
    "out= needs 1 tensors, got 2")
row(C, "launcher wrong shape", lambda: compiled()[1].launcher(**targs(w=torch.ones(4, 4, dtype=torch.float16))),
    "InputError", "input 'w' has shape (4, 4)")

# ================================================================== lowering: configs and tuning

L = "lowering"


def looped():
    """A one-kernel μGraph (op 1, a loop of 4 iterations) for the lowering's own entries."""
    kg = mg.KernelGraph("looped")
    X = kg.input("X", (8, 64))
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=4)
    bg.output(bg.accum(bg.input(X, imap={}, fmap=1)))
    kg.output(kg.kernel(bg)[0])
    return kg


def lcompile(configs):
    import lower

    return lower.compile(looped(), device="cpu", configs=configs)


def kcfg(**kw):
    import lower

    return lower.KernelConfig(**kw)


def klabel(label):
    import lower

    return lower.KernelConfig.from_label(label)


def ltune(**kw):
    from lower.profile import tune

    return tune(looped(), **{"predict_only": True, **kw})


row(L, "compile configs a list", lambda: lcompile([1]), "ArgumentTypeError",
    "configs must map op ids of graph-defined ops to KernelConfigs, got list")
row(L, "compile configs key a str", lambda: lcompile({"1": "w4s3"}), "ArgumentTypeError",
    "configs key: '1' is a str, not an int (keys are op ids of graph-defined ops: [1])")
row(L, "compile configs key not a kernel", lambda: lcompile({0: "w4s3"}), "ConfigError",
    "configs[0]: op 0 is not a graph-defined op of 'looped'; those are [1]")
row(L, "compile configs label 'w4'", lambda: lcompile({1: "w4"}), "ConfigError",
    "configs[1]: not a KernelConfig label: 'w4'; labels read w<warps>s<stages>")
row(L, "compile configs value an int", lambda: lcompile({1: 4}), "ArgumentTypeError",
    "configs[1]: expected a KernelConfig, a dict of its fields or a label")
row(L, "compile configs dict unknown field", lambda: lcompile({1: {"warps": 4}}), "ConfigError",
    "configs[1]: KernelConfig: unknown field 'warps'")
row(L, "compile configs dict bad value", lambda: lcompile({1: {"num_warps": 3}}), "ConfigError",
    "configs[1]: KernelConfig: num_warps=3: must be a power of two")
row(L, "compile configs split not dividing", lambda: lcompile({1: "w4s3k3"}), "ConfigError",
    "configs[1] (w4s3k3): looped_k1: split 3 must divide forloop 4")
row(L, "compile a str", lambda: __import__("lower").compile("k", device="cpu"), "ArgumentTypeError",
    "expected a KernelGraph or Program, got str")
row(L, "label 'zzz'", lambda: klabel("zzz"), "ConfigError", "not a KernelConfig label: 'zzz'")
row(L, "label an int", lambda: klabel(4), "ArgumentTypeError", "expected a label string, got int")
row(L, "label 3 warps", lambda: klabel("w3s2"), "ConfigError",
    "label 'w3s2': KernelConfig: num_warps=3: must be a power of two from 1 to 32")
row(L, "label 0 stages", lambda: klabel("w4s0"), "ConfigError", "num_stages=0: must be from 1 to 16")
row(L, "label a class split twice", lambda: klabel("w4s3p1:2x1:4"), "ConfigError", "names a class twice")
row(L, "KernelConfig num_warps True", lambda: kcfg(num_warps=True), "ArgumentTypeError",
    "num_warps: True is a bool, not an int")
row(L, "KernelConfig num_stages 2.0", lambda: kcfg(num_stages=2.0), "ArgumentTypeError",
    "num_stages: 2.0 is a float, not an int")
row(L, "KernelConfig num_warps 64", lambda: kcfg(num_warps=64), "ConfigError",
    "num_warps=64: must be a power of two from 1 to 32")
row(L, "KernelConfig split 0", lambda: kcfg(split=0), "ConfigError", "split=0: must be from 1 to 1024")
row(L, "KernelConfig chunk -2", lambda: kcfg(chunk=-2), "ConfigError", "chunk=-2: must be from 1 to 1024")
row(L, "KernelConfig sub an int", lambda: kcfg(sub=5), "ArgumentTypeError", "sub=5 must be (class id, r) pairs")
row(L, "KernelConfig sub factor 0", lambda: kcfg(sub=((1, 0),)), "ConfigError", "sub pair (1, 0)")
row(L, "KernelConfig fp32_dot code", lambda: kcfg(fp32_dot='ieee"); import os'), "ConfigError",
    "fp32_dot='ieee\"); import os': must be one of ('ieee', 'tf32', 'tf32x3')")
row(L, "KernelConfig combine 'first'", lambda: kcfg(combine="first"), "ConfigError",
    "combine='first': must be one of ('kernel', 'last')")
row(L, "KernelConfig small_mm 1", lambda: kcfg(small_mm=1), "ArgumentTypeError",
    "small_mm=1: must be one of ('dot', 'v', 'va'), got int")
row(L, "KernelConfig defer_sums 1", lambda: kcfg(defer_sums=1), "ArgumentTypeError",
    "defer_sums=1: must be True or False")
row(L, "KernelConfig.from_dict a list", lambda: __import__("lower").KernelConfig.from_dict([1]), "ArgumentTypeError",
    "expected a dict of fields, got list")
row(L, "tune a str", lambda: __import__("lower").tune("k"), "ArgumentTypeError",
    "lower.tune: expected a KernelGraph or Program, got str")
row(L, "tune inputs a list", lambda: ltune(inputs=[1]), "InputError", "inputs must map input names")
row(L, "tune unknown input", lambda: ltune(inputs={"Y": torch.ones(1)}), "InputError",
    "unexpected input 'Y'; the inputs are ['X']")
row(L, "tune input an array", lambda: ltune(inputs={"X": np.ones((8, 64))}), "InputError",
    "input 'X' must be a torch.Tensor, got ndarray")
row(L, "tune top 0", lambda: ltune(top=0), "ConfigError", "top=0 must be >= 1")
row(L, "tune top '6'", lambda: ltune(top="6"), "ArgumentTypeError", "top='6' must be an int >= 1")
row(L, "tune device_params a str", lambda: ltune(device_params="H100"), "ArgumentTypeError",
    "device_params must be a lower.cost_model.DeviceParams")
row(L, "tune warps 4", lambda: ltune(warps=4), "ArgumentTypeError", "warps=4 must be a non-empty list or tuple")
row(L, "tune warps (3,)", lambda: ltune(warps=(3,)), "ConfigError",
    "warps holds 3; each must be a power of two from 1 to 32")
row(L, "tune stages ()", lambda: ltune(stages=()), "ArgumentTypeError", "stages=() must be a non-empty")
row(L, "tune stages (0,)", lambda: ltune(stages=(0,)), "ConfigError", "stages holds 0; each must be an int from 1")
row(L, "tune log 5", lambda: ltune(log=5), "ArgumentTypeError", "log=5 must be a function")
row(L, "tune ref a tensor", lambda: ltune(ref=torch.ones(8, 16)), "InputError", "ref must be a list of 1 torch")
row(L, "tune tol NaN", lambda: ltune(tol=float("nan")), "ArgumentTypeError", "tol=nan must be a finite number")
row(L, "tune tol 0", lambda: ltune(tol=0), "ConfigError", "tol=0 must be > 0")
row(L, "tune timing 'hot'", lambda: ltune(timing="hot"), "ConfigError",
    "timing='hot' must be one of ['cold', 'dram', 'graph', 'warm']")
row(L, "tune small_mm 'dot'", lambda: ltune(small_mm="dot"), "ArgumentTypeError",
    "small_mm='dot' must be a non-empty list or tuple")
row(L, "tune small_mm ('x',)", lambda: ltune(small_mm=("x",)), "ConfigError", "small_mm holds 'x'")
row(L, "tune budget_s -1", lambda: ltune(budget_s=-1), "ConfigError", "budget_s=-1 must be >= 0 seconds")
row(L, "tune budget_s '1'", lambda: ltune(budget_s="1"), "ArgumentTypeError", "budget_s='1' must be None or")
row(L, "tune predict_only 1", lambda: ltune(predict_only=1), "ArgumentTypeError", "predict_only=1 must be True")
row(L, "tune history a list", lambda: ltune(history=[1]), "ArgumentTypeError", "history must be the timings dict")
row(L, "tune history seconds a str", lambda: ltune(history={"k1:w4s3": "1"}), "ArgumentTypeError",
    "history entry 'k1:w4s3'")
row(L, "profile configs of another graph", lambda: __import__("lower").profile(looped(), configs={7: "w4s3"}),
    "ConfigError", "lower.profile: configs[7]: op 7 is not a graph-defined op")

# ================================================================== save / load

F = "save/load"
row(F, "save into a missing folder", lambda: mg.save(prog()[0], work() / "missing" / "p.json"),
    "SerializationError", "does not exist")
row(F, "save onto a folder", lambda: mg.save(prog()[0], work()), "SerializationError", "is a folder")
row(F, "save a str", lambda: mg.save("p", work() / "p.json"), "ArgumentTypeError", "cannot save a str")
row(F, "save a dict", lambda: mg.save({"to_json": 1}, work() / "p.json"), "ArgumentTypeError", "cannot save a dict")
row(F, "save to path 3", lambda: mg.save(prog()[0], 3), "ArgumentTypeError", "expected a file path")
row(F, "load a missing file", lambda: mg.load(work() / "nope.json"), "SerializationError", "cannot read")
row(F, "load a folder", lambda: mg.load(work()), "SerializationError", "cannot read")
row(F, "load(3)", lambda: mg.load(3), "ArgumentTypeError", "expected a file path")
row(F, "not JSON", lambda: load_doc("{not json"), "SerializationError", "not JSON")
row(F, "binary garbage", lambda: (lambda p: (p.write_bytes(b"\xff\xfe\x00garbage"), mg.load(p)))(work() / "bin.json"),
    "SerializationError", "not UTF-8")
row(F, "empty file", lambda: load_doc(""), "SerializationError", "not JSON")
row(F, "a list", lambda: load_doc("[]"), "SerializationError", "not a mugraph document")
row(F, "version 99", edited(lambda: prog()[0], _set("version", 99)), "SerializationError",
    "unsupported mugraph format version 99")
row(F, "kind Foo", edited(lambda: prog()[0], _set("kind", "Foo")), "SerializationError", "unknown document kind 'Foo'")


def _const_doc(c):
    def build():
        p = mg.Program("c")
        p.output(p.input("x", (2, 2)) * 0.5)
        return p
    return edited(build, _set("ops.1.attrs.c", c))


row(F, "constant '1e100000000'", _const_doc("1e100000000"), "SerializationError", "exponent beyond ±400")
row(F, "constant '1/0'", _const_doc("1/0"), "SerializationError", "divides by zero")
row(F, "constant 'nan'", _const_doc("nan"), "SerializationError", "is not a rational")
row(F, "constant 'inf'", _const_doc("inf"), "SerializationError", "is not a rational")
row(F, "constant 1e400 (JSON number)", lambda: load_doc(json.dumps(doc_of(mg.Program("c"))).replace(
    '"ops": []', '"ops": [{"op": "input", "name": "x", "shape": [2], "dtype": "float16"}, '
                 '{"op": "scale", "inputs": [0], "attrs": {"c": 1e400}}]')), "SerializationError", "not finite")
row(F, "constant of 1000 digits", _const_doc("7" * 1000), "SerializationError", "is not a rational")
row(F, "constant 10**450/1", _const_doc("1" + "0" * 450 + "/1"), "SerializationError", "numerator has 451 digits")
row(F, "constant a list", _const_doc([1, 2]), "SerializationError", "(list) is not a real scalar")
row(F, "JSON nested 100000 deep", lambda: load_doc("[" * 100000 + "]" * 100000), "SerializationError",
    "nested deeper than the parser")
row(F, "JSON nested 70 deep", lambda: load_doc("[" * 70 + "]" * 70), "SerializationError", "nested 70 levels deep > 64")
row(F, "number of 5000 digits", lambda: load_doc("1" * 5000), "SerializationError", "number literal of 5000 characters")
row(F, "float dim 2.5", edited(lambda: prog()[0], _set("ops.0.shape.0", 2.5)), "SerializationError",
    "dim 0 is 2.5 (float), not an int")
row(F, "float dim 4.0", edited(lambda: prog()[0], _set("ops.0.shape.0", 4.0)), "SerializationError", "dim 0 is 4.0")
row(F, "bool dim", edited(lambda: prog()[0], _set("ops.0.shape.0", True)), "SerializationError", "dim 0 is True")
row(F, "negative tensor index", edited(lambda: prog()[0], _set("ops.2.inputs.0", -1)), "SerializationError",
    "ops[2].inputs[0]: tensor index -1 out of range")
row(F, "forward tensor index", edited(lambda: prog()[0], _set("ops.2.inputs.0", 3)), "SerializationError",
    "tensor index 3 out of range")
row(F, "string tensor index", edited(lambda: prog()[0], _set("ops.2.inputs.0", "0")), "SerializationError",
    "expected an integer, got a string")
row(F, "negative output index", edited(lambda: prog()[0], _set("outputs.0", -1)), "SerializationError",
    "outputs[0]: tensor index -1")
row(F, "unknown key in an op", edited(lambda: prog()[0], _set("ops.2.input", [0])), "SerializationError",
    "unknown key(s) 'input'")
row(F, "op without inputs", edited(lambda: prog()[0], lambda d: d["ops"][2].pop("inputs")), "SerializationError",
    "missing key(s) ['inputs']")
row(F, "ops not a list", edited(lambda: prog()[0], _set("ops", {"0": 1})), "SerializationError",
    "ops: expected a list")
row(F, "op entry a string", edited(lambda: prog()[0], _set("ops.2", "exp")), "SerializationError",
    "ops[2]: expected an object")
row(F, "unknown attribute", edited(lambda: (lambda p: (p.output(mg.sum(p.input("x", (2, 2)), 1)), p)[1])(
    mg.Program("s")), _set("ops.1.attrs.keepdim", True)), "SerializationError", "unknown attribute(s) ['keepdim']")
row(F, "float reduce dim", edited(lambda: (lambda p: (p.output(mg.sum(p.input("x", (2, 2)), 1)), p)[1])(
    mg.Program("s")), _set("ops.1.attrs.dim", 1.0)), "SerializationError", "dim: expected an integer")
row(F, "name a number", edited(lambda: prog()[0], _set("name", 5)), "SerializationError", "name: expected a string")
row(F, "name with a newline", edited(lambda: prog()[0], _set("name", "a\nb")), "SerializationError",
    "printable characters")
row(F, "input name with a dot", edited(lambda: prog()[0], _set("ops.0.name", "os.system")), "SerializationError",
    "Python identifiers")
row(F, "output is an input", edited(lambda: prog()[0], _set("outputs.0", 0)), "SerializationError", "is an input")
row(F, "iterator source -1", edited(ref_lora, _set("ops.4.block.ops.0.source", -1)), "SerializationError",
    "source: tensor index -1 out of range")
row(F, "imap float", edited(ref_lora, _set("ops.4.block.ops.1.imap.0", 1.0)), "SerializationError",
    "imap[0]: expected an integer")
row(F, "grid string", edited(ref_lora, _set("ops.4.block.grid.0", "64")), "SerializationError",
    "grid[0]: expected an integer")
row(F, "forloop float", edited(ref_lora, _set("ops.4.block.forloop", 1.0)), "SerializationError",
    "forloop: expected an integer")
row(F, "accum with two inputs", edited(ref_lora, lambda d: next(
    o for o in d["ops"][4]["block"]["ops"] if o["op"] == "accum")["inputs"].append(0)), "SerializationError",
    "a sum accumulator takes 1 input(s), got 2")
row(F, "saver tensor 999", edited(ref_lora, _set("ops.4.block.savers.0.tensor", 999)), "SerializationError",
    "savers[0].tensor: tensor index 999")
row(F, "saver omap missing axis", edited(ref_lora, _set("ops.4.block.savers.0.omap", [None, None, None])),
    "SerializationError", "grid axis x (size 4) is missing")
row(F, "unknown block op", edited(ref_lora, _set("ops.4.block.ops.4.op", "frobnicate")), "SerializationError",
    "unknown op 'frobnicate'")


def _result_doc(edit):
    """A saved superoptimize result (the program as its one candidate), edited."""
    def fn():
        from mugraph.core.benchmarks import program
        from mugraph.pipeline.optimize import Candidate, Optimized

        g = ref_lora()
        c = Candidate(g, "search", configs={4: {"num_warps": 4}})
        d = Optimized(program("lora", small=True), c, [c], {"why": "t"}, "cpu").to_json()
        edit(d)
        return load_doc(d, "r.mug.json")
    return fn


row(F, "result best -1", _result_doc(_set("best", -1)), "CacheError", "best=-1 is not the index")
row(F, "result best '0'", _result_doc(_set("best", "0")), "CacheError", "best='0'")
row(F, "result without candidates", _result_doc(_set("candidates", [])), "CacheError", "holds no candidates")
row(F, "result device 'tpu'", _result_doc(_set("device", "tpu")), "CacheError", "device='tpu'")
row(F, "result config injection", _result_doc(_set("candidates.0.configs.4.num_warps", "4); import os")),
    "CacheError", "num_warps='4); import os' is not a valid value")
row(F, "result config unknown field", _result_doc(_set("candidates.0.configs.4.evil", 1)), "CacheError",
    "unknown field 'evil'")
row(F, "result config of a non-kernel", _result_doc(_set("candidates.0.configs.0", {})), "CacheError",
    "key '0' is not a graph-defined op")
row(F, "result origin", _result_doc(_set("candidates.0.origin", "magic")), "CacheError", "origin 'magic'")
row(F, "result version 7", _result_doc(_set("version", 7)), "CacheError", "not a saved mugraph result of version 1")
row(F, "load_result of garbage", lambda: (lambda p: (p.write_text("{oops"), mg.pipeline.load_result(p)))(
    work() / "bad.mug.json"), "CacheError", "unreadable cached result")
row(F, "render to a missing folder", lambda: mg.render(prog()[0], work() / "missing" / "g.dot"),
    "SerializationError", "does not exist")
row(F, "render to .jpg", lambda: mg.render(prog()[0], work() / "g.jpg"), "SerializationError",
    "the suffix picks the format")
row(F, "render a str", lambda: mg.render("p", work() / "g.dot"), "ArgumentTypeError", "to_dot: expected a Program")

# ================================================================== huge shapes

H = "huge shapes"
row(H, "input dim 2**31", lambda: mg.Program("p").input("x", (2**31, 1)), "ShapeError", "has a dim > 2147483647")
row(H, "input dim 10**30", lambda: mg.Program("p").input("x", (10**30,)), "ShapeError", "MAX_DIM")
row(H, "input of 2**40 elements", lambda: mg.Program("p").input("x", (2**20, 2**20)), "ShapeError",
    "1099511627776 elements > 2147483647")
row(H, "reshape to 2**40", lambda: mg.reshape(x_(), (2**20, 2**20)), "ShapeError", "elements")
row(H, "repeat to 2**40", lambda: mg.repeat(x_(), (2**19, 2**18)), "ShapeError", "elements > 2147483647")
row(H, "forloop 2**40", lambda: mg.BlockGraph(forloop=2**40), "InvalidGraphError", "forloop 1099511627776")
row(H, "JSON dim 2**40", edited(lambda: prog()[0], _set("ops.0.shape.0", 2**40)), "SerializationError",
    "has a dim > 2147483647")


def _huge_eval(build):
    def fn():
        p = mg.Program("h")
        outs = build(p)
        p.output(outs)
        mg.evaluate(p, {t.name: np.ones(t.shape) for t in p.inputs})
    return fn


row(H, "broadcast to 10**10 elements", lambda: (lambda p: p.input("a", (100000, 1)) + p.input("b", (1, 100000)))(
    mg.Program("h")), "ShapeError", "10000000000 elements > 2147483647")
row(H, "evaluate a 4*10**8 broadcast", _huge_eval(lambda p: p.input("a", (20000, 1)) + p.input("b", (1, 20000))),
    "ResourceError", "400000000 elements > max_elements=268435456")
row(H, "evaluate a 4*10**8 outer product", _huge_eval(lambda p: p.input("a", (20000, 1)) @ p.input("b", (1, 20000))),
    "ResourceError", "t2 (20000, 20000)")
row(H, "repeat to 10**9", _huge_eval(lambda p: mg.repeat(p.input("a", (1000, 1)), (1, 1000000))), "ResourceError",
    "elements > max_elements")


@case(H, "block tile x loop", "ResourceError", "(in chunks of one block)")
def _():
    kg = mg.KernelGraph("k")  # small inputs; one block's (128, 256) outer sum over 16384 steps is 2**29
    X = kg.input("X", (1024, 1))
    Y = kg.input("Y", (1, 4194304))
    bg = mg.BlockGraph(grid=(8, 1, 1), forloop=16384)
    x = bg.input(X, imap=(0,))
    y = bg.input(Y, fmap=1)
    bg.output(bg.accum(x + y), omap=(0,))
    kg.output(kg.kernel(bg)[0])
    mg.evaluate(kg, {"X": np.ones((1024, 1)), "Y": np.ones((1, 4194304))})


row(H, "superoptimize a 4*10**8 program", lambda: sopt(program=(lambda p: (p.output(mg.exp(
    p.input("a", (20000, 1)) + p.input("b", (1, 20000)))), p)[1])(mg.Program("big"))), "ResourceError",
    "too large to verify")

# ================================================================== own: found while hardening

O = "own"
row(O, "input named like an unnamed tensor", lambda: mg.Program("p").input("t1", (2,)), "InvalidGraphError",
    "names of the form t<N>/b<N> label unnamed tensors")
row(O, "input named like a tile", lambda: mg.Program("p").input("b0", (2,)), "InvalidGraphError", "t<N>/b<N>")
row(O, "search key superoptimize overwrites", lambda: sopt({"search": {"seed": 7}}), "ConfigError",
    "set by superoptimize itself")
row(O, "numpy complex constant", lambda: x_() * np.complex64(1), "ArgumentTypeError", "complex64")
row(O, "Decimal constant", lambda: mg.scale(x_(), __import__("decimal").Decimal("0.5")), "ConstantError",
    "(Decimal) is not a real scalar")
row(O, "error message with a newline", lambda: mg.Program("p").input("a\nb", (2,)), "InvalidGraphError",
    "Python identifiers")
row(O, "const shape attr a float", lambda: prog()[0].add_op("const", [], {"value": 1, "shape": (1.0, 1)}),
    "ShapeError", "dim 0 is 1.0")
row(O, "const value a str", lambda: prog()[0].add_op("const", [], {"value": "1", "shape": (1, 1)}),
    "ConstantError", "'1' (str)")
row(O, "reps attr a str", lambda: (lambda p, x, *_: p.add_op("repeat", [x], {"reps": "22"}))(*prog()),
    "ArgumentTypeError", "reps '22' must be a sequence of ints")


# ================================================================== CLI

CLI = "CLI"


def cli(*args: str):
    """Run ``python -m mugraph ARGS`` in-process; returns click's Result."""
    from click.testing import CliRunner

    from mugraph.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def _files() -> dict[str, Path]:
    w = work()
    tiny_py = w / "tiny.py"
    if not tiny_py.exists():
        tiny_py.write_text("import mugraph as mg\np = mg.Program('tiny')\nx = p.input('x', (8, 16), 'float32')\n"
                           "w = p.input('w', (16, 16), 'float32')\np.output(mg.exp(x @ w))\n")
        (w / "twice.py").write_text("import mugraph as mg\np = mg.Program('t')\nx = p.input('x', (4, 4))\n"
                                    "p.output(mg.exp(mg.exp(x)))\n")
        (w / "raises.py").write_text("raise RuntimeError('boom')\n")
        (w / "garbage.json").write_text("{not json")
        (w / "a_file").write_text("x")
        mg.save(ref_lora(), w / "kernel.json")
    return {p.stem: p for p in w.iterdir()}


SEARCH_ARGS = ("--time-limit", "20", "--max-block-ops", "3", "--max-kernel-ops", "1", "--workers", "1", "--no-cache")
for args, msg in [
        (("show", "{w}/missing.json"), "does not exist"),
        (("show", "{garbage}"), "SerializationError"),
        (("show", "{tiny}", "--name", "nope"), "no graph named 'nope'"),
        (("show", "{tiny}", "--png", "{w}/missing/g.png"), "does not exist"),
        (("show", "{tiny}", "--png", "{w}/g.jpg"), "the suffix picks the format"),
        (("show", "{w}"), "is a directory"),
        (("show", "{raises}"), "running the file failed: RuntimeError: boom"),
        (("show",), "Missing argument"),
        (("optimize", "{w}/missing.py"), "does not exist"),
        (("optimize", "{tiny}", "--time-limit", "abc"), "'abc' is not a valid float"),
        (("optimize", "{tiny}", "--time-limit", "-5"), "search.time_limit=-5.0"),
        (("optimize", "{tiny}", "--max-block-ops", "0"), "search.max_block_ops=0"),
        (("optimize", "{tiny}", "--workers", "-1"), "search.workers=-1"),
        (("optimize", "{tiny}", "--tune-seconds", "0"), "0.0 is not in the range x>0"),
        (("optimize", "{tiny}", "--seed", "-1"), "-1 is not in the range"),
        (("optimize", "{tiny}", "--device", "tpu"), "'tpu' is not one of"),
        (("optimize", "{tiny}", "--out", "{w}/missing/r.json") + SEARCH_ARGS, "does not exist"),
        (("optimize", "{tiny}", "--out", "{w}") + SEARCH_ARGS, "is a folder"),
        (("optimize", "{twice}") + SEARCH_ARGS, "NotLaxError"),
        (("optimize", "{kernel}") + SEARCH_ARGS, "already holds graph-defined kernels"),
        (("optimize", "{tiny}", "--bogus"), "No such option"),
        (("bench", "--name", "nonexistent"), "'nonexistent' is not one of"),
        (("bench", "--batch", "0"), "0 is not in the range"),
        (("bench", "--batch", "x"), "'x' is not a valid integer"),
        (("bench", "--top-k", "0"), "0 is not in the range"),
        (("bench", "--tune-seconds", "-1"), "-1.0 is not in the range"),
        (("bench", "--timing", "hot"), "'hot' is not one of"),
        (("bench", "--name", "lora", "--batch", "1", "--results", "{a_file}") + SEARCH_ARGS, "is a file"),
        (("demo", "--batch", "0"), "0 is not in the range"),
        (("demo", "--small", "--out", "{a_file}"), "is a file, not a folder"),
        (("nosuchcommand",), "No such command"),
]:
    shown = args[:-len(SEARCH_ARGS)] if args[-len(SEARCH_ARGS):] == SEARCH_ARGS else args
    row(CLI, " ".join(shown).replace("{w}/", "").replace("{", "").replace("}", ""),
        (lambda a=args: cli(*[x.format(w=work(), **_files()) for x in a])), "cli", msg)


# ================================================================== checking a row

@dataclass
class Outcome:
    kind: str      # "ok", "other mugraph error", "raw exception", "accepted", "cli: ..."
    detail: str


def run(c: Case) -> Outcome:
    """Run one row and say what happened (never raises)."""
    errors = __import__("mugraph.core.errors", fromlist=["x"])
    try:
        result = c.fn()
    except BaseException as e:  # noqa: BLE001 - classifying what escaped is the point
        if isinstance(e, KeyboardInterrupt):
            raise
        if not isinstance(e, errors.MugraphError):
            return Outcome("raw exception", f"{type(e).__name__}: {str(e)[:200]}")
        want = getattr(errors, c.err, None)
        msg = str(e)
        if want is None or not isinstance(e, want):
            return Outcome("other mugraph error", f"{type(e).__name__} (expected {c.err}): {msg[:200]}")
        if "\n" in msg or c.msg not in msg:
            return Outcome("other mugraph error", f"message {msg[:300]!r} lacks {c.msg!r} or is not one line")
        return Outcome("ok", f"{type(e).__name__}: {msg}")
    if c.err != "cli":
        return Outcome("accepted", f"returned {type(result).__name__}")
    err = result.stderr if hasattr(result, "stderr") else result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return Outcome("raw exception", f"{type(result.exception).__name__}: {str(result.exception)[:200]}")
    if result.exit_code == 0:
        return Outcome("accepted", f"exit 0: {result.output[-200:]!r}")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if len(lines) == 1 and lines[0].startswith("error: ") and c.msg in lines[0] and "Traceback" not in result.output:
        return Outcome("ok", lines[0])
    return Outcome("other mugraph error", f"exit {result.exit_code}, stderr {err[-300:]!r}")


def table(outcomes: list[tuple[Case, Outcome]]) -> str:
    cats: dict[str, dict[str, int]] = {}
    for c, o in outcomes:
        d = cats.setdefault(c.category, {"tried": 0, "ok": 0, "other mugraph error": 0, "raw exception": 0,
                                         "accepted": 0})
        d["tried"] += 1
        d[o.kind] += 1
    lines = ["| category | kinds tried | one-line error, as expected | another mugraph error | raw exception "
             "(traceback) | silently accepted |", "|---|---|---|---|---|---|"]
    tot = {k: 0 for k in ("tried", "ok", "other mugraph error", "raw exception", "accepted")}
    for cat, d in cats.items():
        lines.append(f"| {cat} | {d['tried']} | {d['ok']} | {d['other mugraph error']} | {d['raw exception']} | "
                     f"{d['accepted']} |")
        for k in tot:
            tot[k] += d[k]
    lines.append(f"| **all** | **{tot['tried']}** | **{tot['ok']}** | **{tot['other mugraph error']}** | "
                 f"**{tot['raw exception']}** | **{tot['accepted']}** |")
    return "\n".join(lines)


def main() -> None:
    import os
    import signal
    import sys

    os.environ.setdefault("TRITON_INTERPRET", "1")
    verbose = "-v" in sys.argv
    limit = 90

    def alarm(*_):
        raise TimeoutError(f"ran for more than {limit} s")

    signal.signal(signal.SIGALRM, alarm)
    outcomes = []
    for c in CASES:
        signal.alarm(limit)
        try:
            o = run(c)
        except TimeoutError as e:
            o = Outcome("accepted", str(e))
        finally:
            signal.alarm(0)
        if isinstance(o.detail, str) and o.detail.startswith("TimeoutError"):
            o = Outcome("accepted", o.detail)
        outcomes.append((c, o))
        if verbose or o.kind != "ok":
            print(f"[{o.kind}] {c.category} / {c.name}: {o.detail[:240]}", file=sys.stderr)
    print(table(outcomes))


if __name__ == "__main__":
    main()
