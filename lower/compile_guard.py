"""A wall-clock bound on the kernel compiler's assembler while kernels are tuned.

Triton compiles a kernel in-process down to PTX, then runs NVIDIA's ``ptxas`` as a child
process with no time limit. For a few lowered variants — a whole decode attention in one
block, its (heads, rows, d, keys) tiles unrolled — ``ptxas`` ran for minutes: one
re-ranking on an H200 sat 430 s in a single ``ptxas`` call for a configuration whose share
was 3 s, and a Python signal cannot interrupt the wait (the tuner treats every exception
of a configuration as "does not compile", so even an alarm's exception was swallowed and
the next configuration compiled).

:func:`bounded_compiles` watches this process's ``ptxas`` children from a thread and kills
one that has run longer than the bound. Triton then raises its own "``ptxas`` failed"
error, and the tuner counts that configuration as one that does not compile — which it is,
for any practical purpose: a kernel that takes minutes to assemble is a kernel of spilled,
fully unrolled tiles, never a fast one. Linux only (it reads ``/proc``); elsewhere a
no-op.

Triton prints the whole PTX of a kernel whose ``ptxas`` failed to standard output (tens of
thousands of lines: a Qwen2-7B decode layer's log on an H200 held 250,000 of them, three
dumps of stopped assemblers). While the bound is on, such a dump is dropped — the tuner
logs the failure in one line, and the stopped assembler's warning says why — and
everything else printed passes through unchanged (:class:`_DropAssemblerDumps`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Iterator, TextIO

log = logging.getLogger("mugraph")

#: seconds one ``ptxas`` run may take while tuning before it is stopped (a kernel of the
#: lowering assembles in 0.1–5 s on a 16-core host)
PTXAS_LIMIT_S = 45.0
#: how often the watcher looks at the children (seconds)
POLL_S = 0.5
#: the assembler's process name, as ``/proc/<pid>/comm`` gives it
ASSEMBLERS = ("ptxas",)

_lock = threading.Lock()
_depth = 0  # nested bounded_compiles blocks share one watcher
_stop: threading.Event | None = None


def children(pid: int | None = None) -> list[int]:
    """The process ids of ``pid``'s children (default: this process), from
    ``/proc/<pid>/task/*/children``; empty where ``/proc`` does not have them."""
    pid = os.getpid() if pid is None else pid
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(x) for x in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    except OSError:
        return []
    return out


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def watch(stop: threading.Event, limit_s: float, poll_s: float = POLL_S) -> None:
    """Until ``stop`` is set: kill each assembler child of this process once it has been
    seen running for ``limit_s`` seconds (one warning line each)."""
    first_seen: dict[int, float] = {}
    while not stop.wait(poll_s):
        now = time.monotonic()
        alive = {p for p in children() if _name(p) in ASSEMBLERS}
        for p in list(first_seen):
            if p not in alive:
                del first_seen[p]
        for p in alive:
            t0 = first_seen.setdefault(p, now)
            if now - t0 >= limit_s:
                try:
                    os.kill(p, signal.SIGKILL)
                    log.warning("mugraph: a kernel's ptxas ran past %.0f s and was stopped; that configuration "
                                "counts as one that does not compile", limit_s)
                except OSError:
                    pass
                first_seen[p] = float("inf")  # once


#: the line that ends Triton's dump of a kernel whose assembler failed
DUMP_END = "please share the reproducer above with Triton project"


class _DropAssemblerDumps:
    """Standard output with Triton's assembler-failure dumps left out (one ``print`` each,
    ending with :data:`DUMP_END`); every other write passes through to ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, s: str) -> int:
        if DUMP_END in s:
            first = next((ln for ln in s.splitlines() if ln.strip() and not ln.startswith("=")), "")
            log.debug("mugraph: Triton's PTX dump of a failed assembler left out (%s)", first.strip())
            return len(s)
        return self.stream.write(s)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def bounded_compiles(limit_s: float = PTXAS_LIMIT_S) -> Iterator[None]:
    """While the block runs, an assembler (``ptxas``) child running longer than ``limit_s``
    seconds is killed, and Triton's dump of a failed assembler's PTX is left out of standard
    output (module docstring). Nested blocks share the outermost's watcher."""
    with redirect_stdout(_DropAssemblerDumps(sys.stdout)):
        with _bounded_assembler(limit_s):
            yield


@contextmanager
def _bounded_assembler(limit_s: float) -> Iterator[None]:
    global _depth, _stop
    if not Path("/proc/self/task").is_dir():
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _stop = threading.Event()
            threading.Thread(target=watch, args=(_stop, limit_s), name="mugraph-ptxas-bound", daemon=True).start()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _stop is not None:
                _stop.set()
                _stop = None
