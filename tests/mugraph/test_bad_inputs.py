"""Every row of the bad-input table (``bad_inputs.py``): the misuse raises the
expected ``MugraphError`` subclass — never a raw exception from numpy, torch, json or
dataclasses, never silent acceptance — with a one-line message naming the culprit;
the CLI prints ``error: <one line>`` and exits non-zero."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mugraph as mg
from bad_inputs import CASES, run

ROOT = Path(__file__).resolve().parents[2]


def assert_one_line_mugraph_error(case) -> None:
    """The helper every row goes through: what escaped, its class, its one line."""
    outcome = run(case)
    assert outcome.kind == "ok", f"{case.category} / {case.name}: {outcome.kind}: {outcome.detail}"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.category}:{c.name}" for c in CASES])
def test_bad_input(case):
    assert_one_line_mugraph_error(case)


def test_the_table_is_large_and_covers_every_category():
    cats = {c.category for c in CASES}
    assert {"builder", "μGraph construction", "evaluate", "superoptimize config", "compiled-program call",
            "save/load", "CLI", "huge shapes", "own"} <= cats
    assert len(CASES) >= 150
    assert len({(c.category, c.name) for c in CASES}) == len(CASES), "row names repeat"


def test_checker_is_not_vacuous():
    """The helper fails a row that raises a raw exception, the wrong class, a
    multi-line message, or nothing at all."""
    from bad_inputs import Case

    def raw():
        raise KeyError("x")

    def multi():
        raise mg.ShapeError("two\nlines")  # MugraphError joins them: still one line, and it says so

    cases = [Case("t", "raw", raw, "ShapeError", "x"), Case("t", "quiet", lambda: 1, "ShapeError", "x"),
             Case("t", "class", lambda: mg.Program(None), "ShapeError", "name"),
             Case("t", "text", lambda: mg.Program(None), "ArgumentTypeError", "not in the message")]
    assert [run(c).kind for c in cases] == ["raw exception", "accepted", "other mugraph error",
                                            "other mugraph error"]
    assert str(mg.ShapeError("two\nlines")) == "two | lines"


def test_int8_float_check_is_refused_before_any_search(monkeypatch):
    import search

    def no_search(*a, **k):
        raise AssertionError("the search ran")

    monkeypatch.setattr(search, "run", no_search)
    p = mg.Program("p")
    p.output(mg.exp(p.input("x", (4, 4), "float32")))
    with pytest.raises(mg.ConfigError, match="'int8' is not a dtype the float check runs"):
        mg.superoptimize(p, {"float_dtypes": ("int8",)}, device="cpu", cache_dir=False)


@pytest.mark.parametrize("args,needle", [
    (["bench", "--name", "nonexistent"], "'nonexistent' is not one of"),
    (["show", "{bad}"], "SerializationError"),
])
def test_real_command_line_prints_one_error_line(tmp_path, args, needle):
    """``python -m mugraph …`` in a fresh process: one line on stderr, no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "mugraph", *[a.format(bad=bad) for a in args]], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_cli_reports_an_unexpected_error_in_one_line(monkeypatch, tmp_path):
    """A bug (not a MugraphError) is still one line and exit 1; MUGRAPH_TRACEBACK=1 lets
    it through for debugging. --help exits 0."""
    from click.testing import CliRunner

    import mugraph.cli
    from mugraph.cli import main

    def broken(*a, **k):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(mugraph.cli, "graph_from_file", broken)
    f = tmp_path / "g.json"
    f.write_text("{}")
    r = CliRunner().invoke(main, ["show", str(f)])
    assert r.exit_code == 1 and r.stderr.strip() == ("error: internal error, ValueError: boom "
                                                     "(set MUGRAPH_TRACEBACK=1 for the traceback)")
    monkeypatch.setenv("MUGRAPH_TRACEBACK", "1")
    r = CliRunner().invoke(main, ["show", str(f)])
    assert isinstance(r.exception, ValueError)
    assert CliRunner().invoke(main, ["--help"]).exit_code == 0


def test_what_is_refused_is_only_what_is_wrong():
    """The strict checks take what is right in every spelling: numpy scalars as exact
    constants, numpy ints as dims, lists as shapes, negative dims, dict imaps."""
    import numpy as np
    from fractions import Fraction

    p = mg.Program("p")
    x = p.input("x", [np.int64(4), 8], "float32")
    assert x.shape == (4, 8) and type(x.shape[0]) is int
    assert (np.float64(2.0) * x).op.attrs["c"] == 2 and (np.float32(0.5) * x).op.attrs["c"] == Fraction(1, 2)
    assert (x * np.int64(3)).op.attrs["c"] == 3 and (x / np.int64(4)).op.attrs["c"] == Fraction(1, 4)
    assert (x * 0.1).op.attrs["c"] == Fraction(1, 10)
    assert mg.sum(x, -1).shape == (4, 1) and mg.reshape(x, [np.int32(8), 4]).shape == (8, 4)
    kg = mg.KernelGraph("k")
    X = kg.input("X", (8, 64))
    bg = mg.BlockGraph(grid=[2], forloop=4)
    t = bg.input(X, imap={"x": 0}, fmap=1)
    assert t.shape == (4, 16) and bg.grid == (2, 1, 1)
    ins = {"x": np.arange(32, dtype=np.int64).reshape(4, 8)}
    p.output(mg.exp(x))
    assert np.allclose(mg.evaluate(p, ins)[0], np.exp(ins["x"]))
