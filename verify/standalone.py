"""Standalone verification of hand-written kernels: ``python -m mugraph verify REF CAND``
(and ``python -m verify REF CAND``) call :func:`verify_files`.

Each path is either

* a saved ``.json`` program or μGraph (``mg.save``), or
* a ``.py`` file, run as a script, that defines the graph as a module attribute.
  The reference is the attribute ``REF``, the candidate ``CAND``; each may be a
  Program/KernelGraph or a zero-argument function returning one (so one file can
  hold both: ``verify_files("pair.py", "pair.py")`` or ``verify_files("pair.py")``).
  A file without ``REF``/``CAND`` that defines exactly one graph (any top-level
  name) gives that graph.

Running a ``.py`` file executes it: verify only files you trust.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from mugraph.core.errors import ConfigError, MugraphError
from mugraph.core.ir import KernelGraph
from mugraph.core.serialize import load

from .equivalence import DEFAULT_ERROR, FieldLike, equivalent
from .family import DEFAULT
from .field import MIRAGE
from .verdict import Verdict

_cache: dict[str, dict] = {}


def _namespace(path: Path) -> dict:
    key = str(path.resolve())
    if key not in _cache:
        try:
            _cache[key] = runpy.run_path(str(path), run_name="__mugraph_verify__")
        except MugraphError:
            raise
        except Exception as e:
            raise MugraphError(f"{path}: running the file failed: {type(e).__name__}: {e}") from None
    return _cache[key]


def graph_from_path(path: str | Path, role: str) -> KernelGraph:
    """The reference (``role="REF"``) or candidate (``role="CAND"``) graph in ``path``."""
    path = Path(path)
    if not path.is_file():
        raise MugraphError(f"{path}: no such file")
    if path.suffix == ".json":
        return load(path)
    if path.suffix != ".py":
        raise MugraphError(f"{path}: expected a .json (saved graph) or .py file")
    ns = _namespace(path)
    if role in ns:
        obj = ns[role]
        if callable(obj) and not isinstance(obj, KernelGraph):
            try:
                obj = obj()
            except MugraphError:
                raise
            except Exception as e:
                raise MugraphError(f"{path}: {role}() failed: {type(e).__name__}: {e}") from None
        if not isinstance(obj, KernelGraph):
            raise MugraphError(f"{path}: {role} is a {type(obj).__name__}, not a mugraph Program or KernelGraph")
        return obj
    graphs = {k: v for k, v in ns.items() if isinstance(v, KernelGraph) and not k.startswith("_")}
    if len(graphs) == 1:
        return next(iter(graphs.values()))
    found = sorted(graphs) or "no graphs"
    raise MugraphError(f"{path}: define {role} (a graph or a function returning one); the file defines {found}")


def verify_files(ref_path: str | Path, cand_path: str | Path | None = None, *, error: float = DEFAULT_ERROR,
                 seed: int | None = None, field: FieldLike = DEFAULT, float_check: bool = True,
                 non_lax: str = "raise") -> Verdict:
    """Load the reference and candidate from files and run :func:`verify.equivalent`.

    ``cand_path`` defaults to ``ref_path`` (one .py file defining ``REF`` and ``CAND``)."""
    for name, v in (("ref_path", ref_path), ("cand_path", cand_path)):
        if not (isinstance(v, (str, Path)) or (v is None and name == "cand_path")):
            raise ConfigError(f"verify_files: {name} must be a path (str or pathlib.Path), got {type(v).__name__}")
    ref_path = Path(ref_path)
    cand_path = Path(cand_path) if cand_path is not None else ref_path
    ref = graph_from_path(ref_path, "REF")
    cand = graph_from_path(cand_path, "CAND")
    return equivalent(ref, cand, error=error, seed=seed, field=field, float_check=float_check, non_lax=non_lax)


def failure_line(v: Verdict) -> str | None:
    """The line a command prints when the verdict is not a pass: which checks failed
    (None when every check passed)."""
    if v.ok:
        return None
    failed = v.failed_checks or (["field tests"] if v.equivalent is not True else [])
    what = ", ".join(f"{k} ({v.checks.get(k, 'failed')})" for k in failed) or "no check passed"
    return f"FAILED: {what}"


def main(argv: list[str] | None = None) -> int:
    """``python -m verify REF [CAND] [--error E] [--seed S] [--mirage-primes] [--json]``;
    exit status 0 when equivalent and every check passed (field tests, error bound,
    float check), 1 when any check failed or the verdict is undecided (the failed
    checks are printed to stderr), 2 on a bad input."""
    ap = argparse.ArgumentParser(prog="python -m verify", description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("cand", nargs="?")
    ap.add_argument("--error", type=float, default=DEFAULT_ERROR)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-float", action="store_true", help="skip the float check")
    ap.add_argument("--float-only", action="store_true", help="compare non-Lax graphs in floating point")
    ap.add_argument("--mirage-primes", action="store_true", help="use p=167, q=83 (weak; for comparison)")
    ap.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = ap.parse_args(argv)
    try:
        v = verify_files(args.ref, args.cand, error=args.error, seed=args.seed,
                         field=MIRAGE if args.mirage_primes else DEFAULT, float_check=not args.no_float,
                         non_lax="float" if args.float_only else "raise")
    except MugraphError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(v.dumps(indent=1) if args.json else str(v))
    line = failure_line(v)
    if line:
        print(line, file=sys.stderr)
    return 0 if line is None else 1
