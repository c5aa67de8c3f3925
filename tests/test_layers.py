"""The import layering: IR core ← stages (search, verify, lower; search may use
verify) ← product (pipeline, CLI, demo), with no import cycle anywhere —
function-level imports included (:mod:`importgraph` reads every import
statement of the source).

The checker is itself tested on small planted packages, so a contract that
could never fail would be caught here."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import importgraph as ig

ROOT = Path(__file__).resolve().parents[1]


def test_no_layer_violations():
    assert ig.violations(ig.build(ROOT)) == []


def test_no_import_cycles():
    assert ig.build(ROOT).cycles() == []


def test_every_module_is_seen():
    """The walk covers the four packages (a glob that matched nothing would pass the
    two tests above vacuously)."""
    g = ig.build(ROOT)
    for m in ("mugraph.core.ir", "mugraph.pipeline.optimize", "search.driver", "verify.equivalence", "lower.plan"):
        assert m in g.modules
    assert len(g.imports) > 200


def test_importing_the_core_imports_no_stage():
    """At run time too: ``import mugraph`` (and a graph built, evaluated, saved) loads
    none of search / verify / lower / mugraph.pipeline; ``mg.superoptimize`` does."""
    code = textwrap.dedent("""
        import sys, tempfile, os
        import mugraph as mg
        p = mg.Program("p"); X = p.input("X", (2, 3)); p.output(mg.exp(X) * 2)
        mg.evaluate(p, {"X": __import__("torch").ones(2, 3)})
        from mugraph.core.serialize import save, load
        load(save(p, os.path.join(tempfile.mkdtemp(), "p.json")))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("search", "verify", "lower")
                     or m.startswith("mugraph.pipeline")))
        mg.superoptimize
        print("search" in sys.modules and "mugraph.pipeline" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))


CLEAN = {
    "mugraph/__init__.py": """
        from .core.ir import Graph

        def __getattr__(name):
            from . import pipeline
            return getattr(pipeline, name)
    """,
    "mugraph/core/__init__.py": "from .ir import Graph\n",
    "mugraph/core/ir.py": "from .errors import Bad\n",
    "mugraph/core/errors.py": "class Bad(Exception): pass\n",
    "mugraph/pipeline/__init__.py": "import search\nimport lower\nfrom ..core.ir import Graph\n",
    "search/__init__.py": "import verify\nfrom mugraph.core.ir import Graph\n",
    "verify/__init__.py": "from mugraph.core import ir\n",
    "lower/__init__.py": "from mugraph.core.errors import Bad\n",
}


def test_checker_passes_a_clean_planted_package(tmp_path):
    _plant(tmp_path, CLEAN)
    g = ig.build(tmp_path)
    assert ig.violations(g) == [] and g.cycles() == []
    assert len(g.function_level()) == 1  # the roof's lazy import of the product


@pytest.mark.parametrize("module, text, why", [
    ("mugraph/core/ir.py", "from .errors import Bad\n\ndef f():\n    import search\n", "the IR core imports the search"),
    ("mugraph/core/ir.py", "from ..pipeline import x\n", "the IR core imports the product"),
    ("mugraph/core/errors.py", "from lower import y\n", "the IR core imports the lower"),
    ("mugraph/core/__init__.py", "import mugraph\n", "the IR core imports the product"),
    ("verify/__init__.py", "from search import z\n", "stage verify imports stage search"),
    ("lower/__init__.py", "def f():\n    from verify import z\n", "stage lower imports stage verify"),
    ("search/__init__.py", "import lower\n", "stage search imports stage lower"),
    ("lower/__init__.py", "from mugraph.pipeline import z\n", "stage lower imports the product"),
])
def test_checker_catches_a_planted_violation(tmp_path, module, text, why):
    """Each contract, broken once: the checker names the import and the rule, even
    when the import hides inside a function."""
    _plant(tmp_path, {**CLEAN, module: text})
    bad = ig.violations(ig.build(tmp_path))
    assert bad and all(why in v for v in bad), bad


def test_checker_catches_a_planted_cycle(tmp_path):
    """A cycle through a function-level import inside one layer counts as a cycle."""
    _plant(tmp_path, {**CLEAN, "search/a.py": "from . import b\n",
                      "search/b.py": "def f():\n    from .a import g\n"})
    g = ig.build(tmp_path)
    assert ig.violations(g) == []
    assert g.cycles() == [["search.a", "search.b"]]


def test_type_checking_imports_are_not_dependencies(tmp_path):
    _plant(tmp_path, {**CLEAN, "mugraph/core/ir.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                    "    from ..pipeline import Optimized\n"})
    assert ig.violations(ig.build(tmp_path)) == []


@pytest.mark.parametrize("access", ["mg.pipeline.load_result", "mg.OptimizeConfig", "mg.load"])
def test_product_names_resolve_on_first_access(access):
    """Each lazy name works as the first thing a fresh interpreter asks for (the
    subpackage itself included: ``mg.pipeline.…`` before anything imported it)."""
    code = f"import mugraph as mg\nx = {access}\nfrom mugraph import superoptimize, save\nprint(callable(x))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-500:]
