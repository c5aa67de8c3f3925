"""The fingerprint's fixed draws and the program's fingerprint outputs, shared by the
processes of one search through files.

Every search worker fingerprints complete candidates against the program on one fixed
draw (:func:`verify.equivalence.fingerprint`). Without sharing, each worker draws the
program's inputs at full shape and evaluates the program on them itself, at its first
complete candidate: gated_mlp at b=8 (two 4096×4096 weights) is 1.7 s and 0.9 GB of
draws and 1.5 s more for the program's outputs, per worker — sixteen workers asked for
25 GB at once and the search stalled for 40 s on a 2-core machine, and four such rows
side by side stalled the 60 s search on a 64-core GPU machine the same way.

With a directory set (:func:`use`), :func:`load_or_make` keeps each value there as
``.npy`` files: the first process to need it computes and writes it (atomically), every
other process maps the files copy-on-write — the pages are the page cache's, one copy
for all the workers of the machine, and a process that wrote to one (nothing does)
would get a private page, never change the others'. The search driver fills the
directory before its workers start and removes it when the search ends; a worker on
another machine (a Ray node) does not see the directory and computes its own, as before.
The values are functions of their keys alone (seed, primes, input name and shape; the
program's serialized form), so sharing changes no fingerprint.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

_DIR: Optional[Path] = None
#: called when a temporary directory is removed: caches of values mapped from it let go
_RELEASE: list[Callable[[], None]] = []


def use(directory: str | Path | None) -> Optional[Path]:
    """Share values through ``directory`` from now on in this process (None: stop).
    Returns the directory used before."""
    global _DIR
    old, _DIR = _DIR, None if directory is None else Path(directory)
    return old


def directory() -> Optional[Path]:
    """The directory values are shared through in this process (None: none)."""
    return _DIR


@contextlib.contextmanager
def temporary(prefix: str = "mugraph-draws-") -> Iterator[Path]:
    """A fresh directory to share through, used while the block runs, then removed
    (the previous setting restored). Processes that mapped its files keep their pages."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    old = use(path)
    try:
        yield path
    finally:
        use(old)
        release()
        shutil.rmtree(path, ignore_errors=True)


def release() -> None:
    """Let go of every value mapped from a shared directory (the caches registered with
    :func:`on_release` clear themselves): when the directory is removed, and in a search
    worker when its search ends and it waits for the next one."""
    for fn in _RELEASE:
        fn()


def on_release(fn: Callable[[], None]) -> None:
    """Call ``fn`` whenever a :func:`temporary` directory is removed (a cache of values
    mapped from it clears itself, so no mapping keeps a removed file's disk space)."""
    _RELEASE.append(fn)


def key(*parts: object) -> str:
    """A file-name-safe key for ``parts`` (their ``repr``s, hashed)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def load_or_make(name: str, make: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
    """``make()``'s arrays, shared under ``name`` (:func:`key`) when a directory is set:
    read (mapped copy-on-write) if some process wrote them, else made here and written."""
    d = _DIR
    if d is None or not d.is_dir():
        return make()
    done = d / f"{name}.count"
    if done.exists():
        with contextlib.suppress(OSError, ValueError):
            n = int(done.read_text())
            return [np.load(d / f"{name}.{i}.npy", mmap_mode="c") for i in range(n)]
    arrays = make()
    with contextlib.suppress(OSError):  # a full or vanished directory: the arrays are still right
        for i, a in enumerate(arrays):
            tmp = d / f".{name}.{i}.{os.getpid()}.npy"
            np.save(tmp, np.ascontiguousarray(a))
            os.replace(tmp, d / f"{name}.{i}.npy")
        tmp = d / f".{name}.count.{os.getpid()}"
        tmp.write_text(str(len(arrays)))
        os.replace(tmp, done)
    return arrays
