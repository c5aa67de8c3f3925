"""Progress reports: a live bar on a terminal, a few plain lines anywhere else.

Every long-running loop of mugraph (the search's phases, the demo, the lowering's
digest check) shows its progress through :class:`Progress`, so the rule below lives
in this one place.

Why two modes. A tqdm bar redraws itself with carriage returns a few times a
second. On a terminal that is one line that changes; written to a file, a CI log or
a notebook's captured output, every redraw stays: a 90 s search left 188 copies of
its bar (62 KB) in a log. So when the stream is not a terminal (``isatty()`` false),
progress is written as plain newline-terminated lines, no carriage return, at most

* one line when a phase starts (:meth:`Progress.phase`),
* one line every :data:`INTERVAL` seconds otherwise (whatever the caller's update
  rate), and
* one closing line with the final counts (:meth:`Progress.close`; the end counts as
  the last phase),

each with the counts and the time left, e.g.
``search: search, 120/340 tasks, 1,234 states, 3 matches, 45 s left``. Notes
(:meth:`Progress.write`: a failed task, a lost worker) are printed as they come in
both modes; they are rare and each one matters.

A progress nested in another (a piece search inside a whole search) writes its
plain lines through its parent's clock, so nesting does not multiply the lines: its
phases and its end print only when a line is due anyway. On a terminal it is a bar
of its own, below its parent's.

``enabled=False`` (the public ``progress=False`` arguments) makes every method a
no-op: nothing is written in either mode.

It sits in the IR core, the lowest layer, so every stage and the product may use
it; it imports nothing of mugraph, and tqdm only when a bar is drawn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Optional, TextIO, TypeVar

#: seconds between two plain lines (not a terminal) within a phase
INTERVAL = 10.0

T = TypeVar("T")


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (a closed or odd stream is not)."""
    isatty = getattr(stream, "isatty", None)
    if isatty is None:
        return False
    try:
        return bool(isatty())
    except (ValueError, OSError):  # closed, or detached
        return False


class _Lines:
    """The plain-line writer of one top-level progress and its nested ones: the stream
    and when the last line went out, which the :data:`INTERVAL` rule is measured from."""

    def __init__(self, stream: TextIO, interval: float, clock: Callable[[], float]) -> None:
        self.stream, self.interval, self.clock = stream, interval, clock
        self.last: Optional[float] = None

    def due(self) -> bool:
        return self.last is None or self.clock() - self.last >= self.interval

    def emit(self, line: str) -> None:
        # one line, whatever the text holds: a newline in a name must not break the rule
        line = " ".join(line.replace("\r", " ").split("\n"))
        self.stream.write(line + "\n")
        self.stream.flush()
        self.last = self.clock()


