"""The package version, in one place, and the fingerprint of the installed code (the
product records both in cache keys and search checkpoints).

``__version__`` has not changed with most changes of behaviour, so a stored result
cannot be trusted on it alone: :func:`code_fingerprint` hashes the code and data that
decide what ``superoptimize`` returns, so a result or a checkpoint written by other
code is recomputed instead of served (docs/design.md §8.3).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

__version__ = "0.1.0"

#: the packages whose code decides a result: the IR and the pipeline (``mugraph``), the
#: search, the verifier and the lowering (its cost model reads the timing data in lower/data)
FINGERPRINTED = ("mugraph", "search", "verify", "lower")

#: folders left out of the fingerprint, relative to the package: ``mugraph/frontend``
#: (torch.compile) only decides *which* programs are superoptimized — each piece's program
#: and configuration are in the cache key already — and what is done with a result after it
#: leaves the cache (lowering it for the call's strides, registering an operator; not
#: cached). Counting it would re-search every piece of every model after any change of the
#: capture or partitioning code, without any stored result having been wrong.
NOT_FINGERPRINTED = (("mugraph", "frontend"),)


def _package_dir(name: str) -> Path | None:
    """Where package ``name`` is installed, found without importing it (importing the
    lowering here would import triton before its interpreter mode is chosen)."""
    if name == "mugraph":
        return Path(__file__).resolve().parent
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _counted(rel: Path) -> bool:
    """Whether a file (path relative to its package) is code or data of the package: a
    ``.py`` file or a file under a ``data`` folder (package data such as lower/data/*),
    never bytecode caches or stray files (editor backups, notes)."""
    if "__pycache__" in rel.parts:
        return False
    return rel.suffix == ".py" or "data" in rel.parts[:-1]


def fingerprint_of_packages(packages: dict[str, Path | None],
                            excluded: tuple[tuple[str, ...], ...] = NOT_FINGERPRINTED) -> str:
    """sha256 over the sorted relative paths and the bytes of the counted files of
    ``packages`` (name -> folder; ``None``: not installed, which is hashed as such).
    Each path and content is length-prefixed, so no two file sets hash alike by
    concatenation."""
    h = hashlib.sha256()
    for name in sorted(packages):
        root = packages[name]
        h.update(f"package {name} {'missing' if root is None else 'present'}\n".encode())
        if root is None:
            continue
        files = []
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if any(rel.parts[:len(ex) - 1] == ex[1:] for ex in excluded if ex[0] == name):
                continue
            if _counted(rel) and path.is_file():
                files.append((rel.as_posix(), path))
        for rel_name, path in sorted(files):
            data = path.read_bytes()
            head = f"{name}/{rel_name}".encode()
            h.update(len(head).to_bytes(8, "little") + head + len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def code_fingerprint() -> str:
    """The fingerprint of the installed code and data of :data:`FINGERPRINTED` (less
    :data:`NOT_FINGERPRINTED`): 64 hex digits, computed once per process (about 1 MB read).

    What it covers and why: everything that decides a cached ``superoptimize`` result —
    the IR and its rules, the search, the verifier, the lowering and its cost-model data,
    and the pipeline that checks, ranks and times the candidates (``mugraph/pipeline``).
    An upgrade or a local edit of any of them may change a result (a verifier that no
    longer accepts some μGraph, a search that finds a faster one), so a result computed
    by other code is never served as this code's answer."""
    return fingerprint_of_packages({name: _package_dir(name) for name in FINGERPRINTED})


@functools.lru_cache(maxsize=None)
def frontend_fingerprint() -> str:
    """The fingerprint of ``mugraph/frontend`` alone (:data:`NOT_FINGERPRINTED` leaves it
    out of :func:`code_fingerprint`): what keys the ATen traces the front end stores for a
    warm start, which its capture's passes shape — an edit of a pass must not be served a
    trace the old pass made."""
    return fingerprint_of_packages({"mugraph": _package_dir("mugraph") / "frontend"})