class Progress:
    """The progress of one loop: a count (``n`` of ``total`` ``unit``\\ s), the phase it
    is in, named counts (``{"states": 1234, "matches": 3}``) and the time left (from
    ``end``, a time on ``clock``, None when unbounded).

    ``stream``: where to write (default ``sys.stderr`` at construction); a terminal
    gets a tqdm bar, anything else the plain lines of the module's rule, at most one
    every ``interval`` seconds of ``clock`` (both injectable, so the rule can be
    tested without waiting). ``leave``: whether the bar stays on the screen, and
    whether a plain-line closing line is written, after :meth:`close`. ``parent``: the
    progress this one is nested in (see the module's docstring).
    """

    def __init__(self, desc: str, *, total: Optional[int] = None, unit: str = "it", enabled: bool = True,
                 stream: Optional[TextIO] = None, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic, end: Optional[float] = None, leave: bool = True,
                 parent: Optional[Progress] = None) -> None:
        self.desc, self.unit, self.total, self.end, self.leave = desc, unit, total, end, leave
        self.enabled = enabled
        self.n = 0
        self.phase_name: Optional[str] = None
        self.counts: dict[str, int] = {}
        self.clock = clock
        self.started = clock()
        self.nested = parent is not None and parent._lines is not None
        self._bar: Any = None
        self._lines: Optional[_Lines] = None
        self._closed = not enabled
        if not enabled:
            return
        out = sys.stderr if stream is None else stream
        if is_terminal(out):
            self._bar = _tqdm(desc, total, unit, leave, out)
        if self._bar is None:
            self._lines = parent._lines if self.nested else _Lines(out, interval, clock)

    # ------------------------------------------------------------------ state
    def phase(self, name: str, *, counts: Optional[Mapping[str, int]] = None) -> None:
        """Enter phase ``name`` (``counts``: as in :meth:`update`): the bar's description,
        or one plain line now (nested: if due)."""
        if self._closed or name == self.phase_name:
            return
        self.phase_name = name
        if counts is not None:
            self.counts = dict(counts)
        self._show(force=not self.nested)

    def update(self, n: int = 0, *, total: Optional[int] = None, counts: Optional[Mapping[str, int]] = None) -> None:
        """Count ``n`` more units done; ``total`` and ``counts`` replace the previous ones
        (None: unchanged). Redraws the bar, or writes a plain line if one is due."""
        if self._closed:
            return
        self.n += n
        if total is not None:
            self.total = total
        if counts is not None:
            self.counts = dict(counts)
        self._show(force=False)

    def reset(self, total: Optional[int] = None, n: int = 0) -> None:
        """Start the count over at ``n`` of ``total`` (when the work turns out to be known)."""
        if self._closed:
            return
        self.n, self.total = n, total
        if self._bar is not None:
            self._bar.reset(total=total)
            self._bar.update(n)

    def iterate(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, counting one unit as each is done (its total: ``len(items)`` if it has one)."""
        if self.total is None and hasattr(items, "__len__"):
            self.reset(total=len(items))  # type: ignore[arg-type]
        for x in items:
            yield x
            self.update(1)

    def write(self, note: str) -> None:
        """A one-line note (a failure), printed at once in both modes, above the bar."""
        if self._closed:
            return
        if self._bar is not None:
            self._bar.write(f"{self.desc}: {note}")
        elif self._lines is not None:
            self._lines.emit(f"{self.desc}: {note}")

    def close(self, *, counts: Optional[Mapping[str, int]] = None) -> None:
        """End, with the final ``counts`` (None: the last ones): the bar is closed; not a
        terminal, the closing line (unless ``leave=False``; nested: only when due)."""
        if self._closed:
            return
        if counts is not None:
            self.counts = dict(counts)
        if self._bar is not None:
            self._show(force=True)
            self._bar.close()
        elif self._lines is not None and self.leave and (not self.nested or self._lines.due()):
            self._lines.emit(self.line(final=True))
        self._closed = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:  # an exception too: the bar must not stay half-drawn
        self.close()

    # --------------------------------------------------------------- drawing
    def left(self) -> Optional[float]:
        """Seconds to ``end`` (never negative), None when there is no end."""
        return None if self.end is None else max(0.0, self.end - self.clock())

    def line(self, final: bool = False) -> str:
        """The plain line for the state now: ``desc: phase, n/total units, counts, time``."""
        parts = ["done" if final else self.phase_name or ""]
        unit = self.unit if self.n == 1 and self.total is None else self.unit + "s"
        parts.append(f"{self.n:,} {unit}" if self.total is None else f"{self.n:,}/{self.total:,} {unit}")
        parts += [f"{v:,} {k}" for k, v in self.counts.items()]
        left = self.left()
        if final:
            parts.append(f"{self.clock() - self.started:.0f} s")
        elif left is not None:
            parts.append(f"{left:.0f} s left")
        return f"{self.desc}: " + ", ".join(p for p in parts if p)

    def _show(self, force: bool) -> None:
        bar = self._bar
        if bar is not None:
            left = self.left()
            name = self.phase_name or self.desc
            bar.set_description_str(name if left is None else f"{name} ({left:.0f} s left)", refresh=False)
            bar.set_postfix(self.counts, refresh=False)
            if bar.total != self.total:
                bar.total = self.total
            # update() redraws when tqdm's own interval allows; refresh() at once
            bar.update(self.n - bar.n)
            if force:
                bar.refresh()
        elif self._lines is not None and (force or self._lines.due()):
            self._lines.emit(self.line())


def _tqdm(desc: str, total: Optional[int], unit: str, leave: bool, stream: TextIO) -> Any:
    """A tqdm bar on ``stream``, or None when tqdm is not installed (plain lines then)."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=leave, file=stream)
